//! `egressd validate` on broken configs: each kind of mistake is reported at the exact
//! `file:line:column` of the offending text, with the object, the field path and a hint; every
//! mistake of a directory is reported in one run; each object's status conditions are printed.
//!
//! Fixtures live in `tests/fixtures/invalid/<case>/`. Expected positions are computed from the
//! fixture text (the offending token is searched for), never written as numbers here, so a
//! fixture can gain a comment line without silently breaking or weakening a test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use egressd::commands::{validate_with, ValidateOptions, Validation};
use egressd::config::{load_paths, Diagnostic, Reason, Severity};
use egressd::runtime::compile::compile;
use egressd::upstream::dns::DnsResolver;
use egressd::upstream::registry::StateRegistry;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid")
        .join(case)
}

/// Where a diagnostic must point: `token`, found inside `context`, which must occur exactly
/// once in the file. The context disambiguates tokens that also appear elsewhere (in a comment,
/// or another object); often the two are equal.
struct Spot<'a> {
    file: &'a str,
    context: &'a str,
    token: &'a str,
}

fn spot<'a>(file: &'a str, context: &'a str, token: &'a str) -> Spot<'a> {
    Spot {
        file,
        context,
        token,
    }
}

/// 1-based line and column (counted in characters, as egressd reports them) of a spot.
fn position(dir: &Path, s: &Spot<'_>) -> (u32, u32) {
    let path = dir.join(s.file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut hits = text.match_indices(s.context);
    let (start, _) = hits
        .next()
        .unwrap_or_else(|| panic!("`{}` not found in {}", s.context, path.display()));
    assert!(
        hits.next().is_none(),
        "`{}` occurs more than once in {}; use a longer context",
        s.context,
        path.display()
    );
    let within = s
        .context
        .find(s.token)
        .unwrap_or_else(|| panic!("token `{}` is not inside `{}`", s.token, s.context));
    let before = &text[..start + within];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (
        u32::try_from(line).expect("small file"),
        u32::try_from(column).expect("short line"),
    )
}

/// Every diagnostic of `dir`, computed exactly as `egressd validate` does (load, then compile).
fn diagnostics(dir: &Path) -> Vec<Diagnostic> {
    let loaded = load_paths(&[dir.to_path_buf()]);
    // Compiling needs a registry, hence a resolver; validation never resolves anything, so the
    // name server is never contacted.
    let resolver = DnsResolver::new(&["127.0.0.1:53".parse().expect("literal")]).expect("resolver");
    let registry = Arc::new(StateRegistry::new(resolver));
    compile(Arc::new(loaded.set), loaded.diagnostics, &registry, 1).diagnostics
}

/// What `egressd validate --verbose DIR` reports (every object's conditions), from the
/// library.
fn validate_dir(dir: &Path) -> Validation {
    let verbose = ValidateOptions {
        verbose: true,
        ..ValidateOptions::default()
    };
    validate_with(&[dir.to_path_buf()], verbose)
}

fn render(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one diagnostic of a fixture made of a single mistake (anything else fails the test).
fn only_diagnostic(case: &str) -> (PathBuf, Diagnostic) {
    let dir = fixture(case);
    let mut diags = diagnostics(&dir);
    assert_eq!(
        diags.len(),
        1,
        "{case}: expected exactly one diagnostic, got:\n{}",
        render(&diags)
    );
    (dir, diags.remove(0))
}

/// What one error must say. `object` is `Kind namespace/name`, or None for mistakes that are
/// found before an object exists (syntax, unknown kinds).
struct Expect<'a> {
    at: Spot<'a>,
    object: Option<&'a str>,
    field: &'a str,
    message: &'a str,
}

/// Whether `d` is the diagnostic `e` describes (file, position, object, field, message).
fn matches(dir: &Path, d: &Diagnostic, e: &Expect<'_>) -> bool {
    let (line, column) = position(dir, &e.at);
    d.file == dir.join(e.at.file)
        && (d.line, d.column) == (line, column)
        && d.object.as_ref().map(ToString::to_string).as_deref() == e.object
        && d.field == e.field
        && d.message.contains(e.message)
}

fn assert_error(dir: &Path, d: &Diagnostic, e: &Expect<'_>) {
    let (line, column) = position(dir, &e.at);
    assert!(
        matches(dir, d, e),
        "expected an error at {}:{line}:{column} on {:?} field `{}` saying `{}`, got:\n{d}",
        dir.join(e.at.file).display(),
        e.object,
        e.field,
        e.message,
    );
    assert_eq!(d.severity, Severity::Error, "{d}");
    assert!(
        d.hint.as_deref().is_some_and(|h| !h.is_empty()),
        "every error carries a hint: {d}"
    );
    assert!(!d.message.contains('\n'), "one line per diagnostic: {d}");
}

/// `dir` gives exactly the errors `expected` describes, each once.
fn assert_exactly(dir: &Path, expected: &[Expect<'_>]) {
    let diags = diagnostics(dir);
    for e in expected {
        let found: Vec<&Diagnostic> = diags.iter().filter(|d| matches(dir, d, e)).collect();
        assert_eq!(
            found.len(),
            1,
            "{} `{}`:\n{}",
            e.field,
            e.message,
            render(&diags)
        );
        assert_error(dir, found[0], e);
    }
    assert_eq!(diags.len(), expected.len(), "{}", render(&diags));
}

/// The condition lines printed under `object` (`Kind ns/name`) in a validate report, for the
/// object defined in `file`.
fn conditions(report: &str, object: &str, file: &Path) -> Vec<String> {
    let header = format!("{object} ({})", file.display());
    let mut lines = report.lines().skip_while(|l| *l != header);
    assert!(
        lines.next().is_some(),
        "no status for {header} in the report:\n{report}"
    );
    lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_owned())
        .collect()
}

fn has_condition(report: &str, object: &str, file: &Path, prefix: &str) -> bool {
    conditions(report, object, file)
        .iter()
        .any(|c| c.starts_with(prefix))
}

fn run_validate_binary(dir: &Path, flags: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("validate")
        .args(flags)
        .arg(dir)
        .output()
        .expect("run egressd validate");
    (
        out.status.code(),
        String::from_utf8(out.stdout).expect("utf-8 report"),
    )
}

// ---------------------------------------------------------------------------------------------
// One kind of mistake per test
// ---------------------------------------------------------------------------------------------

#[test]
fn yaml_syntax_error_points_at_the_misindented_key_and_other_files_still_load() {
    let (dir, d) = only_diagnostic("yaml-syntax");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("backend.yaml", "   protocol: HTTP", "protocol"),
            object: None,
            field: "",
            message: "YAML syntax error",
        },
    );
    // The broken file contributes nothing; its valid neighbour is loaded and gets a status.
    let v = validate_dir(&dir);
    assert!(!v.ok);
    assert!(
        has_condition(
            &v.report,
            "Backend default/orders",
            &dir.join("other.yaml"),
            "Accepted=True"
        ),
        "{}",
        v.report
    );
    assert!(
        !v.report.contains("Backend default/inventory ("),
        "{}",
        v.report
    );
}

