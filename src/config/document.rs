//! One YAML document → one typed object: the envelope (`apiVersion`, `kind`, `metadata`) is
//! checked, the object named as well as it can be, and its `spec` deserialized with every error
//! collected.

use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::error::{Diagnostic, ObjectId};
use super::load::Loaded;
use super::wire::common::ObjectMeta;
use super::wire::enums::take_alias_uses;
use super::wire::{Kind, Labels, Object, KINDS_NOT_YET_SUPPORTED};
use super::yaml::{self, Node, Pos};
use crate::names::is_dns_subdomain;

const TOP_LEVEL_FIELDS: [&str; 4] = ["apiVersion", "kind", "metadata", "spec"];

/// Errors reported for one object at most; beyond this, fixing what is shown comes first.
const MAX_ERRORS_PER_OBJECT: usize = 50;

/// Loads one document of `file` into `loaded`: its object when it is valid, and every
/// diagnostic either way.
pub(super) fn load_document(file: &Arc<Path>, doc: &Node, loaded: &mut Loaded) {
    let diags = &mut loaded.diagnostics;
    let yaml::Value::Map(entries) = &doc.value else {
        diags.push(
            Diagnostic::error(
                &**file,
                doc.pos,
                format!("expected an object, found a {}", doc.kind_name()),
            )
            .hint("each document needs apiVersion, kind, metadata and spec"),
        );
        return;
    };
    let envelope = Envelope {
        file,
        doc,
        // Reported once the object is known, so the error names it.
        unknown_keys: entries
            .iter()
            .map(|(key, _)| key)
            .filter(|key| !TOP_LEVEL_FIELDS.contains(&key.as_str().unwrap_or("")))
            .collect(),
    };
    let Some(kind) = envelope.kind(diags) else {
        return;
    };
    if matches!(kind, Kind::Secret | Kind::ConfigMap) {
        return super::secrets::load_document(file, doc, kind, loaded);
    }
    let (id, meta, mut ok) = envelope.metadata(kind, diags);
    ok &= envelope.check_api_version(kind, &id, diags);
    let Some(spec) = doc.get("spec") else {
        diags.push(Diagnostic::error(&**file, doc.pos, "missing field `spec`").object(&id));
        return;
    };
    let base = Base {
        file,
        doc,
        id,
        meta,
        ok,
    };
    base.push_kind(kind, spec, loaded);
}

/// A document that is a map, and its top-level keys that no kind has.
struct Envelope<'a> {
    file: &'a Arc<Path>,
    doc: &'a Node,
    unknown_keys: Vec<&'a Node>,
}

