//! `EgressPolicy` objects compiled into what a request is judged by: which policies cover a
//! destination, whether a client is one they list, and the decision.
//!
//! A destination that some policies cover is reachable only by the clients those policies
//! list; one no policy covers follows `ProxyConfig.spec.clientPolicy.default`. `Report`
//! policies change nothing: the decision is taken with the `Enforce` policies alone, and a
//! client they let through but that would be refused with every policy enforced is reported
//! ("would deny").

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use foldhash::fast::RandomState as FastHash;
use ipnet::IpNet;

use super::identity::{Client, TlsIdentity};
use crate::names::hostname_matches;
use crate::upstream::address::canonical_ip;

/// Names of one kind of identity a policy lists: exact, or by prefix (`ns/payments/*`).
#[derive(Debug, Default)]
pub(crate) struct Names {
    exact: HashSet<Box<str>>,
    prefixes: Vec<Box<str>>,
}

impl Names {
    /// Adds `pattern`: a prefix when it ends in `*`, else an exact name.
    pub(crate) fn add(&mut self, pattern: &str) {
        match pattern.strip_suffix('*') {
            Some(prefix) => self.prefixes.push(prefix.into()),
            None => {
                self.exact.insert(pattern.into());
            }
        }
    }

    fn matches(&self, name: &str) -> bool {
        self.exact.contains(name) || self.prefixes.iter().any(|p| name.starts_with(&**p))
    }
}

/// The clients one policy lets through.
#[derive(Debug, Default)]
pub(crate) struct ClientSet {
    pub(crate) spiffe_ids: Names,
    pub(crate) subject_names: Names,
    pub(crate) proxy_users: Names,
    /// Canonical networks.
    pub(crate) cidrs: Vec<IpNet>,
}

impl ClientSet {
    /// Whether `client` matches any entry.
    pub(crate) fn contains(&self, client: &Client<'_>) -> bool {
        let tls = match client.tls {
            Some(TlsIdentity::Spiffe(id)) => self.spiffe_ids.matches(id),
            Some(TlsIdentity::Subject(cn)) => self.subject_names.matches(cn),
            None => false,
        };
        tls || client.user.is_some_and(|u| self.proxy_users.matches(u))
            || (!self.cidrs.is_empty() && {
                let addr = canonical_ip(client.addr);
                self.cidrs.iter().any(|net| net.contains(&addr))
            })
    }
}

/// One `EgressPolicy`.
#[derive(Debug)]
pub(crate) struct Rule {
    /// `namespace/name`.
    pub(crate) name: Arc<str>,
    /// `mode: Report`.
    pub(crate) report: bool,
    pub(crate) clients: ClientSet,
}

/// What a request's destination is, as policies name it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Destination<'a> {
    /// The Backend's `namespace/name`, when a Backend serves it.
    pub(crate) backend: Option<&'a str>,
    /// The destination hostname: the Backend's `fqdn.hostname`, or the undeclared host.
    pub(crate) host: Option<&'a str>,
}

/// The decision for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict<'p> {
    Allow,
    /// Refused by the `Enforce` policy named (`None`: by `clientPolicy.default: Deny`).
    Deny {
        policy: Option<&'p str>,
        /// When the default refused although a `Report` policy covers the destination: that
        /// policy (a `Report` policy decides nothing, so the default does, for every client).
        report_only: Option<&'p str>,
    },
    /// Let through, but the `Report` policy named would refuse it.
    WouldDeny {
        policy: &'p str,
    },
}

/// Every `EgressPolicy` and the default, indexed by what they cover.
#[derive(Debug, Default)]
pub(crate) struct ClientPolicy {
    /// `clientPolicy.default: Deny`.
    pub(crate) default_deny: bool,
    /// Sorted by name: the first covering policy is the one a refusal names.
    rules: Vec<Rule>,
    // Looked up per request: a fast hash (keys come from the config, not from clients).
    by_backend: HashMap<Box<str>, Vec<u32>, FastHash>,
    by_host: HashMap<Box<str>, Vec<u32>, FastHash>,
    /// `*.suffix` patterns and their policy.
    wildcard_hosts: Vec<(Box<str>, u32)>,
}

/// What one policy covers, as compiled.
#[derive(Debug, Default)]
pub(crate) struct Covers {
    /// Backends' `namespace/name`.
    pub(crate) backends: Vec<String>,
    /// Hostnames, lower case, exact or `*.suffix`.
    pub(crate) hostnames: Vec<String>,
}

