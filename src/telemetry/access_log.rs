//! The access log: one line per request, written by a background thread so the hot path never
//! blocks on a slow terminal or disk. If the writer falls behind by more than a bounded queue,
//! lines are dropped rather than slowing traffic.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use serde::Serialize;

use crate::config::wire::enums::AccessLogFormat;

/// One request (or tunnelled connection), as logged: built when the response headers go out
/// and written when its body has been sent or abandoned.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct AccessRecord {
    /// When the request arrived.
    pub(crate) time: String,
    pub(crate) client: SocketAddr,
    /// What the client's certificate proved: its SPIFFE ID, or `CN=name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) client_identity: Option<String>,
    /// The user `Proxy-Authorization` authenticated (at most 256 bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) proxy_user: Option<String>,
    pub(crate) listener: String,
    /// The request came inside a CONNECT tunnel egressd served as HTTP (`true`; absent
    /// otherwise): decrypted by `tlsInterception`, or plaintext inside the tunnel.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) intercepted: bool,
    pub(crate) method: String,
    pub(crate) authority: String,
    pub(crate) path: String,
    pub(crate) protocol: &'static str,
    pub(crate) status: u16,
    /// The `x-egressd-error` code of a local reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<&'static str>,
    /// The finer cause of some errors (e.g. `unknown_ca` for `upstream_tls_failure`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_cause: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) route: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) endpoint: Option<SocketAddr>,
    /// Times the request was sent upstream (retries included); 0 when egressd answered
    /// before sending it.
    pub(crate) attempts: u32,
    /// The request body's size: declared (`Content-Length`), or counted as it was sent
    /// upstream when none was declared (absent when nothing was sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bytes_in: Option<u64>,
    /// For a body without a declared size: its bytes, counted as they were sent upstream
    /// (read into `bytes_in` when the line is written).
    #[serde(skip)]
    pub(crate) bytes_in_counted: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// Response body bytes sent to the client.
    pub(crate) bytes_out: u64,
    /// MCP requests: the JSON-RPC method and the tool of a `tools/call`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mcp_method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mcp_tool: Option<String>,
    /// A rate limit rule refused the request (`limited policy/rule`) or would have under
    /// `mode: Report` (`would_limit policy/rule`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate_limit: Option<String>,
    /// From the request's arrival until the upstream's response headers (the last attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upstream_ttfb_ms: Option<f64>,
    /// When the (last) attempt opened a new upstream connection: how long connecting took
    /// (TCP, TLS and HTTP handshakes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upstream_connect_ms: Option<f64>,
    /// TLS with the endpoint (`TLSv1.3`, `TLSv1.2`), as its latest handshake settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upstream_tls: Option<&'static str>,
    /// The ALPN protocol of that handshake (`h2`, `http/1.1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upstream_alpn: Option<&'static str>,
    /// Until the response headers went to the client.
    pub(crate) headers_ms: f64,
    /// Until the response's last byte was sent (or the client went away).
    pub(crate) duration_ms: f64,
    /// False when the response was not sent to its end (the client left, a limit cut it).
    pub(crate) complete: bool,
}

/// The longest text a client controls that an access log field carries (MCP method and tool
/// names come from request bodies of up to 4 MiB).
pub(crate) const MAX_CLIENT_FIELD_BYTES: usize = 256;

/// `text` cut to [`MAX_CLIENT_FIELD_BYTES`] (on a character boundary, marked with `…`).
pub(crate) fn clipped(text: &str) -> String {
    if text.len() <= MAX_CLIENT_FIELD_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_CLIENT_FIELD_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Milliseconds with microsecond precision: plenty, and lines stay short.
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

struct Sink {
    tx: SyncSender<Vec<u8>>,
    format: AccessLogFormat,
}

/// The access log, reconfigurable on reload.
pub(crate) struct AccessLog {
    sink: ArcSwapOption<Sink>,
    settings: std::sync::Mutex<Option<AccessLogSettings>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog {
            sink: ArcSwapOption::empty(),
            settings: std::sync::Mutex::new(None),
        }
    }
}

/// Lines waiting for the writer thread before new ones are dropped.
const QUEUE: usize = 16 * 1024;

