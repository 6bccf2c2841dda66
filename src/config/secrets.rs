//! Reading `Secret` and `ConfigMap` documents (core `v1`) exactly as `kubectl get -o yaml`
//! writes them, so that Kubernetes manifests can be dropped into a config directory.
//!
//! Unlike egressd's own kinds, their `metadata` is taken leniently (what the API server adds —
//! `uid`, `resourceVersion`, `creationTimestamp`, `managedFields`, ... — is accepted and
//! ignored) and their content sits beside `metadata`: a Secret's `type`, `data` (base64) and
//! `stringData` (plain text, winning over `data`), a ConfigMap's `data` (plain text) and
//! `binaryData` (base64). Any other top-level field is an error, as everywhere. Values are
//! decoded here and never appear in a message: errors name the key and its position.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;

use super::error::{Diagnostic, ObjectId};
use super::load::Loaded;
use super::wire::secret::{DataEntry, KeyedData};
use super::wire::{Kind, Labels, Object};
use super::yaml::{Node, Pos, Spanned};
use crate::names::is_dns_subdomain;

/// Top-level fields of each kind (Kubernetes' own, all optional but `metadata`).
fn fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Secret => &[
            "apiVersion",
            "kind",
            "metadata",
            "type",
            "data",
            "stringData",
            "immutable",
        ],
        _ => &[
            "apiVersion",
            "kind",
            "metadata",
            "data",
            "binaryData",
            "immutable",
        ],
    }
}

/// How a field's values are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Base64,
    Text,
}

/// Loads one Secret or ConfigMap document into `loaded`.
pub(super) fn load_document(file: &Arc<Path>, doc: &Node, kind: Kind, loaded: &mut Loaded) {
    let meta = doc.get("metadata");
    let text = |field: &str| {
        meta.and_then(|m| m.get(field))
            .and_then(|n| n.as_str().map(|s| (s.to_owned(), n.pos)))
    };
    let name = text("name");
    let namespace = text("namespace");
    let id = ObjectId {
        kind: kind.name().into(),
        namespace: namespace
            .as_ref()
            .map_or_else(|| "default".into(), |(ns, _)| ns.as_str().into()),
        name: name
            .as_ref()
            .map_or_else(|| "<unnamed>".into(), |(n, _)| n.as_str().into()),
    };
    let mut reading = Reading {
        file,
        doc,
        kind,
        id,
        diags: Vec::new(),
    };
    reading.check_metadata(meta, &name, &namespace);
    reading.check_api_version();
    reading.check_fields();
    let data = reading.data();
    let Reading { id, diags, .. } = reading;
    loaded.diagnostics.extend(diags);
    // An object with a bad value is kept: a reference to it then says what is wrong with the
    // key it needs rather than "not found". The config is refused all the same.
    if name.is_some() {
        let labels = meta
            .map(kept_labels)
            .filter(|l| !l.labels.is_empty() || !l.annotations.is_empty());
        loaded.set.secrets.push(Arc::new(Object {
            id,
            labels: labels.map(Box::new),
            namespace_written: namespace.is_some(),
            file: file.clone(),
            pos: doc.pos,
            spec: data,
        }));
    }
}

/// A `metadata` field's text and position.
type Written = Option<(String, Pos)>;

/// One Secret or ConfigMap document being read, and the problems found so far (each about
/// the object `id`).
struct Reading<'a> {
    file: &'a Arc<Path>,
    doc: &'a Node,
    kind: Kind,
    id: ObjectId,
    diags: Vec<Diagnostic>,
}

