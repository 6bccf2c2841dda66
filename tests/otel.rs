//! egressd's own span per request (ProxyConfig `tracing`, `--features otel`): exported over
//! OTLP/HTTP to a collector (here a hyper server decoding the official protobuf messages),
//! parented by the client's `traceparent`, and the parent of what the upstream sees.

#![cfg(feature = "otel")]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::eventually;
use common::proxy::{get_absolute, get_with_headers, ip_backend, preamble_with};
use common::proxy::{route_to, TestProxy};
use common::upstream::Upstream;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span};
use prost::Message;

const HOST: &str = "app.trace.test";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP collector on 127.0.0.1: keeps every span it is sent, with its resource's
/// `service.name`.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<(String, Span)>>> = Arc::default();
        let kept = spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let export = ExportTraceServiceRequest::decode(body).unwrap();
                        for resource in export.resource_spans {
                            let service = resource
                                .resource
                                .iter()
                                .flat_map(|r| &r.attributes)
                                .find(|a| a.key == "service.name")
                                .and_then(|a| a.value.as_ref()?.value.clone());
                            let service = match service {
                                Some(Value::StringValue(s)) => s,
                                _ => String::new(),
                            };
                            for scope in resource.scope_spans {
                                for span in scope.spans {
                                    kept.lock().unwrap().push((service.clone(), span));
                                }
                            }
                        }
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Collector { addr, spans }
    }

    fn span_of_trace(&self, trace_id: &str) -> Option<(String, Span)> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .find(|(_, s)| hex(&s.trace_id) == trace_id)
            .cloned()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.clone())
}

/// `traceparent` split into (trace id, parent id, flags).
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!((p.len(), p[0]), (4, "00"), "{traceparent}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

async fn setup(sampling_percent: u32) -> (Collector, Upstream, TestProxy) {
    let collector = Collector::start().await;
    let upstream = Upstream::start("app").await;
    let tracing = format!(
        "  tracing:\n    otlpEndpoint: http://{}/v1/traces\n    samplingPercent: {sampling_percent}\n    serviceName: egress-test\n    exportInterval: 50ms\n",
        collector.addr
    );
    let yaml = preamble_with(None, &tracing)
        + &ip_backend("app", upstream.addr, "")
        + &route_to(HOST, "app");
    let proxy = TestProxy::start(&yaml).await;
    (collector, upstream, proxy)
}

#[tokio::test]
async fn the_upstream_sees_egressds_span_under_the_clients_and_the_collector_gets_it() {
    let (collector, upstream, proxy) = setup(100).await;
    let client_parent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let r = get_with_headers(
        proxy.http(),
        HOST,
        "/traced?q=1",
        &[
            ("traceparent", &client_parent),
            ("tracestate", "vendor=opaque"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);

    let seen = upstream.last_request();
    let (trace, parent, flags) = parts(seen.headers["traceparent"].to_str().unwrap());
    assert_eq!(trace, TRACE_ID, "the same trace");
    assert_ne!(
        parent, CLIENT_SPAN,
        "the upstream's parent is egressd's span"
    );
    assert_eq!(flags, "01");
    assert_eq!(seen.headers["tracestate"], "vendor=opaque");

    eventually(
        "the span reaches the collector",
        Duration::from_secs(10),
        || async { collector.span_of_trace(TRACE_ID).is_some() },
    )
    .await;
    let (service, span) = collector.span_of_trace(TRACE_ID).unwrap();
    assert_eq!(service, "egress-test");
    assert_eq!(hex(&span.span_id), parent);
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(span.kind, SpanKind::Client as i32);
    assert_eq!(span.name, "GET default/app");
    assert_eq!(
        attribute(&span, "http.response.status_code"),
        Some(Value::IntValue(200))
    );
    assert_eq!(
        attribute(&span, "egressd.backend"),
        Some(Value::StringValue("default/app".into()))
    );
    assert_eq!(
        attribute(&span, "network.peer.port"),
        Some(Value::IntValue(i64::from(upstream.addr.port())))
    );
    assert_eq!(
        attribute(&span, "http.response.body.size"),
        Some(Value::IntValue(3)),
        "ended after the body (`app`) was sent"
    );
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    assert_ne!(span.status.map(|s| s.code), Some(StatusCode::Error as i32));
}

#[tokio::test]
async fn sampling_follows_the_parent_and_new_traces_use_the_percentage() {
    // 0%: new traces are not sampled, a sampled parent still is.
    let (collector, upstream, proxy) = setup(0).await;
    let unsampled = get_with_headers(proxy.http(), HOST, "/new", &[]).await;
    assert_eq!(unsampled.status, 200);
    let (new_trace, _, flags) = parts(
        upstream.last_request().headers["traceparent"]
            .to_str()
            .unwrap(),
    );
    assert_eq!(flags, "00", "propagated, marked not sampled");

    // A local reply is a span too, with the error code.
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let refused = get_absolute(proxy.http(), "http://nowhere.trace.test/").await;
    assert_eq!(refused.status, 403, "no traceparent: not sampled at 0%");
    let parent = format!("00-{trace}-b7ad6b7169203331-01");
    let r = get_with_headers(
        proxy.http(),
        "nowhere.trace.test",
        "/",
        &[("traceparent", &parent)],
    )
    .await;
    assert_eq!(r.status, 403);
    eventually(
        "a sampled parent is followed whatever the percentage",
        Duration::from_secs(10),
        || async { collector.span_of_trace(trace).is_some() },
    )
    .await;
    let (_, span) = collector.span_of_trace(trace).unwrap();
    assert_eq!(
        attribute(&span, "error.type"),
        Some(Value::StringValue("destination_not_allowed".into()))
    );
    assert_eq!(span.status.map(|s| s.code), Some(StatusCode::Error as i32));
    // Both unsampled requests ended before the sampled one: they would have been exported
    // with it or before it.
    assert!(collector.span_of_trace(&new_trace).is_none());
    assert_eq!(collector.spans.lock().unwrap().len(), 1);
}
