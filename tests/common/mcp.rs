//! MCP peers built with the official Rust MCP SDK (`rmcp`) over the Streamable HTTP transport:
//! a stateful server on 127.0.0.`n` (several share a port behind one Backend of IP endpoints,
//! like [`super::outlier`]) that records what it sees, and a client that reaches a route
//! hostname through egressd's listener.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::ProtocolVersion;
use rmcp::model::{
    CallToolRequestParams, ProgressNotificationParam, RequestMetaObject, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{
    schemars, tool, tool_handler, tool_router, ClientHandler, Peer, RoleClient, RoleServer,
    ServerHandler, ServiceExt,
};
use tokio::sync::mpsc;
use tower_service::Service;

/// The path the servers answer on (the `protocolOptions.mcp.path` default).
pub(crate) const PATH: &str = "/mcp";

/// The session header of the Streamable HTTP transport (case-insensitive on the wire).
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

/// How a [`McpServer`] is set up.
#[derive(Debug, Clone, Default)]
pub(crate) struct McpServerOptions {
    /// The name `whoami` answers with (default `mcp-<ip>`), before `@address`.
    pub(crate) name: Option<String>,
    /// Answer plain JSON for requests that emit no notification (rmcp's `json_response`); by
    /// default every POST is answered with an SSE stream.
    pub(crate) json_response: bool,
    /// End every POST's event stream after this many events, as a server may (MCP
    /// 2025-11-25): the client resumes it with a GET carrying `Last-Event-ID`.
    pub(crate) close_post_streams_after: Option<usize>,
    /// The `retry:` of rmcp's priming events (rmcp's default: 3 s).
    pub(crate) sse_retry: Option<Duration>,
}

/// One HTTP request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct SeenRequest {
    pub(crate) method: http::Method,
    pub(crate) session: Option<String>,
    pub(crate) headers: http::HeaderMap,
}

/// What a server recorded, shared with the tools and the HTTP layer.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    /// Sessions this server issued (`Mcp-Session-Id` of its initialize responses), in order.
    sessions: Mutex<Vec<String>>,
    /// Every HTTP request on [`PATH`], in arrival order.
    requests: Mutex<Vec<SeenRequest>>,
    /// Tool calls per session id.
    tool_calls: Mutex<HashMap<String, u64>>,
}

/// A real rmcp Streamable HTTP server (stateful sessions, `LocalSessionManager`) on
/// 127.0.0.`n`:`port`, path [`PATH`]. Tools: `whoami`, `count`, `slow_progress`, `echo`.
pub(crate) struct McpServer {
    pub(crate) addr: SocketAddr,
    pub(crate) name: String,
    recorded: Arc<Recorded>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl McpServer {
    /// Binds 127.0.0.`n`:`port` (`port` 0: ephemeral) and serves MCP there until dropped.
    pub(crate) async fn start(n: u8, port: u16, options: McpServerOptions) -> McpServer {
        let bind = SocketAddr::new([127, 0, 0, n].into(), port);
        let listener = super::ports::listen(bind).await.expect("bind MCP server");
        let addr = listener.local_addr().unwrap();
        let name = options
            .name
            .clone()
            .unwrap_or_else(|| format!("mcp-{}", addr.ip()));
        let recorded = Arc::new(Recorded::default());

        let identity = format!("{name}@{addr}");
        let tools_recorded = recorded.clone();
        let config = StreamableHttpServerConfig::default()
            // egressd forwards the route's Host: not a loopback name rmcp would accept.
            .disable_allowed_hosts()
            .with_json_response(options.json_response)
            .with_sse_retry(options.sse_retry.or(Some(Duration::from_secs(3))));
        let sessions = Arc::new(LocalSessionManager::default());
        let service: StreamableHttpService<Tools, LocalSessionManager> = StreamableHttpService::new(
            move || Ok(Tools::new(identity.clone(), tools_recorded.clone())),
            sessions.clone(),
            config,
        );

        let http_recorded = recorded.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let service = service.clone();
                let recorded = http_recorded.clone();
                let close_after = options.close_post_streams_after;
                let retry = options.sse_retry;
                let sessions = sessions.clone();
                let handler = hyper::service::service_fn(move |req: http::Request<_>| {
                    let mut service = service.clone();
                    let recorded = recorded.clone();
                    let sessions = sessions.clone();
                    async move {
                        let session = (req.method() == http::Method::POST)
                            .then(|| header(req.headers(), SESSION_HEADER))
                            .flatten();
                        let response = serve(&mut service, &recorded, req).await;
                        let event_stream = response
                            .headers()
                            .get(http::header::CONTENT_TYPE)
                            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                        Ok::<_, Infallible>(match (close_after, session) {
                            (Some(events), Some(session)) if event_stream => response.map(|body| {
                                http_body_util::BodyExt::boxed(CloseAfterEvents {
                                    inner: body,
                                    left: events,
                                    request: None,
                                    close: Some((sessions, session.into(), retry)),
                                })
                            }),
                            _ => response,
                        })
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), handler)
                        .await;
                });
            }
        });
        McpServer {
            addr,
            name,
            recorded,
            task,
        }
    }

    /// What `whoami` answers: `name@ip:port`.
    pub(crate) fn identity(&self) -> String {
        format!("{}@{}", self.name, self.addr)
    }

    /// How many sessions this server initialized.
    pub(crate) fn sessions_initialized(&self) -> usize {
        self.recorded.sessions.lock().unwrap().len()
    }

    /// The session ids this server issued.
    pub(crate) fn sessions(&self) -> Vec<String> {
        self.recorded.sessions.lock().unwrap().clone()
    }

    /// Every HTTP request on [`PATH`] so far.
    pub(crate) fn requests(&self) -> Vec<SeenRequest> {
        self.recorded.requests.lock().unwrap().clone()
    }

    /// HTTP requests that carried `session` in `Mcp-Session-Id`.
    pub(crate) fn requests_in_session(&self, session: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.session.as_deref() == Some(session))
            .count()
    }

    /// Tool calls answered in `session`.
    pub(crate) fn tool_calls_in_session(&self, session: &str) -> u64 {
        self.recorded
            .tool_calls
            .lock()
            .unwrap()
            .get(session)
            .copied()
            .unwrap_or(0)
    }
}

