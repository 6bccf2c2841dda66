//! The configs shipped in `config/` and `config/examples/*/` stay valid, warn only where the
//! warning is deliberate, and point editors at a JSON Schema that matches what `egressd schema`
//! prints today.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use egressd::commands::validate;
use egressd::config::wire::Kind;
use egressd::config::{load_paths, Diagnostic, Reason, Severity};
use egressd::runtime::compile::{compile, Compiled};
use egressd::upstream::dns::DnsResolver;
use egressd::upstream::registry::StateRegistry;

const REGENERATE: &str = "cargo run -q -- schema > docs/schema.json";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `config/` itself and every directory under `config/examples/`.
fn config_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![repo().join("config")];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(repo().join("config/examples"))
        .expect("config/examples exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.is_dir())
        .collect();
    examples.sort();
    dirs.extend(examples);
    dirs
}

fn compiled(dir: &Path) -> Compiled {
    let loaded = load_paths(&[dir.to_path_buf()]);
    // Validation never resolves names; the resolver only has to exist.
    let resolver = DnsResolver::new(&["127.0.0.1:53".parse().expect("literal")]).expect("resolver");
    let registry = Arc::new(StateRegistry::new(resolver));
    compile(Arc::new(loaded.set), loaded.diagnostics, &registry, 1)
}

/// The warnings each directory is allowed, as (object, reason); any other diagnostic fails.
/// A new example directory starts with none: add its deliberate warnings here, with a reason.
fn deliberate_warnings() -> BTreeMap<&'static str, Vec<(&'static str, Reason)>> {
    BTreeMap::from([
        ("config", vec![]),
        // Plaintext to in-cluster services: deliberate in the example, and saying so
        // (Degraded) is the point.
        (
            "sidecar",
            vec![
                ("Backend default/inventory", Reason::Degraded),
                ("Backend default/orders", Reason::Degraded),
            ],
        ),
        // Plaintext to the search team's API, for the same reason.
        (
            "central-gateway",
            vec![("Backend search/search-api", Reason::Degraded)],
        ),
    ])
}

fn dir_name(dir: &Path) -> &str {
    dir.file_name()
        .and_then(|n| n.to_str())
        .expect("utf-8 name")
}

#[test]
fn the_promised_examples_exist() {
    let names: Vec<String> = config_dirs()
        .iter()
        .map(|d| dir_name(d).to_owned())
        .collect();
    for wanted in ["config", "sidecar", "central-gateway"] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} missing: {names:?}"
        );
    }
}

#[test]
fn every_shipped_config_is_valid_with_only_the_deliberate_warnings() {
    let allowed = deliberate_warnings();
    for dir in config_dirs() {
        let name = dir_name(&dir);
        let v = validate(std::slice::from_ref(&dir));
        assert!(v.ok, "{} is invalid:\n{}", dir.display(), v.report);

        let diags = compiled(&dir).diagnostics;
        let mut got: Vec<(String, Option<Reason>)> = diags
            .iter()
            .map(|d: &Diagnostic| {
                assert_eq!(d.severity, Severity::Warning, "{d}");
                (
                    d.object
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    d.reason,
                )
            })
            .collect();
        let mut want: Vec<(String, Option<Reason>)> = allowed
            .get(name)
            .map(|w| w.iter().map(|(o, r)| ((*o).to_owned(), Some(*r))).collect())
            .unwrap_or_default();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            want,
            "{}: unexpected warnings (add deliberate ones to deliberate_warnings()):\n{}",
            dir.display(),
            v.report
        );
        // The report says so too, and shows the warnings as Degraded conditions.
        let summary = format!("0 error(s), {} warning(s)", want.len());
        assert!(
            v.report
                .lines()
                .any(|l| l.starts_with("valid: ") && l.ends_with(&summary)),
            "{}",
            v.report
        );
        for (object, _) in &want {
            assert!(
                v.report.contains(&format!("{object} (")),
                "{object} has no status in:\n{}",
                v.report
            );
        }
        assert_eq!(
            v.report.matches("  Degraded=True Degraded").count(),
            want.len(),
            "{}",
            v.report
        );
    }
}

#[test]
fn examples_keep_their_documented_listeners() {
    let cases = [
        (
            "config/examples/sidecar",
            "default/sidecar/http",
            "127.0.0.1:15001",
        ),
        (
            "config/examples/central-gateway",
            "egress-system/egress/http",
            "0.0.0.0:8080",
        ),
    ];
    for (dir, key, addr) in cases {
        let c = compiled(&repo().join(dir));
        let listeners: Vec<(String, String)> = c
            .snapshot
            .listeners
            .iter()
            .map(|l| (l.key.to_string(), l.addr.to_string()))
            .collect();
        assert_eq!(listeners, [(key.to_owned(), addr.to_owned())], "{dir}");
    }
}

#[test]
fn every_shipped_yaml_file_points_its_editor_at_docs_schema_json() {
    let schema = repo()
        .join("docs/schema.json")
        .canonicalize()
        .expect("docs/schema.json exists");
    for dir in config_dirs() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("readable dir")
            .map(|e| e.expect("readable entry").path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{} has no YAML files", dir.display());
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable file");
            let first = text.lines().next().unwrap_or("");
            let rel = first
                .strip_prefix("# yaml-language-server: $schema=")
                .unwrap_or_else(|| {
                    panic!(
                        "{} must start with `# yaml-language-server: $schema=...`, starts with `{first}`",
                        file.display()
                    )
                });
            let target = dir.join(rel).canonicalize().unwrap_or_else(|e| {
                panic!("{}: $schema={rel} does not exist: {e}", file.display())
            });
            assert_eq!(target, schema, "{}: $schema={rel}", file.display());
        }
    }
}

fn schema_from_binary() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("schema")
        .output()
        .expect("run egressd schema");
    assert!(out.status.success(), "egressd schema failed: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 schema")
}

#[test]
fn schema_command_prints_json_with_one_entry_per_kind() {
    let text = schema_from_binary();
    let schema: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    // One `if kind == K then <K's schema>` per kind.
    let by_kind = schema["allOf"].as_array().expect("allOf is an array");
    assert_eq!(by_kind.len(), Kind::ALL.len(), "{by_kind:#?}");
    for kind in Kind::ALL {
        let entries: Vec<&serde_json::Value> = by_kind
            .iter()
            .filter(|e| e["if"]["properties"]["kind"]["const"] == kind.name())
            .map(|e| &e["then"])
            .collect();
        assert_eq!(entries.len(), 1, "entries for {}", kind.name());
        let versions = entries[0]["properties"]["apiVersion"]["enum"]
            .as_array()
            .expect("apiVersion enum");
        assert!(
            versions.iter().any(|v| v == kind.api_versions()[0]),
            "{}: {versions:?}",
            kind.name()
        );
    }
}

#[test]
fn docs_schema_json_matches_what_the_schema_command_prints() {
    let path = repo().join("docs/schema.json");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; create it with `{REGENERATE}`",
            path.display()
        )
    });
    // Compared as text, not as JSON values: the file is what editors load, byte for byte.
    assert!(
        on_disk == schema_from_binary(),
        "docs/schema.json is out of date with `egressd schema`; regenerate it with `{REGENERATE}`"
    );
}
