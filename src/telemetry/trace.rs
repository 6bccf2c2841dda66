//! egressd's own span per request (ProxyConfig `tracing`), exported over OTLP/HTTP to a
//! collector. Only in builds with the `otel` cargo feature; without it a config that sets
//! `tracing` is rejected, and W3C `traceparent`/`tracestate` pass through untouched as always.
//!
//! With tracing on, each HTTP request (and CONNECT) gets a CLIENT span whose parent is the
//! client's `traceparent` (when valid), and the request goes upstream with egressd's span as
//! the parent, so the upstream's span hangs under egressd's. Sampling follows the parent's
//! decision; new traces are sampled at `samplingPercent`. The span starts when the request
//! arrives and ends when the response body has been sent (or abandoned); a CONNECT tunnel's
//! span ends at the `200`. Spans are batched and exported off the request path by the SDK's
//! own thread; a collector that is down costs dropped spans, never requests.

use std::time::Duration;

/// `ProxyConfig.spec.tracing`, validated.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TracingSettings {
    /// OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub(crate) endpoint: String,
    /// Fraction of new traces sampled (0.0 – 1.0).
    pub(crate) sampling: f64,
    /// `service.name` of the spans.
    pub(crate) service_name: String,
    /// How long spans wait to be exported in a batch.
    pub(crate) export_interval: Duration,
}

/// What a request's span says when it ends.
#[derive(Debug, Default)]
#[cfg_attr(
    not(feature = "otel"),
    expect(
        dead_code,
        reason = "without `otel` no span is ever ended; the request path still fills it in"
    )
)]
pub(crate) struct SpanEnd<'a> {
    pub(crate) status: u16,
    /// `x-egressd-error` of a local reply.
    pub(crate) error: Option<&'a str>,
    pub(crate) route: Option<&'a str>,
    pub(crate) backend: Option<&'a str>,
    pub(crate) endpoint: Option<std::net::SocketAddr>,
    pub(crate) attempts: u32,
    pub(crate) bytes_out: u64,
    /// Whether the client got the whole response body.
    pub(crate) complete: bool,
}

impl<'a> From<&'a super::access_log::AccessRecord> for SpanEnd<'a> {
    fn from(record: &'a super::access_log::AccessRecord) -> Self {
        SpanEnd {
            status: record.status,
            error: record.error,
            route: record.route.as_deref(),
            backend: record.backend.as_deref(),
            endpoint: record.endpoint,
            attempts: record.attempts,
            bytes_out: record.bytes_out,
            complete: record.complete,
        }
    }
}

#[cfg(feature = "otel")]
pub(crate) use otel::{RequestSpan, Tracing};

#[cfg(not(feature = "otel"))]
pub(crate) use disabled::{RequestSpan, Tracing};

/// Whether this build can export spans.
pub const AVAILABLE: bool = cfg!(feature = "otel");

#[cfg(not(feature = "otel"))]
mod disabled {
    //! Without the `otel` feature nothing is ever constructed: a config with `tracing` is
    //! rejected when compiled.

    use super::{SpanEnd, TracingSettings};

    /// Never constructed in this build.
    #[derive(Debug)]
    pub(crate) enum Tracing {}

    /// Never constructed in this build.
    #[derive(Debug)]
    pub(crate) enum RequestSpan {}

    impl Tracing {
        pub(crate) fn start(_settings: &TracingSettings) -> Result<Self, String> {
            Err("this build has no tracing (build with `--features otel`)".to_owned())
        }

        pub(crate) fn settings(&self) -> &TracingSettings {
            match *self {}
        }

        pub(crate) fn request_span(
            &self,
            _headers: &mut http::HeaderMap,
            _method: &http::Method,
            _authority: &str,
            _listener: &str,
            _client: std::net::SocketAddr,
        ) -> RequestSpan {
            match *self {}
        }

        pub(crate) fn shutdown(&self) {
            match *self {}
        }
    }

    impl RequestSpan {
        pub(crate) fn end(self, _end: &SpanEnd<'_>) {
            match self {}
        }
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::borrow::Cow;

    use http::header::HeaderName;
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
    use opentelemetry::{Context, KeyValue};
    use opentelemetry_http::{HeaderExtractor, HeaderInjector};
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::{
        BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
    };
    use opentelemetry_sdk::Resource;

    use super::{SpanEnd, TracingSettings};

    const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
    const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

    /// A tracer provider exporting to one collector.
    pub(crate) struct Tracing {
        settings: TracingSettings,
        provider: SdkTracerProvider,
        tracer: SdkTracer,
        propagator: TraceContextPropagator,
    }

    impl std::fmt::Debug for Tracing {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Tracing")
                .field("settings", &self.settings)
                .finish_non_exhaustive()
        }
    }