#[test]
fn unknown_top_level_field_is_an_error_at_its_key() {
    let (dir, d) = only_diagnostic("unknown-top-level-field");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("backend.yaml", "\nlabels:", "labels"),
            object: Some("Backend default/inventory"),
            field: "",
            message: "unknown field `labels`",
        },
    );
}

#[test]
fn unknown_field_inside_a_route_match_is_reported_with_its_full_path() {
    let (dir, d) = only_diagnostic("unknown-nested-field");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("route.yaml", "header:", "header"),
            object: Some("HTTPRoute default/api"),
            field: "spec.rules[0].matches[0].header",
            message: "unknown field `header`",
        },
    );
    // The message lists what is accepted there, which contains the intended spelling.
    assert!(d.message.contains("`headers`"), "{d}");
}

#[test]
fn unknown_kind_is_an_error_at_the_kind_value() {
    let (dir, d) = only_diagnostic("unknown-kind");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("service-entry.yaml", "kind: ServiceEntry", "ServiceEntry"),
            object: None,
            field: "",
            message: "unknown kind `ServiceEntry`",
        },
    );
    assert!(d.hint.as_deref().unwrap_or("").contains("Backend"), "{d}");
}

#[test]
fn kind_of_the_model_that_is_not_implemented_yet_says_so() {
    let (dir, d) = only_diagnostic("kind-not-supported");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("grpc-route.yaml", "kind: GRPCRoute", "GRPCRoute"),
            object: None,
            field: "",
            message: "kind `GRPCRoute` is not supported yet",
        },
    );
}

#[test]
fn api_version_of_another_group_is_rejected_with_the_right_one_as_hint() {
    let (dir, d) = only_diagnostic("wrong-api-version");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot(
                "backend.yaml",
                "apiVersion: gateway.networking.k8s.io/v1",
                "gateway.networking.k8s.io/v1",
            ),
            object: Some("Backend default/inventory"),
            field: "",
            message: "apiVersion `gateway.networking.k8s.io/v1` does not serve kind Backend",
        },
    );
    assert!(
        d.hint
            .as_deref()
            .unwrap_or("")
            .contains("egressd.dev/v1alpha1"),
        "{d}"
    );
}

#[test]
fn unknown_enum_value_is_an_error_at_the_value_listing_the_accepted_ones() {
    let (dir, d) = only_diagnostic("bad-enum-value");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("route.yaml", "type: Prefix", "Prefix"),
            object: Some("HTTPRoute default/api"),
            field: "spec.rules[0].matches[0].path.type",
            message: "unknown value `Prefix`",
        },
    );
    assert!(d.message.contains("PathPrefix"), "{d}");
}

#[test]
fn durations_without_a_gateway_api_unit_are_errors_at_the_value() {
    let dir = fixture("bad-duration");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 2, "{}", render(&diags));
    // Errors come in file order: the bare number first, then the words.
    assert_error(
        &dir,
        &diags[0],
        &Expect {
            at: spot("routes.yaml", "request: 10", "10"),
            object: Some("HTTPRoute default/bare-number"),
            field: "spec.rules[0].timeouts.request",
            message: "invalid duration \"10\"",
        },
    );
    assert_error(
        &dir,
        &diags[1],
        &Expect {
            at: spot(
                "routes.yaml",
                "backendRequest: \"5 seconds\"",
                "\"5 seconds\"",
            ),
            object: Some("HTTPRoute default/words"),
            field: "spec.rules[0].timeouts.backendRequest",
            message: "invalid duration \"5 seconds\"",
        },
    );
}

#[test]
fn listener_port_above_65535_is_out_of_range() {
    let (dir, d) = only_diagnostic("port-out-of-range");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("gateway.yaml", "port: 70000", "70000"),
            object: Some("Gateway default/sidecar"),
            field: "spec.listeners[0].port",
            message: "70000 is out of range",
        },
    );
}

#[test]
fn http2_settings_out_of_range_are_errors_at_each_value() {
    let dir = fixture("http2-settings-out-of-range");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 4, "{}", render(&diags));
    let object = Some("ProxyConfig default/egressd");
    let expected = [
        (
            "maxConcurrentStreams: 0",
            "0",
            "maxConcurrentStreams",
            "maxConcurrentStreams must be at least 1",
        ),
        (
            "initialStreamWindowSize: 2Gi",
            "2Gi",
            "initialStreamWindowSize",
            "initialStreamWindowSize 2Gi is out of range (1 to 2147483647 bytes)",
        ),
        (
            "initialConnectionWindowSize: 1024",
            "1024",
            "initialConnectionWindowSize",
            "initialConnectionWindowSize 1Ki is out of range (65535 to 2147483647 bytes)",
        ),
        (
            "maxPendingAcceptResetStreams: 0",
            "0",
            "maxPendingAcceptResetStreams",
            "maxPendingAcceptResetStreams must be at least 1",
        ),
    ];
    for (d, (context, token, name, message)) in diags.iter().zip(expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("proxy.yaml", context, token),
                object,
                field: &format!("spec.downstream.http2.{name}"),
                message,
            },
        );
    }
}

