//! Compiled Backends kept from the serving config, so that a reload compiles only what changed.
//!
//! A Backend's compiled form depends on its object, on the BackendTrafficPolicies (those that
//! target it, and those that target a Gateway, whose connection sections apply to every
//! Backend), on the ProxyConfig, on the state registry (which gives the same endpoints and
//! groups for the same identity) and on the files it reads (CA bundles, client certificates,
//! credentials). When the load cache hands out the very same object (its file did not change),
//! the policies, ProxyConfig, Secrets and ConfigMaps are the very same objects, and every file it read has the same
//! content, compiling it again would give what the serving config already has: that Backend,
//! with the warnings and health-check plans compiling it gave, is taken as it is.
//!
//! Anything else (an edited Backend, a moved one, any policy or ProxyConfig change) compiles
//! again, so that positions in diagnostics and every cross-object check stay exact. The entries
//! are replaced only when a config is accepted: a refused config reuses nothing later.

use std::collections::HashMap;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use foldhash::fast::RandomState as FastHash;

use crate::config::wire::backend::BackendSpec;
use crate::config::wire::gateway::GatewaySpec;
use crate::config::wire::policy::BackendTrafficPolicySpec;
use crate::config::wire::proxy::ProxyConfigSpec;
use crate::config::wire::secret::KeyedData;
use crate::config::wire::{Object, GATEWAY_GROUP};
use crate::config::{ConfigSet, Diagnostic};
use crate::snapshot::Backend;
use crate::upstream::health_check::CheckPlan;

/// The compiled Backends of one accepted config, by object identity.
#[derive(Default)]
pub(crate) struct CompiledBackends {
    /// The objects the entries were compiled under: when any differs, nothing is reused.
    policies: Vec<Arc<Object<BackendTrafficPolicySpec>>>,
    proxy_configs: Vec<Arc<Object<ProxyConfigSpec>>>,
    /// The Secrets and ConfigMaps: a Backend's TLS may be built from them, and they are few
    /// and rarely change, so any change compiles every Backend again.
    secrets: Vec<Arc<Object<KeyedData>>>,
    /// The Gateways, when a policy targets one (its sections then depend on them existing).
    gateways: Option<Vec<Arc<Object<GatewaySpec>>>>,
    /// By the address of the object (kept alive by the entry, so it cannot be another's).
    entries: HashMap<usize, Entry, FastHash>,
    /// Which Backend serves each declared (hostname, port): it keeps it at the next reload.
    pub(crate) held_ports: super::routes::HeldPorts,
}

/// One compiled Backend and what compiling it gave besides.
#[derive(Clone)]
pub(crate) struct Entry {
    object: Arc<Object<BackendSpec>>,
    pub(crate) backend: Arc<Backend>,
    /// None when compiling gave nothing besides the Backend (most do not): 10,000 entries
    /// of three empty vectors were a megabyte.
    side: Option<Arc<Side>>,
}

/// What compiling a kept Backend gave besides the Backend.
struct Side {
    /// Its warnings (a Backend with an error is never kept).
    diagnostics: Vec<Diagnostic>,
    /// Its ports' active health checks: every accepted config starts checkers anew.
    health_checks: Vec<CheckPlan>,
    /// The files it read and a hash of what they held.
    files: Vec<(PathBuf, u64)>,
}

impl Entry {
    pub(crate) fn diagnostics(&self) -> &[Diagnostic] {
        self.side.as_ref().map_or(&[], |s| &s.diagnostics)
    }

    pub(crate) fn health_checks(&self) -> &[CheckPlan] {
        self.side.as_ref().map_or(&[], |s| &s.health_checks)
    }

    fn file_states(&self) -> &[(PathBuf, u64)] {
        self.side.as_ref().map_or(&[], |s| &s.files)
    }

    pub(crate) fn files(&self) -> impl Iterator<Item = &PathBuf> {
        self.file_states().iter().map(|(path, _)| path)
    }
}

