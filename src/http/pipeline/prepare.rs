//! Phase "prepare": the request as it goes upstream. Origin-form URI (rewritten if a filter
//! says so), HTTP/1.1 semantics, hop-by-hop headers removed, `Host`, `Via` and
//! `X-Forwarded-For` set, the route's RequestHeaderModifier applied, and the Backend's
//! credentials (`CredentialInjector` extensions) added: the same for requests and websocket
//! upgrades.

use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;

use super::ctx::RequestCtx;
use super::destination::Destination;
use super::route::Routed;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::headers::{add_forwarded_for, append_via, strip_hop_by_hop};
use crate::snapshot::router::RouteEntry;
use crate::snapshot::Target;
use crate::upstream::body::RequestBody;

/// A request ready to go upstream.
pub(super) struct Prepared {
    pub(super) req: Request<RequestBody>,
    /// The request's consistent-hash key hashed, when the Backend balances by one (taken
    /// from the client's headers, before they were rewritten).
    pub(super) hash: Option<u64>,
}

/// Phase "prepare".
pub(super) fn phase(
    ctx: &RequestCtx<'_>,
    req: Request<Incoming>,
    dest: &Destination,
    routed: &Routed<'_>,
) -> Result<Prepared, ProxyError> {
    let target = &**routed.target;
    let hash = request_hash(ctx, target, req.headers());
    let mut req = rewrite(ctx, req, dest, target, routed.entry)?;
    inject_credentials(target, req.headers_mut())?;
    Ok(Prepared { req, hash })
}

