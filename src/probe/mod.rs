//! `egressd check --probe`: validate a config as `egressd validate` does, then connect to every
//! endpoint of every Backend port the way egressd would and report what happened.
//!
//! For a port that originates TLS, each endpoint gets a real handshake with the port's own
//! client config (see [`handshake`]); the report shows the SNI sent, whether the chain and the
//! name verified, the TLS version and ALPN negotiated, what became of the client certificate
//! (Mutual), and when the server certificate expires. A plaintext port gets a TCP connect only.
//!
//! Endpoints are found as egressd finds them: an FQDN destination is resolved by egressd's
//! resolver (`ProxyConfig.spec.dns.nameservers`, the Backend's lookup family), IP endpoints are
//! taken as listed. A wildcard Backend (`*.example.com`) has no endpoints until a request names
//! a host: each `--probe-host` it covers is probed as that request would go (its own SNI and
//! verified name, its DNS answers checked). The connect and the handshake each get the Backend's own connect timeout
//! (inline `trafficPolicy`, else a BackendTrafficPolicy targeting the Backend, else 10 s);
//! route and Gateway policies can change it for routed traffic but have no say here. Endpoints
//! are probed concurrently and reported in config order.

mod certificate;
mod describe;
mod handshake;

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use self::certificate::Expected;
use self::describe::describe_tls;
use self::handshake::probe_tls;
use crate::commands::{validate_compiled, ValidateOptions};
use crate::config::wire::backend::{BackendSpec, BackendTls};
use crate::config::wire::enums::{LookupFamily, SanType, TlsMode};
use crate::config::wire::EGRESSD_GROUP;
use crate::config::{ConfigSet, ObjectId};
use crate::runtime::compile::Compiled;
use crate::snapshot::wildcard::WildcardHosts;
use crate::snapshot::{BackendPort, RequestPolicy};
use crate::upstream::address::AnswerPolicy;
use crate::upstream::connect::{connect_tcp, ConnectError, Transport};
use crate::upstream::dns::{AnswerCheck, DnsResolver, RefreshPlan};
use crate::upstream::EndpointSource;

/// The outcome of `egressd check --probe`.
pub struct ProbeReport {
    /// The config is valid and every endpoint answered as egressd needs it to.
    pub ok: bool,
    /// The validation report followed by one block per Backend port.
    pub text: String,
}

/// Validates `paths`, then probes every endpoint of every Backend port; a wildcard Backend's
/// port for each of `hosts` it covers.
pub async fn probe(paths: &[PathBuf], hosts: &[String]) -> ProbeReport {
    let (validation, compiled) = validate_compiled(paths, ValidateOptions::default());
    let mut text = validation.report;
    let compiled = match compiled {
        Some(compiled) if validation.ok => compiled,
        _ => {
            text.push_str("\nnot probing: the config is invalid\n");
            return ProbeReport { ok: false, text };
        }
    };
    let nameservers = &compiled.snapshot.settings.nameservers;
    let resolver = match DnsResolver::new(nameservers) {
        Ok(resolver) => resolver,
        Err(e) => {
            let _ = writeln!(text, "\nprobe FAILED: cannot set up DNS: {e}");
            return ProbeReport { ok: false, text };
        }
    };
    let dns = if nameservers.is_empty() {
        "the system resolver".to_owned()
    } else {
        let list: Vec<String> = nameservers.iter().map(ToString::to_string).collect();
        format!("nameservers {}", list.join(", "))
    };

    let hosts: Vec<String> = hosts
        .iter()
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .collect();
    let plans = plan_ports(&compiled, &hosts);
    let reports = join_all(plans.iter().map(|p| probe_port(p, &resolver, &dns))).await;

    // A port fails as a whole (its name did not resolve) or by its endpoints.
    let (mut endpoints, mut failed, mut failed_ports, mut ok) = (0, 0, 0, true);
    for host in unprobed_hosts(&compiled, &hosts) {
        let _ = writeln!(
            text,
            "
--probe-host {host}: FAILED: no wildcard Backend serves it (none covers it, or deniedHostnames refuses it)"
        );
        ok = false;
    }
    for (plan, report) in plans.iter().zip(&reports) {
        text.push('\n');
        render_port(&mut text, plan, report);
        endpoints += report.endpoints.len();
        let failures = report
            .endpoints
            .iter()
            .filter(|e| e.failure.is_some())
            .count();
        failed += failures;
        if report.error.is_some() || failures > 0 {
            failed_ports += 1;
        }
    }
    ok &= failed_ports == 0;
    let _ = writeln!(
        text,
        "\nprobe {}: {} port(s), {failed_ports} failed; {endpoints} endpoint(s), {failed} failed",
        if ok { "ok" } else { "FAILED" },
        plans.len(),
    );
    ProbeReport { ok, text }
}