#[test]
fn duplicate_identity_across_files_names_both_files() {
    let (dir, d) = only_diagnostic("duplicate-identity");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("more-backends.yaml", "apiVersion:", "apiVersion"),
            object: Some("Backend default/inventory"),
            field: "",
            message: "duplicate object Backend default/inventory",
        },
    );
    // The other definition, with its position, is in the hint.
    let first = spot("inventory.yaml", "apiVersion:", "apiVersion");
    let (line, column) = position(&dir, &first);
    let first_at = format!("{}:{line}:{column}", dir.join("inventory.yaml").display());
    let printed = d.to_string();
    assert!(printed.contains(&first_at), "{printed}");
    assert!(printed.contains("more-backends.yaml"), "{printed}");
}

#[test]
fn backend_ref_to_a_missing_backend_is_ref_not_found() {
    let (dir, d) = only_diagnostic("dangling-backend-ref");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("route.yaml", "- name: inventroy", "name"),
            object: Some("HTTPRoute default/api"),
            field: "spec.rules[0].backendRefs[0]",
            message: "Backend default/inventroy does not exist",
        },
    );
    assert_eq!(d.reason, Some(Reason::RefNotFound), "{d}");
    let v = validate_dir(&dir);
    let file = dir.join("route.yaml");
    assert_eq!(
        conditions(&v.report, "HTTPRoute default/api", &file),
        [
            "Accepted=True Accepted",
            "ResolvedRefs=False RefNotFound: Backend default/inventroy does not exist or has errors",
            "Programmed=False Invalid: the config has errors",
        ],
        "{}",
        v.report
    );
}

#[test]
fn parent_ref_to_a_missing_gateway_is_ref_not_found() {
    let (dir, d) = only_diagnostic("dangling-parent-ref");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("route.yaml", "- name: side-car", "name"),
            object: Some("HTTPRoute default/api"),
            field: "spec.parentRefs[0]",
            message: "Gateway default/side-car does not exist",
        },
    );
    assert_eq!(d.reason, Some(Reason::RefNotFound), "{d}");
    let v = validate_dir(&dir);
    let file = dir.join("route.yaml");
    assert!(
        has_condition(
            &v.report,
            "HTTPRoute default/api",
            &file,
            "ResolvedRefs=False RefNotFound: Gateway default/side-car does not exist"
        ),
        "{}",
        v.report
    );
    // The Gateway itself is fine; it is only not programmed because the config is rejected.
    assert!(
        has_condition(
            &v.report,
            "Gateway default/sidecar",
            &file,
            "Programmed=False ConfigRejected"
        ),
        "{}",
        v.report
    );
}

#[test]
fn invalid_regular_expression_is_an_error_at_the_pattern() {
    let (dir, d) = only_diagnostic("invalid-regex");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot(
                "route.yaml",
                "value: \"/api/(v1|v2/.*\"",
                "\"/api/(v1|v2/.*\"",
            ),
            object: Some("HTTPRoute default/api"),
            field: "spec.rules[0].matches[0].path.value",
            message: "invalid regular expression `/api/(v1|v2/.*`: unclosed group",
        },
    );
}

#[test]
fn mutual_tls_without_a_client_certificate_is_rejected_at_the_mode() {
    let (dir, d) = only_diagnostic("tls-mutual-without-certificate");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("backend.yaml", "mode: Mutual", "Mutual"),
            object: Some("Backend default/inventory"),
            field: "spec.tls.mode",
            message: "tls.mode Mutual needs a client certificate",
        },
    );
    assert!(
        d.hint
            .as_deref()
            .unwrap_or("")
            .contains("clientCertificate"),
        "the hint says what to add: {d}"
    );
    let v = validate_dir(&dir);
    assert!(
        has_condition(
            &v.report,
            "Backend default/inventory",
            &dir.join("backend.yaml"),
            "Accepted=False Invalid"
        ),
        "{}",
        v.report
    );
}

#[test]
fn fqdn_destination_that_is_an_ip_address_is_rejected() {
    let (dir, d) = only_diagnostic("fqdn-ip-literal");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("backend.yaml", "hostname: 10.20.30.40", "10.20.30.40"),
            object: Some("Backend default/inventory"),
            field: "spec.destination.fqdn.hostname",
            message: "`10.20.30.40` is an IP address",
        },
    );
    assert!(d.hint.as_deref().unwrap_or("").contains("type: IP"), "{d}");
}

#[test]
fn missing_required_field_is_an_error_at_the_mapping_that_lacks_it() {
    let (dir, d) = only_diagnostic("missing-required-field");
    assert_error(
        &dir,
        &d,
        &Expect {
            // A mapping's position is that of its first key.
            at: spot("backend.yaml", "  protocol: HTTP", "protocol"),
            object: Some("Backend default/inventory"),
            field: "spec",
            message: "missing field `destination`",
        },
    );
}

#[test]
fn upper_case_object_name_is_invalid() {
    let (dir, d) = only_diagnostic("invalid-name");
    assert_error(
        &dir,
        &d,
        &Expect {
            at: spot("backend.yaml", "name: Inventory", "Inventory"),
            object: Some("Backend default/Inventory"),
            field: "metadata.name",
            message: "invalid name `Inventory`",
        },
    );
}

