//! Config loading that nothing on disk can fool, starve or make leak (issue #14): entries named
//! `*.yaml` that are not readable regular files, invalid UTF-8, objects with several mistakes,
//! size and alias-expansion bounds, configs that declare no listener, and secrets in the
//! `/config` dump, `/status` and the log.
//!
//! Everything runs on real files in temp dirs; what only the process shows (exit codes, the
//! log) runs the built binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use egressd::commands::validate;
use egressd::config::{load_paths, load_paths_with, Diagnostic, LoadLimits, Severity};

use common::binary::{Egressd, TestConfig, HOST, LISTENER};
use common::poll_within;
use common::proxy::{get, ip_backend, preamble, TestProxy};
use common::upstream::Upstream;

/// A Gateway with one listener: enough for a config to be served.
const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  listeners:
  - name: http
    address: 127.0.0.1
    port: 0
    protocol: HTTP
"#;

/// A valid Backend, for configs that need an object besides the Gateway.
const BACKEND: &str = r#"apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: api
spec:
  destination:
    type: FQDN
    fqdn:
      hostname: api.example.com
    ports:
    - number: 443
"#;

/// Generous bound on one `egressd validate` run: the machine is shared, and speed is not what
/// these tests test (only that nothing hangs or crawls).
const VALIDATE_WITHIN: Duration = Duration::from_secs(20);

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path
}

/// A temp dir holding a valid config (`gateway.yaml`, `backend.yaml`).
fn valid_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    write(dir.path(), "gateway.yaml", GATEWAY);
    write(dir.path(), "backend.yaml", BACKEND);
    dir
}

fn errors(diags: &[Diagnostic]) -> Vec<&Diagnostic> {
    diags.iter().filter(|d| d.is_error()).collect()
}

fn render(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one error about `path`; fails the test unless there is exactly one.
fn only_error_for<'a>(diags: &'a [Diagnostic], path: &Path) -> &'a Diagnostic {
    let mine: Vec<&Diagnostic> = errors(diags)
        .into_iter()
        .filter(|d| d.file == path)
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "expected one error for {}:\n{}",
        path.display(),
        render(diags)
    );
    mine[0]
}

/// 1-based line and column (in characters) of the first occurrence of `needle` in `text`.
fn position_of(text: &str, needle: &str) -> (u32, u32) {
    spot(text, needle, needle)
}

/// Like [`position_of`], for `token` inside the first occurrence of `context`.
fn spot(text: &str, context: &str, token: &str) -> (u32, u32) {
    let at = text
        .find(context)
        .unwrap_or_else(|| panic!("`{context}` not in the text"))
        + context
            .find(token)
            .unwrap_or_else(|| panic!("`{token}` not in `{context}`"));
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line as u32, column as u32)
}