/// One Backend port to probe.
struct PortPlan {
    backend: Arc<str>,
    port: Arc<BackendPort>,
    /// `TLS Simple`, `TLS Mutual` or `plaintext`.
    mode: String,
    expected: Expected,
    timeout: Duration,
    destination: Destination,
}

enum Destination {
    Dns {
        hostname: String,
        family: LookupFamily,
        check: AnswerCheck,
    },
    Listed(Vec<SocketAddr>),
    /// A wildcard Backend's port no `--probe-host` names: its hosts exist on demand only.
    Wildcard(String),
}

/// The ports of every compiled Backend, in config order. What the runtime types do not keep
/// (the TLS mode's name, what names are verified, the Backend's connect timeout) is read from
/// the wire config, which compiled without errors.
fn plan_ports(compiled: &Compiled, hosts: &[String]) -> Vec<PortPlan> {
    let snapshot = &compiled.snapshot;
    let mut plans = Vec::new();
    for backend in &snapshot.backends {
        let Some(raw) = snapshot.config.backends.iter().find(|o| o.id == backend.id) else {
            continue;
        };
        let timeout = connect_timeout(&snapshot.config, &backend.id, &raw.spec);
        for port in &backend.ports {
            let tls = written_tls(&raw.spec, port);
            let mode = mode_name(port, tls);
            let destination = match &port.wildcard {
                Some(wildcard) => {
                    let probed: Vec<PortPlan> = hosts
                        .iter()
                        .filter_map(|host| host_port(&backend.label, port, wildcard, host))
                        .map(|(backend, port, destination)| PortPlan {
                            backend,
                            port,
                            mode: mode.clone(),
                            expected: expected_names(tls),
                            timeout,
                            destination,
                        })
                        .collect();
                    if !probed.is_empty() {
                        plans.extend(probed);
                        continue;
                    }
                    Destination::Wildcard(wildcard.pattern().to_owned())
                }
                None => endpoint_destination(compiled, port),
            };
            plans.push(PortPlan {
                backend: backend.label.clone(),
                port: port.clone(),
                mode,
                expected: expected_names(tls),
                timeout,
                destination,
            });
        }
    }
    plans
}

/// The `tls` written for `port`: the port's own, else the Backend's.
fn written_tls<'a>(spec: &'a BackendSpec, port: &BackendPort) -> Option<&'a BackendTls> {
    let raw_port = spec
        .destination
        .ports
        .iter()
        .find(|p| p.number.value == port.number);
    raw_port
        .and_then(|p| p.tls.as_ref())
        .or(spec.tls.as_ref())
        .map(|t| &*t.value)
}

/// `plaintext`, or `TLS` and the mode written (Simple when none is).
fn mode_name(port: &BackendPort, tls: Option<&BackendTls>) -> String {
    match &port.transport {
        Transport::Plain => "plaintext".to_owned(),
        Transport::Tls(_) => {
            let mode = tls.and_then(|t| t.mode.as_ref());
            format!("TLS {}", mode.map_or(TlsMode::Simple, |m| m.value))
        }
    }
}

