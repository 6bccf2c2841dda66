//! Destinations no Backend or route declares, reached under `outboundPolicy: AllowAny` or
//! `AuditOnly` (under `RegistryOnly` they get 403 `destination_not_allowed`).
//!
//! Each (host, port, carriage) gets a target made on first use, the way an FQDN Backend with
//! default policy would be: a DNS group re-resolved when the answer's TTL runs out (or one
//! endpoint for an IP literal), least-request balancing, pooled connections, default
//! timeouts, no retries; HTTPS destinations share one TLS client config, each sending its
//! own name. The targets are shared by every request of one config generation.
//! Clients choose the hosts, so the table is bounded ([`UndeclaredLimits`]): at most
//! `maxDestinations` targets (the least recently used makes room), and a target nobody used
//! for `idleTimeout` is forgotten; either way its DNS refresher stops (at once when idle, or
//! when the last request holding it ends). A reload starts a new table; endpoints still in
//! use keep their pools through the state registry (see `snapshot::on_demand`).
//!
//! What this never reaches:
//! - hosts a Backend declares: their own rules apply, so a port the Backend does not list or a
//!   CONNECT to a host declared only for HTTP stays 403 whatever the policy;
//! - `deniedHostnames`;
//! - addresses in `undeclaredDestinations.deniedAddresses` (every non-public address by
//!   default: loopback, where egressd's admin port listens, private networks, link-local with
//!   the cloud metadata service, …) unless `allowedAddresses` opens them, and never
//!   link-local/unspecified ones. Judged on the canonical address (`::ffff:127.0.0.1` is
//!   127.0.0.1, see `upstream::address`). An IP literal there is refused with 403; a hostname
//!   whose answers are all denied gets 502 `destination_address_denied` naming them.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::balance::BalancerKind;
use crate::bounded::share::Share;
use crate::config::wire::enums::{LookupFamily, Protocol};
use crate::config::ObjectId;
use crate::names::{hostname_matches, is_valid_hostname};
use crate::snapshot::on_demand::{take_lookup, LookupsBusy, Made, OnDemand};
use crate::snapshot::{Backend, BackendPort, Target};
use crate::upstream::address::{canonical_ip, AddressPolicy};
use crate::upstream::connect::{Http2Options, Http2Settings, HttpWire, Transport};
use crate::upstream::dns::{AnswerCheck, RefreshPlan};
use crate::upstream::pool::PoolSettings;
use crate::upstream::registry::{EndpointTemplate, PortIdentity, StateRegistry};
use crate::upstream::tls::{NameCheck, Roots, TlsOrigination, TlsSpec, TlsVersion};
use crate::upstream::{EndpointGroup, EndpointSource, GroupSettings};

/// How many undeclared destinations one config generation keeps, and for how long unused
/// (`undeclaredDestinations.maxDestinations`, `.idleTimeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UndeclaredLimits {
    pub(crate) max_destinations: usize,
    pub(crate) idle_timeout: Duration,
    /// Endpoints of all destinations together (`maxEndpoints`; each gets at least one).
    pub(crate) max_endpoints: usize,
}

impl Default for UndeclaredLimits {
    fn default() -> Self {
        UndeclaredLimits {
            max_destinations: 1024,
            idle_timeout: Duration::from_secs(300),
            max_endpoints: 4096,
        }
    }
}

type Key = (String, u16, Carriage);

/// The Backend label undeclared destinations share in logs and metrics (one series, not one
/// per host: clients choose the hosts).
pub(crate) const LABEL: &str = "undeclared";

/// How a request's bytes travel to an undeclared destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Carriage {
    /// HTTP in plaintext: the client asked for `http://` on a plaintext listener.
    Http,
    /// HTTP over TLS verified against the system's roots, with SNI: the client asked for
    /// `https://` (or came over an HTTPS listener).
    Https,
    /// Raw bytes: `CONNECT host:port`, or a TLS passthrough listener's connection.
    Tcp,
}

