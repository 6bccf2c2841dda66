//! Host names: what every layer agrees on about them (a leaf module: it imports nothing of
//! egressd, so the config loader, the request path and telemetry can all use it).

/// The longest host name (RFC 1035 §2.3.4: 255 octets on the wire, 253 as text).
pub const MAX_HOST_LEN: usize = 253;

/// RFC 1123 subdomain: lower-case labels of letters, digits and `-`, each at most 63
/// characters, not starting or ending with `-`, at most 253 in all. Kubernetes requires it of
/// object names and namespaces; hostnames follow the same grammar.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A DNS name (RFC 1123), lower-case, not an IP literal, no wildcard.
pub(crate) fn is_valid_hostname(host: &str) -> bool {
    is_dns_subdomain(host) && host.parse::<std::net::IpAddr>().is_err()
}

/// `host` or `*.host`.
pub(crate) fn is_valid_hostname_pattern(pattern: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => is_valid_hostname(rest),
        None => is_valid_hostname(pattern),
    }
}

/// Whether `host` matches `pattern` (`*.suffix` matches one or more labels before the suffix).
pub(crate) fn hostname_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        None => pattern == host,
    }
}
