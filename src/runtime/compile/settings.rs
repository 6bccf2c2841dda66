//! `ProxyConfig` → [`ProxySettings`].

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{at, Cx};
use crate::config::wire::enums::{AccessLogFormat, OutboundPolicy};
use crate::config::wire::proxy::ProxyConfigSpec;
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId, Reason};
use crate::names::is_valid_hostname_pattern;
use crate::snapshot::{AccessLogSettings, ProxySettings};
use crate::telemetry::trace::TracingSettings;

/// The files of `ProxyConfig.spec.platformIdentity`, resolved.
#[derive(Clone, Debug)]
pub(crate) struct PlatformFiles {
    pub(crate) certificate: std::path::PathBuf,
    pub(crate) private_key: std::path::PathBuf,
    pub(crate) ca: Option<std::path::PathBuf>,
}

/// Settings plus what backends need from them.
pub(crate) struct Settings {
    pub(crate) proxy: ProxySettings,
    /// For `tls.mode: PlatformProvided`.
    pub(crate) platform_identity: Option<PlatformFiles>,
    /// `deniedHostnames` patterns, lower-case.
    pub(crate) denied_hostnames: Vec<String>,
    /// The key MCP session ids are authenticated with.
    pub(crate) mcp_session_key: std::sync::Arc<crate::mcp::session::SessionKey>,
    /// `Gateway.spec.tls.backend.clientCertificateRef`, for Mutual Backends without one.
    pub(crate) gateway_client_certificate: super::gateway_tls::GatewayClientCertificate,
    /// `tlsInterception`: what makes the certificates of intercepted hosts.
    pub(crate) interception: Option<Arc<crate::interception::Interceptor>>,
}

impl std::ops::Deref for Settings {
    type Target = ProxySettings;
    fn deref(&self) -> &ProxySettings {
        &self.proxy
    }
}

/// The settings of the config's one `ProxyConfig` (the defaults without one), each section
/// checked in turn.
pub(crate) fn compile(cx: &mut Cx, set: &ConfigSet) -> Settings {
    let mut settings = Settings {
        proxy: ProxySettings::default(),
        platform_identity: None,
        denied_hostnames: Vec::new(),
        mcp_session_key: crate::mcp::session::SessionKey::of_this_process(),
        gateway_client_certificate: super::gateway_tls::default_client_certificate(cx, set),
        interception: super::interception::compile(cx, set),
    };
    for extra in set.proxy_configs.iter().skip(1) {
        cx.error(
            at(&extra.file, &extra.id, extra.pos, ""),
            "only one ProxyConfig is allowed",
            format!("merge it into {}", set.proxy_configs[0].id),
        );
    }
    let Some(pc) = set.proxy_configs.first() else {
        return settings;
    };
    let pc = Source {
        file: &pc.file,
        id: &pc.id,
        spec: &pc.spec,
    };
    pc.admin_address(cx, &mut settings.proxy);
    pc.outbound_policy(cx, &mut settings.proxy);
    pc.traffic_sections(cx, &mut settings.proxy);
    pc.denied_hostnames(cx, &mut settings.denied_hostnames);
    pc.nameservers(cx, &mut settings.proxy);
    settings.platform_identity = pc.platform_identity();
    pc.downstream_and_admin(cx, &mut settings.proxy);
    if let Some(tracing) = &pc.spec.tracing {
        settings.proxy.tracing = compile_tracing(cx, pc.file, pc.id, tracing);
    }
    pc.mcp_session_key(cx, &mut settings.mcp_session_key);
    (
        settings.proxy.rate_limit_redis,
        settings.proxy.rate_limit_failure_closed,
    ) = super::rate_limit::redis_settings(cx, set);
    settings
}

/// The ProxyConfig being compiled, and where it is written.
struct Source<'a> {
    file: &'a Path,
    id: &'a ObjectId,
    spec: &'a ProxyConfigSpec,
}

