//! A `rateLimit` section compiled: its rules, what each matches, and the counters it counts
//! in. Matching is per request and allocation-free unless a rule is `Distinct` (its key holds
//! the distinct values).

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use ipnet::IpNet;
use regex::Regex;

use super::distinct::DistinctCounters;
use super::window::WindowCounter;
use super::{Decision, Quota};
use crate::policy::identity::{Client, TlsIdentity};
use crate::policy::rules::ClientSet;

/// One `rateLimit` section as it applies to one scope (a Backend, a route, or everything the
/// policy targets when its rules are `shared`).
#[derive(Debug)]
pub(crate) struct RateLimitPolicy {
    /// The policy's `namespace/name` (`Backend ns/name` for an inline section).
    pub(crate) name: Arc<str>,
    /// What its counters count (`backend ns/name`, `route ns/name`; `shared` when every rule
    /// is).
    pub(crate) scope: Arc<str>,
    /// `mode: Report`: requests over a limit pass, and are recorded as "would limit".
    pub(crate) report: bool,
    pub(crate) local: Box<[Rule]>,
    pub(crate) global: Box<[Rule]>,
    /// Some rule selects MCP calls: requests to an MCP endpoint path are judged after their
    /// JSON-RPC body is read, once per call.
    pub(crate) mcp: bool,
}

impl RateLimitPolicy {
    /// Whether any rule counts in Redis.
    pub(crate) fn has_global(&self) -> bool {
        !self.global.is_empty()
    }
}

/// One rule: which requests it counts, its quota, and its counters.
#[derive(Debug)]
pub(crate) struct Rule {
    /// The rule's `name`, or its index in its list (`local[0]`, `global[1]`).
    pub(crate) label: Arc<str>,
    pub(crate) quota: Quota,
    /// All must match (none: every request).
    pub(crate) selectors: Arc<[Selector]>,
    pub(crate) counter: Counter,
    /// `egressd_ratelimit_decisions_total` of this rule, resolved by its first decision.
    pub(crate) stats: std::sync::OnceLock<crate::telemetry::metrics::RateLimitStats>,
}

/// Where a rule counts.
#[derive(Debug)]
pub(crate) enum Counter {
    /// In this process; shared with the same rule of the next config generation.
    Local(Arc<LocalCounter>),
    /// In Redis, under this key (distinct values append their hash).
    Global(Box<str>),
}

/// A local rule's counters.
#[derive(Debug)]
pub(crate) enum LocalCounter {
    One(WindowCounter),
    /// Boxed: its shards are a kilobyte, and most rules have one counter.
    Distinct(Box<DistinctCounters>),
}

impl LocalCounter {
    /// Counts one request (with its distinct values, when the rule has some).
    pub(crate) fn acquire(&self, key: &[u8], quota: Quota, now_ms: u64) -> Decision {
        match self {
            LocalCounter::One(c) => c.acquire(quota, now_ms),
            LocalCounter::Distinct(t) => t.acquire(t.value_hash(key), quota, now_ms),
        }
    }

    /// Gives back a request [`acquire`](Self::acquire) counted.
    pub(crate) fn release(&self, key: &[u8], quota: Quota, now_ms: u64) {
        match self {
            LocalCounter::One(c) => c.release(quota, now_ms),
            LocalCounter::Distinct(t) => t.release(t.value_hash(key), quota, now_ms),
        }
    }
}

/// What a request is, as rules look at it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    /// `CONNECT` for a tunnel; empty for a passthrough connection (no method).
    pub(crate) method: &'a str,
    /// Empty for tunnels and passthrough connections.
    pub(crate) path: &'a str,
    /// None for a passthrough connection.
    pub(crate) headers: Option<&'a HeaderMap>,
    pub(crate) client: Client<'a>,
    /// The JSON-RPC call, for a request to an MCP endpoint path whose body egressd read.
    pub(crate) mcp: Option<McpCall<'a>>,
}

/// One JSON-RPC call of an MCP request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct McpCall<'a> {
    pub(crate) method: Option<&'a str>,
    pub(crate) tool: Option<&'a str>,
}

/// One client selector: every part given must match.
#[derive(Debug, Default)]
pub(crate) struct Selector {
    pub(crate) headers: Vec<HeaderMatch>,
    /// Any may match (each possibly inverted).
    pub(crate) methods: Vec<(http::Method, bool)>,
    pub(crate) path: Option<(PathMatch, bool)>,
    pub(crate) source: Option<SourceMatch>,
    pub(crate) clients: Option<ClientsMatch>,
    pub(crate) mcp: Option<McpMatch>,
}

#[derive(Debug)]
pub(crate) struct HeaderMatch {
    pub(crate) name: http::HeaderName,
    pub(crate) value: ValueMatch,
    pub(crate) invert: bool,
}

#[derive(Debug)]
pub(crate) enum ValueMatch {
    Exact(Box<[u8]>),
    /// Anchored: must match the whole value.
    Regex(Regex),
    /// Present; one counter per value.
    Distinct,
}

