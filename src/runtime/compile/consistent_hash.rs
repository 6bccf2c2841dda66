//! `loadBalancer.consistentHash`: positioned validation, and the resolved settings.

use http::header::HeaderName;

use super::{at, At, Cx};
use crate::balance::maglev::{self, MAX_TABLE_SIZE};
use crate::balance::ring_hash::{DEFAULT_MAX_RING_SIZE, DEFAULT_MIN_RING_SIZE, MAX_RING_SIZE};
use crate::balance::{ConsistentHashSettings, HashKey, HashTable};
use crate::config::wire::enums::{ConsistentHashType, LoadBalancerType};
use crate::config::wire::policy::{ConsistentHashConfig, LoadBalancer};
use crate::config::yaml::Pos;
use crate::config::ObjectId;

/// Checks the consistent-hash settings of `lb` (and that type and section go together).
pub(super) fn check(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    lb: &LoadBalancer,
    prefix: &str,
) {
    let field = |name: &str| format!("{prefix}.loadBalancer.{name}");
    let is_type = lb.kind.value == LoadBalancerType::ConsistentHash;
    let ch = match (&lb.consistent_hash, is_type) {
        (None, false) => return,
        (None, true) => {
            cx.error(
                at(file, id, lb.kind.pos, field("type")),
                "type ConsistentHash needs consistentHash settings (what to hash)",
                "add `consistentHash: {type: Header, header: {name: x-user}}` (or Cookie, SourceIP)",
            );
            return;
        }
        (Some(ch), false) => {
            cx.error(
                at(file, id, ch.pos, field("consistentHash")),
                format!(
                    "consistentHash settings do not apply to type {}",
                    lb.kind.value
                ),
                "remove consistentHash, or set type: ConsistentHash",
            );
            return;
        }
        (Some(ch), true) => ch,
    };
    let section = Section { file, id, prefix };
    check_key(cx, &section, &ch.value);
    check_stray_keys(cx, &section, &ch.value);
    check_table(cx, &section, &ch.value);
}

/// A `consistentHash` section being checked, and where it is written.
struct Section<'a> {
    file: &'a std::path::Path,
    id: &'a ObjectId,
    /// The field path of the policy section holding `loadBalancer`.
    prefix: &'a str,
}

impl<'a> Section<'a> {
    /// Where a diagnostic about `consistentHash.{name}` points.
    fn at(&self, pos: Pos, name: &str) -> At<'a> {
        let field = format!("{}.loadBalancer.consistentHash.{name}", self.prefix);
        at(self.file, self.id, pos, field)
    }
}

/// The key: exactly the sub-section the type names, with a valid header or cookie name.
fn check_key(cx: &mut Cx, s: &Section<'_>, c: &ConsistentHashConfig) {
    match (c.kind.value, &c.header, &c.cookie) {
        (ConsistentHashType::Header, None, _) => cx.error(
            s.at(c.kind.pos, "type"),
            "type Header needs the header's name",
            "add `header: {name: x-user}`",
        ),
        (ConsistentHashType::Header, Some(h), _) => {
            if HeaderName::from_bytes(h.value.name.value.as_bytes()).is_err() {
                cx.error(
                    s.at(h.value.name.pos, "header.name"),
                    format!("{:?} is not a valid header name", h.value.name.value),
                    "a token such as x-user",
                );
            }
        }
        (ConsistentHashType::Cookie, _, None) => cx.error(
            s.at(c.kind.pos, "type"),
            "type Cookie needs the cookie's name",
            "add `cookie: {name: session}`",
        ),
        (ConsistentHashType::Cookie, _, Some(k)) => {
            let name = &k.value.name;
            if name.value.is_empty() || name.value.bytes().any(|b| b"=; \t,\"".contains(&b)) {
                cx.error(
                    s.at(name.pos, "cookie.name"),
                    format!("{:?} is not a valid cookie name", name.value),
                    "a token such as session",
                );
            }
            for (what, v) in [("ttl", &k.value.ttl), ("attributes", &k.value.attributes)] {
                if let Some(v) = v {
                    cx.not_yet(
                        s.at(v.pos, &format!("cookie.{what}")),
                        &format!("cookie.{what} (generating the cookie)"),
                        "",
                    );
                }
            }
        }
        (ConsistentHashType::SourceIp, _, _) => {}
    }
}

