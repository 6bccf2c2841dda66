//! The active health checker: one task per endpoint group, probing each endpoint every
//! `interval` over a fresh connection made exactly as the Backend port says (TLS mode, SNI,
//! verification, HTTP version), and reporting the results to the group.
//!
//! Scheduling: the group's endpoints start at offsets spread evenly over one interval from a
//! random phase (`health::start_offset`), so checks are never fired all at once; afterwards
//! each endpoint is checked `interval` (+ jitter) after its previous check ended. The next due
//! time is kept in the endpoint, so the checker a reload starts carries on the schedule of the
//! one it replaces, and endpoints a DNS refresh adds are picked up on the next round.
//!
//! Lifetime: a checker stops when its group is dropped (it holds a `Weak`, like the outlier
//! tick) or when a newer config started checkers of its own (the epoch changed): the new
//! snapshot's groups own the endpoints' health from then on, and a result of the old checker
//! that arrives late is dropped instead of being counted twice.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::header::{HOST, USER_AGENT};
use http::HeaderValue;
use tokio::sync::watch;
use tokio::time::Instant;

use super::connect::{connect_http, connect_tcp, ConnectError, Http2Options, HttpConnection};
use super::connect::{HttpWire, Transport};
use super::{Endpoint, EndpointGroup};
use crate::balance::health::{start_offset, ActiveSettings, CheckKind, CheckResult, HttpCheck};
use crate::upstream::body::RequestBody;

/// What a checker needs besides the group's settings: how to reach the endpoints.
#[derive(Clone, Debug)]
pub(crate) struct CheckPlan {
    pub(crate) group: Weak<EndpointGroup>,
    /// `namespace/name`, for the metric and the logs.
    pub(crate) backend: Arc<str>,
    /// `Host` for HTTP checks: `http.host`, else the Backend's hostname (with the port when it
    /// is not the scheme's default); `None` for IP Backends: the endpoint's address.
    pub(crate) host: Option<HeaderValue>,
    pub(crate) transport: Transport,
    pub(crate) wire: HttpWire,
    pub(crate) http2: Arc<Http2Options>,
    /// The port's MCP options, for `type: MCP` (None: not an MCP port; `/mcp`, any version).
    pub(crate) mcp: Option<Arc<crate::mcp::McpPort>>,
}

pub(crate) use crate::telemetry::metrics::CheckCounters;

/// Why an HTTP check failed.
#[derive(Debug, thiserror::Error)]
enum CheckError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("request failed: {0}")]
    Request(#[source] hyper::Error),
    #[error("cannot build the check request: {0}")]
    Build(#[source] http::Error),
    #[error("HTTP/2 connection has no stream available")]
    NoStream,
    #[error("status {0} is not an expected status")]
    Status(u16),
    #[error("MCP {method}: {detail}")]
    Mcp {
        method: &'static str,
        detail: String,
    },
}

/// Runs the checks of `plan`'s group until the group is dropped or `epoch` moves on.
pub(crate) async fn run(plan: CheckPlan, mut epoch: watch::Receiver<u64>, counters: CheckCounters) {
    let mine = *epoch.borrow_and_update();
    let Some(settings) = plan
        .group
        .upgrade()
        .and_then(|g| g.active_settings().cloned())
    else {
        return;
    };
    if let Some(group) = plan.group.upgrade() {
        group.rebuild_pickable();
    }
    let phase = Duration::from_nanos(fastrand::u64(
        ..u64::try_from(settings.interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1),
    ));
    let plan = Arc::new(plan);
    let settings = Arc::new(settings);
    loop {
        let Some(group) = plan.group.upgrade() else {
            return;
        };
        if *epoch.borrow() != mine {
            return;
        }
        let now = Instant::now();
        let list = group.list();
        let n = list.endpoints.len();
        let mut wake = now + settings.interval;
        for (i, endpoint) in list.endpoints.iter().enumerate() {
            let first = now + start_offset(i, n, settings.interval, phase);
            let due = endpoint.health.due_or(first);
            if due > now {
                wake = wake.min(due);
                continue;
            }
            // Not due again before this check can have ended; the check sets the real time.
            let until = now + settings.timeout + settings.interval;
            endpoint.health.set_next_due(until);
            wake = wake.min(until);
            tokio::spawn(check_one(
                plan.clone(),
                settings.clone(),
                endpoint.clone(),
                (epoch.clone(), mine),
                counters.clone(),
            ));
        }
        drop(list);
        drop(group);
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            changed = epoch.changed() => if changed.is_err() || *epoch.borrow() != mine {
                return;
            },
        }
    }
}

