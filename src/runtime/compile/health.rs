//! `healthCheck.active`: validation (positioned errors) and the resolved settings.

use std::time::Duration;

use super::{at, Cx};
use crate::balance::health::{ActiveSettings, CheckKind, HttpCheck};
use crate::config::wire::enums::HealthCheckType;
use crate::config::wire::policy::{ActiveHealthCheck, HttpHealthCheck};
use crate::config::yaml::Spanned;
use crate::config::ObjectId;

/// Reports the mistakes in `healthCheck.active`, each at its value.
pub(super) fn check_active(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    active: &ActiveHealthCheck,
    prefix: &str,
) {
    let field = |name: &str| format!("{prefix}.healthCheck.active.{name}");
    for (name, v) in [("interval", &active.interval), ("timeout", &active.timeout)] {
        if let Some(v) = v.as_ref().filter(|v| v.value.0.is_zero()) {
            cx.error(
                at(file, id, v.pos, field(name)),
                format!("{name} must be greater than zero"),
                if name == "interval" {
                    "e.g. 10s"
                } else {
                    "e.g. 1s"
                },
            );
        }
    }
    for (name, v) in [
        ("unhealthyThreshold", &active.unhealthy_threshold),
        ("healthyThreshold", &active.healthy_threshold),
    ] {
        if let Some(v) = v.as_ref().filter(|v| v.value == 0) {
            cx.error(
                at(file, id, v.pos, field(name)),
                format!("{name} must be at least 1"),
                "the number of checks in a row that change an endpoint's health, e.g. 3",
            );
        }
    }
    if let Some(http) = &active.http {
        check_http(cx, file, id, active, http, prefix);
    }
}

/// `healthCheck.active.http`: only for type HTTP, with an absolute path, a method that asks
/// for a response, a valid Host and HTTP statuses.
fn check_http(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    active: &ActiveHealthCheck,
    http: &Spanned<HttpHealthCheck>,
    prefix: &str,
) {
    let field = |name: &str| format!("{prefix}.healthCheck.active.{name}");
    if active.kind.value != HealthCheckType::Http {
        cx.error(
            at(file, id, http.pos, field("http")),
            format!("http settings do not apply to type {}", active.kind.value),
            "remove http, or set type: HTTP (type MCP pings the port's protocolOptions.mcp.path)",
        );
    }
    let http_pos = http.pos;
    let http = &http.value;
    if let Some(path) = &http.path {
        let valid =
            path.value.starts_with('/') && path.value.parse::<http::uri::PathAndQuery>().is_ok();
        if !valid {
            cx.error(
                at(file, id, path.pos, field("http.path")),
                format!("path `{}` is not an absolute request path", path.value),
                "start it with /, e.g. /healthz",
            );
        }
    }
    if let Some(method) = &http.method {
        if method_of(&method.value).is_none() {
            cx.error(
                at(file, id, method.pos, field("http.method")),
                format!("`{}` is not a method a health check can send", method.value),
                "e.g. GET or HEAD",
            );
        }
    }
    if let Some(host) = &http.host {
        if host.value.is_empty() || http::HeaderValue::from_str(&host.value).is_err() {
            cx.error(
                at(file, id, host.pos, field("http.host")),
                format!("`{}` is not a valid Host header", host.value),
                "e.g. api.example.com",
            );
        }
    }
    let Some(statuses) = &http.expected_statuses else {
        return;
    };
    if statuses.is_empty() {
        cx.error(
            at(file, id, http_pos, field("http.expectedStatuses")),
            "expectedStatuses is empty: no check could pass",
            "list the statuses that mean healthy, e.g. [200]",
        );
    }
    for (i, s) in statuses.iter().enumerate() {
        if !(100..=599).contains(&s.value) {
            cx.error(
                at(
                    file,
                    id,
                    s.pos,
                    field(&format!("http.expectedStatuses[{i}]")),
                ),
                format!(
                    "expected status {} is not an HTTP status (100 to 599)",
                    s.value
                ),
                "e.g. [200, 204]",
            );
        }
    }
}

/// `GET`, `HEAD`, ...: any standard or extension method except CONNECT (which opens a tunnel
/// rather than asking for a response).
fn method_of(s: &str) -> Option<http::Method> {
    http::Method::from_bytes(s.as_bytes())
        .ok()
        .filter(|m| m != http::Method::CONNECT)
}

/// `healthCheck.active` over the defaults; `None` when absent or of a type this build does
/// not run (already reported by `check_active`).
pub(super) fn active_settings(
    active: Option<&Spanned<ActiveHealthCheck>>,
) -> Option<ActiveSettings> {
    let a = &active?.value;
    let duration = |v: &Option<Spanned<crate::config::units::GwDuration>>, default: Duration| {
        v.as_ref().map_or(default, |v| v.value.0)
    };
    let kind = match a.kind.value {
        HealthCheckType::Tcp => CheckKind::Tcp,
        HealthCheckType::Mcp => CheckKind::Mcp,
        HealthCheckType::Http => {
            let http = a.http.as_ref().map(|h| &h.value);
            CheckKind::Http(HttpCheck {
                path: http
                    .and_then(|h| h.path.as_ref())
                    .map_or_else(|| "/".to_owned(), |p| p.value.clone()),
                method: http
                    .and_then(|h| h.method.as_ref())
                    .and_then(|m| method_of(&m.value))
                    .unwrap_or(http::Method::GET),
                host: http.and_then(|h| h.host.as_ref()).map(|h| h.value.clone()),
                expected_statuses: http
                    .and_then(|h| h.expected_statuses.as_ref())
                    .map_or_else(|| vec![200], |s| s.iter().map(|s| s.value).collect()),
            })
        }
    };
    Some(ActiveSettings {
        kind,
        interval: duration(&a.interval, ActiveSettings::DEFAULT_INTERVAL),
        interval_jitter: duration(&a.interval_jitter, Duration::ZERO),
        timeout: duration(&a.timeout, ActiveSettings::DEFAULT_TIMEOUT),
        unhealthy_threshold: a
            .unhealthy_threshold
            .as_ref()
            .map_or(ActiveSettings::DEFAULT_UNHEALTHY_THRESHOLD, |v| v.value),
        healthy_threshold: a
            .healthy_threshold
            .as_ref()
            .map_or(ActiveSettings::DEFAULT_HEALTHY_THRESHOLD, |v| v.value),
        uneject_on_pass: a.uneject_on_pass.unwrap_or(true),
    })
}
