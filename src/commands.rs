//! What the CLI subcommands do, apart from argument parsing (`main.rs`).

use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{load_paths, promote_warnings};
use crate::runtime::compile::{compile, Compiled};
use crate::runtime::reload::refuse_without_listeners;
use crate::upstream::dns::DnsResolver;
use crate::upstream::registry::StateRegistry;

/// The report of `egressd validate`: every diagnostic, then each object's conditions.
pub struct Validation {
    pub ok: bool,
    pub report: String,
}

/// How `egressd validate` judges and reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct ValidateOptions {
    /// Every warning is an error (`--strict`), as `ProxyConfig.spec.strict` makes it for
    /// reloads.
    pub strict: bool,
    /// Every object's conditions, the fine ones too (`--verbose`); by default only what is
    /// not fine is listed.
    pub verbose: bool,
}

/// Loads and compiles `paths` exactly as a reload would, without touching the network.
pub fn validate(paths: &[PathBuf]) -> Validation {
    validate_compiled(paths, ValidateOptions::default()).0
}

/// [`validate`] with `options`.
pub fn validate_with(paths: &[PathBuf], options: ValidateOptions) -> Validation {
    validate_compiled(paths, options).0
}

/// As [`validate`], also handing back what was compiled (`None` only when DNS could not even
/// be set up), for `egressd check --probe` to probe exactly the Backends a reload would serve.
pub fn validate_compiled(
    paths: &[PathBuf],
    options: ValidateOptions,
) -> (Validation, Option<Compiled>) {
    let loaded = load_paths(paths);
    let files = loaded.set.files.len();
    // A resolver is needed to build the registry; nothing is resolved during validation.
    let resolver = DnsResolver::new(&[])
        .or_else(|_| DnsResolver::new(&["127.0.0.1:53".parse().expect("literal address")]));
    let registry = match resolver {
        Ok(r) => Arc::new(StateRegistry::new(r)),
        Err(e) => {
            let validation = Validation {
                ok: false,
                report: format!("cannot set up DNS for validation: {e}\n"),
            };
            return (validation, None);
        }
    };
    let mut compiled = compile(Arc::new(loaded.set), loaded.diagnostics, &registry, 1);
    // A reload would refuse it, so validation does too.
    refuse_without_listeners(&mut compiled, paths);
    if options.strict {
        promote_warnings(&mut compiled.diagnostics, "--strict");
    }
    let report = report(&compiled, files, options.verbose);
    let validation = Validation {
        ok: compiled.errors().next().is_none(),
        report,
    };
    (validation, Some(compiled))
}

/// Every diagnostic, then each object's conditions (only those not fine unless `verbose`),
/// then the counts.
fn report(compiled: &Compiled, files: usize, verbose: bool) -> String {
    let mut report = String::new();
    for d in &compiled.diagnostics {
        let _ = writeln!(report, "{d}");
    }
    let errors = compiled.errors().count();
    let warnings = compiled.diagnostics.len() - errors;
    if !compiled.diagnostics.is_empty() {
        report.push('\n');
    }
    let status = compiled.status();
    let mut fine = 0;
    for object in &status.objects {
        let shown: Vec<_> = object
            .conditions
            .iter()
            .filter(|c| verbose || !c.is_fine())
            .collect();
        if shown.is_empty() {
            fine += 1;
            continue;
        }
        let _ = writeln!(report, "{} ({})", object.object, object.file.display());
        for c in shown {
            let _ = write!(report, "  {}={} {}", c.kind, c.status, c.reason);
            if !c.message.is_empty() {
                let _ = write!(report, ": {}", c.message);
            }
            report.push('\n');
        }
    }
    let objects = status.objects.len();
    if fine > 0 && !verbose {
        let _ = writeln!(
            report,
            "{fine} object(s) with nothing to report (--verbose lists their conditions)"
        );
    }
    let _ = writeln!(
        report,
        "\n{}: {files} file(s), {objects} object(s), {errors} error(s), {warnings} warning(s)",
        if errors == 0 { "valid" } else { "invalid" }
    );
    report
}

/// `egressd healthcheck`: asks the admin server at `admin` for `path` (`/healthz`, `/ready`)
/// and gives its status code. For exec probes and container health checks where the admin
/// server listens on loopback only (a sidecar's), since the image has no shell or curl.
pub fn healthcheck(
    admin: std::net::SocketAddr,
    path: &str,
    timeout: std::time::Duration,
) -> Result<u16, String> {
    use std::io::{Read, Write};
    if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!("{path:?} is not a path (e.g. /healthz)"));
    }
    let mut stream = std::net::TcpStream::connect_timeout(&admin, timeout)
        .map_err(|e| format!("cannot connect to {admin}: {e}"))?;
    let io = |e: std::io::Error| format!("{admin}: {e}");
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    // The status line is all that is read: `HTTP/1.1 200 OK`.
    let mut head = [0u8; 64];
    let mut filled = 0;
    while filled < 12 {
        match stream.read(&mut head[filled..]).map_err(io)? {
            0 => break,
            n => filled += n,
        }
    }
    let line = String::from_utf8_lossy(&head[..filled]);
    line.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{admin} did not answer HTTP: {line:?}"))
}

pub use crate::interception::init::{
    CaInitOptions, CaInitReport, DEFAULT_NAME as CA_DEFAULT_NAME,
    DEFAULT_VALIDITY_DAYS as CA_DEFAULT_VALIDITY_DAYS,
};

/// `egressd ca init`: makes an interception CA and writes `ca.crt` and `ca.key` into
/// `options.dir`; the error says why nothing (or nothing usable) was written.
/// The DNS suffixes a CA for the config at `paths` needs to sign for (`egressd ca init
/// --config`): every name a CONNECT could be intercepted for, a wildcard `*.example.com` as
/// `example.com`, names under another in the list left out. Empty when the config has none;
/// an error when it does not load, or when a name is an IP address (name constraints on DNS
/// names alone would let the CA sign for any address).
pub fn interception_names(paths: &[PathBuf]) -> Result<Vec<String>, String> {
    let (validation, compiled) = validate_compiled(paths, ValidateOptions::default());
    let compiled = match compiled {
        Some(compiled) if validation.ok => compiled,
        _ => return Err(format!("the config does not load:\n{}", validation.report)),
    };
    let mut names: Vec<String> = compiled
        .snapshot
        .routers
        .values()
        .flat_map(|router| router.interceptable_names())
        .map(|name| {
            name.trim_start_matches("*.")
                .trim_start_matches('.')
                .to_owned()
        })
        .collect();
    if let Some(ip) = names
        .iter()
        .find(|n| n.parse::<std::net::IpAddr>().is_ok() || n.starts_with('['))
    {
        return Err(format!("{ip} is an IP address: a CA constrained to DNS names would still sign for it; make the CA without --config"));
    }
    names.sort();
    names.dedup();
    // `api.example.com` needs nothing once `example.com` is permitted.
    let covered = |n: &String, by: &String| n != by && n.ends_with(&format!(".{by}"));
    let kept = names
        .iter()
        .filter(|n| !names.iter().any(|by| covered(n, by)))
        .cloned()
        .collect();
    Ok(kept)
}

pub fn ca_init(options: &CaInitOptions) -> Result<CaInitReport, String> {
    crate::interception::init::init(options).map_err(|e| e.to_string())
}
