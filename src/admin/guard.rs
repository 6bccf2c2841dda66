//! Which requests the admin server answers at all: the `Host` check against DNS rebinding and
//! the `Origin` check against cross-site requests that change something.
//!
//! The admin port is on loopback, and the console invites a browser to it. A page on any web
//! site can make that browser send requests to `127.0.0.1:15000`: either directly (the page
//! cannot read the answer, but a `POST` still takes effect) or, after pointing its own name at
//! 127.0.0.1 (DNS rebinding), as "same origin", reading config and status. The two checks
//! close both doors, as Jupyter, webpack-dev-server and Vite do:
//!
//! - `Host` must be an IP literal, `localhost` or `*.localhost` (RFC 6761: names that can only
//!   mean loopback), or a name `admin.allowedHosts` lists. A rebinding page's Host is its own
//!   domain, which nobody listed. Probes and scrapers address the admin port by IP; `kubectl
//!   port-forward` users by `localhost`.
//! - A request that changes something (`POST /logging`) from a browser must come from the
//!   console itself: `Sec-Fetch-Site` `same-origin` (or `none`, typed by the person), and an
//!   `Origin`, if any, that names this very host. curl sends neither header.

use http::{header, HeaderMap, Request};

use crate::names::hostname_matches;
use crate::upstream::address::is_loopback_name;

/// Why a request was refused (403); the `x-egressd-error` code and the text of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `Host` names something `admin.allowedHosts` does not list.
    Host,
    /// A browser sent a request that changes something from another origin.
    CrossOrigin,
}

impl Refusal {
    pub(super) fn code(self) -> &'static str {
        match self {
            Refusal::Host => "admin_host_not_allowed",
            Refusal::CrossOrigin => "admin_cross_origin",
        }
    }

    pub(super) fn explain(self) -> &'static str {
        match self {
            Refusal::Host => {
                "the admin server answers requests with one Host that is an IP address, \
                 localhost, or listed in ProxyConfig spec.admin.allowedHosts\n"
            }
            Refusal::CrossOrigin => {
                "a change through the admin server must come from its own page or a non-browser \
                 client\n"
            }
        }
    }
}

/// The `Host` check: `Ok` for a request the admin server answers.
/// Exactly one `Host` (or an absolute-form authority) is judged: none (HTTP/1.0) or two are
/// refused, as a request whose host is ambiguous.
pub(super) fn check_host<B>(req: &Request<B>, allowed: &[String]) -> Result<(), Refusal> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(value), None) => value.to_str().map_err(|_| Refusal::Host)?,
        (Some(_), Some(_)) => return Err(Refusal::Host),
        (None, _) => match req.uri().authority() {
            Some(authority) => authority.as_str(),
            None => return Err(Refusal::Host),
        },
    };
    if host_allowed(host, allowed) {
        Ok(())
    } else {
        Err(Refusal::Host)
    }
}

/// The `Origin` check for requests that change something.
pub(super) fn check_origin(headers: &HeaderMap) -> Result<(), Refusal> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(Refusal::CrossOrigin);
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).map(|h| h.as_bytes());
    // `Origin: null` (a sandboxed frame, a redirect) never names this host.
    let named = origin
        .as_bytes()
        .strip_prefix(b"http://")
        .is_some_and(|rest| host.is_some_and(|h| rest.eq_ignore_ascii_case(h)));
    if named {
        Ok(())
    } else {
        Err(Refusal::CrossOrigin)
    }
}

/// Whether a `Host` value (`name`, `name:port`, `[v6]:port`) is one the admin server answers.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // An IPv6 literal: `[::1]`, `[::1]:15000`.
        Some(rest) => {
            return rest.split_once(']').is_some_and(|(v6, port)| {
                v6.parse::<std::net::Ipv6Addr>().is_ok()
                    && (port.is_empty() || port.strip_prefix(':').is_some_and(valid_port))
            });
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    is_loopback_name(&name)
        || allowed
            .iter()
            .any(|pattern| pattern == "*" || hostname_matches(pattern, &name))
}

/// One to five digits.
fn valid_port(p: &str) -> bool {
    (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(host: Option<&str>) -> Request<()> {
        let mut b = Request::get("/status");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn ip_literals_and_localhost_names_pass_without_configuration() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:15000",
            "10.1.2.3:15000",
            "[::1]",
            "[::1]:15000",
            "localhost",
            "LOCALHOST:15000",
            "localhost.:15000",
            "egressd.localhost:15000",
        ] {
            assert_eq!(check_host(&get(Some(host)), &[]), Ok(()), "{host}");
        }
    }

    #[test]
    fn no_host_or_two_hosts_are_refused() {
        // HTTP/1.0 without Host, and a second Host behind an allowed one: whose host is it?
        assert_eq!(check_host(&get(None), &[]), Err(Refusal::Host));
        let mut two = get(Some("127.0.0.1"));
        two.headers_mut()
            .append(header::HOST, "rebind.attacker.test".parse().unwrap());
        assert_eq!(check_host(&two, &[]), Err(Refusal::Host));
    }

    #[test]
    fn other_names_pass_only_when_listed() {
        for host in [
            "evil.example:15000",
            "rebind.attacker.test",
            "admin",
            "localhost.evil.example",
            "127.0.0.1.nip.io:15000",
            "[::1",
            "[zz]:1",
            "127.0.0.1:port",
            "127.0.0.1:123456",
            "",
        ] {
            assert_eq!(
                check_host(&get(Some(host)), &[]),
                Err(Refusal::Host),
                "{host}"
            );
        }
        let allowed = ["egressd-admin.ops.svc".to_owned(), "*.corp.test".to_owned()];
        assert_eq!(
            check_host(&get(Some("egressd-admin.ops.svc:15000")), &allowed),
            Ok(())
        );
        assert_eq!(check_host(&get(Some("a.b.corp.test")), &allowed), Ok(()));
        assert_eq!(
            check_host(&get(Some("corp.test")), &allowed),
            Err(Refusal::Host)
        );
        assert_eq!(
            check_host(&get(Some("anything.example")), &["*".to_owned()]),
            Ok(())
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_change_from_another_origin_is_refused() {
        let same = [
            vec![("host", "127.0.0.1:15000")],
            vec![
                ("host", "127.0.0.1:15000"),
                ("sec-fetch-site", "same-origin"),
            ],
            vec![("host", "127.0.0.1:15000"), ("sec-fetch-site", "none")],
            vec![
                ("host", "localhost:15000"),
                ("origin", "http://localhost:15000"),
            ],
        ];
        for h in same {
            assert_eq!(check_origin(&headers(&h)), Ok(()), "{h:?}");
        }
        let cross = [
            vec![
                ("host", "127.0.0.1:15000"),
                ("sec-fetch-site", "cross-site"),
            ],
            vec![("host", "127.0.0.1:15000"), ("sec-fetch-site", "same-site")],
            vec![
                ("host", "127.0.0.1:15000"),
                ("origin", "http://evil.example"),
            ],
            vec![("host", "127.0.0.1:15000"), ("origin", "null")],
            vec![
                ("host", "127.0.0.1:15000"),
                ("origin", "https://127.0.0.1:15000"),
            ],
            vec![("origin", "http://127.0.0.1:15000")],
        ];
        for h in cross {
            assert_eq!(
                check_origin(&headers(&h)),
                Err(Refusal::CrossOrigin),
                "{h:?}"
            );
        }
    }
}
