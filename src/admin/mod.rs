//! The admin server (loopback by default): readiness, liveness, config and status dumps,
//! metrics.
//!
//! | path | what |
//! |---|---|
//! | `/ready` (`/healthz/ready`) | 200 once a config serves; 503 before that and while draining |
//! | `/healthz` | 200 while the process runs |
//! | `/config` (`/config_dump`) | the serving config as JSON, secrets redacted |
//! | `/status` | last reload result, generation, listeners, every object's conditions |
//! | `/metrics` (`/stats/prometheus`) | Prometheus metrics |
//! | `/endpoints` | per Backend port and endpoint: health, ejection (time left, multiplier), requests in flight, connections |
//! | `/blocked` | destinations refused because nothing declares them, with a Backend for each (`?format=yaml`) |
//! | `/` | the console (HTML, for a browser; `console.rs`); the plain-text index for other clients and `/?format=text` |

mod console;
mod endpoints;
mod guard;
mod redact;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::http::sending::BodyLimits;
use crate::listener::cap::{AcceptBackoff, ConnectionCap, Slot};
use crate::listener::detect::{Prefix, ServedIo};
use crate::listener::watchdog::{Activity, Tracked};
use crate::listener::{count_parse_error, drive, http1_server, refused as listener_refused};
use crate::listener::{OnExpiry, Timers};
use crate::snapshot::shared::Shared;
use crate::snapshot::DownstreamSettings;
use crate::telemetry::log_limit::limited;