/// RFC 9110 §7.6.2: a TRACE or OPTIONS request whose `Max-Forwards` is 0 is answered by
/// egressd as its final recipient, not forwarded: OPTIONS with the methods egressd relays,
/// TRACE with the request it received (without the credentials and cookies in it, §9.3.8).
pub(super) fn final_recipient<B>(req: &Request<B>) -> Option<Response<ProxyBody>> {
    let method = req.method();
    if method != Method::OPTIONS && method != Method::TRACE {
        return None;
    }
    if max_forwards(req.headers())? != 0 {
        return None;
    }
    let mut response = if method == Method::OPTIONS {
        let mut r = Response::new(ProxyBody::empty());
        r.headers_mut().insert(
            header::ALLOW,
            HeaderValue::from_static(
                "GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH",
            ),
        );
        r
    } else {
        let mut echo = format!("TRACE {} HTTP/1.1\r\n", req.uri()).into_bytes();
        for (name, value) in req.headers() {
            if [
                header::AUTHORIZATION,
                header::PROXY_AUTHORIZATION,
                header::COOKIE,
            ]
            .contains(name)
            {
                continue;
            }
            echo.extend_from_slice(name.as_str().as_bytes());
            echo.extend_from_slice(b": ");
            echo.extend_from_slice(value.as_bytes());
            echo.extend_from_slice(b"\r\n");
        }
        echo.extend_from_slice(b"\r\n");
        let mut r = Response::new(ProxyBody::local(echo.into()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("message/http"),
        );
        r
    };
    *response.status_mut() = StatusCode::OK;
    Some(response)
}

/// `Max-Forwards` as a number (a value that is not one is no value).
fn max_forwards(headers: &http::HeaderMap) -> Option<u32> {
    std::str::from_utf8(headers.get(header::MAX_FORWARDS)?.as_bytes())
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Credentials the application never holds (`CredentialInjector` extensions).
fn inject_credentials(target: &Target, headers: &mut http::HeaderMap) -> Result<(), ProxyError> {
    for credential in &target.backend.credentials {
        credential
            .apply(headers)
            .map_err(|reason| ProxyError::CredentialUnavailable {
                backend: target.backend.label.clone(),
                extension: credential.name.clone(),
                reason: reason.to_owned(),
            })?;
    }
    Ok(())
}

/// Origin-form, HTTP/1.1, filtered headers.
fn rewrite(
    ctx: &RequestCtx<'_>,
    req: Request<Incoming>,
    dest: &Destination,
    target: &Target,
    entry: Option<&RouteEntry>,
) -> Result<Request<RequestBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let filters = entry.map(|e| &e.action.filters);
    parts.uri = origin_form(&parts.uri, entry)?;
    let client_version = parts.version;
    parts.version = Version::HTTP_11;

    let headers = &mut parts.headers;
    // HTTP/2 clients always take trailers; HTTP/1.1 clients say so with `TE: trailers`.
    // gRPC needs them whatever the client says.
    let te_trailers = strip_hop_by_hop(headers);
    let trailers = te_trailers || client_version == Version::HTTP_2 || target.port.speaks_grpc();
    if trailers {
        headers.insert(header::TE, trailers_te());
    }
    // hyper answers `100 Continue` itself when egressd first reads a body that is not empty
    // (HTTP/2 clients get none, from hyper or from the upstream): the upstream is not asked
    // again, as Envoy and nginx do not ask it. A request without a body (most) skips the
    // lookup.
    if http_body::Body::size_hint(&body).exact() != Some(0)
        && headers
            .get(header::EXPECT)
            .is_some_and(|e| e.as_bytes().eq_ignore_ascii_case(b"100-continue"))
    {
        headers.remove(header::EXPECT);
    }
    // RFC 9110 §7.6.2: TRACE and OPTIONS count down their hops (0 was answered before).
    if parts.method == Method::OPTIONS || parts.method == Method::TRACE {
        if let Some(hops) = max_forwards(headers).filter(|&n| n > 0) {
            headers.insert(header::MAX_FORWARDS, HeaderValue::from(hops - 1));
        }
    }
    // RFC 9113 §8.2.3: the cookie-pairs HTTP/2 lets a client send as separate fields are one
    // field again on their way to HTTP/1.1 (and an HTTP/2 upstream takes either form).
    if client_version == Version::HTTP_2 {
        join_cookies(headers);
    }
    // The value a rewrite gives (the rule's filter, else the Backend's hostname).
    let rewritten = filters.and_then(|f| f.rewrite_host.clone()).or_else(|| {
        target
            .rewrite_authority
            .then(|| target.port.authority.clone())
            .flatten()
    });
    match rewritten {
        Some(host) => {
            headers.insert(header::HOST, host);
        }
        // The client's authority as it wrote it in `Host` (origin-form): left as it is rather
        // than copied into a new value.
        None if headers
            .get(header::HOST)
            .is_some_and(|h| h.as_bytes() == dest.authority.as_str().as_bytes()) => {}
        None => {
            let host = HeaderValue::from_str(dest.authority.as_str()).map_err(|_| {
                ProxyError::InvalidRequest("authority is not a valid Host value".into())
            })?;
            headers.insert(header::HOST, host);
        }
    }
    append_via(headers, client_version);
    let conn = ctx.conn;
    add_forwarded_for(
        headers,
        &conn.client_header,
        if conn.tls { "https" } else { "http" },
    );
    if let Some(f) = filters {
        f.request_headers.apply(headers);
    }
    Ok(Request::from_parts(parts, RequestBody::from_client(body)))
}

/// Several `cookie` fields joined into one with `; ` (one field or none: nothing to do).
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut fields = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    let mut sensitive = first.is_sensitive();
    for field in headers.get_all(header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(field.as_bytes());
        sensitive |= field.is_sensitive();
    }
    // Valid values joined by "; " are a valid value.
    if let Ok(mut value) = HeaderValue::from_bytes(&joined) {
        value.set_sensitive(sensitive);
        headers.insert(header::COOKIE, value);
    }
}

/// The origin-form URI, with the path rewritten if the rule's filter says so.
fn origin_form(uri: &Uri, entry: Option<&RouteEntry>) -> Result<Uri, ProxyError> {
    let path = uri.path();
    let new_path = entry.and_then(|entry| {
        let rewrite = entry.action.filters.rewrite_path.as_ref()?;
        Some(rewrite.apply(path, &entry.matcher.path))
    });
    let path_and_query = match (new_path, uri.query()) {
        (None, _) => uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
        (Some(p), None) => PathAndQuery::try_from(p)
            .map_err(|e| ProxyError::InvalidRequest(format!("rewritten path: {e}")))?,
        (Some(p), Some(q)) => PathAndQuery::try_from(format!("{p}?{q}"))
            .map_err(|e| ProxyError::InvalidRequest(format!("rewritten path: {e}")))?,
    };
    Ok(Uri::from(path_and_query))
}

/// The request's consistent-hash key hashed, when the Backend balances by one (nothing is
/// computed for the other balancers).
fn request_hash(ctx: &RequestCtx<'_>, target: &Target, headers: &http::HeaderMap) -> Option<u64> {
    target
        .port
        .endpoints
        .hash_key()?
        .hash(headers, ctx.conn.client.ip())
}

/// `te: trailers` for the upstream, when the client can take trailers back (RFC 9110
/// §10.1.4: `TE` is hop-by-hop, so the proxy says it for itself).
fn trailers_te() -> HeaderValue {
    HeaderValue::from_static("trailers")
}
