//! `Backend` → [`Backend`] with its ports and endpoint groups.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use super::destination::{compile_destination, Destination};
use super::policy::{check_sections, PolicyIndex};
use super::reuse::{CompiledBackends, Entry, FileStates, SideOutputs};
use super::settings::Settings;
use super::tls::{compile_tls, TlsSite};
use super::{at, At, Cx};
use crate::balance::health::{ActiveSettings, CheckKind};
use crate::balance::outlier::{FailurePercentageSettings, OutlierSettings, SuccessRateSettings};
use crate::balance::slow_start::SlowStartSettings;
use crate::balance::{BalancerKind, LeastRequestSettings};
use crate::config::wire::backend::{BackendPort as WirePort, BackendSpec};
use crate::config::wire::enums::{LookupFamily, Protocol, TlsMode};
use crate::config::wire::policy::{
    CircuitBreaker, DnsPolicy, HealthCheck, Http2Policy, LoadBalancer, TimeoutPolicy,
    TrafficPolicySpec,
};
use crate::config::wire::Object;
use crate::config::yaml::{Pos, Spanned};
use crate::config::{ConfigSet, ObjectId, Reason};
use crate::snapshot::wildcard::{HostDns, WildcardHosts, WildcardPlan};
use crate::snapshot::{Backend, BackendPort};
use crate::upstream::breaker::{BreakerSettings, RetryBudget};
use crate::upstream::connect::{Http2Settings, HttpWire, TcpKeepalive, Transport};
use crate::upstream::dns::{AnswerCheck, RefreshPlan};
use crate::upstream::health_check::CheckPlan;
use crate::upstream::pem::PemSource;
use crate::upstream::pool::PoolSettings;
use crate::upstream::registry::{
    EndpointTemplate, GroupKey, GroupSource, PortIdentity, StateRegistry,
};
use crate::upstream::tls::{Roots, TlsSpec};
use crate::upstream::{Endpoint, EndpointGroup, EndpointSource, GroupSettings};

/// A compiled Backend with its inline policy (if any).
pub(crate) type BackendEntry<'a> = (Arc<Backend>, Option<&'a TrafficPolicySpec>);

/// Compiled Backends by `(namespace, name)`, with their inline policies for request-level
/// resolution later.
pub(crate) struct Backends<'a> {
    /// By namespace, then name, borrowed from the objects: a lookup allocates nothing (an
    /// owned `(namespace, name)` key made two strings per backendRef).
    by_name: HashMap<&'a str, HashMap<&'a str, BackendEntry<'a>>>,
    order: Vec<Arc<Backend>>,
    /// The same Backends, for the next reload to reuse.
    pub(crate) compiled: CompiledBackends,
}

impl<'a> Backends<'a> {
    pub(crate) fn all(&self) -> Vec<Arc<Backend>> {
        self.order.clone()
    }

    /// Every compiled Backend with its inline policy, in no particular order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &BackendEntry<'a>> {
        self.by_name.values().flat_map(HashMap::values)
    }

    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<&BackendEntry<'a>> {
        self.by_name.get(namespace)?.get(name)
    }
}

pub(crate) fn compile<'a>(
    cx: &mut Cx,
    set: &'a ConfigSet,
    policies: &PolicyIndex<'_>,
    settings: &Settings,
    registry: &Arc<StateRegistry>,
    previous: Option<&CompiledBackends>,
) -> Backends<'a> {
    let mut out = Backends {
        by_name: HashMap::new(),
        order: Vec::with_capacity(set.backends.len()),
        compiled: CompiledBackends::for_set(set),
    };
    let previous = previous.filter(|p| p.applies_to(set));
    let mut files = FileStates::default();
    for obj in &set.backends {
        let kept = previous.and_then(|p| p.find(obj, &mut files));
        let backend = match kept {
            Some(entry) => {
                reuse(cx, entry);
                out.compiled.keep(entry.clone());
                Some(entry.backend.clone())
            }
            None => compile_recording(cx, obj, policies, settings, registry, &mut out, &mut files),
        };
        if let Some(backend) = backend {
            let inline = obj.spec.traffic_policy.as_ref().map(|p| &*p.value);
            out.by_name
                .entry(&obj.id.namespace)
                .or_default()
                .insert(&obj.id.name, (backend.clone(), inline));
            out.order.push(backend);
        }
    }
    out
}