#[test]
fn enum_alias_is_a_warning_at_the_value_and_the_config_stays_valid() {
    let (dir, d) = only_diagnostic("alias-warning");
    let (line, column) = position(
        &dir,
        &spot("backend.yaml", "mode: INSECURE_DISABLE", "INSECURE_DISABLE"),
    );
    assert_eq!(d.severity, Severity::Warning, "{d}");
    assert_eq!(d.file, dir.join("backend.yaml"), "{d}");
    assert_eq!((d.line, d.column), (line, column), "{d}");
    assert!(
        d.message
            .contains("`INSECURE_DISABLE` is an alias of `InsecureDisable`"),
        "{d}"
    );
    assert_eq!(d.hint.as_deref(), Some("write `InsecureDisable`"), "{d}");

    let Validation { ok, report } = validate_dir(&dir);
    assert!(ok, "{report}");
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("valid: ") && l.ends_with("0 error(s), 1 warning(s)")),
        "{report}"
    );
    // And the binary agrees: warnings alone exit 0.
    let (code, stdout) = run_validate_binary(&dir, &[]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("warning: Backend default/inventory"),
        "{stdout}"
    );
    // `--strict`: the warning is an error, and says why.
    let (code, stdout) = run_validate_binary(&dir, &["--strict"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("error: Backend default/inventory")
                && l.contains("(an error under --strict)")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("invalid: ") && l.ends_with("1 error(s), 0 warning(s)")),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------------------------
// Many mistakes at once
// ---------------------------------------------------------------------------------------------

/// Every mistake planted in `tests/fixtures/invalid/many-mistakes/` (each file's comments say
/// which). Each sits in its own object, so no mistake hides another.
fn many_mistakes() -> Vec<Expect<'static>> {
    vec![
        Expect {
            at: spot("00-broken.yaml", " namespace: shop", "namespace"),
            object: None,
            field: "",
            message: "YAML syntax error",
        },
        Expect {
            at: spot("backends.yaml", "mode: Mutual", "Mutual"),
            object: Some("Backend default/billing"),
            field: "spec.tls.mode",
            message: "tls.mode Mutual needs a client certificate",
        },
        Expect {
            at: spot("backends.yaml", "hostname: 127.0.0.1", "127.0.0.1"),
            object: Some("Backend default/metrics"),
            field: "spec.destination.fqdn.hostname",
            message: "`127.0.0.1` is an IP address",
        },
        Expect {
            at: spot("backends.yaml", "name: Reports", "Reports"),
            object: Some("Backend default/Reports"),
            field: "metadata.name",
            message: "invalid name `Reports`",
        },
        Expect {
            at: spot("backends.yaml", "name: search\nspec:\n  tls:", "tls"),
            object: Some("Backend default/search"),
            field: "spec",
            message: "missing field `destination`",
        },
        Expect {
            at: spot("duplicate.yaml", "apiVersion", "apiVersion"),
            object: Some("Backend default/ledger"),
            field: "",
            message: "duplicate object Backend default/ledger",
        },
        Expect {
            at: spot("gateway.yaml", "port: 80800", "80800"),
            object: Some("Gateway default/admin-gw"),
            field: "spec.listeners[0].port",
            message: "80800 is out of range",
        },
        Expect {
            at: spot("other-kinds.yaml", "kind: GRPCRoute", "GRPCRoute"),
            object: None,
            field: "",
            message: "kind `GRPCRoute` is not supported yet",
        },
        Expect {
            at: spot(
                "other-kinds.yaml",
                "apiVersion: gateway.networking.k8s.io/v1\n",
                "gateway",
            ),
            object: Some("ProxyConfig default/egressd"),
            field: "",
            message: "does not serve kind ProxyConfig",
        },
        Expect {
            at: spot("other-kinds.yaml", "\nstatus: {}", "status"),
            object: Some("Backend default/audit"),
            field: "",
            message: "unknown field `status`",
        },
        Expect {
            at: spot("policy.yaml", "  timeouts:", "timeouts"),
            object: Some("BackendTrafficPolicy default/ledger-timeouts"),
            field: "spec.timeouts",
            message: "unknown field `timeouts`",
        },
        Expect {
            at: spot(
                "policy.yaml",
                "  - group: egressd.dev\n    kind: Backend\n    name: ledger-v2",
                "group",
            ),
            object: Some("BackendTrafficPolicy default/dns"),
            field: "spec.targetRefs[0]",
            message: "target Backend default/ledger-v2 does not exist",
        },
        Expect {
            at: spot("routes.yaml", "type: Prefix", "Prefix"),
            object: Some("HTTPRoute default/prefix-typo"),
            field: "spec.rules[0].matches[0].path.type",
            message: "unknown value `Prefix`",
        },
        Expect {
            at: spot("routes.yaml", "\"/ledger/[0-9+\"", "\"/ledger/[0-9+\""),
            object: Some("HTTPRoute default/bad-regex"),
            field: "spec.rules[0].matches[0].path.value",
            message: "invalid regular expression `/ledger/[0-9+`",
        },
        Expect {
            at: spot("routes.yaml", "- name: ledgre", "name"),
            object: Some("HTTPRoute default/typo-backend"),
            field: "spec.rules[0].backendRefs[0]",
            message: "Backend default/ledgre does not exist",
        },
        Expect {
            at: spot("routes.yaml", "request: 30", "30"),
            object: Some("HTTPRoute default/bare-timeout"),
            field: "spec.rules[0].timeouts.request",
            message: "invalid duration \"30\"",
        },
        Expect {
            at: spot("routes.yaml", "- name: side-car", "name"),
            object: Some("HTTPRoute default/typo-gateway"),
            field: "spec.parentRefs[0]",
            message: "Gateway default/side-car does not exist",
        },
    ]
}

