//! Request intake (`Clients`' methods): reading a client's bytes, parsing the head (and
//! checking its API key), reading the body, and routing the complete request: the one pass over
//! its body that finds the model, the session fields and the prompt's block hashes (S16), then
//! its session, its rate-limit reservation, and its `Arrival` on the model's inbox.

use std::borrow::Cow;

use crate::clock::Tick;
use crate::protocol::prompt::PromptHasher;
use crate::protocol::{
    parse_request_head_into, scan_body, BodyFields, ChunkedDecoder, FieldValue, Framing, Side, Span,
};
use crate::ring::prompt_pool::{PromptPool, NO_PROMPT};
use crate::scheduler::{Arrival, Input, RequestId};
use crate::server::generation::{Generation, Model, SessionSource};
use crate::server::metrics::ShardMetrics;
use crate::server::shard::auth;
use crate::server::shard::connection::Phase;
use crate::server::shard::limits;
use crate::server::shard::request::{hash_session, session_value, Request, Session};
use crate::server::shard::upstream::Upstreams;
use crate::server::shard::Cx;

use super::{Clients, KEY_BITS};

/// Where an inference request goes, once its body is scanned (S16: the prompt's block hashes,
/// when its model hashes prompts, are in `Clients::prompt_scratch`).
#[derive(Debug, Clone, Copy)]
struct Route {
    model: u16,
    session: Option<u64>,
    body_len: usize,
    /// Issue \[11\]: the body's `max_tokens` (see `protocol::json::ModelField`).
    max_tokens: Option<u32>,
}

/// A router answer refusing a request: its status, error code and message, and the model it
/// counts for.
#[derive(Debug)]
struct Refusal {
    status: u16,
    code: &'static str,
    message: Cow<'static, str>,
    model: Option<u16>,
}

impl Clients {
    // ----- reading requests -----

    /// Reads what the client sent, then moves its request along.
    pub(super) fn read(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        if self.conns[key].phase == Phase::Lingering {
            return self.discard_input(key, cx);
        }
        loop {
            let limit = self.read_limit(key, cx);
            let c = &mut self.conns[key];
            let drained = c.fill(limit);
            let gone = c.gone;
            self.advance(key, upstreams, cx);
            if drained || gone || !self.conns.contains(key) {
                return;
            }
            // Read on only when the read stopped at a limit that the new phase raised above
            // what is buffered now (a parsed head lets its body in; a dispatched request, the
            // next head). Answering a pipelined request drops its bytes, so this compares
            // with the buffer after `advance`, not before.
            if self.read_limit(key, cx) <= self.conns[key].rlen {
                return;
            }
        }
    }

    /// How many bytes the client's buffer may hold now: a head may fill its limit (the parser
    /// reports the overflow) or the buffer it has already (a large request then comes in one
    /// read, not a head-sized one first); a body, its length and room for one pipelined head,
    /// as the later phases (so a body's last read comes up short when nothing follows it: the
    /// socket is known empty, and no read that only says EAGAIN follows the response).
    fn read_limit(&self, key: usize, cx: &Cx) -> usize {
        let Some(c) = self.conns.get(key) else { return 0 };
        let head_max = cx.gen.limits.max_header_bytes;
        match (c.phase, c.req.map(|slot| &self.requests[slot])) {
            (Phase::Head, _) => (head_max + 1).max(c.rbuf.len()),
            (Phase::Body, Some(req)) => match req.head.framing {
                Framing::ContentLength(n) => req.head.head_len + n as usize + head_max,
                // Chunk framing adds bytes; the decoder enforces the decoded limit.
                _ => usize::MAX,
            },
            (_, Some(req)) => req.raw_len + head_max,
            _ => head_max,
        }
    }

    /// Moves the client's request through the phases as far as its bytes allow.
    fn advance(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        loop {
            let progressed = match self.conns[key].phase {
                Phase::Head => self.parse_head(key, upstreams, cx),
                Phase::Body => self.read_body(key, upstreams, cx),
                Phase::Queued | Phase::Upstream(_) | Phase::Done | Phase::Lingering => false,
            };
            if !self.conns.contains(key) {
                return;
            }
            if !progressed {
                break;
            }
        }
        if self.conns[key].gone {
            self.gone(key, upstreams, cx);
        }
    }

