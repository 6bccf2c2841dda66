//! Wildcard Backends (`fqdn.hostname: "*.example.com"`): one Backend for every host under a
//! suffix, each concrete host made into a target on first use — resolved on demand (its own
//! DNS refresher, answers checked as any declared name's), with TLS sending the concrete host
//! as SNI and verifying the certificate against it, and its own endpoints (pools, outlier
//! state, circuit breaker). Hosts are kept in a bounded table (`fqdn.maxHosts`, the least
//! recently used makes room) and forgotten when idle (`fqdn.hostIdleTimeout`); their
//! endpoints together are bounded too (`fqdn.maxEndpoints`), so hostile answers of many
//! addresses cannot multiply with the hosts.
//!
//! Routing finds a wildcard Backend only when no Backend declares the exact host, and the
//! longest matching suffix wins (`*.eu.example.com` before `*.example.com`).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderValue;
use ipnet::IpNet;

use crate::balance::outlier::Detection;
use crate::balance::BalancerKind;
use crate::bounded::share::Share;
use crate::config::wire::enums::LookupFamily;
use crate::config::ObjectId;
use crate::names::hostname_matches;
use crate::snapshot::on_demand::{take_lookup, Companion, LookupsBusy, Made, OnDemand};
use crate::snapshot::{BackendPort, Target};
use crate::upstream::address::AnswerPolicy;
use crate::upstream::connect::Transport;
use crate::upstream::dns::{AnswerCheck, RefreshPlan};
use crate::upstream::health_check::{CheckCounters, CheckPlan};
use crate::upstream::pool::PoolSettings;
use crate::upstream::registry::{EndpointTemplate, PortIdentity, StateRegistry};
use crate::upstream::tls::TlsOrigination;
use crate::upstream::{EndpointGroup, EndpointSource, GroupSettings};

/// How many concrete hosts a wildcard Backend keeps, for how long unused, and how many
/// endpoints they hold together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostLimits {
    pub(crate) max_hosts: usize,
    pub(crate) idle_timeout: Duration,
    /// Endpoints of all hosts together (each host gets at least one).
    pub(crate) max_endpoints: usize,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_hosts: 256,
            idle_timeout: Duration::from_secs(300),
            // Eight addresses a host on average at the default maxHosts: more than most names
            // have.
            max_endpoints: 2048,
        }
    }
}

/// How a wildcard Backend's hosts are resolved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostDns {
    pub(crate) refresh: Duration,
    pub(crate) respect_ttl: bool,
    pub(crate) family: LookupFamily,
}

/// A concrete host a wildcard Backend cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HostRefused {
    #[error("the host matches ProxyConfig deniedHostnames `{0}`")]
    DeniedHostname(String),
    #[error("`{host}` is not under `{pattern}`")]
    NotCovered { host: String, pattern: String },
    #[error(transparent)]
    LookupsBusy(#[from] LookupsBusy),
}

/// Where a wildcard Backend's outlier detections are reported (the Backend's metrics: one
/// series for the Backend, whichever host).
pub(crate) type SharedDetectionSink = Arc<dyn Fn(Detection) + Send + Sync>;

/// Where a wildcard Backend's hosts are counted.
pub(crate) struct Reporting {
    pub(crate) detections: SharedDetectionSink,
    pub(crate) checks: CheckCounters,
}

/// The per-host side of one wildcard Backend, shared by its ports.
pub(crate) struct WildcardHosts {
    plan: WildcardPlan,
    table: Arc<OnDemand<(String, u16)>>,
    /// The endpoints the hosts hold together (`fqdn.maxEndpoints`).
    endpoints: Arc<Share>,
    registry: Arc<StateRegistry>,
    /// Where the hosts' outlier detections and health checks are counted: the Backend's
    /// series, set when the config is accepted, before any request can make a host (a host
    /// gets its checker only then).
    reporting: OnceLock<Reporting>,
    /// The epoch the hosts' checkers run under. It never moves: a host's checker is as old as
    /// the host and ends when its group is dropped, or when this is (the config compiled the
    /// Backend again; its new hosts get new checkers). A reload that keeps the Backend keeps
    /// its hosts, and their checkers go on.
    checker_epoch: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for WildcardHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WildcardHosts")
            .field("pattern", &self.plan.pattern)
            .field("hosts", &self.table.len())
            .finish_non_exhaustive()
    }
}

