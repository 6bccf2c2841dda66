//! A TLS probe turned into report lines: for each check, whether it was made and by what.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::pki_types::CertificateDer;
use rustls::ProtocolVersion;

use super::certificate::{names_match, read_leaf, Expected, Leaf};
use super::handshake::{ClientCert, Outcome, TlsProbe};
use super::{connect_failure, EndpointReport};
use crate::upstream::tls::TlsFailure;

/// A report line: its label and its text.
type Line = (&'static str, String);

/// Turns a TLS probe into report lines, saying for each check whether it was made and by what.
pub(super) fn describe_tls(addr: SocketAddr, p: &TlsProbe, expected: &Expected) -> EndpointReport {
    let mut lines = vec![(
        "sni",
        p.sni.clone().unwrap_or_else(|| "none (IP)".to_owned()),
    )];
    let der = p.chain.as_ref().and_then(|chain| chain.first());
    let leaf = der.map(read_leaf);
    let mut failure = None;
    match &p.outcome {
        Outcome::ConnectFailed(e) => {
            lines.push(("tcp", format!("FAILED: {e}")));
            return EndpointReport {
                addr,
                failure: Some(connect_failure(e)),
                lines,
            };
        }
        Outcome::Established { version, alpn } => {
            lines.extend(established(p, expected, *version, alpn.as_deref()));
        }
        Outcome::HandshakeFailed { failure: f, detail } => {
            failure = Some(format!("{}: {}", f.code(), f.explain()));
            let (chain, name) = failed_checks(f, p, expected, der, leaf.as_ref());
            lines.push(("chain", chain));
            lines.push(("name", name));
            lines.push(("handshake", format!("FAILED: {detail}")));
        }
    }
    if let (ClientCert::Rejected { failure: f, .. }, None) = (&p.client_cert, &failure) {
        failure = Some(match f {
            Some(f) => format!("{}: {}", f.code(), f.explain()),
            None => "client_cert_rejected: the server refused the client certificate".to_owned(),
        });
    }
    lines.push(("client cert", client_cert(&p.client_cert)));
    lines.extend(certificate(leaf, p.chain_from_diagnostic));
    EndpointReport {
        addr,
        failure,
        lines,
    }
}

/// The chain, name and negotiation lines of a handshake that succeeded.
fn established(
    p: &TlsProbe,
    expected: &Expected,
    version: Option<ProtocolVersion>,
    alpn: Option<&[u8]>,
) -> [Line; 3] {
    let (chain, name) = if matches!(expected, Expected::Nothing) {
        let not = "not checked (insecureSkipVerify)".to_owned();
        (not.clone(), not)
    } else {
        let want = expected.describe(&p.server_name);
        ("ok".to_owned(), format!("ok (expected {want})"))
    };
    let alpn = alpn.map_or("none".into(), String::from_utf8_lossy);
    [
        ("chain", chain),
        ("name", name),
        (
            "negotiated",
            format!("{}, ALPN {alpn}", version_name(version)),
        ),
    ]
}

/// What became of the chain and the name checks in a handshake that failed with `f`.
fn failed_checks(
    f: &TlsFailure,
    p: &TlsProbe,
    expected: &Expected,
    der: Option<&CertificateDer<'_>>,
    leaf: Option<&Result<Leaf, String>>,
) -> (String, String) {
    let want = expected.describe(&p.server_name);
    match f {
        _ if matches!(expected, Expected::Nothing) => {
            let not = "not checked (insecureSkipVerify)".to_owned();
            (not.clone(), not)
        }
        TlsFailure::UnknownCa
        | TlsFailure::Expired
        | TlsFailure::NotYetValid
        | TlsFailure::BadCertificate => {
            let chain = format!("FAILED {}: {}", f.code(), f.explain());
            let alone = "checked on its own, as the chain failed first";
            let name = match (der, leaf) {
                (Some(der), Some(Ok(_))) => match names_match(der, expected, &p.server_name) {
                    Some(true) => format!("ok (expected {want}; {alone})"),
                    Some(false) => {
                        format!("FAILED: the certificate does not name {want} ({alone})")
                    }
                    None => "not checked (the chain failed first)".to_owned(),
                },
                _ => "not checked (the chain failed first)".to_owned(),
            };
            (chain, name)
        }
        // Every verifier egressd builds checks the chain before the name.
        TlsFailure::NameMismatch => {
            let names = match leaf {
                Some(Ok(leaf)) if !leaf.sans.is_empty() => leaf.sans.join(", "),
                Some(Ok(_)) => "no subject alternative name".to_owned(),
                _ => "(certificate not read)".to_owned(),
            };
            (
                "ok".to_owned(),
                format!(
                    "FAILED {}: expected {want}, the certificate names {names}",
                    f.code()
                ),
            )
        }
        _ => {
            let not = format!("not determined (the handshake failed: {})", f.code());
            (not.clone(), not)
        }
    }
}

/// What became of the client certificate.
fn client_cert(outcome: &ClientCert) -> String {
    match outcome {
        ClientCert::NotConfigured => "none configured".to_owned(),
        ClientCert::RequestedButNotConfigured => {
            "the server asked for one; none configured (tls.mode Mutual sends one)".to_owned()
        }
        ClientCert::NotRequested => {
            "configured, but the server did not ask for it (not sent)".to_owned()
        }
        ClientCert::Accepted(how) => format!("presented and accepted ({how})"),
        ClientCert::NoObjection => {
            "presented; the server raised no objection within 1s of the handshake".to_owned()
        }
        ClientCert::Rejected {
            failure: Some(f),
            why,
        } => format!("REJECTED {}: {why}", f.code()),
        ClientCert::Rejected { failure: None, why } => format!("REJECTED: {why}"),
        ClientCert::Unknown(why) => format!("outcome unknown: {why}"),
    }
}

/// The server certificate's lines: whom it names, and when it expires.
fn certificate(leaf: Option<Result<Leaf, String>>, from_diagnostic: bool) -> Vec<Line> {
    let source = if from_diagnostic {
        " (read by a second handshake that accepts any certificate)"
    } else {
        ""
    };
    match leaf {
        Some(Ok(leaf)) => {
            let sans = if leaf.sans.is_empty() {
                "no subject alternative name".to_owned()
            } else {
                leaf.sans.join(", ")
            };
            let days = leaf.days_left(unix_now());
            let when = if days >= 0 {
                format!("{}, in {days} days", leaf.not_after_date)
            } else {
                format!("{}, EXPIRED {} days ago", leaf.not_after_date, -days)
            };
            vec![
                ("certificate", format!("{}; {sans}{source}", leaf.subject)),
                ("expires", when),
            ]
        }
        Some(Err(e)) => vec![("certificate", format!("unreadable: {e}"))],
        None => vec![("certificate", "not received".to_owned())],
    }
}

fn version_name(v: Option<ProtocolVersion>) -> String {
    match v {
        Some(ProtocolVersion::TLSv1_3) => "TLS 1.3".to_owned(),
        Some(ProtocolVersion::TLSv1_2) => "TLS 1.2".to_owned(),
        Some(other) => format!("{other:?}"),
        None => "unknown version".to_owned(),
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
