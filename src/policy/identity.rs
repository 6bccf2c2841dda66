//! Who a client is: its source address, what its TLS client certificate proves (an HTTPS
//! listener with `tls.frontendValidation`), and the proxy user it authenticated as.

use std::fmt;
use std::net::IpAddr;

use x509_parser::extensions::GeneralName;

/// SPIFFE IDs are at most 2048 bytes (SPIFFE ID spec §2.3); a longer URI is no identity.
const MAX_SPIFFE_ID: usize = 2048;
/// X.520 `ub-common-name`: a longer CN is no identity.
const MAX_COMMON_NAME: usize = 64;

/// What a verified client certificate says its holder is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TlsIdentity {
    /// The certificate's `spiffe://` URI SAN (an X.509-SVID).
    Spiffe(Box<str>),
    /// The subject's common name, for certificates without a SPIFFE ID.
    Subject(Box<str>),
}

impl TlsIdentity {
    /// The identity of a (verified) leaf certificate: its first `spiffe://` URI SAN, else
    /// its subject CN; `None` when it has neither (or one too long to be real).
    pub(crate) fn of_certificate(der: &[u8]) -> Option<TlsIdentity> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            let spiffe = san.value.general_names.iter().find_map(|name| match name {
                GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some(*uri),
                _ => None,
            });
            if let Some(uri) = spiffe {
                return (uri.len() <= MAX_SPIFFE_ID).then(|| TlsIdentity::Spiffe(uri.into()));
            }
        }
        let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
        (!cn.is_empty() && cn.len() <= MAX_COMMON_NAME).then(|| TlsIdentity::Subject(cn.into()))
    }

    /// The identity as the access log and `/blocked` show it: the SPIFFE ID, or `CN=name`.
    /// Control characters (a CN may hold a newline) are written `\xHH`: this text reaches
    /// the process log, where a raw newline would forge a line.
    pub(crate) fn shown(&self) -> String {
        match self {
            TlsIdentity::Spiffe(id) => escaped(id),
            TlsIdentity::Subject(cn) => format!("CN={}", escaped(cn)),
        }
    }
}

/// `text` with control characters as `\xHH`.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Everything known about the client of one request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Client<'a> {
    /// The source address, canonical.
    pub(crate) addr: IpAddr,
    pub(crate) tls: Option<&'a TlsIdentity>,
    /// The user `Proxy-Authorization` authenticated.
    pub(crate) user: Option<&'a str>,
}

impl Client<'_> {
    /// The client as a metric label: its identity, else its address.
    pub(crate) fn label(&self) -> String {
        match (self.tls, self.user) {
            (Some(tls), _) => tls.shown(),
            (None, Some(user)) => format!("user {user}"),
            (None, None) => self.addr.to_string(),
        }
    }
}

impl fmt::Display for Client<'_> {
    /// `spiffe://… (10.0.0.7)`, `CN=batch (10.0.0.7)`, `user alice (10.0.0.7)`, `10.0.0.7`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.tls, self.user) {
            (Some(tls), _) => write!(f, "{} ({})", tls.shown(), self.addr),
            (None, Some(user)) => write!(f, "user {user} ({})", self.addr),
            (None, None) => write!(f, "{}", self.addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_common_name_with_a_newline_is_shown_on_one_line() {
        let forged = TlsIdentity::Subject("batch\nINFO egressd: client policy: allow".into());
        let shown = forged.shown();
        assert!(!shown.contains('\n'), "{shown}");
        assert_eq!(shown, "CN=batch\\x0aINFO egressd: client policy: allow");
        let spiffe = TlsIdentity::Spiffe("spiffe://corp/ns/a\r\nb".into());
        assert_eq!(spiffe.shown(), "spiffe://corp/ns/a\\x0d\\x0ab");
        // Ordinary names are shown as they are.
        assert_eq!(TlsIdentity::Subject("batch".into()).shown(), "CN=batch");
    }
}
