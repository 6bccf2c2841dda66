//! Config load + compile from bytes: one YAML file, as `egressd validate` and a reload read it.
//! Whatever the text, loading and compiling end with diagnostics, never a panic, and every
//! diagnostic and status condition can be printed.

#![no_main]

use std::fmt::Write;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use egressd::config::load::load_text;
use egressd::config::LoadLimits;
use egressd::runtime::compile::compile;
use egressd::upstream::registry::StateRegistry;
use egressd::upstream::dns::DnsResolver;
use libfuzzer_sys::fuzz_target;

/// One registry for the whole run, as a long-running egressd has; swept after each input so
/// what a config created does not pile up. Nothing is resolved while compiling.
static REGISTRY: LazyLock<Arc<StateRegistry>> = LazyLock::new(|| {
    let resolver = DnsResolver::new(&["127.0.0.1:53".parse().expect("literal address")])
        .expect("a resolver with a fixed name server");
    Arc::new(StateRegistry::new(resolver))
});

fuzz_target!(|data: &[u8]| {
    // A directory that does not exist: files the config refers to (certificates, keys) are
    // looked up next to it and not found, as in a broken deployment.
    let file = Path::new("/nonexistent-egressd-fuzz/config.yaml");
    let text = String::from_utf8_lossy(data);
    let loaded = load_text(file, &text, &LoadLimits::default());
    let compiled = compile(Arc::new(loaded.set), loaded.diagnostics, &REGISTRY, 1);
    let mut report = String::new();
    for d in &compiled.diagnostics {
        let _ = writeln!(report, "{d}");
    }
    let status = compiled.status();
    for object in &status.objects {
        let _ = writeln!(report, "{} ({})", object.object, object.file.display());
        for c in &object.conditions {
            let _ = writeln!(
                report,
                "{}={} {}: {}",
                c.kind, c.status, c.reason, c.message
            );
        }
    }
    // What the admin server's `/status` shows of it.
    let _ = serde_json::to_vec(&status);
    drop(compiled);
    REGISTRY.sweep();
});