/// Runs `egressd validate` (with `env` set) and returns its exit code and stdout.
fn validate_binary(dir: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let (done, result) = mpsc::channel();
    let dir = dir.to_owned();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    std::thread::spawn(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
            .arg("validate")
            .arg(&dir)
            .env_remove("RUST_LOG")
            .env_remove("EGRESSD_LOG_LEVEL")
            .envs(env)
            .output()
            .expect("run egressd validate");
        let _ = done.send((
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    });
    result
        .recv_timeout(VALIDATE_WITHIN)
        .unwrap_or_else(|_| panic!("egressd validate did not finish within {VALIDATE_WITHIN:?}"))
}

// ---------------------------------------------------------------------------------------------
// Point 11: entries that are not readable regular files, invalid UTF-8, every error of an object
// ---------------------------------------------------------------------------------------------

#[test]
fn dangling_symlink_named_yaml_is_an_error_while_configmap_data_links_still_load() {
    // A Kubernetes ConfigMap volume: the files live in a hidden timestamped directory reached
    // through the hidden `..data` symlink, and each key is a visible symlink through it.
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("..2024_01_01_00_00_00.000000000");
    std::fs::create_dir(&stamp).unwrap();
    write(&stamp, "gateway.yaml", GATEWAY);
    std::os::unix::fs::symlink(stamp.file_name().unwrap(), dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/gateway.yaml", dir.path().join("gateway.yaml")).unwrap();
    let dangling = dir.path().join("backend.yaml");
    std::os::unix::fs::symlink("..data/backend.yaml", &dangling).unwrap();

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let d = only_error_for(&loaded.diagnostics, &dangling);
    assert!(d.message.contains("dangling symlink"), "{d}");
    assert!(d.message.contains("..data/backend.yaml"), "{d}");
    assert_eq!(
        errors(&loaded.diagnostics).len(),
        1,
        "{}",
        render(&loaded.diagnostics)
    );
    // The key reached through `..data` loaded; the hidden entries themselves were not read.
    assert_eq!(loaded.set.gateways.len(), 1);
    assert_eq!(loaded.set.files, vec![dir.path().join("gateway.yaml")]);
}

#[test]
fn symlink_loop_named_yaml_is_an_error_naming_it() {
    let dir = valid_dir();
    let a = dir.path().join("loop-a.yaml");
    let b = dir.path().join("loop-b.yaml");
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    for link in [&a, &b] {
        let d = only_error_for(&loaded.diagnostics, link);
        assert!(d.message.contains("symlink that cannot be followed"), "{d}");
    }
    assert!(!validate(&[dir.path().to_path_buf()]).ok);
}

#[test]
fn directory_named_yaml_is_an_error_naming_it() {
    let dir = valid_dir();
    let sub = dir.path().join("more.yaml");
    std::fs::create_dir(&sub).unwrap();
    write(&sub, "inside.yaml", BACKEND);

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let d = only_error_for(&loaded.diagnostics, &sub);
    assert!(d.message.contains("is a directory"), "{d}");
    // Not read recursively: the Backend inside would be a duplicate of `api`.
    assert_eq!(loaded.set.backends.len(), 1);
}

#[test]
fn fifo_named_yaml_is_an_error_and_never_blocks_the_loader() {
    let dir = valid_dir();
    let fifo = dir.path().join("pipe.yaml");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());

    // Opening a FIFO for reading blocks until a writer comes: run the load where a hang is
    // seen as a timeout, not as a stuck test.
    let (done, result) = mpsc::channel();
    let paths = vec![dir.path().to_path_buf()];
    std::thread::spawn(move || {
        let _ = done.send(load_paths(&paths).diagnostics);
    });
    let diags = result
        .recv_timeout(VALIDATE_WITHIN)
        .expect("the loader blocked on the FIFO");
    let d = only_error_for(&diags, &fifo);
    assert!(d.message.contains("FIFO"), "{d}");
    assert!(d.message.contains("not a regular file"), "{d}");
}

#[test]
fn invalid_utf8_is_an_error_at_the_line_and_column_of_the_first_bad_byte() {
    let dir = valid_dir();
    let text =
        "apiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata:\n  name: latin1 # café\n";
    // "café" in Latin-1: é is the single byte 0xE9.
    let mut bytes = text.replace('é', "\u{0}").into_bytes();
    let bad = bytes.iter().position(|&b| b == 0).unwrap();
    bytes[bad] = 0xE9;
    let file = dir.path().join("latin1.yaml");
    std::fs::write(&file, &bytes).unwrap();

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let d = only_error_for(&loaded.diagnostics, &file);
    // Line 4, column of the é (characters, as editors count them).
    let (line, column) = position_of(text, "é");
    assert_eq!((d.line, d.column), (line, column), "{d}");
    assert!(d.message.contains("not valid UTF-8"), "{d}");
    assert!(d.message.contains("0xe9"), "{d}");
    assert!(
        !d.hint.as_deref().unwrap_or("").contains("permission"),
        "{d}"
    );
}

#[test]
fn validate_binary_exits_1_naming_every_entry_it_cannot_read() {
    let dir = valid_dir();
    let dangling = dir.path().join("gone.yaml");
    std::os::unix::fs::symlink("nowhere.yaml", &dangling).unwrap();
    let sub = dir.path().join("sub.yaml");
    std::fs::create_dir(&sub).unwrap();
    let fifo = dir.path().join("pipe.yaml");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());

    let (code, stdout) = validate_binary(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stdout}");
    for path in [&dangling, &sub, &fifo] {
        assert!(
            stdout.contains(&format!("{}: error: ", path.display())),
            "{} not reported:\n{stdout}",
            path.display()
        );
    }
}

/// One object, many mistakes: each one is reported, at its own position, in one run.
const MANY_IN_ONE: &str = r#"apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: many
  labels: {team: [a]}