/// A running admin server; dropping the handle (or `stop`) closes it.
pub(crate) struct AdminHandle {
    pub(crate) addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl AdminHandle {
    pub(crate) fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for AdminHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds the admin address and serves it on the current runtime. Connections are capped
/// (`admin.maxConnections`) and get the proxy's `downstream.headerReadTimeout` and
/// `downstream.idleTimeout`, both read at each accept. At the cap, a new connection makes
/// room by closing the oldest one that has no request in flight (a silent socket, an idle
/// keep-alive): a flood of silent sockets cannot keep a probe out ([`Open`]).
pub(crate) async fn start(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<AdminHandle> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (stop, mut stopped) = watch::channel(false);
    tokio::spawn(async move {
        let cap = Arc::new(ConnectionCap::default());
        let mut open = Open::default();
        let mut backoff = AcceptBackoff::default();
        loop {
            let accepted = tokio::select! {
                _ = async { let _ = stopped.wait_for(|s| *s).await; } => break,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    shared.metrics.downstream_accept_errors.inc();
                    let pause = backoff.next();
                    limited!(warn, error = %e, retry_in = ?pause, "admin accept failed");
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            backoff.reset();
            let accepted_at = tokio::time::Instant::now();
            let (downstream, max) = {
                let snapshot = shared.snapshot.load();
                let settings = &snapshot.settings;
                (settings.downstream, settings.admin_max_connections)
            };
            let Some(slot) = cap
                .try_take(max)
                .or_else(|| make_room(&mut open, &cap, max, &shared))
            else {
                listener_refused(&shared, "admin_max_connections");
                drop(stream);
                limited!(
                    warn,
                    max_connections = max,
                    "admin connection refused: admin.maxConnections connections are open, all busy"
                );
                continue;
            };
            let shared = shared.clone();
            let stopped = stopped.clone();
            let conn = open.register(accepted_at);
            tokio::spawn(async move {
                serve(stream, slot, &downstream, shared, stopped, conn).await;
            });
        }
    });
    tracing::info!(address = %addr, "admin listener bound");
    Ok(AdminHandle { addr, stop })
}

/// At the cap: closes the oldest admin connection with no request in flight, and lets the new
/// one in over the cap while that one closes (never past twice the cap).
fn make_room(
    open: &mut Open,
    cap: &Arc<ConnectionCap>,
    max: usize,
    shared: &Shared,
) -> Option<Slot> {
    if !open.evict_idle() {
        return None;
    }
    listener_refused(shared, "admin_idle_evicted");
    limited!(
        debug,
        "admin connection closed to make room: admin.maxConnections were open, this one idle"
    );
    cap.try_take(max.saturating_mul(2))
}

/// The admin connections open now, oldest first, each with the switch that closes it.
#[derive(Default)]
struct Open(VecDeque<OpenConn>);

struct OpenConn {
    activity: Weak<Activity>,
    evict: watch::Sender<bool>,
}

/// What a served admin connection gets from [`Open::register`].
struct Registered {
    activity: Arc<Activity>,
    evicted: watch::Receiver<bool>,
}

impl Open {
    fn register(&mut self, accepted_at: tokio::time::Instant) -> Registered {
        self.0.retain(|c| c.activity.strong_count() > 0);
        let activity = Activity::new(accepted_at);
        let (evict, evicted) = watch::channel(false);
        self.0.push_back(OpenConn {
            activity: Arc::downgrade(&activity),
            evict,
        });
        Registered { activity, evicted }
    }

    /// Tells the oldest connection with no request in flight to close; whether there was one.
    fn evict_idle(&mut self) -> bool {
        self.0.retain(|c| c.activity.strong_count() > 0);
        let idle = self
            .0
            .iter()
            .position(|c| c.activity.upgrade().is_some_and(|a| !a.is_busy()) && !*c.evict.borrow());
        match idle.and_then(|i| self.0.remove(i)) {
            Some(conn) => conn.evict.send(true).is_ok(),
            None => false,
        }
    }
}

/// Serves one admin connection (HTTP/1.1) until the client closes it, a timeout does, the
/// admin server stops, or a new connection needs its slot while it does nothing.
async fn serve(
    stream: tokio::net::TcpStream,
    slot: Slot,
    settings: &DownstreamSettings,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
    conn: Registered,
) {
    let Registered {
        activity,
        mut evicted,
    } = conn;
    let accepted_at = activity.born();
    let service = {
        let (shared, activity) = (shared.clone(), activity.clone());
        service_fn(move |req| {
            let in_flight = activity.begin();
            let mut response = route(&shared, &req);
            // Every answer is what its Content-Type says (JSON, text, the console's files).
            response.headers_mut().insert(
                header::X_CONTENT_TYPE_OPTIONS,
                header::HeaderValue::from_static("nosniff"),
            );
            let response =
                response.map(|body| Tracked::new(body, in_flight, None, BodyLimits::default()));
            async move { Ok::<_, Infallible>(response) }
        })
    };
    let io = TokioIo::new(ServedIo::new(stream, Prefix::default(), Some(slot)));
    let conn = http1_server(settings).serve_connection(io, service);
    let timers = Timers::new(
        &activity,
        settings.header_read_timeout.map(|t| accepted_at + t),
        settings,
    );
    // The admin server has no drain of its own (it stops with the process): a connection is
    // "drained" when a new one needs its slot while it does nothing.
    let result = drive(
        conn,
        |c| c.graceful_shutdown(),
        OnExpiry::Close,
        timers,
        &mut stopped,
        &mut evicted,
        &shared,
    )
    .await;
    if let Err(e) = result {
        count_parse_error(&shared, &e);
    }
}

fn route(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let allowed = guard::check_host(req, &shared.snapshot.load().settings.admin_allowed_hosts)
        .and_then(|()| match *req.method() {
            Method::GET | Method::HEAD => Ok(()),
            _ => guard::check_origin(req.headers()),
        });
    if let Err(refusal) = allowed {
        limited!(
            warn,
            code = refusal.code(),
            host = ?req.headers().get(header::HOST),
            origin = ?req.headers().get(header::ORIGIN),
            path = req.uri().path(),
            "admin request refused"
        );
        let mut r = text(StatusCode::FORBIDDEN, refusal.explain());
        r.headers_mut().insert(
            crate::http::error::ERROR_HEADER,
            header::HeaderValue::from_static(refusal.code()),
        );
        return r;
    }
    if req.uri().path() == "/logging" {
        return logging(req);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    if let Some(asset) = console::asset(req.uri().path()) {
        return asset;
    }
    match req.uri().path() {
        "/ready" | "/healthz/ready" => {
            if shared.is_ready() {
                text(StatusCode::OK, "ready\n")
            } else if shared.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "no config serving yet\n")
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/config" | "/config_dump" => json(&redact::config_dump(&shared.snapshot.load().config)),
        "/status" => json(&status(shared)),
        "/endpoints" | "/clusters" => json(&endpoints::endpoints(&shared.snapshot.load())),
        "/blocked" => blocked(shared, req.uri().query()),
        "/metrics" | "/stats/prometheus" => {
            endpoints::refresh_gauges(shared);
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (body, content_type) = shared.metrics.encode_for(accept);
            let mut r = text(StatusCode::OK, &body);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(content_type),
            );
            r
        }
        "/" => console::index(req),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /ready /healthz /config /status /endpoints /blocked /metrics\n",
        ),
    }
}

/// `/logging`: `GET` shows the log filter, `POST /logging?level=FILTER` changes it (`debug`,
/// or `RUST_LOG` syntax such as `info,egressd::upstream=trace`). A POST, so that a crawler or a
/// prefetching browser never changes it by following a link.
fn logging(req: &Request<Incoming>) -> Response<Full<Bytes>> {
    use crate::telemetry::log_level;
    match *req.method() {
        Method::GET | Method::HEAD => match log_level::current() {
            Some(filter) => text(StatusCode::OK, &format!("{filter}\n")),
            None => text(StatusCode::NOT_FOUND, "no adjustable log filter\n"),
        },
        Method::POST | Method::PUT => {
            let level = req.uri().query().and_then(|q| {
                q.split('&')
                    .find_map(|p| p.strip_prefix("level="))
                    .map(percent_decode)
            });
            let Some(level) = level else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "say which filter: POST /logging?level=debug\n",
                );
            };
            match log_level::set(&level) {
                Ok(filter) => text(StatusCode::OK, &format!("{filter}\n")),
                Err(e) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
            }
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET, or POST ?level=\n"),
    }
}

/// `%XX` escapes and `+` decoded (a filter such as `info,egressd=debug` arrives as
/// `info%2Cegressd%3Ddebug` from some clients).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/blocked`: destinations refused because nothing declares them, the most recent first,
/// each with a Backend that would allow it; `?format=yaml`: just those Backends, one YAML
/// document each, ready for the config directory.
fn blocked(shared: &Shared, query: Option<&str>) -> Response<Full<Bytes>> {
    let limits = shared.snapshot.load().settings.blocked_audit;
    let list = shared.blocked_destinations.list(limits);
    if query.is_some_and(|q| q.split('&').any(|p| p == "format=yaml")) {
        let docs: Vec<String> = list
            .iter()
            .filter(|b| b.client.is_none())
            .map(|b| b.backend_yaml())
            .collect();
        let mut r = text(StatusCode::OK, &docs.join("---\n"));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/yaml"),
        );
        return r;
    }
    let entries: Vec<serde_json::Value> = list.iter().map(|b| b.to_json()).collect();
    json(&serde_json::json!({
        "capacity": limits.max_entries,
        "blocked": entries,
    }))
}

