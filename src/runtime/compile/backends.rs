//! `Backend` → [`Backend`] with its ports and endpoint groups.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use super::policy::{check_sections, PolicyIndex};
use super::settings::Settings;
use super::tls::{compile_tls, TlsSite};
use super::{at, Cx};
use crate::balance::health::CheckKind;
use crate::balance::outlier::{FailurePercentageSettings, OutlierSettings, SuccessRateSettings};
use crate::balance::slow_start::SlowStartSettings;
use crate::balance::{BalancerKind, LeastRequestSettings};
use crate::config::wire::backend::BackendSpec;
use crate::config::wire::enums::{DestinationType, LookupFamily, Protocol, TlsMode};
use crate::config::wire::policy::{
    CircuitBreaker, DnsPolicy, HealthCheck, Http2Policy, LoadBalancer, TimeoutPolicy,
    TrafficPolicySpec,
};
use crate::config::wire::Object;
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, Reason};
use crate::names::{hostname_matches, is_valid_hostname};
use crate::snapshot::{Backend, BackendPort};
use crate::upstream::address::is_never_reachable;
use crate::upstream::breaker::{BreakerSettings, RetryBudget};
use crate::upstream::connect::{Http2Options, Http2Settings, HttpWire, TcpKeepalive, Transport};
use crate::upstream::dns::RefreshPlan;
use crate::upstream::health_check::CheckPlan;
use crate::upstream::pool::PoolSettings;
use crate::upstream::registry::{EndpointTemplate, GroupKey, GroupSource, StateRegistry};
use crate::upstream::{Endpoint, EndpointGroup, EndpointSource, GroupSettings};

/// Compiled Backends by `(namespace, name)`, with their inline policies for request-level
/// resolution later.
/// A compiled Backend with its inline policy (if any).
pub(crate) type BackendEntry<'a> = (Arc<Backend>, Option<&'a TrafficPolicySpec>);

pub(crate) struct Backends<'a> {
    pub by_name: HashMap<(String, String), BackendEntry<'a>>,
    order: Vec<Arc<Backend>>,
}

impl Backends<'_> {
    pub fn all(&self) -> Vec<Arc<Backend>> {
        self.order.clone()
    }

    pub fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<&(Arc<Backend>, Option<&TrafficPolicySpec>)> {
        self.by_name.get(&(namespace.to_owned(), name.to_owned()))
    }
}

pub(crate) fn compile<'a>(
    cx: &mut Cx,
    set: &'a ConfigSet,
    policies: &PolicyIndex<'_>,
    settings: &Settings,
    registry: &StateRegistry,
) -> Backends<'a> {
    let mut out = Backends {
        by_name: HashMap::new(),
        order: Vec::new(),
    };
    for obj in &set.backends {
        if let Some(backend) = compile_one(cx, obj, policies, settings, registry) {
            let inline = obj.spec.traffic_policy.as_ref().map(|p| &p.value);
            out.by_name.insert(
                (obj.id.namespace.clone(), obj.id.name.clone()),
                (backend.clone(), inline),
            );
            out.order.push(backend);
        }
    }
    out
}

