//! `*Ref` fields → the PEM material of the `Secret`s and `ConfigMap`s they name: listener
//! `certificateRefs`, `clientCertificateRef` and `validation.caCertificateRefs`.
//!
//! A reference names `{group: "", kind, name, namespace}` (namespace: the referrer's by
//! default). Every way it can fail — no such object, a Secret of the wrong type, a key missing
//! or not base64 — is an error at the reference that names the object and where it is written;
//! PEM that does not parse is reported when the TLS config is built, naming the same. No
//! message ever holds a value.

use std::collections::HashMap;
use std::sync::Arc;

use super::{At, Cx};
use crate::config::wire::backend::CredentialSecretRef;
use crate::config::wire::common::SecretRef;
use crate::config::wire::secret::{KeyedData, TLS_SECRET_TYPE};
use crate::config::wire::Object;
use crate::config::{ConfigSet, ObjectId};
use crate::upstream::pem::{read_certs, read_key, PemError, PemSource};

/// The Secrets and ConfigMaps of a config, by `(kind, namespace, name)`.
#[derive(Default)]
pub(crate) struct Secrets {
    by_id: HashMap<ObjectId, Arc<Object<KeyedData>>>,
}

impl Secrets {
    pub(crate) fn new(set: &ConfigSet) -> Secrets {
        Secrets {
            by_id: set
                .secrets
                .iter()
                .map(|o| (o.id.clone(), o.clone()))
                .collect(),
        }
    }

    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Arc<Object<KeyedData>>> {
        let id = ObjectId {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        self.by_id.get(&id).cloned()
    }
}

/// When the certificates the config's Secrets and ConfigMaps hold expire (`tls.crt` and
/// `ca.crt` keys; the earliest `notAfter` of each), labelled `Secret ns/name tls.crt`: the
/// series of `egressd_certificate_expiry_seconds` next to the certificate files'. Every such
/// key counts, referenced or not: a Secret is in the config directories to be used.
pub(crate) fn certificate_expiries(set: &ConfigSet) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for o in &set.secrets {
        for name in ["tls.crt", "ca.crt"] {
            let Some(bytes) = o.spec.entries.get(name).and_then(|e| e.bytes.clone()) else {
                continue;
            };
            let source = PemSource::inline(String::new(), String::new(), bytes);
            if let Some(expiry) = crate::upstream::pem::earliest_expiry(&source) {
                let label = format!("{} {}/{} {name}", o.id.kind, o.id.namespace, o.id.name);
                out.push((label, expiry));
            }
        }
    }
    out
}

/// What a reference is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// `tls.crt` and `tls.key` of a `kubernetes.io/tls` Secret.
    Certificate,
    /// `ca.crt` of a ConfigMap or a Secret.
    Ca,
    /// One key of a Secret of any type (a credential).
    Value,
}

/// The value of one key of a Secret (any type), with how messages name it (`Secret ns/name
/// key `credential` (file:line:col)`); `None` when the reference cannot be used (reported at
/// `at`).
pub(crate) fn secret_value(
    cx: &mut Cx,
    at: At<'_>,
    r: &CredentialSecretRef,
    referrer_namespace: &str,
) -> Option<(Arc<[u8]>, String)> {
    let as_ref = SecretRef {
        group: r.group.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
        namespace: r.namespace.clone(),
    };
    let object = find(cx, &at, &as_ref, referrer_namespace, Use::Value)?;
    let name = r.key.as_deref().unwrap_or("credential");
    let (label, written_at, bytes) = entry(cx, &at, &object, name)?;
    Some((bytes, format!("{label} ({written_at})")))
}

/// A certificate chain and its key from a `kubernetes.io/tls` Secret; `None` when the
/// reference cannot be used (reported at `at`).
pub(crate) fn certificate(
    cx: &mut Cx,
    at: At<'_>,
    r: &SecretRef,
    referrer_namespace: &str,
) -> Option<(PemSource, PemSource)> {
    let object = find(cx, &at, r, referrer_namespace, Use::Certificate)?;
    let cert = key(cx, &at, &object, "tls.crt");
    let key = key(cx, &at, &object, "tls.key");
    let (cert, key) = (cert?, key?);
    // Parsed here too (and again when the TLS config is built) so that PEM that does not
    // parse is reported at the reference.
    let parsed = read_certs(&cert)
        .map(drop)
        .and_then(|()| read_key(&key).map(drop));
    pem_checked(cx, &at, parsed)?;
    Some((cert, key))
}

fn pem_checked(cx: &mut Cx, at: &At<'_>, parsed: Result<(), PemError>) -> Option<()> {
    parsed
        .map_err(|e| {
            cx.error(
                at.clone(),
                e.to_string(),
                "the value must be PEM: `-----BEGIN ...-----` lines around base64",
            );
        })
        .ok()
}