impl CompiledBackends {
    /// Empty, for the objects of `set`: filled while `set` compiles.
    pub(crate) fn for_set(set: &ConfigSet) -> Self {
        // Backends depend on the Gateways when a policy targets one (its sections then depend
        // on them existing) or one names the default client certificate of Mutual Backends.
        let targets_gateway = set.policies.iter().any(|p| {
            p.spec
                .target_refs
                .iter()
                .any(|t| t.group == GATEWAY_GROUP && t.kind == "Gateway")
        }) || set.gateways.iter().any(|g| g.spec.tls.is_some());
        CompiledBackends {
            policies: set.policies.clone(),
            proxy_configs: set.proxy_configs.clone(),
            secrets: set.secrets.clone(),
            gateways: targets_gateway.then(|| set.gateways.clone()),
            entries: HashMap::default(),
            held_ports: super::routes::HeldPorts::default(),
        }
    }

    /// Whether Backends compiled under `self` may serve `set` unchanged (as far as the objects
    /// besides the Backends go).
    pub(crate) fn applies_to(&self, set: &ConfigSet) -> bool {
        same_objects(&self.policies, &set.policies)
            && same_objects(&self.proxy_configs, &set.proxy_configs)
            && same_objects(&self.secrets, &set.secrets)
            && self
                .gateways
                .as_ref()
                .is_none_or(|g| same_objects(g, &set.gateways))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry compiled from this very object, if every file it read still holds what it held.
    pub(crate) fn find(
        &self,
        object: &Arc<Object<BackendSpec>>,
        files: &mut FileStates,
    ) -> Option<&Entry> {
        let entry = self.entries.get(&key(object))?;
        let unchanged = Arc::ptr_eq(&entry.object, object)
            && entry
                .file_states()
                .iter()
                .all(|(path, state)| files.current(path) == *state);
        unchanged.then_some(entry)
    }

    pub(crate) fn keep(&mut self, entry: Entry) {
        self.entries.insert(key(&entry.object), entry);
    }

    /// Records a Backend just compiled from `object`; not kept when a file it read changed
    /// while it compiled (its content then may not be what was compiled).
    pub(crate) fn record(
        &mut self,
        object: &Arc<Object<BackendSpec>>,
        backend: Arc<Backend>,
        side: SideOutputs,
        files: &mut FileStates,
    ) {
        let mut states = Vec::with_capacity(side.files.len());
        for path in side.files {
            match files.settled_since(&path, side.started) {
                Some(state) => states.push((path, state)),
                None => return,
            }
        }
        let side = Side {
            diagnostics: side.diagnostics,
            health_checks: side.health_checks,
            files: states,
        };
        let empty =
            side.diagnostics.is_empty() && side.health_checks.is_empty() && side.files.is_empty();
        self.keep(Entry {
            object: object.clone(),
            backend,
            side: (!empty).then(|| Arc::new(side)),
        });
    }
}

fn same_objects<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

fn key<T>(object: &Arc<T>) -> usize {
    Arc::as_ptr(object) as usize
}

/// What compiling one Backend gave besides the Backend.
pub(crate) struct SideOutputs {
    pub(crate) started: SystemTime,
    pub(crate) diagnostics: Vec<Diagnostic>,
    pub(crate) health_checks: Vec<CheckPlan>,
    pub(crate) files: Vec<PathBuf>,
}

/// The content of referenced files, read once per compile however many Backends name them.
#[derive(Default)]
pub(crate) struct FileStates {
    read: HashMap<PathBuf, FileState>,
}

#[derive(Clone, Copy)]
struct FileState {
    /// Hash of the content, or of the error reading it (a missing file is a state too).
    hash: u64,
    /// When the file (or its directory entry) last changed, if known.
    changed: Option<SystemTime>,
}

impl FileStates {
    fn state(&mut self, path: &Path) -> FileState {
        if let Some(state) = self.read.get(path) {
            return *state;
        }
        let state = read_state(path);
        self.read.insert(path.to_owned(), state);
        state
    }

    /// The hash of what `path` holds now.
    fn current(&mut self, path: &Path) -> u64 {
        self.state(path).hash
    }