#[test]
fn egress_policy_mistakes_are_each_reported_at_their_position() {
    let dir = fixture("egress-policy");
    let policy = Some("EgressPolicy default/payments");
    let expected = [
        Expect {
            at: spot("policies.yaml", "\"payments/*\"", "\"payments/*\""),
            object: policy,
            field: "spec.clients.spiffeIds[0]",
            message: "a SPIFFE ID starts with spiffe://",
        },
        Expect {
            at: spot("policies.yaml", "\"10.0.0.0/33\"", "\"10.0.0.0/33\""),
            object: policy,
            field: "spec.clients.cidrs[0]",
            message: "invalid CIDR `10.0.0.0/33`",
        },
        Expect {
            at: spot("policies.yaml", "\"a*b\"", "\"a*b\""),
            object: policy,
            field: "spec.clients.subjectNames[0]",
            message: "`*` only at the end",
        },
        Expect {
            at: spot("policies.yaml", "- name: ledgre", "name"),
            object: policy,
            field: "spec.to.backendRefs[0]",
            message: "Backend default/ledgre does not exist",
        },
        Expect {
            at: spot(
                "policies.yaml",
                "\"*.*.example.com\"",
                "\"*.*.example.com\"",
            ),
            object: policy,
            field: "spec.to.hostnames[0]",
            message: "is not a hostname or `*.suffix` wildcard",
        },
        Expect {
            at: spot("policies.yaml", "proxyUser:", "proxyUser"),
            object: Some("EgressPolicy default/typo"),
            field: "spec.clients.proxyUser",
            message: "unknown field `proxyUser`",
        },
        Expect {
            at: spot("policies.yaml", "to: {}", "{}"),
            object: Some("EgressPolicy default/nowhere"),
            field: "spec.to",
            message: "the policy covers no destination",
        },
    ];
    assert_exactly(&dir, &expected);
}

#[test]
fn wildcard_hostname_mistakes_are_each_reported_at_their_position() {
    let dir = fixture("wildcard-backend");
    let expected = [
        Expect {
            at: spot("backends.yaml", "\"*.com\"", "\"*.com\""),
            object: Some("Backend default/too-wide"),
            field: "spec.destination.fqdn.hostname",
            message: "is not `*.` and a domain of two or more labels",
        },
        Expect {
            at: spot(
                "backends.yaml",
                "\"api.*.example.com\"",
                "\"api.*.example.com\"",
            ),
            object: Some("Backend default/inner-star"),
            field: "spec.destination.fqdn.hostname",
            message: "`*` only as the whole first label",
        },
        Expect {
            at: spot("backends.yaml", "maxHosts: 10", "10"),
            object: Some("Backend default/one-host"),
            field: "spec.destination.fqdn.maxHosts",
            message: "maxHosts is for wildcard hostnames",
        },
    ];
    assert_exactly(&dir, &expected);
}

#[test]
fn every_mistake_of_a_directory_is_reported_in_one_run_at_its_position() {
    let dir = fixture("many-mistakes");
    let expected = many_mistakes();
    assert!(expected.len() >= 10);
    let diags = diagnostics(&dir);
    for e in &expected {
        let found: Vec<&Diagnostic> = diags.iter().filter(|d| matches(&dir, d, e)).collect();
        assert_eq!(
            found.len(),
            1,
            "expected one error at {} `{}` saying `{}`; all diagnostics:\n{}",
            e.at.file,
            e.at.context,
            e.message,
            render(&diags)
        );
        assert_error(&dir, found[0], e);
    }
    // Nothing else: no mistake reported twice, no knock-on noise, no warnings.
    assert_eq!(diags.len(), expected.len(), "{}", render(&diags));
}

#[test]
fn validate_binary_prints_every_mistake_and_the_conditions_and_exits_1() {
    let dir = fixture("many-mistakes");
    let expected = many_mistakes();
    let (code, stdout) = run_validate_binary(&dir, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    for e in &expected {
        let (line, column) = position(&dir, &e.at);
        let prefix = format!("{}:{line}:{column}: error: ", dir.join(e.at.file).display());
        let printed = stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line starting with `{prefix}` in:\n{stdout}"));
        assert!(printed.contains(e.message), "{printed}");
        if let Some(object) = e.object {
            assert!(printed.contains(&format!(": {object}: ")), "{printed}");
        }
    }
    // The summary line counts them all.
    let summary = format!("{} error(s), 0 warning(s)", expected.len());
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("invalid: 7 file(s)") && l.ends_with(&summary)),
        "{stdout}"
    );

    // Conditions of the objects that loaded.
    let routes = dir.join("routes.yaml");
    let backends = dir.join("backends.yaml");
    let cases = [
        (
            "HTTPRoute default/typo-backend",
            &routes,
            "ResolvedRefs=False RefNotFound: Backend default/ledgre does not exist",
        ),
        (
            "HTTPRoute default/typo-gateway",
            &routes,
            "ResolvedRefs=False RefNotFound: Gateway default/side-car does not exist",
        ),
        (
            "HTTPRoute default/bad-regex",
            &routes,
            "Accepted=False Invalid: invalid regular expression",
        ),
        (
            "Backend default/billing",
            &backends,
            "Accepted=False Invalid: tls.mode Mutual needs a client certificate",
        ),
        (
            "Backend default/ledger",
            &backends,
            "Accepted=False Invalid: duplicate object",
        ),
        (
            "BackendTrafficPolicy default/dns",
            &dir.join("policy.yaml"),
            "ResolvedRefs=False RefNotFound: target Backend default/ledger-v2",
        ),
    ];
    for (object, file, condition) in cases {
        assert!(
            has_condition(&stdout, object, file, condition),
            "{object}: no condition `{condition}` in:\n{}",
            conditions(&stdout, object, file).join("\n")
        );
    }
    // An object with nothing wrong is not listed (nor the conditions that are fine of those
    // that are); `--verbose` lists every condition.
    let gateway = dir.join("gateway.yaml");
    let header = format!("Gateway default/sidecar ({})", gateway.display());
    assert!(!stdout.lines().any(|l| l == header), "{stdout}");
    assert!(!stdout.contains("=True Accepted"), "{stdout}");
    assert!(
        stdout.contains("object(s) with nothing to report (--verbose lists their conditions)"),
        "{stdout}"
    );
    let (_, verbose) = run_validate_binary(&dir, &["--verbose"]);
    assert!(
        has_condition(
            &verbose,
            "Gateway default/sidecar",
            &gateway,
            "Accepted=True Accepted"
        ),
        "{verbose}"
    );
}