/// Gives again what compiling a kept Backend gave: its warnings, its health checks (each
/// accepted config starts its own checkers) and the files it reads (watched).
fn reuse(cx: &mut Cx, entry: &Entry) {
    cx.diagnostics.extend(entry.diagnostics().iter().cloned());
    cx.health_checks
        .extend(entry.health_checks().iter().cloned());
    for file in entry.files() {
        cx.refer(file);
    }
}

/// Compiles one Backend and records it with what it gave, for the next reload to reuse.
fn compile_recording(
    cx: &mut Cx,
    obj: &Arc<Object<BackendSpec>>,
    policies: &PolicyIndex<'_>,
    settings: &Settings,
    registry: &Arc<StateRegistry>,
    out: &mut Backends<'_>,
    files: &mut FileStates,
) -> Option<Arc<Backend>> {
    let started = std::time::SystemTime::now();
    let (diagnostics, health_checks) = (cx.diagnostics.len(), cx.health_checks.len());
    cx.referred_by_backend.clear();
    let backend = compile_one(cx, obj, policies, settings, registry);
    if &*obj.id.kind == "XBackend" {
        // Mapped onto a Backend when loaded: name the fields as the XBackend writes them.
        for d in &mut cx.diagnostics[diagnostics..] {
            d.field = crate::config::xbackend::field_path(&d.field);
        }
    }
    let backend = backend?;
    let side = SideOutputs {
        started,
        diagnostics: cx.diagnostics[diagnostics..].to_vec(),
        health_checks: cx.health_checks[health_checks..].to_vec(),
        files: std::mem::take(&mut cx.referred_by_backend),
    };
    out.compiled.record(obj, backend.clone(), side, files);
    Some(backend)
}

/// The connection-level policy of a Backend (its inline `trafficPolicy`, else a
/// BackendTrafficPolicy targeting it), the same for all its ports.
struct BackendPolicy {
    dns: DnsPolicy,
    balancer: BalancerKind,
    breaker: BreakerSettings,
    health_check: Option<HealthCheck>,
    outlier: OutlierSettings,
    active: Option<ActiveSettings>,
    tcp_keepalive: Option<TcpKeepalive>,
    http2: Http2Settings,
    pool: PoolSettings,
}

/// One Backend while its ports compile: its YAML, where it sends and its policy.
struct BackendSite<'a> {
    obj: &'a Object<BackendSpec>,
    settings: &'a Settings,
    registry: &'a Arc<StateRegistry>,
    label: Arc<str>,
    dest: Destination,
    policy: BackendPolicy,
    /// The settings of the groups of all its ports (shared with other Backends' groups).
    group_settings: Arc<GroupSettings>,
    /// A wildcard Backend's hosts, which its ports share.
    wildcard: Option<Arc<WildcardHosts>>,
}

impl BackendSite<'_> {
    fn file(&self) -> &Path {
        &self.obj.file
    }

    fn id(&self) -> &ObjectId {
        &self.obj.id
    }

    fn spec(&self) -> &BackendSpec {
        &self.obj.spec
    }
}

/// A port's protocol and where it is written (the port's own, else the Backend's).
struct PortProtocol {
    value: Protocol,
    pos: Pos,
    field: String,
}

/// How a port connects: its TLS mode, what its client config was built from, its transport.
struct PortTransport {
    mode: Option<TlsMode>,
    spec: Option<TlsSpec>,
    transport: Transport,
}