/// One check of one endpoint, recorded in its group unless the checker was replaced meanwhile.
async fn check_one(
    plan: Arc<CheckPlan>,
    settings: Arc<ActiveSettings>,
    endpoint: Arc<Endpoint>,
    (epoch, mine): (watch::Receiver<u64>, u64),
    counters: CheckCounters,
) {
    let result = probe(endpoint.addr, &settings, &plan).await;
    endpoint
        .health
        .set_next_due(Instant::now() + settings.next_interval());
    let Some(group) = plan.group.upgrade() else {
        return;
    };
    if *epoch.borrow() != mine {
        return;
    }
    match &result {
        CheckResult::Pass => {
            counters.pass.inc();
        }
        CheckResult::Fail(reason) => {
            counters.fail.inc();
            tracing::debug!(backend = %plan.backend, endpoint = %endpoint.addr, reason, "active health check failed");
        }
    }
    group.record_check(&endpoint, &result);
}

/// Probes `addr` once, within `settings.timeout`.
pub(crate) async fn probe(
    addr: SocketAddr,
    settings: &ActiveSettings,
    plan: &CheckPlan,
) -> CheckResult {
    let timeout = settings.timeout;
    let attempt = async {
        match &settings.kind {
            CheckKind::Tcp => connect_tcp(addr, timeout)
                .await
                .map(drop)
                .map_err(CheckError::from),
            CheckKind::Http(http) => http_check(addr, timeout, http, plan).await,
            CheckKind::Mcp => mcp_check(addr, timeout, plan).await,
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => CheckResult::Fail(format!("no answer within {timeout:?}")),
        Ok(Ok(())) => CheckResult::Pass,
        Ok(Err(e)) => CheckResult::Fail(e.to_string()),
    }
}

/// The `Host` of a check's requests.
fn check_host(addr: SocketAddr, plan: &CheckPlan) -> Result<HeaderValue, CheckError> {
    match &plan.host {
        Some(host) => Ok(host.clone()),
        None => HeaderValue::from_str(&addr.to_string()).map_err(|e| CheckError::Build(e.into())),
    }
}

/// A new connection for one check's requests, sent one after the other.
enum CheckConnection {
    Http1(super::h1_conn::H1Sender),
    Http2(hyper::client::conn::http2::SendRequest<RequestBody>),
}

impl CheckConnection {
    /// Not counted against circuitBreaker.maxConnections: a check must not wait behind
    /// traffic; never a pooled connection: the check is about whether a new one works.
    async fn open(
        addr: SocketAddr,
        timeout: Duration,
        plan: &CheckPlan,
    ) -> Result<Self, CheckError> {
        let (connection, _) = connect_http(
            addr,
            timeout,
            &plan.transport,
            plan.wire,
            &plan.http2,
            None,
            None,
        )
        .await?;
        Ok(match connection {
            HttpConnection::Http1(conn) => CheckConnection::Http1(conn.spawn()),
            HttpConnection::Http2(conn) => {
                let stream = Arc::new(conn).try_claim().ok_or(CheckError::NoStream)?;
                CheckConnection::Http2(stream.sender())
            }
        })
    }

    /// Sends `builder` (its URI a path) with `body`; the target goes into `:authority` on
    /// HTTP/2 (RFC 9113 §8.3.1), into `Host` on HTTP/1.1.
    async fn send(
        &mut self,
        builder: http::request::Builder,
        path: &str,
        host: &HeaderValue,
        plan: &CheckPlan,
        body: RequestBody,
    ) -> Result<http::Response<hyper::body::Incoming>, CheckError> {
        let builder = builder.header(USER_AGENT, "egressd-health-check");
        match self {
            CheckConnection::Http1(sender) => {
                let request = builder
                    .uri(path)
                    .header(HOST, host.clone())
                    .body(body)
                    .map_err(CheckError::Build)?;
                sender.ready().await.map_err(CheckError::Request)?;
                sender
                    .send_request(request)
                    .await
                    .map_err(CheckError::Request)
            }
            CheckConnection::Http2(sender) => {
                let scheme = match plan.transport {
                    Transport::Plain => "http",
                    Transport::Tls(_) => "https",
                };
                let authority = host.to_str().unwrap_or_default();
                let request = builder
                    .uri(format!("{scheme}://{authority}{path}"))
                    .body(body)
                    .map_err(CheckError::Build)?;
                sender
                    .send_request(request)
                    .await
                    .map_err(CheckError::Request)
            }
        }
    }
}

/// `type: MCP`: `initialize` (the version the port names, else the latest with a handshake),
/// `notifications/initialized`, `ping`, then `DELETE` of the session — always, once the server
/// issued one, whatever the other steps gave — so checks leave none behind; for the stateless
/// protocol (`version` 2026-07-28 or later) a self-contained `ping` alone. Passes when `ping`
/// gets a result. JSON and event-stream answers are read alike.
async fn mcp_check(
    addr: SocketAddr,
    timeout: Duration,
    plan: &CheckPlan,
) -> Result<(), CheckError> {
    use crate::mcp::health as probe;
    let version = plan.mcp.as_ref().and_then(|m| m.version.as_deref());
    let mut steps = McpSteps {
        addr,
        timeout,
        plan,
        path: plan.mcp.as_ref().map_or("/mcp", |m| m.path.as_str()),
        host: check_host(addr, plan)?,
        conn: Some(CheckConnection::open(addr, timeout, plan).await?),
    };
    let failed = |method: &'static str| move |detail: String| CheckError::Mcp { method, detail };

    if let Some(version) = version.filter(|v| probe::is_stateless(v)) {
        let headers = probe::headers(None, version, "ping");
        let answer = steps.post(probe::ping(2, Some(version)), headers).await?;
        return probe::read_result(answer, 2)
            .await
            .result
            .map(drop)
            .map_err(failed("ping"));
    }
    let answer = steps.post(probe::initialize(1, version), vec![]).await?;
    let session = answer.headers().get(crate::mcp::SESSION_ID).cloned();
    let initialized = probe::read_result(answer, 1).await;
    steps.answered(initialized.finished);
    let negotiated = initialized
        .result
        .as_ref()
        .ok()
        .and_then(|r| r.get("protocolVersion"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or(version.unwrap_or(probe::LATEST_WITH_INITIALIZE))
        .to_owned();

    let outcome = async {
        initialized.result.map_err(failed("initialize"))?;
        let headers = |method| probe::headers(session.clone(), &negotiated, method);
        let notified = steps
            .post(probe::initialized(), headers("notifications/initialized"))
            .await?;
        let status = notified.status();
        let finished = read_to_end(notified).await;
        steps.answered(finished);
        if !status.is_success() {
            return Err(failed("notifications/initialized")(format!(
                "status {status}"
            )));
        }
        let answer = steps.post(probe::ping(2, None), headers("ping")).await?;
        let pinged = probe::read_result(answer, 2).await;
        steps.answered(pinged.finished);
        pinged.result.map(drop).map_err(failed("ping"))
    }
    .await;

    if let Some(session) = session {
        // A server that keeps sessions would otherwise collect one per check. Best effort:
        // the check's verdict is the steps' above.
        let delete = http::Request::builder()
            .method(http::Method::DELETE)
            .header(crate::mcp::SESSION_ID, session)
            .header(crate::mcp::PROTOCOL_VERSION, negotiated.as_str());
        if let Ok(answer) = steps.send(delete, RequestBody::Empty).await {
            read_to_end(answer).await;
        }
    }
    outcome
}

/// The connection an MCP check's steps share, opened again when an answer was left unread on
/// HTTP/1.1 (a server that keeps an event stream open after its response): the next request
/// cannot go on that one.
struct McpSteps<'a> {
    addr: SocketAddr,
    timeout: Duration,
    plan: &'a CheckPlan,
    path: &'a str,
    host: HeaderValue,
    conn: Option<CheckConnection>,
}

impl McpSteps<'_> {
    async fn send(
        &mut self,
        builder: http::request::Builder,
        body: RequestBody,
    ) -> Result<http::Response<hyper::body::Incoming>, CheckError> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self
                .conn
                .insert(CheckConnection::open(self.addr, self.timeout, self.plan).await?),
        };
        conn.send(builder, self.path, &self.host, self.plan, body)
            .await
    }

    /// POSTs one JSON-RPC message to the MCP endpoint.
    async fn post(
        &mut self,
        message: serde_json::Value,
        headers: Vec<(http::HeaderName, HeaderValue)>,
    ) -> Result<http::Response<hyper::body::Incoming>, CheckError> {
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        let body = RequestBody::Buffered(Some(message.to_string().into()), None);
        self.send(builder, body).await
    }

    /// After an answer: an HTTP/1.1 connection whose answer was not read to its end is done.
    fn answered(&mut self, finished: bool) {
        if !finished && matches!(self.conn, Some(CheckConnection::Http1(_))) {
            self.conn = None;
        }
    }
}

