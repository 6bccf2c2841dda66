//! Phase "limit": the `rateLimit` rules of the request's policy (docs/rate-limits.md), after
//! "authorize" (a refused client costs no quota) and before "admit". Every kind counts one
//! request: an HTTP request, a websocket or a CONNECT tunnel when it opens, a passthrough
//! connection when its ClientHello is read; an MCP call to an MCP endpoint path is judged by
//! the MCP hook once its body is read (rules may select by JSON-RPC method and tool).
//!
//! Local rules first (atomic counters in this process), then global ones (one Redis script
//! for all of them). A request over any rule is refused and counted by none: the rules that
//! had counted it give it back. `mode: Report` lets it through, recorded as "would limit".
//! When Redis cannot decide within its `timeout`, `failureMode` says: `Open` passes, `Closed`
//! refuses (503 `rate_limit_unavailable`).

use std::sync::Arc;

use super::ctx::RequestCtx;
use super::kind::Kind;
use crate::http::error::ProxyError;
use crate::policy::identity::Client;
use crate::ratelimit::redis::GlobalCheck;
use crate::ratelimit::rules::{Counter, Facts, McpCall, RateLimitPolicy, Rule};
use crate::ratelimit::{clock, Decision};
use crate::snapshot::Target;
use crate::telemetry::metrics::RateLimitStats;

/// What the request looks like to the rules (besides its client).
#[derive(Clone, Copy)]
pub(super) struct Request<'r> {
    pub(super) method: &'r str,
    pub(super) path: &'r str,
    pub(super) headers: Option<&'r http::HeaderMap>,
    pub(super) mcp: Option<McpCall<'r>>,
}

/// Phase "limit" for an HTTP request, a websocket or a CONNECT (`kind`): its rules judged now,
/// unless the MCP hook judges them once the body is read ([`judged_by_mcp`]).
pub(super) async fn of_request<B>(
    ctx: &mut RequestCtx<'_>,
    rules: &Arc<RateLimitPolicy>,
    target: &Target,
    req: &http::Request<B>,
    kind: Kind,
) -> Result<(), ProxyError> {
    if judged_by_mcp(rules, target, req, kind) {
        return Ok(());
    }
    let request = Request {
        method: req.method().as_str(),
        path: req.uri().path(),
        headers: Some(req.headers()),
        mcp: None,
    };
    phase(ctx, rules, request).await
}

/// Whether the MCP hook judges a request's rules rather than phase "limit" itself: rules
/// select MCP calls, and the request is a POST to the MCP endpoint path (its JSON-RPC body is
/// read there).
fn judged_by_mcp<B>(
    rules: &RateLimitPolicy,
    target: &Target,
    req: &http::Request<B>,
    kind: Kind,
) -> bool {
    rules.mcp
        && kind == Kind::Request
        && req.method() == http::Method::POST
        && target
            .port
            .mcp
            .as_deref()
            .is_some_and(|m| m.applies_to(req.uri()))
}

/// Phase "limit": `Ok` when the request may go on.
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    policy: &Arc<RateLimitPolicy>,
    request: Request<'_>,
) -> Result<(), ProxyError> {
    let facts = Facts {
        method: request.method,
        path: request.path,
        headers: request.headers,
        client: Client {
            addr: ctx.conn.client.ip(),
            tls: ctx.conn.identity.as_deref(),
            user: ctx.user.as_deref(),
        },
        mcp: request.mcp,
    };
    let now = clock::now_ms();
    if let Some((rule, decision)) = local(ctx, policy, &facts, now) {
        return over(ctx, policy, rule, decision);
    }
    if policy.has_global() {
        match Box::pin(global(ctx, policy, &facts)).await {
            Ok(None) => {}
            Ok(Some((rule, decision))) => {
                give_back(policy, &facts, policy.local.len(), now);
                return over(ctx, policy, rule, decision);
            }
            Err(err) => {
                if matches!(err, ProxyError::RateLimitUnavailable { .. }) {
                    give_back(policy, &facts, policy.local.len(), now);
                }
                return Err(err);
            }
        }
    }
    Ok(())
}

/// The local rules: the first one over its limit, with its decision (the rules before it
/// given their request back).
fn local<'p>(
    ctx: &RequestCtx<'_>,
    policy: &'p RateLimitPolicy,
    facts: &Facts<'_>,
    now: u64,
) -> Option<(&'p Rule, Decision)> {
    let mut key = Vec::new();
    for (i, rule) in policy.local.iter().enumerate() {
        key.clear();
        let Counter::Local(counter) = &rule.counter else {
            continue;
        };
        if !rule.matches(facts, &mut key) {
            continue;
        }
        let decision = counter.acquire(&key, rule.quota, now);
        if !decision.allowed {
            give_back(policy, facts, i, now);
            return Some((rule, decision));
        }
        stats(ctx, policy, rule).allowed.inc();
    }
    None
}