/// One Backend: its destination, policy and ports; `None` when any of it is in error.
fn compile_one(
    cx: &mut Cx,
    obj: &Object<BackendSpec>,
    policies: &PolicyIndex<'_>,
    settings: &Settings,
    registry: &Arc<StateRegistry>,
) -> Option<Arc<Backend>> {
    let (file, id, spec) = (&*obj.file, &obj.id, &obj.spec);
    let before = cx.error_count();

    let credentials = super::credentials::compile_extensions(cx, file, id, &spec.extensions);
    let inline = spec.traffic_policy.as_ref();
    if let Some(p) = inline {
        check_sections(cx, file, id, &p.value, "spec.trafficPolicy");
    }
    let dest = compile_destination(cx, file, id, &spec.destination, settings);
    let policy = backend_policy(policies, id, inline.map(|p| &*p.value));
    let group_settings = cx.group_settings.get(GroupSettings {
        balancer: policy.balancer.key(),
        outlier: policy.outlier,
        active: policy.active.clone(),
        breaker: policy.breaker,
    });
    let mut site = BackendSite {
        obj,
        settings,
        registry,
        label: format!("{}/{}", id.namespace, id.name).into(),
        dest,
        policy,
        group_settings,
        wildcard: None,
    };
    site.wildcard = wildcard_hosts(&site);
    let ports = compile_ports(cx, &site);

    if cx.error_count() > before {
        return None;
    }
    Some(Arc::new(Backend {
        label: site.label,
        id: id.clone(),
        hostname: site.dest.hostname,
        ports,
        fallback: spec.fallback.as_ref().is_some_and(|f| f.value),
        credentials,
        stats: std::sync::OnceLock::new(),
    }))
}

/// The Backend's policy sections over their defaults.
fn backend_policy(
    policies: &PolicyIndex<'_>,
    id: &ObjectId,
    inline: Option<&TrafficPolicySpec>,
) -> BackendPolicy {
    let timeouts: TimeoutPolicy = policies
        .backend_section(id, inline, |s| s.timeout.as_ref())
        .unwrap_or_default();
    let health_check = policies.backend_section(id, inline, |s| s.health_check.as_ref());
    BackendPolicy {
        dns: policies
            .backend_section(id, inline, |s| s.dns.as_ref())
            .unwrap_or_default(),
        balancer: policies
            .backend_section(id, inline, |s| s.load_balancer.as_ref())
            .map_or_else(BalancerKind::default, |lb| balancer_kind(&lb)),
        breaker: policies
            .backend_section(id, inline, |s| s.circuit_breaker.as_ref())
            .map_or_else(BreakerSettings::default, |cb| breaker_settings(&cb)),
        outlier: health_check
            .as_ref()
            .map_or_else(OutlierSettings::default, outlier_settings),
        active: health_check
            .as_ref()
            .and_then(|hc| super::health::active_settings(hc.active.as_ref())),
        health_check,
        tcp_keepalive: policies
            .backend_section(id, inline, |s| s.tcp_keepalive.as_ref())
            .map(|k| {
                let d = TcpKeepalive::default();
                TcpKeepalive {
                    idle: k.idle_time.as_ref().map_or(d.idle, |v| v.value.0),
                    interval: k.interval.as_ref().map_or(d.interval, |v| v.value.0),
                    probes: k.probes.as_ref().map_or(d.probes, |v| v.value),
                }
            }),
        http2: policies
            .backend_section(id, inline, |s| s.http2.as_ref())
            .map_or_else(Http2Settings::default, |p| http2_settings(&p)),
        pool: PoolSettings {
            idle_timeout: timeouts
                .http
                .as_ref()
                .and_then(|h| h.connection_idle_timeout)
                .map_or(PoolSettings::default().idle_timeout, Duration::from),
            ..PoolSettings::default()
        },
    }
}

/// `destination.ports`, each a real port listed once.
fn compile_ports(cx: &mut Cx, site: &BackendSite<'_>) -> Vec<Arc<BackendPort>> {
    let (file, id) = (site.file(), site.id());
    let mut ports = Vec::new();
    let mut seen_ports: HashMap<u16, usize> = HashMap::new();
    for (i, port) in site.spec().destination.ports.iter().enumerate() {
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
        ports.push(compile_port(cx, site, port, &field));
    }
    ports
}