impl AccessLog {
    /// Applies settings; reopens the destination only when they changed.
    pub(crate) fn configure(&self, settings: &AccessLogSettings) -> std::io::Result<()> {
        let mut current = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref() == Some(settings) {
            return Ok(());
        }
        if !settings.enabled {
            self.sink.store(None);
            *current = Some(settings.clone());
            return Ok(());
        }
        let mut out: Box<dyn Write + Send> = match settings.path.as_str() {
            "stdout" => Box::new(std::io::stdout()),
            "stderr" => Box::new(std::io::stderr()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        std::thread::Builder::new()
            .name("egressd-access-log".into())
            .spawn(move || {
                // Ends when the sink is replaced or dropped (all senders gone).
                while let Ok(line) = rx.recv() {
                    if out.write_all(&line).is_err() {
                        continue;
                    }
                    // Flush when the queue is drained, so lines appear promptly without a
                    // syscall per line under load.
                    let mut more = rx.try_recv();
                    while let Ok(line) = more {
                        let _ = out.write_all(&line);
                        more = rx.try_recv();
                    }
                    let _ = out.flush();
                }
            })?;
        self.sink.store(Some(Arc::new(Sink {
            tx,
            format: settings.format,
        })));
        *current = Some(settings.clone());
        Ok(())
    }

    pub(crate) fn enabled(&self) -> bool {
        self.sink.load().is_some()
    }

    /// Queues one line; never blocks.
    pub(crate) fn write(&self, record: &AccessRecord) {
        let guard = self.sink.load();
        let Some(sink) = guard.as_ref() else { return };
        let mut line = match sink.format {
            AccessLogFormat::Json => serde_json::to_vec(record).unwrap_or_default(),
            AccessLogFormat::Text => text_line(record).into_bytes(),
        };
        line.push(b'\n');
        // A full queue drops the line: the hot path never waits for the writer.
        let _ = sink.tx.try_send(line);
    }
}

/// One line of the `Text` format: `time client identity listener "METHOD authority+path
/// protocol" status error bytes_out backend endpoint duration`, `-` for what is absent. The
/// identity is the client certificate's (`client_identity`), else the proxy user, as the
/// user field of a common-log line. Fields a client or a certificate controls are written
/// with spaces, quotes, backslashes and control characters as `\xHH`, so a line always has
/// the same fields.
fn text_line(record: &AccessRecord) -> String {
    let identity = record
        .client_identity
        .as_deref()
        .or(record.proxy_user.as_deref())
        .unwrap_or("-");
    format!(
        "{} {} {} {} \"{} {}{} {}\" {} {} {} {} {} {:.3}ms",
        record.time,
        record.client,
        Escaped(identity),
        record.listener,
        Escaped(&record.method),
        Escaped(&record.authority),
        Escaped(&record.path),
        record.protocol,
        record.status,
        record.error_cause.or(record.error).unwrap_or("-"),
        record.bytes_out,
        record.backend.as_deref().unwrap_or("-"),
        record
            .endpoint
            .map_or_else(|| "-".to_owned(), |e| e.to_string()),
        record.duration_ms
    )
}

/// Text for a space-separated field: nothing in it can split the field or the line.
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            if c.is_whitespace() || c.is_control() || c == '"' || c == '\\' {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    write!(f, "\\x{b:02x}")?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// `ProxyConfig.spec.accessLog`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AccessLogSettings {
    pub(crate) enabled: bool,
    pub(crate) format: AccessLogFormat,
    /// `stdout`, `stderr` or a file path.
    pub(crate) path: String,
}

impl Default for AccessLogSettings {
    fn default() -> Self {
        AccessLogSettings {
            enabled: true,
            format: AccessLogFormat::Json,
            path: "stdout".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AccessRecord {
        AccessRecord {
            time: "2026-11-28T13:00:00Z".to_owned(),
            client: "127.0.0.1:50000".parse().unwrap(),
            client_identity: None,
            proxy_user: None,
            listener: "default/gw/http".to_owned(),
            intercepted: false,
            method: "GET".to_owned(),
            authority: "api.test".to_owned(),
            path: "/v1".to_owned(),
            protocol: "HTTP/1.1",
            status: 200,
            error: None,
            error_cause: None,
            route: None,
            backend: Some("default/api".to_owned()),
            endpoint: Some("127.0.0.2:8080".parse().unwrap()),
            attempts: 1,
            bytes_in: None,
            bytes_in_counted: None,
            bytes_out: 5,
            mcp_method: None,
            mcp_tool: None,
            rate_limit: None,
            upstream_ttfb_ms: None,
            upstream_connect_ms: None,
            upstream_tls: None,
            upstream_alpn: None,
            headers_ms: 1.0,
            duration_ms: 1.5,
            complete: true,
        }
    }

    #[test]
    fn a_text_line_names_the_client_certificate_or_else_the_proxy_user() {
        let plain = record();
        assert_eq!(
            text_line(&plain),
            "2026-11-28T13:00:00Z 127.0.0.1:50000 - default/gw/http \"GET api.test/v1 HTTP/1.1\" \
             200 - 5 default/api 127.0.0.2:8080 1.500ms"
        );
        let user = AccessRecord {
            proxy_user: Some("alice".to_owned()),
            ..record()
        };
        assert!(text_line(&user)
            .starts_with("2026-11-28T13:00:00Z 127.0.0.1:50000 alice default/gw/http "));
        let both = AccessRecord {
            client_identity: Some("spiffe://corp.test/ns/shop/sa/payments".to_owned()),
            ..user
        };
        assert!(
            text_line(&both).contains(" spiffe://corp.test/ns/shop/sa/payments default/gw/http ")
        );
    }

    #[test]
    fn what_a_client_or_certificate_controls_cannot_split_a_text_line() {
        let hostile = AccessRecord {
            client_identity: Some("CN=Jane \"Ops\" Doe\n2026 fake line".to_owned()),
            proxy_user: Some("ignored".to_owned()),
            ..record()
        };
        let line = text_line(&hostile);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains(" CN=Jane\\x20\\x22Ops\\x22\\x20Doe\\x0a2026\\x20fake\\x20line "),
            "{line}"
        );
        assert_eq!(
            line.split(' ').count(),
            text_line(&record()).split(' ').count()
        );
    }
}