impl Envelope<'_> {
    /// The error for a top-level key that is not one of [`TOP_LEVEL_FIELDS`].
    fn unknown_key_error(&self, key: &Node) -> Diagnostic {
        let name = key.as_str().unwrap_or("");
        let hint = if name == "status" {
            "status is written by egressd (see `egressd validate` and /status); remove it"
        } else {
            "a document has only apiVersion, kind, metadata and spec"
        };
        Diagnostic::error(&**self.file, key.pos, format!("unknown field `{name}`")).hint(hint)
    }

    /// Reports unknown top-level keys of a document that did not get far enough to name its
    /// object.
    fn flush_unknown(&self, diags: &mut Vec<Diagnostic>) {
        diags.extend(self.unknown_keys.iter().map(|k| self.unknown_key_error(k)));
    }

    /// The document's kind; `None` (reported, with the unknown keys) when it is missing, not
    /// a kind, or a kind this build does not support.
    fn kind(&self, diags: &mut Vec<Diagnostic>) -> Option<Kind> {
        let Some(kind_node) = self.doc.get("kind") else {
            diags.push(
                Diagnostic::error(&**self.file, self.doc.pos, "missing field `kind`")
                    .hint(format!("one of: {}", kind_names())),
            );
            self.flush_unknown(diags);
            return None;
        };
        let kind_name = kind_node.as_str().unwrap_or("");
        let kind = Kind::from_name(kind_name);
        if kind.is_none() {
            let (message, hint) = if KINDS_NOT_YET_SUPPORTED.contains(&kind_name) {
                (
                    format!("kind `{kind_name}` is not supported yet"),
                    "remove it; supported kinds: ".to_owned() + &kind_names(),
                )
            } else {
                (
                    format!("unknown kind `{kind_name}`"),
                    format!("one of: {}", kind_names()),
                )
            };
            diags.push(Diagnostic::error(&**self.file, kind_node.pos, message).hint(hint));
            self.flush_unknown(diags);
        }
        kind
    }

    /// The object's id and metadata, and whether they are valid. A broken `metadata` still
    /// names the object as well as it can, and the rest of the document is still checked: one
    /// run reports every error of an object. Reports the metadata's errors, the unknown keys
    /// and invalid names, in that order.
    fn metadata(&self, kind: Kind, diags: &mut Vec<Diagnostic>) -> (ObjectId, ObjectMeta, bool) {
        let (meta, meta_errors) = self.parse_metadata(kind);
        let meta_ok = meta_errors.is_empty();
        let id = self.identity(kind, &meta, meta_ok);
        let mut ok = meta_ok;
        for d in meta_errors {
            diags.push(d.object(&id));
        }
        for key in &self.unknown_keys {
            diags.push(self.unknown_key_error(key).object(&id));
            ok = false;
        }
        if meta_ok {
            ok &= self.check_names(&id, &meta, diags);
        }
        (id, meta, ok)
    }

    /// `metadata` deserialized (the default when it is missing or broken) and its errors.
    fn parse_metadata(&self, kind: Kind) -> (ObjectMeta, Vec<Diagnostic>) {
        let file = &**self.file;
        match self.doc.get("metadata") {
            None => {
                let missing = Diagnostic::error(
                    file,
                    self.doc.pos,
                    format!("{} has no `metadata`", kind.name()),
                )
                .hint("add `metadata: {name: ...}`");
                (ObjectMeta::default(), vec![missing])
            }
            Some(node) => match yaml::from_node_all(node, MAX_ERRORS_PER_OBJECT) {
                Ok(meta) => (meta, Vec::new()),
                Err(errors) => {
                    let errors = errors.into_iter().map(|e| {
                        Diagnostic::error(file, e.pos, e.message)
                            .field(join_path("metadata", &e.path))
                    });
                    (ObjectMeta::default(), errors.collect())
                }
            },
        }
    }

    /// The object's id: from the valid `metadata`, or else from what is written in it.
    fn identity(&self, kind: Kind, meta: &ObjectMeta, meta_ok: bool) -> ObjectId {
        if meta_ok {
            return ObjectId {
                kind: shared_name(kind.name()),
                namespace: meta
                    .namespace
                    .as_deref()
                    .map_or_else(|| shared_name("default"), Arc::from),
                name: meta.name.as_str().into(),
            };
        }
        let written = |field: &str| {
            self.doc
                .get("metadata")
                .and_then(|n| n.get(field))
                .and_then(Node::scalar_text)
                .map(std::borrow::Cow::into_owned)
        };
        ObjectId {
            kind: shared_name(kind.name()),
            namespace: written("namespace").map_or_else(|| shared_name("default"), Arc::from),
            name: written("name")
                .unwrap_or_else(|| "<unnamed>".to_owned())
                .into(),
        }
    }

    /// Reports a name or namespace that is not a DNS subdomain; true when both are.
    fn check_names(&self, id: &ObjectId, meta: &ObjectMeta, diags: &mut Vec<Diagnostic>) -> bool {
        let Some(node) = self.doc.get("metadata") else {
            return true;
        };
        let mut ok = true;
        for (field, value) in [
            ("name", Some(&*id.name)),
            ("namespace", meta.namespace.as_deref()),
        ] {
            if let Some(value) = value {
                if !is_dns_subdomain(value) {
                    let pos = node.get(field).map_or(node.pos, |n| n.pos);
                    diags.push(
                        Diagnostic::error(&**self.file, pos, format!("invalid {field} `{value}`"))
                            .object(id)
                            .field(format!("metadata.{field}"))
                            .hint("use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (at most 253 characters)"),
                    );
                    ok = false;
                }
            }
        }
        ok
    }

    /// Reports a missing `apiVersion` or one that does not serve `kind`; true when it does.
    fn check_api_version(&self, kind: Kind, id: &ObjectId, diags: &mut Vec<Diagnostic>) -> bool {
        let file = &**self.file;
        let hint = format!("use `apiVersion: {}`", kind.api_versions()[0]);
        match self.doc.get("apiVersion") {
            None => {
                diags.push(
                    Diagnostic::error(file, self.doc.pos, "missing field `apiVersion`")
                        .object(id)
                        .hint(hint),
                );
                false
            }
            Some(node) => {
                let version = node.as_str().unwrap_or("");
                if kind.api_versions().contains(&version) {
                    return true;
                }
                diags.push(
                    Diagnostic::error(
                        file,
                        node.pos,
                        format!("apiVersion `{version}` does not serve kind {}", kind.name()),
                    )
                    .object(id)
                    .hint(hint),
                );
                false
            }
        }
    }
}

