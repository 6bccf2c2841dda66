//! Destinations as text and as addresses, in one canonical form before any policy looks at
//! them.
//!
//! One address has many spellings: `127.0.0.1` is also `::ffff:127.0.0.1` (IPv4-mapped),
//! `::127.0.0.1` (IPv4-compatible, deprecated but still parsed), `64:ff9b::7f00:1` (NAT64, RFC
//! 6052: reaches the IPv4 address on a network with a NAT64 gateway), and, to the C library's
//! `inet_aton`, `127.1`, `2130706433` or `0x7f.0.0.1`. A deny list written for one spelling
//! must hold for all of them, so every allow/deny decision is taken on [`canonical_ip`], and a
//! host that only `inet_aton` reads as an address is no host at all ([`canonical_host`]).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;

pub use crate::names::MAX_HOST_LEN;
/// The longest label of a host name (RFC 1035 §2.3.4).
pub(crate) const MAX_LABEL_LEN: usize = 63;

/// `ip` in the form a policy judges: an IPv6 address that stands for an IPv4 one (mapped,
/// compatible, NAT64 well-known prefix) becomes that IPv4 address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return v4.into();
    }
    let s = v6.segments();
    let embedded = || Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32).into();
    // NAT64 well-known prefix 64:ff9b::/96 (RFC 6052 §2.1).
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return embedded();
    }
    // IPv4-compatible ::a.b.c.d (RFC 4291 §2.5.5.1); `::` and `::1` are IPv6's own.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return embedded();
    }
    ip
}

/// Why a host named by a client is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidHost {
    #[error("empty host")]
    Empty,
    #[error("host is {0} bytes long; a host name has at most 253")]
    TooLong(usize),
    #[error("a label of the host is empty or longer than 63 bytes")]
    BadLabel,
    #[error(
        "the host has a character a host name cannot have (letters, digits, '-', '_' and '.')"
    )]
    BadCharacter,
    #[error("`{0}` is not an IPv6 address")]
    BadIpv6(String),
    #[error("the host looks like an IPv4 address in a form only inet_aton reads (write it as four decimal numbers, a.b.c.d)")]
    NumericHost,
}

/// The host part of an authority (or an SNI) as egressd routes and judges it: lower-case,
/// without the trailing dot, IP literals in canonical form (IPv6 in brackets, IPv4-mapped and
/// similar forms as IPv4). Borrowed when the client's text already is that.
///
/// Accepted: IP literals (`a.b.c.d`, `[v6]`), and host names of at most 253 bytes whose labels
/// have 1–63 letters, digits, `-` or `_` (underscores appear in real names, e.g. SRV-style
/// and internal hosts) and whose last label is not all digits (RFC 3696 §2: a top-level label
/// is never numeric, so such a "name" is an address in some other spelling).
pub fn canonical_host(raw: &str) -> Result<Cow<'_, str>, InvalidHost> {
    if let Some(inner) = raw.strip_prefix('[') {
        let Some(text) = inner.strip_suffix(']') else {
            return Err(InvalidHost::BadIpv6(truncated(inner)));
        };
        let v6: Ipv6Addr = text
            .parse()
            .map_err(|_| InvalidHost::BadIpv6(truncated(text)))?;
        return Ok(match canonical_ip(v6.into()) {
            IpAddr::V4(v4) => Cow::Owned(v4.to_string()),
            IpAddr::V6(v6) => {
                let canonical = format!("[{v6}]");
                if canonical == raw {
                    Cow::Borrowed(raw)
                } else {
                    Cow::Owned(canonical)
                }
            }
        });
    }
    let host = raw.strip_suffix('.').unwrap_or(raw);
    if host.is_empty() {
        return Err(InvalidHost::Empty);
    }
    if host.len() > MAX_HOST_LEN {
        return Err(InvalidHost::TooLong(host.len()));
    }
    // An IPv4 literal starts with a digit: a name skips the parser.
    if host.as_bytes()[0].is_ascii_digit() {
        if let Ok(v4) = host.parse::<Ipv4Addr>() {
            // Rust reads only the four-decimal form; anything else is refused below.
            return Ok(if host.len() == raw.len() {
                Cow::Borrowed(raw)
            } else {
                Cow::Owned(v4.to_string())
            });
        }
    }
    // One pass over the bytes, label by label (this runs for every request). A label's
    // length is judged before its characters.
    let mut upper = false;
    let mut label = Label::default();
    for (at, b) in host.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'-' | b'_' => label.numeric = false,
            b'A'..=b'Z' => {
                label.numeric = false;
                upper = true;
            }
            b'0'..=b'9' => {}
            b'.' => {
                label.end(at)?;
                label = Label {
                    start: at + 1,
                    ..Label::default()
                };
            }
            _ => label.bad_character = true,
        }
    }
    label.end(host.len())?;
    if label.numeric || is_hex_number(&host[label.start..]) {
        return Err(InvalidHost::NumericHost);
    }
    Ok(match (upper, host.len() == raw.len()) {
        (false, true) => Cow::Borrowed(raw),
        (false, false) => Cow::Borrowed(host),
        (true, _) => Cow::Owned(host.to_ascii_lowercase()),
    })
}