/// One port: its protocol, MCP options, TLS, wire, endpoint group and health checks.
fn compile_port(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    port: &Spanned<WirePort>,
    field: &str,
) -> Arc<BackendPort> {
    let number = port.number.value;
    let protocol = port_protocol(cx, site, port, field);
    let mcp = compile_mcp(cx, site, port, field, protocol.value);
    let transport = port_transport(cx, site, port, field, protocol.value);
    let wire = port_wire(cx, site, &protocol, &transport.transport);
    let policy = &site.policy;
    let group = match &site.wildcard {
        // A template: each concrete host gets a group of its own.
        Some(_) => Arc::new(EndpointGroup::new_static(
            Vec::new(),
            || policy.balancer.build(),
            site.group_settings.clone(),
        )),
        None => endpoint_group(cx, site, number, protocol.value, &transport),
    };
    let mode = transport.mode;
    let authority = site
        .dest
        .hostname
        .as_ref()
        .filter(|_| site.wildcard.is_none() && rewrites_authority(site.spec()))
        .and_then(|host| HeaderValue::from_str(&host_and_port(host, number, mode)).ok());
    let http2 = cx.http2_options(&policy.http2);
    if policy.active.is_some() && site.wildcard.is_none() {
        cx.health_checks.push(CheckPlan {
            group: Arc::downgrade(&group),
            backend: site.label.clone(),
            host: check_host(site, number, mode),
            transport: transport.transport.clone(),
            wire,
            http2: http2.clone(),
            mcp: mcp.clone(),
        });
    }
    Arc::new(BackendPort {
        tcp_keepalive: policy.tcp_keepalive,
        mcp,
        passthrough: mode == Some(TlsMode::Passthrough),
        interception: port.interception.as_ref().map(|m| m.value)
            != Some(crate::config::wire::enums::InterceptionMode::Disabled),
        transport: transport.transport,
        wire,
        http2,
        number,
        protocol: protocol.value,
        endpoints: group,
        authority,
        wildcard: site.wildcard.clone(),
    })
}

/// A wildcard Backend's hosts (`None` for other Backends): limits, DNS and balancing of each
/// concrete host, and which ports take their TLS name from it.
fn wildcard_hosts(site: &BackendSite<'_>) -> Option<Arc<WildcardHosts>> {
    let limits = site.dest.wildcard?;
    let pattern = site.dest.hostname.clone()?;
    let (id, spec) = (site.id(), site.spec());
    let dns = &site.policy.dns;
    // A port whose `tls` names no SNI or hostname to verify sends each concrete host.
    let sni_from_host = spec
        .destination
        .ports
        .iter()
        .filter(|p| {
            p.tls.as_ref().or(spec.tls.as_ref()).is_none_or(|t| {
                t.value.sni.is_none()
                    && t.value
                        .validation
                        .as_ref()
                        .is_none_or(|v| v.hostname.is_none())
            })
        })
        .map(|p| p.number.value)
        .collect();
    let plan = WildcardPlan {
        pattern,
        id: id.clone(),
        allowed: site.dest.allowed.clone(),
        denied_hostnames: site.settings.denied_hostnames.clone(),
        dns: HostDns {
            refresh: dns
                .dns_refresh_rate
                .map_or(Duration::from_secs(30), Duration::from),
            respect_ttl: dns.respect_dns_ttl.unwrap_or(true),
            family: dns.lookup_family.unwrap_or(LookupFamily::IPv4Preferred),
        },
        balancer: site.policy.balancer.clone(),
        group_settings: site.group_settings.clone(),
        pool: site.policy.pool,
        rewrite_authority: rewrites_authority(spec),
        sni_from_host,
        label: site.label.clone(),
        check_host: configured_check_host(site),
    };
    Some(Arc::new(WildcardHosts::new(
        plan,
        limits,
        site.registry.clone(),
    )))
}

/// Whether requests carry the destination's hostname as authority (`fqdn.rewriteAuthority`,
/// default true).
fn rewrites_authority(spec: &BackendSpec) -> bool {
    spec.destination
        .fqdn
        .as_ref()
        .is_none_or(|f| f.rewrite_authority.unwrap_or(true))
}

/// `host`, with `:port` when the port is not the default one of the port's scheme.
fn host_and_port(host: &str, port: u16, mode: Option<TlsMode>) -> String {
    let default_port = if mode == Some(TlsMode::InsecureDisable) {
        80
    } else {
        443
    };
    if port == default_port {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    }
}