/// Records the request, lets rmcp answer it, and records a session it issued.
async fn serve<B>(
    service: &mut StreamableHttpService<Tools, LocalSessionManager>,
    recorded: &Recorded,
    req: http::Request<B>,
) -> <StreamableHttpService<Tools, LocalSessionManager> as Service<http::Request<B>>>::Response
where
    B: http_body::Body + Send + 'static,
    B::Error: std::fmt::Display,
    B::Data: Send + 'static,
{
    let session = header(req.headers(), SESSION_HEADER);
    if req.uri().path() != PATH {
        return http::Response::builder()
            .status(404)
            .body(Default::default())
            .unwrap();
    }
    recorded.requests.lock().unwrap().push(SeenRequest {
        method: req.method().clone(),
        session: session.clone(),
        headers: req.headers().clone(),
    });
    let response = match service.call(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    if session.is_none() {
        if let Some(issued) = header(response.headers(), SESSION_HEADER) {
            recorded.sessions.lock().unwrap().push(issued);
        }
    }
    response
}

/// A POST's event stream that the server closes after `left` more events, the way rmcp lets a
/// server do it (`close_sse_stream`: a priming event, then the end, the session and its event
/// cache kept for the client's resume). The stream's request id comes from the event ids
/// (`<index>/<request id>`).
struct CloseAfterEvents<B> {
    inner: B,
    left: usize,
    request: Option<u64>,
    close: Option<(Arc<LocalSessionManager>, Arc<str>, Option<Duration>)>,
}

impl<B> http_body::Body for CloseAfterEvents<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        let std::task::Poll::Ready(Some(Ok(frame))) = &polled else {
            return polled;
        };
        let Some(data) = frame.data_ref().filter(|_| self.close.is_some()) else {
            return polled;
        };
        let text = String::from_utf8_lossy(data).into_owned();
        if self.request.is_none() {
            self.request = text
                .lines()
                .filter_map(|l| l.strip_prefix("id:"))
                .find_map(|id| id.trim().split_once('/')?.1.parse().ok());
        }
        self.left = self.left.saturating_sub(text.matches("\n\n").count());
        if let (0, Some(request)) = (self.left, self.request) {
            if let Some((sessions, session, retry)) = self.close.take() {
                tokio::spawn(async move {
                    let handle = sessions.sessions.read().await.get(&session).cloned();
                    if let Some(handle) = handle {
                        let _ = handle.close_sse_stream(request, retry).await;
                    }
                });
            }
        }
        polled
    }
}

