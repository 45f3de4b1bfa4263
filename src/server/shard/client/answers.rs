//! The router's own answers on a client connection (`Clients`' methods): OpenAI-shaped
//! errors counted for their model, 429s of the rate limits, 401s of the API keys, protocol
//! errors, and the framing every answer ends with.

use crate::protocol::{write_protocol_error, Framing, ProtocolError, Version};
use crate::server::generation::NO_TENANT;

use crate::server::shard::answer::{write_json, write_router_error, AnswerTo, ErrorAnswer};
use crate::server::shard::answer::{write_router_error_with, BEARER_CHALLENGE};
use crate::server::shard::auth;
use crate::server::shard::connection::Phase;
use crate::server::shard::limits;
use crate::server::shard::upstream::Upstreams;
use crate::server::shard::Cx;

use super::Clients;

impl Clients {
    /// Writes a router answer, an OpenAI-shaped JSON error counted for `model`, then ends the
    /// request.
    pub(in crate::server::shard) fn router_error(
        &mut self,
        key: usize,
        answer: ErrorAnswer<'_>,
        model: Option<u16>,
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        let to = self.answer_to(key, cx);
        write_router_error(&mut self.conns[key].wbuf, answer, to);
        self.finish_response(key, answer.0, to.keep_alive, model, upstreams, cx);
    }

    /// Issue \[11\]: a request its tenant's limits refused: 429 `rate_limit_exceeded` with the
    /// bucket's `Retry-After`, or 400 `request_too_large` when it could never fit.
    pub(super) fn limited(
        &mut self,
        key: usize,
        refusal: crate::server::rate_limit::Refusal,
        model: u16,
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        let slot = self.conns[key].req.expect("a request");
        let name = cx.gen.tenant_name(self.requests[slot].tenant).unwrap_or("");
        let (status, code, message, retry_after) = limits::answer(refusal, name);
        let mut digits = [0u8; 20];
        let retry_after =
            retry_after.map(|s| ("Retry-After", crate::protocol::decimal(s, &mut digits)));
        let to = self.answer_to(key, cx);
        let answer = (status, code, &*message);
        write_router_error_with(&mut self.conns[key].wbuf, answer, to, retry_after);
        self.finish_response(key, status, to.keep_alive, Some(model), upstreams, cx);
    }

    /// A 401 `invalid_api_key` with `WWW-Authenticate: Bearer` (issue \[11\]), from the head
    /// alone: a request with a body closes the connection after it, as its body is not read.
    pub(super) fn unauthorized(
        &mut self,
        key: usize,
        error: crate::credential::AuthError,
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        let c = &mut self.conns[key];
        let req = &self.requests[c.req.expect("a request")];
        c.closing |= req.head.framing != Framing::None;
        let message = auth::message(error, &req.head, &c.rbuf);
        let to = self.answer_to(key, cx);
        let answer = (401, "invalid_api_key", message);
        write_router_error_with(&mut self.conns[key].wbuf, answer, to, Some(BEARER_CHALLENGE));
        self.finish_response(key, 401, to.keep_alive, None, upstreams, cx);
    }

    /// How an answer of the router's own to the request on `key` is framed: its client's
    /// version, `HEAD` or not, and kept alive unless the request, the connection or the
    /// shutdown says close.
    pub(super) fn answer_to(&self, key: usize, cx: &Cx) -> AnswerTo {
        let c = &self.conns[key];
        let req = c.req.map(|slot| &self.requests[slot]);
        AnswerTo {
            version: req.map_or(Version::Http11, |r| r.head.version),
            keep_alive: req.is_some_and(|r| r.keep_alive) && !c.closing && !cx.shutting_down(),
            head: req.is_some_and(|r| r.is_head(&c.rbuf)),
        }
    }

    /// Writes a router answer with `status` and a JSON body, then ends the request.
    pub(super) fn respond(
        &mut self,
        key: usize,
        status: u16,
        body: &[u8],
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        let to = self.answer_to(key, cx);
        write_json(&mut self.conns[key].wbuf, status, body, to);
        self.finish_response(key, status, to.keep_alive, None, upstreams, cx);
    }

    /// A framing error: answer and close (the connection cannot be trusted).
    pub(super) fn protocol_error(
        &mut self,
        key: usize,
        e: ProtocolError,
        model: Option<u16>,
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        write_protocol_error(e, &mut self.conns[key].wbuf);
        self.finish_response(key, e.status(), false, model, upstreams, cx);
    }

    /// The router's response is in the write buffer: count it and flush it.
    pub(super) fn finish_response(
        &mut self,
        key: usize,
        status: u16,
        keep_alive: bool,
        model: Option<u16>,
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        let c = &mut self.conns[key];
        match model {
            Some(m) => {
                let tenant = c.req.map_or(NO_TENANT, |slot| self.requests[slot].tenant);
                cx.metrics.count_status(m, tenant, status);
            }
            None => cx.metrics.count_other_status(status),
        }
        match c.req {
            Some(slot) => {
                let req = &mut self.requests[slot];
                req.status = status;
                req.keep_alive = keep_alive;
                req.complete = Some(false);
            }
            None => c.closing = true,
        }
        c.closing |= !keep_alive;
        c.phase = Phase::Done;
        self.set_timer(key, None, cx);
        self.flush(key, upstreams, cx);
    }
}
