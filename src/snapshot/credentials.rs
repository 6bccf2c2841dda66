//! `CredentialInjector` Backend extensions: a credential the application never holds, put
//! into a request header on the way out. The credential is read from its file when the config
//! is compiled; the file is watched, so a rotated credential reloads without a restart.

use http::{HeaderMap, HeaderName, HeaderValue};

/// One `CredentialInjector`, resolved.
pub(crate) struct CredentialInjection {
    /// The extension's `name`.
    pub(crate) name: String,
    pub(crate) header: HeaderName,
    /// `prefix` + the credential, marked sensitive (HPACK never indexes it); or why it could
    /// not be read.
    pub(crate) value: Result<HeaderValue, String>,
    /// Replace a value the client sent.
    pub(crate) overwrite: bool,
    /// Without a credential, send the request anyway (else 503).
    pub(crate) fail_open: bool,
}

impl std::fmt::Debug for CredentialInjection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credential itself: this reaches logs and dumps.
        f.debug_struct("CredentialInjection")
            .field("name", &self.name)
            .field("header", &self.header)
            .field(
                "value",
                &self
                    .value
                    .as_ref()
                    .map(|_| "<redacted>")
                    .map_err(String::as_str),
            )
            .field("overwrite", &self.overwrite)
            .field("fail_open", &self.fail_open)
            .finish()
    }
}

impl CredentialInjection {
    /// Sets the header on a request's way upstream; `Err` (the reason) when the credential
    /// is unavailable and the extension fails closed.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) -> Result<(), &str> {
        match &self.value {
            Ok(value) => {
                if self.overwrite || !headers.contains_key(&self.header) {
                    headers.insert(self.header.clone(), value.clone());
                }
                Ok(())
            }
            Err(_) if self.fail_open => Ok(()),
            Err(reason) => Err(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injection(value: Result<HeaderValue, String>, overwrite: bool) -> CredentialInjection {
        CredentialInjection {
            name: "key".into(),
            header: http::header::AUTHORIZATION,
            value,
            overwrite,
            fail_open: false,
        }
    }

    #[test]
    fn overwrite_replaces_and_keep_keeps_the_clients_value() {
        let secret = HeaderValue::from_static("Bearer s3cret");
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, "Bearer app".parse().unwrap());
        injection(Ok(secret.clone()), false)
            .apply(&mut headers)
            .unwrap();
        assert_eq!(headers[http::header::AUTHORIZATION], "Bearer app");
        injection(Ok(secret), true).apply(&mut headers).unwrap();
        assert_eq!(headers[http::header::AUTHORIZATION], "Bearer s3cret");
        assert_eq!(
            headers.get_all(http::header::AUTHORIZATION).iter().count(),
            1
        );
    }

    #[test]
    fn an_unavailable_credential_fails_closed_unless_told_otherwise_and_never_shows() {
        let mut closed = injection(Err("file missing".into()), true);
        assert_eq!(closed.apply(&mut HeaderMap::new()), Err("file missing"));
        closed.fail_open = true;
        assert_eq!(closed.apply(&mut HeaderMap::new()), Ok(()));
        let shown = format!(
            "{:?}",
            injection(Ok(HeaderValue::from_static("Bearer s3cret")), true)
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
