//! Every ```yaml block in README.md and docs/*.md is a config `egressd validate` accepts:
//! the documentation cannot show a field, a value or a shape that this build rejects.
//!
//! Each block is written alone as `block.yaml` into a temporary directory and checked by the
//! built binary, as a user would (`egressd validate DIR`, exit 0; warnings are fine). A config
//! must declare a listener, which a snippet about a Backend or a policy rarely shows, so a
//! block without a `kind: Gateway` gets one beside it (`listener.yaml`). Blocks that are not
//! meant to be a valid config (an error being shown, a fragment) use another info string,
//! such as ```text.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The listener added next to blocks that declare none.
const LISTENER: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: docs-listener
spec:
  listeners:
  - name: http
    port: 0
    protocol: HTTP
    address: 127.0.0.1
";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, in a stable order.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut all = vec![repo().join("README.md")];
    all.extend(docs);
    all
}

/// A fenced block whose info string is exactly `yaml`.
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    text: String,
}

/// The ```yaml blocks of a Markdown text. Fences may be indented (inside a list item); the
/// fence's indentation is taken off the block's lines. Blocks with any other info string
/// are skipped, and so is everything inside them.
fn yaml_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let mut text = String::new();
        let mut closed = false;
        for (_, inner) in lines.by_ref() {
            if inner.trim() == "```" {
                closed = true;
                break;
            }
            let cut = inner.len() - inner.trim_start().len();
            text.push_str(&inner[cut.min(indent)..]);
            text.push('\n');
        }
        assert!(closed, "line {}: a fenced block is never closed", i + 1);
        if info.trim() == "yaml" {
            blocks.push(Block { line: i + 1, text });
        }
    }
    blocks
}

fn declares_listener(yaml: &str) -> bool {
    yaml.lines()
        .any(|l| l.trim_start().trim_start_matches("- ").trim() == "kind: Gateway")
}

/// `egressd validate` on the block; `None` when it exits 0, else what it printed.
fn validate(block: &Block) -> Option<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("block.yaml"), &block.text).expect("write block.yaml");
    if !declares_listener(&block.text) {
        std::fs::write(dir.path().join("listener.yaml"), LISTENER).expect("write listener.yaml");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("validate")
        .arg(dir.path())
        .output()
        .expect("run egressd validate");
    if out.status.success() {
        return None;
    }
    Some(format!(
        "exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[test]
fn the_block_scanner_finds_yaml_fences_only() {
    let md = "text\n```sh\nkind: Gateway\n```\n\n- item\n  ```yaml\n  kind: Backend\n  ```\n```text\nbad: [\n```\n";
    let blocks = yaml_blocks(md);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].line, 7);
    assert_eq!(blocks[0].text, "kind: Backend\n");
    assert!(declares_listener("---\nkind: Gateway\n"));
    assert!(!declares_listener("kind: Backend\n"));
}

#[test]
fn every_yaml_block_in_the_docs_validates() {
    let mut checked = 0;
    let mut in_docs = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let markdown = std::fs::read_to_string(&doc).expect("readable Markdown");
        let name = doc
            .strip_prefix(repo())
            .expect("inside the repository")
            .display()
            .to_string();
        for block in yaml_blocks(&markdown) {
            checked += 1;
            if name.starts_with("docs") {
                in_docs += 1;
            }
            if let Some(report) = validate(&block) {
                failures.push(format!(
                    "{name}:{}: this ```yaml block is not a valid config:\n{}\n{report}",
                    block.line, block.text
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} ```yaml blocks fail `egressd validate`:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        in_docs > 0,
        "no ```yaml block found under docs/: the test would check nothing"
    );
}