/// The label of a host name being read by `canonical_host`.
struct Label {
    start: usize,
    numeric: bool,
    bad_character: bool,
}

impl Default for Label {
    fn default() -> Self {
        Label {
            start: 0,
            numeric: true,
            bad_character: false,
        }
    }
}

impl Label {
    /// The label ends before `end`: judged.
    fn end(&self, end: usize) -> Result<(), InvalidHost> {
        let len = end - self.start;
        if len == 0 || len > MAX_LABEL_LEN {
            return Err(InvalidHost::BadLabel);
        }
        if self.bad_character {
            return Err(InvalidHost::BadCharacter);
        }
        Ok(())
    }
}

/// `0x7f`: a label `inet_aton` reads as a hexadecimal number.
fn is_hex_number(label: &str) -> bool {
    let b = label.as_bytes();
    b.len() > 2 && b[0] == b'0' && (b[1] | 0x20) == b'x' && b[2..].iter().all(u8::is_ascii_hexdigit)
}

/// A client's text in an error message, cut short: it is the client's, and may be huge.
fn truncated(text: &str) -> String {
    const SHOWN: usize = 64;
    match text.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Addresses no destination may be, declared or not: link-local (which holds the cloud
/// metadata service at 169.254.169.254), unspecified and broadcast. A DNS answer pointing
/// there is a classic SSRF pivot. Judged on the canonical form.
pub(crate) fn is_never_reachable(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_unspecified() || v4.is_broadcast(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80 || v6.is_unspecified(),
    }
}

/// Every address that is not on the public internet: what undeclared destinations may not be
/// or resolve to unless `undeclaredDestinations` says otherwise (smokescreen's default).
pub(crate) fn non_public_networks() -> Vec<IpNet> {
    [
        "0.0.0.0/8",       // "this network" (RFC 791)
        "10.0.0.0/8",      // private (RFC 1918)
        "100.64.0.0/10",   // carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",     // loopback: egressd's own admin port lives here
        "169.254.0.0/16",  // link-local, cloud metadata
        "172.16.0.0/12",   // private
        "192.0.0.0/24",    // IETF protocol assignments (RFC 6890)
        "192.0.2.0/24",    // documentation (TEST-NET-1)
        "192.168.0.0/16",  // private
        "198.18.0.0/15",   // benchmarking (RFC 2544)
        "198.51.100.0/24", // documentation (TEST-NET-2)
        "203.0.113.0/24",  // documentation (TEST-NET-3)
        "224.0.0.0/4",     // multicast
        "240.0.0.0/4",     // reserved, and broadcast
        "::/128",          // unspecified
        "::1/128",         // loopback
        "64:ff9b:1::/48",  // local-use NAT64 (RFC 8215): embeds IPv4 addresses of any kind
        "100::/64",        // discard-only (RFC 6666)
        "2001:db8::/32",   // documentation
        "fc00::/7",        // unique local
        "fe80::/10",       // link-local
        "ff00::/8",        // multicast
    ]
    .iter()
    .map(|cidr| cidr.parse().expect("a valid CIDR literal"))
    .collect()
}

/// A CIDR in canonical form: an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the IPv4
/// network it stands for, so it matches the canonical addresses it is compared with.
pub(crate) fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::new_assert(v4.into(), v6.prefix_len() - 96),
            None => net,
        },
        _ => net,
    }
}