fn compile_one(
    cx: &mut Cx,
    obj: &Object<BackendSpec>,
    policies: &PolicyIndex<'_>,
    settings: &Settings,
    registry: &StateRegistry,
) -> Option<Arc<Backend>> {
    let (file, id, spec) = (&*obj.file, &obj.id, &obj.spec);
    let dest = &spec.destination;
    let before = cx.diagnostics.iter().filter(|d| d.is_error()).count();

    let credentials = super::credentials::compile_extensions(cx, file, id, &spec.extensions);
    let inline = spec.traffic_policy.as_ref();
    if let Some(p) = inline {
        check_sections(cx, file, id, &p.value, "spec.trafficPolicy");
    }

    // Destination.
    let mut hostname = None;
    // Address, own port (else the Backend port's), weight, priority.
    let mut ips: Vec<(IpAddr, Option<u16>, u32, u32)> = Vec::new();
    match dest.kind.value {
        DestinationType::Fqdn => {
            if dest.ip.is_some() {
                cx.error(
                    at(file, id, dest.pos, "spec.destination.ip"),
                    "type FQDN takes `fqdn`, not `ip`",
                    "remove `ip` or set `type: IP`",
                );
            }
            match &dest.fqdn {
                None => cx.error(
                    at(file, id, dest.pos, "spec.destination.fqdn"),
                    "type FQDN needs `fqdn.hostname`",
                    "add `fqdn: {hostname: api.example.com}`",
                ),
                Some(fqdn) => {
                    let host = fqdn
                        .hostname
                        .value
                        .trim_end_matches('.')
                        .to_ascii_lowercase();
                    let pos = fqdn.hostname.pos;
                    if host.parse::<IpAddr>().is_ok() {
                        cx.error(
                            at(file, id, pos, "spec.destination.fqdn.hostname"),
                            format!("`{host}` is an IP address"),
                            "use `type: IP` with `ip.endpoints` for addresses",
                        );
                    } else if host.contains('*') {
                        cx.error(
                            at(file, id, pos, "spec.destination.fqdn.hostname"),
                            format!("wildcard hostname `{host}` is not a destination"),
                            "name one host per Backend",
                        );
                    } else if !is_valid_hostname(&host) {
                        cx.error(
                            at(file, id, pos, "spec.destination.fqdn.hostname"),
                            format!("invalid hostname `{host}`"),
                            "use a DNS name such as api.example.com",
                        );
                    } else if let Some(p) = settings
                        .denied_hostnames
                        .iter()
                        .find(|p| hostname_matches(p, &host))
                    {
                        cx.error(
                            at(file, id, pos, "spec.destination.fqdn.hostname"),
                            format!(
                                "hostname `{host}` is denied by ProxyConfig deniedHostnames `{p}`"
                            ),
                            "choose another destination or change deniedHostnames",
                        );
                    } else {
                        hostname = Some(host);
                    }
                }
            }
        }
        DestinationType::Ip => {
            if dest.fqdn.is_some() {
                cx.error(
                    at(file, id, dest.pos, "spec.destination.fqdn"),
                    "type IP takes `ip`, not `fqdn`",
                    "remove `fqdn` or set `type: FQDN`",
                );
            }
            match &dest.ip {
                Some(ip) if !ip.endpoints.is_empty() => {
                    for (i, ep) in ip.endpoints.iter().enumerate() {
                        let field = format!("spec.destination.ip.endpoints[{i}]");
                        match ep.address.value.parse::<IpAddr>() {
                            Ok(addr) if is_never_reachable(addr) => cx.error(at(file, id, ep.address.pos, format!("{field}.address")), format!("address {addr} is link-local or unspecified and never a destination"), "use the service's real address"),
                            Ok(addr) => ips.push((crate::upstream::address::canonical_ip(addr), ep.port.as_ref().map(|p| p.value), ep.weight.unwrap_or(1), ep.priority.as_ref().map_or(0, |p| p.value))),
                            Err(_) => cx.error(at(file, id, ep.address.pos, format!("{field}.address")), format!("invalid IP address `{}`", ep.address.value), "write an IPv4 or IPv6 address without port"),
                        }
                        if let Some(port) = &ep.port {
                            if port.value == 0 {
                                cx.error(
                                    at(file, id, port.pos, format!("{field}.port")),
                                    "port 0 is not a destination port",
                                    "use 1-65535",
                                );
                            } else if dest.ports.len() != 1 {
                                cx.error(
                                    at(file, id, port.pos, format!("{field}.port")),
                                    format!(
                                        "an endpoint's own port needs a Backend with exactly one port (this one declares {})",
                                        dest.ports.len()
                                    ),
                                    "split the Backend: one per port, each with its endpoints",
                                );
                            }
                        }
                        if ep.weight == Some(0) {
                            cx.error(
                                at(file, id, ep.pos, format!("{field}.weight")),
                                "weight must be at least 1",
                                "remove the endpoint to stop sending it traffic",
                            );
                        }
                        if let Some(h) = &ep.hostname {
                            cx.not_yet(
                                at(file, id, h.pos, format!("{field}.hostname")),
                                "endpoint hostname",
                                "[tls]",
                            );
                        }
                    }
                }
                _ => cx.error(
                    at(file, id, dest.pos, "spec.destination.ip.endpoints"),
                    "type IP needs at least one endpoint",
                    "add `ip: {endpoints: [{address: 10.0.0.1}]}`",
                ),
            }
        }
    }
    if dest.ports.is_empty() {
        cx.error(
            at(file, id, dest.pos, "spec.destination.ports"),
            "a Backend needs at least one port",
            "add `ports: [{number: 443}]`",
        );
    }

    let label: Arc<str> = format!("{}/{}", id.namespace, id.name).into();
    // Connection-level policy.
    let inline_spec = inline.map(|p| &p.value);
    let dns: DnsPolicy = policies
        .backend_section(id, inline_spec, |s| s.dns.as_ref())
        .unwrap_or_default();
    let timeouts: TimeoutPolicy = policies
        .backend_section(id, inline_spec, |s| s.timeout.as_ref())
        .unwrap_or_default();
    let balancer = policies
        .backend_section(id, inline_spec, |s| s.load_balancer.as_ref())
        .map_or_else(BalancerKind::default, |lb| balancer_kind(&lb));
    let breaker = policies
        .backend_section(id, inline_spec, |s| s.circuit_breaker.as_ref())
        .map_or_else(BreakerSettings::default, |cb| breaker_settings(&cb));
    let health_check = policies.backend_section(id, inline_spec, |s| s.health_check.as_ref());
    let outlier = health_check
        .as_ref()
        .map_or_else(OutlierSettings::default, outlier_settings);
    let active = health_check
        .as_ref()
        .and_then(|hc| super::health::active_settings(hc.active.as_ref()));
    let tcp_keepalive = policies
        .backend_section(id, inline_spec, |s| s.tcp_keepalive.as_ref())
        .map(|k| {
            let d = TcpKeepalive::default();
            TcpKeepalive {
                idle: k.idle_time.as_ref().map_or(d.idle, |v| v.value.0),
                interval: k.interval.as_ref().map_or(d.interval, |v| v.value.0),
                probes: k.probes.as_ref().map_or(d.probes, |v| v.value),
            }
        });
    let http2 = policies
        .backend_section(id, inline_spec, |s| s.http2.as_ref())
        .map_or_else(Http2Settings::default, |p| http2_settings(&p));
    let pool = PoolSettings {
        idle_timeout: timeouts
            .http
            .as_ref()
            .and_then(|h| h.connection_idle_timeout)
            .map_or(PoolSettings::default().idle_timeout, Duration::from),
        ..PoolSettings::default()
    };

    let mut ports = Vec::new();
    let mut seen_ports: HashMap<u16, usize> = HashMap::new();
    for (i, port) in dest.ports.iter().enumerate() {
        let field = format!("spec.destination.ports[{i}]");
        let number = port.number.value;
        if number == 0 {
            cx.error(
                at(file, id, port.number.pos, format!("{field}.number")),
                "port 0 is not a destination port",
                "use 1-65535",
            );
            continue;
        }
        if let Some(first) = seen_ports.insert(number, i) {
            cx.error(
                at(file, id, port.number.pos, format!("{field}.number")),
                format!("port {number} is listed twice (also ports[{first}])"),
                "list each port once",
            );
            continue;
        }
        let tls = port.tls.as_ref().or(spec.tls.as_ref());
        let protocol = port.protocol.as_ref().or(spec.protocol.as_ref());
        let passthrough = tls
            .and_then(|t| t.value.mode.as_ref())
            .is_some_and(|m| m.value == TlsMode::Passthrough);
        // Passthrough carries the client's TLS bytes untouched: protocol TCP is implied.
        let protocol_value = protocol.map_or(
            if passthrough {
                Protocol::Tcp
            } else {
                Protocol::Http
            },
            |p| p.value,
        );
        let (protocol_pos, protocol_field) = match (&port.protocol, &spec.protocol) {
            (Some(p), _) => (p.pos, format!("{field}.protocol")),
            (None, Some(p)) => (p.pos, "spec.protocol".to_owned()),
            _ => (port.pos, field.clone()),
        };
        match protocol_value {
            Protocol::Tcp => {}
            http if passthrough => cx.error(
                at(file, id, protocol_pos, protocol_field.clone()),
                format!(
                    "tls.mode Passthrough carries raw TLS bytes and cannot speak protocol {http}"
                ),
                "use protocol TCP (or omit protocol)",
            ),
            _ => {}
        }
        // An HTTP or MCP check needs an HTTP port; on raw TCP only a connect can be checked.
        let request_check = active.as_ref().and_then(|a| match a.kind {
            CheckKind::Http(_) => Some("HTTP"),
            CheckKind::Mcp => Some("MCP"),
            CheckKind::Tcp => None,
        });
        if let Some(kind) = request_check.filter(|_| protocol_value == Protocol::Tcp) {
            cx.error(
                at(file, id, protocol_pos, protocol_field.clone()),
                format!(
                    "port {number} carries TCP, so healthCheck.active type {kind} cannot check it"
                ),
                "use healthCheck.active type: TCP for this Backend",
            );
        }
        let mcp = compile_mcp(cx, file, id, spec, port, &field, protocol_value, settings);
        let tls_field = if port.tls.is_some() {
            format!("{field}.tls")
        } else {
            "spec.tls".to_owned()
        };
        let plan = compile_tls(
            cx,
            &TlsSite {
                file,
                id,
                tls: tls.map(|t| (&t.value, t.pos)),
                object_pos: obj.pos,
                field: &tls_field,
                hostname: hostname.as_deref(),
                protocol: protocol_value,
                platform: settings.platform_identity.as_ref(),
            },
        );
        let mode = plan.as_ref().map(|p| p.mode);
        let tls_spec = plan.and_then(|p| p.spec);
        if let Some(spec) = &tls_spec {
            if let crate::upstream::tls::Roots::Files(files) = &spec.roots {
                cx.referenced.extend(files.iter().cloned());
            }
            if let Some((cert, key)) = &spec.client_cert {
                cx.referenced.insert(cert.clone());
                cx.referenced.insert(key.clone());
            }
        }
        let transport = match &tls_spec {
            None => Transport::Plain,
            Some(spec) => match crate::upstream::tls::build(spec) {
                Ok(origination) => Transport::Tls(Arc::new(origination)),
                Err(e) => {
                    cx.missing_ref(
                        at(file, id, tls.map_or(obj.pos, |t| t.pos), tls_field.clone()),
                        format!("TLS settings of port {number} cannot be used: {e}"),
                        "check the certificate, key and CA files (paths are relative to this YAML file)",
                    );
                    Transport::Plain
                }
            },
        };
        if mode == Some(TlsMode::InsecureDisable) {
            // No valid destination (already reported as an error): nothing to judge, and
            // calling a rejected `127.0.0.1` "non-loopback" would only mislead.
            let known = hostname.is_some() || !ips.is_empty();
            let loopback = match &hostname {
                Some(h) => h == "localhost",
                None => ips.iter().all(|(ip, _, _, _)| ip.is_loopback()),
            };
            if known && !loopback {
                cx.warn(
                    at(file, id, tls.map_or(obj.pos, |t| t.pos), tls_field.clone()),
                    Reason::Degraded,
                    format!("port {number} sends plaintext (tls.mode InsecureDisable) to a non-loopback destination"),
                    "use tls.mode Simple unless the network path is trusted",
                );
            }
        }

        let plaintext = matches!(transport, Transport::Plain);
        if protocol_value == Protocol::H2c && !plaintext {
            cx.error(
                at(file, id, protocol_pos, protocol_field.clone()),
                "protocol H2C is HTTP/2 in plaintext, but this port originates TLS",
                "set tls.mode: InsecureDisable for h2c, or use protocol HTTP2 for HTTP/2 over TLS",
            );
        }
        let wire = match protocol_value {
            Protocol::Http2 | Protocol::H2c | Protocol::Grpc => HttpWire::Http2,
            // MCP is HTTP plus MCP handling (CONFIG.md).
            Protocol::Http | Protocol::Mcp if !plaintext => HttpWire::Negotiated,
            _ => HttpWire::Http1,
        };

        let mut fingerprint = DefaultHasher::new();
        protocol_value.hash(&mut fingerprint);
        http2.hash(&mut fingerprint);
        mode.hash(&mut fingerprint);
        tls_spec.hash(&mut fingerprint);
        let template = EndpointTemplate {
            backend: id.clone(),
            port: number,
            transport: fingerprint.finish(),
            pool,
            weight: 1,
            priority: 0,
        };
        let settings = GroupSettings {
            outlier,
            active: active.clone(),
            breaker,
        };
        let group = match &hostname {
            Some(host) => {
                let refresh = dns
                    .dns_refresh_rate
                    .map_or(Duration::from_secs(30), Duration::from);
                let respect_ttl = dns.respect_dns_ttl.unwrap_or(true);
                let family = dns.lookup_family.unwrap_or(LookupFamily::IPv4Preferred);
                let key = GroupKey {
                    template: template.clone(),
                    source: GroupSource::Dns {
                        hostname: host.clone(),
                        refresh,
                        respect_ttl,
                        family,
                    },
                    balancer: balancer.key(),
                    outlier,
                    active: active.clone(),
                    breaker,
                };
                let source = EndpointSource::Dns {
                    hostname: host.clone(),
                    port: number,
                    refresh,
                    respect_ttl,
                };
                let (group, created) = registry.group(key, || {
                    EndpointGroup::new_dns(source, || balancer.build(), settings)
                });
                if created {
                    cx.outlier_groups
                        .push((Arc::downgrade(&group), label.clone()));
                    cx.refreshers.push(RefreshPlan {
                        group: Arc::downgrade(&group),
                        template,
                        family,
                        addresses: None,
                    });
                }
                group
            }
            None => {
                let endpoints: Vec<Arc<Endpoint>> = ips
                    .iter()
                    .map(|(ip, own_port, weight, priority)| {
                        let t = EndpointTemplate {
                            weight: *weight,
                            priority: *priority,
                            ..template.clone()
                        };
                        registry.endpoint(&t, SocketAddr::new(*ip, own_port.unwrap_or(number)))
                    })
                    .collect();
                let mut levels: Vec<u32> = ips.iter().map(|(_, _, _, p)| *p).collect();
                levels.sort_unstable();
                levels.dedup();
                let key = GroupKey {
                    template,
                    source: GroupSource::Static {
                        levels: levels.len().max(1),
                    },
                    balancer: balancer.key(),
                    outlier,
                    active: active.clone(),
                    breaker,
                };
                let (group, created) = registry.group(key, || {
                    EndpointGroup::new_static(endpoints.clone(), || balancer.build(), settings)
                });
                if created {
                    cx.outlier_groups
                        .push((Arc::downgrade(&group), label.clone()));
                } else if !group.holds(&endpoints) {
                    // Published when this config is accepted: a config that is refused must
                    // leave the serving one's endpoints alone.
                    cx.static_lists.push((group.clone(), endpoints));
                }
                group
            }
        };
        let rewrite = dest
            .fqdn
            .as_ref()
            .is_none_or(|f| f.rewrite_authority.unwrap_or(true));
        let authority = match (&hostname, rewrite) {
            (Some(host), true) => {
                let default_port = if mode == Some(TlsMode::InsecureDisable) {
                    80
                } else {
                    443
                };
                let value = if number == default_port {
                    host.clone()
                } else {
                    format!("{host}:{number}")
                };
                HeaderValue::from_str(&value).ok()
            }
            _ => None,
        };
        if active.is_some() {
            cx.health_checks.push(CheckPlan {
                group: Arc::downgrade(&group),
                backend: format!("{}/{}", id.namespace, id.name).into(),
                host: check_host(health_check.as_ref(), hostname.as_deref(), number, mode),
                transport: transport.clone(),
                wire,
                http2: Http2Options::new(&http2),
                mcp: mcp.clone(),
            });
        }
        ports.push(Arc::new(BackendPort {
            tcp_keepalive,
            mcp,
            passthrough: mode == Some(TlsMode::Passthrough),
            transport,
            wire,
            http2: Http2Options::new(&http2),
            number,
            protocol: protocol_value,
            endpoints: group,
            authority,
        }));
    }

    let errors_now = cx.diagnostics.iter().filter(|d| d.is_error()).count();
    if errors_now > before {
        return None;
    }
    Some(Arc::new(Backend {
        label,
        id: id.clone(),
        hostname,
        ports,
        fallback: spec.fallback.as_ref().is_some_and(|f| f.value),
        credentials,
        stats: std::sync::OnceLock::new(),
    }))
}