/// `Host` of HTTP health checks: `http.host`, else the Backend's hostname (with the port when
/// it is not the default one of the port's scheme); `None` for IP Backends (the endpoint
/// address is used).
fn check_host(site: &BackendSite<'_>, port: u16, mode: Option<TlsMode>) -> Option<HeaderValue> {
    let value = configured_check_host(site).or_else(|| {
        let host = site.dest.hostname.as_deref()?;
        Some(host_and_port(host, port, mode))
    })?;
    HeaderValue::from_str(&value).ok()
}

/// The active health check's `http.host`, when set.
fn configured_check_host(site: &BackendSite<'_>) -> Option<String> {
    site.policy
        .health_check
        .as_ref()
        .and_then(|hc| hc.active.as_ref())
        .and_then(|a| a.value.http.as_ref())
        .and_then(|h| h.value.host.as_ref())
        .map(|h| h.value.clone())
}

/// The port's protocol (the port's own, else the Backend's; TCP under Passthrough, else HTTP),
/// checked against the TLS mode and the active health check.
fn port_protocol(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    port: &Spanned<WirePort>,
    field: &str,
) -> PortProtocol {
    let (file, id, spec) = (site.file(), site.id(), site.spec());
    let passthrough = port
        .tls
        .as_ref()
        .or(spec.tls.as_ref())
        .and_then(|t| t.value.mode.as_ref())
        .is_some_and(|m| m.value == TlsMode::Passthrough);
    // Passthrough carries the client's TLS bytes untouched: protocol TCP is implied.
    let value = port.protocol.as_ref().or(spec.protocol.as_ref()).map_or(
        if passthrough {
            Protocol::Tcp
        } else {
            Protocol::Http
        },
        |p| p.value,
    );
    let (pos, field) = match (&port.protocol, &spec.protocol) {
        (Some(p), _) => (p.pos, format!("{field}.protocol")),
        (None, Some(p)) => (p.pos, "spec.protocol".to_owned()),
        _ => (port.pos, field.to_owned()),
    };
    if passthrough && value != Protocol::Tcp {
        cx.error(
            at(file, id, pos, field.clone()),
            format!("tls.mode Passthrough carries raw TLS bytes and cannot speak protocol {value}"),
            "use protocol TCP (or omit protocol)",
        );
    }
    // An HTTP or MCP check needs an HTTP port; on raw TCP only a connect can be checked.
    let request_check = site.policy.active.as_ref().and_then(|a| match a.kind {
        CheckKind::Http(_) => Some("HTTP"),
        CheckKind::Mcp => Some("MCP"),
        CheckKind::Tcp => None,
    });
    if let Some(kind) = request_check.filter(|_| value == Protocol::Tcp) {
        cx.error(
            at(file, id, pos, field.clone()),
            format!(
                "port {} carries TCP, so healthCheck.active type {kind} cannot check it",
                port.number.value
            ),
            "use healthCheck.active type: TCP for this Backend",
        );
    }
    PortProtocol { value, pos, field }
}

/// The port's `tls` block (the port's own, else the Backend's) checked, and its client config
/// built from the files it names.
fn port_transport(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    port: &Spanned<WirePort>,
    field: &str,
    protocol: Protocol,
) -> PortTransport {
    let (file, id, obj) = (site.file(), site.id(), site.obj);
    let number = port.number.value;
    let tls = port.tls.as_ref().or(obj.spec.tls.as_ref());
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
            tls: tls.map(|t| (&*t.value, t.pos)),
            object_pos: obj.pos,
            field: &tls_field,
            // A wildcard Backend's hosts each send their own name (see `snapshot::wildcard`).
            hostname: site
                .dest
                .hostname
                .as_deref()
                .filter(|_| site.dest.wildcard.is_none()),
            protocol,
            platform: site.settings.platform_identity.as_ref(),
            gateway_default: &site.settings.gateway_client_certificate,
        },
    );
    let mode = plan.as_ref().map(|p| p.mode);
    let spec = plan.and_then(|p| p.spec);
    let here = || at(file, id, tls.map_or(obj.pos, |t| t.pos), tls_field.clone());
    // A CA file that cannot be used is reported at its entry of `caCertificateFiles`.
    let ca_files = tls
        .and_then(|t| t.value.validation.as_ref())
        .map_or(&[][..], |v| v.ca_certificate_files.as_slice());
    let at_entry = |origin: &str| {
        ca_files.iter().enumerate().find_map(|(i, f)| {
            let path = super::tls::resolve(file, &f.value);
            (PemSource::file(path).to_string() == origin).then(|| {
                let field = format!("{tls_field}.validation.caCertificateFiles[{i}]");
                at(file, id, f.pos, field)
            })
        })
    };
    let transport = match &spec {
        None => Transport::Plain,
        Some(spec) => originate(cx, here(), spec, number, &at_entry),
    };
    if mode == Some(TlsMode::InsecureDisable) {
        warn_plaintext(cx, here(), &site.dest, number);
    }
    PortTransport {
        mode,
        spec,
        transport,
    }
}

