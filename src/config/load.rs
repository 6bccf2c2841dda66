//! Reading config directories: files → YAML documents → typed objects.
//!
//! Every problem of every file is collected (not only the first), so one run of
//! `egressd validate` shows everything that needs fixing.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::error::{Diagnostic, ObjectId};
use super::files;
use super::limits::{show_bytes, LoadLimits};
use super::wire::backend::BackendSpec;
use super::wire::common::ObjectMeta;
use super::wire::egress_policy::EgressPolicySpec;
use super::wire::enums::take_alias_uses;
use super::wire::gateway::GatewaySpec;
use super::wire::policy::BackendTrafficPolicySpec;
use super::wire::proxy::ProxyConfigSpec;
use super::wire::route::HttpRouteSpec;
use super::wire::secret::KeyedData;
use super::wire::tls_route::TlsRouteSpec;
use super::wire::xbackend::XBackendSpec;
use super::wire::{Kind, Labels, Object, KINDS_NOT_YET_SUPPORTED};
use super::yaml::{self, Node, Pos};
use crate::names::is_dns_subdomain;

/// Every object of a config, grouped by kind, in file order.
#[derive(Clone, Debug, Default)]
///
/// Objects are shared (`Arc`): a reload reuses the objects of every file whose bytes did not
/// change (see [`LoadCache`]) instead of parsing it again.
pub struct ConfigSet {
    pub gateways: Vec<Arc<Object<GatewaySpec>>>,
    pub http_routes: Vec<Arc<Object<HttpRouteSpec>>>,
    pub tls_routes: Vec<Arc<Object<TlsRouteSpec>>>,
    pub backends: Vec<Arc<Object<BackendSpec>>>,
    pub policies: Vec<Arc<Object<BackendTrafficPolicySpec>>>,
    pub proxy_configs: Vec<Arc<Object<ProxyConfigSpec>>>,
    pub egress_policies: Vec<Arc<Object<EgressPolicySpec>>>,
    /// The XBackends as written (for `/config`); each is in `backends` too, mapped.
    pub xbackends: Vec<Arc<Object<XBackendSpec>>>,
    /// The Secrets and ConfigMaps (`id.kind` tells them apart).
    pub secrets: Vec<Arc<Object<KeyedData>>>,
    /// The YAML files that were read.
    pub files: Vec<PathBuf>,
    /// Hash of every file's path and content: equal fingerprints mean nothing changed.
    pub fingerprint: u64,
}

/// The outcome of reading config paths: the objects that parsed, and every diagnostic.
#[derive(Debug, Default)]
pub struct Loaded {
    pub set: ConfigSet,
    pub diagnostics: Vec<Diagnostic>,
}

impl Loaded {
    /// Adds what one file gave (its objects shared, not copied).
    fn extend(&mut self, file: &Loaded) {
        let (to, from) = (&mut self.set, &file.set);
        to.gateways.extend(from.gateways.iter().cloned());
        to.http_routes.extend(from.http_routes.iter().cloned());
        to.tls_routes.extend(from.tls_routes.iter().cloned());
        to.backends.extend(from.backends.iter().cloned());
        to.policies.extend(from.policies.iter().cloned());
        to.proxy_configs.extend(from.proxy_configs.iter().cloned());
        to.egress_policies
            .extend(from.egress_policies.iter().cloned());
        to.xbackends.extend(from.xbackends.iter().cloned());
        to.secrets.extend(from.secrets.iter().cloned());
        self.diagnostics.extend(file.diagnostics.iter().cloned());
    }
}

/// What each file gave the previous load, by path: a reload parses again only the files whose
/// bytes changed, and shares the objects of the others (a SIGHUP over 10,000 Backends in ten
/// unchanged files parses nothing). Entries of files no longer read are dropped.
#[derive(Debug, Default)]
pub struct LoadCache {
    files: HashMap<PathBuf, (u64, Arc<Loaded>)>,
}