    /// The hash of what `path` holds, unless it changed at or after `since` (less a second
    /// for file systems with coarse timestamps): then what compiling read may differ from
    /// what is hashed now (git's "racily clean" entries, the same reasoning).
    fn settled_since(&mut self, path: &Path, since: SystemTime) -> Option<u64> {
        let state = self.state(path);
        let horizon = since
            .checked_sub(std::time::Duration::from_secs(1))
            .unwrap_or(since);
        match state.changed {
            Some(changed) if changed < horizon => Some(state.hash),
            _ => None,
        }
    }
}

fn read_state(path: &Path) -> FileState {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    crate::config::hash_file_state(path, &mut hasher);
    FileState {
        hash: hasher.finish(),
        changed: status_change(path),
    }
}

/// The file's status change time (a rename or a rewrite both set it, unlike the modification
/// time, which `mv` keeps); for a missing file, its directory's.
fn status_change(path: &Path) -> Option<SystemTime> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(_) => std::fs::metadata(path.parent()?).ok()?,
    };
    let secs = u64::try_from(meta.ctime()).ok()?;
    let nanos = u32::try_from(meta.ctime_nsec()).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load::load_paths_cached;
    use crate::config::{LoadCache, LoadLimits};
    use crate::runtime::compile::{compile_reusing, Compiled};
    use crate::upstream::dns::DnsResolver;
    use crate::upstream::registry::StateRegistry;

    /// Backend `name` with one loopback endpoint and an active TCP check (a health-check plan);
    /// `warned` sends plaintext to a documentation address instead (a warning). Compiled only:
    /// nothing connects.
    fn backend(name: &str, warned: bool) -> String {
        let address = if warned { "192.0.2.10" } else { "127.0.0.1" };
        format!(
            "apiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\n\
             spec:\n  destination: {{type: IP, ip: {{endpoints: [{{address: {address}}}]}}, \
             ports: [{{number: 8080}}]}}\n  protocol: HTTP11\n  tls: {{mode: InsecureDisable}}\n\
             \x20 trafficPolicy: {{healthCheck: {{active: {{type: TCP, interval: 10s}}}}}}\n"
        )
    }

    struct Fixture {
        dir: tempfile::TempDir,
        cache: LoadCache,
        registry: Arc<StateRegistry>,
    }

    impl Fixture {
        fn new() -> Self {
            let resolver = DnsResolver::new(&["127.0.0.1:53".parse().unwrap()]).unwrap();
            Fixture {
                dir: tempfile::tempdir().unwrap(),
                cache: LoadCache::default(),
                registry: Arc::new(StateRegistry::new(resolver)),
            }
        }

        fn write(&self, file: &str, yaml: &str) {
            std::fs::write(self.dir.path().join(file), yaml).unwrap();
        }

        fn compile(&mut self, previous: Option<&CompiledBackends>) -> Compiled {
            let paths = [self.dir.path().to_owned()];
            let loaded = load_paths_cached(&paths, &LoadLimits::default(), &mut self.cache);
            let set = Arc::new(loaded.set);
            let compiled = compile_reusing(set, loaded.diagnostics, &self.registry, 1, previous);
            assert!(!compiled.has_errors(), "{:?}", compiled.diagnostics);
            compiled
        }
    }

    fn same(a: &Compiled, b: &Compiled, name: &str) -> bool {
        let find = |c: &Compiled| {
            c.snapshot
                .backends
                .iter()
                .find(|b| &*b.id.name == name)
                .cloned()
                .unwrap()
        };
        Arc::ptr_eq(&find(a), &find(b))
    }

    fn messages(c: &Compiled) -> Vec<String> {
        c.diagnostics.iter().map(ToString::to_string).collect()
    }

    /// A second compile of unchanged objects takes their Backends as they are, with the
    /// warnings and health-check plans compiling them gave; an edited object compiles again.
    #[test]
    fn unchanged_backends_are_taken_as_compiled() {
        let mut f = Fixture::new();
        f.write("a.yaml", &backend("a", true));
        f.write("b.yaml", &backend("b", false));
        let first = f.compile(None);
        assert_eq!(first.backends.len(), 2);
        assert_eq!(first.diagnostics.len(), 1, "{:?}", messages(&first));
        assert_eq!(first.health_checks.len(), 2);

        let second = f.compile(Some(&first.backends));
        assert!(same(&first, &second, "a") && same(&first, &second, "b"));
        assert_eq!(messages(&second), messages(&first));
        assert_eq!(second.health_checks.len(), 2);
        assert!(second.refreshers.is_empty() && second.outlier_groups.is_empty());

        f.write("b.yaml", &backend("b", true));
        let third = f.compile(Some(&second.backends));
        assert!(same(&second, &third, "a"));
        assert!(!same(&second, &third, "b"));
        assert_eq!(third.diagnostics.len(), 2, "{:?}", messages(&third));
        assert_eq!(third.health_checks.len(), 2);
        // Kept for the next reload: both, the recompiled one as it is now.
        assert_eq!(third.backends.len(), 2);
        let fourth = f.compile(Some(&third.backends));
        assert!(same(&third, &fourth, "b"));
    }

    /// A policy or ProxyConfig added, changed or removed: every Backend compiles again (a
    /// policy can change any Backend's sections).
    #[test]
    fn a_policy_change_compiles_every_backend_again() {
        let mut f = Fixture::new();
        f.write("a.yaml", &backend("a", false));
        let first = f.compile(None);
        f.write(
            "policy.yaml",
            "apiVersion: egressd.dev/v1alpha1\nkind: BackendTrafficPolicy\n\
             metadata: {name: p}\nspec:\n  targetRefs: [{group: egressd.dev, kind: Backend, \
             name: a}]\n  circuitBreaker: {maxConnections: 5}\n",
        );
        let second = f.compile(Some(&first.backends));
        assert!(!same(&first, &second, "a"));
        let third = f.compile(Some(&second.backends));
        assert!(same(&second, &third, "a"));
        f.write(
            "proxy.yaml",
            "apiVersion: egressd.dev/v1alpha1\nkind: ProxyConfig\nmetadata: {name: p}\nspec: {}\n",
        );
        let fourth = f.compile(Some(&third.backends));
        assert!(!same(&third, &fourth, "a"));
    }

    /// A file is reusable only when it settled before compiling started, and a change to its
    /// content is seen.
    #[test]
    fn file_states_see_changes_and_distrust_fresh_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one").unwrap();
        let mut states = FileStates::default();
        assert_eq!(states.settled_since(&path, SystemTime::now()), None);
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        let one = states.settled_since(&path, later).unwrap();
        std::fs::write(&path, "two").unwrap();
        assert_eq!(states.current(&path), one, "read once per compile");
        let mut next = FileStates::default();
        assert_ne!(next.current(&path), one);
        std::fs::remove_file(&path).unwrap();
        let mut gone = FileStates::default();
        assert_ne!(gone.current(&path), one);
        assert_eq!(gone.current(&path), FileStates::default().current(&path));
    }

    /// An entry that read a file is reused while the file holds the same bytes.
    #[test]
    fn a_backend_that_read_a_changed_file_compiles_again() {
        let mut f = Fixture::new();
        f.write("a.yaml", &backend("a", false));
        let first = f.compile(None);
        let token = f.dir.path().join("token");
        std::fs::write(&token, "one").unwrap();
        let object = first.snapshot.config.backends[0].clone();
        let mut kept = CompiledBackends::for_set(&first.snapshot.config);
        let side = SideOutputs {
            started: SystemTime::now() + std::time::Duration::from_secs(5),
            diagnostics: Vec::new(),
            health_checks: Vec::new(),
            files: vec![token.clone()],
        };
        let backend = first.snapshot.backends[0].clone();
        kept.record(&object, backend, side, &mut FileStates::default());
        assert!(kept.find(&object, &mut FileStates::default()).is_some());
        std::fs::write(&token, "two").unwrap();
        assert!(kept.find(&object, &mut FileStates::default()).is_none());
        // Recorded just now (not settled): not kept at all.
        let mut fresh = CompiledBackends::for_set(&first.snapshot.config);
        let side = SideOutputs {
            started: SystemTime::now(),
            diagnostics: Vec::new(),
            health_checks: Vec::new(),
            files: vec![token],
        };
        let backend = first.snapshot.backends[0].clone();
        fresh.record(&object, backend, side, &mut FileStates::default());
        assert!(fresh.is_empty());
    }
}
