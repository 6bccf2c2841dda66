//! Phase "destination": where the client wants to go (the absolute URI's or `Host`'s host and
//! port), checked and canonicalised before anything routes, records or judges it; and the
//! request's head checked against the downstream limits and for loops through egressd.

use http::header;
use http::uri::{Authority, PathAndQuery, Uri};
use http::{Method, Request};

use super::ctx::RequestCtx;
use crate::http::error::{HelloRejection, ProxyError};
use crate::http::headers::{egressd_hops, MAX_EGRESSD_HOPS};
use crate::http::limits::HeadRejection;

/// Where the client wants to go, from the absolute URI or `Host`.
#[derive(Debug)]
pub(super) struct Destination {
    /// The host in canonical form (`upstream::address::canonical_host`), only when that is not
    /// the client's text without its trailing dot (the common case needs no copy).
    canonical: Option<String>,
    /// The length of the host at the start of `authority` (userinfo is refused, so the host
    /// starts it), without its trailing dot: `host()` is called several times per request and
    /// `Authority::host` parses again each time.
    host_len: usize,
    pub(super) port: Option<u16>,
    /// The authority as the client gave it (used as `Host` when not rewritten).
    pub(super) authority: Authority,
    /// 80 for `http` (and origin-form on plaintext listeners), 443 for `https`.
    pub(super) scheme_default_port: u16,
}

impl Destination {
    /// Lower-case, without port or trailing dot, IP literals canonical (IPv6 in brackets).
    pub(super) fn host(&self) -> &str {
        match &self.canonical {
            Some(h) => h,
            None => self
                .authority
                .as_str()
                .get(..self.host_len)
                .unwrap_or_default(),
        }
    }

    /// A passthrough connection's destination: its SNI, canonical, on TLS's own port 443 (the
    /// ClientHello names no port). An SNI that is no host name is the client's error.
    pub(super) fn of_sni(sni: &str) -> Result<Destination, ProxyError> {
        let invalid = |e: String| ProxyError::ClientHello(HelloRejection::InvalidSni(e));
        let host = crate::upstream::address::canonical_host(sni)
            .map_err(|e| invalid(e.to_string()))?
            .into_owned();
        let authority = host
            .parse::<Authority>()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Destination {
            canonical: None,
            host_len: host.len(),
            port: None,
            authority,
            scheme_default_port: 443,
        })
    }

    /// The port asked for, or the scheme's.
    pub(super) fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(self.scheme_default_port)
    }
}

/// Phase "destination".
pub(super) fn phase<B: http_body::Body>(
    ctx: &RequestCtx<'_>,
    req: &Request<B>,
) -> Result<Destination, ProxyError> {
    crate::http::limits::check_head(req, &ctx.snapshot.settings.downstream.head)?;
    // Only a body without a known length can be framed by `Transfer-Encoding` (hyper refuses
    // it in HTTP/1.0, h2 in HTTP/2): most requests skip the header lookup.
    if req.version() == http::Version::HTTP_11 && req.body().size_hint().exact().is_none() {
        crate::http::limits::check_transfer_codings(req.headers())?;
    }
    let dest = destination(req, ctx.conn.tls)?;
    if let Some(tunnel) = &ctx.conn.tunnel {
        same_as_tunnel(req, &dest, tunnel)?;
    }
    // A request that keeps coming back (a Backend or destination pointing at egressd itself)
    // is stopped here instead of multiplying until a limit breaks.
    let hops = egressd_hops(req.headers());
    if hops >= MAX_EGRESSD_HOPS {
        return Err(ProxyError::LoopDetected { hops });
    }
    Ok(dest)
}