/// `Host` of HTTP health checks: `http.host`, else the Backend's hostname (with the port when
/// it is not the default one of the port's scheme); `None` for IP Backends (the endpoint
/// address is used).
fn check_host(
    hc: Option<&HealthCheck>,
    hostname: Option<&str>,
    port: u16,
    mode: Option<TlsMode>,
) -> Option<HeaderValue> {
    let configured = hc
        .and_then(|hc| hc.active.as_ref())
        .and_then(|a| a.value.http.as_ref())
        .and_then(|h| h.value.host.as_ref())
        .map(|h| h.value.clone());
    let value = configured.or_else(|| {
        let host = hostname?;
        let default_port = if mode == Some(TlsMode::InsecureDisable) {
            80
        } else {
            443
        };
        Some(if port == default_port {
            host.to_owned()
        } else {
            format!("{host}:{port}")
        })
    })?;
    HeaderValue::from_str(&value).ok()
}

/// `protocolOptions.mcp` of a port (the port's own, else the Backend's), for protocol MCP.
#[allow(clippy::too_many_arguments)]
fn compile_mcp(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &crate::config::ObjectId,
    spec: &BackendSpec,
    port: &crate::config::wire::backend::BackendPort,
    field: &str,
    protocol: Protocol,
    settings: &Settings,
) -> Option<Arc<crate::mcp::McpPort>> {
    let (options, options_field) = match (&port.protocol_options, &spec.protocol_options) {
        (Some(o), _) => (Some(o), format!("{field}.protocolOptions.mcp")),
        (None, Some(o)) => (Some(o), "spec.protocolOptions.mcp".to_owned()),
        (None, None) => (None, String::new()),
    };
    let mcp = options.and_then(|o| o.value.mcp.as_ref());
    if protocol != Protocol::Mcp {
        if let Some(m) = mcp {
            cx.error(
                at(file, id, m.pos, options_field),
                format!("protocolOptions.mcp applies to protocol MCP, not {protocol}"),
                "set protocol: MCP, or remove protocolOptions.mcp",
            );
        }
        return None;
    }
    let m = mcp.map(|m| &m.value);
    let sub = |name: &str| format!("{options_field}.{name}");
    let path = m.and_then(|m| m.path.as_ref());
    if let Some(p) = path.filter(|p| !p.value.starts_with('/')) {
        cx.error(
            at(file, id, p.pos, sub("path")),
            format!("path `{}` must start with /", p.value),
            "e.g. /mcp",
        );
    }
    let mut legacy_sse = false;
    if let Some(t) = m.and_then(|m| m.transport.as_ref()) {
        match t.value.as_str() {
            "StreamableHTTP" => {}
            "SSE" => legacy_sse = true,
            other => cx.error(
                at(file, id, t.pos, sub("transport")),
                format!("unknown MCP transport `{other}`"),
                "StreamableHTTP (the default) or SSE",
            ),
        }
    }
    let stateful = match m.and_then(|m| m.session_routing.as_ref()) {
        None => true,
        Some(r) if r.value == "Stateful" => true,
        Some(r) if r.value == "Stateless" => false,
        Some(r) => {
            cx.error(
                at(file, id, r.pos, sub("sessionRouting")),
                format!("unknown sessionRouting `{}`", r.value),
                "Stateful (the default: a session stays on the endpoint that issued it) or Stateless",
            );
            true
        }
    };
    let default_path = if legacy_sse {
        crate::mcp::legacy::DEFAULT_PATH
    } else {
        "/mcp"
    };
    Some(Arc::new(crate::mcp::McpPort {
        legacy_sse,
        path: path.map_or_else(|| default_path.to_owned(), |p| p.value.clone()),
        version: m.and_then(|m| m.version.as_ref()).map(|v| v.value.clone()),
        stateful,
        key: settings.mcp_session_key.clone(),
        tools: m
            .and_then(|m| m.tools.as_ref())
            .map(|t| crate::mcp::inspect::ToolPolicy {
                allow: t.value.allow.clone(),
                deny: t.value.deny.clone(),
            }),
    }))
}

