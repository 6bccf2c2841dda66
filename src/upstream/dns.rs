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

use super::address::{canonical_ip, is_never_reachable, AddressPolicy};
use super::group::{EndpointGroup, EndpointSource};
use crate::balance::EndpointList;
use crate::config::wire::enums::LookupFamily;
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
    #[error(
        "resolving {host}: no usable address (all answers were denied or of the wrong family)"
    )]
    NoAddress { host: String },
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

    /// Resolves `host` to addresses of the wanted family, and when the answer expires.
    pub async fn resolve(
        &self,
        host: &str,
        family: LookupFamily,
    ) -> Result<(Vec<IpAddr>, Instant), DnsError> {
        let lookup = self
            .inner
            .lookup_ip(host)
            .await
            .map_err(|e| DnsError::Lookup {
                host: host.to_owned(),
                message: e.to_string(),
            })?;
        let valid_until = lookup.valid_until();
        // Canonical first: an AAAA answer `::ffff:169.254.169.254` is the IPv4 address.
        let all: Vec<IpAddr> = lookup
            .iter()
            .map(canonical_ip)
            .filter(|ip| !is_never_reachable(*ip))
            .collect();
        let v4: Vec<IpAddr> = all.iter().copied().filter(IpAddr::is_ipv4).collect();
        let v6: Vec<IpAddr> = all.iter().copied().filter(IpAddr::is_ipv6).collect();
        let mut chosen = match family {
            LookupFamily::IPv4Only => v4,
            LookupFamily::IPv6Only => v6,
            LookupFamily::IPv4Preferred => {
                if v4.is_empty() {
                    v6
                } else {
                    v4
                }
            }
            LookupFamily::IPv6Preferred => {
                if v6.is_empty() {
                    v4
                } else {
                    v6
                }
            }
            LookupFamily::All => all,
        };
        chosen.sort();
        chosen.dedup();
        if chosen.is_empty() {
            return Err(DnsError::NoAddress {
                host: host.to_owned(),
            });
        }
        Ok((chosen, valid_until))
    }
}

/// What a refresher needs besides its group.
pub struct RefreshPlan {
    pub group: Weak<EndpointGroup>,
    pub template: EndpointTemplate,
    pub family: LookupFamily,
    /// Which answers undeclared destinations may use (`undeclaredDestinations`); `None` for
    /// Backends, which may resolve to anything but never-reachable addresses.
    pub addresses: Option<Arc<AddressPolicy>>,
}

/// Keeps one DNS group current until the group is dropped (no snapshot uses it any more).
pub async fn refresh_loop(plan: RefreshPlan, registry: Arc<StateRegistry>) {
    let mut failures: u32 = 0;
    loop {
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
        let resolved =
            resolver
                .resolve(&hostname, plan.family)
                .await
                .and_then(|(mut ips, valid_until)| {
                    if let Some(policy) = &plan.addresses {
                        ips.retain(|ip| !policy.refuses(*ip));
                    }
                    if ips.is_empty() {
                        return Err(DnsError::NoAddress {
                            host: hostname.clone(),
                        });
                    }
                    Ok((ips, valid_until))
                });
        let wait = match resolved {
            Ok((ips, valid_until)) => {
                failures = 0;
                let endpoints = ips
                    .into_iter()
                    .map(|ip| registry.endpoint(&plan.template, SocketAddr::new(ip, port)))
                    .collect();
                group.publish(EndpointList::resolved(endpoints));
                let ttl = valid_until.saturating_duration_since(Instant::now());
                if respect_ttl {
                    // At least 1s so a zero TTL cannot turn into a query loop.
                    ttl.clamp(Duration::from_secs(1), Duration::from_secs(3600))
                } else {
                    refresh
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let previous = group.list();
                if plan.addresses.is_some() {
                    // An undeclared destination: the client chose the name, and each request
                    // for it gets 503 naming this error; a warning per name would let clients
                    // fill the log.
                    tracing::debug!(host = %hostname, error = %e, kept = previous.endpoints.len(), "DNS resolution of an undeclared destination failed");
                } else {
                    tracing::warn!(host = %hostname, error = %e, kept = previous.endpoints.len(), "DNS resolution failed; keeping the last good addresses");
                }
                let mut kept = EndpointList::resolved(previous.endpoints.clone());
                kept.last_error = Some(e.to_string());
                group.publish(kept);
                // Retry sooner than the refresh rate, backing off: 1s, 2s, 4s … up to refresh.
                Duration::from_secs(1u64 << failures.min(6)).min(refresh)
            }
        };
        drop(group);
        tokio::time::sleep(wait).await;
    }
}
