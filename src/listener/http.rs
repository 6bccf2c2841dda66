//! The HTTP servers of downstream connections: HTTP/1.1 and HTTP/2 (h2c by prior knowledge, or
//! `h2` by ALPN behind TLS), built from [`Http2ServerSettings`] and [`DownstreamSettings`].
//!
//! # Stream-reset floods
//!
//! HTTP/2 lets a client open a stream and cancel it at once, and the cancelled stream no
//! longer counts against `SETTINGS_MAX_CONCURRENT_STREAMS`. Two attacks use that to make a
//! server start unbounded work while staying under the stream limit:
//!
//! - **Rapid Reset** (CVE-2023-44487): HEADERS then RST_STREAM, thousands of times. h2 counts
//!   the streams reset by the client before the server has accepted them
//!   (`max_pending_accept_reset_streams`, default 20 at any one time) and closes the
//!   connection with GOAWAY `ENHANCE_YOUR_CALM` (debug data `too_many_resets`) beyond that.
//!   A flood sent as fast as the client can write arrives in batches that h2 reads whole
//!   before hyper accepts any of their streams, so the limit trips early: in
//!   tests/h2_downstream.rs a raw flood of 20,000 ends at stream 41 (the 21st), and none of
//!   its requests reaches the upstream. A stream reset *after* hyper accepted it is not
//!   counted: hyper then drops the request's future at once (it polls for RST_STREAM while
//!   waiting for the response), which cancels whatever egressd was doing for it (routing,
//!   connecting, waiting for the upstream). Such a stream costs a task and the work done
//!   until the reset arrived; a client that resets only accepted streams has at most
//!   `max_concurrent_streams` of them open at once, but nothing in hyper or h2 bounds how
//!   often it repeats that (a per-connection rate limit would; egressd has none yet).
//! - **MadeYouReset** (CVE-2025-8671): the client makes the *server* reset streams with
//!   stream-level protocol errors (e.g. a WINDOW_UPDATE that overflows the stream window),
//!   after which the request may still be running. h2 counts the resets it sends for the
//!   client's errors, and the streams it refuses beyond `max_concurrent_streams`
//!   (`max_local_error_reset_streams`, default 1024 over the connection's life), and closes
//!   the connection with GOAWAY `ENHANCE_YOUR_CALM` (`too_many_internal_resets`) beyond that.
//!
//! Both limits are configurable (`ProxyConfig.spec.downstream.http2`) but cannot be turned
//! off: h2 allows disabling the second, egressd does not offer it.

use hyper::server::conn::{http1, http2};
use hyper_util::rt::TokioTimer;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::http::sending::StreamExecutor;
use crate::snapshot::{DownstreamSettings, Http2ServerSettings};
use crate::telemetry::metrics::ReasonLabel;

/// The HTTP servers of downstream connections, one per protocol (see `detect`), and the
/// connection settings they were built with.
#[derive(Debug)]
pub(crate) struct HttpServer {
    pub(crate) h1: http1::Builder,
    pub(crate) h2: http2::Builder<StreamExecutor>,
    pub(crate) settings: DownstreamSettings,
}

/// The servers for connections accepted under `http2` and `settings`; `send_cuts` counts
/// the HTTP/2 streams reset because their client did not read them.
pub(super) fn server(
    http2: &Http2ServerSettings,
    settings: &DownstreamSettings,
    send_cuts: Family<ReasonLabel, Counter>,
) -> HttpServer {
    let streams = StreamExecutor {
        send: settings.send_timeout,
        cuts: send_cuts,
    };
    HttpServer {
        h1: http1_server(settings),
        h2: http2_server(http2, streams),
        settings: *settings,
    }
}

/// The HTTP/1.1 server: the head bounded while it is read (hyper answers 431 and closes past
/// `maxRequestHeadersBytes` or `maxRequestHeaders`); no timer of its own, the connection's
/// watchdog applies `headerReadTimeout` and `idleTimeout`.
pub(crate) fn http1_server(settings: &DownstreamSettings) -> http1::Builder {
    let mut h1 = http1::Builder::new();
    h1.header_read_timeout(None)
        .max_header_size(settings.head.max_bytes);
    // hyper keeps its default 100 header slots on the stack; any other count costs a heap
    // allocation per request, paid only when asked for.
    if settings.head.max_headers != crate::snapshot::RequestHeadLimits::HYPER_MAX_HEADERS {
        h1.max_headers(settings.head.max_headers);
    }
    h1
}

fn http2_server(
    http2: &Http2ServerSettings,
    streams: StreamExecutor,
) -> http2::Builder<StreamExecutor> {
    let mut builder = http2::Builder::new(streams);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(http2.max_concurrent_streams)
        .max_header_list_size(http2.max_header_list_size)
        .initial_stream_window_size(http2.initial_stream_window_size)
        .initial_connection_window_size(http2.initial_connection_window_size)
        .max_pending_accept_reset_streams(http2.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(http2.max_local_error_reset_streams)
        // RFC 8441: websockets over HTTP/2 arrive as extended CONNECT (http/pipeline/websocket).
        .enable_connect_protocol();
    builder
}