/// The `http2` section over the defaults (values were range-checked by `check_sections`).
fn http2_settings(p: &Http2Policy) -> Http2Settings {
    let defaults = Http2Settings::default();
    let window = |q: &Option<crate::config::yaml::Spanned<crate::config::units::Quantity>>,
                  default: u32| {
        q.as_ref()
            .and_then(|q| u32::try_from(q.value.0).ok())
            .unwrap_or(default)
    };
    Http2Settings {
        max_concurrent_streams: p.max_concurrent_streams.as_ref().map(|v| v.value),
        stream_window: window(&p.initial_stream_window_size, defaults.stream_window),
        connection_window: window(
            &p.initial_connection_window_size,
            defaults.connection_window,
        ),
        keepalive: p.connection_keepalive.as_ref().map(|k| {
            (
                k.interval.value.0,
                k.timeout.map_or(Duration::from_secs(20), |t| t.0),
            )
        }),
    }
}

/// The `loadBalancer` section (validated by `check_sections`).
fn balancer_kind(lb: &LoadBalancer) -> BalancerKind {
    use crate::config::wire::enums::LoadBalancerType;
    match lb.kind.value {
        LoadBalancerType::RoundRobin => BalancerKind::RoundRobin,
        LoadBalancerType::Random => BalancerKind::Random,
        LoadBalancerType::ConsistentHash => lb
            .consistent_hash
            .as_ref()
            .and_then(|c| super::consistent_hash::settings(&c.value))
            // Only a config with errors (never used) has no settings here.
            .map_or_else(BalancerKind::default, BalancerKind::ConsistentHash),
        LoadBalancerType::LeastRequest => {
            let defaults = LeastRequestSettings::default();
            let lr = lb.least_request.as_ref().map(|l| &l.value);
            let bias = lr.and_then(|l| l.active_request_bias.as_ref());
            BalancerKind::LeastRequest(LeastRequestSettings {
                choice_count: lr
                    .and_then(|l| l.choice_count.as_ref())
                    .map_or(defaults.choice_count, |c| c.value),
                active_request_bias: bias.map_or(defaults.active_request_bias, |b| b.value),
                bias_explicit: bias.is_some(),
                distinct_choices: lr
                    .and_then(|l| l.distinct_choices)
                    .unwrap_or(defaults.distinct_choices),
                slow_start: lb.slow_start.as_ref().map(|s| {
                    let d = SlowStartSettings::default();
                    SlowStartSettings {
                        window: s.value.window.value.0,
                        aggression: s
                            .value
                            .aggression
                            .as_ref()
                            .map_or(d.aggression, |a| a.value),
                        min_factor: s
                            .value
                            .min_weight_percent
                            .as_ref()
                            .map_or(d.min_factor, |m| f64::from(m.value) / 100.0),
                    }
                }),
            })
        }
    }
}