/// A wildcard Backend as compiled: what each of its hosts is made from.
pub(crate) struct WildcardPlan {
    /// `*.example.com`.
    pub(crate) pattern: String,
    pub(crate) id: ObjectId,
    /// `destination.fqdn.allowedAddresses`.
    pub(crate) allowed: Vec<IpNet>,
    pub(crate) denied_hostnames: Vec<String>,
    pub(crate) dns: HostDns,
    pub(crate) balancer: BalancerKind,
    pub(crate) group_settings: Arc<GroupSettings>,
    pub(crate) pool: PoolSettings,
    /// Send the concrete host as `Host` (`rewriteAuthority`, default true).
    pub(crate) rewrite_authority: bool,
    /// Port templates whose TLS takes its SNI (and verified name) from the concrete host.
    pub(crate) sni_from_host: Vec<u16>,
    /// `namespace/name`, for the health-check metric and logs.
    pub(crate) label: Arc<str>,
    /// `Host` of HTTP health checks when `http.host` sets one (else the concrete host).
    pub(crate) check_host: Option<String>,
}

impl WildcardHosts {
    pub(crate) fn new(
        plan: WildcardPlan,
        limits: HostLimits,
        registry: Arc<StateRegistry>,
    ) -> Self {
        WildcardHosts {
            table: Arc::new(OnDemand::new(
                "wildcard Backend host",
                limits.max_hosts,
                limits.idle_timeout,
                registry.clone(),
            )),
            endpoints: Arc::new(Share::new(limits.max_endpoints)),
            plan,
            registry,
            reporting: OnceLock::new(),
            checker_epoch: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Counts the outlier detections and health checks of every host made from now on as
    /// `reporting` says (the first call wins: ports share one `WildcardHosts`, and a kept
    /// Backend's series are the same).
    pub(crate) fn report(&self, reporting: Reporting) {
        let _ = self.reporting.set(reporting);
    }

    /// The checker of one host's port, when the Backend has active checks and the config
    /// serves (run by the host's task, and stopped with it).
    fn checker(&self, host: &str, port: &BackendPort) -> Option<Companion> {
        self.plan.group_settings.active.as_ref()?;
        let counters = self.reporting.get().map(|r| &r.checks)?;
        let host_header = match &self.plan.check_host {
            Some(configured) => HeaderValue::from_str(configured).ok(),
            None => host_value(host, port.number, &port.transport),
        };
        let plan = CheckPlan {
            group: Arc::downgrade(&port.endpoints),
            backend: self.plan.label.clone(),
            host: host_header,
            transport: port.transport.clone(),
            wire: port.wire,
            http2: port.http2.clone(),
            mcp: port.mcp.clone(),
        };
        Some(Box::pin(crate::upstream::health_check::run(
            plan,
            self.checker_epoch.subscribe(),
            counters.clone(),
        )))
    }

    /// The concrete hosts kept now for `port`, sorted, with their ports.
    pub(crate) fn hosts_of_port(&self, port: u16) -> Vec<(String, Arc<BackendPort>)> {
        let mut hosts: Vec<_> = self
            .table
            .entries()
            .into_iter()
            .filter(|((_, number), _)| *number == port)
            .map(|((host, _), target)| (host, target.port.clone()))
            .collect();
        hosts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        hosts
    }

    /// The target of `host` (canonical) for the port of `template` (a target of this
    /// Backend, as routing found it), made on first use.
    pub(crate) fn target(&self, template: &Target, host: &str) -> Result<Arc<Target>, HostRefused> {
        self.admit(host)?;
        let number = template.port.number;
        let made = self.table.get_or_make((host.to_owned(), number), || {
            take_lookup(&self.registry)?;
            Ok::<_, HostRefused>(self.build(template, host))
        })?;
        // The table's target may have been made through another listener: the port is the
        // host's, the policy this route's.
        Ok(Arc::new(Target {
            backend: template.backend.clone(),
            port: made.port.clone(),
            policy: template.policy.clone(),
            rewrite_authority: template.rewrite_authority,
        }))
    }

    /// `*.example.com`.
    pub(crate) fn pattern(&self) -> &str {
        &self.plan.pattern
    }

    /// Whether this Backend may serve `host` (canonical).
    pub(crate) fn admit(&self, host: &str) -> Result<(), HostRefused> {
        if !hostname_matches(&self.plan.pattern, host) {
            return Err(HostRefused::NotCovered {
                host: host.to_owned(),
                pattern: self.plan.pattern.clone(),
            });
        }
        match self
            .plan
            .denied_hostnames
            .iter()
            .find(|p| hostname_matches(p, host))
        {
            Some(p) => Err(HostRefused::DeniedHostname(p.clone())),
            None => Ok(()),
        }
    }

    /// The port of `host` on `base` as a request would make it, and how it would be resolved,
    /// for `egressd check --probe`: nothing kept, nothing started.
    pub(crate) fn probe_port(
        &self,
        base: &BackendPort,
        host: &str,
    ) -> Result<(Arc<BackendPort>, RefreshPlan), HostRefused> {
        self.admit(host)?;
        Ok(self.host_port(base, host))
    }

    /// A new target of `host` on `template`'s port, its DNS refresher and, when the config
    /// has active checks, its checker (neither started); its outlier detector ticks.
    fn build(&self, template: &Target, host: &str) -> Made {
        let (port, refresh) = self.host_port(&template.port, host);
        let group = &port.endpoints;
        // Its detector ticks like any group's (ejections expire, rates are judged), and its
        // detections count as the wildcard Backend's.
        let sink = self.reporting.get().map(|r| r.detections.clone());
        self.registry.outlier_clock().add(
            Arc::downgrade(group),
            Box::new(move |d| {
                if let Some(sink) = &sink {
                    sink(d);
                }
            }),
        );
        let companion = self.checker(host, &port);
        let target = Target {
            backend: template.backend.clone(),
            port,
            policy: template.policy.clone(),
            rewrite_authority: template.rewrite_authority,
        };
        Made {
            target,
            refresh: Some(refresh),
            companion,
        }
    }

    /// The port of `host` on `base`: its own endpoint group (resolved from `host`), TLS with
    /// `host` as SNI, `Host` rewritten to it; and the group's DNS refresher (not started).
    fn host_port(&self, base: &BackendPort, host: &str) -> (Arc<BackendPort>, RefreshPlan) {
        let number = base.number;
        // Endpoints are identified by the concrete host: a pooled TLS connection made for one
        // host never carries another host's requests.
        let id = ObjectId {
            kind: self.plan.id.kind.clone(),
            namespace: self.plan.id.namespace.clone(),
            name: format!("{} {host}", self.plan.id.name).into(),
        };
        let endpoint_template = EndpointTemplate {
            port: Arc::new(PortIdentity {
                backend: id,
                number,
                transport: 0,
                pool: self.plan.pool,
            }),
            weight: 1,
            priority: 0,
        };
        let source = EndpointSource::Dns {
            hostname: host.to_owned(),
            port: number,
            refresh: self.plan.dns.refresh,
            respect_ttl: self.plan.dns.respect_ttl,
        };
        let balancer = self.plan.balancer.clone();
        let group = Arc::new(EndpointGroup::new_dns(
            source,
            || balancer.build(),
            self.plan.group_settings.clone(),
        ));
        let refresh = RefreshPlan {
            group: Arc::downgrade(&group),
            template: endpoint_template,
            family: self.plan.dns.family,
            check: AnswerCheck::Declared(AnswerPolicy::declared(host, self.plan.allowed.clone())),
            backend: self.plan.label.clone(),
            on_demand: Some(self.endpoints.part()),
        };
        let transport = match &base.transport {
            Transport::Tls(tls) if self.plan.sni_from_host.contains(&number) => {
                Transport::Tls(Arc::new(with_sni(tls, host)))
            }
            other => other.clone(),
        };
        let authority = self
            .plan
            .rewrite_authority
            .then(|| host_value(host, number, &base.transport))
            .flatten();
        let port = Arc::new(BackendPort {
            number,
            protocol: base.protocol,
            passthrough: base.passthrough,
            interception: base.interception,
            transport,
            wire: base.wire,
            http2: base.http2.clone(),
            mcp: base.mcp.clone(),
            tcp_keepalive: base.tcp_keepalive,
            endpoints: group,
            authority,
            wildcard: None,
        });
        (port, refresh)
    }
}

/// `target` itself, or, when it is a wildcard Backend's template, the target of `host`.
pub(crate) fn concrete<'t>(
    target: &'t Arc<Target>,
    host: &str,
) -> Result<Cow<'t, Arc<Target>>, HostRefused> {
    match &target.port.wildcard {
        None => Ok(Cow::Borrowed(target)),
        Some(hosts) => hosts.target(target, host).map(Cow::Owned),
    }
}

/// `tls` sending `host` as SNI (and so verifying the certificate against it, unless the
/// Backend names what to verify): the same client configs, another server name.
fn with_sni(tls: &TlsOrigination, host: &str) -> TlsOrigination {
    TlsOrigination {
        config: tls.config.clone(),
        http1_config: tls.http1_config.clone(),
        sni: rustls::pki_types::ServerName::try_from(host.to_owned()).ok(),
    }
}

/// `Host` for requests to `host`: with the port unless it is the scheme's default.
fn host_value(host: &str, port: u16, transport: &Transport) -> Option<HeaderValue> {
    let default = match transport {
        Transport::Plain => 80,
        Transport::Tls(_) => 443,
    };
    let value = if port == default {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    };
    HeaderValue::from_str(&value).ok()
}