#[test]
fn upstream_http2_mistakes_are_errors_at_each_value() {
    let dir = fixture("upstream-http2-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 5, "{}", render(&diags));
    let expected = [
        (
            ("maxConcurrentStreams: 0", "0"),
            "Backend default/windows",
            "spec.trafficPolicy.http2.maxConcurrentStreams",
            "maxConcurrentStreams must be at least 1",
        ),
        (
            ("initialStreamWindowSize: 1Ki", "1Ki"),
            "Backend default/windows",
            "spec.trafficPolicy.http2.initialStreamWindowSize",
            "initialStreamWindowSize 1Ki is out of range (65535 to 2147483647 bytes)",
        ),
        (
            ("{interval: 0s}", "0s"),
            "Backend default/windows",
            "spec.trafficPolicy.http2.connectionKeepalive.interval",
            "keepalive interval must be greater than zero",
        ),
        (
            ("protocol: H2C", "H2C"),
            "Backend default/h2c-over-tls",
            "spec.protocol",
            "protocol H2C is HTTP/2 in plaintext, but this port originates TLS",
        ),
        (
            ("alpnProtocols: [h2]", "alpnProtocols"),
            "Backend default/alpn",
            "spec.tls.alpnProtocols",
            "ALPN protocol `h2` is not spoken on protocol HTTP11",
        ),
    ];
    for (d, ((context, token), object, field, message)) in diags.iter().zip(expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backends.yaml", context, token),
                object: Some(object),
                field,
                message,
            },
        );
    }
}

#[test]
fn consistent_hash_mistakes_are_errors_at_each_value() {
    let dir = fixture("consistent-hash-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 7, "{}", render(&diags));
    let lb = "spec.trafficPolicy.loadBalancer";
    let ch = format!("{lb}.consistentHash");
    let expected = [
        (
            ("tableSize: 65536", "65536"),
            "Backend default/maglev",
            format!("{ch}.maglev.tableSize"),
            "tableSize 65536 is not a prime number",
        ),
        (
            ("{type: Header}", "Header"),
            "Backend default/no-header",
            format!("{ch}.type"),
            "type Header needs the header's name",
        ),
        (
            ("ttl: 1h", "1h"),
            "Backend default/ring",
            format!("{ch}.cookie.ttl"),
            "cookie.ttl (generating the cookie) is not supported yet",
        ),
        (
            ("minimumRingSize: 4096", "4096"),
            "Backend default/ring",
            format!("{ch}.ringHash.minimumRingSize"),
            "minimumRingSize 4096 is above maximumRingSize 2048",
        ),
        (
            ("maglev: {}", "{"),
            "Backend default/ring",
            format!("{ch}.maglev"),
            "ringHash and maglev are exclusive",
        ),
        (
            ("consistentHash: {type: SourceIP}", "{"),
            "Backend default/stray",
            ch.clone(),
            "consistentHash settings do not apply to type RoundRobin",
        ),
        (
            ("ConsistentHash  # and nothing", "ConsistentHash"),
            "Backend default/missing",
            format!("{lb}.type"),
            "type ConsistentHash needs consistentHash settings (what to hash)",
        ),
    ];
    for (d, ((context, token), object, field, message)) in diags.iter().zip(&expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backends.yaml", context, token),
                object: Some(object),
                field,
                message,
            },
        );
    }
}

#[test]
fn load_balancer_and_health_check_mistakes_are_errors_at_each_value() {
    let dir = fixture("health-check-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 11, "{}", render(&diags));
    let p = "spec.trafficPolicy";
    let expected = [
        (
            ("leastRequest: {choiceCount", "{"),
            format!("{p}.loadBalancer.leastRequest"),
            "leastRequest settings do not apply to type RoundRobin",
        ),
        (
            ("slowStart: {window", "{"),
            format!("{p}.loadBalancer.slowStart"),
            "slowStart is not supported with type RoundRobin",
        ),
        (
            ("window: 0s", "0s"),
            format!("{p}.loadBalancer.slowStart.window"),
            "window must be greater than zero",
        ),
        (
            ("aggression: -1.5", "-1.5"),
            format!("{p}.loadBalancer.slowStart.aggression"),
            "aggression -1.5 must be a number above 0",
        ),
        (
            ("minWeightPercent: 101", "101"),
            format!("{p}.loadBalancer.slowStart.minWeightPercent"),
            "minWeightPercent 101 is above 100",
        ),
        (
            ("panicThreshold: 120", "120"),
            format!("{p}.healthCheck.panicThreshold"),
            "panicThreshold 120 is above 100",
        ),
        (
            ("interval: 0s", "0s"),
            format!("{p}.healthCheck.passive.interval"),
            "interval must be greater than zero",
        ),
        (
            ("maxEjectionTime: 10s", "10s"),
            format!("{p}.healthCheck.passive.maxEjectionTime"),
            "maxEjectionTime 10s is shorter than baseEjectionTime 30s",
        ),
        (
            ("maxEjectionPercent: 150", "150"),
            format!("{p}.healthCheck.passive.maxEjectionPercent"),
            "maxEjectionPercent 150 is above 100",
        ),
        (
            ("consecutiveLocalOriginFailures: 3", "3"),
            format!("{p}.healthCheck.passive.consecutiveLocalOriginFailures"),
            "consecutiveLocalOriginFailures applies only when local-origin errors are split out",
        ),
        (
            ("{threshold: 101}", "101"),
            format!("{p}.healthCheck.passive.failurePercentage.threshold"),
            "threshold 101 is above 100",
        ),
    ];
    for (d, ((context, token), field, message)) in diags.iter().zip(&expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backend.yaml", context, token),
                object: Some("Backend default/flaky"),
                field,
                message,
            },
        );
    }
}