impl ClientPolicy {
    /// The policy set of `rules` (each with what it covers) and the default.
    pub(crate) fn new(default_deny: bool, mut rules: Vec<(Rule, Covers)>) -> ClientPolicy {
        rules.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let mut policy = ClientPolicy {
            default_deny,
            ..ClientPolicy::default()
        };
        for (i, (rule, covers)) in rules.into_iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            for backend in covers.backends {
                policy.by_backend.entry(backend.into()).or_default().push(i);
            }
            for host in covers.hostnames {
                if host.starts_with("*.") {
                    policy.wildcard_hosts.push((host.into(), i));
                } else {
                    policy.by_host.entry(host.into()).or_default().push(i);
                }
            }
            policy.rules.push(rule);
        }
        // Each list is in policy order already; a policy naming a Backend twice counts once.
        for list in policy
            .by_backend
            .values_mut()
            .chain(policy.by_host.values_mut())
        {
            list.dedup();
        }
        policy
    }

    /// Whether an `EgressPolicy` named `name` (`namespace/name`) is part of this config, and
    /// in which mode (`Some(true)`: Report).
    pub(crate) fn mode_of(&self, name: &str) -> Option<bool> {
        self.rules
            .binary_search_by(|r| (*r.name).cmp(name))
            .ok()
            .map(|i| self.rules[i].report)
    }

    /// The policies covering `dest`, in name order, without repeats. The usual case, one
    /// index list (the Backend's, or the host's), is borrowed: nothing is allocated.
    fn covering(&self, dest: Destination<'_>) -> Cow<'_, [u32]> {
        let by_backend = dest.backend.and_then(|b| self.by_backend.get(b));
        let by_host = dest.host.and_then(|h| self.by_host.get(h));
        let any_wildcard = dest
            .host
            .is_some_and(|h| self.wildcard_covering(h).next().is_some());
        match (by_backend, by_host, any_wildcard) {
            (None, None, false) => Cow::Borrowed(&[]),
            (Some(list), None, false) | (None, Some(list), false) => Cow::Borrowed(list),
            _ => {
                let mut found: Vec<u32> = Vec::new();
                found.extend(by_backend.into_iter().flatten());
                found.extend(by_host.into_iter().flatten());
                if let Some(host) = dest.host {
                    found.extend(self.wildcard_covering(host));
                }
                found.sort_unstable();
                found.dedup();
                Cow::Owned(found)
            }
        }
    }

    /// The policies whose `*.suffix` hostnames cover `host`.
    fn wildcard_covering<'a>(&'a self, host: &'a str) -> impl Iterator<Item = u32> + 'a {
        self.wildcard_hosts
            .iter()
            .filter(move |(pattern, _)| hostname_matches(pattern, host))
            .map(|(_, i)| *i)
    }

    /// Whether `client` may reach `dest`.
    pub(crate) fn decide(&self, dest: Destination<'_>, client: &Client<'_>) -> Verdict<'_> {
        let covering = self.covering(dest);
        let rule = |i: &u32| &self.rules[*i as usize];
        let listed = |i: &&u32| rule(i).clients.contains(client);
        let mut enforce = covering.iter().filter(|i| !rule(i).report).peekable();
        let allowed = match enforce.peek() {
            None => !self.default_deny,
            Some(_) => enforce.clone().any(|i| listed(&i)),
        };
        if !allowed {
            let policy = enforce.next().map(|i| &*rule(i).name);
            let report_only = covering
                .iter()
                .find(|i| policy.is_none() && rule(i).report)
                .map(|i| &*rule(i).name);
            return Verdict::Deny {
                policy,
                report_only,
            };
        }
        // As if every policy were enforced.
        let would_allow = if covering.is_empty() {
            !self.default_deny
        } else {
            covering.iter().any(|i| listed(&i))
        };
        if would_allow {
            return Verdict::Allow;
        }
        match covering.iter().find(|i| rule(i).report) {
            Some(i) => Verdict::WouldDeny {
                policy: &rule(i).name,
            },
            None => Verdict::Allow,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn rule(name: &str, report: bool, spiffe: &[&str], cidrs: &[&str]) -> Rule {
        let mut clients = ClientSet::default();
        for s in spiffe {
            clients.spiffe_ids.add(s);
        }
        clients.cidrs = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        Rule {
            name: name.into(),
            report,
            clients,
        }
    }

    fn covers(backends: &[&str], hostnames: &[&str]) -> Covers {
        Covers {
            backends: backends.iter().map(|s| s.to_string()).collect(),
            hostnames: hostnames.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn spiffe(id: &str) -> TlsIdentity {
        TlsIdentity::Spiffe(id.into())
    }

    #[test]
    fn a_covered_destination_is_for_the_listed_clients_only() {
        let policy = ClientPolicy::new(
            false,
            vec![(
                rule("default/pay", false, &["spiffe://td/ns/payments/*"], &[]),
                covers(&["default/stripe"], &["*.stripe.com"]),
            )],
        );
        let payments = spiffe("spiffe://td/ns/payments/sa/api");
        let web = spiffe("spiffe://td/ns/web/sa/api");
        let addr: IpAddr = "10.0.0.1".parse().unwrap();
        let client = |tls| Client {
            addr,
            tls,
            user: None,
        };
        let stripe = Destination {
            backend: Some("default/stripe"),
            host: Some("api.stripe.com"),
        };
        assert_eq!(
            policy.decide(stripe, &client(Some(&payments))),
            Verdict::Allow
        );
        assert_eq!(
            policy.decide(stripe, &client(Some(&web))),
            Verdict::Deny {
                policy: Some("default/pay"),
                report_only: None,
            }
        );
        // Covered by the wildcard hostname alone (an undeclared destination).
        let undeclared = Destination {
            backend: None,
            host: Some("files.stripe.com"),
        };
        assert!(matches!(
            policy.decide(undeclared, &client(Some(&web))),
            Verdict::Deny { .. }
        ));
        // Not covered: the default.
        let github = Destination {
            backend: Some("default/github"),
            host: Some("api.github.com"),
        };
        assert_eq!(policy.decide(github, &client(None)), Verdict::Allow);
        let closed = ClientPolicy::new(true, Vec::new());
        assert_eq!(
            closed.decide(github, &client(None)),
            Verdict::Deny {
                policy: None,
                report_only: None,
            }
        );
    }

    #[test]
    fn report_policies_let_through_and_say_what_they_would_refuse() {
        let policy = ClientPolicy::new(
            false,
            vec![
                (
                    rule("default/trial", true, &[], &["10.1.0.0/16"]),
                    covers(&["default/api"], &[]),
                ),
                (
                    rule("default/other", false, &[], &["10.2.0.0/16"]),
                    covers(&["default/db"], &[]),
                ),
            ],
        );
        let api = Destination {
            backend: Some("default/api"),
            host: None,
        };
        let from = |a: &str| Client {
            addr: a.parse().unwrap(),
            tls: None,
            user: None,
        };
        assert_eq!(policy.decide(api, &from("10.1.2.3")), Verdict::Allow);
        assert_eq!(
            policy.decide(api, &from("10.9.9.9")),
            Verdict::WouldDeny {
                policy: "default/trial"
            }
        );
        // IPv4-mapped source addresses are the IPv4 address.
        assert_eq!(policy.decide(api, &from("::ffff:10.1.2.3")), Verdict::Allow);
        // Under `default: Deny`, a Report policy decides nothing: the default refuses every
        // client, listed or not, and the verdict names the Report policy.
        let closed = ClientPolicy::new(
            true,
            vec![(
                rule("default/trial", true, &[], &["10.1.0.0/16"]),
                covers(&["default/api"], &[]),
            )],
        );
        assert_eq!(
            closed.decide(api, &from("10.1.2.3")),
            Verdict::Deny {
                policy: None,
                report_only: Some("default/trial"),
            }
        );
    }

    #[test]
    fn any_enforcing_policy_that_lists_the_client_lets_it_through() {
        let mut users = rule("default/b-users", false, &[], &[]);
        users.clients.proxy_users.add("alice");
        let policy = ClientPolicy::new(
            false,
            vec![
                (
                    rule("default/a-spiffe", false, &["spiffe://td/x"], &[]),
                    covers(&["default/api"], &[]),
                ),
                (users, covers(&["default/api"], &[])),
            ],
        );
        let api = Destination {
            backend: Some("default/api"),
            host: None,
        };
        let alice = Client {
            addr: "127.0.0.1".parse().unwrap(),
            tls: None,
            user: Some("alice"),
        };
        assert_eq!(policy.decide(api, &alice), Verdict::Allow);
        let bob = Client {
            user: Some("bob"),
            ..alice
        };
        assert_eq!(
            policy.decide(api, &bob),
            Verdict::Deny {
                policy: Some("default/a-spiffe"),
                report_only: None,
            },
            "the refusal names the first policy by name"
        );
    }
}