/// Which addresses undeclared destinations (`AllowAny`, `AuditOnly`) may be or resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddressPolicy {
    /// Opens addresses the denied list holds (`undeclaredDestinations.allowedAddresses`).
    pub(crate) allowed: Arc<[IpNet]>,
    /// `undeclaredDestinations.deniedAddresses`: every non-public network by default.
    pub(crate) denied: Arc<[IpNet]>,
}

impl Default for AddressPolicy {
    fn default() -> Self {
        AddressPolicy {
            allowed: Arc::new([]),
            denied: non_public_networks().into(),
        }
    }
}

impl AddressPolicy {
    /// Whether `ip` (any spelling) is refused: never-reachable addresses always, then the
    /// allowed list before the denied one.
    pub(crate) fn refuses(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        if is_never_reachable(ip) {
            return true;
        }
        if self.allowed.iter().any(|net| net.contains(&ip)) {
            return false;
        }
        self.denied.iter().any(|net| net.contains(&ip))
    }
}

/// What a declared FQDN Backend's DNS answers may be (`destination.fqdn.allowedAddresses`).
///
/// A declared name is trusted to be *a* service, not to be any address: whoever controls its
/// DNS (or poisons it) could point it at the cloud metadata service or at egressd's own admin
/// port and turn every client allowed to reach the Backend into an SSRF. So answers in
/// link-local, unspecified ("this network", which Linux connects to loopback), broadcast and
/// multicast ranges are refused, and loopback too unless the name itself means loopback
/// (`localhost`, `*.localhost`, RFC 6761 §6.3). Private ranges stay allowed: declared names
/// are often internal services. `allowedAddresses` opens any of these ranges for one Backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct AnswerPolicy {
    /// `allowedAddresses`, canonical.
    allowed: Arc<[IpNet]>,
    /// The name means loopback (RFC 6761): loopback answers are what it should get.
    loopback_name: bool,
}

/// Whether `host` (lowercase, no final dot) is one of the names RFC 6761 reserves for
/// loopback.
pub(crate) fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost")
}

impl AnswerPolicy {
    /// The policy for the declared name `host` with the Backend's `allowedAddresses`.
    pub(crate) fn declared(host: &str, allowed: Vec<IpNet>) -> Self {
        AnswerPolicy {
            allowed: allowed.into_iter().map(canonical_net).collect(),
            loopback_name: is_loopback_name(host),
        }
    }