impl Source<'_> {
    /// `admin.address`: an ip:port (warned about when not loopback).
    fn admin_address(&self, cx: &mut Cx, proxy: &mut ProxySettings) {
        let (file, id) = (self.file, self.id);
        let Some(addr) = self.spec.admin.as_ref().and_then(|a| a.address.as_ref()) else {
            return;
        };
        match addr.value.parse::<SocketAddr>() {
            Ok(parsed) => {
                if !parsed.ip().is_loopback() {
                    cx.warn(
                        at(file, id, addr.pos, "spec.admin.address"),
                        Reason::Degraded,
                        format!("admin listener on non-loopback address {parsed} exposes config and status"),
                        "bind it to 127.0.0.1 unless something outside the host must reach it",
                    );
                }
                proxy.admin_addr = parsed;
            }
            Err(_) => cx.error(
                at(file, id, addr.pos, "spec.admin.address"),
                format!("invalid admin address `{}`", addr.value),
                "use ip:port, e.g. 127.0.0.1:15000",
            ),
        }
    }

    /// `outboundPolicy` (AllowAny warned about).
    fn outbound_policy(&self, cx: &mut Cx, proxy: &mut ProxySettings) {
        let Some(policy) = &self.spec.outbound_policy else {
            return;
        };
        proxy.outbound_policy = policy.value;
        if policy.value == OutboundPolicy::AllowAny {
            cx.warn(
                at(self.file, self.id, policy.pos, "spec.outboundPolicy"),
                Reason::Degraded,
                "outboundPolicy AllowAny lets clients reach any destination, and records nothing of it",
                "use AuditOnly to see what RegistryOnly would refuse (admin /blocked) while migrating",
            );
        }
    }

    /// `undeclaredDestinations`, `blockedAudit`, `bufferedBodies`, `drain` and `accessLog`.
    fn traffic_sections(&self, cx: &mut Cx, proxy: &mut ProxySettings) {
        let (file, id, spec) = (self.file, self.id, self.spec);
        if let Some(undeclared) = &spec.undeclared_destinations {
            super::undeclared::compile_undeclared(cx, file, id, undeclared, proxy);
        }
        if let Some(audit) = &spec.blocked_audit {
            super::undeclared::compile_blocked_audit(cx, file, id, audit, proxy);
        }
        if let Some(buffers) = &spec.buffered_bodies {
            super::undeclared::compile_buffered_bodies(cx, file, id, buffers, proxy);
        }
        if let Some(timeout) = spec.drain.as_ref().and_then(|d| d.timeout) {
            proxy.drain_timeout = Duration::from(timeout);
        }
        if let Some(log) = &spec.access_log {
            proxy.access_log = AccessLogSettings {
                enabled: log.enabled.unwrap_or(true),
                format: log.format.unwrap_or(AccessLogFormat::Json),
                path: log.path.clone().unwrap_or_else(|| "stdout".to_owned()),
            };
        }
    }

    /// `deniedHostnames`, lower-case, each a hostname or `*.suffix`.
    fn denied_hostnames(&self, cx: &mut Cx, denied: &mut Vec<String>) {
        for pattern in &self.spec.denied_hostnames {
            let lower = pattern.value.to_ascii_lowercase();
            if is_valid_hostname_pattern(&lower) {
                denied.push(lower);
            } else {
                cx.error(
                    at(self.file, self.id, pattern.pos, "spec.deniedHostnames"),
                    format!("invalid hostname pattern `{}`", pattern.value),
                    "use a hostname or `*.suffix`",
                );
            }
        }
    }

    /// `dns.nameservers`, each an ip:port, and the DNS limits.
    fn nameservers(&self, cx: &mut Cx, proxy: &mut ProxySettings) {
        let Some(dns) = &self.spec.dns else {
            return;
        };
        let limits = &mut proxy.dns_limits;
        let mut at_least_one = |value: &Option<Spanned<u32>>, field: &str, default: u32| {
            let value = value.as_ref()?;
            if value.value == 0 {
                cx.error(
                    at(self.file, self.id, value.pos, format!("spec.dns.{field}")),
                    format!("{field} must be at least 1"),
                    format!("omit it for the default, {default}"),
                );
                return None;
            }
            Some(value.value)
        };
        let defaults = crate::upstream::dns::DnsLimits::default();
        if let Some(max) = at_least_one(
            &dns.max_addresses_per_answer,
            "maxAddressesPerAnswer",
            defaults.max_addresses_per_answer as u32,
        ) {
            limits.max_addresses_per_answer = max as usize;
        }
        if let Some(rate) = at_least_one(
            &dns.max_lookups_per_second,
            "maxLookupsPerSecond",
            defaults.max_lookups_per_second,
        ) {
            limits.max_lookups_per_second = rate;
        }
        for ns in &dns.nameservers {
            match ns.value.parse::<SocketAddr>() {
                Ok(addr) => proxy.nameservers.push(addr),
                Err(_) => cx.error(
                    at(self.file, self.id, ns.pos, "spec.dns.nameservers"),
                    format!("invalid name server `{}`", ns.value),
                    "use ip:port, e.g. 10.0.0.10:53",
                ),
            }
        }
    }

    /// `platformIdentity`'s files, relative to the ProxyConfig's file like every other path.
    fn platform_identity(&self) -> Option<PlatformFiles> {
        let identity = self.spec.platform_identity.as_ref()?;
        let path = |p: &str| super::tls::resolve(self.file, p);
        Some(PlatformFiles {
            certificate: path(&identity.certificate_file),
            private_key: path(&identity.private_key_file),
            ca: identity.ca_certificate_file.as_deref().map(path),
        })
    }

    /// `downstream` (HTTP/2 and connection limits), then the admin server's connection limit
    /// and allowed hosts.
    fn downstream_and_admin(&self, cx: &mut Cx, proxy: &mut ProxySettings) {
        let (file, id) = (self.file, self.id);
        if let Some(downstream) = &self.spec.downstream {
            if let Some(http2) = &downstream.http2 {
                proxy.downstream_http2 = super::downstream::compile_http2(cx, file, id, http2);
            }
            proxy.downstream = super::downstream::compile_limits(cx, file, id, downstream);
        }
        let Some(admin) = &self.spec.admin else {
            return;
        };
        proxy.admin_max_connections = super::downstream::compile_admin_max_connections(
            cx,
            file,
            id,
            admin.max_connections.as_ref(),
            proxy.admin_max_connections,
        );
        for pattern in &admin.allowed_hosts {
            let lower = pattern.value.to_ascii_lowercase();
            if lower == "*" || is_valid_hostname_pattern(&lower) {
                proxy.admin_allowed_hosts.push(lower);
            } else {
                cx.error(
                    at(file, id, pattern.pos, "spec.admin.allowedHosts"),
                    format!("invalid host name pattern `{}`", pattern.value),
                    "use a host name, `*.suffix`, or `*` (IP addresses and localhost need no entry)",
                );
            }
        }
    }

    /// `mcp.sessionKeyFile`: read now, and watched.
    fn mcp_session_key(&self, cx: &mut Cx, key: &mut Arc<crate::mcp::session::SessionKey>) {
        let Some(key_file) = self
            .spec
            .mcp
            .as_ref()
            .and_then(|m| m.value.session_key_file.as_ref())
        else {
            return;
        };
        let path = super::tls::resolve(self.file, &key_file.value);
        match crate::mcp::session::SessionKey::from_file(&path) {
            Ok(read) => *key = Arc::new(read),
            Err(e) => cx.error(
                at(self.file, self.id, key_file.pos, "spec.mcp.sessionKeyFile"),
                e.to_string(),
                "write at least 32 random bytes to it, e.g. `openssl rand -base64 48 > FILE`, \
                 and give every replica the same file",
            ),
        }
        // A rotated key reloads (sessions issued under the old key then get 404 and
        // re-initialize).
        cx.refer(&path);
    }
}