#[test]
fn active_health_check_mistakes_are_errors_at_each_value() {
    let dir = fixture("active-health-check-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 8, "{}", render(&diags));
    let p = "spec.trafficPolicy.healthCheck.active";
    let checked = Some("Backend default/checked");
    let expected = [
        (
            ("interval: 0s", "0s"),
            checked,
            format!("{p}.interval"),
            "interval must be greater than zero",
        ),
        (
            ("timeout: 0s", "0s"),
            checked,
            format!("{p}.timeout"),
            "timeout must be greater than zero",
        ),
        (
            ("unhealthyThreshold: 0", "0"),
            checked,
            format!("{p}.unhealthyThreshold"),
            "unhealthyThreshold must be at least 1",
        ),
        (
            (" healthyThreshold: 0", "0"),
            checked,
            format!("{p}.healthyThreshold"),
            "healthyThreshold must be at least 1",
        ),
        (
            ("path: healthz", "healthz"),
            checked,
            format!("{p}.http.path"),
            "path `healthz` is not an absolute request path",
        ),
        (
            ("[200, 700]", "700"),
            checked,
            format!("{p}.http.expectedStatuses[1]"),
            "expected status 700 is not an HTTP status (100 to 599)",
        ),
        (
            ("8443, protocol: TCP", "TCP"),
            Some("Backend default/pinged"),
            "spec.destination.ports[0].protocol".to_owned(),
            "port 8443 carries TCP, so healthCheck.active type MCP cannot check it",
        ),
        (
            ("{number: 443, protocol: TCP", "TCP"),
            Some("Backend default/tunnelled"),
            "spec.destination.ports[0].protocol".to_owned(),
            "port 443 carries TCP, so healthCheck.active type HTTP cannot check it",
        ),
    ];
    for (d, ((context, token), object, field, message)) in diags.iter().zip(&expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backend.yaml", context, token),
                object: *object,
                field,
                message,
            },
        );
    }
}

#[test]
fn circuit_breaker_mistakes_are_errors_at_each_value() {
    let dir = fixture("circuit-breaker-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 5, "{}", render(&diags));
    let p = "spec.trafficPolicy.circuitBreaker";
    let expected = [
        (
            ("maxConnections: 0", "0"),
            format!("{p}.maxConnections"),
            "maxConnections must be at least 1",
        ),
        (
            ("maxParallelRequests: 0", "0"),
            format!("{p}.maxParallelRequests"),
            "maxParallelRequests must be at least 1",
        ),
        (
            ("{percent: 150}", "150"),
            format!("{p}.retryBudget.percent"),
            "percent 150 is not between 0 and 100",
        ),
        (
            ("idleTime: 500ms", "500ms"),
            "spec.trafficPolicy.tcpKeepalive.idleTime".to_owned(),
            "idleTime 500ms is below 1s (the kernel counts whole seconds)",
        ),
        (
            ("probes: 0", "0"),
            "spec.trafficPolicy.tcpKeepalive.probes".to_owned(),
            "probes must be at least 1",
        ),
    ];
    for (d, ((context, token), field, message)) in diags.iter().zip(&expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backend.yaml", context, token),
                object: Some("Backend default/busy"),
                field,
                message,
            },
        );
    }
}

#[test]
fn mcp_option_mistakes_are_errors_at_each_value() {
    let dir = fixture("mcp-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 4, "{}", render(&diags));
    let expected = [
        (
            ("{path: /mcp}", "{"),
            "Backend default/plain",
            "spec.protocolOptions.mcp",
            "protocolOptions.mcp applies to protocol MCP, not HTTP",
        ),
        (
            ("path: mcp", "mcp"),
            "Backend default/tools",
            "spec.protocolOptions.mcp.path",
            "path `mcp` must start with /",
        ),
        (
            ("transport: WebSocket", "WebSocket"),
            "Backend default/tools",
            "spec.protocolOptions.mcp.transport",
            "unknown MCP transport `WebSocket`",
        ),
        (
            ("sessionRouting: Sticky", "Sticky"),
            "Backend default/tools",
            "spec.protocolOptions.mcp.sessionRouting",
            "unknown sessionRouting `Sticky`",
        ),
    ];
    for (d, ((context, token), object, field, message)) in diags.iter().zip(expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backends.yaml", context, token),
                object: Some(object),
                field,
                message,
            },
        );
    }
}

#[test]
fn extension_mistakes_are_errors_at_each_value() {
    let dir = fixture("extension-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 5, "{}", render(&diags));
    let expected = [
        (
            ("type: RequestSigner", "RequestSigner"),
            "spec.extensions[0].type",
            "unknown extension type `RequestSigner`",
        ),
        (
            ("header: Content-Length", "Content-Length"),
            "spec.extensions[1].config.header",
            "header `content-length` cannot carry a credential: egressd manages it",
        ),
        (
            ("header: \"x api key\"", "\"x api key\""),
            "spec.extensions[2].config.header",
            "`x api key` is not a valid header name",
        ),
        (
            ("credential: {}", "{"),
            "spec.extensions[3].config.credential",
            "credential needs exactly one of valueFile and secretRef",
        ),
        (
            ("secretRef: {name", "{"),
            "spec.extensions[4].config.credential.secretRef",
            "Secret default/api-key not found",
        ),
    ];
    for (d, ((context, token), field, message)) in diags.iter().zip(expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backends.yaml", context, token),
                object: Some("Backend default/api"),
                field,
                message,
            },
        );
    }
}

