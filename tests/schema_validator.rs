//! `docs/schema.json` as an editor sees it: every document of every file checked by the
//! reference JSON Schema validator (Python `jsonschema`, installed into target/tmp on first
//! use), the way yaml-language-server checks each document of a multi-document file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The validator and the YAML reader, pinned.
const PACKAGES: [&str; 2] = ["jsonschema==4.23.0", "PyYAML==6.0.2"];

#[derive(Debug, serde::Deserialize)]
struct SchemaError {
    file: String,
    document: usize,
    path: String,
    message: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The errors the validator finds in `files`.
fn check(files: &[PathBuf]) -> Vec<SchemaError> {
    let python = common::python::venv("schema-python", &PACKAGES);
    let out = Command::new(python)
        .arg(repo().join("tests/fixtures/python/check_schema.py"))
        .arg(repo().join("docs/schema.json"))
        .args(files)
        .output()
        .expect("run check_schema.py");
    assert!(
        out.status.success(),
        "check_schema.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Every config the repository ships, each document, is what the schema describes.
#[test]
fn every_shipped_config_document_passes_the_schema() {
    let mut files = Vec::new();
    yaml_files(&repo().join("config"), &mut files);
    let gateway = repo().join("deploy/kubernetes/gateway");
    files.push(gateway.join("mcp/mcp.yaml"));
    files.push(gateway.join("ratelimit/ratelimit.yaml"));
    // The kustomize components' ProxyConfig sections (proxy-spec.yaml, which kustomize appends
    // to the spec of the base's ProxyConfig), each in a ProxyConfig of its own.
    let dir = tempfile::tempdir().unwrap();
    for component in ["mcp", "ratelimit"] {
        let spec =
            std::fs::read_to_string(gateway.join(component).join("proxy-spec.yaml")).unwrap();
        let file = dir.path().join(format!("{component}-proxy.yaml"));
        let head = "apiVersion: egressd.dev/v1alpha1\nkind: ProxyConfig\nmetadata:\n  name: egressd\nspec:\n";
        std::fs::write(&file, format!("{head}{spec}")).unwrap();
        files.push(file);
    }
    assert!(files.len() > 10, "{files:?}");
    let errors = check(&files);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// A file of three documents with a mistake in the second and two in the third: three
/// errors, each in its document and at its field (a `oneOf` over every kind gave dozens,
/// one per kind that the document is not); a deprecated alias is flagged, not offered.
#[test]
fn mistakes_in_later_documents_are_reported_once_each_at_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("three.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  listeners:
  - {name: http, address: 127.0.0.1, port: 15001, protocol: HTTP}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: api}
spec:
  destination:
    type: FQDN
    fqdn: {hostname: api.example.com}
    ports: [{number: 443}]
  protocl: HTTP
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: hooks}
spec:
  destination:
    type: FQDN
    fqdn: {hostname: hooks.example.com}
    ports: [{number: "four-four-three"}]
  tls: {mode: ServerOnly}
"#,
    )
    .unwrap();
    let errors = check(std::slice::from_ref(&file));
    let found: Vec<(usize, &str)> = errors
        .iter()
        .map(|e| (e.document, e.path.as_str()))
        .collect();
    assert_eq!(found.len(), 3, "{errors:#?}");
    assert!(found.contains(&(1, "spec")), "{errors:#?}");
    assert!(
        found.contains(&(2, "spec/destination/ports/0/number")),
        "{errors:#?}"
    );
    // `ServerOnly` (Envoy Gateway's word for Simple) is accepted by egressd with a warning,
    // and not offered by the schema.
    assert!(found.contains(&(2, "spec/tls")), "{errors:#?}");
    let typo = errors.iter().find(|e| e.document == 1).unwrap();
    assert!(typo.message.contains("protocl"), "{typo:?}");
    assert!(errors.iter().all(|e| e.file.ends_with("three.yaml")));
}