/// Reads every `*.yaml`/`*.yml` file of the given directories (or single files), within the
/// process's [`LoadLimits`].
///
/// Directories are read non-recursively; hidden entries are skipped, which also skips the
/// `..data`/`..<timestamp>` machinery of Kubernetes ConfigMap volumes (their files are reached
/// through the visible per-key symlinks).
pub fn load_paths(paths: &[PathBuf]) -> Loaded {
    load_paths_with(paths, &LoadLimits::current())
}

/// [`load_paths`] within explicit limits.
pub fn load_paths_with(paths: &[PathBuf], limits: &LoadLimits) -> Loaded {
    load_paths_cached(paths, limits, &mut LoadCache::default())
}

/// [`load_paths_with`], reusing what `cache` holds for files whose bytes did not change, and
/// leaving in it what this load read.
pub fn load_paths_cached(paths: &[PathBuf], limits: &LoadLimits, cache: &mut LoadCache) -> Loaded {
    let mut previous = std::mem::take(&mut cache.files);
    let mut loaded = Loaded::default();
    let mut hasher = DefaultHasher::new();
    let mut total: u64 = 0;
    'paths: for path in paths {
        let listed = files::list(path, &mut loaded.diagnostics);
        for (i, file) in listed.iter().enumerate() {
            let opened = match files::open(file) {
                Ok(opened) => opened,
                Err(d) => {
                    loaded.diagnostics.push(*d);
                    continue;
                }
            };
            if total.saturating_add(opened.size) > limits.max_total_bytes {
                let skipped = listed.len() - i - 1;
                loaded.diagnostics.push(
                    Diagnostic::error(
                        file,
                        Pos::default(),
                        format!(
                            "the config is larger than {} in all: this file (and {skipped} \
                             more in this directory, and any other config path) was not read",
                            show_bytes(limits.max_total_bytes)
                        ),
                    )
                    .hint("remove files that do not belong, or raise --max-config-size"),
                );
                break 'paths;
            }
            let text = match opened.read(file, limits.max_file_bytes) {
                Ok(text) => text,
                Err(d) => {
                    loaded.diagnostics.push(*d);
                    continue;
                }
            };
            total = total.saturating_add(text.len() as u64);
            let text_hash = {
                let mut h = DefaultHasher::new();
                text.hash(&mut h);
                h.finish()
            };
            file.hash(&mut hasher);
            text_hash.hash(&mut hasher);
            let this_file = match previous.remove(file) {
                Some((hash, cached)) if hash == text_hash => cached,
                _ => {
                    let mut this_file = Loaded::default();
                    load_file(file, &text, limits, &mut this_file);
                    Arc::new(this_file)
                }
            };
            loaded.extend(&this_file);
            cache.files.insert(file.clone(), (text_hash, this_file));
            loaded.set.files.push(file.clone());
        }
    }
    loaded.set.fingerprint = hasher.finish();
    check_duplicates(&mut loaded);
    loaded
}

pub use files::is_config_file;

/// Loads one file's `text` as [`load_paths_with`] loads each file it reads, without touching
/// the file system: the fuzz targets (`fuzz/`) drive the loader and the compiler with it.
pub fn load_text(file: &Path, text: &str, limits: &LoadLimits) -> Loaded {
    let mut loaded = Loaded::default();
    let mut hasher = DefaultHasher::new();
    file.hash(&mut hasher);
    text.hash(&mut hasher);
    load_file(file, text, limits, &mut loaded);
    loaded.set.files.push(file.to_owned());
    loaded.set.fingerprint = hasher.finish();
    check_duplicates(&mut loaded);
    loaded
}

