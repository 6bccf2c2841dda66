//! Destinations egressd refused because nothing declares them (`destination_not_allowed`):
//! how often, first and last seen, and for each a Backend that would allow it — what admin
//! `/blocked` shows, so an operator can see what was blocked and, when it should not have
//! been, paste the Backend into the config directory. Under `outboundPolicy: AuditOnly` the
//! undeclared destinations that were let through are listed the same way, as `audited`.
//!
//! Bounded ([`AuditLimits`], `ProxyConfig.spec.blockedAudit`): at most `maxEntries`
//! destinations are kept (the least recently seen one makes room) and one not seen for
//! `retention` is dropped, so a client trying random hosts cannot grow egressd's memory. Hosts
//! are at most 253 bytes (a longer one is no host name, and never gets here), so the list is
//! bounded in bytes too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::time::rfc3339;

/// How much the audit remembers (`ProxyConfig.spec.blockedAudit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AuditLimits {
    /// Destinations remembered at most.
    pub(crate) max_entries: usize,
    /// How long a destination stays listed after it was last seen.
    pub(crate) retention: Duration,
}

impl Default for AuditLimits {
    fn default() -> Self {
        AuditLimits {
            max_entries: 1024,
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// How the client tried to reach the destination (it decides the suggested Backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Via {
    /// A plain HTTP request (absolute-form URI or `Host`).
    Http,
    /// `CONNECT host:port` (an `HTTPS_PROXY` client tunnelling its own TLS).
    Connect,
    /// The SNI of a TLS connection to a Passthrough listener.
    TlsPassthrough,
}

impl Via {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Via::Http => "http",
            Via::Connect => "connect",
            Via::TlsPassthrough => "tls-passthrough",
        }
    }
}

/// What egressd did with the undeclared destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// Refused (403 or a closed connection).
    Blocked,
    /// Let through under `AuditOnly`: what `RegistryOnly` would have refused.
    Audited,
    /// A declared destination this client may not reach (`EgressPolicy`, 403).
    ClientDenied,
    /// Let through, but a `Report` `EgressPolicy` would refuse this client.
    WouldDeny,
}

impl Action {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Blocked => "blocked",
            Action::Audited => "audited",
            Action::ClientDenied => "client_denied",
            Action::WouldDeny => "would_deny",
        }
    }
}

/// Host, port, how, what egressd did, and the client (empty when the destination itself was
/// refused, whoever asked).
type Key = (String, u16, Via, Action, String);

#[derive(Clone, Debug)]
struct Seen {
    count: u64,
    first: SystemTime,
    last: SystemTime,
    /// The `EgressPolicy` that refused (or would refuse) the client, last time.
    policy: Option<Box<str>>,
}

/// One blocked destination, as `/blocked` shows it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Blocked {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) via: Via,
    pub(crate) action: Action,
    /// The client refused (`client_denied`, `would_deny`), as `Client` shows it.
    pub(crate) client: Option<String>,
    /// The policy that refused it; `None` with a client: `clientPolicy.default`.
    pub(crate) policy: Option<String>,
    pub(crate) count: u64,
    pub(crate) first_seen: SystemTime,
    pub(crate) last_seen: SystemTime,
}

/// The blocked destinations seen since start.
#[derive(Debug, Default)]
pub(crate) struct BlockedDestinations {
    seen: Mutex<HashMap<Key, Seen>>,
}

impl BlockedDestinations {
    /// Counts one refusal (or audited use) of `host` (lower-case) on `port`.
    pub(crate) fn record(
        &self,
        host: &str,
        port: u16,
        via: Via,
        action: Action,
        limits: AuditLimits,
    ) {
        let key = (host.to_owned(), port, via, action, String::new());
        self.record_at(key, None, limits, SystemTime::now());
    }

