//! Reading the server name from a TLS ClientHello without terminating TLS (Passthrough
//! listeners). The bytes are only looked at; they are forwarded to the endpoint unchanged.
//!
//! Robust to what arrives in practice: a ClientHello split across TCP reads or across several
//! TLS records, no SNI extension at all, and bytes that are not TLS (a plaintext HTTP request
//! sent to the wrong port).

/// The outcome of looking at the bytes received so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    /// Not enough bytes yet; read more and look again.
    NeedMore,
    /// A complete ClientHello; its SNI host name (lower-case) if it carries one.
    Hello(Option<String>),
    /// Not a TLS ClientHello; the reason, for logs and metrics.
    Invalid(&'static str),
}

/// A ClientHello larger than this is refused (real ones are a few hundred bytes to a few KiB;
/// post-quantum key shares keep them well under this).
pub(crate) const MAX_HELLO: usize = 64 * 1024;

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

/// Looks at the first bytes of a connection.
pub fn peek_client_hello(buf: &[u8]) -> Peek {
    // Reassemble the handshake message from as many records as it spans.
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        if buf.len() < at + 5 {
            return Peek::NeedMore;
        }
        let record = &buf[at..];
        if record[0] != RECORD_HANDSHAKE {
            return Peek::Invalid(if at == 0 {
                "not a TLS handshake record"
            } else {
                "ClientHello interrupted by another record type"
            });
        }
        if record[1] != 3 {
            return Peek::Invalid("not a TLS record (bad version)");
        }
        let len = u16::from_be_bytes([record[3], record[4]]) as usize;
        if len == 0 || len > 16 * 1024 + 256 {
            return Peek::Invalid("TLS record length out of range");
        }
        if record.len() < 5 + len {
            return Peek::NeedMore;
        }
        handshake.extend_from_slice(&record[5..5 + len]);
        at += 5 + len;
        if handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Peek::Invalid("first handshake message is not a ClientHello");
            }
            let body_len =
                u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize;
            if body_len > MAX_HELLO {
                return Peek::Invalid("ClientHello too large");
            }
            if handshake.len() >= 4 + body_len {
                return match server_name(&handshake[4..4 + body_len]) {
                    Ok(name) => Peek::Hello(name),
                    Err(why) => Peek::Invalid(why),
                };
            }
        }
        if at > MAX_HELLO + 1024 {
            return Peek::Invalid("ClientHello too large");
        }
    }
}

/// A cursor over the ClientHello body that fails with a reason instead of panicking.
struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.data.len() < n {
            return Err("truncated ClientHello");
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u8()? as usize;
        self.take(n)
    }

    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u16()? as usize;
        self.take(n)
    }
}

/// The SNI host name of a ClientHello body (RFC 8446 §4.1.2, RFC 6066 §3).
fn server_name(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader { data: body };
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.data.is_empty() {
        return Ok(None); // no extensions at all (old clients)
    }
    let mut extensions = Reader { data: r.vec16()? };
    while !extensions.data.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        if kind != EXT_SERVER_NAME {
            continue;
        }
        let mut list = Reader {
            data: Reader { data }.vec16()?,
        };
        while !list.data.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == NAME_TYPE_HOST {
                let name = std::str::from_utf8(name).map_err(|_| "SNI is not UTF-8")?;
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err("SNI is not a host name");
                }
                return Ok(Some(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Ok(None);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A real ClientHello, as rustls writes it.
    fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut config =
            rustls::ClientConfig::builder_with_provider(crate::upstream::tls::provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
        config.enable_sni = sni.is_some();
        let name = sni.unwrap_or("ignored.example").to_owned();
        let mut conn =
            rustls::ClientConnection::new(Arc::new(config), name.try_into().unwrap()).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn finds_the_server_name() {
        let hello = client_hello(Some("API.Example.com"));
        assert_eq!(
            peek_client_hello(&hello),
            Peek::Hello(Some("api.example.com".into()))
        );
    }

    #[test]
    fn every_prefix_needs_more_and_the_whole_hello_is_found() {
        let hello = client_hello(Some("split.example"));
        for cut in 0..hello.len() {
            assert_eq!(
                peek_client_hello(&hello[..cut]),
                Peek::NeedMore,
                "cut at {cut}"
            );
        }
        assert_eq!(
            peek_client_hello(&hello),
            Peek::Hello(Some("split.example".into()))
        );
    }

    #[test]
    fn hello_split_across_records_is_reassembled() {
        let hello = client_hello(Some("records.example"));
        let body = &hello[5..];
        // Re-frame the handshake message as three records.
        let mut framed = Vec::new();
        for chunk in body.chunks(body.len() / 3 + 1) {
            framed.extend_from_slice(&[22, 3, 1]);
            framed.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            framed.extend_from_slice(chunk);
        }
        assert_eq!(
            peek_client_hello(&framed),
            Peek::Hello(Some("records.example".into()))
        );
    }

    #[test]
    fn hello_without_sni_is_reported_as_such() {
        let hello = client_hello(None);
        assert_eq!(peek_client_hello(&hello), Peek::Hello(None));
    }

    #[test]
    fn plaintext_http_is_not_tls() {
        assert_eq!(
            peek_client_hello(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Peek::Invalid("not a TLS handshake record")
        );
    }

    #[test]
    fn garbage_inside_a_record_is_invalid_not_a_panic() {
        let mut hello = client_hello(Some("x.example"));
        // Claim a session id longer than the message.
        hello[5 + 4 + 2 + 32] = 250;
        assert!(matches!(peek_client_hello(&hello), Peek::Invalid(_)));
    }
}