spec:
  destination:
    type: FQDN
    fqdn: {hostname: api.example.com, color: blue}
    ports: [{number: eighty}, {number: 443, name: [x]}, {number: 70000}, {number: 8443}]
  protocol: HTTP9
  tls: {mode: Sideways, sni: [a]}
  fallback: maybe
  colour: red
"#;

#[test]
fn every_error_of_an_object_is_reported_in_one_run_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "gateway.yaml", GATEWAY);
    let file = write(dir.path(), "many.yaml", MANY_IN_ONE);

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let found = errors(&loaded.diagnostics);
    // (field, where: context and token, message)
    let expected = [
        (
            "metadata.labels.team",
            ("team: [a]", "["),
            "expected a string",
        ),
        (
            "spec.destination.fqdn.color",
            ("color", "color"),
            "unknown field `color`",
        ),
        (
            "spec.destination.ports[0].number",
            ("eighty", "eighty"),
            "expected an integer",
        ),
        (
            "spec.destination.ports[1].name",
            ("name: [x]", "["),
            "expected a string",
        ),
        (
            "spec.destination.ports[2].number",
            ("70000", "70000"),
            "out of range",
        ),
        ("spec.protocol", ("HTTP9", "HTTP9"), "unknown value `HTTP9`"),
        (
            "spec.tls.mode",
            ("Sideways", "Sideways"),
            "unknown value `Sideways`",
        ),
        ("spec.tls.sni", ("sni: [a]", "["), "expected a string"),
        ("spec.fallback", ("maybe", "maybe"), "expected a boolean"),
        (
            "spec.colour",
            ("colour", "colour"),
            "unknown field `colour`",
        ),
    ];
    for (field, (context, token), message) in expected {
        let (line, column) = spot(MANY_IN_ONE, context, token);
        let hit = found.iter().any(|d| {
            d.file == file
                && d.field == field
                && (d.line, d.column) == (line, column)
                && d.message.contains(message)
                && d.object.as_ref().map(ToString::to_string).as_deref()
                    == Some("Backend default/many")
        });
        assert!(
            hit,
            "no `{message}` at {line}:{column} {field}:\n{}",
            render(&loaded.diagnostics)
        );
    }
    // Nothing else: leaving a bad value out reports no "missing field" for it.
    assert_eq!(
        found.len(),
        expected.len(),
        "{}",
        render(&loaded.diagnostics)
    );
    assert!(loaded.set.backends.is_empty());
}

#[test]
fn a_field_missing_from_the_start_is_still_reported_next_to_other_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "gateway.yaml", GATEWAY);
    let text = "apiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {name: noports}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {hostname: api.example.com}\n  fallback: maybe\n";
    write(dir.path(), "backend.yaml", text);

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let found = errors(&loaded.diagnostics);
    assert!(
        found
            .iter()
            .any(|d| d.field == "spec.destination" && d.message.contains("missing field `ports`")),
        "{}",
        render(&loaded.diagnostics)
    );
    assert!(
        found.iter().any(|d| d.field == "spec.fallback"),
        "{}",
        render(&loaded.diagnostics)
    );
    assert_eq!(found.len(), 2, "{}", render(&loaded.diagnostics));
}

#[test]
fn errors_of_one_object_are_capped_at_fifty_with_a_warning_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "gateway.yaml", GATEWAY);
    let mut text = BACKEND.to_owned();
    for i in 0..60 {
        text.push_str(&format!("  unknown{i}: 1\n"));
    }
    write(dir.path(), "backend.yaml", &text);

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    assert_eq!(
        errors(&loaded.diagnostics).len(),
        50,
        "{}",
        render(&loaded.diagnostics)
    );
    let note = loaded
        .diagnostics
        .iter()
        .find(|d| d.severity == Severity::Warning)
        .unwrap_or_else(|| panic!("no warning:\n{}", render(&loaded.diagnostics)));
    assert!(note.message.contains("only the first 50 errors"), "{note}");
}

// ---------------------------------------------------------------------------------------------
// Point 8: alias expansion bounded in bytes, files and the whole config bounded in size
// ---------------------------------------------------------------------------------------------

/// The issue's bomb: a 50 KB string anchored once and aliased 10,000 times (90 KB of YAML,
/// 500 MB expanded).
fn alias_bomb() -> String {
    let mut text = format!("big: &b \"{}\"\nlist:\n", "x".repeat(50_000));
    for _ in 0..10_000 {
        text.push_str("- *b\n");
    }
    text
}

