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
mod handshake;

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use rustls::ProtocolVersion;

use self::certificate::{names_match, read_leaf, Expected};
use self::handshake::{probe_tls, ClientCert, Outcome, TlsProbe};
use crate::commands::validate_compiled;
use crate::config::wire::backend::{BackendSpec, BackendTls};
use crate::config::wire::enums::{LookupFamily, SanType, TlsMode};
use crate::config::wire::EGRESSD_GROUP;
use crate::config::{ConfigSet, ObjectId};
use crate::runtime::compile::Compiled;
use crate::snapshot::{BackendPort, RequestPolicy};
use crate::upstream::address::AnswerPolicy;
use crate::upstream::connect::{connect_tcp, ConnectError, Transport};
use crate::upstream::dns::{AnswerCheck, DnsResolver, RefreshPlan};
use crate::upstream::tls::TlsFailure;
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
    let (validation, compiled) = validate_compiled(paths);
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

    let (mut endpoints, mut failed, mut ok) = (0, 0, true);
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
        ok &= report.error.is_none();
        endpoints += report.endpoints.len();
        failed += report
            .endpoints
            .iter()
            .filter(|e| e.failure.is_some())
            .count();
    }
    ok &= failed == 0;
    let _ = writeln!(
        text,
        "\nprobe {}: {} port(s), {endpoints} endpoint(s), {failed} failed",
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
            let raw_port = raw
                .spec
                .destination
                .ports
                .iter()
                .find(|p| p.number.value == port.number);
            let tls = raw_port
                .and_then(|p| p.tls.as_ref())
                .or(raw.spec.tls.as_ref())
                .map(|t| &*t.value);
            let mode = match &port.transport {
                Transport::Plain => "plaintext".to_owned(),
                Transport::Tls(_) => {
                    let mode = tls.and_then(|t| t.mode.as_ref());
                    format!("TLS {}", mode.map_or(TlsMode::Simple, |m| m.value))
                }
            };
            let destination = if let Some(wildcard) = &port.wildcard {
                let mut any = false;
                for host in hosts {
                    let Ok((host_port, refresh)) = wildcard.probe_port(port, host) else {
                        continue;
                    };
                    any = true;
                    plans.push(PortPlan {
                        backend: format!("{} host {host}", backend.label).into(),
                        port: host_port,
                        mode: mode.clone(),
                        expected: expected_names(tls),
                        timeout,
                        destination: Destination::Dns {
                            hostname: host.clone(),
                            family: refresh.family,
                            check: refresh.check,
                        },
                    });
                }
                if any {
                    continue;
                }
                Destination::Wildcard(wildcard.pattern().to_owned())
            } else {
                match &port.endpoints.source {
                    EndpointSource::Dns { hostname, .. } => {
                        let refresher = refresher_of(compiled, port);
                        Destination::Dns {
                            hostname: hostname.clone(),
                            family: refresher.map_or(LookupFamily::IPv4Preferred, |r| r.family),
                            check: refresher.map_or_else(
                                || {
                                    AnswerCheck::Declared(AnswerPolicy::declared(
                                        hostname,
                                        Vec::new(),
                                    ))
                                },
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

/// Turns a TLS probe into report lines, saying for each check whether it was made and by what.
fn describe_tls(addr: SocketAddr, p: &TlsProbe, expected: &Expected) -> EndpointReport {
    let mut lines = vec![(
        "sni",
        p.sni.clone().unwrap_or_else(|| "none (IP)".to_owned()),
    )];
    let want = expected.describe(&p.server_name);
    let der = p.chain.as_ref().and_then(|chain| chain.first());
    let leaf = der.map(read_leaf);
    let skipped = matches!(expected, Expected::Nothing);
    let mut failure = None;
    match &p.outcome {
        Outcome::ConnectFailed(e) => {
            lines.push(("tcp", format!("FAILED: {e}")));
            return EndpointReport {
                addr,
                failure: Some(connect_failure(e)),
                lines,
            };
        }
        Outcome::Established { version, alpn } => {
            let (chain, name) = if skipped {
                let not = "not checked (insecureSkipVerify)".to_owned();
                (not.clone(), not)
            } else {
                ("ok".to_owned(), format!("ok (expected {want})"))
            };
            lines.push(("chain", chain));
            lines.push(("name", name));
            let alpn = alpn
                .as_ref()
                .map_or("none".into(), |a| String::from_utf8_lossy(a));
            lines.push((
                "negotiated",
                format!("{}, ALPN {alpn}", version_name(*version)),
            ));
        }
        Outcome::HandshakeFailed { failure: f, detail } => {
            failure = Some(format!("{}: {}", f.code(), f.explain()));
            let (chain, name) = match f {
                _ if skipped => {
                    let not = "not checked (insecureSkipVerify)".to_owned();
                    (not.clone(), not)
                }
                TlsFailure::UnknownCa
                | TlsFailure::Expired
                | TlsFailure::NotYetValid
                | TlsFailure::BadCertificate => {
                    let chain = format!("FAILED {}: {}", f.code(), f.explain());
                    let alone = "checked on its own, as the chain failed first";
                    let name = match (der, &leaf) {
                        (Some(der), Some(Ok(_))) => {
                            match names_match(der, expected, &p.server_name) {
                                Some(true) => format!("ok (expected {want}; {alone})"),
                                Some(false) => format!(
                                    "FAILED: the certificate does not name {want} ({alone})"
                                ),
                                None => "not checked (the chain failed first)".to_owned(),
                            }
                        }
                        _ => "not checked (the chain failed first)".to_owned(),
                    };
                    (chain, name)
                }
                // Every verifier egressd builds checks the chain before the name.
                TlsFailure::NameMismatch => {
                    let names = match &leaf {
                        Some(Ok(leaf)) if !leaf.sans.is_empty() => leaf.sans.join(", "),
                        Some(Ok(_)) => "no subject alternative name".to_owned(),
                        _ => "(certificate not read)".to_owned(),
                    };
                    (
                        "ok".to_owned(),
                        format!(
                            "FAILED {}: expected {want}, the certificate names {names}",
                            f.code()
                        ),
                    )
                }
                _ => {
                    let not = format!("not determined (the handshake failed: {})", f.code());
                    (not.clone(), not)
                }
            };
            lines.push(("chain", chain));
            lines.push(("name", name));
            lines.push(("handshake", format!("FAILED: {detail}")));
        }
    }

    let client_cert = match &p.client_cert {
        ClientCert::NotConfigured => "none configured".to_owned(),
        ClientCert::RequestedButNotConfigured => {
            "the server asked for one; none configured (tls.mode Mutual sends one)".to_owned()
        }
        ClientCert::NotRequested => {
            "configured, but the server did not ask for it (not sent)".to_owned()
        }
        ClientCert::Accepted(how) => format!("presented and accepted ({how})"),
        ClientCert::NoObjection => {
            "presented; the server raised no objection within 1s of the handshake".to_owned()
        }
        ClientCert::Rejected {
            failure: Some(f),
            why,
        } => format!("REJECTED {}: {why}", f.code()),
        ClientCert::Rejected { failure: None, why } => format!("REJECTED: {why}"),
        ClientCert::Unknown(why) => format!("outcome unknown: {why}"),
    };
    if let (ClientCert::Rejected { failure: f, .. }, None) = (&p.client_cert, &failure) {
        failure = Some(match f {
            Some(f) => format!("{}: {}", f.code(), f.explain()),
            None => "client_cert_rejected: the server refused the client certificate".to_owned(),
        });
    }
    lines.push(("client cert", client_cert));

    let source = if p.chain_from_diagnostic {
        " (read by a second handshake that accepts any certificate)"
    } else {
        ""
    };
    match leaf {
        Some(Ok(leaf)) => {
            let sans = if leaf.sans.is_empty() {
                "no subject alternative name".to_owned()
            } else {
                leaf.sans.join(", ")
            };
            lines.push(("certificate", format!("{}; {sans}{source}", leaf.subject)));
            let days = leaf.days_left(unix_now());
            let when = if days >= 0 {
                format!("{}, in {days} days", leaf.not_after_date)
            } else {
                format!("{}, EXPIRED {} days ago", leaf.not_after_date, -days)
            };
            lines.push(("expires", when));
        }
        Some(Err(e)) => lines.push(("certificate", format!("unreadable: {e}"))),
        None => lines.push(("certificate", "not received".to_owned())),
    }
    EndpointReport {
        addr,
        failure,
        lines,
    }
}

fn version_name(v: Option<ProtocolVersion>) -> String {
    match v {
        Some(ProtocolVersion::TLSv1_3) => "TLS 1.3".to_owned(),
        Some(ProtocolVersion::TLSv1_2) => "TLS 1.2".to_owned(),
        Some(other) => format!("{other:?}"),
        None => "unknown version".to_owned(),
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
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