fn load_file(file: &Path, text: &str, limits: &LoadLimits, loaded: &mut Loaded) {
    if text.trim().is_empty() {
        // Not an error (a placeholder file is legitimate), but `: > file` on a running
        // egressd must not go unnoticed: it removes whatever the file declared.
        loaded.diagnostics.push(
            Diagnostic::warning(file, Pos::default(), "file is empty: it declares nothing")
                .hint("if it was truncated by mistake, restore it; otherwise delete it"),
        );
        return;
    }
    let file: Arc<Path> = Arc::from(file);
    let docs = match yaml::parse_documents_with(text, limits.parse()) {
        Ok(docs) => docs,
        Err(e) if e.limit.is_some() => {
            let hint = match e.limit {
                Some(yaml::Limit::Copies) => {
                    "nothing in this file was loaded; use fewer or smaller aliases, \
                     or raise --max-config-alias-expansion"
                }
                _ => "nothing in this file was loaded; nest less deeply",
            };
            loaded
                .diagnostics
                .push(Diagnostic::error(&*file, e.pos, e.message).hint(hint));
            return;
        }
        Err(e) => {
            loaded.diagnostics.push(
                Diagnostic::error(&*file, e.pos, format!("YAML syntax error: {}", e.message))
                    .hint("fix the YAML syntax; nothing in this file was loaded"),
            );
            return;
        }
    };
    for doc in &docs {
        take_alias_uses();
        load_document(&file, doc, loaded);
    }
}

/// Reports unknown top-level keys of a document that did not get far enough to name its object.
fn flush_unknown(diags: &mut Vec<Diagnostic>, keys: &[&Node], error: &dyn Fn(&Node) -> Diagnostic) {
    diags.extend(keys.iter().map(|k| error(k)));
}

const TOP_LEVEL_FIELDS: [&str; 4] = ["apiVersion", "kind", "metadata", "spec"];

/// Errors reported for one object at most; beyond this, fixing what is shown comes first.
const MAX_ERRORS_PER_OBJECT: usize = 50;