/// Inside a tunnel served as HTTP, every request is for the CONNECT's host and port (RFC 9110
/// §15.5.20: 421 for a request this connection cannot serve), and none is a CONNECT itself.
fn same_as_tunnel<B>(
    req: &Request<B>,
    dest: &Destination,
    tunnel: &super::ctx::TunnelOrigin,
) -> Result<(), ProxyError> {
    // An extended CONNECT (`:protocol`, a websocket over HTTP/2) is a request like any other.
    let extended = req.extensions().get::<hyper::ext::Protocol>().is_some();
    if req.method() == Method::CONNECT && !extended {
        return Err(ProxyError::InvalidRequest(
            "a CONNECT inside a CONNECT tunnel".into(),
        ));
    }
    let port = dest.port_or_default();
    if dest.host() != &*tunnel.host || port != tunnel.port {
        return Err(ProxyError::Misdirected {
            tunnel: format!("{}:{}", tunnel.host, tunnel.port),
            asked: format!("{}:{port}", dest.host()),
        });
    }
    Ok(())
}

/// The request's path normalised (`downstream.paths`, see `http::path`) before anything
/// matches it and before it is forwarded; the URI is replaced only when the path changes.
/// Targets without a path (`CONNECT host:port`, `OPTIONS *`) are left alone.
pub(super) fn normalize_path<B>(
    ctx: &RequestCtx<'_>,
    req: &mut Request<B>,
) -> Result<(), ProxyError> {
    let uri = req.uri();
    let path = uri.path();
    if !path.starts_with('/') {
        return Ok(());
    }
    let rules = &ctx.snapshot.settings.downstream.paths;
    let Some(normal) = crate::http::path::normalize(path, rules).map_err(HeadRejection::Path)?
    else {
        return Ok(());
    };
    let path_and_query = match uri.query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    let mut parts = uri.clone().into_parts();
    // Only characters the path had, or unreserved ones, or `%XY`: always a valid path.
    let invalid =
        |e: &dyn std::fmt::Display| ProxyError::InvalidRequest(format!("normalised path: {e}"));
    parts.path_and_query = Some(PathAndQuery::try_from(path_and_query).map_err(|e| invalid(&e))?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|e| invalid(&e))?;
    Ok(())
}

/// The host and port the client asked for. `tls`: the request arrived on an HTTPS listener, so
/// a `Host` without a port means 443.
fn destination<B>(req: &Request<B>, tls: bool) -> Result<Destination, ProxyError> {
    // RFC 9112 §3.2: a server answers 400 to any HTTP/1.1 request without Host, absolute-form
    // and CONNECT included (HTTP/1.0 may omit it; HTTP/2 has `:authority`).
    if req.version() == http::Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        return Err(ProxyError::InvalidRequest(
            "an HTTP/1.1 request needs a Host header".into(),
        ));
    }
    check_target_form(req)?;
    let uri = req.uri();
    // Absolute-form (forward proxy) and HTTP/2 requests carry the authority in the URI; RFC
    // 9112 §3.2.2 says a proxy then ignores Host.
    let (authority, default_port) = match uri.authority() {
        Some(a) => (
            a.clone(),
            if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            },
        ),
        None => {
            let host = req.headers().get(header::HOST).ok_or_else(|| {
                ProxyError::InvalidRequest("no Host header and no absolute URI".into())
            })?;
            let authority = host
                .to_str()
                .ok()
                .and_then(|h| h.parse::<Authority>().ok())
                .ok_or_else(|| ProxyError::InvalidRequest("malformed Host header".into()))?;
            (authority, if tls { 443 } else { 80 })
        }
    };
    if authority.as_str().contains('@') {
        return Err(ProxyError::InvalidRequest(
            "userinfo in the request authority is not allowed".into(),
        ));
    }
    // Checked and canonicalised before anything routes, records or judges it: a host that is
    // no host name or IP literal never reaches a table, and every spelling of an address is
    // one address.
    let raw = host_of(authority.as_str());
    // After the host: nothing, or `:` and the port (`Authority` checked it is digits; RFC 3986
    // §3.2.3 allows it empty, meaning the scheme's).
    let port = match &authority.as_str()[raw.len()..] {
        "" | ":" => None,
        after => match after.strip_prefix(':').map(str::parse::<u16>) {
            Some(Ok(port)) => Some(port),
            _ => return Err(ProxyError::InvalidRequest("invalid port".into())),
        },
    };
    let (canonical, host_len) = match crate::upstream::address::canonical_host(raw) {
        Ok(std::borrow::Cow::Borrowed(host)) => (None, host.len()),
        Ok(std::borrow::Cow::Owned(host)) => (Some(host), 0),
        Err(e) => return Err(ProxyError::InvalidRequest(format!("invalid host: {e}"))),
    };
    Ok(Destination {
        canonical,
        host_len,
        port,
        authority,
        scheme_default_port: default_port,
    })
}