/// The port of `host` on a wildcard Backend's `port`, as a request to it would make it (none
/// when the Backend does not cover `host`): its name in the report, the port, and how it is
/// resolved.
fn host_port(
    label: &str,
    port: &BackendPort,
    wildcard: &WildcardHosts,
    host: &str,
) -> Option<(Arc<str>, Arc<BackendPort>, Destination)> {
    let (host_port, refresh) = wildcard.probe_port(port, host).ok()?;
    let destination = Destination::Dns {
        hostname: host.to_owned(),
        family: refresh.family,
        check: refresh.check,
    };
    Some((
        format!("{label} host {host}").into(),
        host_port,
        destination,
    ))
}

/// Where a (non-wildcard) port's endpoints come from: its DNS name, resolved as its refresher
/// would, or its listed addresses.
fn endpoint_destination(compiled: &Compiled, port: &BackendPort) -> Destination {
    match &port.endpoints.source {
        EndpointSource::Dns { hostname, .. } => {
            let refresher = refresher_of(compiled, port);
            Destination::Dns {
                hostname: hostname.clone(),
                family: refresher.map_or(LookupFamily::IPv4Preferred, |r| r.family),
                check: refresher.map_or_else(
                    || AnswerCheck::Declared(AnswerPolicy::declared(hostname, Vec::new())),
                    |r| r.check.clone(),
                ),
            }
        }
        EndpointSource::Static => Destination::Listed(
            port.endpoints
                .list()
                .endpoints
                .iter()
                .map(|e| e.addr)
                .collect(),
        ),
    }
}

/// The `--probe-host` names no wildcard Backend of the config serves.
fn unprobed_hosts<'h>(compiled: &Compiled, hosts: &'h [String]) -> Vec<&'h String> {
    let wildcards: Vec<_> = compiled
        .snapshot
        .backends
        .iter()
        .flat_map(|b| b.ports.iter().filter_map(|p| p.wildcard.as_ref()))
        .collect();
    hosts
        .iter()
        .filter(|h| !wildcards.iter().any(|w| w.admit(h).is_ok()))
        .collect()
}

/// The DNS refresher of this port's group: the lookup family and answer check it uses.
fn refresher_of<'c>(compiled: &'c Compiled, port: &BackendPort) -> Option<&'c RefreshPlan> {
    compiled.refreshers.iter().find(|r| {
        r.group
            .upgrade()
            .is_some_and(|g| Arc::ptr_eq(&g, &port.endpoints))
    })
}

/// The Backend's connect timeout: the `timeout` section of its inline policy, else of the first
/// (by namespace/name) BackendTrafficPolicy targeting it, as the compiler ranks them.
fn connect_timeout(set: &ConfigSet, id: &ObjectId, spec: &BackendSpec) -> Duration {
    let mut policies: Vec<_> = set
        .policies
        .iter()
        .filter(|p| p.id.namespace == id.namespace)
        .filter(|p| {
            p.spec.target_refs.iter().any(|t| {
                t.group == EGRESSD_GROUP
                    && t.kind == "Backend"
                    && *t.name == *id.name
                    && t.section_name.is_none()
            })
        })
        .collect();
    policies.sort_by(|a, b| a.id.cmp(&b.id));
    let section = spec
        .traffic_policy
        .as_ref()
        .and_then(|p| p.timeout.as_ref())
        .or_else(|| policies.iter().find_map(|p| p.spec.timeout.as_ref()));
    section
        .and_then(|t| t.tcp.as_ref())
        .and_then(|tcp| tcp.connect_timeout)
        .map_or(RequestPolicy::default().connect_timeout, Duration::from)
}

/// What the port's certificate must name, by the same precedence as the compiler:
/// `insecureSkipVerify`, else `subjectAltNames`, else `validation.hostname`, else the server name.
fn expected_names(tls: Option<&BackendTls>) -> Expected {
    let Some(v) = tls.and_then(|t| t.validation.as_ref()) else {
        return Expected::ServerName;
    };
    if v.insecure_skip_verify == Some(true) {
        return Expected::Nothing;
    }
    let mut names = Vec::new();
    let mut uris = Vec::new();
    for san in &v.subject_alt_names {
        match (san.kind, &san.hostname, &san.uri) {
            (SanType::Hostname, Some(h), _) => names.push(h.to_ascii_lowercase()),
            (SanType::Uri, _, Some(u)) => uris.push(u.clone()),
            _ => {}
        }
    }
    if names.is_empty() && uris.is_empty() {
        match &v.hostname {
            Some(h) => names.push(h.to_ascii_lowercase()),
            None => return Expected::ServerName,
        }
    }
    Expected::Identities { names, uris }
}