/// Why an undeclared destination is refused even though the policy allows undeclared ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("a Backend declares this host; requests follow its ports and protocol")]
    Declared,
    #[error("the host matches ProxyConfig deniedHostnames `{0}`")]
    DeniedHostname(String),
    #[error("address {0} is not reachable as an undeclared destination: it is not public (undeclaredDestinations.deniedAddresses; allowedAddresses opens it), or link-local/unspecified")]
    DeniedAddress(IpAddr),
    #[error("`{0}` is not a valid hostname")]
    InvalidHost(String),
    #[error("cannot originate TLS: {0}")]
    Tls(String),
    #[error(transparent)]
    WildcardHost(#[from] crate::snapshot::wildcard::HostRefused),
    #[error(transparent)]
    LookupsBusy(#[from] LookupsBusy),
}

impl Refusal {
    /// Whether the refusal is egressd's lookup rate, not a rule about the destination.
    pub(crate) fn is_lookups_busy(&self) -> bool {
        matches!(
            self,
            Refusal::LookupsBusy(_)
                | Refusal::WildcardHost(crate::snapshot::wildcard::HostRefused::LookupsBusy(_))
        )
    }
}

/// The undeclared destinations of one config generation.
pub(crate) struct UndeclaredDestinations {
    /// `AuditOnly`: every use is recorded as what `RegistryOnly` would have refused.
    audit: bool,
    /// Hostnames of FQDN Backends (lower-case).
    declared: HashSet<String>,
    denied_hostnames: Vec<String>,
    addresses: Arc<AddressPolicy>,
    registry: Arc<StateRegistry>,
    targets: Arc<OnDemand<Key>>,
    /// The endpoints the destinations hold together (`maxEndpoints`).
    endpoints: Arc<Share>,
    /// The TLS client config every HTTPS destination shares (its certificate is verified
    /// against the name its connections send), made on first use: one, not one per name.
    https: OnceLock<Arc<TlsOrigination>>,
    http2: Arc<Http2Options>,
}

impl std::fmt::Debug for UndeclaredDestinations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UndeclaredDestinations")
            .field("audit", &self.audit)
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

impl UndeclaredDestinations {
    pub(crate) fn new(
        audit: bool,
        declared: HashSet<String>,
        denied_hostnames: Vec<String>,
        addresses: &AddressPolicy,
        limits: UndeclaredLimits,
        registry: Arc<StateRegistry>,
    ) -> Self {
        UndeclaredDestinations {
            audit,
            declared,
            denied_hostnames,
            addresses: Arc::new(addresses.clone()),
            targets: Arc::new(OnDemand::new(
                "undeclared destination",
                limits.max_destinations,
                limits.idle_timeout,
                registry.clone(),
            )),
            endpoints: Arc::new(Share::new(limits.max_endpoints)),
            https: OnceLock::new(),
            http2: Arc::new(Http2Options::new(&Http2Settings::default())),
            registry,
        }
    }

    /// Undeclared destinations kept now (for `/metrics`).
    pub(crate) fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether uses are recorded as audited (`AuditOnly`).
    pub(crate) fn audits(&self) -> bool {
        self.audit
    }

    /// The target for `host` (canonical, as `upstream::address::canonical_host` makes it) on
    /// `port`, made on first use. Must run inside the runtime: a new target starts the task
    /// that forgets it when idle (and, for a hostname, its DNS refresher).
    pub(crate) fn target(
        self: &Arc<Self>,
        host: &str,
        port: u16,
        carriage: Carriage,
    ) -> Result<Arc<Target>, Refusal> {
        let key = (host.to_owned(), port, carriage);
        self.targets
            .get_or_make(key, || self.build(host, port, carriage))
    }

    /// The target, and the DNS refresher it needs (a hostname's), not started yet: only the
    /// target that makes it into the table gets one.
    fn build(&self, host: &str, port: u16, carriage: Carriage) -> Result<Made, Refusal> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let literal = bare.parse::<IpAddr>().ok().map(canonical_ip);
        self.admit(host, literal)?;
        if literal.is_none() {
            // Refused destinations were refused before they could cost a lookup.
            take_lookup(&self.registry)?;
        }
        let (transport, wire, protocol) = self.carriage_transport(host, literal, carriage)?;
        // Endpoints are identified by the host they were reached as and how: a pooled TLS
        // connection made for one host must not carry another host's requests.
        let id = ObjectId {
            kind: "Backend".into(),
            namespace: "".into(),
            name: format!("{LABEL} {host}").into(),
        };
        let template = EndpointTemplate {
            port: Arc::new(PortIdentity {
                backend: id.clone(),
                number: port,
                transport: carriage as u64,
                pool: PoolSettings::default(),
            }),
            weight: 1,
            priority: 0,
        };
        let (group, refresh) = self.endpoint_group(host, literal, port, template);
        let port = Arc::new(BackendPort {
            number: port,
            protocol,
            passthrough: carriage == Carriage::Tcp,
            // Undeclared destinations are never intercepted.
            interception: false,
            transport,
            wire,
            http2: self.http2.clone(),
            mcp: None,
            tcp_keepalive: None,
            endpoints: group,
            authority: None,
            wildcard: None,
        });
        let backend = Arc::new(Backend {
            id,
            label: LABEL.into(),
            hostname: literal.is_none().then(|| host.to_owned()),
            ports: vec![port.clone()],
            fallback: false,
            credentials: Vec::new(),
            stats: std::sync::OnceLock::new(),
        });
        let target = Target {
            backend,
            port,
            policy: Arc::default(),
            rewrite_authority: false,
        };
        Ok(Made {
            target,
            refresh,
            companion: None,
        })
    }

    /// Refuses an IP `literal` the address policy denies, or a hostname that is invalid,
    /// declared by a Backend, or denied by `deniedHostnames`.
    fn admit(&self, host: &str, literal: Option<IpAddr>) -> Result<(), Refusal> {
        match literal {
            Some(ip) => {
                if self.addresses.refuses(ip) {
                    return Err(Refusal::DeniedAddress(ip));
                }
            }
            None => {
                if !is_valid_hostname(host) {
                    return Err(Refusal::InvalidHost(host.to_owned()));
                }
                if self.declared.contains(host) {
                    return Err(Refusal::Declared);
                }
                if let Some(p) = self
                    .denied_hostnames
                    .iter()
                    .find(|p| hostname_matches(p, host))
                {
                    return Err(Refusal::DeniedHostname(p.clone()));
                }
            }
        }
        Ok(())
    }

    /// How `carriage` reaches `host`: plaintext, or TLS verified against the system's roots.
    fn carriage_transport(
        &self,
        host: &str,
        literal: Option<IpAddr>,
        carriage: Carriage,
    ) -> Result<(Transport, HttpWire, Protocol), Refusal> {
        Ok(match carriage {
            Carriage::Http => (Transport::Plain, HttpWire::Http1, Protocol::Http),
            Carriage::Tcp => (Transport::Plain, HttpWire::Http1, Protocol::Tcp),
            Carriage::Https => {
                let shared = self.https_config()?;
                // An IP literal is verified as an IP address, without SNI (RFC 6066 §3).
                let sni = match literal {
                    Some(_) => None,
                    None => Some(
                        ServerName::try_from(host.to_owned())
                            .map_err(|e| Refusal::Tls(format!("{host}: {e}")))?,
                    ),
                };
                let origination = TlsOrigination {
                    config: shared.config.clone(),
                    http1_config: shared.http1_config.clone(),
                    sni,
                };
                let transport = Transport::Tls(Arc::new(origination));
                (transport, HttpWire::Negotiated, Protocol::Http)
            }
        })
    }

    /// The TLS client config of HTTPS destinations, made on first use (a failure, such as
    /// unreadable system roots, is tried again by the next destination).
    fn https_config(&self) -> Result<&Arc<TlsOrigination>, Refusal> {
        if let Some(made) = self.https.get() {
            return Ok(made);
        }
        let spec = TlsSpec {
            roots: Roots::System,
            names: NameCheck::ServerName,
            client_cert: None,
            versions: vec![TlsVersion::V1_2, TlsVersion::V1_3],
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            sni: None,
        };
        let made = crate::upstream::tls::build(&spec).map_err(|e| Refusal::Tls(e.to_string()))?;
        Ok(self.https.get_or_init(|| Arc::new(made)))
    }

    /// The endpoints of `host`: the one address of an IP `literal`, else a DNS group, and its
    /// refresher (not started).
    fn endpoint_group(
        &self,
        host: &str,
        literal: Option<IpAddr>,
        port: u16,
        template: EndpointTemplate,
    ) -> (Arc<EndpointGroup>, Option<RefreshPlan>) {
        let balancer = BalancerKind::default();
        if let Some(ip) = literal {
            let group = Arc::new(EndpointGroup::new_static(
                vec![self.registry.endpoint(&template, SocketAddr::new(ip, port))],
                || balancer.build(),
                GroupSettings::default(),
            ));
            return (group, None);
        }
        let source = EndpointSource::Dns {
            hostname: host.to_owned(),
            port,
            refresh: Duration::from_secs(30),
            respect_ttl: true,
        };
        let group = Arc::new(EndpointGroup::new_dns(
            source,
            || balancer.build(),
            GroupSettings::default(),
        ));
        let refresh = RefreshPlan {
            group: Arc::downgrade(&group),
            template,
            family: LookupFamily::IPv4Preferred,
            check: AnswerCheck::Undeclared(self.addresses.clone()),
            backend: LABEL.into(),
            on_demand: Some(self.endpoints.part()),
        };
        (group, Some(refresh))
    }
}
