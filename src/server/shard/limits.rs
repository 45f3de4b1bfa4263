//! A request against its tenant's rate limits (issue \[11\]): what it reserves when it is queued,
//! the answer when it is refused, and what it settles to when it ends. The cells and their
//! arithmetic are [`Limiter`]'s (`server::rate_limit`); this file decides the amounts.
//!
//! - **Reserved** when the request is queued, before its scheduler sees it: one request, and
//!   its prompt's estimated tokens (body bytes / 4, the scheduler's own estimate before it has
//!   learned a backend's ratio, [`TokenRate::NEW`](crate::scheduler::estimate::TokenRate))
//!   plus its `max_tokens` (the larger of `max_tokens` and `max_completion_tokens`), or
//!   `rate_limit.default_max_tokens` capped to what the bucket holds beyond the prompt.
//! - **Settled** when it ends, to what it used: for a 2xx response, the `usage` it carried
//!   (`prompt_tokens` + `completion_tokens`); without `completion_tokens`, a stream counts one
//!   token per SSE `data:` event (the client did not ask for `stream_options.include_usage`,
//!   or the stream was cut before the usage event), and another response keeps its
//!   reservation; without `prompt_tokens`, the estimate stands. A request that got no 2xx
//!   (refused, failed before a response, a backend's error status, its client gone before the
//!   head) used nothing: its tokens are refunded. The request itself stays counted.

use std::borrow::Cow;

use crate::server::generation::{Generation, NO_TENANT};
use crate::server::metrics::ShardMetrics;
use crate::server::rate_limit::{Limit, Limiter, Refusal, Reservation};

use super::request::Request;

/// Prompt bytes per estimated token.
const BYTES_PER_TOKEN: u64 = 4;

/// Reserves `req`'s request and tokens of its tenant (nothing without a tenant); a body of
/// `body_len` bytes naming `max_tokens`. On a refusal nothing is held and it is counted.
pub(super) fn reserve(
    gen: &Generation,
    limiter: &Limiter,
    metrics: &ShardMetrics,
    req: &mut Request,
    (body_len, max_tokens): (usize, Option<u32>),
    now: crate::clock::Tick,
) -> Result<(), Refusal> {
    let index = req.tenant;
    let Some(tenant) = gen.tenant(index) else { return Ok(()) };
    let (rpm, tpm) = (tenant.config.requests_per_minute, tenant.config.tokens_per_minute);
    let prompt = (body_len as u64).div_ceil(BYTES_PER_TOKEN);
    req.prompt_estimate = prompt;
    if rpm == 0 && tpm == 0 {
        // Nothing to hold, but the request settles when it ends, so that its tokens are
        // counted (`warmpath_tenant_tokens_total` counts every tenant's).
        req.reservation = Some(Reservation::NONE);
        return Ok(());
    }
    let completion = match max_tokens {
        Some(n) => u64::from(n),
        None => {
            let default = u64::from(gen.config.rate_limit.default_max_tokens);
            if tpm == 0 {
                default
            } else {
                default.min(tpm.saturating_sub(prompt))
            }
        }
    };
    match limiter.reserve(tenant, index, prompt + completion, now) {
        Ok(reservation) => {
            req.reservation = Some(reservation);
            req.tokens_reserved = (tpm > 0).then_some(reservation.tokens);
            Ok(())
        }
        Err(refusal) => {
            let limit = match refusal {
                Refusal::Over { limit, .. } => limit,
                Refusal::TooLarge { .. } => Limit::Tokens,
            };
            req.limited = Some(limit);
            metrics.count_rate_limited(index, limit);
            Err(refusal)
        }
    }
}

/// The answer to a refusal of tenant `name`'s request: its status, code, message and
/// `Retry-After` (seconds).
pub(super) fn answer(
    refusal: Refusal,
    name: &str,
) -> (u16, &'static str, Cow<'static, str>, Option<u64>) {
    match refusal {
        Refusal::Over { limit, retry_after_s } => {
            let key = match limit {
                Limit::Requests => "requests_per_minute",
                Limit::Tokens => "tokens_per_minute",
            };
            let message = format!(
                "rate limit reached: tenant {name:?} is over its {key}; retry after {retry_after_s} s"
            );
            (429, "rate_limit_exceeded", message.into(), Some(retry_after_s))
        }
        Refusal::TooLarge { tokens, limit } => {
            let message = format!(
                "request too large: it may use {tokens} tokens (the prompt's estimate plus \
                 max_tokens), more than tenant {name:?}'s whole tokens_per_minute ({limit}); \
                 lower max_tokens or shorten the prompt"
            );
            (400, "request_too_large", message.into(), None)
        }
    }
}

/// Settles `req`'s reservation, once, to what it used (see the module doc), and counts the
/// tokens of a 2xx response.
pub(super) fn settle(
    gen: &Generation,
    limiter: &Limiter,
    metrics: &ShardMetrics,
    req: &mut Request,
) {
    let Some(reservation) = req.reservation.take() else { return };
    let Some(tenant) = gen.tenant(req.tenant) else { return };
    let (prompt, completion) = used(req, reservation.tokens);
    if (200..300).contains(&req.status) && req.tenant != NO_TENANT {
        metrics.count_tenant_tokens(req.tenant, prompt, completion);
    }
    let used = prompt + completion;
    req.tokens_used = (tenant.config.tokens_per_minute > 0).then_some(used);
    limiter.settle(tenant, req.tenant, reservation, used);
}

/// The prompt and completion tokens `req` used, having reserved `reserved`.
fn used(req: &Request, reserved: u64) -> (u64, u64) {
    let relayed = req.ttfb.is_some() && (200..300).contains(&req.status);
    if !relayed {
        return (0, 0);
    }
    let usage = req.usage.usage();
    let prompt = usage.prompt_tokens.map_or(req.prompt_estimate, u64::from);
    let completion = match (usage.completion_tokens, req.streaming) {
        (Some(n), _) => u64::from(n),
        (None, true) => u64::from(req.usage.events()),
        (None, false) => reserved.saturating_sub(req.prompt_estimate),
    };
    (prompt, completion)
}