/// `circuitBreaker` over Envoy's defaults (validated by `check_sections`).
fn breaker_settings(cb: &CircuitBreaker) -> BreakerSettings {
    let d = BreakerSettings::default();
    let v = |f: &Option<Spanned<u32>>, default: u32| f.as_ref().map_or(default, |v| v.value);
    BreakerSettings {
        max_parallel_requests: v(&cb.max_parallel_requests, d.max_parallel_requests),
        max_connections: v(&cb.max_connections, d.max_connections),
        max_pending_requests: v(&cb.max_pending_requests, d.max_pending_requests),
        max_parallel_retries: v(&cb.max_parallel_retries, d.max_parallel_retries),
        retry_budget: cb.retry_budget.as_ref().map(|b| {
            let d = RetryBudget::default();
            RetryBudget {
                milli_percent: b
                    .value
                    .percent
                    .as_ref()
                    .map_or(d.milli_percent, |p| (p.value * 1000.0).round() as u32),
                min_concurrency: v(&b.value.min_retry_concurrency, d.min_concurrency),
            }
        }),
    }
}

/// `healthCheck` over egressd's defaults (validated by `check_sections`).
fn outlier_settings(hc: &HealthCheck) -> OutlierSettings {
    let d = OutlierSettings::default();
    let p = hc.passive.as_ref().map(|p| &p.value);
    let duration = |v: Option<&crate::config::yaml::Spanned<crate::config::units::GwDuration>>,
                    default: Duration| v.map_or(default, |v| v.value.0);
    let base = duration(
        p.and_then(|p| p.base_ejection_time.as_ref()),
        d.base_ejection_time,
    );
    OutlierSettings {
        interval: duration(p.and_then(|p| p.interval.as_ref()), d.interval),
        // 0 turns a detector off.
        consecutive_gateway_errors: match p.and_then(|p| p.consecutive_gateway_errors.as_ref()) {
            Some(v) => (v.value > 0).then_some(v.value),
            None => d.consecutive_gateway_errors,
        },
        // Unset: detected at Envoy's 5, not enforced; 0: not even detected.
        consecutive_5xx: p
            .and_then(|p| p.consecutive_5xx_errors.as_ref())
            .map_or(d.consecutive_5xx, |v| v.value),
        enforce_5xx: p
            .and_then(|p| p.consecutive_5xx_errors.as_ref())
            .is_some_and(|v| v.value > 0),
        split_local_origin: p
            .and_then(|p| p.split_external_local_origin_errors)
            .unwrap_or(d.split_local_origin),
        consecutive_local_origin: p
            .and_then(|p| p.consecutive_local_origin_failures.as_ref())
            .map_or(d.consecutive_local_origin, |v| v.value),
        success_rate: p.and_then(|p| p.success_rate.as_ref()).map(|sr| {
            let d = SuccessRateSettings::default();
            let v = |f: &Option<Spanned<u32>>, default| f.as_ref().map_or(default, |v| v.value);
            SuccessRateSettings {
                stdev_factor: v(&sr.value.stdev_factor, d.stdev_factor),
                minimum_hosts: v(&sr.value.minimum_hosts, d.minimum_hosts),
                request_volume: v(&sr.value.request_volume, d.request_volume),
            }
        }),
        failure_percentage: p.and_then(|p| p.failure_percentage.as_ref()).map(|fp| {
            let d = FailurePercentageSettings::default();
            let v = |f: &Option<Spanned<u32>>, default| f.as_ref().map_or(default, |v| v.value);
            FailurePercentageSettings {
                threshold: v(&fp.value.threshold, d.threshold),
                minimum_hosts: v(&fp.value.minimum_hosts, d.minimum_hosts),
                request_volume: v(&fp.value.request_volume, d.request_volume),
            }
        }),
        base_ejection_time: base,
        max_ejection_time: duration(
            p.and_then(|p| p.max_ejection_time.as_ref()),
            d.max_ejection_time.max(base),
        ),
        max_ejection_jitter: duration(
            p.and_then(|p| p.max_ejection_time_jitter.as_ref()),
            d.max_ejection_jitter,
        ),
        max_ejection_percent: p
            .and_then(|p| p.max_ejection_percent.as_ref())
            .map_or(d.max_ejection_percent, |v| v.value),
        always_eject_one: p
            .and_then(|p| p.always_eject_one_endpoint)
            .unwrap_or(d.always_eject_one),
        panic_threshold: hc
            .panic_threshold
            .as_ref()
            .map_or(d.panic_threshold, |v| v.value),
    }
}