#[test]
fn alias_expansion_is_bounded_in_bytes_and_reported_at_the_alias() {
    let dir = valid_dir();
    let bomb = alias_bomb();
    let file = write(dir.path(), "bomb.yaml", &bomb);

    let limits = LoadLimits {
        max_alias_bytes: 1 << 20,
        ..LoadLimits::default()
    };
    let loaded = load_paths_with(&[dir.path().to_path_buf()], &limits);
    let d = only_error_for(&loaded.diagnostics, &file);
    assert!(
        d.message
            .contains("anchors and aliases expand to more than 1Mi"),
        "{d}"
    );
    // The alias that went over: the anchor (one copy) and 19 aliases of ~50 KB fit in 1 MiB,
    // the 20th does not. Its line is 2 (header) + 20.
    assert_eq!((d.line, d.column), (22, 3), "{d}");
    // The rest of the config still loaded (it is reported, not silently dropped).
    assert_eq!(loaded.set.gateways.len(), 1);
}

#[test]
fn nested_anchors_without_any_alias_count_against_the_budget() {
    // Each anchor keeps a copy of its node: 100 nested anchors around one 100 KB list would
    // copy it 100 times without a single alias.
    let dir = tempfile::tempdir().unwrap();
    let inner = vec!["x"; 50_000].join(",");
    let mut text = String::from("k: ");
    for i in 0..100 {
        text.push_str(&format!("&a{i} ["));
    }
    text.push_str(&inner);
    text.push_str(&"]".repeat(100));
    text.push('\n');
    let file = write(dir.path(), "nested.yaml", &text);

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let d = only_error_for(&loaded.diagnostics, &file);
    assert!(
        d.message
            .contains("anchors and aliases expand to more than 4Mi"),
        "{d}"
    );
}

