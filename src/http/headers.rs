//! Header rules of a forwarding proxy: hop-by-hop removal (RFC 9110 §7.6.1), `Via`
//! (§7.6.3) and `X-Forwarded-*`.

use std::net::IpAddr;

use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::Version;

/// Headers that describe one connection and never cross a proxy, besides those listed in
/// `Connection`. `Proxy-Authorization` holds credentials for this proxy, never for the origin.
/// `Trailer` is not among them: RFC 9110 §6.6.2 makes it end-to-end, and hyper's HTTP/1.1
/// encoder sends only the trailer fields it names.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including every header named in `Connection`, and `Upgrade`:
/// the websocket path (`http/pipeline/websocket`) puts back the two it relays; any other upgrade
/// (e.g. h2c) is refused by leaving it out, so the upstream answers as plain HTTP.
///
/// `Content-Length` goes too when `Transfer-Encoding` is there (RFC 9112 §6.3).
///
/// Returns whether the removed `TE` accepted trailers (`TE: trailers`), so the caller can say
/// the same for itself upstream.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // Most messages carry none of these: one pass over the names (cheap comparisons of
    // standard headers) avoids ten hash lookups per message.
    if !headers.keys().any(is_hop_by_hop) {
        return false;
    }
    let trailers = has_token(headers, &header::TE, "trailers");
    // A message framed by Transfer-Encoding has no Content-Length, whatever it says (RFC 9112
    // §6.3): the sender's chunked body is relayed whole, re-framed by this hop, and a stale
    // length left behind would make the next hop cut it (or read the next message into it).
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    // Names listed in Connection first, while the header is still there (removed below with
    // the other hop-by-hop headers). Each value is taken out by a cheap clone (it shares the
    // bytes of the message) and its names removed as `&str`: no name is made, nothing is
    // allocated for the `Connection: keep-alive` most servers send.
    let mut index = 0;
    while let Some(value) = headers
        .get_all(header::CONNECTION)
        .iter()
        .nth(index)
        .cloned()
    {
        index += 1;
        for name in value.to_str().unwrap_or_default().split(',') {
            let name = name.trim();
            if !name.eq_ignore_ascii_case(header::CONNECTION.as_str()) {
                headers.remove(name);
            }
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
    trailers
}

/// Whether a comma-separated list header contains `token` (parameters such as `;q=` ignored).
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(token))
        })
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::UPGRADE || HOP_BY_HOP.iter().any(|h| h == name)
}

/// The `Via` entry this proxy adds for a message of `version`.
pub(crate) fn via_value(version: Version) -> HeaderValue {
    HeaderValue::from_static(match version {
        Version::HTTP_09 => "0.9 egressd",
        Version::HTTP_10 => "1.0 egressd",
        Version::HTTP_2 => "2 egressd",
        Version::HTTP_3 => "3 egressd",
        _ => "1.1 egressd",
    })
}

/// How many egressd hops a request may have passed before egressd refuses it as a loop: a
/// sidecar in front of a gateway is two; a Backend or undeclared destination that points back
/// at egressd adds one per pass.
pub(crate) const MAX_EGRESSD_HOPS: usize = 8;

/// How many times egressd is named in the request's `Via` (entries `<version> egressd`, the
/// pseudonym this proxy uses).
pub(crate) fn egressd_hops(headers: &HeaderMap) -> usize {
    headers
        .get_all(header::VIA)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter(|entry| {
            let entry = entry.trim_ascii();
            // `1.1 egressd`, optionally followed by a comment: `1.1 egressd (...)`.
            entry
                .split(|&b| b == b' ')
                .nth(1)
                .is_some_and(|pseudonym| pseudonym == b"egressd")
        })
        .count()
}

/// Appends this proxy to `Via` (one header line, comma-joined, as RFC 9110 allows).
pub(crate) fn append_via(headers: &mut HeaderMap, version: Version) {
    let ours = via_value(version);
    append_list(headers, header::VIA, ours);
}

/// The client address as an `X-Forwarded-For` entry (made once per connection).
pub(crate) fn client_address_value(client: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&client.to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

// Made at compile time (`from_static` checks a name at run time when it is not a standard one).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Appends the client address to `X-Forwarded-For` and sets `X-Forwarded-Proto` when the
/// client did not.
pub(crate) fn add_forwarded_for(
    headers: &mut HeaderMap,
    client: &HeaderValue,
    proto: &'static str,
) {
    append_list(headers, X_FORWARDED_FOR, client.clone());
    headers
        .entry(X_FORWARDED_PROTO)
        .or_insert(HeaderValue::from_static(proto));
}

/// Adds `value` to the list header `name`, as one line (`a, b, value`): one lookup, and a new
/// value made only when the header was there already.
fn append_list(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    match headers.entry(name) {
        Entry::Vacant(entry) => {
            entry.insert(value);
        }
        Entry::Occupied(mut entry) => {
            let mut joined = Vec::new();
            for existing in entry.iter() {
                joined.extend_from_slice(existing.as_bytes());
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(value.as_bytes());
            // Valid values joined by ", " are a valid value; `insert` replaces every line.
            entry.insert(HeaderValue::from_bytes(&joined).unwrap_or(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_header_gets_the_value_appended_as_one_line() {
        let mut h = HeaderMap::new();
        let client = HeaderValue::from_static("192.0.2.7");
        add_forwarded_for(&mut h, &client, "http");
        assert_eq!(h.get_all(X_FORWARDED_FOR).iter().count(), 1);
        assert_eq!(h[X_FORWARDED_FOR], "192.0.2.7");
        // Two lines from the client: joined, with ours last.
        let mut h = HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_static("10.0.0.2, 10.0.0.3"),
        );
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        add_forwarded_for(&mut h, &client, "http");
        let lines: Vec<_> = h.get_all(X_FORWARDED_FOR).iter().collect();
        assert_eq!(lines, ["10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7"]);
        assert_eq!(h[X_FORWARDED_PROTO], "https", "the client's proto is kept");
    }

    #[test]
    fn egressd_hops_counts_our_via_entries_only() {
        let mut h = HeaderMap::new();
        assert_eq!(egressd_hops(&h), 0);
        h.append(
            header::VIA,
            HeaderValue::from_static("1.1 egressd, 1.1 squid"),
        );
        h.append(
            header::VIA,
            HeaderValue::from_static("2 egressd (sidecar),1.0 notegressd"),
        );
        assert_eq!(egressd_hops(&h), 2);
    }

    #[test]
    fn strips_hop_by_hop_and_connection_listed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic eA=="),
        );
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    /// Every `Connection` header counts, names in any case and with spaces; a listed name that
    /// is no header name, or `Connection` itself, breaks nothing.
    #[test]
    fn names_from_every_connection_header_are_removed() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("X-One ,, bad name"),
        );
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("connection,x-two"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static(" x-three"));
        for name in ["x-one", "x-two", "x-three", "x-four"] {
            h.insert(name, HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["x-four"]);
    }

    #[test]
    fn transfer_encoding_drops_content_length() {
        let mut h = HeaderMap::new();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty());

        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get(header::CONTENT_LENGTH).unwrap(), "5");
    }

    #[test]
    fn via_and_xff_append() {
        let mut h = HeaderMap::new();
        h.insert(header::VIA, HeaderValue::from_static("1.1 other"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        append_via(&mut h, Version::HTTP_11);
        add_forwarded_for(
            &mut h,
            &client_address_value("127.0.0.1".parse().unwrap()),
            "http",
        );
        assert_eq!(h.get(header::VIA).unwrap(), "1.1 other, 1.1 egressd");
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.1");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
    }
}