#[derive(Debug)]
pub(crate) enum PathMatch {
    Exact(Box<str>),
    /// Path-element prefix, without its trailing slash (`/a` matches `/a`, `/a/b`; not `/ab`).
    Prefix(Box<str>),
    /// Anchored.
    Regex(Regex),
}

#[derive(Debug)]
pub(crate) struct SourceMatch {
    /// Canonical.
    pub(crate) net: IpNet,
    pub(crate) distinct: bool,
    pub(crate) invert: bool,
}

#[derive(Debug)]
pub(crate) struct ClientsMatch {
    /// `None`: every client.
    pub(crate) set: Option<ClientSet>,
    pub(crate) distinct: bool,
}

#[derive(Debug, Default)]
pub(crate) struct McpMatch {
    /// Empty: any method.
    pub(crate) methods: Vec<Box<str>>,
    /// Exact names and prefixes (ending in `*`, stored without it); empty: any tool.
    pub(crate) tools: Vec<(Box<str>, bool)>,
}

impl Rule {
    /// Whether the rule counts `facts`; its distinct values are appended to `key`.
    pub(crate) fn matches(&self, facts: &Facts<'_>, key: &mut Vec<u8>) -> bool {
        self.selectors.iter().all(|s| s.matches(facts, key))
    }

    /// Whether any selector looks at MCP calls.
    pub(crate) fn selects_mcp(&self) -> bool {
        self.selectors.iter().any(|s| s.mcp.is_some())
    }
}

impl Selector {
    fn matches(&self, facts: &Facts<'_>, key: &mut Vec<u8>) -> bool {
        if !self.methods.is_empty()
            && !self
                .methods
                .iter()
                .any(|(m, invert)| (m.as_str() == facts.method) != *invert)
        {
            return false;
        }
        if let Some((path, invert)) = &self.path {
            if path.matches(facts.path) == *invert {
                return false;
            }
        }
        if let Some(mcp) = &self.mcp {
            if !facts.mcp.is_some_and(|call| mcp.matches(&call)) {
                return false;
            }
        }
        if let Some(source) = &self.source {
            let addr = crate::upstream::address::canonical_ip(facts.client.addr);
            if source.net.contains(&addr) == source.invert {
                return false;
            }
            if source.distinct {
                push_part(key, b'a', addr_bytes(addr).as_slice());
            }
        }
        if let Some(clients) = &self.clients {
            if !clients
                .set
                .as_ref()
                .is_none_or(|s| s.contains(&facts.client))
            {
                return false;
            }
            if clients.distinct {
                push_identity(key, &facts.client);
            }
        }
        self.headers.iter().all(|h| h.matches(facts.headers, key))
    }
}

impl HeaderMatch {
    fn matches(&self, headers: Option<&HeaderMap>, key: &mut Vec<u8>) -> bool {
        let value = headers.and_then(|h| h.get(&self.name));
        match (&self.value, value) {
            (ValueMatch::Distinct, Some(v)) => {
                push_part(key, b'h', v.as_bytes());
                true
            }
            (ValueMatch::Distinct, None) => false,
            (ValueMatch::Exact(want), v) => {
                v.is_some_and(|v| v.as_bytes() == &**want) != self.invert
            }
            (ValueMatch::Regex(re), v) => {
                v.and_then(|v| v.to_str().ok())
                    .is_some_and(|v| re.is_match(v))
                    != self.invert
            }
        }
    }
}

impl PathMatch {
    fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => **p == *path,
            PathMatch::Prefix(p) => {
                path.starts_with(&**p) && matches!(path.as_bytes().get(p.len()), None | Some(b'/'))
            }
            PathMatch::Regex(re) => re.is_match(path),
        }
    }
}

impl McpMatch {
    fn matches(&self, call: &McpCall<'_>) -> bool {
        let method = self.methods.is_empty()
            || call
                .method
                .is_some_and(|m| self.methods.iter().any(|w| **w == *m));
        let tool = self.tools.is_empty()
            || call.tool.is_some_and(|t| {
                self.tools.iter().any(|(name, prefix)| {
                    if *prefix {
                        t.starts_with(&**name)
                    } else {
                        **name == *t
                    }
                })
            });
        method && tool
    }
}

/// A distinct part of a key: a tag, the length, the bytes (so no two different lists of
/// values make the same key).
fn push_part(key: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    key.push(tag);
    key.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    key.extend_from_slice(bytes);
}

fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The client's identity as a distinct value: its SPIFFE ID, else its certificate's subject,
/// else its proxy user, else its address.
fn push_identity(key: &mut Vec<u8>, client: &Client<'_>) {
    match (client.tls, client.user) {
        (Some(TlsIdentity::Spiffe(id)), _) => push_part(key, b's', id.as_bytes()),
        (Some(TlsIdentity::Subject(cn)), _) => push_part(key, b'n', cn.as_bytes()),
        (None, Some(user)) => push_part(key, b'u', user.as_bytes()),
        (None, None) => {
            let addr = crate::upstream::address::canonical_ip(client.addr);
            push_part(key, b'a', addr_bytes(addr).as_slice());
        }
    }
}
