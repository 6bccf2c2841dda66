//! Authority / Host parsing: the bytes as an `http::uri::Authority` (as the request's URI or
//! `Host` header gives it to egressd), its host through `canonical_host`, and the raw text
//! through `canonical_host` too; the first 16 bytes as an IPv6 address through
//! `canonical_ip`.
//!
//! Properties: a canonical host is canonical (canonicalising it again gives it back, borrowed),
//! lower-case, at most 253 bytes, without a trailing dot; an IP literal's canonical form is
//! the canonical IP's own spelling; `canonical_ip` is idempotent and keeps IPv4 as it is.

#![no_main]

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use egressd::upstream::address::{canonical_host, canonical_ip, MAX_HOST_LEN};
use http::uri::Authority;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(authority) = Authority::try_from(data) {
        // egressd refuses userinfo before looking at the host.
        if !authority.as_str().contains('@') {
            check_host(authority.host());
            let _ = authority.port_u16();
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        check_host(text);
    }
    if let Ok(bytes) = <[u8; 16]>::try_from(data.get(..16).unwrap_or_default()) {
        let ip = IpAddr::V6(Ipv6Addr::from(bytes));
        let once = canonical_ip(ip);
        assert_eq!(
            canonical_ip(once),
            once,
            "canonical_ip({ip}) is not canonical"
        );
        let v4 = IpAddr::V4(Ipv4Addr::from([bytes[0], bytes[1], bytes[2], bytes[3]]));
        assert_eq!(canonical_ip(v4), v4);
    }
});

fn check_host(raw: &str) {
    let Ok(canonical) = canonical_host(raw) else {
        return;
    };
    let c: &str = &canonical;
    assert!(
        matches!(canonical_host(c), Ok(Cow::Borrowed(again)) if again == c),
        "{raw:?} → {c:?} → {:?}",
        canonical_host(c)
    );
    assert!(
        !c.bytes().any(|b| b.is_ascii_uppercase()),
        "{raw:?} → {c:?}"
    );
    assert!(c.len() <= MAX_HOST_LEN, "{raw:?} → {c:?}");
    assert!(!c.is_empty() && !c.ends_with('.'), "{raw:?} → {c:?}");
    // An IP literal: its canonical spelling.
    let literal = raw.strip_suffix('.').unwrap_or(raw);
    let ip = match literal.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => literal.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    };
    if let Some(ip) = ip {
        let expected = match canonical_ip(ip) {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        assert_eq!(c, expected, "{raw:?}");
    }
    // And the canonical form reads back as an IP literal exactly when it is one.
    let back = match c.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => c.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    };
    if let Some(back) = back {
        assert_eq!(
            canonical_ip(back),
            back,
            "{raw:?} → {c:?} is not a canonical IP"
        );
    }
}