fn load_document(file: &Arc<Path>, doc: &Node, loaded: &mut Loaded) {
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
    let mut ok = true;
    // Reported once the object is known, so the error names it.
    let unknown_keys: Vec<&Node> = entries
        .iter()
        .map(|(key, _)| key)
        .filter(|key| !TOP_LEVEL_FIELDS.contains(&key.as_str().unwrap_or("")))
        .collect();
    let unknown_key_error = |key: &Node| {
        let name = key.as_str().unwrap_or("");
        let hint = if name == "status" {
            "status is written by egressd (see `egressd validate` and /status); remove it"
        } else {
            "a document has only apiVersion, kind, metadata and spec"
        };
        Diagnostic::error(&**file, key.pos, format!("unknown field `{name}`")).hint(hint)
    };

    let Some(kind_node) = doc.get("kind") else {
        diags.push(
            Diagnostic::error(&**file, doc.pos, "missing field `kind`")
                .hint(format!("one of: {}", kind_names())),
        );
        return flush_unknown(diags, &unknown_keys, &unknown_key_error);
    };
    let kind_name = kind_node.as_str().unwrap_or("");
    let Some(kind) = Kind::from_name(kind_name) else {
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
        diags.push(Diagnostic::error(&**file, kind_node.pos, message).hint(hint));
        return flush_unknown(diags, &unknown_keys, &unknown_key_error);
    };
    if matches!(kind, Kind::Secret | Kind::ConfigMap) {
        return super::secrets::load_document(file, doc, kind, loaded);
    }

    // A broken `metadata` still names the object as well as it can, and the rest of the
    // document is still checked: one run reports every error of an object.
    let meta_node = doc.get("metadata");
    let mut meta_errors = Vec::new();
    let meta: ObjectMeta = match meta_node {
        None => {
            meta_errors.push(
                Diagnostic::error(
                    &**file,
                    doc.pos,
                    format!("{} has no `metadata`", kind.name()),
                )
                .hint("add `metadata: {name: ...}`"),
            );
            ObjectMeta::default()
        }
        Some(node) => match yaml::from_node_all(node, MAX_ERRORS_PER_OBJECT) {
            Ok(meta) => meta,
            Err(errors) => {
                meta_errors.extend(errors.into_iter().map(|e| {
                    Diagnostic::error(&**file, e.pos, e.message)
                        .field(join_path("metadata", &e.path))
                }));
                ObjectMeta::default()
            }
        },
    };
    let meta_ok = meta_errors.is_empty();
    let written = |field: &str| {
        meta_node
            .and_then(|n| n.get(field))
            .and_then(Node::scalar_text)
            .map(std::borrow::Cow::into_owned)
    };
    let id = if meta_ok {
        ObjectId {
            kind: shared_name(kind.name()),
            namespace: meta
                .namespace
                .as_deref()
                .map_or_else(|| shared_name("default"), Arc::from),
            name: meta.name.as_str().into(),
        }
    } else {
        ObjectId {
            kind: shared_name(kind.name()),
            namespace: written("namespace").map_or_else(|| shared_name("default"), Arc::from),
            name: written("name")
                .unwrap_or_else(|| "<unnamed>".to_owned())
                .into(),
        }
    };
    ok &= meta_ok;
    for d in meta_errors {
        diags.push(d.object(&id));
    }
    for key in &unknown_keys {
        diags.push(unknown_key_error(key).object(&id));
        ok = false;
    }
    if let Some(node) = meta_node.filter(|_| meta_ok) {
        for (field, value) in [
            ("name", Some(&*id.name)),
            ("namespace", meta.namespace.as_deref()),
        ] {
            if let Some(value) = value {
                if !is_dns_subdomain(value) {
                    let pos = node.get(field).map_or(node.pos, |n| n.pos);
                    diags.push(
                        Diagnostic::error(&**file, pos, format!("invalid {field} `{value}`"))
                            .object(&id)
                            .field(format!("metadata.{field}"))
                            .hint("use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (at most 253 characters)"),
                    );
                    ok = false;
                }
            }
        }
    }

    match doc.get("apiVersion") {
        None => {
            diags.push(
                Diagnostic::error(&**file, doc.pos, "missing field `apiVersion`")
                    .object(&id)
                    .hint(format!("use `apiVersion: {}`", kind.api_versions()[0])),
            );
            ok = false;
        }
        Some(node) => {
            let version = node.as_str().unwrap_or("");
            if !kind.api_versions().contains(&version) {
                diags.push(
                    Diagnostic::error(
                        &**file,
                        node.pos,
                        format!("apiVersion `{version}` does not serve kind {}", kind.name()),
                    )
                    .object(&id)
                    .hint(format!("use `apiVersion: {}`", kind.api_versions()[0])),
                );
                ok = false;
            }
        }
    }

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
    match kind {
        Kind::Gateway => base.push(spec, &mut loaded.diagnostics, &mut loaded.set.gateways),
        Kind::HttpRoute => base.push(spec, &mut loaded.diagnostics, &mut loaded.set.http_routes),
        Kind::TlsRoute => base.push(spec, &mut loaded.diagnostics, &mut loaded.set.tls_routes),
        Kind::Backend => base.push(spec, &mut loaded.diagnostics, &mut loaded.set.backends),
        Kind::BackendTrafficPolicy => {
            base.push(spec, &mut loaded.diagnostics, &mut loaded.set.policies)
        }
        Kind::ProxyConfig => {
            base.push(spec, &mut loaded.diagnostics, &mut loaded.set.proxy_configs)
        }
        Kind::EgressPolicy => base.push(
            spec,
            &mut loaded.diagnostics,
            &mut loaded.set.egress_policies,
        ),
        Kind::XBackend => super::xbackend::push(base, spec, loaded),
        Kind::Secret | Kind::ConfigMap => {} // read above: they have no `spec`
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

/// A duplicate identity (group, kind, namespace, name) is an error naming both places. An
/// XBackend is a Backend here (both are reached by the same namespace/name).
fn check_duplicates(loaded: &mut Loaded) {
    let mut seen: HashMap<(&str, &str, &str), (Arc<Path>, Pos)> = HashMap::new();
    let set = &loaded.set;
    let all = set
        .gateways
        .iter()
        .map(|o| (&o.id, &o.file, o.pos))
        .chain(set.http_routes.iter().map(|o| (&o.id, &o.file, o.pos)))
        .chain(set.tls_routes.iter().map(|o| (&o.id, &o.file, o.pos)))
        .chain(set.backends.iter().map(|o| (&o.id, &o.file, o.pos)))
        .chain(set.policies.iter().map(|o| (&o.id, &o.file, o.pos)))
        .chain(set.proxy_configs.iter().map(|o| (&o.id, &o.file, o.pos)))
        .chain(set.egress_policies.iter().map(|o| (&o.id, &o.file, o.pos)))
        .chain(set.secrets.iter().map(|o| (&o.id, &o.file, o.pos)));
    let mut dups = Vec::new();
    for (id, file, pos) in all {
        let kind = if &*id.kind == "XBackend" {
            "Backend"
        } else {
            &id.kind
        };
        let key = (kind, &*id.namespace, &*id.name);
        if let Some((first_file, first_pos)) = seen.get(&key) {
            dups.push(
                Diagnostic::error(&**file, pos, format!("duplicate object {id}"))
                    .object(id)
                    .hint(format!(
                        "first defined at {}:{}; rename one of them",
                        first_file.display(),
                        first_pos
                    )),
            );
        } else {
            seen.insert(key, (file.clone(), pos));
        }
    }
    loaded.diagnostics.extend(dups);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(name: &str) -> String {
        format!(
            "apiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\n\
             spec:\n  destination: {{type: IP, ip: {{endpoints: [{{address: 127.0.0.1}}]}}, \
             ports: [{{number: 80}}]}}\n  protocol: HTTP11\n  tls: {{mode: InsecureDisable}}\n"
        )
    }

    fn names(loaded: &Loaded) -> Vec<&str> {
        loaded.set.backends.iter().map(|b| b.name()).collect()
    }

    /// `metadata` comes back as written (for `/config`) though only labels and annotations
    /// are kept besides the id.
    #[test]
    fn metadata_is_given_back_as_written() {
        let text = format!(
            "{}---\n{}",
            backend("plain"),
            backend("tagged").replace(
                "metadata: {name: tagged}",
                "metadata: {name: tagged, namespace: team, labels: {app: x}, annotations: {a: b}}"
            )
        );
        let loaded = load_text(Path::new("x.yaml"), &text, &LoadLimits::default());
        assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
        let (plain, tagged) = (&loaded.set.backends[0], &loaded.set.backends[1]);
        assert!(plain.labels.is_none());
        let meta = serde_json::to_value(plain.meta()).unwrap();
        assert_eq!(meta, serde_json::json!({"name": "plain"}));
        let meta = serde_json::to_value(tagged.meta()).unwrap();
        assert_eq!(
            meta,
            serde_json::json!({"name": "tagged", "namespace": "team", "labels": {"app": "x"},
                "annotations": {"a": "b"}})
        );
    }

    /// A reload shares the objects of files whose bytes did not change, parses the changed
    /// ones again, forgets removed ones, and keeps each file's warnings.
    #[test]
    fn unchanged_files_are_not_parsed_again() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a.yaml"),
            dir.path().join("b.yaml"),
            dir.path().join("c.yaml"),
        );
        std::fs::write(&a, backend("a")).unwrap();
        std::fs::write(&b, backend("b")).unwrap();
        std::fs::write(&c, "").unwrap(); // a warning: "file is empty"
        let (paths, limits) = (vec![dir.path().to_owned()], LoadLimits::default());
        let mut cache = LoadCache::default();
        let first = load_paths_cached(&paths, &limits, &mut cache);
        assert_eq!(names(&first), ["a", "b"]);
        assert_eq!(first.diagnostics.len(), 1, "{:?}", first.diagnostics);

        std::fs::write(&b, backend("b2")).unwrap();
        let second = load_paths_cached(&paths, &limits, &mut cache);
        assert_eq!(names(&second), ["a", "b2"]);
        assert!(Arc::ptr_eq(&first.set.backends[0], &second.set.backends[0]));
        assert_eq!(second.diagnostics.len(), 1, "{:?}", second.diagnostics);
        assert_ne!(first.set.fingerprint, second.set.fingerprint);

        std::fs::remove_file(&a).unwrap();
        let third = load_paths_cached(&paths, &limits, &mut cache);
        assert_eq!(names(&third), ["b2"]);
        assert!(Arc::ptr_eq(&second.set.backends[1], &third.set.backends[0]));
        assert_eq!(cache.files.len(), 2);
        // Without a cache, the same objects and fingerprint.
        let fresh = load_paths_with(&paths, &limits);
        assert_eq!(names(&fresh), ["b2"]);
        assert_eq!(fresh.set.fingerprint, third.set.fingerprint);
    }
}
