//! Resolving FQDN destinations and keeping their endpoint lists current.
//!
//! Each FQDN Backend port has one refresher task. It re-resolves when the answer's TTL runs out
//! (clamped to 1 s – 1 h, so a zero TTL cannot spin) or every `dnsRefreshRate` when TTLs are not
//! respected. A failed resolution keeps the last good addresses serving and retries
//! sooner. Every address is an endpoint whose identity is the address, so endpoints (and their
//! pools) survive re-resolution.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfigGroup, ResolveHosts, ResolverConfig,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;

use super::address::{canonical_ip, AddressPolicy, AnswerPolicy};
use super::group::{EndpointGroup, EndpointSource};
use crate::balance::EndpointList;
use crate::bounded::share::Part;
use crate::config::wire::enums::LookupFamily;
use crate::telemetry::metrics::{ActionLabel, BackendReasonLabel};
use crate::upstream::registry::{EndpointTemplate, StateRegistry};

/// A DNS resolver shared by every refresher.
#[derive(Clone)]
pub struct DnsResolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DnsResolver")
    }
}

/// A resolution failure.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("cannot read the system resolver configuration: {0}")]
    SystemConfig(String),
    #[error("resolving {host}: {message}")]
    Lookup { host: String, message: String },
    #[error("resolving {host}: no address of the wanted family")]
    NoAddress { host: String },
    /// Every answer was an address the destination may not use (see [`AnswerCheck`]).
    #[error("{host} resolved only to refused addresses: {refused}; {opened_by} opens a range")]
    AddressDenied {
        host: String,
        refused: String,
        /// The field that would let the destination use them.
        opened_by: &'static str,
    },
}

/// Which DNS answers a destination may use.
#[derive(Clone, Debug)]
pub(crate) enum AnswerCheck {
    /// A declared FQDN Backend: see [`AnswerPolicy`].
    Declared(AnswerPolicy),
    /// An undeclared destination (`AllowAny`, `AuditOnly`): `undeclaredDestinations`.
    Undeclared(Arc<AddressPolicy>),
}

impl AnswerCheck {
    /// The field that opens refused ranges.
    fn opened_by(&self) -> &'static str {
        match self {
            AnswerCheck::Declared(_) => "destination.fqdn.allowedAddresses",
            AnswerCheck::Undeclared(_) => "undeclaredDestinations.allowedAddresses",
        }
    }

    /// Why the answer `ip` is refused, or `None` when it may be used.
    pub(crate) fn refuses(&self, ip: IpAddr) -> Option<&'static str> {
        match self {
            AnswerCheck::Declared(policy) => policy.refuses(ip),
            AnswerCheck::Undeclared(policy) => policy.refuses(ip).then_some("not a public address"),
        }
    }
}

/// The usable answers of one lookup, and those refused.
#[derive(Debug)]
pub(crate) struct Answers {
    /// Usable addresses of the wanted family, canonical, sorted, without duplicates.
    pub(crate) ips: Vec<IpAddr>,
    /// Refused addresses (canonical) and why, in answer order.
    pub(crate) refused: Vec<(IpAddr, &'static str)>,
    /// When the answer expires.
    pub(crate) valid_until: Instant,
}

/// `127.0.0.1 (loopback), 169.254.169.254 (link-local)`.
pub(crate) fn describe_refused(refused: &[(IpAddr, &'static str)]) -> String {
    let mut out = String::new();
    for (i, (ip, why)) in refused.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("{ip} ({why})"));
    }
    out
}

impl DnsResolver {
    /// Uses the given name servers, or the system configuration (`/etc/resolv.conf`) when empty.
    /// The hosts file is always consulted first, as the C library does.
    pub fn new(nameservers: &[SocketAddr]) -> Result<Self, DnsError> {
        let mut builder = if nameservers.is_empty() {
            TokioResolver::builder_tokio().map_err(|e| DnsError::SystemConfig(e.to_string()))?
        } else {
            let mut group = NameServerConfigGroup::new();
            for addr in nameservers {
                group.merge(NameServerConfigGroup::from_ips_clear(
                    &[addr.ip()],
                    addr.port(),
                    true,
                ));
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, vec![], group),
                TokioConnectionProvider::default(),
            )
        };
        let opts = builder.options_mut();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.use_hosts_file = ResolveHosts::Always;
        opts.timeout = Duration::from_secs(3);
        opts.attempts = 2;
        Ok(DnsResolver {
            inner: builder.build(),
        })
    }