/// RFC 9112 §3.2: each request-target form is for its methods, and nothing is guessed for a
/// target that fits none. A bare `host:port` or word (`GET evil.test:8080`, `GET noslash`,
/// which `http::Uri` reads as an authority) is authority-form, for CONNECT only (§3.2.3);
/// `*` is for OPTIONS only (§3.2.4). Before, such a target became the destination, and the
/// request went upstream as `GET /`.
fn check_target_form<B>(req: &Request<B>) -> Result<(), ProxyError> {
    let uri = req.uri();
    if uri.scheme().is_none() && uri.authority().is_some() && req.method() != Method::CONNECT {
        return Err(ProxyError::InvalidRequest(
            "the request target is neither a path nor an absolute URI (a bare host:port is for CONNECT only, RFC 9112 §3.2.3)".into(),
        ));
    }
    if uri.path() == "*" && req.method() != Method::OPTIONS {
        return Err(ProxyError::InvalidRequest(
            "the request target `*` is for OPTIONS only (RFC 9112 §3.2.4)".into(),
        ));
    }
    // `http::Uri` takes bytes over 0x7F as they come; a URI has none (RFC 3986 §2: they are
    // percent-encoded), and a request line with them is invalid (RFC 9112 §3: 400).
    if uri
        .path_and_query()
        .is_some_and(|pq| !pq.as_str().is_ascii())
    {
        return Err(ProxyError::InvalidRequest(
            "the request target has bytes outside ASCII: percent-encode them (RFC 3986 §2.1)"
                .into(),
        ));
    }
    Ok(())
}

/// `Authority::host` of an authority without userinfo (refused before), in one byte loop:
/// `[v6]` with its brackets, else the text before the port.
fn host_of(authority: &str) -> &str {
    let bytes = authority.as_bytes();
    let end = if bytes.first() == Some(&b'[') {
        bytes.iter().position(|&b| b == b']').map(|at| at + 1)
    } else {
        bytes.iter().position(|&b| b == b':')
    };
    authority
        .get(..end.unwrap_or(bytes.len()))
        .unwrap_or(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(host: &str) -> Result<Destination, ProxyError> {
        let req = Request::get("/")
            .header(header::HOST, host)
            .body(())
            .unwrap();
        destination(&req, false)
    }

    #[test]
    fn the_host_is_found_as_http_finds_it() {
        for given in [
            "example.com",
            "example.com:80",
            "example.com:",
            "[::1]",
            "[::1]:8443",
            "a:b:c",
            "",
            "[",
        ] {
            let expected = given.parse::<Authority>().map(|a| a.host().to_owned());
            if let Ok(expected) = expected {
                assert_eq!(host_of(given), expected, "{given}");
            }
        }
    }

    #[test]
    fn host_and_port_are_split_once_and_canonical() {
        for (given, host, port) in [
            ("example.com", "example.com", 80),
            ("example.com.:8080", "example.com", 8080),
            ("Example.COM:81", "example.com", 81),
            ("127.0.0.1:9", "127.0.0.1", 9),
            ("[::1]", "[::1]", 80),
            ("[::1]:8443", "[::1]", 8443),
            ("[0:0::1]:1", "[::1]", 1),
            ("example.com:", "example.com", 80),
        ] {
            let d = dest(given).unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!((d.host(), d.port_or_default()), (host, port), "{given}");
            assert_eq!(d.authority.as_str(), given);
        }
    }

    #[test]
    fn a_port_out_of_range_is_a_bad_request() {
        for given in ["example.com:99999", "example.com:65536", "[::1]:1x"] {
            assert!(
                matches!(dest(given), Err(ProxyError::InvalidRequest(_))),
                "{given}"
            );
        }
    }
}