    fn parse_head(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) -> bool {
        let c = &mut self.conns[key];
        if c.rlen == 0 {
            return false;
        }
        let head = self.requests.next_head();
        let parsed = parse_request_head_into(&c.rbuf[..c.rlen], &cx.gen.limits, head);
        let now = cx.now();
        match parsed {
            Err(e) => {
                self.protocol_error(key, e, None, upstreams, cx);
                false
            }
            Ok(false) => {
                // Bytes of a head arrived: the header timeout runs from the first of them.
                if c.req.is_none() && !c.gone {
                    let deadline = now + cx.timeouts.header;
                    let armed = c.timer.and_then(|timer| cx.wheel.deadline(timer));
                    if armed.is_none_or(|d| d > deadline) {
                        self.set_timer(key, Some(deadline), cx);
                    }
                }
                false
            }
            Ok(true) => {
                self.begin(key, now, upstreams, cx);
                true
            }
        }
    }

    /// A request's head is parsed (into the next request slot): it takes that slot, shows its
    /// API key when tenants are configured (issue \[11\]), and waits for its body (answering
    /// `100 Continue` when asked).
    fn begin(&mut self, key: usize, now: Tick, upstreams: &mut Upstreams, cx: &mut Cx) {
        let head = self.requests.next_head();
        let expect = head.expect_continue && head.framing != Framing::None;
        let decoder = (head.framing == Framing::Chunked)
            .then(|| ChunkedDecoder::new(cx.gen.limits.chunked(), Side::Downstream));
        let c = &mut self.conns[key];
        let slot = self.requests.start(decoder, now);
        c.req = Some(slot);
        if cx.gen.auth_required() {
            let req = &mut self.requests[slot];
            if auth::needs_key(req.head.path(&c.rbuf)) {
                match auth::authenticate(&req.head, &c.rbuf, &cx.gen.keys) {
                    Ok(tenant) => req.tenant = tenant,
                    Err(error) => return self.unauthorized(key, error, upstreams, cx),
                }
            }
        }
        let c = &mut self.conns[key];
        c.phase = Phase::Body;
        if expect {
            c.wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let deadline = now + cx.timeouts.body;
        self.set_timer(key, Some(deadline), cx);
        if expect {
            self.flush(key, upstreams, cx);
        }
    }

    /// Checks whether the body is complete; dispatches the request when it is.
    fn read_body(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) -> bool {
        let c = &mut self.conns[key];
        let req = &mut self.requests[c.req.expect("a request in the body phase")];
        let complete = match req.head.framing {
            Framing::None => true,
            Framing::ContentLength(n) => {
                let end = req.head.head_len + n as usize;
                req.raw_len = end;
                c.rlen >= end
            }
            Framing::Chunked => {
                let decoder = req.decoder.as_mut().expect("a chunked decoder");
                match decoder.feed(&c.rbuf[req.raw_len..c.rlen], &mut req.decoded) {
                    Ok(progress) => {
                        req.raw_len += progress.consumed;
                        progress.done
                    }
                    Err(e) => {
                        let model = req.model;
                        self.protocol_error(key, e, model, upstreams, cx);
                        return false;
                    }
                }
            }
        };
        if !complete {
            return false;
        }
        self.set_timer(key, None, cx);
        self.dispatch(key, upstreams, cx);
        true
    }

    // ----- routing -----

    /// Routes a complete request.
    fn dispatch(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        let gen = cx.gen;
        let c = &self.conns[key];
        let req = &self.requests[c.req.expect("a request to dispatch")];
        let method = req.head.method(&c.rbuf);
        let path = req.head.path(&c.rbuf);
        if method == b"POST" && path.starts_with(b"/v1/") {
            return self.inference(key, upstreams, cx);
        }
        // HEAD is GET without the content (RFC 9110 9.3.2; `respond` leaves the body out).
        let method = if method == b"HEAD" { b"GET".as_slice() } else { method };
        match (method, path) {
            (b"GET", b"/v1/models") => self.respond(key, 200, &gen.models_json, upstreams, cx),
            (b"GET", b"/healthz") => self.respond(key, 200, br#"{"status":"ok"}"#, upstreams, cx),
            (b"GET", b"/readyz") if gen.ready() => {
                self.respond(key, 200, br#"{"status":"ready"}"#, upstreams, cx);
            }
            (b"GET", b"/readyz") => self.respond(
                key,
                503,
                br#"{"status":"not ready","reason":"a model has no healthy backend"}"#,
                upstreams,
                cx,
            ),
            _ => {
                let answer = (404, "model_not_found", "unknown path");
                self.router_error(key, answer, None, upstreams, cx);
            }
        }
    }

    /// An inference request: find its model and session, and queue it.
    fn inference(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        match self.route(key, cx) {
            Ok(route) => self.queue(key, route, upstreams, cx),
            Err(r) => {
                let answer = (r.status, r.code, &*r.message);
                self.router_error(key, answer, r.model, upstreams, cx);
            }
        }
    }

    /// Where an inference request goes: one pass over its body finds the model, records the
    /// `body:` session fields of every model (into `field_values`) and, when a model hashes
    /// prompts, the prompt's block hashes (into `prompt_scratch`; copied into the model's pool
    /// slot by `prompt_slot`); then the model's session sources, in order, give the session.
    fn route(&mut self, key: usize, cx: &Cx) -> Result<Route, Refusal> {
        let gen = cx.gen;
        let c = &self.conns[key];
        let req = &mut self.requests[c.req.expect("a request")];
        let body = req.body(&c.rbuf);
        if let Some(block) = gen.prompt_block_bytes {
            if self.prompt_hasher.block_bytes() != block {
                self.prompt_hasher = PromptHasher::new(block);
            }
        }
        let hasher =
            gen.prompt_block_bytes.map(|_| (&mut self.prompt_hasher, &mut self.prompt_scratch));
        // No allocation once the vector has grown to the generation's field count.
        self.field_values.resize(gen.body_fields.len(), FieldValue::Unseen);
        let fields = BodyFields { names: &gen.body_fields, values: &mut self.field_values };
        let refusal = |status, code, message, model| Refusal { status, code, message, model };
        let field = match scan_body(body, hasher, fields) {
            Ok((field, _)) => field,
            Err(e) => return Err(refusal(400, "invalid_request", e.to_string().into(), None)),
        };
        let Some(&model) = gen.by_name.get(&*field.value) else {
            let message = format!("model {:?} is not configured", &*field.value);
            return Err(refusal(404, "model_not_found", message.into(), None));
        };
        let (streaming, token, body_len) = (field.stream, field.token.clone(), body.len());
        let max_tokens = field.max_tokens;
        req.model = Some(model);
        req.streaming = streaming;
        req.model_token = token;
        let m = &gen.models[usize::from(model)];
        match find_session(m, gen, req, &c.rbuf, &self.field_values) {
            Ok(session) => {
                req.session = session;
                let session = req.session_value(&c.rbuf).map(hash_session);
                Ok(Route { model, session, body_len, max_tokens })
            }
            Err(message) => Err(refusal(400, "invalid_request", message.into(), Some(model))),
        }
    }

    /// Queues a routed request with its model's scheduler, or answers 503 when a shutdown has
    /// begun, the buffered-bytes budget is spent or the model's inbox is full.
    fn queue(&mut self, key: usize, route: Route, upstreams: &mut Upstreams, cx: &mut Cx) {
        let gen = cx.gen;
        let Route { model, session, body_len, max_tokens } = route;
        let slot = self.conns[key].req.expect("a request");
        let held = self.requests[slot].raw_len as u64 + self.requests[slot].decoded.len() as u64;
        let refused = if cx.shutting_down() {
            Some("shutting down")
        } else if self.buffered + held > gen.config.server.max_buffered_bytes {
            Some("buffered request bytes budget exhausted")
        } else {
            None
        };
        if let Some(message) = refused {
            return self.router_error(
                key,
                (503, "unavailable", message),
                Some(model),
                upstreams,
                cx,
            );
        }
        let req = &mut self.requests[slot];
        let reserved =
            limits::reserve(gen, cx.limiter, cx.metrics, req, (body_len, max_tokens), cx.now());
        if let Err(refusal) = reserved {
            return self.limited(key, refusal, model, upstreams, cx);
        }
        self.serial += 1;
        let id = RequestId::new(cx.shard, self.serial << KEY_BITS | key as u64);
        let prompt = self.prompt_slot(key, model, cx);
        // Issue [11]: the request's tenant (`Request::tenant`, 0 = none) is what the fair-share
        // scheduler's `Arrival::tenant` takes; this is the one place an `Arrival` is built.
        let arrival = Arrival {
            id,
            session,
            prompt_bytes: u32::try_from(body_len).unwrap_or(u32::MAX),
            streaming: self.requests[slot].streaming,
            prompt,
            tenant: self.requests[slot].tenant,
        };
        if cx.inputs.arrive(gen, model, Input::Arrive(arrival)).is_err() {
            let pool = &gen.models[usize::from(model)].prompts;
            if let (Some(pool), true) = (pool, prompt != NO_PROMPT) {
                pool.release(prompt);
            }
            let answer = (503, "unavailable", "the model's scheduler inbox is full");
            return self.router_error(key, answer, Some(model), upstreams, cx);
        }
        let req = &mut self.requests[slot];
        req.id = id;
        req.buffered = held;
        self.conns[key].phase = Phase::Queued;
        self.buffered += held;
        ShardMetrics::set(&cx.metrics.buffered, self.buffered);
    }

    /// S16: the pool slot holding the request's prompt block hashes, or [`NO_PROMPT`] when its
    /// model hashes no prompts or the pool is exhausted (counted: the request goes as if
    /// nothing of it were cached).
    fn prompt_slot(&mut self, key: usize, model: u16, cx: &Cx) -> u32 {
        let m = &cx.gen.models[usize::from(model)];
        let Some(pool) = &m.prompts else { return NO_PROMPT };
        let Some(slot) = pool.acquire() else {
            let exhausted = &cx.metrics.models[usize::from(model)].prompt_pool_exhausted;
            ShardMetrics::bump(exhausted);
            return NO_PROMPT;
        };
        let block = m.config.queue.prefix_block_bytes as usize;
        if block == self.prompt_hasher.block_bytes() {
            // The scan hashed at this model's block size: its hashes go into the slot.
            let (scratch, found) = (&self.prompt_scratch, self.prompt_hasher.ends());
            pool.with_ends(slot, |hashes, ends| {
                hashes.clear();
                hashes.extend_from_slice(scratch);
                *ends = found;
            });
            return slot;
        }
        // Another model's block size: a second pass at this model's.
        let c = &self.conns[key];
        let body = self.requests[c.req.expect("a request")].body(&c.rbuf);
        hash_prompt(pool, slot, &mut self.prompt_hasher, block, body);
        slot
    }
}

/// The session of `req`, routed to model `m`: its sources in order, the first present wins (a
/// header whose value is empty after trimming, or a body field that is not a usable string, is
/// not present). The model's own `session_header` keeps SPEC 2.4's rule, an invalid value is a
/// 400 (the message); another header's invalid value counts as absent.
fn find_session(
    m: &Model,
    gen: &Generation,
    req: &Request,
    rbuf: &[u8],
    fields: &[FieldValue],
) -> Result<Session, &'static str> {
    for source in &m.session_sources {
        match source {
            // Checked when the head was parsed (a bad value was answered 400 then).
            SessionSource::Header { name, .. } if *name == gen.limits.session_header => {
                if let Some(span) = req.head.session_id {
                    return Ok(Session::Header(span));
                }
            }
            SessionSource::Header { name, strict } => {
                match session_value(req.head.headers.get(rbuf, name)) {
                    Ok(Some(value)) => return Ok(Session::Header(Span::of(rbuf, value))),
                    Ok(None) => {}
                    Err(message) if *strict => return Err(message),
                    Err(_) => {}
                }
            }
            SessionSource::Body(index) => {
                if let FieldValue::String { start, end } = fields[*index] {
                    return Ok(Session::Body { start, end });
                }
            }
        }
    }
    Ok(Session::None)
}

/// S16: hashes `body`'s prompt in `block`-byte blocks into the pool's `slot`.
fn hash_prompt(pool: &PromptPool, slot: u32, hasher: &mut PromptHasher, block: usize, body: &[u8]) {
    if hasher.block_bytes() != block {
        *hasher = PromptHasher::new(block);
    }
    pool.with_ends(slot, |hashes, ends| {
        hasher.hash_body(body, hashes);
        *ends = hasher.ends();
    });
}