/// A `header` or `cookie` sub-section for a type that does not use it.
fn check_stray_keys(cx: &mut Cx, s: &Section<'_>, c: &ConsistentHashConfig) {
    let stray = [
        (
            "header",
            c.header.as_ref().map(|h| h.pos),
            ConsistentHashType::Header,
        ),
        (
            "cookie",
            c.cookie.as_ref().map(|k| k.pos),
            ConsistentHashType::Cookie,
        ),
    ];
    for (name, pos, kind) in stray {
        if let Some(pos) = pos.filter(|_| c.kind.value != kind) {
            cx.error(
                s.at(pos, name),
                format!("{name} does not apply to type {}", c.kind.value),
                format!("remove {name}, or set type: {kind}"),
            );
        }
    }
}

/// The table: ring hash or Maglev, not both, each with sizes in range.
fn check_table(cx: &mut Cx, s: &Section<'_>, c: &ConsistentHashConfig) {
    if let (Some(_), Some(m)) = (&c.ring_hash, &c.maglev) {
        cx.error(
            s.at(m.pos, "maglev"),
            "ringHash and maglev are exclusive",
            "keep one of them (ringHash is the default)",
        );
    }
    if let Some(r) = &c.ring_hash {
        let (min, max) = (&r.value.minimum_ring_size, &r.value.maximum_ring_size);
        for (name, v) in [("minimumRingSize", min), ("maximumRingSize", max)] {
            if let Some(v) = v
                .as_ref()
                .filter(|v| !(1..=MAX_RING_SIZE).contains(&v.value))
            {
                cx.error(
                    s.at(v.pos, &format!("ringHash.{name}")),
                    format!("{name} {} is out of range (1 to {MAX_RING_SIZE})", v.value),
                    "the default minimum is 1024 points",
                );
            }
        }
        let min_value = min.as_ref().map_or(DEFAULT_MIN_RING_SIZE, |v| v.value);
        let max_value = max.as_ref().map_or(DEFAULT_MAX_RING_SIZE, |v| v.value);
        if let Some(v) = min.as_ref().filter(|_| min_value > max_value) {
            cx.error(
                s.at(v.pos, "ringHash.minimumRingSize"),
                format!("minimumRingSize {min_value} is above maximumRingSize {max_value}"),
                "lower minimumRingSize or raise maximumRingSize",
            );
        }
    }
    if let Some(size) = c.maglev.as_ref().and_then(|m| m.value.table_size.as_ref()) {
        let n = size.value;
        let (message, hint) = if n > MAX_TABLE_SIZE {
            (
                format!("tableSize {n} is above {MAX_TABLE_SIZE}"),
                "65537 (the default) suits up to a few hundred endpoints",
            )
        } else if !maglev::is_prime(n) {
            (
                format!("tableSize {n} is not a prime number"),
                "a prime such as 65537 (the default), 131071 or 524287",
            )
        } else {
            return;
        };
        cx.error(s.at(size.pos, "maglev.tableSize"), message, hint);
    }
}

/// The settings of a section `check` accepted (`None` when it could not be, then the config
/// has errors and is not used).
pub(super) fn settings(c: &ConsistentHashConfig) -> Option<ConsistentHashSettings> {
    let key = match c.kind.value {
        ConsistentHashType::Header => {
            let name = &c.header.as_ref()?.value.name.value;
            HashKey::Header(HeaderName::from_bytes(name.as_bytes()).ok()?)
        }
        ConsistentHashType::Cookie => HashKey::Cookie(c.cookie.as_ref()?.value.name.value.clone()),
        ConsistentHashType::SourceIp => HashKey::SourceIp,
    };
    let table = match (&c.maglev, &c.ring_hash) {
        (Some(m), _) => HashTable::Maglev {
            size: m
                .value
                .table_size
                .as_ref()
                .map_or(maglev::DEFAULT_TABLE_SIZE, |s| s.value),
        },
        (None, Some(r)) => HashTable::RingHash {
            min_size: r
                .value
                .minimum_ring_size
                .as_ref()
                .map_or(DEFAULT_MIN_RING_SIZE, |v| v.value),
            max_size: r
                .value
                .maximum_ring_size
                .as_ref()
                .map_or(DEFAULT_MAX_RING_SIZE, |v| v.value),
        },
        (None, None) => HashTable::default(),
    };
    Some(ConsistentHashSettings { key, table })
}