/// The client config of a port that originates TLS, from the files (noted as referenced) and
/// Secrets `spec` names; plaintext, with the reason reported, when they cannot be used.
fn originate<'a>(
    cx: &mut Cx,
    here: At<'a>,
    spec: &TlsSpec,
    number: u16,
    at_entry: &dyn Fn(&str) -> Option<At<'a>>,
) -> Transport {
    let roots = match &spec.roots {
        Roots::Pem(sources) => sources.as_slice(),
        Roots::System => &[],
    };
    let client = spec.client_cert.iter().flat_map(|(cert, key)| [cert, key]);
    for file in roots.iter().chain(client).filter_map(PemSource::path) {
        cx.refer(file);
    }
    match crate::upstream::tls::build(spec) {
        Ok(origination) => Transport::Tls(Arc::new(origination)),
        Err(e) => {
            let here = e.origin().and_then(at_entry).unwrap_or(here);
            cx.missing_ref(
                here,
                format!("TLS settings of port {number} cannot be used: {e}"),
                "check the certificate, key and CA files (paths are relative to this YAML file) or Secrets",
            );
            Transport::Plain
        }
    }
}

/// Warns when tls.mode InsecureDisable sends plaintext beyond this host.
fn warn_plaintext(cx: &mut Cx, here: At<'_>, dest: &Destination, number: u16) {
    // No valid destination (already reported as an error): nothing to judge, and calling a
    // rejected `127.0.0.1` "non-loopback" would only mislead.
    let known = dest.hostname.is_some() || !dest.addrs.is_empty();
    let loopback = match &dest.hostname {
        // RFC 6761: `localhost` and every name under it (a wildcard under it too) mean loopback.
        Some(h) => crate::upstream::address::is_loopback_name(h),
        None => dest.addrs.iter().all(|a| a.ip.is_loopback()),
    };
    if known && !loopback {
        cx.warn(
            here,
            Reason::Degraded,
            format!("port {number} sends plaintext (tls.mode InsecureDisable) to a non-loopback destination"),
            "use tls.mode Simple unless the network path is trusted",
        );
    }
}

/// How HTTP is spoken on the port: HTTP/2 for H2C, HTTP2 and gRPC, negotiated by ALPN for
/// HTTP and MCP over TLS, else HTTP/1.1. H2C over TLS is an error.
fn port_wire(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    protocol: &PortProtocol,
    transport: &Transport,
) -> HttpWire {
    let plaintext = matches!(transport, Transport::Plain);
    if protocol.value == Protocol::H2c && !plaintext {
        cx.error(
            at(site.file(), site.id(), protocol.pos, protocol.field.clone()),
            "protocol H2C is HTTP/2 in plaintext, but this port originates TLS",
            "set tls.mode: InsecureDisable for h2c, or use protocol HTTP2 for HTTP/2 over TLS",
        );
    }
    match protocol.value {
        Protocol::Http2 | Protocol::H2c | Protocol::Grpc => HttpWire::Http2,
        // MCP is HTTP plus MCP handling (docs/configuration.md).
        Protocol::Http | Protocol::Mcp if !plaintext => HttpWire::Negotiated,
        _ => HttpWire::Http1,
    }
}

