//! The parts of the websocket opening handshake egressd does itself. An HTTP/1.1 client sends
//! its own `Sec-WebSocket-Key` and checks the upstream's answer; an HTTP/2 client (RFC 8441)
//! sends no key and expects `200`, so for it egressd is the websocket client of the HTTP/1.1
//! handshake upstream: it makes the key, checks the `101` as RFC 6455 §4.1 tells a client
//! to, and turns it into the `200` of an extended CONNECT.

use data_encoding::BASE64;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use sha1::{Digest, Sha1};

use crate::http::pipeline::kind::has_token;

/// `Sec-WebSocket-Key`.
pub(super) const SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
/// `Sec-WebSocket-Accept`.
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// Appended to the key before hashing (RFC 6455 §1.3).
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 §4.1).
///
/// The key only shows that the server understood a websocket handshake (no cache or plain
/// HTTP server would answer with its hash); it protects nothing secret, so fastrand's
/// non-cryptographic randomness is enough.
pub(super) fn new_key() -> HeaderValue {
    let nonce = fastrand::u128(..).to_le_bytes();
    HeaderValue::from_str(&BASE64.encode(&nonce)).expect("base64 is a valid header value")
}

/// The `Sec-WebSocket-Accept` that answers `key` (RFC 6455 §4.2.2): base64 of the SHA-1 of
/// the key followed by the GUID.
fn accept_key(key: &[u8]) -> String {
    let mut sha1 = Sha1::new();
    sha1.update(key);
    sha1.update(GUID);
    BASE64.encode(&sha1.finalize())
}

/// Checks that a `101` answer completes the handshake egressd started with `key`, as a
/// websocket client must (RFC 6455 §4.1): `Upgrade: websocket`, `Connection: upgrade`, and
/// the `Sec-WebSocket-Accept` of that key. The error says what was wrong.
pub(super) fn check_switch(headers: &HeaderMap, key: &HeaderValue) -> Result<(), String> {
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err("101 without `Upgrade: websocket`".into());
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err("101 without `Connection: upgrade`".into());
    }
    let expected = accept_key(key.as_bytes());
    match headers.get(SEC_WEBSOCKET_ACCEPT) {
        Some(accept) if accept.as_bytes() == expected.as_bytes() => Ok(()),
        Some(accept) => Err(format!(
            "Sec-WebSocket-Accept {accept:?} does not answer the key egressd sent (expected {expected:?})"
        )),
        None => Err("101 without Sec-WebSocket-Accept".into()),
    }
}

/// Turns the upstream's `101` into the answer to an extended CONNECT (RFC 8441 §5): `200`,
/// without the HTTP/1.1 handshake's own headers (`Sec-WebSocket-Accept` answers a key the
/// client never sent; `Connection` and `Upgrade` have no meaning in HTTP/2).
/// `Sec-WebSocket-Protocol` and `-Extensions` stay: they are the client's to check.
pub(super) fn into_extended_connect_answer(status: &mut StatusCode, headers: &mut HeaderMap) {
    *status = StatusCode::OK;
    headers.remove(SEC_WEBSOCKET_ACCEPT);
    headers.remove(header::CONNECTION);
    headers.remove(header::UPGRADE);
    // A 2xx answer to CONNECT has no body (RFC 9110 §9.3.6); hyper refuses one that says so.
    headers.remove(header::CONTENT_LENGTH);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_of_the_rfc_6455_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn new_keys_are_16_random_bytes_in_base64() {
        let a = new_key();
        let b = new_key();
        assert_ne!(a, b);
        let decoded = BASE64.decode(a.as_bytes()).expect("base64");
        assert_eq!(decoded.len(), 16);
    }

    fn switch(accept: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(
            SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_str(accept).expect("ASCII"),
        );
        headers
    }

    #[test]
    fn a_101_must_answer_the_key_that_was_sent() {
        let key = HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(
            check_switch(&switch("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), &key),
            Ok(())
        );
        let wrong = check_switch(&switch("AAAAAAAAAAAAAAAAAAAAAAAAAAA="), &key);
        assert!(wrong.is_err_and(|e| e.contains("does not answer")));
        let mut no_upgrade = switch("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        no_upgrade.remove(header::UPGRADE);
        assert!(check_switch(&no_upgrade, &key).is_err());
    }

    #[test]
    fn the_200_of_an_extended_connect_keeps_only_end_to_end_headers() {
        let mut headers = switch("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        headers.insert("sec-websocket-protocol", HeaderValue::from_static("chat"));
        let mut status = StatusCode::SWITCHING_PROTOCOLS;
        into_extended_connect_answer(&mut status, &mut headers);
        assert_eq!(status, StatusCode::OK);
        let names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["sec-websocket-protocol"]);
    }
}
