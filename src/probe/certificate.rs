//! What the probe reads from the server's leaf certificate (its names and when it expires), and
//! the name check done on its own when the chain check failed first.

use std::net::IpAddr;

use rustls::pki_types::{CertificateDer, ServerName};
use x509_parser::extensions::GeneralName;

use crate::upstream::verify::names_any_identity;

/// What a port's certificate must name, as configured (docs/configuration.md, "TLS modes").
#[derive(Clone, Debug)]
pub(super) enum Expected {
    /// `insecureSkipVerify`: nothing is checked.
    Nothing,
    /// The handshake's server name: the SNI, or the endpoint IP when none is sent.
    ServerName,
    /// `validation.subjectAltNames` (Hostname and URI) or `validation.hostname`: any one.
    Identities {
        names: Vec<String>,
        uris: Vec<String>,
    },
}

impl Expected {
    /// The names to print, for an endpoint whose handshake uses `server_name`.
    pub(crate) fn describe(&self, server_name: &ServerName<'_>) -> String {
        match self {
            Expected::Nothing => "nothing (insecureSkipVerify)".to_owned(),
            Expected::ServerName => server_name.to_str().into_owned(),
            Expected::Identities { names, uris } => {
                let all: Vec<&str> = names.iter().chain(uris).map(String::as_str).collect();
                if all.len() == 1 {
                    all[0].to_owned()
                } else {
                    format!("any of {}", all.join(", "))
                }
            }
        }
    }
}

/// The parts of a leaf certificate the report shows.
#[derive(Debug)]
pub(super) struct Leaf {
    /// The subject, e.g. `CN=api.example.com`.
    pub(crate) subject: String,
    /// Subject alternative names as `DNS:…`, `IP:…`, `URI:…`.
    pub(crate) sans: Vec<String>,
    /// notAfter, seconds since the Unix epoch.
    pub(crate) not_after: i64,
    /// notAfter as `YYYY-MM-DD`.
    pub(crate) not_after_date: String,
}

impl Leaf {
    /// Whole days from `now` (Unix seconds) until the certificate expires; negative once it has.
    pub(crate) fn days_left(&self, now: i64) -> i64 {
        (self.not_after - now).div_euclid(86_400)
    }
}

/// Parses the leaf certificate.
pub(super) fn read_leaf(der: &CertificateDer<'_>) -> Result<Leaf, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(dns) => sans.push(format!("DNS:{dns}")),
                GeneralName::URI(uri) => sans.push(format!("URI:{uri}")),
                GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
                    Some(ip) => sans.push(format!("IP:{ip}")),
                    None => sans.push("IP:(malformed)".to_owned()),
                },
                _ => {}
            }
        }
    }
    let not_after = cert.validity().not_after;
    Ok(Leaf {
        subject: cert.subject().to_string(),
        sans,
        not_after: not_after.timestamp(),
        not_after_date: not_after.to_datetime().date().to_string(),
    })
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// Whether the leaf names what `expected` asks for, judged by egressd's verifier's own name
/// check, but without the chain. `None` when there is nothing to check or the certificate
/// cannot be parsed.
pub(super) fn names_match(
    der: &CertificateDer<'_>,
    expected: &Expected,
    server_name: &ServerName<'_>,
) -> Option<bool> {
    let cert = webpki::EndEntityCert::try_from(der).ok()?;
    match expected {
        Expected::Nothing => None,
        Expected::ServerName => Some(names_any_identity(
            &cert,
            std::slice::from_ref(server_name),
            &[],
        )),
        Expected::Identities { names, uris } => {
            let names: Vec<ServerName<'_>> = names
                .iter()
                .filter_map(|n| ServerName::try_from(n.as_str()).ok())
                .collect();
            Some(names_any_identity(&cert, &names, uris))
        }
    }
}
