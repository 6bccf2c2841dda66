//! `egressd ca init`: the files it writes (modes, contents as openssl reads them), what it
//! prints, and that it never overwrites a CA. Leaves signed with such a CA are checked with
//! `openssl verify` by the unit tests of `src/interception` (the module is crate-private).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn egressd_in_shell(script_prefix: &str, args: &[&str]) -> Output {
    // `sh -c '<prefix>; exec egressd "$@"'`: a umask for the child without touching ours.
    let script = format!("{script_prefix}; exec \"$0\" \"$@\"");
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_egressd"))
        .args(args)
        .output()
        .expect("egressd runs")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("exists")
        .permissions()
        .mode()
        & 0o7777
}

fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ca_init_writes_a_name_constrained_ca_with_private_key_modes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("ca");
    let dir_str = dir.to_str().expect("UTF-8");
    // umask 077 would make a plain create 0600: ca.crt must still be 0644.
    let out = egressd_in_shell(
        "umask 077",
        &[
            "ca",
            "init",
            dir_str,
            "--name",
            "Ops Interception CA",
            "--permitted-dns",
            "example.com",
            "--permitted-dns",
            ".Internal.Test",
            "--validity",
            "90",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cert = dir.join("ca.crt");
    let key = dir.join("ca.key");
    assert_eq!(mode(&cert), 0o644);
    assert_eq!(mode(&key), 0o600);
    let cert_str = cert.to_str().expect("UTF-8");
    let text = openssl(&["x509", "-in", cert_str, "-noout", "-text"]);
    assert!(text.contains("CA:TRUE, pathlen:0"), "{text}");
    assert!(text.contains("Certificate Sign, CRL Sign"), "{text}");
    assert!(text.contains("X509v3 Name Constraints: critical"), "{text}");
    assert!(text.contains("DNS:example.com"), "{text}");
    assert!(text.contains("DNS:internal.test"), "{text}");
    assert!(text.contains("Subject: CN = Ops Interception CA"), "{text}");
    assert!(text.contains("NIST CURVE: P-256"), "{text}");
    let end = openssl(&["x509", "-in", cert_str, "-noout", "-checkend", "7689600"]);
    assert!(end.contains("will not expire"), "89 days: {end}");
    let fingerprint = openssl(&["x509", "-in", cert_str, "-noout", "-fingerprint", "-sha256"]);
    let fingerprint = fingerprint.trim().trim_start_matches("sha256 Fingerprint=");
    assert!(
        stdout.contains(&format!("SHA-256 fingerprint: {fingerprint}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("curl --cacert {cert_str}")),
        "{stdout}"
    );
    assert!(stdout.contains(key.to_str().expect("UTF-8")), "{stdout}");
    // The key is the certificate's and openssl reads it.
    let key_pub = openssl(&["pkey", "-in", key.to_str().expect("UTF-8"), "-pubout"]);
    let cert_pub = openssl(&["x509", "-in", cert_str, "-noout", "-pubkey"]);
    assert_eq!(key_pub, cert_pub);
}

#[test]
fn ca_init_never_overwrites() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let dir_str = dir.to_str().expect("UTF-8");
    let first = egressd_in_shell("true", &["ca", "init", dir_str]);
    assert!(first.status.success());
    let cert = std::fs::read(dir.join("ca.crt")).expect("ca.crt");
    let key = std::fs::read(dir.join("ca.key")).expect("ca.key");
    let second = egressd_in_shell("true", &["ca", "init", dir_str]);
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("exists; egressd ca init never overwrites"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(dir.join("ca.crt")).expect("ca.crt"), cert);
    assert_eq!(std::fs::read(dir.join("ca.key")).expect("ca.key"), key);
    // A key alone (a CA half moved away) is not overwritten either, and no certificate is
    // written next to it.
    std::fs::remove_file(dir.join("ca.crt")).expect("rm");
    let third = egressd_in_shell("true", &["ca", "init", dir_str]);
    assert_eq!(third.status.code(), Some(1));
    assert!(!dir.join("ca.crt").exists());
    assert_eq!(std::fs::read(dir.join("ca.key")).expect("ca.key"), key);
}

#[test]
fn ca_init_refuses_what_is_not_a_dns_suffix() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir_str = tmp.path().to_str().expect("UTF-8");
    let out = egressd_in_shell(
        "true",
        &["ca", "init", dir_str, "--permitted-dns", "*.example.com"],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--permitted-dns \"*.example.com\" is not a DNS name"),
        "{stderr}"
    );
    assert!(!tmp.path().join("ca.key").exists());
}

/// `ca init --config DIR` permits exactly what the config could intercept: the hostname of a
/// Backend port whose TLS egressd originates, a wildcard Backend's domain, a route's hostname
/// — not a Passthrough or plaintext Backend's, nor a port with `interception: Disabled`.
#[test]
fn ca_init_takes_its_name_constraints_from_the_config() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("config");
    std::fs::create_dir(&config).unwrap();
    let backend = |name: &str, host: &str, extra: &str| {
        format!("---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: \"{host}\"}}\n    ports: [{{number: 443{extra}}}]\n")
    };
    let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  listeners:\n  - {name: http, address: 127.0.0.1, port: 0, protocol: HTTP}\n".to_owned()
        + &backend("github", "api.github.com", "")
        + &backend("pkgs", "*.pkgs.example", "")
        + &backend("pkgs-api", "api.pkgs.example", "")
        + &backend("opted-out", "secret.test", ", interception: Disabled")
        + &backend("plain", "plain.test", "")
        + "  tls: {mode: InsecureDisable}\n"
        + &backend("tunnel", "tunnel.test", "")
        + "  tls: {mode: Passthrough}\n"
        + "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  hostnames: [routed.test]\n  rules: [{backendRefs: [{name: github}]}]\n";
    std::fs::write(config.join("egressd.yaml"), yaml).unwrap();
    let dir = tmp.path().join("ca");
    let out = egressd_in_shell(
        "true",
        &[
            "ca",
            "init",
            dir.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "permitted DNS names (from the config): api.github.com, pkgs.example, routed.test"
        ),
        "{stdout}"
    );
    let text = openssl(&[
        "x509",
        "-in",
        dir.join("ca.crt").to_str().unwrap(),
        "-noout",
        "-text",
    ]);
    for name in ["api.github.com", "pkgs.example", "routed.test"] {
        assert!(text.contains(&format!("DNS:{name}")), "{name}: {text}");
    }
    for name in ["secret.test", "plain.test", "tunnel.test"] {
        assert!(!text.contains(name), "{name}: {text}");
    }
}
