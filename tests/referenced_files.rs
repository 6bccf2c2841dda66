//! Files the config names (CA bundles, credentials, the MCP session key) are read only when
//! they are regular files, and only up to a bound per kind (issue #31, point 3): a FIFO never
//! blocks the loader, `/dev/zero` never fills memory, `/dev/urandom` never spins; each is an
//! error naming the file, and `egressd validate` finishes.

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// Generous: what is tested is that validate finishes at all.
const WITHIN: Duration = Duration::from_secs(30);

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  listeners: [{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}]\n";

/// A Backend trusting the CA bundle at `ca` and injecting the credential in `credential`.
fn backend(ca: &Path, credential: &Path) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: api}}
spec:
  destination:
    type: FQDN
    fqdn: {{hostname: api.example.com}}
    ports: [{{number: 443}}]
  tls:
    mode: Simple
    validation:
      caCertificateFiles: [{ca:?}]
  extensions:
  - name: key
    type: CredentialInjector
    config: {{header: Authorization, credential: {{valueFile: {credential:?}}}}}
"#,
        ca = ca.display().to_string(),
        credential = credential.display().to_string(),
    )
}

/// `egressd validate dir`: exit code and everything it printed; fails the test if it hangs.
fn validate(dir: &Path) -> (Option<i32>, String) {
    let (done, result) = mpsc::channel();
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
            .arg("validate")
            .arg(&dir)
            .env_remove("RUST_LOG")
            .output()
            .expect("run egressd validate");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let _ = done.send((out.status.code(), text));
    });
    result
        .recv_timeout(WITHIN)
        .expect("egressd validate did not finish: a referenced file blocked or never ended")
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success());
}

#[test]
fn a_fifo_as_ca_bundle_and_dev_zero_as_credential_are_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ca.pem");
    mkfifo(&fifo);
    let yaml = GATEWAY.to_owned() + &backend(&fifo, Path::new("/dev/zero"));
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let (code, out) = validate(dir.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("ca.pem") && out.contains("FIFO"), "{out}");
    assert!(
        out.contains("/dev/zero") && out.contains("a device"),
        "{out}"
    );
}

#[test]
fn dev_urandom_as_ca_bundle_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let credential = dir.path().join("token");
    std::fs::write(&credential, "secret-token\n").unwrap();
    let yaml = GATEWAY.to_owned() + &backend(Path::new("/dev/urandom"), &credential);
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let (code, out) = validate(dir.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("/dev/urandom") && out.contains("a device"),
        "{out}"
    );
    // At the entry that names the file (line 18, column 28: the list's item).
    assert!(
        out.lines().any(|l| l.contains(
            "egressd.yaml:18:28: error: Backend default/api: \
             spec.tls.validation.caCertificateFiles[0]: TLS settings of port 443"
        )),
        "{out}"
    );
    assert!(
        !out.contains("secret-token"),
        "the credential leaked: {out}"
    );
}

#[test]
fn an_oversized_credential_file_is_refused_naming_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not PEM").unwrap();
    let credential = dir.path().join("token");
    std::fs::write(&credential, vec![b'a'; 1 << 20]).unwrap();
    let yaml = GATEWAY.to_owned() + &backend(&ca, &credential);
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let (code, out) = validate(dir.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("token") && out.contains("more than 65536"),
        "{out}"
    );
}

#[test]
fn a_fifo_as_mcp_session_key_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("session.key");
    mkfifo(&fifo);
    let proxy = format!(
        "apiVersion: egressd.dev/v1alpha1\nkind: ProxyConfig\nmetadata: {{name: egressd}}\nspec:\n  mcp: {{sessionKeyFile: {:?}}}\n---\n",
        fifo.display().to_string()
    );
    std::fs::write(dir.path().join("egressd.yaml"), proxy + GATEWAY).unwrap();
    let (code, out) = validate(dir.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("session.key") && out.contains("FIFO"), "{out}");
}