/// Gives back the request the first `n` local rules counted.
fn give_back(policy: &RateLimitPolicy, facts: &Facts<'_>, n: usize, now: u64) {
    let mut key = Vec::new();
    for rule in &policy.local[..n] {
        key.clear();
        if let Counter::Local(counter) = &rule.counter {
            if rule.matches(facts, &mut key) {
                counter.release(&key, rule.quota, now);
            }
        }
    }
}

/// The global rules, in one Redis round trip: the rule over its limit, if one is.
async fn global<'p>(
    ctx: &RequestCtx<'_>,
    policy: &'p RateLimitPolicy,
    facts: &Facts<'_>,
) -> Result<Option<(&'p Rule, Decision)>, ProxyError> {
    let mut matched: Vec<(&Rule, String)> = Vec::new();
    let mut key = Vec::new();
    for rule in policy.global.iter() {
        key.clear();
        let Counter::Global(base) = &rule.counter else {
            continue;
        };
        if rule.matches(facts, &mut key) {
            matched.push((rule, global_key(base, &key)));
        }
    }
    if matched.is_empty() {
        return Ok(None);
    }
    let checks: Vec<GlobalCheck<'_>> = matched
        .iter()
        .map(|(rule, key)| GlobalCheck {
            key,
            quota: rule.quota,
        })
        .collect();
    let Some(store) = ctx.snapshot.rate_limit_store.as_deref() else {
        return unavailable(ctx, policy, "no Redis store is running".into());
    };
    match store.acquire(&checks).await {
        Ok(decisions) => {
            let over = matched
                .iter()
                .zip(&decisions)
                .find(|(_, d)| !d.allowed)
                .map(|((rule, _), d)| (*rule, *d));
            if over.is_none() {
                for (rule, _) in &matched {
                    stats(ctx, policy, rule).allowed.inc();
                }
            }
            Ok(over)
        }
        Err(e) => {
            let reason = e.kind();
            let metrics = &ctx.shared.metrics;
            let label = crate::telemetry::metrics::ReasonLabel { reason };
            metrics.ratelimit_redis_errors.get_or_create(&label).inc();
            unavailable(ctx, policy, e.to_string())
        }
    }
}

/// The Redis key of a global rule: its base, and a digest of the distinct values (never the
/// values themselves: they are the client's, of any length).
fn global_key(base: &str, distinct: &[u8]) -> String {
    if distinct.is_empty() {
        return base.to_owned();
    }
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, distinct);
    let mut key = String::with_capacity(base.len() + 33);
    key.push_str(base);
    key.push(':');
    for b in &digest.as_ref()[..16] {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

/// Redis could not decide: `failureMode` says what happens.
fn unavailable<T: Default>(
    ctx: &RequestCtx<'_>,
    policy: &RateLimitPolicy,
    reason: String,
) -> Result<T, ProxyError> {
    let closed = ctx.snapshot.settings.rate_limit_failure_closed;
    let action = if closed { "refused" } else { "passed" };
    let label = crate::telemetry::metrics::ActionLabel { action };
    ctx.shared
        .metrics
        .ratelimit_failure_mode
        .get_or_create(&label)
        .inc();
    crate::telemetry::log_limit::limited!(warn, policy = %policy.name, %reason, action, "rate limit could not be checked in Redis");
    if closed {
        Err(ProxyError::RateLimitUnavailable {
            policy: policy.name.clone(),
            reason,
        })
    } else {
        Ok(T::default())
    }
}

/// A rule's quota is used up: refused, or (`mode: Report`) let through and recorded.
fn over(
    ctx: &mut RequestCtx<'_>,
    policy: &RateLimitPolicy,
    rule: &Rule,
    decision: Decision,
) -> Result<(), ProxyError> {
    let stats = stats(ctx, policy, rule);
    let verdict = if policy.report {
        stats.would_limit.inc();
        "would_limit"
    } else {
        stats.limited.inc();
        "limited"
    };
    ctx.rate_limit = Some(format!("{verdict} {}/{}", policy.name, rule.label));
    if policy.report {
        return Ok(());
    }
    Err(ProxyError::RateLimited {
        policy: policy.name.clone(),
        rule: rule.label.clone(),
        quota: rule.quota,
        reset: decision.reset,
    })
}

fn stats<'r>(ctx: &RequestCtx<'_>, policy: &RateLimitPolicy, rule: &'r Rule) -> &'r RateLimitStats {
    rule.stats.get_or_init(|| {
        ctx.shared
            .metrics
            .ratelimit_stats(&policy.name, &rule.label)
    })
}