fn header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct SlowProgressArgs {
    /// How many progress notifications to send.
    pub(crate) count: u32,
    /// Milliseconds before each notification.
    pub(crate) delay_ms: u64,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct EchoArgs {
    pub(crate) text: String,
}

/// One session's tool handler: rmcp's session manager makes one per initialize.
#[derive(Clone)]
struct Tools {
    identity: String,
    recorded: Arc<Recorded>,
    counter: Arc<AtomicU64>,
    tool_router: ToolRouter<Self>,
}

impl Tools {
    fn new(identity: String, recorded: Arc<Recorded>) -> Self {
        Tools {
            identity,
            recorded,
            counter: Arc::default(),
            tool_router: Self::tool_router(),
        }
    }

    /// Counts a tool call under the session id the request carried.
    fn record_call(&self, parts: &http::request::Parts) {
        let session = header(&parts.headers, SESSION_HEADER).unwrap_or_default();
        *self
            .recorded
            .tool_calls
            .lock()
            .unwrap()
            .entry(session)
            .or_default() += 1;
    }
}

#[tool_router]
impl Tools {
    #[tool(description = "Which server endpoint answered: name@ip:port")]
    fn whoami(
        &self,
        rmcp::handler::server::tool::Extension(parts): rmcp::handler::server::tool::Extension<
            http::request::Parts,
        >,
    ) -> String {
        self.record_call(&parts);
        self.identity.clone()
    }

    #[tool(description = "A per-session counter: 1, 2, 3 ... within one session")]
    fn count(
        &self,
        rmcp::handler::server::tool::Extension(parts): rmcp::handler::server::tool::Extension<
            http::request::Parts,
        >,
    ) -> String {
        self.record_call(&parts);
        (self.counter.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }

    #[tool(description = "Sends `count` progress notifications `delay_ms` apart, then returns")]
    async fn slow_progress(
        &self,
        Parameters(args): Parameters<SlowProgressArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        rmcp::handler::server::tool::Extension(parts): rmcp::handler::server::tool::Extension<
            http::request::Parts,
        >,
    ) -> Result<String, rmcp::ErrorData> {
        self.record_call(&parts);
        let token = meta.get_progress_token().ok_or_else(|| {
            rmcp::ErrorData::invalid_params("slow_progress needs a progress token", None)
        })?;
        for step in 1..=args.count {
            // The tool's own pacing (what is measured downstream), not synchronisation.
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
            peer.notify_progress(
                ProgressNotificationParam::new(token.clone(), f64::from(step))
                    .with_total(f64::from(args.count)),
            )
            .await
            .map_err(|e| rmcp::ErrorData::internal_error(e.to_string(), None))?;
        }
        Ok(format!("done {}", args.count))
    }

    #[tool(description = "Returns its text argument")]
    fn echo(
        &self,
        Parameters(args): Parameters<EchoArgs>,
        rmcp::handler::server::tool::Extension(parts): rmcp::handler::server::tool::Extension<
            http::request::Parts,
        >,
    ) -> String {
        self.record_call(&parts);
        args.text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// A progress notification as the client received it.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    pub(crate) progress: f64,
    pub(crate) total: Option<f64>,
    pub(crate) at: Instant,
}

/// The client side handler: forwards progress notifications with their arrival time.
struct ProgressRecorder {
    progress: mpsc::UnboundedSender<Progress>,
}

impl ClientHandler for ProgressRecorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(Progress {
            progress: params.progress,
            total: params.total,
            at: Instant::now(),
        });
    }
}

/// A reqwest client whose every connection to `host` goes to `via`.
fn via_client(via: SocketAddr, host: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .resolve(host, via)
        .build()
        .expect("reqwest client")
}

/// An rmcp client session over Streamable HTTP.
pub(crate) struct McpClient {
    service: RunningService<RoleClient, ProgressRecorder>,
    progress: mpsc::UnboundedReceiver<Progress>,
}

impl McpClient {
    /// Connects to `url` (initialize and `notifications/initialized` included).
    pub(crate) async fn connect(
        url: &str,
    ) -> Result<McpClient, rmcp::service::ClientInitializeError> {
        Self::connect_with(reqwest::Client::new(), url).await
    }

    /// Connects to `http://{host}:{via.port}/mcp` with every TCP connection going to `via`
    /// (egressd's listener): the request's Host is the route hostname, as a client that
    /// resolves `host` to the proxy would send it.
    pub(crate) async fn connect_via(
        via: SocketAddr,
        host: &str,
    ) -> Result<McpClient, rmcp::service::ClientInitializeError> {
        let url = format!("http://{host}:{}{PATH}", via.port());
        Self::connect_with(via_client(via, host), &url).await
    }

    /// [`Self::connect_via`] with a new TCP connection for every request (no pooling), as
    /// requests spread over proxy replicas behind a TCP balancer.
    pub(crate) async fn connect_via_fresh_connections(
        via: SocketAddr,
        host: &str,
    ) -> Result<McpClient, rmcp::service::ClientInitializeError> {
        let http = reqwest::Client::builder()
            .resolve(host, via)
            .pool_max_idle_per_host(0)
            .build()
            .expect("reqwest client");
        Self::connect_with(http, &format!("http://{host}:{}{PATH}", via.port())).await
    }

    /// [`Self::connect_via`] speaking the stateless protocol 2026-07-28: `server/discover`
    /// instead of a session, each request self-contained, `Mcp-Method` / `Mcp-Name` headers.
    pub(crate) async fn connect_stateless_via(
        via: SocketAddr,
        host: &str,
    ) -> Result<McpClient, rmcp::service::ClientInitializeError> {
        Self::connect_with_lifecycle(
            via_client(via, host),
            &format!("http://{host}:{}{PATH}", via.port()),
            Some(ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            }),
        )
        .await
    }

    async fn connect_with(
        http: reqwest::Client,
        url: &str,
    ) -> Result<McpClient, rmcp::service::ClientInitializeError> {
        Self::connect_with_lifecycle(http, url, None).await
    }

    async fn connect_with_lifecycle(
        http: reqwest::Client,
        url: &str,
        lifecycle: Option<ClientLifecycleMode>,
    ) -> Result<McpClient, rmcp::service::ClientInitializeError> {
        let transport = StreamableHttpClientTransport::with_client(
            http,
            StreamableHttpClientTransportConfig::with_uri(url),
        );
        let (tx, progress) = mpsc::unbounded_channel();
        let handler = ProgressRecorder { progress: tx };
        let service = match lifecycle {
            Some(lifecycle) => handler.serve_with_lifecycle(transport, lifecycle).await?,
            None => handler.serve(transport).await?,
        };
        Ok(McpClient { service, progress })
    }

    /// The peer, for anything the helpers do not cover.
    pub(crate) fn peer(&self) -> &Peer<RoleClient> {
        self.service.peer()
    }

    /// The names of the server's tools.
    pub(crate) async fn tool_names(&self) -> Result<Vec<String>, rmcp::ServiceError> {
        let tools = self.service.list_all_tools().await?;
        Ok(tools.into_iter().map(|t| t.name.to_string()).collect())
    }

    /// Calls `name` with `args` (a JSON object or null) and returns the text of its result.
    pub(crate) async fn call_text(
        &self,
        name: &str,
        args: serde_json::Value,
    ) -> Result<String, rmcp::ServiceError> {
        let mut params = CallToolRequestParams::new(name.to_owned());
        if let serde_json::Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        let result = self.service.call_tool(params).await?;
        assert_ne!(
            result.is_error,
            Some(true),
            "tool {name} failed: {result:?}"
        );
        Ok(result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join(""))
    }

    /// What the `whoami` tool answers (panics on failure).
    pub(crate) async fn whoami(&self) -> String {
        self.call_text("whoami", serde_json::json!({}))
            .await
            .expect("whoami")
    }

    /// The session's next `count` (panics on failure).
    pub(crate) async fn count(&self) -> String {
        self.call_text("count", serde_json::json!({}))
            .await
            .expect("count")
    }

    /// Progress notifications received so far (each once).
    pub(crate) fn take_progress(&mut self) -> Vec<Progress> {
        let mut all = Vec::new();
        while let Ok(p) = self.progress.try_recv() {
            all.push(p);
        }
        all
    }

    /// Calls `slow_progress` and returns its text with the `count` progress notifications of
    /// the call, in arrival order (waits up to 5 s after the result for any still in dispatch).
    pub(crate) async fn slow_progress(
        &mut self,
        count: u32,
        delay: Duration,
    ) -> Result<(String, Vec<Progress>), rmcp::ServiceError> {
        self.take_progress();
        let text = self
            .call_text(
                "slow_progress",
                serde_json::json!({"count": count, "delay_ms": delay.as_millis() as u64}),
            )
            .await?;
        let mut progress = self.take_progress();
        while progress.len() < count as usize {
            match tokio::time::timeout(Duration::from_secs(5), self.progress.recv()).await {
                Ok(Some(p)) => progress.push(p),
                _ => break,
            }
        }
        Ok((text, progress))
    }

    /// Ends the session (DELETE) and the client.
    pub(crate) async fn close(self) {
        let _ = self.service.cancel().await;
    }
}