/// `spec.tracing` → [`TracingSettings`]; an error in builds without the `otel` feature.
fn compile_tracing(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &crate::config::ObjectId,
    tracing: &crate::config::yaml::Spanned<crate::config::wire::proxy::TracingSpec>,
) -> Option<TracingSettings> {
    if !crate::telemetry::trace::AVAILABLE {
        cx.error(
            at(file, id, tracing.pos, "spec.tracing"),
            "this build of egressd cannot export spans",
            "build with `cargo build --release --features otel` (the container image has it), or remove `tracing`",
        );
        return None;
    }
    let spec = &tracing.value;
    let before = cx.error_count();
    let endpoint = &spec.otlp_endpoint;
    match endpoint.value.parse::<http::Uri>() {
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
        Ok(uri) if uri.scheme_str() == Some("https") => cx.error(
            at(file, id, endpoint.pos, "spec.tracing.otlpEndpoint"),
            "https:// collectors are not supported: the exporter has no TLS",
            "send to a collector agent on the node or in the pod over http://",
        ),
        _ => cx.error(
            at(file, id, endpoint.pos, "spec.tracing.otlpEndpoint"),
            format!("`{}` is not an http:// URL", endpoint.value),
            "e.g. http://127.0.0.1:4318/v1/traces",
        ),
    }
    let sampling = match &spec.sampling_percent {
        None => 1.0,
        Some(p) if (0.0..=100.0).contains(&p.value) => p.value / 100.0,
        Some(p) => {
            cx.error(
                at(file, id, p.pos, "spec.tracing.samplingPercent"),
                format!("samplingPercent {} is not between 0 and 100", p.value),
                "e.g. 100 (every new trace) or 0.1",
            );
            1.0
        }
    };
    let service_name = spec
        .service_name
        .as_ref()
        .map_or_else(|| "egressd".to_owned(), |s| s.value.clone());
    if cx.error_count() > before {
        return None;
    }
    Some(TracingSettings {
        endpoint: endpoint.value.clone(),
        sampling,
        service_name,
        export_interval: spec
            .export_interval
            .map_or(Duration::from_secs(5), Duration::from),
    })
}
