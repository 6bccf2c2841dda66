//! A Backend's `destination` → the hostname it resolves or the addresses it lists.

use std::net::IpAddr;
use std::path::Path;

use super::settings::Settings;
use super::{at, Cx};
use crate::config::wire::backend::{Destination as WireDestination, FqdnDestination, IpEndpoint};
use crate::config::wire::enums::DestinationType;
use crate::config::yaml::{Pos, Spanned};
use crate::config::ObjectId;
use crate::names::{hostname_matches, is_valid_hostname};
use crate::snapshot::wildcard::HostLimits;
use crate::upstream::address::{canonical_ip, is_never_reachable, AnswerPolicy};

/// A listed IP endpoint.
#[derive(Clone, Copy, Debug)]
pub(super) struct ListedAddr {
    pub(crate) ip: IpAddr,
    /// The endpoint's own port; `None`: the Backend port's.
    pub(crate) port: Option<u16>,
    pub(crate) weight: u32,
    pub(crate) priority: u32,
}

/// Where a Backend sends: an FQDN's hostname, or listed addresses. What is in error is left
/// out (and reported).
#[derive(Debug, Default)]
pub(super) struct Destination {
    pub(crate) hostname: Option<String>,
    /// `hostname` is `*.suffix`: a wildcard Backend, with these limits on its hosts.
    pub(crate) wildcard: Option<HostLimits>,
    /// Which DNS answers `hostname` may use.
    pub(crate) answers: AnswerPolicy,
    /// `fqdn.allowedAddresses` (a wildcard Backend's hosts each get an [`AnswerPolicy`]).
    pub(crate) allowed: Vec<ipnet::IpNet>,
    pub(crate) addrs: Vec<ListedAddr>,
}

/// Where the `destination` block is.
struct Site<'a> {
    file: &'a Path,
    id: &'a ObjectId,
    dest: &'a Spanned<WireDestination>,
}

/// Checks `spec.destination` (type, hostname or endpoints, ports) and says where it sends.
pub(super) fn compile_destination(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    dest: &Spanned<WireDestination>,
    settings: &Settings,
) -> Destination {
    let site = Site { file, id, dest };
    let mut out = Destination::default();
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
                    out.hostname = compile_hostname(cx, &site, fqdn, settings);
                    let allowed = compile_allowed_addresses(cx, &site, fqdn);
                    out.wildcard = host_limits(cx, &site, fqdn, out.hostname.as_deref());
                    if let Some(host) = &out.hostname {
                        out.answers = AnswerPolicy::declared(host, allowed.clone());
                    }
                    out.allowed = allowed;
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
                        out.addrs.extend(compile_ip_endpoint(cx, &site, i, ep));
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
    out
}

/// `fqdn.hostname`, lowercased and without a final dot: a DNS name that is not denied.
fn compile_hostname(
    cx: &mut Cx,
    site: &Site<'_>,
    fqdn: &FqdnDestination,
    settings: &Settings,
) -> Option<String> {
    let host = fqdn
        .hostname
        .value
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let here = || {
        at(
            site.file,
            site.id,
            fqdn.hostname.pos,
            "spec.destination.fqdn.hostname",
        )
    };
    // A wildcard is judged by its domain: `*.example.com` is denied by `example.com` and
    // by `*.example.com`.
    let suffix = host.strip_prefix("*.");
    if host.parse::<IpAddr>().is_ok() {
        cx.error(
            here(),
            format!("`{host}` is an IP address"),
            "use `type: IP` with `ip.endpoints` for addresses",
        );
    } else if suffix.is_some_and(|d| d.contains('*') || !is_valid_hostname(d) || !d.contains('.')) {
        cx.error(
            here(),
            format!("wildcard hostname `{host}` is not `*.` and a domain of two or more labels"),
            "e.g. *.example.com (it matches one or more labels under example.com, not example.com itself)",
        );
    } else if suffix.is_none() && host.contains('*') {
        cx.error(
            here(),
            format!("`{host}`: `*` only as the whole first label (`*.example.com`)"),
            "name one host, or `*.` and a domain",
        );
    } else if suffix.is_none() && !is_valid_hostname(&host) {
        cx.error(
            here(),
            format!("invalid hostname `{host}`"),
            "use a DNS name such as api.example.com",
        );
    } else if let Some(p) = settings
        .denied_hostnames
        .iter()
        .find(|p| hostname_matches(p, &host) || suffix.is_some_and(|d| hostname_matches(p, d)))
    {
        cx.error(
            here(),
            format!("hostname `{host}` is denied by ProxyConfig deniedHostnames `{p}`"),
            "choose another destination or change deniedHostnames",
        );
    } else {
        return Some(host);
    }
    None
}

