//! Status conditions of every object, derived from the diagnostics of a load (Gateway API
//! style: `Accepted`, `ResolvedRefs`, `Programmed`, `Degraded`, `Conflicted`, `Overridden`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::config::{ConfigSet, Diagnostic, ObjectId, Reason};

/// One condition.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Condition {
    /// Whether the condition says all is well: a positive condition that holds, or a
    /// negative one (`Degraded`, `Conflicted`, `Overridden`) that does not; and
    /// `ConfigRejected`, which says only that another object has errors.
    pub fn is_fine(&self) -> bool {
        let negative = matches!(self.kind, "Degraded" | "Conflicted" | "Overridden");
        (self.status == "True") != negative || self.reason == "ConfigRejected"
    }
}

/// Conditions of one object.
#[derive(Clone, Debug, Serialize)]
pub struct ObjectStatus {
    #[serde(flatten)]
    pub object: ObjectId,
    /// Shared with the object (10,000 objects made 10,000 copies of ten file names).
    #[serde(serialize_with = "display_path")]
    pub file: Arc<Path>,
    pub conditions: Vec<Condition>,
}

fn display_path<S: serde::Serializer>(path: &Arc<Path>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&path.display())
}

/// Conditions of every object of a config.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusReport {
    pub objects: Vec<ObjectStatus>,
}

/// What became of the config whose conditions are derived: its `Programmed` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It is the one serving.
    Serving,
    /// A reload refused it; the config of generation `serving` keeps serving (0: none yet).
    Rejected { serving: u64 },
    /// Only checked (`egressd validate`): applied nowhere, whatever its errors.
    Checked,
}

impl Outcome {
    /// The `Programmed=False` message of a config with errors.
    fn unprogrammed(self) -> String {
        match self {
            Outcome::Rejected { serving: 0 } => {
                "the config has errors; no config is serving yet".to_owned()
            }
            Outcome::Rejected { serving } => {
                format!("the config has errors; generation {serving} keeps serving")
            }
            Outcome::Serving | Outcome::Checked => "the config has errors".to_owned(),
        }
    }
}

impl StatusReport {
    /// Derives every object's conditions; `outcome` says whether this config is the one
    /// serving (not when it was rejected because some object has errors).
    pub(crate) fn build(set: &ConfigSet, diagnostics: &[Diagnostic], outcome: Outcome) -> Self {
        let programmed = outcome == Outcome::Serving
            || (outcome == Outcome::Checked && !diagnostics.iter().any(Diagnostic::is_error));
        // Each object's diagnostics, found in one pass (a scan per object made a config of
        // 10,000 Backends with a warning each take seconds).
        let mut by_object: HashMap<&ObjectId, Vec<&Diagnostic>> = HashMap::new();
        for d in diagnostics {
            if let Some(id) = &d.object {
                by_object.entry(id).or_default().push(d);
            }
        }
        let mut objects = Vec::new();
        let all = set
            .gateways
            .iter()
            .map(|o| (&o.id, &o.file))
            .chain(set.http_routes.iter().map(|o| (&o.id, &o.file)))
            .chain(set.tls_routes.iter().map(|o| (&o.id, &o.file)))
            .chain(set.backends.iter().map(|o| (&o.id, &o.file)))
            .chain(set.policies.iter().map(|o| (&o.id, &o.file)))
            .chain(set.proxy_configs.iter().map(|o| (&o.id, &o.file)))
            .chain(set.egress_policies.iter().map(|o| (&o.id, &o.file)))
            .chain(set.secrets.iter().map(|o| (&o.id, &o.file)));
        for (id, file) in all {
            let mine = by_object.get(id).map_or(&[][..], Vec::as_slice);
            objects.push(ObjectStatus {
                object: id.clone(),
                file: file.clone(),
                conditions: conditions(mine, programmed, outcome),
            });
        }
        StatusReport { objects }
    }
}

fn conditions(diags: &[&Diagnostic], programmed: bool, outcome: Outcome) -> Vec<Condition> {
    let first = |pred: &dyn Fn(&Diagnostic) -> bool| diags.iter().find(|d| pred(d)).copied();
    let mut out = Vec::new();

    let invalid = first(&|d| d.is_error() && d.reason != Some(Reason::RefNotFound));
    out.push(match invalid {
        Some(d) => cond(
            "Accepted",
            false,
            d.reason.map_or("Invalid", Reason::as_str),
            d,
        ),
        None => ok("Accepted", "Accepted"),
    });
    out.push(match first(&|d| d.reason == Some(Reason::RefNotFound)) {
        Some(d) => cond("ResolvedRefs", false, "RefNotFound", d),
        None => ok("ResolvedRefs", "ResolvedRefs"),
    });
    let own_errors = diags.iter().any(|d| d.is_error());
    out.push(if programmed {
        ok("Programmed", "Programmed")
    } else {
        Condition {
            kind: "Programmed",
            status: "False",
            reason: if own_errors {
                "Invalid"
            } else {
                "ConfigRejected"
            },
            message: outcome.unprogrammed(),
        }
    });
    for (kind, reason) in [
        ("Degraded", Reason::Degraded),
        ("Conflicted", Reason::Conflicted),
        ("Overridden", Reason::Overridden),
    ] {
        if let Some(d) = first(&|d| d.reason == Some(reason)) {
            out.push(cond(kind, true, reason.as_str(), d));
        }
    }
    out
}

fn ok(kind: &'static str, reason: &'static str) -> Condition {
    Condition {
        kind,
        status: "True",
        reason,
        message: String::new(),
    }
}

fn cond(kind: &'static str, status: bool, reason: &'static str, d: &Diagnostic) -> Condition {
    Condition {
        kind,
        status: if status { "True" } else { "False" },
        reason,
        message: d.message.clone(),
    }
}
