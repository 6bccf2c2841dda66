//! The request hash that consistent hashing places on its ring or table: a header's value, a
//! cookie's value or the client's IP address, hashed with xxHash64 (as Envoy does).
//!
//! Computed once per request, and only for Backends balanced by `ConsistentHash`: nothing here
//! runs for the other balancers.

use std::net::IpAddr;

use http::header::{HeaderName, COOKIE};
use http::HeaderMap;

/// What a request is hashed by (`loadBalancer.consistentHash.type`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashKey {
    /// The first value of this header.
    Header(HeaderName),
    /// The value of this cookie (the first one of that name in `Cookie` headers).
    Cookie(String),
    /// The client's IP address (the port is left out: one client, one endpoint).
    SourceIp,
}

impl HashKey {
    /// The request's hash, or `None` when the request carries no key (no such header or
    /// cookie); the balancer then picks as if the hash were random.
    pub fn hash(&self, headers: &HeaderMap, client: IpAddr) -> Option<u64> {
        match self {
            HashKey::Header(name) => headers.get(name).map(|v| hash_bytes(v.as_bytes())),
            HashKey::Cookie(name) => cookie_value(headers, name).map(hash_bytes),
            HashKey::SourceIp => Some(hash_ip(client)),
        }
    }

    /// The hash of a connection that has no HTTP request (CONNECT tunnels, TLS passthrough):
    /// only `SourceIp` has a key there.
    pub(crate) fn hash_connection(&self, client: IpAddr) -> Option<u64> {
        match self {
            HashKey::SourceIp => Some(hash_ip(client)),
            HashKey::Header(_) | HashKey::Cookie(_) => None,
        }
    }
}

/// xxHash64 with seed 0, Envoy's `HashUtil::xxHash64`.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(bytes, 0)
}

fn hash_ip(ip: IpAddr) -> u64 {
    // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: the same client either way.
    match ip.to_canonical() {
        IpAddr::V4(v4) => hash_bytes(&v4.octets()),
        IpAddr::V6(v6) => hash_bytes(&v6.octets()),
    }
}

/// The value of cookie `name` (RFC 6265 §5.4 `name=value; name2=value2`, over every `Cookie`
/// header, HTTP/2 clients may split them), without its optional double quotes. Borrows from
/// the header: nothing is allocated.
fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (n, v) = (&pair[..eq], pair[eq + 1..].trim_ascii());
            (n.trim_ascii() == name.as_bytes()).then(|| unquote(v))
        })
}

fn unquote(v: &[u8]) -> &[u8] {
    match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn header_key_hashes_the_first_value() {
        let key = HashKey::Header(HeaderName::from_static("x-user"));
        let h = headers(&[("x-user", "alice"), ("x-user", "bob")]);
        assert_eq!(key.hash(&h, CLIENT), Some(hash_bytes(b"alice")));
        assert_eq!(key.hash(&headers(&[("x-other", "a")]), CLIENT), None);
    }

    #[test]
    fn cookie_key_finds_the_named_cookie_in_any_cookie_header() {
        let key = HashKey::Cookie("session".into());
        let h = headers(&[
            ("cookie", "a=1; b=2"),
            ("cookie", "x=y;session=\"s-42\" ; c=3"),
        ]);
        assert_eq!(key.hash(&h, CLIENT), Some(hash_bytes(b"s-42")));
        let h = headers(&[("cookie", "sessionx=1; xsession=2; session=abc")]);
        assert_eq!(key.hash(&h, CLIENT), Some(hash_bytes(b"abc")));
        assert_eq!(key.hash(&headers(&[("cookie", "a=1")]), CLIENT), None);
        assert_eq!(key.hash(&HeaderMap::new(), CLIENT), None);
    }

    #[test]
    fn source_ip_ignores_the_ipv4_mapped_form() {
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let key = HashKey::SourceIp;
        assert_eq!(
            key.hash(&HeaderMap::new(), mapped),
            key.hash(&HeaderMap::new(), CLIENT)
        );
        assert_eq!(
            key.hash_connection(CLIENT),
            key.hash(&HeaderMap::new(), CLIENT)
        );
        assert_eq!(
            HashKey::Header(HeaderName::from_static("x-user")).hash_connection(CLIENT),
            None
        );
    }
}