    /// Counts one client refused (or reported) by an `EgressPolicy`. `client` is bounded by
    /// what an identity can be (a SPIFFE ID is at most 2048 bytes).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_client(
        &self,
        host: &str,
        port: u16,
        via: Via,
        action: Action,
        client: &str,
        policy: Option<&str>,
        limits: AuditLimits,
    ) {
        let key = (host.to_owned(), port, via, action, client.to_owned());
        self.record_at(key, policy, limits, SystemTime::now());
    }

    fn record_at(&self, key: Key, policy: Option<&str>, limits: AuditLimits, now: SystemTime) {
        let host = &key.0;
        if host.len() > crate::names::MAX_HOST_LEN {
            // Not a host name: callers check first; this keeps the bound whatever they do.
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = seen.get_mut(&key) {
            s.count += 1;
            s.last = now;
            if s.policy.as_deref() != policy {
                s.policy = policy.map(Into::into);
            }
            return;
        }
        // A new destination: the expired ones go first (O(n) only when a new key arrives).
        seen.retain(|_, s| !expired(s.last, now, limits.retention));
        let first = Seen {
            count: 1,
            first: now,
            last: now,
            policy: policy.map(Into::into),
        };
        crate::bounded::insert_bounded(&mut seen, limits.max_entries, key, first, |s| s.last);
    }

    /// Every destination remembered, the most recently blocked first.
    /// Forgets the entries `still_refused` says the serving config would not refuse any more
    /// (called with the destination, what was done, and the policy named): after a reload
    /// that declares a blocked host, `/blocked` no longer offers a Backend for it.
    pub(crate) fn forget_unless(
        &self,
        still_refused: impl Fn(&str, u16, Action, Option<&str>) -> bool,
    ) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|(host, port, _, action, _), s| {
            still_refused(host, *port, *action, s.policy.as_deref())
        });
    }

    pub(crate) fn list(&self, limits: AuditLimits) -> Vec<Blocked> {
        self.list_at(limits, SystemTime::now())
    }

    fn list_at(&self, limits: AuditLimits, now: SystemTime) -> Vec<Blocked> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, s| !expired(s.last, now, limits.retention));
        let mut all: Vec<Blocked> = seen
            .iter()
            .map(|((host, port, via, action, client), s)| Blocked {
                host: host.clone(),
                port: *port,
                via: *via,
                action: *action,
                client: (!client.is_empty()).then(|| client.clone()),
                policy: s.policy.as_deref().map(str::to_owned),
                count: s.count,
                first_seen: s.first,
                last_seen: s.last,
            })
            .collect();
        all.sort_by(|a, b| b.last_seen.cmp(&a.last_seen).then(a.host.cmp(&b.host)));
        all
    }
}

/// Whether a destination last seen at `last` is past its retention at `now`.
fn expired(last: SystemTime, now: SystemTime, retention: Duration) -> bool {
    now.duration_since(last).is_ok_and(|age| age > retention)
}

impl Blocked {
    /// A Backend that allows this destination the way the client tried to reach it: plain
    /// HTTP stays plaintext on its port (the client chose it; the comment suggests TLS
    /// origination instead), `CONNECT` and TLS passthrough become a Passthrough TCP port.
    pub(crate) fn backend_yaml(&self) -> String {
        let name = backend_name(&self.host, self.port);
        let (ports, tls, comment) = match self.via {
            Via::Http => (
                format!("[{{number: {}}}]", self.port),
                "{mode: InsecureDisable}",
                "# The client sent plain HTTP, and this Backend keeps it plaintext. To encrypt, let\n# egressd originate TLS: port 443 with the default tls (Simple), the client still\n# sending plain http:// for port 443 to egressd.\n",
            ),
            Via::Connect | Via::TlsPassthrough => (
                format!("[{{number: {}, protocol: TCP}}]", self.port),
                "{mode: Passthrough}",
                "# The client's own TLS passes through to the destination.\n",
            ),
        };
        format!(
            "{comment}apiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata:\n  name: {name}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: {host}}}\n    ports: {ports}\n  tls: {tls}\n",
            host = self.host,
        )
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "host": self.host,
            "port": self.port,
            "via": self.via.as_str(),
            "action": self.action.as_str(),
            "count": self.count,
            "firstSeen": rfc3339(self.first_seen),
            "lastSeen": rfc3339(self.last_seen),
            // A client refused a declared destination needs a policy change, not a Backend.
            "backend": self.client.is_none().then(|| self.backend_yaml()),
            "client": self.client,
            "policy": self.policy,
        })
    }
}

