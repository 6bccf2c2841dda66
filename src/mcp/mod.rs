//! MCP (Model Context Protocol) Backends: session affinity, protocol version checks and
//! stream handling for `protocol: MCP` (see docs/mcp.md).

pub mod errors;
pub(crate) mod health;
pub mod inspect;
pub mod legacy;
pub mod session;

use std::sync::Arc;

use session::SessionKey;

/// `protocolOptions.mcp` of one Backend port, resolved.
#[derive(Debug)]
pub(crate) struct McpPort {
    /// The MCP endpoint's path; requests to other paths are plain HTTP.
    pub(crate) path: String,
    /// `MCP-Protocol-Version` the server speaks (None: any).
    pub(crate) version: Option<String>,
    /// `sessionRouting: Stateful`: sessions stay on the endpoint that issued them.
    pub(crate) stateful: bool,
    pub(crate) key: Arc<SessionKey>,
    /// `tools`: which tools clients may call (None: all).
    pub(crate) tools: Option<inspect::ToolPolicy>,
    /// `transport: SSE`: the legacy HTTP+SSE transport (2024-11-05); `path` is the event
    /// stream's, messages go to the URL it announces (see `legacy.rs`).
    pub(crate) legacy_sse: bool,
}

impl McpPort {
    /// Whether a request to `uri` is MCP traffic: the MCP endpoint's path, or for the legacy
    /// transport also a message URL egressd announced (a wrapped session in the query).
    pub(crate) fn applies_to(&self, uri: &http::Uri) -> bool {
        uri.path() == self.path
            || (self.legacy_sse && uri.query().is_some_and(session::mentions_wrapped))
    }
}

/// `Mcp-Session-Id` (case-insensitive, as every header name).
pub(crate) const SESSION_ID: http::HeaderName = http::HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`.
pub(crate) const PROTOCOL_VERSION: http::HeaderName =
    http::HeaderName::from_static("mcp-protocol-version");

/// Why an MCP request is answered by egressd itself.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 404: the client must initialize a new session.
    SessionNotFound(String),
    /// 400: the request's protocol version is not the Backend's.
    ProtocolVersion { expected: String, got: String },
}

impl McpPort {
    /// Phase "mcp" on the way in: checks `MCP-Protocol-Version`, and for stateful routing
    /// replaces the client's session id by the server's; returns the endpoint the session is
    /// pinned to (None: a request without a session, e.g. `initialize`, is balanced). The
    /// session must have been issued by this Backend (`backend`) and `port`: routing sends it
    /// there whatever the route's weights.
    pub(crate) fn inbound(
        &self,
        backend: &str,
        port: u16,
        headers: &mut http::HeaderMap,
    ) -> Result<Option<std::net::SocketAddr>, Refusal> {
        if let (Some(expected), Some(got)) = (&self.version, headers.get(&PROTOCOL_VERSION)) {
            if got.as_bytes() != expected.as_bytes() {
                return Err(Refusal::ProtocolVersion {
                    expected: expected.clone(),
                    got: String::from_utf8_lossy(got.as_bytes()).into_owned(),
                });
            }
        }
        if !self.stateful {
            return Ok(None);
        }
        let Some(wrapped) = headers.get(&SESSION_ID) else {
            return Ok(None);
        };
        let wrapped = wrapped
            .to_str()
            .map_err(|_| Refusal::SessionNotFound("the session id is not visible ASCII".into()))?;
        let (home, upstream) = self
            .key
            .unwrap(wrapped)
            .map_err(|e| Refusal::SessionNotFound(format!("the session id is {}", e.as_str())))?;
        home.issued_by(backend, port)?;
        let value = http::HeaderValue::from_str(&upstream)
            .map_err(|_| Refusal::SessionNotFound("the session id is malformed".into()))?;
        headers.insert(SESSION_ID, value);
        Ok(Some(home.endpoint))
    }

    /// Phase "mcp" on the way out: a session id the server issued is wrapped with where it was
    /// issued; SSE streams are marked not to be buffered by proxies in front.
    pub(crate) fn outbound(&self, home: &session::SessionHome, headers: &mut http::HeaderMap) {
        if self.stateful {
            if let Some(upstream) = headers.get(&SESSION_ID).and_then(|v| v.to_str().ok()) {
                let wrapped = self.key.wrap(home, upstream);
                if let Ok(value) = http::HeaderValue::from_str(&wrapped) {
                    headers.insert(SESSION_ID, value);
                }
            }
        }
        if is_event_stream(headers) {
            headers.insert(
                http::HeaderName::from_static("x-accel-buffering"),
                http::HeaderValue::from_static("no"),
            );
        }
    }
}

impl session::SessionHome {
    /// Whether this session belongs to `backend`'s `port` (a request reaches another one only
    /// when its Backend left the route, or the client sent it elsewhere).
    pub(crate) fn issued_by(&self, backend: &str, port: u16) -> Result<(), Refusal> {
        if self.backend == backend && self.port == port {
            Ok(())
        } else {
            Err(Refusal::SessionNotFound(format!(
                "it was issued by Backend {} port {}, which this request does not reach",
                self.backend, self.port
            )))
        }
    }
}

/// Whether a response is an SSE stream (`text/event-stream`).
pub(crate) fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}