/// A CA bundle: `ca.crt` of a ConfigMap (the default kind) or a Secret.
pub(crate) fn ca_bundle(
    cx: &mut Cx,
    at: At<'_>,
    r: &SecretRef,
    referrer_namespace: &str,
) -> Option<PemSource> {
    let object = find(cx, &at, r, referrer_namespace, Use::Ca)?;
    let bundle = key(cx, &at, &object, "ca.crt")?;
    pem_checked(cx, &at, read_certs(&bundle).map(drop))?;
    Some(bundle)
}

/// `Secret team-a/client (certs.yaml:3:1)`: how messages name an object.
fn describe(o: &Object<KeyedData>) -> String {
    format!(
        "{} {}/{} ({}:{})",
        o.id.kind,
        o.id.namespace,
        o.id.name,
        o.file.display(),
        o.pos
    )
}

/// The object a reference names, checked for kind and type.
fn find(
    cx: &mut Cx,
    at: &At<'_>,
    r: &SecretRef,
    referrer_namespace: &str,
    purpose: Use,
) -> Option<Arc<Object<KeyedData>>> {
    let default_kind = match purpose {
        Use::Certificate | Use::Value => "Secret",
        Use::Ca => "ConfigMap",
    };
    let kind = r.kind.as_deref().unwrap_or(default_kind);
    let group = r.group.as_deref().unwrap_or("");
    let kinds_ok = match purpose {
        Use::Certificate | Use::Value => kind == "Secret",
        Use::Ca => kind == "Secret" || kind == "ConfigMap",
    };
    if !group.is_empty() || !kinds_ok {
        let wanted = match purpose {
            Use::Certificate | Use::Value => "a Secret (`kind: Secret`, core group)",
            Use::Ca => "a ConfigMap or a Secret (`kind: ConfigMap` or `Secret`, core group)",
        };
        let g = if group.is_empty() { "core" } else { group };
        cx.error(
            at.clone(),
            format!(
                "reference to {kind} `{}` in group `{g}`: this field takes {wanted}",
                r.name
            ),
            "omit group; write kind Secret or ConfigMap",
        );
        return None;
    }
    let namespace = r.namespace.as_deref().unwrap_or(referrer_namespace);
    let Some(object) = cx.secrets.get(kind, namespace, &r.name) else {
        cx.missing_ref(
            at.clone(),
            format!("{kind} {namespace}/{} not found", r.name),
            format!(
                "add a {kind} document (apiVersion: v1) named `{}` in namespace `{namespace}` to the config directory",
                r.name
            ),
        );
        return None;
    };
    if purpose == Use::Certificate && object.spec.secret_type() != TLS_SECRET_TYPE {
        let pos = object
            .spec
            .secret_type
            .as_ref()
            .map_or(object.pos, |t| t.pos);
        cx.error(
            at.clone(),
            format!(
                "{} has type `{}`, and a certificate needs a Secret of type {TLS_SECRET_TYPE} (type at {}:{pos})",
                describe(&object),
                object.spec.secret_type(),
                object.file.display()
            ),
            "create it with `kubectl create secret tls`, or set `type: kubernetes.io/tls`",
        );
        return None;
    }
    Some(object)
}

/// One key's PEM, named by the object and the key's position.
fn key(cx: &mut Cx, at: &At<'_>, o: &Object<KeyedData>, name: &str) -> Option<PemSource> {
    let (label, written_at, bytes) = entry(cx, at, o, name)?;
    Some(PemSource::inline(label, written_at, bytes))
}

/// One key's bytes, with the label and position messages name it by.
fn entry(
    cx: &mut Cx,
    at: &At<'_>,
    o: &Object<KeyedData>,
    name: &str,
) -> Option<(String, String, Arc<[u8]>)> {
    let Some(entry) = o.spec.entries.get(name) else {
        let keys: Vec<&str> = o.spec.entries.keys().map(String::as_str).collect();
        cx.missing_ref(
            at.clone(),
            format!("{} has no key `{name}`", describe(o)),
            match name {
                "ca.crt" => "put the CA certificates (PEM) under `ca.crt`".to_owned(),
                "tls.crt" | "tls.key" => {
                    "a kubernetes.io/tls Secret holds `tls.crt` (PEM chain) and `tls.key` (PEM key)"
                        .to_owned()
                }
                _ => format!(
                    "name the key with `key:` (the Secret has {})",
                    if keys.is_empty() {
                        "no keys".to_owned()
                    } else {
                        keys.join(", ")
                    }
                ),
            },
        );
        return None;
    };
    let label = format!(
        "{} {}/{} key `{name}`",
        o.id.kind, o.id.namespace, o.id.name
    );
    let written_at = format!("{}:{}", o.file.display(), entry.pos);
    match &entry.bytes {
        Some(bytes) => Some((label, written_at, bytes.clone())),
        None => {
            cx.error(
                at.clone(),
                format!("{label} ({written_at}) is not valid base64"),
                "`data` values are base64; write plain PEM under `stringData` instead",
            );
            None
        }
    }
}