    impl Tracing {
        /// Builds the exporter and its batch thread. Nothing is sent until a span ends.
        pub(crate) fn start(settings: &TracingSettings) -> Result<Self, String> {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(std::time::Duration::from_secs(10))
                .build()
                .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
            let batch = BatchSpanProcessor::builder(exporter)
                .with_batch_config(
                    BatchConfigBuilder::default()
                        .with_scheduled_delay(settings.export_interval)
                        .build(),
                )
                .build();
            let provider = SdkTracerProvider::builder()
                .with_span_processor(batch)
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                    settings.sampling,
                ))))
                .with_resource(
                    Resource::builder_empty()
                        .with_service_name(settings.service_name.clone())
                        .build(),
                )
                .build();
            let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "egressd");
            Ok(Tracing {
                settings: settings.clone(),
                provider,
                tracer,
                propagator: TraceContextPropagator::new(),
            })
        }

        pub(crate) fn settings(&self) -> &TracingSettings {
            &self.settings
        }

        /// Starts the span of a request whose headers are `headers`: its parent is the
        /// client's trace context; egressd's own replaces it in `headers`, which go upstream.
        pub(crate) fn request_span(
            &self,
            headers: &mut http::HeaderMap,
            method: &http::Method,
            authority: &str,
            listener: &str,
            client: std::net::SocketAddr,
        ) -> RequestSpan {
            let parent = self.propagator.extract(&HeaderExtractor(headers));
            let span = self
                .tracer
                .span_builder(Cow::Owned(method.as_str().to_owned()))
                .with_kind(SpanKind::Client)
                .with_attributes([
                    KeyValue::new("http.request.method", method.as_str().to_owned()),
                    KeyValue::new("server.address", authority.to_owned()),
                    KeyValue::new("client.address", client.ip().to_string()),
                    KeyValue::new("egressd.listener", listener.to_owned()),
                ])
                .start_with_context(&self.tracer, &parent);
            let ours = span.span_context().clone();
            if ours.is_valid() {
                headers.remove(TRACEPARENT);
                headers.remove(TRACESTATE);
                let cx = Context::new().with_remote_span_context(ours);
                self.propagator
                    .inject_context(&cx, &mut HeaderInjector(headers));
            }
            RequestSpan {
                span,
                method: method.clone(),
            }
        }

        /// Exports what is batched and stops the exporter thread. Blocks: call off the
        /// runtime's workers.
        pub(crate) fn shutdown(&self) {
            if let Err(e) = self.provider.shutdown() {
                tracing::debug!(error = %e, "tracing shutdown");
            }
        }
    }

    /// One request's span, ended by [`RequestSpan::end`].
    pub(crate) struct RequestSpan {
        span: opentelemetry_sdk::trace::Span,
        method: http::Method,
    }

    impl std::fmt::Debug for RequestSpan {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("RequestSpan").finish_non_exhaustive()
        }
    }

    impl RequestSpan {
        pub(crate) fn end(mut self, end: &SpanEnd<'_>) {
            let span = &mut self.span;
            if !span.is_recording() {
                return;
            }
            if let Some(backend) = end.backend {
                // Low cardinality (Backend names, not hosts): `GET default/api`.
                span.update_name(format!("{} {backend}", self.method));
                span.set_attribute(KeyValue::new("egressd.backend", backend.to_owned()));
            }
            if let Some(route) = end.route {
                span.set_attribute(KeyValue::new("egressd.route", route.to_owned()));
            }
            if let Some(endpoint) = end.endpoint {
                span.set_attribute(KeyValue::new(
                    "network.peer.address",
                    endpoint.ip().to_string(),
                ));
                span.set_attribute(KeyValue::new(
                    "network.peer.port",
                    i64::from(endpoint.port()),
                ));
            }
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(end.status),
            ));
            span.set_attribute(KeyValue::new("egressd.attempts", i64::from(end.attempts)));
            span.set_attribute(KeyValue::new(
                "http.response.body.size",
                i64::try_from(end.bytes_out).unwrap_or(i64::MAX),
            ));
            span.set_attribute(KeyValue::new("egressd.complete", end.complete));
            if let Some(code) = end.error {
                span.set_attribute(KeyValue::new("error.type", code.to_owned()));
            }
            // HTTP semantic conventions: for a client span, 4xx and 5xx are errors.
            if end.status >= 400 || !end.complete {
                let why = end.error.map_or_else(
                    || {
                        if end.complete {
                            format!("status {}", end.status)
                        } else {
                            "response not completed".to_owned()
                        }
                    },
                    str::to_owned,
                );
                span.set_status(Status::error(why));
            }
            span.end();
        }
    }
}