/// What probing one port found.
struct PortReport {
    /// How the endpoints were found.
    destination: String,
    /// Why there are no endpoints to probe (DNS failed).
    error: Option<String>,
    endpoints: Vec<EndpointReport>,
}

struct EndpointReport {
    addr: SocketAddr,
    /// `None`: the endpoint is usable.
    failure: Option<String>,
    lines: Vec<(&'static str, String)>,
}

async fn probe_port(plan: &PortPlan, resolver: &DnsResolver, dns: &str) -> PortReport {
    let (addrs, destination) = match &plan.destination {
        Destination::Listed(addrs) => (addrs.clone(), "IP endpoints as listed".to_owned()),
        Destination::Wildcard(pattern) => {
            return PortReport {
                destination: format!(
                    "wildcard {pattern}: hosts are resolved when requests name them; probe one with --probe-host HOST"
                ),
                error: None,
                endpoints: Vec::new(),
            }
        }
        Destination::Dns {
            hostname,
            family,
            check,
        } => {
            let found = format!("{hostname} resolved by {dns} ({family})");
            match resolver.resolve(hostname, *family, check).await {
                Ok(answers) => {
                    let number = plan.port.number;
                    let addrs = answers
                        .ips
                        .into_iter()
                        .map(|ip| SocketAddr::new(ip, number));
                    (addrs.collect(), found)
                }
                Err(e) => {
                    return PortReport {
                        destination: found,
                        error: Some(e.to_string()),
                        endpoints: Vec::new(),
                    }
                }
            }
        }
    };
    let endpoints = join_all(addrs.into_iter().map(|addr| probe_endpoint(plan, addr))).await;
    PortReport {
        destination,
        error: None,
        endpoints,
    }
}

async fn probe_endpoint(plan: &PortPlan, addr: SocketAddr) -> EndpointReport {
    match &plan.port.transport {
        Transport::Plain => match connect_tcp(addr, plan.timeout).await {
            Ok(_) => EndpointReport {
                addr,
                failure: None,
                lines: vec![(
                    "tcp",
                    "connected (plaintext port: no TLS to check)".to_owned(),
                )],
            },
            Err(e) => EndpointReport {
                addr,
                failure: Some(connect_failure(&e)),
                lines: vec![("tcp", format!("FAILED: {e}"))],
            },
        },
        Transport::Tls(tls) => {
            let probe = probe_tls(addr, tls, plan.timeout).await;
            describe_tls(addr, &probe, &plan.expected)
        }
    }
}

fn connect_failure(e: &ConnectError) -> String {
    match e {
        ConnectError::Timeout { .. } => "connect_timeout".to_owned(),
        _ => "connect_failed".to_owned(),
    }
}

fn render_port(text: &mut String, plan: &PortPlan, report: &PortReport) {
    let _ = writeln!(
        text,
        "{} port {} ({}, {}, connect timeout {:?})",
        plan.backend, plan.port.number, plan.port.protocol, plan.mode, plan.timeout
    );
    let _ = writeln!(text, "  {}", report.destination);
    if let Some(e) = &report.error {
        let _ = writeln!(text, "  FAILED: {e}");
        return;
    }
    for endpoint in &report.endpoints {
        match &endpoint.failure {
            None => {
                let _ = writeln!(text, "  {}: ok", endpoint.addr);
            }
            Some(why) => {
                let _ = writeln!(text, "  {}: FAILED {why}", endpoint.addr);
            }
        }
        for (label, value) in &endpoint.lines {
            let _ = writeln!(text, "    {:<12} {value}", format!("{label}:"));
        }
    }
}
