//! `ProxyConfig.spec.undeclaredDestinations`, `.blockedAudit` and `.bufferedBodies` → the
//! limits of what clients fill by naming destinations and sending bodies.

use std::path::Path;
use std::time::Duration;

use super::{at, Cx};
use crate::config::wire::proxy::{BlockedAuditSpec, UndeclaredDestinationsSpec};
use crate::config::yaml::Spanned;
use crate::config::ObjectId;
use crate::snapshot::ProxySettings;
use crate::telemetry::blocked::AuditLimits;
use crate::upstream::address::canonical_net;

/// Reads `undeclaredDestinations` into `settings`.
pub(super) fn compile_undeclared(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &UndeclaredDestinationsSpec,
    settings: &mut ProxySettings,
) {
    let mut cidrs = |list: &[Spanned<String>], field: &str| -> Vec<ipnet::IpNet> {
        let mut nets = Vec::with_capacity(list.len());
        for (i, cidr) in list.iter().enumerate() {
            match parse_cidr(&cidr.value) {
                Some(net) => nets.push(canonical_net(net)),
                None => cx.error(
                    at(file, id, cidr.pos, format!("spec.undeclaredDestinations.{field}[{i}]")),
                    format!("invalid CIDR `{}`", cidr.value),
                    "write an address with a prefix length, e.g. 10.0.0.0/8 or fd00::/8 (a bare address means /32 or /128)",
                ),
            }
        }
        nets
    };
    let policy = &mut settings.undeclared_addresses;
    if let Some(denied) = &spec.denied_addresses {
        policy.denied = cidrs(denied, "deniedAddresses").into();
    }
    if let Some(allowed) = &spec.allowed_addresses {
        policy.allowed = cidrs(allowed, "allowedAddresses").into();
    }
    let limits = &mut settings.undeclared_limits;
    if let Some(max) = &spec.max_destinations {
        match usize::try_from(max.value) {
            Ok(n) if n >= 1 => limits.max_destinations = n,
            _ => cx.error(
                at(
                    file,
                    id,
                    max.pos,
                    "spec.undeclaredDestinations.maxDestinations",
                ),
                "maxDestinations must be at least 1",
                "omit it for the default, 1024",
            ),
        }
    }
    if let Some(max) = &spec.max_endpoints {
        match usize::try_from(max.value) {
            Ok(n) if n >= 1 => limits.max_endpoints = n,
            _ => cx.error(
                at(
                    file,
                    id,
                    max.pos,
                    "spec.undeclaredDestinations.maxEndpoints",
                ),
                "maxEndpoints must be at least 1",
                "omit it for the default, 4096",
            ),
        }
    }
    if let Some(idle) = &spec.idle_timeout {
        let idle_timeout = Duration::from(idle.value);
        if idle_timeout.is_zero() {
            cx.error(
                at(
                    file,
                    id,
                    idle.pos,
                    "spec.undeclaredDestinations.idleTimeout",
                ),
                "idleTimeout must be longer than 0s",
                "omit it for the default, 5m",
            );
        } else {
            limits.idle_timeout = idle_timeout;
        }
    }
}

/// Reads `blockedAudit` into `settings`.
pub(super) fn compile_blocked_audit(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &BlockedAuditSpec,
    settings: &mut ProxySettings,
) {
    let audit: &mut AuditLimits = &mut settings.blocked_audit;
    if let Some(max) = &spec.max_entries {
        match usize::try_from(max.value) {
            Ok(n) if n >= 1 => audit.max_entries = n,
            _ => cx.error(
                at(file, id, max.pos, "spec.blockedAudit.maxEntries"),
                "maxEntries must be at least 1",
                "omit it for the default, 1024",
            ),
        }
    }
    if let Some(retention) = &spec.retention {
        let retention_time = Duration::from(retention.value);
        if retention_time.is_zero() {
            cx.error(
                at(file, id, retention.pos, "spec.blockedAudit.retention"),
                "retention must be longer than 0s",
                "omit it for the default, 24h",
            );
        } else {
            audit.retention = retention_time;
        }
    }
}

/// `10.0.0.0/8`, `::1/128`, or a bare address (a single-address network).
pub(super) fn parse_cidr(text: &str) -> Option<ipnet::IpNet> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>().ok().or_else(|| {
        text.parse::<std::net::IpAddr>()
            .ok()
            .map(ipnet::IpNet::from)
    })
}

/// Reads `bufferedBodies` into `settings`.
pub(super) fn compile_buffered_bodies(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &crate::config::wire::proxy::BufferedBodiesSpec,
    settings: &mut ProxySettings,
) {
    let buffers = &mut settings.buffered_bodies;
    if let Some(budget) = &spec.budget {
        let bytes = u64::from(budget.value);
        // At least one whole MCP body (4 MiB), or inspection could never happen.
        if bytes < crate::mcp::inspect::BODY_LIMIT {
            cx.error(
                at(file, id, budget.pos, "spec.bufferedBodies.budget"),
                format!("budget must be at least 4Mi (one MCP body egressd inspects), got {bytes} bytes"),
                "omit it for the default, 32Mi",
            );
        } else {
            buffers.budget = bytes;
        }
    }
    if let Some(timeout) = &spec.read_timeout {
        let read_timeout = Duration::from(timeout.value);
        if read_timeout.is_zero() {
            cx.error(
                at(file, id, timeout.pos, "spec.bufferedBodies.readTimeout"),
                "readTimeout must be longer than 0s",
                "omit it for the default, 30s",
            );
        } else {
            buffers.read_timeout = read_timeout;
        }
    }
}