impl Reading<'_> {
    /// An error at `pos` of this document's file.
    fn error(&self, pos: Pos, message: String) -> Diagnostic {
        Diagnostic::error(&**self.file, pos, message)
    }

    /// Records `d` as a problem of this object.
    fn fail(&mut self, d: Diagnostic) {
        self.diags.push(d.object(&self.id));
    }

    /// `metadata` and its `name` must be there; the name and namespace must be DNS names.
    fn check_metadata(&mut self, meta: Option<&Node>, name: &Written, namespace: &Written) {
        match (meta, name) {
            (None, _) => self.fail(
                self.error(
                    self.doc.pos,
                    format!("{} has no `metadata`", self.kind.name()),
                )
                .hint("add `metadata: {name: ...}`"),
            ),
            (Some(m), None) => self.fail(
                self.error(m.pos, "missing field `metadata.name`".to_owned())
                    .field("metadata.name"),
            ),
            _ => {}
        }
        for (field, value) in [("name", name), ("namespace", namespace)] {
            if let Some((value, pos)) = value.as_ref().filter(|(v, _)| !is_dns_subdomain(v)) {
                self.fail(
                    self.error(*pos, format!("invalid {field} `{value}`"))
                        .field(format!("metadata.{field}"))
                        .hint("use lower-case letters, digits, '-' and '.'"),
                );
            }
        }
    }

    /// `apiVersion` must be `v1`.
    fn check_api_version(&mut self) {
        let doc = self.doc;
        match doc
            .get("apiVersion")
            .map(|n| (n.as_str().unwrap_or(""), n.pos))
        {
            Some(("v1", _)) => {}
            Some((other, pos)) => self.fail(
                self.error(
                    pos,
                    format!(
                        "apiVersion `{other}` does not serve kind {}",
                        self.kind.name()
                    ),
                )
                .hint("use `apiVersion: v1`"),
            ),
            None => self.fail(
                self.error(doc.pos, "missing field `apiVersion`".into())
                    .hint("use `apiVersion: v1`"),
            ),
        }
    }

    /// Every top-level field must be one of the kind's [`fields`].
    fn check_fields(&mut self) {
        let kind = self.kind;
        for (key, _) in self.doc.as_map().unwrap_or_default() {
            let written = key.as_str().unwrap_or("");
            if !fields(kind).contains(&written) {
                self.fail(
                    self.error(key.pos, format!("unknown field `{written}`"))
                        .hint(format!(
                            "a {} has only {}",
                            kind.name(),
                            fields(kind).join(", ")
                        )),
                );
            }
        }
    }

    /// The keyed content: a Secret's `type`, then each data section in the order Kubernetes
    /// merges them (`stringData` last, over `data`).
    fn data(&mut self) -> KeyedData {
        let mut data = KeyedData::default();
        if self.kind == Kind::Secret {
            if let Some(t) = self.doc.get("type") {
                match t.as_str() {
                    Some(s) => data.secret_type = Some(Spanned::new(t.pos, s.to_owned())),
                    None => self.fail(
                        self.error(t.pos, "`type` must be a string".into())
                            .field("type"),
                    ),
                }
            }
        }
        let sections: &[(&str, Encoding)] = match self.kind {
            Kind::Secret => &[("data", Encoding::Base64), ("stringData", Encoding::Text)],
            _ => &[("data", Encoding::Text), ("binaryData", Encoding::Base64)],
        };
        for (section, encoding) in sections {
            self.read_section(section, *encoding, &mut data);
        }
        data
    }

    /// Adds the entries of `section` (a map of keys to strings, absent or null for none).
    fn read_section(&mut self, section: &str, encoding: Encoding, data: &mut KeyedData) {
        let Some(node) = self.doc.get(section) else {
            return;
        };
        if matches!(node.value, super::yaml::Value::Null) {
            return;
        }
        let Some(entries) = node.as_map() else {
            self.fail(
                self.error(
                    node.pos,
                    format!("`{section}` must be a mapping of keys to strings"),
                )
                .field(section),
            );
            return;
        };
        for (key, value) in entries {
            let key_text = key.scalar_text().unwrap_or_default().into_owned();
            let field = format!("{section}.{key_text}");
            let Some(text) = value.as_str() else {
                // Never the value itself in the message: it may be the secret.
                self.fail(
                    self.error(
                        value.pos,
                        format!("`{field}` must be a string, found a {}", value.kind_name()),
                    )
                    .field(field),
                );
                continue;
            };
            let bytes = self.value_bytes(section, encoding, &field, value.pos, text);
            data.entries.insert(
                key_text,
                DataEntry {
                    pos: value.pos,
                    bytes,
                },
            );
        }
    }

    /// The bytes of the value `text` of `field` (`None`, reported, when it is not base64 and
    /// should be).
    fn value_bytes(
        &mut self,
        section: &str,
        encoding: Encoding,
        field: &str,
        pos: Pos,
        text: &str,
    ) -> Option<Arc<[u8]>> {
        match encoding {
            Encoding::Text => Some(Arc::from(text.as_bytes())),
            Encoding::Base64 => match decode(text) {
                Some(bytes) => Some(Arc::from(bytes)),
                None => {
                    let plain = if self.kind == Kind::Secret {
                        "stringData"
                    } else {
                        "data"
                    };
                    self.fail(
                        self.error(pos, format!("`{field}` is not valid base64"))
                            .field(field)
                            .hint(format!("`{section}` values are base64 (as kubectl writes them); put plain text under `{plain}`")),
                    );
                    None
                }
            },
        }
    }
}