#[test]
fn validate_binary_reports_the_alias_bomb_at_its_position_and_exits_1() {
    let dir = valid_dir();
    let file = write(dir.path(), "bomb.yaml", &alias_bomb());

    let started = Instant::now();
    let (code, stdout) = validate_binary(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let prefix = format!("{}:", file.display());
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no error for the bomb:\n{stdout}"));
    let positioned = regex::Regex::new(
        r"^.*bomb\.yaml:\d+:\d+: error: anchors and aliases expand to more than 4Mi",
    )
    .unwrap();
    assert!(positioned.is_match(line), "{line}");
    println!("validate took {:?}", started.elapsed());
}

#[test]
fn file_over_the_size_limit_is_an_error_and_the_flag_raises_the_limit() {
    let dir = valid_dir();
    // A valid file of 3 KiB: a comment padding a Backend.
    let padded = format!(
        "# {}\n{}",
        "-".repeat(3 * 1024),
        BACKEND.replace("name: api", "name: padded")
    );
    let file = write(dir.path(), "padded.yaml", &padded);

    let limits = LoadLimits {
        max_file_bytes: 2 * 1024,
        ..LoadLimits::default()
    };
    let loaded = load_paths_with(&[dir.path().to_path_buf()], &limits);
    let d = only_error_for(&loaded.diagnostics, &file);
    assert!(d.message.contains("more than the 2Ki"), "{d}");
    assert!(loaded.set.backends.iter().all(|b| &*b.id.name != "padded"));

    // The binary takes the limit from its flag or the environment.
    let (code, stdout) = validate_binary(dir.path(), &[("EGRESSD_MAX_CONFIG_FILE_SIZE", "2Ki")]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("{}: error: file is", file.display())),
        "{stdout}"
    );
    let (code, stdout) = validate_binary(dir.path(), &[("EGRESSD_MAX_CONFIG_FILE_SIZE", "4Ki")]);
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn config_over_the_total_limit_is_an_error_naming_the_file_that_crossed_it() {
    let dir = valid_dir();
    for i in 0..4 {
        let backend = BACKEND.replace("name: api", &format!("name: more-{i}"));
        write(dir.path(), &format!("more-{i}.yaml"), &backend);
    }
    let sizes: u64 = ["backend.yaml", "gateway.yaml", "more-0.yaml"]
        .iter()
        .map(|f| std::fs::metadata(dir.path().join(f)).unwrap().len())
        .sum();
    // Room for the first three files (in name order), not the fourth.
    let limits = LoadLimits {
        max_total_bytes: sizes + 10,
        ..LoadLimits::default()
    };
    let loaded = load_paths_with(&[dir.path().to_path_buf()], &limits);
    let d = only_error_for(&loaded.diagnostics, &dir.path().join("more-1.yaml"));
    assert!(d.message.contains("the config is larger than"), "{d}");
    assert!(d.message.contains("2 more"), "{d}");
    assert_eq!(errors(&loaded.diagnostics).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Point 7: empty files, configs that declare no listener
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_and_whitespace_only_files_are_warnings_naming_them() {
    let dir = valid_dir();
    let empty = write(dir.path(), "empty.yaml", "");
    let blank = write(dir.path(), "blank.yaml", "  \n\n\t\n");

    let loaded = load_paths(&[dir.path().to_path_buf()]);
    for file in [&empty, &blank] {
        let d = loaded
            .diagnostics
            .iter()
            .find(|d| d.file == *file)
            .unwrap_or_else(|| panic!("nothing about {}", file.display()));
        assert_eq!(d.severity, Severity::Warning, "{d}");
        assert!(d.message.contains("file is empty"), "{d}");
    }
    assert!(validate(&[dir.path().to_path_buf()]).ok);
}

#[test]
fn validate_of_a_directory_without_a_listener_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "backend.yaml", BACKEND);
    let (code, stdout) = validate_binary(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("declares no listener"), "{stdout}");

    // An emptied file leaves nothing at all: the same.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "egressd.yaml", "");
    let v = validate(&[dir.path().to_path_buf()]);
    assert!(!v.ok, "{}", v.report);
    assert!(v.report.contains("declares no listener"), "{}", v.report);
    assert!(
        v.report.contains("egressd.yaml: warning: file is empty"),
        "{}",
        v.report
    );
}

#[tokio::test]
async fn first_config_without_a_listener_is_not_served_and_ready_stays_503() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "backend.yaml", BACKEND);
    let options = egressd::Options {
        config: vec![dir.path().to_path_buf()],
        workers: 1,
        admin_address: Some("127.0.0.1:0".parse().unwrap()),
        watch: None,
    };
    let proxy = egressd::Proxy::start(options)
        .await
        .expect("egressd starts");
    let admin = proxy.admin_addr().await.expect("the admin server is up");

    assert_eq!(get(admin, "localhost", "/ready").await.status, 503);
    let status = get(admin, "localhost", "/status").await.text();
    assert!(status.contains("declares no listener"), "{status}");
    assert_eq!(proxy.shared().snapshot.load().generation, 0);
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Point 10: values that may be secrets never leave in a dump, /status or the log
// ---------------------------------------------------------------------------------------------

const BEARER: &str = "s3cr3t-bearer-value";
const SIGNATURE: &str = "s3cr3t-signature";
const QUERY: &str = "s3cr3t-query-token";
const RESPONSE: &str = "s3cr3t-response-value";
const ADDED: &str = "s3cr3t-added-value";
const CREDENTIAL_PATH_MARK: &str = "credential-file";

/// A route using every field kind that carries a value: request and response header
/// modifiers (set and add), header and query parameter matches (exact and regex).
fn route_with_every_value_kind() -> String {
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: signed}}
spec:
  hostnames: [api.test]
  rules:
  - matches:
    - path: {{type: PathPrefix, value: /v1/visible-path}}
      headers:
      - {{name: X-Signature, value: {SIGNATURE}}}
      - {{name: X-Signature-Re, type: RegularExpression, value: "{SIGNATURE}-[0-9]+"}}
      queryParams:
      - {{name: token, value: {QUERY}}}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{{name: X-Upstream-Bearer, value: {BEARER}}}]
        add: [{{name: X-Added, value: {ADDED}}}]
        remove: [X-Removed]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set: [{{name: X-Response-Secret, value: {RESPONSE}}}]
    backendRefs: [{{name: api}}]
"#
    )
}