/// `fqdn.maxHosts` and `fqdn.hostIdleTimeout`: the limits of a wildcard Backend's hosts
/// (`Some` for a wildcard `host`), errors on a Backend of one host.
fn host_limits(
    cx: &mut Cx,
    site: &Site<'_>,
    fqdn: &FqdnDestination,
    host: Option<&str>,
) -> Option<HostLimits> {
    let wildcard = host.is_some_and(|h| h.starts_with("*."));
    let mut limits = HostLimits::default();
    let field = |name: &str| format!("spec.destination.fqdn.{name}");
    let count = |cx: &mut Cx, name: &str, value: &Option<Spanned<u32>>, default, beyond: &str| {
        let max = value.as_ref()?;
        let at_field = at(site.file, site.id, max.pos, field(name));
        if !wildcard {
            let what = format!("{name} is for wildcard hostnames (`*.example.com`){beyond}");
            cx.error(at_field, what, "remove it");
        } else if max.value == 0 {
            let hint = format!("omit it for the default, {default}");
            cx.error(at_field, format!("{name} must be at least 1"), hint);
        } else {
            return Some(max.value as usize);
        }
        None
    };
    if let Some(max) = count(cx, "maxHosts", &fqdn.max_hosts, 256, "") {
        limits.max_hosts = max;
    }
    let one_name = "; dns.maxAddressesPerAnswer of the ProxyConfig bounds one name's";
    if let Some(max) = count(cx, "maxEndpoints", &fqdn.max_endpoints, 2048, one_name) {
        limits.max_endpoints = max;
    }
    if let Some(idle) = &fqdn.host_idle_timeout {
        let idle_timeout = std::time::Duration::from(idle.value);
        if !wildcard {
            cx.error(
                at(site.file, site.id, idle.pos, field("hostIdleTimeout")),
                "hostIdleTimeout is for wildcard hostnames (`*.example.com`)",
                "remove it",
            );
        } else if idle_timeout.is_zero() {
            cx.error(
                at(site.file, site.id, idle.pos, field("hostIdleTimeout")),
                "hostIdleTimeout must be longer than 0s",
                "omit it for the default, 5m",
            );
        } else {
            limits.idle_timeout = idle_timeout;
        }
    }
    wildcard.then_some(limits)
}

/// `fqdn.allowedAddresses`: CIDRs (a bare address is one host).
fn compile_allowed_addresses(
    cx: &mut Cx,
    site: &Site<'_>,
    fqdn: &FqdnDestination,
) -> Vec<ipnet::IpNet> {
    let Some(list) = &fqdn.allowed_addresses else {
        return Vec::new();
    };
    let mut nets = Vec::with_capacity(list.len());
    for (i, cidr) in list.iter().enumerate() {
        match super::undeclared::parse_cidr(&cidr.value) {
            Some(net) => nets.push(net),
            None => cx.error(
                at(
                    site.file,
                    site.id,
                    cidr.pos,
                    format!("spec.destination.fqdn.allowedAddresses[{i}]"),
                ),
                format!("invalid CIDR `{}`", cidr.value),
                "write an address with a prefix length, e.g. 127.0.0.0/8 or 169.254.169.254/32",
            ),
        }
    }
    nets
}

/// `ip.endpoints[i]`: a reachable address, its own port (only on a one-port Backend), a weight.
fn compile_ip_endpoint(
    cx: &mut Cx,
    site: &Site<'_>,
    i: usize,
    ep: &Spanned<IpEndpoint>,
) -> Option<ListedAddr> {
    let (file, id) = (site.file, site.id);
    let field = format!("spec.destination.ip.endpoints[{i}]");
    let listed = match ep.address.value.parse::<IpAddr>() {
        Ok(addr) if is_never_reachable(addr) => {
            cx.error(
                at(file, id, ep.address.pos, format!("{field}.address")),
                format!("address {addr} is link-local or unspecified and never a destination"),
                "use the service's real address",
            );
            None
        }
        Ok(addr) => Some(ListedAddr {
            ip: canonical_ip(addr),
            port: ep.port.as_ref().map(|p| p.value),
            weight: ep.weight.unwrap_or(1),
            priority: ep.priority.as_ref().map_or(0, |p| p.value),
        }),
        Err(_) => {
            cx.error(
                at(file, id, ep.address.pos, format!("{field}.address")),
                format!("invalid IP address `{}`", ep.address.value),
                "write an IPv4 or IPv6 address without port",
            );
            None
        }
    };
    if let Some(port) = &ep.port {
        check_own_port(cx, site, &field, port.value, port.pos);
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
    listed
}

/// An endpoint's own port: a real port, on a Backend that has exactly one.
fn check_own_port(cx: &mut Cx, site: &Site<'_>, field: &str, port: u16, pos: Pos) {
    let here = || at(site.file, site.id, pos, format!("{field}.port"));
    if port == 0 {
        cx.error(here(), "port 0 is not a destination port", "use 1-65535");
    } else if site.dest.ports.len() != 1 {
        cx.error(
            here(),
            format!(
                "an endpoint's own port needs a Backend with exactly one port (this one declares {})",
                site.dest.ports.len()
            ),
            "split the Backend: one per port, each with its endpoints",
        );
    }
}