    /// Resolves `host` to the addresses of the wanted family that `check` lets it use, and
    /// when the answer expires. Answers are judged before the family is chosen, so a refused
    /// IPv4 answer does not hide a usable IPv6 one under `IPv4Preferred`.
    pub(crate) async fn resolve(
        &self,
        host: &str,
        family: LookupFamily,
        check: &AnswerCheck,
    ) -> Result<Answers, DnsError> {
        let lookup = self
            .inner
            .lookup_ip(host)
            .await
            .map_err(|e| DnsError::Lookup {
                host: host.to_owned(),
                message: e.to_string(),
            })?;
        let valid_until = lookup.valid_until();
        let mut refused = Vec::new();
        // Canonical first: an AAAA answer `::ffff:169.254.169.254` is the IPv4 address.
        let all: Vec<IpAddr> = lookup
            .iter()
            .map(canonical_ip)
            .filter(|ip| match check.refuses(*ip) {
                Some(why) => {
                    refused.push((*ip, why));
                    false
                }
                None => true,
            })
            .collect();
        let mut ips = choose_family(all, family);
        ips.sort();
        ips.dedup();
        if ips.is_empty() {
            let host = host.to_owned();
            return Err(if refused.is_empty() {
                DnsError::NoAddress { host }
            } else {
                DnsError::AddressDenied {
                    host,
                    refused: describe_refused(&refused),
                    opened_by: check.opened_by(),
                }
            });
        }
        Ok(Answers {
            ips,
            refused,
            valid_until,
        })
    }
}

/// The addresses of `all` that `family` asks for.
fn choose_family(all: Vec<IpAddr>, family: LookupFamily) -> Vec<IpAddr> {
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = all.iter().partition(|ip| ip.is_ipv4());
    match family {
        LookupFamily::IPv4Only => v4,
        LookupFamily::IPv6Only => v6,
        LookupFamily::IPv4Preferred if v4.is_empty() => v6,
        LookupFamily::IPv4Preferred => v4,
        LookupFamily::IPv6Preferred if v6.is_empty() => v4,
        LookupFamily::IPv6Preferred => v6,
        LookupFamily::All => all,
    }
}

/// Limits on DNS answers and on the lookups of names clients choose
/// (`ProxyConfig.spec.dns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DnsLimits {
    /// Addresses of one answer used at most (the lowest, so the same ones at every refresh).
    pub(crate) max_addresses_per_answer: usize,
    /// Lookups per second (bursts as many) of names clients choose: the hosts of wildcard
    /// Backends and undeclared destinations, first lookups and refreshes.
    pub(crate) max_lookups_per_second: u32,
}

impl Default for DnsLimits {
    fn default() -> Self {
        DnsLimits {
            // Envoy's and most resolvers' answers fit: a DNS answer over UDP holds about 30 A
            // records, and more than a few dozen addresses behind one name are rare.
            max_addresses_per_answer: 64,
            max_lookups_per_second: 100,
        }
    }
}

/// What a refresher needs besides its group.
pub(crate) struct RefreshPlan {
    pub(crate) group: Weak<EndpointGroup>,
    pub(crate) template: EndpointTemplate,
    pub(crate) family: LookupFamily,
    /// Which answers the destination may use.
    pub(crate) check: AnswerCheck,
    /// The Backend's label (metrics, logs); `undeclared` for undeclared destinations.
    pub(crate) backend: Arc<str>,
    /// A name a client chose, made on demand (a wildcard Backend's host, an undeclared
    /// destination): the part its addresses hold of the endpoints its table may hold
    /// together; and its lookups after the first wait for the lookup rate (the first was
    /// taken when the name was made).
    pub(crate) on_demand: Option<Part>,
}

/// How a refresher's answers went, between lookups.
#[derive(Default)]
struct Refreshing {
    failures: u32,
    /// Refused answers are logged when they change, not at every refresh or retry.
    last_refused: Option<String>,
    /// An answer cut to a limit is logged when the cut changes: (addresses, kept).
    last_cut: Option<(usize, usize)>,
}