/// The port's endpoint group from the registry (kept across reloads when nothing that shapes
/// it changed): resolved from the hostname, or the listed addresses.
fn endpoint_group(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    number: u16,
    protocol: Protocol,
    transport: &PortTransport,
) -> Arc<EndpointGroup> {
    let mut fingerprint = DefaultHasher::new();
    protocol.hash(&mut fingerprint);
    site.policy.http2.hash(&mut fingerprint);
    transport.mode.hash(&mut fingerprint);
    transport.spec.hash(&mut fingerprint);
    let port = Arc::new(PortIdentity {
        backend: site.id().clone(),
        number,
        transport: fingerprint.finish(),
        pool: site.policy.pool,
    });
    let settings = site.group_settings.clone();
    match &site.dest.hostname {
        Some(host) => dns_group(cx, site, host, port, settings),
        None => static_group(cx, site, port, settings),
    }
}

/// The group of `host`'s addresses, kept current by a DNS refresher (started with a new group).
fn dns_group(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    host: &str,
    port: Arc<PortIdentity>,
    settings: Arc<GroupSettings>,
) -> Arc<EndpointGroup> {
    let (policy, dns) = (&site.policy, &site.policy.dns);
    let refresh = dns
        .dns_refresh_rate
        .map_or(Duration::from_secs(30), Duration::from);
    let respect_ttl = dns.respect_dns_ttl.unwrap_or(true);
    let family = dns.lookup_family.unwrap_or(LookupFamily::IPv4Preferred);
    let key = GroupKey {
        port: port.clone(),
        source: GroupSource::Dns {
            hostname: host.to_owned(),
            refresh,
            respect_ttl,
            family,
            answers: site.dest.answers.clone(),
        },
        settings: settings.clone(),
    };
    let source = EndpointSource::Dns {
        hostname: host.to_owned(),
        port: port.number,
        refresh,
        respect_ttl,
    };
    let (group, created) = site.registry.group(key, || {
        EndpointGroup::new_dns(source, || policy.balancer.build(), settings)
    });
    if created {
        cx.outlier_groups
            .push((Arc::downgrade(&group), site.label.clone()));
        cx.refreshers.push(RefreshPlan {
            group: Arc::downgrade(&group),
            template: EndpointTemplate {
                port,
                weight: 1,
                priority: 0,
            },
            family,
            check: AnswerCheck::Declared(site.dest.answers.clone()),
            backend: site.label.clone(),
            on_demand: None,
        });
    }
    group
}

/// The group of the listed addresses; a kept group's new list is published when the config is
/// accepted.
fn static_group(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    port: Arc<PortIdentity>,
    settings: Arc<GroupSettings>,
) -> Arc<EndpointGroup> {
    let (policy, addrs) = (&site.policy, &site.dest.addrs);
    let endpoints: Vec<Arc<Endpoint>> = addrs
        .iter()
        .map(|a| {
            let t = EndpointTemplate {
                port: port.clone(),
                weight: a.weight,
                priority: a.priority,
            };
            let number = a.port.unwrap_or(port.number);
            site.registry.endpoint(&t, SocketAddr::new(a.ip, number))
        })
        .collect();
    let mut levels: Vec<u32> = addrs.iter().map(|a| a.priority).collect();
    levels.sort_unstable();
    levels.dedup();
    let key = GroupKey {
        port,
        source: GroupSource::Static {
            levels: levels.len().max(1),
        },
        settings: settings.clone(),
    };
    let (group, created) = site.registry.group(key, || {
        EndpointGroup::new_static(endpoints.clone(), || policy.balancer.build(), settings)
    });
    if created {
        cx.outlier_groups
            .push((Arc::downgrade(&group), site.label.clone()));
    } else if !group.holds(&endpoints) {
        // Published when this config is accepted: a config that is refused must leave the
        // serving one's endpoints alone.
        cx.static_lists.push((group.clone(), endpoints));
    }
    group
}

/// `protocolOptions.mcp` of a port (the port's own, else the Backend's), for protocol MCP.
fn compile_mcp(
    cx: &mut Cx,
    site: &BackendSite<'_>,
    port: &WirePort,
    field: &str,
    protocol: Protocol,
) -> Option<Arc<crate::mcp::McpPort>> {
    let (file, id, spec, settings) = (site.file(), site.id(), site.spec(), site.settings);
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
        max_requests_per_connection: match &p.max_requests_per_connection {
            None => defaults.max_requests_per_connection,
            Some(v) if v.value == 0 => None,
            Some(v) => Some(v.value),
        },
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