/// Reads an answer's body to its end, briefly (a small answer, e.g. `202 Accepted`); whether
/// it ended.
async fn read_to_end(answer: http::Response<hyper::body::Incoming>) -> bool {
    use http_body_util::BodyExt;
    const GRACE: Duration = Duration::from_millis(200);
    const LIMIT: usize = 64 * 1024;
    let mut body = answer.into_body();
    let mut read = 0;
    loop {
        match tokio::time::timeout(GRACE, body.frame()).await {
            Ok(None) => return true,
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.len());
                if read > LIMIT {
                    return false;
                }
            }
            Ok(Some(Err(_))) | Err(_) => return false,
        }
    }
}

/// One request over a new connection (never a pooled one: the check is about whether a new
/// connection works, and must not take a connection from traffic).
async fn http_check(
    addr: SocketAddr,
    timeout: Duration,
    check: &HttpCheck,
    plan: &CheckPlan,
) -> Result<(), CheckError> {
    let host = check_host(addr, plan)?;
    let mut connection = CheckConnection::open(addr, timeout, plan).await?;
    let request = http::Request::builder().method(check.method.clone());
    let status = connection
        .send(request, &check.path, &host, plan, RequestBody::Empty)
        .await?
        .status();
    // The body is not read: dropping the response and the connection's last sender closes it.
    if check.expected_statuses.contains(&status.as_u16()) {
        Ok(())
    } else {
        Err(CheckError::Status(status.as_u16()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::RoundRobin;
    use crate::upstream::endpoint::test_endpoint as endpoint;

    fn settings(kind: CheckKind) -> ActiveSettings {
        ActiveSettings {
            kind,
            interval: Duration::from_millis(20),
            interval_jitter: Duration::ZERO,
            timeout: Duration::from_millis(500),
            unhealthy_threshold: 1,
            healthy_threshold: 1,
            uneject_on_pass: true,
        }
    }

    fn plan(group: &Arc<EndpointGroup>) -> CheckPlan {
        CheckPlan {
            group: Arc::downgrade(group),
            backend: "default/api".into(),
            host: None,
            transport: Transport::Plain,
            wire: HttpWire::Http1,
            http2: Arc::default(),
            mcp: None,
        }
    }

    /// A group whose one endpoint is a listener on 127.0.0.1 that accepts and counts.
    async fn listening_group() -> (Arc<EndpointGroup>, tokio::net::TcpListener) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let group = Arc::new(EndpointGroup::new_static(
            vec![endpoint(port, 1)],
            || Box::new(RoundRobin::new()),
            crate::upstream::group::GroupSettings {
                active: Some(settings(CheckKind::Tcp)),
                ..Default::default()
            },
        ));
        (group, listener)
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_checker_stops_when_a_newer_config_starts_its_own() {
        let (group, listener) = listening_group().await;
        let epoch = watch::Sender::new(1u64);
        let counters = CheckCounters::default();
        let task = tokio::spawn(run(plan(&group), epoch.subscribe(), counters.clone()));
        // It checks (the listener sees connects)...
        tokio::time::timeout(LIMIT, listener.accept())
            .await
            .expect("a check within the limit")
            .unwrap();
        // ...and ends once the epoch moves on.
        epoch.send_replace(2);
        tokio::time::timeout(LIMIT, task)
            .await
            .expect("the checker ended")
            .unwrap();
    }

    #[tokio::test]
    async fn a_checker_stops_when_its_group_is_dropped() {
        let (group, listener) = listening_group().await;
        let epoch = watch::Sender::new(1u64);
        let task = tokio::spawn(run(
            plan(&group),
            epoch.subscribe(),
            CheckCounters::default(),
        ));
        tokio::time::timeout(LIMIT, listener.accept())
            .await
            .expect("a check within the limit")
            .unwrap();
        drop(group);
        tokio::time::timeout(LIMIT, task)
            .await
            .expect("the checker ended")
            .unwrap();
    }

    #[tokio::test]
    async fn a_tcp_check_of_a_closed_port_fails_and_marks_the_endpoint_unhealthy() {
        let (group, listener) = listening_group().await;
        drop(listener);
        let epoch = watch::Sender::new(1u64);
        let counters = CheckCounters::default();
        let _task = tokio::spawn(run(plan(&group), epoch.subscribe(), counters.clone()));
        let endpoint = group.list().endpoints[0].clone();
        tokio::time::timeout(LIMIT, async {
            while !endpoint.health.is_unhealthy() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("unhealthy within the limit");
        assert!(counters.fail.get() >= 1);
        assert!(group.pick(None).is_some(), "panic mode: the only endpoint");
    }

    #[tokio::test]
    async fn an_http_check_without_an_answer_fails_at_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let group = Arc::new(EndpointGroup::new_static(
            vec![],
            || Box::new(RoundRobin::new()),
            crate::upstream::GroupSettings::default(),
        ));
        let s = ActiveSettings {
            timeout: Duration::from_millis(100),
            ..settings(CheckKind::Http(HttpCheck {
                path: "/healthz".into(),
                method: http::Method::GET,
                host: None,
                expected_statuses: vec![200],
            }))
        };
        // The listener accepts (the kernel does) but never answers.
        let result = probe(addr, &s, &plan(&group)).await;
        assert_eq!(
            result,
            CheckResult::Fail("no answer within 100ms".into()),
            "{result:?}"
        );
        drop(listener);
    }
}