#[tokio::test]
async fn config_dump_redacts_every_value_field_and_keeps_names_paths_and_hostnames() {
    let upstream = Upstream::start("api").await;
    let key_dir = tempfile::tempdir().unwrap();
    let key = write(key_dir.path(), CREDENTIAL_PATH_MARK, "s3cr3t-credential\n");
    let injector = format!(
        "  extensions:\n  - name: key\n    type: CredentialInjector\n    config: {{header: Authorization, prefix: \"Bearer \", credential: {{valueFile: \"{}\"}}}}\n",
        key.display()
    );
    let yaml = preamble(None)
        + &ip_backend("api", upstream.addr, &injector)
        + &route_with_every_value_kind();
    let proxy = TestProxy::start(&yaml).await;

    let dump = get(proxy.admin, "localhost", "/config").await;
    assert_eq!(dump.status, 200);
    let text = dump.text();
    for secret in [
        BEARER,
        SIGNATURE,
        QUERY,
        RESPONSE,
        ADDED,
        "s3cr3t-credential",
    ] {
        assert!(
            !text.contains(secret),
            "{secret} leaked in /config:\n{text}"
        );
    }
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let objects = json["objects"].as_array().unwrap();
    let route = objects.iter().find(|o| o["kind"] == "HTTPRoute").unwrap();
    let rule = &route["spec"]["rules"][0];
    let backend = objects.iter().find(|o| o["kind"] == "Backend").unwrap();
    // Each field kind, listed: the value redacted, the name kept.
    let fields = [
        (
            "header match",
            &rule["matches"][0]["headers"][0],
            "X-Signature",
        ),
        (
            "regex header match",
            &rule["matches"][0]["headers"][1],
            "X-Signature-Re",
        ),
        (
            "query param match",
            &rule["matches"][0]["queryParams"][0],
            "token",
        ),
        (
            "request header set",
            &rule["filters"][0]["requestHeaderModifier"]["set"][0],
            "X-Upstream-Bearer",
        ),
        (
            "request header add",
            &rule["filters"][0]["requestHeaderModifier"]["add"][0],
            "X-Added",
        ),
        (
            "response header set",
            &rule["filters"][1]["responseHeaderModifier"]["set"][0],
            "X-Response-Secret",
        ),
    ];
    for (kind, field, name) in fields {
        println!("{kind}: {field}");
        assert_eq!(field["name"], name, "{kind}: {field}");
        assert_eq!(field["value"], "<redacted>", "{kind}: {field}");
    }
    let credential = &backend["spec"]["extensions"][0]["config"]["credential"];
    println!("credential: {credential}");
    assert_eq!(credential, "<redacted>");
    // What is not a secret stays readable.
    assert_eq!(rule["matches"][0]["path"]["value"], "/v1/visible-path");
    assert_eq!(route["spec"]["hostnames"][0], "api.test");
    assert_eq!(
        rule["filters"][0]["requestHeaderModifier"]["remove"][0],
        "X-Removed"
    );
    assert_eq!(
        backend["spec"]["extensions"][0]["config"]["header"],
        "Authorization"
    );
}

#[tokio::test]
async fn rejected_values_are_not_quoted_in_status_nor_in_the_log() {
    let upstream = Upstream::start("a").await;
    let dir = tempfile::tempdir().unwrap();
    let good = TestConfig::new()
        .backend("a", upstream.addr)
        .route_to("a")
        .yaml();
    let config = write(dir.path(), "egressd.yaml", &good);
    let egressd = Egressd::spawn(dir.path()).await;
    let generation = egressd.generation().await;

    // A header value with a line break and a regex that does not compile: both invalid, and
    // both may be secrets.
    let bad = good.replace(
        "  rules:\n  - backendRefs:",
        &format!(
            "  rules:\n  - matches:\n    - headers:\n      - {{name: X-Signature, type: RegularExpression, value: \"({SIGNATURE}\"}}\n    filters:\n    - type: RequestHeaderModifier\n      requestHeaderModifier:\n        set: [{{name: X-Upstream-Bearer, value: \"{BEARER}\\nx\"}}]\n    backendRefs:"
        ),
    );
    assert_ne!(bad, good);
    std::fs::write(&config, &bad).unwrap();

    let e = &egressd;
    let refused = poll_within(Duration::from_secs(10), || async move {
        e.status().await["lastReload"]["result"] == "failure"
    })
    .await
    .is_some();
    if !refused {
        egressd.fail("the bad config was not refused");
    }
    let status = egressd.admin_get("/status").await.unwrap().text();
    assert!(status.contains("X-Upstream-Bearer"), "{status}");
    assert!(status.contains("X-Signature"), "{status}");
    for secret in [BEARER, SIGNATURE] {
        assert!(
            !status.contains(secret),
            "{secret} quoted in /status:\n{status}"
        );
        assert!(
            !egressd.stderr().contains(secret),
            "{secret} quoted in the log:\n{}",
            egressd.stderr()
        );
    }
    assert_eq!(egressd.generation().await, generation);
    let served = common::binary::try_get(egressd.listener_addr(LISTENER).await, HOST, "/").await;
    assert_eq!(served.map(|r| r.status).ok(), Some(http::StatusCode::OK));
}

