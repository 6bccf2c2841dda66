//! What a refusal by a rate limit tells the client besides its status: when to retry, and the
//! quota (draft-ietf-httpapi-ratelimit-headers).

use std::time::Duration;

use http::HeaderValue;

use super::ProxyError;

/// `Retry-After` (RFC 9110 §10.2.3) in whole seconds, at least 1: a client retrying sooner
/// would be refused again.
pub(crate) fn retry_after_secs(reset: Duration) -> u64 {
    reset.as_millis().div_ceil(1000).max(1) as u64
}

/// A 429's `Retry-After`, and the quota in the IETF draft's fields
/// (draft-ietf-httpapi-ratelimit-headers): `RateLimit-Policy: "rule";q=100;w=60` and
/// `RateLimit: "rule";r=0;t=17`.
pub(crate) fn rate_limit_headers(err: &ProxyError, headers: &mut http::HeaderMap) {
    let ProxyError::RateLimited {
        rule, quota, reset, ..
    } = err
    else {
        return;
    };
    let secs = retry_after_secs(*reset);
    // An sf-string: printable ASCII, with `"` and `\` escaped.
    let name: String = rule
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let policy = format!(
        "\"{name}\";q={};w={}",
        quota.requests,
        quota.period.as_secs()
    );
    let state = format!("\"{name}\";r=0;t={secs}");
    headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    for (field, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(field, v);
        }
    }
}