    /// Why the answer `ip` (any spelling) is refused, or `None` when it may be used.
    pub(crate) fn refuses(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = canonical_ip(ip);
        let why = match ip {
            IpAddr::V4(v4) if v4.is_link_local() => "link-local",
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => "link-local",
            IpAddr::V4(v4) if v4.octets()[0] == 0 => "unspecified",
            IpAddr::V6(v6) if v6.is_unspecified() => "unspecified",
            IpAddr::V4(v4) if v4.is_broadcast() => "broadcast",
            IpAddr::V4(v4) if v4.is_multicast() => "multicast",
            IpAddr::V6(v6) if v6.is_multicast() => "multicast",
            IpAddr::V4(v4) if v4.is_loopback() && !self.loopback_name => "loopback",
            IpAddr::V6(v6) if v6.is_loopback() && !self.loopback_name => "loopback",
            _ => return None,
        };
        if self.allowed.iter().any(|net| net.contains(&ip)) {
            return None;
        }
        Some(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_spellings_of_ipv4_addresses_become_ipv4() {
        for spelling in [
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "::ffff:7f00:1",
        ] {
            assert_eq!(canonical_ip(ip(spelling)), ip("127.0.0.1"), "{spelling}");
        }
        for own in ["::", "::1", "2001:db8::1", "64:ff9b:1::7f00:1", "fe80::1"] {
            assert_eq!(canonical_ip(ip(own)), ip(own), "{own}");
        }
    }

    #[test]
    fn hosts_are_lowered_and_literals_canonical() {
        let ok = |raw: &str| canonical_host(raw).unwrap().into_owned();
        assert_eq!(ok("Example.COM."), "example.com");
        assert_eq!(ok("api.example.com"), "api.example.com");
        assert!(matches!(
            canonical_host("api.example.com"),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(ok("my_host.internal"), "my_host.internal");
        assert_eq!(ok("[::ffff:127.0.0.1]"), "127.0.0.1");
        assert_eq!(ok("[::FFFF:7F00:1]"), "127.0.0.1");
        assert_eq!(ok("[64:ff9b::a9fe:a9fe]"), "169.254.169.254");
        assert_eq!(ok("[0:0::1]"), "[::1]");
        assert_eq!(ok("127.0.0.1."), "127.0.0.1");
        assert_eq!(ok("1.example"), "1.example");
    }

    #[test]
    fn what_is_not_a_host_is_refused() {
        let long = "a".repeat(254);
        let label = format!("{}.com", "a".repeat(64));
        for (raw, why) in [
            ("", InvalidHost::Empty),
            (".", InvalidHost::Empty),
            (long.as_str(), InvalidHost::TooLong(254)),
            (label.as_str(), InvalidHost::BadLabel),
            ("a..b", InvalidHost::BadLabel),
            ("example.com..", InvalidHost::BadLabel),
            ("exa mple.com", InvalidHost::BadCharacter),
            ("ex%61mple.com", InvalidHost::BadCharacter),
            ("127.1", InvalidHost::NumericHost),
            ("2130706433", InvalidHost::NumericHost),
            ("0x7f.0.0.1", InvalidHost::NumericHost),
            ("127.0.0.0x1", InvalidHost::NumericHost),
            ("010.0.0.1", InvalidHost::NumericHost),
            (
                "[::ffff:127.0.0.1",
                InvalidHost::BadIpv6("::ffff:127.0.0.1".into()),
            ),
        ] {
            assert_eq!(canonical_host(raw), Err(why), "{raw:?}");
        }
        assert!(matches!(
            canonical_host("[fe80::1%25eth0]"),
            Err(InvalidHost::BadIpv6(_))
        ));
    }

    #[test]
    fn the_policy_judges_every_spelling_alike() {
        let policy = AddressPolicy::default();
        for denied in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
            "::1",
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "224.0.0.1",
            "0.0.0.0",
            "::",
        ] {
            assert!(policy.refuses(ip(denied)), "{denied}");
        }
        for public in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "::ffff:93.184.216.34",
        ] {
            assert!(!policy.refuses(ip(public)), "{public}");
        }
        let opened = AddressPolicy {
            allowed: vec!["127.0.0.0/8".parse().unwrap()].into(),
            ..AddressPolicy::default()
        };
        assert!(!opened.refuses(ip("::ffff:127.0.0.1")));
        let opened = AddressPolicy {
            allowed: vec!["169.254.0.0/16".parse().unwrap()].into(),
            ..AddressPolicy::default()
        };
        assert!(
            opened.refuses(ip("169.254.169.254")),
            "link-local stays refused"
        );
    }

    #[test]
    fn declared_names_may_not_resolve_to_metadata_loopback_or_multicast() {
        let policy = AnswerPolicy::declared("api.example.com", vec![]);
        for (answer, why) in [
            ("169.254.169.254", "link-local"),
            ("::ffff:169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("::", "unspecified"),
            ("255.255.255.255", "broadcast"),
            ("224.0.0.251", "multicast"),
            ("ff02::fb", "multicast"),
            ("127.0.0.1", "loopback"),
            ("127.3.4.5", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("64:ff9b::7f00:1", "loopback"),
            ("::1", "loopback"),
        ] {
            assert_eq!(policy.refuses(ip(answer)), Some(why), "{answer}");
        }
        for private in [
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "fd00::1",
            "93.184.216.34",
        ] {
            assert_eq!(policy.refuses(ip(private)), None, "{private}");
        }
        for name in ["localhost", "api.localhost"] {
            let policy = AnswerPolicy::declared(name, vec![]);
            assert_eq!(policy.refuses(ip("127.0.0.1")), None, "{name}");
            assert_eq!(policy.refuses(ip("::1")), None, "{name}");
            assert_eq!(policy.refuses(ip("169.254.169.254")), Some("link-local"));
        }
        assert!(!is_loopback_name("localhost.example.com"));
        assert!(!is_loopback_name("notlocalhost"));
        let opened = AnswerPolicy::declared(
            "metadata.internal",
            vec!["::ffff:169.254.169.254/128".parse().unwrap()],
        );
        assert_eq!(opened.refuses(ip("169.254.169.254")), None);
        assert_eq!(opened.refuses(ip("169.254.169.253")), Some("link-local"));
    }

    #[test]
    fn mapped_networks_become_ipv4_networks() {
        let net: IpNet = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(canonical_net(net), "10.0.0.0/8".parse::<IpNet>().unwrap());
    }
}
