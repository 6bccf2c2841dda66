use super::*;

/// One error of every kind.
fn every_kind() -> Vec<ProxyError> {
    let backend: Arc<str> = "default/api".into();
    let endpoint: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let b = || backend.clone();
    let t = Duration::from_secs(1);
    let text = || "x".to_owned();
    vec![
        ProxyError::InvalidRequest(text()),
        ProxyError::HeadRejected(super::super::limits::HeadRejection::UriTooLong {
            len: 9,
            max: 8,
        }),
        ProxyError::ClientHello(HelloRejection::Timeout),
        ProxyError::ClientHello(HelloRejection::NotTls("x")),
        ProxyError::ClientHello(HelloRejection::NoSni),
        ProxyError::ClientHello(HelloRejection::InvalidSni(text())),
        ProxyError::DestinationNotAllowed {
            host: text(),
            port: 80,
            via: crate::telemetry::blocked::Via::Http,
        },
        ProxyError::DestinationDenied {
            host: text(),
            port: 80,
            via: crate::telemetry::blocked::Via::Connect,
            reason: crate::snapshot::undeclared::Refusal::Declared,
        },
        ProxyError::PortNotAllowed {
            host: text(),
            port: 81,
            declared: text(),
        },
        ProxyError::NoRoute {
            host: text(),
            path: text(),
        },
        ProxyError::NoBackend { route: b() },
        ProxyError::NoHealthyUpstream {
            backend: b(),
            detail: text(),
        },
        ProxyError::ConnectFailure {
            backend: b(),
            endpoint,
            cause: text(),
        },
        ProxyError::ConnectTimeout {
            backend: b(),
            endpoint,
            timeout: t,
        },
        ProxyError::UpstreamTimeout {
            backend: b(),
            endpoint,
            timeout: t,
            blame: Blame::Endpoint,
        },
        ProxyError::StreamIdleTimeout {
            backend: b(),
            endpoint,
            timeout: t,
            blame: Blame::Endpoint,
        },
        ProxyError::UpstreamTls {
            backend: b(),
            endpoint,
            failure: TlsFailure::UnknownCa,
            detail: text(),
        },
        ProxyError::UpstreamReset {
            backend: b(),
            endpoint,
            cause: text(),
        },
        ProxyError::UpstreamProtocol {
            backend: b(),
            endpoint,
            cause: text(),
        },
        ProxyError::UpgradeNotAllowed { backend: b() },
        ProxyError::Overflow {
            backend: b(),
            limit: crate::upstream::breaker::Limit::Connections,
            max: 1,
        },
        ProxyError::McpSessionNotFound {
            backend: b(),
            reason: text(),
        },
        ProxyError::McpProtocolVersion {
            backend: b(),
            expected: text(),
            got: text(),
        },
        ProxyError::McpHeaderMismatch {
            backend: b(),
            reason: text(),
        },
        ProxyError::McpBodyTooLarge {
            backend: b(),
            limit: 1,
        },
        ProxyError::CredentialUnavailable {
            backend: b(),
            extension: text(),
            reason: text(),
        },
        ProxyError::LoopDetected { hops: 8 },
        ProxyError::ClientNotAllowed {
            client: text(),
            destination: text(),
            reason: text(),
        },
        ProxyError::ProxyAuthRequired {
            reason: "x",
            challenge: HeaderValue::from_static("Basic realm=\"egressd\""),
        },
        ProxyError::DestinationAddressDenied {
            backend: b(),
            detail: text(),
        },
        ProxyError::NotSupported("x"),
        ProxyError::ListenerGone,
        ProxyError::MalformedBody { cause: text() },
        ProxyError::ClientClosed { cause: text() },
        ProxyError::BufferOverflow { budget: 1 },
        ProxyError::BodyTimeout { timeout: t },
    ]
}

#[test]
fn the_table_is_consistent_with_who_a_failure_is_about() {
    for err in every_kind() {
        let class = err.class();
        assert!(
            class.status.is_client_error() || class.status.is_server_error(),
            "{err:?}"
        );
        assert!(!class.code.is_empty(), "{err:?}");
        match err.origin() {
            // The client's fault is never blamed on an upstream, never retried.
            Origin::Downstream => {
                assert!(class.status.is_client_error(), "{err:?}");
                assert_eq!(class.retry, RetryOn::Never, "{err:?}");
                assert!(err.outlier_outcome().is_none(), "{err:?}");
            }
            // egressd's own decisions teach outlier detection nothing.
            Origin::Policy => {
                assert!(err.outlier_outcome().is_none(), "{err:?}");
                assert!(!class.connect_failure, "{err:?}");
                assert_eq!(class.retry, RetryOn::Never, "{err:?}");
            }
            Origin::Upstream { endpoint, .. } => {
                assert!(class.status.is_server_error(), "{err:?}");
                assert_eq!(
                    err.outlier_outcome().is_some(),
                    endpoint.is_some(),
                    "{err:?}"
                );
                assert_eq!(err.endpoint(), endpoint);
            }
        }
        if class.retry == RetryOn::ConnectFailure {
            assert!(class.connect_failure, "{err:?}");
        }
        // Each Backend's connect-failure counters are resolved for these codes only.
        assert_eq!(
            class.connect_failure,
            crate::telemetry::metrics::CONNECT_FAILURE_CODES.contains(&class.code),
            "{err:?}"
        );
    }
}

#[test]
fn a_timeout_is_charged_to_the_endpoint_only_when_the_endpoint_caused_it() {
    let endpoint: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let t = Duration::from_secs(1);
    for blame in [Blame::Endpoint, Blame::ClientDeadline, Blame::ClientBody] {
        let timeouts = [
            ProxyError::UpstreamTimeout {
                backend: "default/api".into(),
                endpoint,
                timeout: t,
                blame,
            },
            ProxyError::StreamIdleTimeout {
                backend: "default/api".into(),
                endpoint,
                timeout: t,
                blame,
            },
        ];
        for err in timeouts {
            let charged = blame == Blame::Endpoint;
            assert_eq!(err.charged_endpoint().is_some(), charged, "{err:?}");
            assert_eq!(err.outlier_outcome().is_some(), charged, "{err:?}");
            // The reply and the access log's endpoint are the same whoever caused it.
            assert_eq!(err.endpoint(), Some(endpoint));
            assert_eq!(err.status(), StatusCode::GATEWAY_TIMEOUT);
        }
    }
    // The client's reset or early close is the client's, never an endpoint's.
    let closed = ProxyError::ClientClosed {
        cause: "reset".into(),
    };
    assert_eq!(closed.charged_endpoint(), None);
    assert_eq!(closed.outlier_outcome(), None);
}