/// Counts a running refresher in `egressd_dns_refreshers` while it lives (however it ends:
/// its group dropped, or its task stopped with its name forgotten).
struct Running(prometheus_client::metrics::gauge::Gauge);

impl Running {
    fn new(gauge: &prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Running(gauge.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Keeps one DNS group current until the group is dropped (no snapshot uses it any more).
pub(crate) async fn refresh_loop(mut plan: RefreshPlan, registry: Arc<StateRegistry>) {
    let _running = Running::new(&registry.dns_stats().refreshers);
    let mut state = Refreshing::default();
    let mut first = true;
    loop {
        if plan.on_demand.is_some() && !std::mem::take(&mut first) {
            wait_for_lookup(&registry).await;
        }
        let Some(group) = plan.group.upgrade() else {
            return;
        };
        let EndpointSource::Dns {
            hostname,
            port,
            refresh,
            respect_ttl,
        } = &group.source
        else {
            return;
        };
        let (hostname, port, refresh, respect_ttl) =
            (hostname.clone(), *port, *refresh, *respect_ttl);
        let resolver = registry.resolver();
        let resolved = resolver.resolve(&hostname, plan.family, &plan.check).await;
        let wait = match resolved {
            Ok(answers) => {
                state.failures = 0;
                let valid_until = answers.valid_until;
                publish(
                    &mut plan, &registry, &group, &hostname, port, answers, &mut state,
                );
                let ttl = valid_until.saturating_duration_since(Instant::now());
                if respect_ttl {
                    // At least 1s so a zero TTL cannot turn into a query loop.
                    ttl.clamp(Duration::from_secs(1), Duration::from_secs(3600))
                } else {
                    refresh
                }
            }
            Err(e) => {
                state.failures = state.failures.saturating_add(1);
                keep_last_good(&plan, &group, &hostname, e, &mut state);
                // Retry sooner than the refresh rate, backing off: 1s, 2s, 4s … up to refresh.
                Duration::from_secs(1u64 << state.failures.min(6)).min(refresh)
            }
        };
        drop(group);
        tokio::time::sleep(wait).await;
    }
}

/// Waits for a lookup of a name a client chose to fit `dns.maxLookupsPerSecond`.
async fn wait_for_lookup(registry: &StateRegistry) {
    let owed = registry.lookups().reserve();
    if !owed.is_zero() {
        registry
            .dns_stats()
            .rate_limited
            .get_or_create(&ActionLabel { action: "delayed" })
            .inc();
        tokio::time::sleep(owed).await;
    }
}

/// Publishes an answer's addresses as the group's endpoints: at most `maxAddressesPerAnswer`
/// of them, and for a name a client chose as many as its table's endpoint share leaves room
/// for.
fn publish(
    plan: &mut RefreshPlan,
    registry: &StateRegistry,
    group: &EndpointGroup,
    hostname: &str,
    port: u16,
    answers: Answers,
    state: &mut Refreshing,
) {
    let refused = (!answers.refused.is_empty()).then(|| describe_refused(&answers.refused));
    if refused != state.last_refused {
        if let Some(refused) = &refused {
            log_refused(plan, hostname, refused);
        }
        state.last_refused = refused;
    }
    let mut ips = answers.ips;
    let answered = ips.len();
    let max = registry.max_addresses();
    let over_answer = ips.len() > max;
    ips.truncate(max);
    let mut over_share = false;
    if let Some(part) = &mut plan.on_demand {
        let held = part.resize(ips.len());
        over_share = held < ips.len();
        ips.truncate(held);
    }
    for (cut, limit) in [
        (over_answer, "max_addresses_per_answer"),
        (over_share, "max_endpoints"),
    ] {
        if cut {
            let label = BackendReasonLabel {
                backend: plan.backend.to_string(),
                reason: limit,
            };
            registry.dns_stats().truncated.get_or_create(&label).inc();
        }
    }
    let cut = (over_answer || over_share).then_some((answered, ips.len()));
    if cut.is_some() && cut != state.last_cut {
        log_cut(plan, hostname, answered, ips.len());
    }
    state.last_cut = cut;
    let endpoints = ips
        .into_iter()
        .map(|ip| registry.endpoint(&plan.template, SocketAddr::new(ip, port)))
        .collect();
    group.publish(EndpointList::resolved(endpoints));
}

/// An answer was cut (logged when the cut changes, counted each time).
fn log_cut(plan: &RefreshPlan, host: &str, answered: usize, kept: usize) {
    let backend = &plan.backend;
    // Limited per call site: the names of wildcard hosts and undeclared destinations are the
    // clients' choice.
    crate::telemetry::log_limit::limited!(warn, %backend, %host, answered, kept, "DNS answer cut: only the lowest addresses are endpoints (ProxyConfig dns.maxAddressesPerAnswer; the maxEndpoints of a wildcard Backend or of undeclared destinations)");
}

/// A lookup failed: the last good addresses keep serving, with the error shown.
fn keep_last_good(
    plan: &RefreshPlan,
    group: &EndpointGroup,
    hostname: &str,
    e: DnsError,
    state: &mut Refreshing,
) {
    let undeclared = matches!(plan.check, AnswerCheck::Undeclared(_));
    let previous = group.list();
    let denied = matches!(e, DnsError::AddressDenied { .. });
    if let DnsError::AddressDenied { refused, .. } = &e {
        if state.last_refused.as_ref() != Some(refused) {
            let kept = previous.endpoints.len();
            log_denied(plan, hostname, refused, kept);
            state.last_refused = Some(refused.clone());
        }
    } else if undeclared {
        // An undeclared destination: the client chose the name, and each request for it
        // gets 503 naming this error; a warning per name would let clients fill the log.
        tracing::debug!(host = %hostname, error = %e, kept = previous.endpoints.len(), "DNS resolution of an undeclared destination failed");
    } else {
        // Limited per call site: a wildcard Backend's names are the clients' choice.
        crate::telemetry::log_limit::limited!(warn, host = %hostname, error = %e, kept = previous.endpoints.len(), "DNS resolution failed; keeping the last good addresses");
    }
    let mut kept = EndpointList::resolved(previous.endpoints.clone());
    kept.last_error = Some(e.to_string());
    kept.address_denied = denied;
    group.publish(kept);
}

/// Some answers were refused, the others serve.
fn log_refused(plan: &RefreshPlan, host: &str, refused: &str) {
    let backend = &plan.template.port.backend;
    if matches!(plan.check, AnswerCheck::Undeclared(_)) {
        tracing::debug!(%host, %refused, "DNS answers of an undeclared destination refused");
    } else {
        // Limited per call site: a wildcard Backend's names are the clients' choice.
        crate::telemetry::log_limit::limited!(warn, %backend, %host, %refused, "DNS answers refused (destination.fqdn.allowedAddresses opens a range); the other answers serve");
    }
}

/// Every answer was refused.
fn log_denied(plan: &RefreshPlan, host: &str, refused: &str, kept: usize) {
    let backend = &plan.template.port.backend;
    if matches!(plan.check, AnswerCheck::Undeclared(_)) {
        tracing::debug!(%host, %refused, "every DNS answer of an undeclared destination refused");
    } else {
        crate::telemetry::log_limit::limited!(warn, %backend, %host, %refused, kept, "every DNS answer refused (destination.fqdn.allowedAddresses opens a range); keeping the last good addresses");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refreshes of names clients chose over the lookup rate wait their turn, each counted.
    #[tokio::test(start_paused = true)]
    async fn refreshes_over_the_lookup_rate_wait_their_turn() {
        let resolver = DnsResolver::new(&["127.0.0.1:53".parse().unwrap()]).unwrap();
        let registry = StateRegistry::new(resolver);
        registry.set_dns_limits(&DnsLimits {
            max_lookups_per_second: 2,
            ..DnsLimits::default()
        });
        let started = tokio::time::Instant::now();
        for _ in 0..6 {
            wait_for_lookup(&registry).await;
        }
        // Two from the bucket, then one every half second.
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        let delayed = ActionLabel { action: "delayed" };
        let stats = registry.dns_stats();
        assert_eq!(stats.rate_limited.get_or_create(&delayed).get(), 4);
    }
}