/// A Kubernetes object name for a destination: the host's labels joined by `-`, then the
/// port, at most 63 characters.
fn backend_name(host: &str, port: u16) -> String {
    let mut name: String = host
        .trim_end_matches('.')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let suffix = format!("-{port}");
    name.truncate(63 - suffix.len());
    let name = name.trim_matches('-');
    format!("{name}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_orders_and_forgets_the_least_recent_when_full() {
        let limits = AuditLimits {
            max_entries: 16,
            ..AuditLimits::default()
        };
        let blocked = BlockedDestinations::default();
        blocked.record("a.example", 80, Via::Http, Action::Blocked, limits);
        blocked.record("b.example", 443, Via::Connect, Action::Blocked, limits);
        blocked.record("a.example", 80, Via::Http, Action::Blocked, limits);
        let list = blocked.list(limits);
        assert_eq!(list[0].host, "a.example");
        assert_eq!(list[0].count, 2);
        assert_eq!(list[1].count, 1);
        for i in 0..limits.max_entries {
            let host = format!("h{i}.example");
            blocked.record(&host, 443, Via::Connect, Action::Audited, limits);
        }
        let list = blocked.list(limits);
        assert_eq!(list.len(), limits.max_entries);
        assert!(
            !list.iter().any(|b| b.host == "b.example"),
            "the least recently seen went"
        );
    }

    #[test]
    fn destinations_past_their_retention_leave_and_non_hosts_never_enter() {
        let limits = AuditLimits {
            max_entries: 16,
            retention: Duration::from_secs(60),
        };
        let blocked = BlockedDestinations::default();
        let then = SystemTime::now();
        let key = |host: &str| {
            (
                host.to_owned(),
                80,
                Via::Http,
                Action::Blocked,
                String::new(),
            )
        };
        blocked.record_at(key("old.example"), None, limits, then);
        let later = then + Duration::from_secs(30);
        blocked.record_at(key("new.example"), None, limits, later);
        blocked.record_at(key(&"a".repeat(300)), None, limits, later);
        assert_eq!(blocked.list_at(limits, later).len(), 2);
        let hosts: Vec<String> = blocked
            .list_at(limits, then + Duration::from_secs(61))
            .into_iter()
            .map(|b| b.host)
            .collect();
        assert_eq!(hosts, ["new.example"], "old.example is past its retention");
    }

    #[test]
    fn suggested_backends_match_how_the_client_came() {
        let http = Blocked {
            host: "api.example.com".into(),
            port: 8080,
            via: Via::Http,
            action: Action::Blocked,
            client: None,
            policy: None,
            count: 1,
            first_seen: SystemTime::UNIX_EPOCH,
            last_seen: SystemTime::UNIX_EPOCH,
        };
        let yaml = http.backend_yaml();
        assert!(yaml.contains("name: api-example-com-8080\n"), "{yaml}");
        assert!(yaml.contains("ports: [{number: 8080}]\n  tls: {mode: InsecureDisable}"));
        let tunnel = Blocked {
            via: Via::Connect,
            port: 443,
            ..http
        };
        assert!(tunnel
            .backend_yaml()
            .contains("ports: [{number: 443, protocol: TCP}]\n  tls: {mode: Passthrough}"));
        assert_eq!(backend_name(&"x".repeat(80), 443).len(), 63);
    }
}