/// Base64 as Kubernetes writes it (standard alphabet, padded); line breaks, which some tools
/// fold long values with, are ignored.
fn decode(text: &str) -> Option<Vec<u8>> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()
}

/// `metadata.labels` and `annotations` that are plain string maps (the rest is ignored).
fn kept_labels(meta: &Node) -> Labels {
    let strings = |field: &str| {
        meta.get(field)
            .and_then(Node::as_map)
            .unwrap_or_default()
            .iter()
            .filter_map(|(k, v)| Some((k.scalar_text()?.into_owned(), v.as_str()?.to_owned())))
            .collect()
    };
    Labels {
        labels: strings("labels"),
        annotations: strings("annotations"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::limits::LoadLimits;
    use super::*;

    fn load(text: &str) -> Loaded {
        super::super::load::load_text(Path::new("s.yaml"), text, &LoadLimits::default())
    }

    /// `kubectl get secret -o yaml` output, server-side fields and all.
    const KUBECTL_SECRET: &str = r#"apiVersion: v1
data:
  ca.crt: Y2E=
  tls.crt: Y2VydA==
  tls.key: a2V5
kind: Secret
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"v1","kind":"Secret"}
  creationTimestamp: "2026-11-20T10:00:00Z"
  labels:
    app: egressd
  managedFields:
  - apiVersion: v1
    fieldsType: FieldsV1
    fieldsV1:
      f:data: {}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2026-11-20T10:00:00Z"
  name: client
  namespace: team-a
  resourceVersion: "4242"
  uid: 3f1c2a4e-0000-4000-8000-000000000001
type: kubernetes.io/tls
"#;

    #[test]
    fn kubectl_output_loads() {
        let loaded = load(KUBECTL_SECRET);
        assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
        let s = &loaded.set.secrets[0];
        assert_eq!(s.id.to_string(), "Secret team-a/client");
        assert_eq!(s.spec.secret_type(), "kubernetes.io/tls");
        let bytes = |k: &str| s.spec.entries[k].bytes.as_deref().map(<[u8]>::to_vec);
        assert_eq!(bytes("tls.crt"), Some(b"cert".to_vec()));
        assert_eq!(bytes("ca.crt"), Some(b"ca".to_vec()));
    }

    #[test]
    fn string_data_wins_and_config_maps_hold_text() {
        let loaded = load(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: YQ==}\nstringData: {k: b}\n\
             ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {ca.crt: plain}\n",
        );
        assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
        let (s, c) = (&loaded.set.secrets[0], &loaded.set.secrets[1]);
        assert_eq!(s.spec.entries["k"].bytes.as_deref(), Some(&b"b"[..]));
        assert_eq!(s.spec.secret_type(), "Opaque");
        assert_eq!(c.id.kind.as_ref(), "ConfigMap");
        assert_eq!(
            c.spec.entries["ca.crt"].bytes.as_deref(),
            Some(&b"plain"[..])
        );
    }

    /// Bad base64 and unknown fields are positioned errors that never quote the value; the
    /// object is kept so that references to it can say what is wrong.
    #[test]
    fn mistakes_are_positioned_and_quote_no_value() {
        let loaded = load(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata:\n  tls.key: not*base64*SECRET\nspec: {}\n",
        );
        let shown: Vec<String> = loaded.diagnostics.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(shown.iter().any(|d| d.starts_with("s.yaml:5:12: error: Secret default/s: data.tls.key: `data.tls.key` is not valid base64")), "{shown:?}");
        assert!(
            shown
                .iter()
                .any(|d| d.contains("6:1") && d.contains("unknown field `spec`")),
            "{shown:?}"
        );
        assert!(shown.iter().all(|d| !d.contains("SECRET")), "{shown:?}");
        assert!(loaded.set.secrets[0].spec.entries["tls.key"]
            .bytes
            .is_none());
    }
}
