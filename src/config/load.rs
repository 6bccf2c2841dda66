//! Reading config directories: files → YAML documents → typed objects.
//!
//! Every problem of every file is collected (not only the first), so one run of
//! `egressd validate` shows everything that needs fixing.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::document::load_document;
use super::error::Diagnostic;
use super::files;
use super::limits::{show_bytes, LoadLimits};
use super::wire::backend::BackendSpec;
use super::wire::egress_policy::EgressPolicySpec;
use super::wire::enums::take_alias_uses;
use super::wire::gateway::GatewaySpec;
use super::wire::policy::BackendTrafficPolicySpec;
use super::wire::proxy::ProxyConfigSpec;
use super::wire::route::HttpRouteSpec;
use super::wire::secret::KeyedData;
use super::wire::tls_route::TlsRouteSpec;
use super::wire::xbackend::XBackendSpec;
use super::wire::Object;
use super::yaml::{self, Pos};

/// Every object of a config, grouped by kind, in file order.
#[derive(Clone, Debug, Default)]
///
/// Objects are shared (`Arc`): a reload reuses the objects of every file whose bytes did not
/// change (see [`LoadCache`]) instead of parsing it again.
pub struct ConfigSet {
    pub gateways: Vec<Arc<Object<GatewaySpec>>>,
    pub(crate) http_routes: Vec<Arc<Object<HttpRouteSpec>>>,
    pub(crate) tls_routes: Vec<Arc<Object<TlsRouteSpec>>>,
    pub backends: Vec<Arc<Object<BackendSpec>>>,
    pub(crate) policies: Vec<Arc<Object<BackendTrafficPolicySpec>>>,
    pub(crate) proxy_configs: Vec<Arc<Object<ProxyConfigSpec>>>,
    pub(crate) egress_policies: Vec<Arc<Object<EgressPolicySpec>>>,
    /// The XBackends as written (for `/config`); each is in `backends` too, mapped.
    pub(crate) xbackends: Vec<Arc<Object<XBackendSpec>>>,
    /// The Secrets and ConfigMaps (`id.kind` tells them apart).
    pub(crate) secrets: Vec<Arc<Object<KeyedData>>>,
    /// The YAML files that were read.
    pub files: Vec<PathBuf>,
    /// Hash of every file's path and content: equal fingerprints mean nothing changed.
    pub(crate) fingerprint: u64,
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
pub(crate) struct LoadCache {
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
pub(crate) fn load_paths_cached(
    paths: &[PathBuf],
    limits: &LoadLimits,
    cache: &mut LoadCache,
) -> Loaded {
    parse_files(read_paths(paths, limits), limits, cache)
}

/// The config files of some paths, read but not parsed: each file's bytes, and the problems
/// met listing and reading them, in the order they came.
#[derive(Debug, Default)]
pub(crate) struct ReadFiles {
    entries: Vec<ReadEntry>,
    /// Hash of every file's path and content (what [`ConfigSet::fingerprint`] becomes).
    pub(crate) fingerprint: u64,
}

#[derive(Debug)]
enum ReadEntry {
    /// A file read whole, and the hash of its bytes (its key in the [`LoadCache`]).
    File {
        path: PathBuf,
        text: String,
        hash: u64,
    },
    /// A path that could not be listed, or a file that could not be read.
    Problem(Diagnostic),
}

/// Reads every config file of `paths` as [`load_paths`] describes, within `limits`, parsing
/// nothing: the bytes and the fingerprint tell whether anything changed before any parsing.
pub(crate) fn read_paths(paths: &[PathBuf], limits: &LoadLimits) -> ReadFiles {
    let mut read = ReadFiles::default();
    let mut hasher = DefaultHasher::new();
    let mut total: u64 = 0;
    'paths: for path in paths {
        let mut problems = Vec::new();
        let listed = files::list(path, &mut problems);
        read.entries
            .extend(problems.into_iter().map(ReadEntry::Problem));
        for (i, file) in listed.iter().enumerate() {
            let opened = match files::open(file) {
                Ok(opened) => opened,
                Err(d) => {
                    read.entries.push(ReadEntry::Problem(*d));
                    continue;
                }
            };
            if total.saturating_add(opened.size) > limits.max_total_bytes {
                let skipped = listed.len() - i - 1;
                read.entries
                    .push(ReadEntry::Problem(over_total(file, skipped, limits)));
                break 'paths;
            }
            let text = match opened.read(file, limits.max_file_bytes) {
                Ok(text) => text,
                Err(d) => {
                    read.entries.push(ReadEntry::Problem(*d));
                    continue;
                }
            };
            total = total.saturating_add(text.len() as u64);
            let hash = {
                let mut h = DefaultHasher::new();
                text.hash(&mut h);
                h.finish()
            };
            file.hash(&mut hasher);
            hash.hash(&mut hasher);
            let path = file.clone();
            read.entries.push(ReadEntry::File { path, text, hash });
        }
    }
    read.fingerprint = hasher.finish();
    read
}

/// The error for the file that would take the config past `limits.max_total_bytes`: it and
/// everything after it is left unread.
fn over_total(file: &Path, skipped: usize, limits: &LoadLimits) -> Diagnostic {
    Diagnostic::error(
        file,
        Pos::default(),
        format!(
            "the config is larger than {} in all: this file (and {skipped} \
             more in this directory, and any other config path) was not read",
            show_bytes(limits.max_total_bytes)
        ),
    )
    .hint("remove files that do not belong, or raise --max-config-size")
}

/// Parses what [`read_paths`] read into typed objects, reusing what `cache` holds for files
/// whose bytes did not change, and leaving in it what this load parsed or reused.
pub(crate) fn parse_files(read: ReadFiles, limits: &LoadLimits, cache: &mut LoadCache) -> Loaded {
    let mut previous = std::mem::take(&mut cache.files);
    let mut loaded = Loaded::default();
    for entry in read.entries {
        let (file, text, text_hash) = match entry {
            ReadEntry::File { path, text, hash } => (path, text, hash),
            ReadEntry::Problem(d) => {
                loaded.diagnostics.push(d);
                continue;
            }
        };
        let this_file = match previous.remove(&file) {
            Some((hash, cached)) if hash == text_hash => cached,
            _ => {
                let mut this_file = Loaded::default();
                load_file(&file, &text, limits, &mut this_file);
                Arc::new(this_file)
            }
        };
        loaded.extend(&this_file);
        cache.files.insert(file.clone(), (text_hash, this_file));
        loaded.set.files.push(file);
    }
    loaded.set.fingerprint = read.fingerprint;
    check_duplicates(&mut loaded);
    loaded
}

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