fn status(shared: &Shared) -> serde_json::Value {
    let snapshot = shared.snapshot.load();
    let listeners: Vec<serde_json::Value> = shared
        .bound
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(key, addr)| serde_json::json!({"name": key.as_ref(), "address": addr.to_string()}))
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "ready": shared.is_ready(),
        "draining": shared.is_draining(),
        "generation": snapshot.generation,
        "lastReload": shared.reload_status(),
        "listeners": listeners,
        "objects": snapshot.status().objects,
        "interception": snapshot.interception.as_ref().map(|i| {
            let ca = i.ca();
            serde_json::json!({
                "caSubject": ca.subject(),
                "caFingerprintSha256": ca.fingerprint_sha256(),
                "caNotAfter": crate::telemetry::time::rfc3339(
                    std::time::UNIX_EPOCH
                        + std::time::Duration::from_secs(u64::try_from(ca.not_after_unix()).unwrap_or(0)),
                ),
                "cachedHosts": i.cached_hosts(),
                "certificatesMade": i.minted_total(),
                "certificatesFailed": i.mint_failures_total(),
            })
        }),
        "rateLimits": snapshot.rate_limits.iter().map(|p| rate_limit_status(&p.0)).collect::<Vec<_>>(),
        "redis": snapshot.rate_limit_store.as_ref().map(|store| redis_status(store)),
    })
}

/// One rate limit policy (per scope) in `/status`: each rule's limit and, for local rules,
/// what its counters hold now.
pub(crate) fn rate_limit_status(
    policy: &crate::ratelimit::rules::RateLimitPolicy,
) -> serde_json::Value {
    use crate::ratelimit::rules::{Counter, LocalCounter};
    let now = crate::ratelimit::clock::now_ms();
    let rules = |kind: &str, rules: &[crate::ratelimit::rules::Rule]| -> Vec<serde_json::Value> {
        rules
            .iter()
            .map(|r| {
                let mut rule = serde_json::json!({
                    "name": &*r.label,
                    "counts": kind,
                    "requests": r.quota.requests,
                    "periodSeconds": r.quota.period.as_secs(),
                });
                if let Counter::Local(counter) = &r.counter {
                    match &**counter {
                        LocalCounter::One(c) => rule["used"] = c.used(r.quota, now).into(),
                        LocalCounter::Distinct(t) => {
                            rule["usedMax"] = t.used_max(r.quota, now).into();
                            rule["distinctValues"] = t.len().into();
                            rule["evicted"] = t.evicted().into();
                            rule["maxBytes"] = t.max_bytes().into();
                        }
                    }
                }
                rule
            })
            .collect()
    };
    let mut all = rules("local", &policy.local);
    all.extend(rules("global", &policy.global));
    serde_json::json!({
        "policy": &*policy.name,
        "scope": &*policy.scope,
        "mode": if policy.report { "Report" } else { "Enforce" },
        "rules": all,
    })
}

/// The Redis store of global rate limits in `/status`: where, and whether it answers.
pub(crate) fn redis_status(store: &crate::ratelimit::redis::GlobalStore) -> serde_json::Value {
    use crate::ratelimit::redis::StoreState;
    let health = store.health();
    let (state, error) = match &health.state {
        StoreState::Connecting => ("connecting", None),
        StoreState::Up => ("up", None),
        StoreState::Down { error, .. } => ("down", Some(error.clone())),
    };
    let time = |t: std::time::SystemTime| crate::telemetry::time::rfc3339(t);
    let down_since = match &health.state {
        StoreState::Down { since, .. } => Some(time(*since)),
        _ => None,
    };
    serde_json::json!({
        "address": store.settings().address,
        "state": state,
        "downSince": down_since,
        "lastSuccess": health.last_success.map(time),
        "failedConnects": health.failed_connects,
        "errors": {
            "unavailable": health.errors.unavailable,
            "timeout": health.errors.timeout,
            "auth": health.errors.auth,
            "other": health.errors.other,
        },
        "lastError": error,
    })
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(value: &serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}
