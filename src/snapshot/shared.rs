//! State shared by every connection, the admin server and the reload loop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use super::{Snapshot, Target};
use crate::config::Diagnostic;
use crate::policy::identity::Client;
use crate::policy::rules::{self, Verdict};
use crate::policy::ClientAccess;
use crate::telemetry::access_log::AccessLog;
use crate::telemetry::blocked::{Action, Via};
use crate::telemetry::metrics::Metrics;

/// The outcome of the last reload attempt, for `/status`.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReloadStatus {
    /// `success`, `failure` or `pending` (nothing loaded yet).
    pub(crate) result: &'static str,
    pub(crate) time: String,
    pub(crate) cause: String,
    /// Generation serving now (0: none).
    pub(crate) generation: u64,
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
    /// Errors and warnings of the last attempt.
    pub(crate) diagnostics: Vec<Diagnostic>,
    /// Errors rendered one per line, as `egressd validate` prints them.
    pub messages: Vec<String>,
    /// When the last attempt failed: the conditions of every object of the rejected config
    /// (e.g. `ResolvedRefs=False` for a certificate file that no longer parses).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) rejected_objects: Vec<crate::config::status::ObjectStatus>,
    /// How long the last successful reload took, from reading the files to the new config
    /// serving (`durationMs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) duration_ms: Option<u64>,
}

/// Shared state. The snapshot is the only thing the hot path reads about config.
#[derive(Debug)]
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub(crate) access_log: AccessLog,
    pub metrics: Metrics,
    /// Destinations refused because nothing declares them (admin `/blocked`).
    pub(crate) blocked_destinations: crate::telemetry::blocked::BlockedDestinations,
    /// Bytes of bodies egressd holds whole now (`bufferedBodies.budget` bounds them).
    pub(crate) buffered_bodies: Arc<crate::bounded::budget::BufferBudget>,
    draining: AtomicBool,
    pub(crate) reload_status: Mutex<ReloadStatus>,
    /// Bound listener addresses by key (ports may be ephemeral), for `/status` and tests.
    pub(crate) bound: Mutex<Vec<(Arc<str>, SocketAddr)>>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::empty()),
            access_log: AccessLog::default(),
            metrics: Metrics::default(),
            blocked_destinations: Default::default(),
            buffered_bodies: Default::default(),
            draining: AtomicBool::new(false),
            reload_status: Mutex::new(ReloadStatus {
                result: "pending",
                ..ReloadStatus::default()
            }),
            bound: Mutex::default(),
        }
    }
}

/// How `/blocked`, the metric and the log name a refusal by `clientPolicy.default: Deny`.
const DEFAULT_POLICY: &str = "clientPolicy.default";

/// A client an `EgressPolicy` (or `clientPolicy.default`) refused.
#[derive(Debug)]
pub(crate) struct ClientRefused {
    /// The client, as logs show it.
    pub(crate) client: String,
    /// Which policy refused it, and why.
    pub(crate) reason: String,
}

impl Shared {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Shared::default())
    }

    /// Records a destination refused because nothing declares it: the audit list, the
    /// metric (host labels capped), and a log line naming it.
    pub(crate) fn blocked(&self, host: &str, port: u16, via: Via) {
        self.undeclared_seen(host, port, via, Action::Blocked);
    }

    /// Records a use of an undeclared destination under `outboundPolicy: AuditOnly`: what
    /// `RegistryOnly` would have refused, listed in `/blocked` as `audited`.
    pub(crate) fn audited(&self, host: &str, port: u16, via: Via) {
        self.undeclared_seen(host, port, via, Action::Audited);
    }

    fn undeclared_seen(&self, host: &str, port: u16, via: Via, action: Action) {
        let limits = self.snapshot.load().settings.blocked_audit;
        self.blocked_destinations
            .record(host, port, via, action, limits);
        match action {
            Action::Blocked => self.metrics.blocked(host),
            Action::Audited => self.metrics.audited(host),
            Action::ClientDenied | Action::WouldDeny => {}
        }
        tracing::debug!(
            host,
            port,
            via = via.as_str(),
            action = action.as_str(),
            "no Backend declares this destination"
        );
    }

    /// Whether `client` may reach `target` (`EgressPolicy`, `clientPolicy.default`). A
    /// refusal, and a client a `Report` policy would refuse, is recorded: `/blocked` with
    /// the client, the metric (client labels capped), and one log line with the decision and
    /// its reason. `host` and `port` are the destination as the client named it.
    pub(crate) fn judge_client(
        &self,
        access: &ClientAccess,
        target: &Target,
        client: &Client<'_>,
        (host, port, via): (&str, u16, Via),
    ) -> Result<(), ClientRefused> {
        let backend = &target.backend;
        let declared = &*backend.label != crate::snapshot::undeclared::LABEL;
        let destination = rules::Destination {
            backend: declared.then_some(&*backend.label),
            // A wildcard Backend's destination is the concrete host asked for.
            host: match backend.hostname.as_deref() {
                Some(pattern) if pattern.starts_with("*.") => Some(host),
                other => other,
            },
        };
        let (action, policy, report_only) = match access.rules.decide(destination, client) {
            Verdict::Allow => return Ok(()),
            Verdict::Deny {
                policy,
                report_only,
            } => (Action::ClientDenied, policy, report_only),
            Verdict::WouldDeny { policy } => (Action::WouldDeny, Some(policy), None),
        };
        let shown = client.to_string();
        let limits = self.snapshot.load().settings.blocked_audit;
        let shown_policy = policy.unwrap_or(DEFAULT_POLICY);
        self.blocked_destinations.record_client(
            host,
            port,
            via,
            action,
            &shown,
            Some(shown_policy),
            limits,
        );
        self.metrics
            .client_policy(shown_policy, action.as_str(), &client.label());
        let reason = match (policy, report_only) {
            (Some(p), _) => format!("EgressPolicy {p} does not list the client"),
            (None, Some(p)) => format!(
                "clientPolicy.default is Deny and decided: EgressPolicy {p} covers the \
                 destination in mode Report, which lets through nothing it lists"
            ),
            (None, None) => {
                "no EgressPolicy covers the destination and clientPolicy.default is Deny".to_owned()
            }
        };
        let decision = match action {
            Action::WouldDeny => "would deny (Report)",
            _ => "deny",
        };
        crate::telemetry::log_limit::limited!(
            info,
            decision,
            client = %shown,
            destination = %format_args!("{host}:{port}"),
            backend = %backend.label,
            policy = shown_policy,
            %reason,
            "client policy: {decision}"
        );
        if action == Action::WouldDeny {
            return Ok(());
        }
        Err(ClientRefused {
            client: shown,
            reason,
        })
    }

    /// Ready: a config serves and we are not draining.
    pub(crate) fn is_ready(&self) -> bool {
        self.snapshot.load().generation > 0 && !self.is_draining()
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn reload_status(&self) -> ReloadStatus {
        self.reload_status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