#[test]
fn outbound_policy_allow_any_warns_and_bad_cidrs_are_errors_at_each_value() {
    let dir = fixture("outbound-policy-mistakes");
    let diags = diagnostics(&dir);
    assert_eq!(diags.len(), 3, "{}", render(&diags));
    for (d, value) in diags.iter().take(2).zip(["10.0.0.0/33", "not-a-network"]) {
        let index = if value == "10.0.0.0/33" { 2 } else { 3 };
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("proxy.yaml", &format!("- {value}"), value),
                object: Some("ProxyConfig default/egressd"),
                field: &format!("spec.undeclaredDestinations.deniedAddresses[{index}]"),
                message: &format!("invalid CIDR `{value}`"),
            },
        );
    }
    let warning = &diags[2];
    assert_eq!(warning.severity, Severity::Warning, "{warning}");
    assert_eq!(warning.field, "spec.outboundPolicy");
    assert!(warning.message.contains("AllowAny"), "{warning}");
}

#[test]
fn tracing_mistakes_are_errors_at_each_value() {
    let dir = fixture("tracing-mistakes");
    let diags = diagnostics(&dir);
    if !egressd::telemetry::trace::AVAILABLE {
        // Without the otel feature the whole section is refused, at `tracing:`.
        assert_eq!(diags.len(), 1, "{}", render(&diags));
        assert!(
            diags[0].message.contains("cannot export spans"),
            "{}",
            diags[0]
        );
        return;
    }
    assert_eq!(diags.len(), 2, "{}", render(&diags));
    let expected = [
        (
            ("otlpEndpoint: https", "https"),
            "spec.tracing.otlpEndpoint",
            "https:// collectors are not supported",
        ),
        (
            ("samplingPercent: 150", "150"),
            "spec.tracing.samplingPercent",
            "samplingPercent 150 is not between 0 and 100",
        ),
    ];
    for (d, ((context, token), field, message)) in diags.iter().zip(expected) {
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("proxy.yaml", context, token),
                object: Some("ProxyConfig default/egressd"),
                field,
                message,
            },
        );
    }
}

#[test]
fn limits_out_of_range_are_errors_at_each_value() {
    let dir = fixture("limits-mistakes");
    let diags = diagnostics(&dir);
    let errors: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert_eq!(errors.len(), 7, "{}", render(&diags));
    let expected = [
        (
            "- 10.0.0.0/40",
            "10.0.0.0/40",
            "spec.undeclaredDestinations.allowedAddresses[0]",
            "invalid CIDR",
        ),
        (
            "maxDestinations: 0",
            "0",
            "spec.undeclaredDestinations.maxDestinations",
            "at least 1",
        ),
        (
            "idleTimeout: 0s",
            "0s",
            "spec.undeclaredDestinations.idleTimeout",
            "longer than 0s",
        ),
        (
            "maxEntries: 0",
            "0",
            "spec.blockedAudit.maxEntries",
            "at least 1",
        ),
        (
            "retention: 0s",
            "0s",
            "spec.blockedAudit.retention",
            "longer than 0s",
        ),
        (
            "budget: 1Mi",
            "1Mi",
            "spec.bufferedBodies.budget",
            "at least 4Mi",
        ),
        (
            "readTimeout: 0s",
            "0s",
            "spec.bufferedBodies.readTimeout",
            "longer than 0s",
        ),
    ];
    for (context, token, field, message) in expected {
        let found = errors.iter().find(|d| d.field == field);
        let d = found.unwrap_or_else(|| panic!("no error for {field}: {}", render(&diags)));
        assert!(d.message.contains(message), "{d}");
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("proxy.yaml", context, token),
                object: Some("ProxyConfig default/egressd"),
                field,
                message: &d.message,
            },
        );
    }
}

#[test]
fn an_endpoint_port_needs_a_backend_with_one_port_and_is_never_0() {
    let dir = fixture("endpoint-port-mistakes");
    let diags = diagnostics(&dir);
    let errors: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert_eq!(errors.len(), 2, "{}", render(&diags));
    let expected = [
        (
            "port: 8001",
            "8001",
            "Backend default/two-ports",
            "exactly one port",
        ),
        ("port: 0", "0", "Backend default/port-zero", "port 0"),
    ];
    for (context, token, object, message) in expected {
        let found = errors
            .iter()
            .find(|d| d.object.as_ref().map(ToString::to_string).as_deref() == Some(object));
        let d = found.unwrap_or_else(|| panic!("no error for {object}: {}", render(&diags)));
        assert_error(
            &dir,
            d,
            &Expect {
                at: spot("backends.yaml", context, token),
                object: Some(object),
                field: "spec.destination.ip.endpoints[0].port",
                message,
            },
        );
    }
}

#[test]
fn plaintext_is_flagged_only_for_destinations_that_are_not_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let backend = |name: &str, host: &str| {
        format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: \"{host}\"}}\n    ports: [{{number: 8080}}]\n  tls: {{mode: InsecureDisable}}\n"
        )
    };
    let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  listeners: [{name: http, port: 0, protocol: HTTP}]\n".to_owned()
        + &backend("plain-localhost", "localhost")
        + &backend("plain-sub", "api.localhost")
        + &backend("plain-wild", "*.apps.localhost")
        + &backend("plain-remote", "api.example.com")
        + &backend("plain-remote-wild", "*.example.com");
    std::fs::write(dir.path().join("backends.yaml"), yaml).unwrap();
    let diags = diagnostics(dir.path());
    let flagged: Vec<String> = diags
        .iter()
        .filter(|d| d.message.contains("sends plaintext"))
        .map(|d| d.to_string())
        .collect();
    assert_eq!(flagged.len(), 2, "{}", render(&diags));
    assert!(
        flagged.iter().any(|d| d.contains("default/plain-remote:")),
        "{flagged:?}"
    );
    assert!(
        flagged
            .iter()
            .any(|d| d.contains("default/plain-remote-wild:")),
        "{flagged:?}"
    );
}