#[test]
fn an_upper_case_yaml_extension_is_a_warning_naming_the_file() {
    let dir = valid_dir();
    let shouting = write(dir.path(), "policy.YAML", BACKEND);
    let diags = load_paths(&[dir.path().to_path_buf()]).diagnostics;
    let warned: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.file == shouting && d.severity == Severity::Warning)
        .collect();
    assert_eq!(warned.len(), 1, "{}", render(&diags));
    assert!(
        warned[0].message.contains("lower-case .yaml"),
        "{}",
        warned[0]
    );
}

/// What a refused config says keeps serving: at start with the listener's port taken there is
/// none ("no config is serving yet", not "the last good config keeps serving"); once one is
/// accepted, a refused reload names its generation, in the error, the log and `/status`.
#[tokio::test]
async fn a_refused_start_and_a_refused_reload_say_what_keeps_serving() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let gateway = GATEWAY.replace("port: 0", &format!("port: {port}"));
    let config = write(dir.path(), "egressd.yaml", &gateway);
    let options = egressd::Options {
        config: vec![dir.path().to_path_buf()],
        workers: 1,
        admin_address: Some("127.0.0.1:0".parse().unwrap()),
        watch: None,
    };
    let proxy = egressd::Proxy::start(options)
        .await
        .expect("egressd starts");
    assert_eq!(proxy.shared().snapshot.load().generation, 0);
    let refused = proxy
        .reload()
        .await
        .expect_err("the port is taken")
        .to_string();
    assert!(refused.ends_with("; no config is serving yet"), "{refused}");
    assert!(!refused.contains("last good"), "{refused}");

    drop(taken);
    let serving = proxy.reload().await.expect("the port is free now");
    // A Backend that loads, with an error the compiler finds: it has a status.
    let mutual = format!("{BACKEND}  tls: {{mode: Mutual}}\n");
    std::fs::write(&config, format!("{gateway}---\n{mutual}")).unwrap();
    let refused = proxy
        .reload()
        .await
        .expect_err("an invalid config")
        .to_string();
    assert!(
        refused.ends_with(&format!("; still serving generation {serving}")),
        "{refused}"
    );
    let admin = proxy.admin_addr().await.expect("admin");
    let status = get(admin, "localhost", "/status").await.text();
    assert!(
        status.contains(&format!(
            "the config has errors; generation {serving} keeps serving"
        )),
        "{status}"
    );
    proxy.shutdown().await;
}

/// A reload step that takes longer than `--reload-timeout` fails the reload, said as such
/// (a config file on a hung mount would otherwise wedge reloads for good). 1 ms is far less
/// than checking 3,000 Backends takes.
#[tokio::test]
async fn a_reload_over_the_reload_timeout_is_reported_as_failed() {
    let dir = valid_dir();
    let mut many = String::new();
    for i in 0..3000 {
        many.push_str(&format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: b{i}}}\n\
             spec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: h{i}.many.test}}\n    \
             ports: [{{number: 443}}]\n"
        ));
    }
    write(dir.path(), "many.yaml", &many);
    let scratch = tempfile::tempdir().unwrap();
    let address_file = scratch.path().join("admin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["run", "--no-watch", "--reload-timeout", "1ms", "--config"])
        .arg(dir.path())
        .args(["--admin-address", "127.0.0.1:0", "--admin-address-file"])
        .arg(&address_file)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run egressd");
    // The admin server comes up once the first load has failed.
    poll_within(Duration::from_secs(30), || {
        let written = address_file.exists().then_some(());
        async move { written }
    })
    .await
    .expect("the admin address is written");
    let _ = child.kill();
    let output = child.wait_with_output().expect("egressd output");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(
        log.contains("did not finish within 1ms (reload timeout)")
            && log.contains("no config is serving yet"),
        "{log}"
    );
}