/// What every kind shares while its spec is deserialized.
pub(super) struct Base<'a> {
    file: &'a Arc<Path>,
    doc: &'a Node,
    id: ObjectId,
    meta: ObjectMeta,
    ok: bool,
}

impl Base<'_> {
    /// Deserializes `spec` as `kind`'s and adds the object to its list in `loaded`.
    fn push_kind(self, kind: Kind, spec: &Node, loaded: &mut Loaded) {
        let (diags, set) = (&mut loaded.diagnostics, &mut loaded.set);
        match kind {
            Kind::Gateway => self.push(spec, diags, &mut set.gateways),
            Kind::HttpRoute => self.push(spec, diags, &mut set.http_routes),
            Kind::TlsRoute => self.push(spec, diags, &mut set.tls_routes),
            Kind::Backend => self.push(spec, diags, &mut set.backends),
            Kind::BackendTrafficPolicy => self.push(spec, diags, &mut set.policies),
            Kind::ProxyConfig => self.push(spec, diags, &mut set.proxy_configs),
            Kind::EgressPolicy => self.push(spec, diags, &mut set.egress_policies),
            Kind::XBackend => super::xbackend::push(self, spec, loaded),
            Kind::Secret | Kind::ConfigMap => {} // read by `secrets`: they have no `spec`
        }
    }

    pub(super) fn push<S: DeserializeOwned>(
        self,
        spec: &Node,
        diags: &mut Vec<Diagnostic>,
        out: &mut Vec<Arc<Object<S>>>,
    ) {
        let parsed = yaml::from_node_all::<S>(spec, MAX_ERRORS_PER_OBJECT);
        // Collecting every error deserializes the spec more than once: each alias use is
        // recorded once per attempt.
        let mut uses = take_alias_uses();
        uses.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        uses.dedup();
        for (written, canonical, pos) in uses {
            // Point at the value when its position is known, else at the document.
            let pos = if pos == Pos::default() {
                self.doc.pos
            } else {
                pos
            };
            diags.push(
                Diagnostic::warning(
                    &**self.file,
                    pos,
                    format!("`{written}` is an alias of `{canonical}`"),
                )
                .object(&self.id)
                .hint(format!("write `{canonical}`")),
            );
        }
        match parsed {
            Ok(spec) if self.ok => out.push(Arc::new(Object {
                id: self.id,
                labels: (!self.meta.labels.is_empty() || !self.meta.annotations.is_empty()).then(
                    || {
                        Box::new(Labels {
                            labels: self.meta.labels,
                            annotations: self.meta.annotations,
                        })
                    },
                ),
                namespace_written: self.meta.namespace.is_some(),
                file: self.file.clone(),
                pos: self.doc.pos,
                spec,
            })),
            Ok(_) => {}
            Err(errors) => {
                let capped = errors.len() >= MAX_ERRORS_PER_OBJECT;
                diags.extend(errors.into_iter().map(|e| {
                    Diagnostic::error(&**self.file, e.pos, e.message)
                        .object(&self.id)
                        .field(join_path("spec", &e.path))
                        .hint(
                            "see `egressd schema` or the config reference in docs/configuration.md",
                        )
                }));
                if capped {
                    diags.push(
                        Diagnostic::warning(
                            &**self.file,
                            self.doc.pos,
                            format!(
                                "only the first {MAX_ERRORS_PER_OBJECT} errors of this object \
                                 are shown"
                            ),
                        )
                        .object(&self.id)
                        .hint("fix these and validate again"),
                    );
                }
            }
        }
    }
}

/// One shared string per kind name and for the `default` namespace: every object's id holds
/// them, and 20,000 copies of `Backend` and `default` were 20,000 allocations each.
fn shared_name(name: &'static str) -> Arc<str> {
    static NAMES: std::sync::LazyLock<Vec<Arc<str>>> = std::sync::LazyLock::new(|| {
        Kind::ALL
            .iter()
            .map(|k| Arc::from(k.name()))
            .chain([Arc::from("default")])
            .collect()
    });
    NAMES
        .iter()
        .find(|n| &n[..] == name)
        .cloned()
        .unwrap_or_else(|| Arc::from(name))
}

fn join_path(prefix: &str, path: &str) -> String {
    if path.is_empty() {
        prefix.to_owned()
    } else if path.starts_with('[') {
        format!("{prefix}{path}")
    } else {
        format!("{prefix}.{path}")
    }
}

fn kind_names() -> String {
    Kind::ALL
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}
