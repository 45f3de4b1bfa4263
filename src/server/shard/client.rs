//! The acceptor and the client connections of a shard, [`Clients`]: accepting, reading
//! requests (parsed by `protocol`), routing them, queueing them with their scheduler, acting on
//! its decisions, answering, ending requests (S10, S12, S14) and writing their access-log
//! lines. The room's other files: a connection and its socket I/O (`connection.rs`), the
//! router's answers as bytes (`answer.rs`) and `Clients`' methods that write them
//! (`client/answers.rs`), `Clients`' request intake, from the first byte to the model's inbox
//! (`client/intake.rs`), a request's state in its reused slot (`request.rs`). What a request
//! does upstream is [`Upstreams`]' business: a call that
//! reaches it (an admission forwards, a flush resumes a paused relay, a client gone
//! mid-response closes its upstream connection) takes it as an argument.

mod answers;
mod intake;

use std::io::{self, ErrorKind, Write};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::Interest;
use rustls::ServerConnection;
use slab::Slab;

use crate::clock::Tick;
use crate::protocol::prompt::PromptHasher;
use crate::protocol::{write_error, FieldValue};
use crate::scheduler::tracker::turn_bucket;
use crate::scheduler::{Input, Output, Usage};
use crate::server::access_log::{self, Outcome, ShardLog};
use crate::server::metrics::ShardMetrics;

use super::answer::rejection;
use super::connection::{discard_unread, read_away, Client, Phase};
use super::limits;
use super::request::{format_request_id, Admission, Request, Requests, Session};
use super::upstream::Upstreams;
use super::{Cx, Occasional, Owner, CLIENT_HIGH_WATER, KEEP_BUFFER_MAX, READ_CHUNK};

/// How long a keep-alive connection may sit idle holding its buffers:
/// after this it gives them back and holds none until its next request (which allocates
/// again), so the memory of idle connections does not drift up to their number times their
/// largest request.
const IDLE_RELEASE: Duration = Duration::from_secs(1);
/// How long a closing client connection keeps reading (and discarding) its input after its
/// last answer, so that a reset does not destroy that answer (RFC 9112 9.6).
const LINGER: Duration = Duration::from_secs(2);
/// Request serials carry the connection's key in their low bits, so client keys stay below
/// 2^24.
const KEY_BITS: u32 = 24;

/// The acceptor and the client connections.
#[derive(Debug)]
pub(super) struct Clients {
    /// The shard's `SO_REUSEPORT` listener; `None` once a drain stopped accepting.
    listener: Option<TcpListener>,
    conns: Slab<Client>,
    /// The state of each request being worked on, in slots the connections hold by index.
    requests: Requests,
    /// Open client connections, lingering ones included.
    open: usize,
    /// This shard's share of `max_connections`.
    max: usize,
    /// The last request serial; a request id is the shard, the serial and the client's key.
    serial: u64,
    /// Request bytes held by queued requests (`max_buffered_bytes`).
    buffered: u64,
    /// Client connections to read again: their response ended and the next request may be
    /// buffered already.
    again: Vec<usize>,
    /// For refusals and input read away.
    scratch: Vec<u8>,
    /// S16: cuts prompts into hashed blocks (its buffer is one block, reused).
    prompt_hasher: PromptHasher,
    /// The block hashes of the last body scanned (see `route`).
    prompt_scratch: Vec<u64>,
    /// What the last body scanned holds of the generation's `body:` session fields.
    field_values: Vec<FieldValue>,
    /// This shard's access-log buffer, when the log is on, and the line being formatted.
    log: Option<Arc<ShardLog>>,
    log_line: Vec<u8>,
    /// `accept` failed for want of a descriptor or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM):
    /// the connections left in the listen queue announce nothing more (the listener is
    /// edge-triggered), so the shard retries at `accept_retry_at`, or at once when one of its
    /// connections closes. `None` while accepting works.
    accept_retry_at: Option<Tick>,
    /// A connection closed while accepting was stalled: a descriptor is free.
    freed: bool,
    /// When an `accept` failure was last logged.
    accept_log: Occasional,
}

/// How long a shard waits before it tries `accept` again after it failed for want of
/// descriptors, when none of its connections closes meanwhile.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

impl Clients {
    pub(super) fn new(listener: TcpListener, max: usize, log: Option<Arc<ShardLog>>) -> Clients {
        Clients {
            listener: Some(listener),
            conns: Slab::with_capacity(1024),
            requests: Requests::default(),
            open: 0,
            max,
            serial: 0,
            buffered: 0,
            again: Vec::new(),
            accept_retry_at: None,
            freed: false,
            accept_log: Occasional::default(),
            scratch: Vec::with_capacity(16 << 10),
            prompt_hasher: PromptHasher::new(256),
            prompt_scratch: Vec::new(),
            field_values: Vec::new(),
            log,
            log_line: Vec::with_capacity(1024),
        }
    }

    /// A new generation's share of `max_connections`.
    pub(super) fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// Whether no client connection is open.
    pub(super) fn is_empty(&self) -> bool {
        self.open == 0
    }

    /// Whether connections wait to be read again.
    pub(super) fn has_again(&self) -> bool {
        !self.again.is_empty()
    }

    /// Whether accepting is stalled (`accept_retry_at`), and so the loop must not sleep past
    /// [`ACCEPT_RETRY`].
    pub(super) fn accept_stalled(&self) -> bool {
        self.accept_retry_at.is_some()
    }

    /// Tries `accept` again if it is stalled and a descriptor came free or the retry is due.
    pub(super) fn retry_accept(&mut self, cx: &mut Cx) {
        let Some(at) = self.accept_retry_at else { return };
        if std::mem::take(&mut self.freed) || cx.now() >= at {
            self.accept(cx);
        }
    }

    /// Client `key` and its request, for the upstream side of their exchange; `None` when the
    /// connection is gone. An exchange always has a request: none is a bug (a panic).
    pub(super) fn exchange(&mut self, key: usize) -> Option<(&mut Client, &mut Request)> {
        let c = self.conns.get_mut(key)?;
        let slot = c.req.expect("a request in an exchange");
        Some((c, &mut self.requests[slot]))
    }

    fn set_timer(&mut self, key: usize, deadline: Option<Tick>, cx: &mut Cx) {
        if let Some(c) = self.conns.get_mut(key) {
            cx.set_timer(&mut c.timer, Owner::Client(key), deadline);
        }
    }

    // ----- accept -----

    pub(super) fn accept(&mut self, cx: &mut Cx) {
        loop {
            let Some(listener) = &self.listener else { return };
            let (mut stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.accept_retry_at = None;
                    return;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return self.accept_failed(&e, cx),
            };
            self.accept_retry_at = None;
            if self.open >= self.max {
                self.refuse(stream, cx);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            if key >= 1 << KEY_BITS {
                continue;
            }
            // On a TLS listener the session starts here; its handshake runs as the client's
            // bytes arrive, under the header timeout armed below.
            let tls = match &cx.gen.tls {
                Some(config) => match ServerConnection::new(Arc::clone(config)) {
                    Ok(session) => Some(Box::new(session)),
                    Err(_) => continue,
                },
                None => None,
            };
            let interest = Interest::READABLE | Interest::WRITABLE;
            if cx.registry.register(&mut stream, Owner::Client(key).token(), interest).is_err() {
                continue;
            }
            entry.insert(Client::new(stream, peer.ip(), tls));
            self.open += 1;
            ShardMetrics::bump(&cx.metrics.accepted);
            ShardMetrics::set(&cx.metrics.open, self.open as u64);
            let deadline = cx.now() + cx.timeouts.header;
            self.set_timer(key, Some(deadline), cx);
        }
    }

    /// `accept` failed, most likely for want of descriptors (EMFILE: the process's open-file
    /// limit; ENFILE: the system's): counted, said once per stall, retried (`accept_retry_at`).
    fn accept_failed(&mut self, error: &io::Error, cx: &mut Cx) {
        ShardMetrics::bump(&cx.metrics.accept_errors);
        if self.accept_log.due(cx) {
            eprintln!(
                "warmpath: shard {}: accept failed: {error}; connections wait in the listen \
                 queue until descriptors free up (warmpath_accept_errors_total counts each \
                 failure; raise the open-file limit, e.g. LimitNOFILE)",
                cx.shard
            );
        }
        self.freed = false;
        self.accept_retry_at = Some(cx.now() + cx.rate.ticks(ACCEPT_RETRY));
    }

    /// Over `max_connections`: a 503 and a close (on TLS only the close: a 503 needs a
    /// handshake first, which is what the limit spares).
    fn refuse(&mut self, mut stream: TcpStream, cx: &Cx) {
        ShardMetrics::bump(&cx.metrics.refused);
        if cx.gen.tls.is_some() {
            return discard_unread(&mut stream, &mut self.scratch);
        }
        self.scratch.clear();
        write_error(
            503,
            "unavailable",
            "too many connections",
            &mut self.scratch,
            &[("Connection", b"close")],
        );
        let _ = stream.write(&self.scratch);
        // No slot to linger in: read away what already arrived, so that the close is a FIN
        // after the 503 rather than a reset (input arriving later still resets).
        discard_unread(&mut stream, &mut self.scratch);
    }

    /// Stops accepting (S13) and closes the idle keep-alive connections; busy ones close after
    /// their response. False when it had stopped already.
    pub(super) fn stop_accepting(&mut self, cx: &mut Cx) -> bool {
        let Some(mut listener) = self.listener.take() else { return false };
        let _ = cx.registry.deregister(&mut listener);
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.phase == Phase::Head && c.rlen == 0)
            .map(|(key, _)| key)
            .collect();
        for key in idle {
            self.close(key, cx);
        }
        true
    }

    /// The drain deadline passed: every client connection left is dropped as gone.
    pub(super) fn all_gone(&mut self, upstreams: &mut Upstreams, cx: &mut Cx) {
        let keys: Vec<usize> = self.conns.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.gone(key, upstreams, cx);
        }
    }

    // ----- events -----

    /// A readiness event of connection `key`.
    pub(super) fn ready(
        &mut self,
        key: usize,
        readable: bool,
        writable: bool,
        hup: bool,
        upstreams: &mut Upstreams,
        cx: &mut Cx,
    ) {
        let Some(c) = self.conns.get_mut(key) else { return };
        c.hup |= hup;
        if writable {
            self.flush(key, upstreams, cx);
        }
        if readable && self.conns.contains(key) {
            self.read(key, upstreams, cx);
        }
    }

    /// Reads the connections whose response ended with the next request possibly buffered.
    pub(super) fn read_again(&mut self, upstreams: &mut Upstreams, cx: &mut Cx) {
        while let Some(key) = self.again.pop() {
            let reading = |c: &Client| matches!(c.phase, Phase::Head | Phase::Body);
            if self.conns.get(key).is_some_and(reading) {
                self.read(key, upstreams, cx);
            }
        }
    }

    /// Connection `key`'s timer fired.
    pub(super) fn expired(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        let now = cx.now();
        let Some(c) = self.conns.get_mut(key) else { return };
        c.timer = None;
        match c.phase {
            Phase::Lingering => {
                c.gone = true;
                self.close(key, cx);
            }
            // A TLS handshake not done within `header_timeout` of the accept: nothing can be
            // answered, close.
            Phase::Head if c.rlen == 0 && c.handshaking() => self.close(key, cx),
            // Idle for IDLE_RELEASE with buffers: give them back, and close when the rest of
            // `idle_timeout` has passed too.
            Phase::Head if c.rlen == 0 && c.holds_buffers() => {
                c.rbuf = Vec::new();
                c.wbuf = Vec::new();
                let rest = cx.timeouts.idle.saturating_sub(cx.rate.ticks(IDLE_RELEASE));
                self.set_timer(key, Some(now + rest), cx);
            }
            Phase::Head if c.rlen == 0 => self.close(key, cx),
            Phase::Head | Phase::Body => {
                let message = match c.phase {
                    Phase::Head => "request head not received within server.header_timeout",
                    _ => "request body not received within server.body_timeout",
                };
                // The rest of the head or body may still arrive: it must not be read as a next
                // request, so close (set before answering, which may flush and end the request
                // at once).
                c.closing = true;
                let model = c.req.and_then(|slot| self.requests[slot].model);
                let answer = (408, "request_timeout", message);
                self.router_error(key, answer, model, upstreams, cx);
            }
            // The client accepted nothing of its response for `idle_timeout`.
            Phase::Upstream(_) | Phase::Done => self.gone(key, upstreams, cx),
            Phase::Queued => {}
        }
    }

    /// A scheduler's decision about one of this shard's requests.
    pub(super) fn decision(&mut self, output: Output, upstreams: &mut Upstreams, cx: &mut Cx) {
        let id = match output {
            Output::Admit { id, .. } | Output::Reject { id, .. } => id,
        };
        let key = (id.0 & ((1 << KEY_BITS) - 1)) as usize;
        let Some(c) = self.conns.get(key) else { return };
        let current = c.phase == Phase::Queued && c.req.is_some_and(|s| self.requests[s].id == id);
        if !current {
            // The client left (a Cancel is on its way or was handled): nothing to do.
            return;
        }
        let req = &mut self.requests[c.req.expect("queued request")];
        self.buffered -= std::mem::take(&mut req.buffered);
        ShardMetrics::set(&cx.metrics.buffered, self.buffered);
        let model = req.model;
        match output {
            Output::Admit { backend, lane, waited, turn, warm, derived, .. } => {
                let turn = turn_bucket(turn);
                if derived {
                    req.session = Session::Derived;
                }
                req.admission = Some(Admission { backend, lane, waited, turn, warm });
                if let Some(m) = model {
                    cx.metrics.count_admitted(m, req.tenant, lane as usize);
                    let wait = cx.rate.duration(waited);
                    let metrics = &cx.metrics.models[usize::from(m)];
                    metrics.queue_wait[lane as usize].observe(wait);
                    metrics.queue_wait_by_turn[turn].observe(wait);
                }
                upstreams.forward(key, self, cx);
            }
            Output::Reject { reason, .. } => {
                self.router_error(key, rejection(reason), model, upstreams, cx);
            }
        }
    }

    /// Writes what the client's buffer holds; ends the request once its response is out, and
    /// resumes a relay paused for this client once half its bytes are out.
    pub(super) fn flush(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        let c = &mut self.conns[key];
        let written = c.write_out();
        if let Some(slot) = c.req {
            self.requests[slot].bytes_out += written;
        }
        if c.gone {
            return self.gone(key, upstreams, cx);
        }
        let pending = c.unsent();
        // A client that stops reading its response: the send timeout is `idle_timeout`, from
        // the last byte it accepted.
        let sending = matches!(c.phase, Phase::Upstream(_) | Phase::Done);
        if sending && pending > 0 && (written > 0 || c.timer.is_none()) {
            let deadline = cx.now() + cx.timeouts.idle;
            self.set_timer(key, Some(deadline), cx);
        } else if sending && pending == 0 && c.timer.is_some() {
            self.set_timer(key, None, cx);
        }
        match self.conns[key].phase {
            Phase::Done if pending == 0 => self.end_request(key, cx),
            Phase::Upstream(up) if pending < CLIENT_HIGH_WATER / 2 => {
                upstreams.resume(up, self, cx);
            }
            _ => {}
        }
    }

    // ----- ending requests -----

    /// The response is flushed: report the end to the scheduler, then serve the next request
    /// on the connection or close it.
    fn end_request(&mut self, key: usize, cx: &mut Cx) {
        let now = cx.now();
        let Some(slot) = self.conns[key].req.take() else {
            // An answer without a request (a malformed head, a 408 before one): it closes, and
            // the client may still be sending.
            return self.linger(key, cx);
        };
        limits::settle(cx.gen, cx.limiter, cx.metrics, &mut self.requests[slot]);
        let req = &self.requests[slot];
        if let (Some(_), Some(model)) = (req.admission, req.model) {
            let success = req.complete == Some(true);
            let seen = req.usage.usage();
            let events = if req.streaming { req.usage.events() } else { 0 };
            let usage = Usage {
                prompt_tokens: seen.prompt_tokens.unwrap_or(0),
                cached_tokens: seen.cached_tokens.unwrap_or(Usage::UNKNOWN_CACHED),
                completion_tokens: seen.completion_tokens.unwrap_or(events),
            };
            cx.send(model, Input::Complete { id: req.id, success, usage });
        }
        if let Some(model) = req.model {
            let elapsed = cx.rate.duration(now.saturating_sub(req.started));
            cx.metrics.models[usize::from(model)].duration.observe(elapsed);
        }
        let outcome = match (req.failure, req.ttfb) {
            (Some(kind), _) => Outcome::UpstreamFailed(kind),
            (None, Some(_)) => Outcome::Relayed,
            (None, None) => Outcome::Router,
        };
        self.log_request(key, slot, outcome, now, cx);
        let (raw_len, keep_alive) = (self.requests[slot].raw_len, self.requests[slot].keep_alive);
        self.requests.release(slot);
        if self.conns[key].closing || !keep_alive || cx.shutting_down() {
            return self.linger(key, cx);
        }
        self.next_request(key, raw_len, now, cx);
    }

    /// Drops the bytes of the request that ended (`used`) and waits for the next one: a
    /// pipelined request may be buffered already.
    fn next_request(&mut self, key: usize, used: usize, now: Tick, cx: &mut Cx) {
        let c = &mut self.conns[key];
        let used = used.min(c.rlen);
        c.rbuf.copy_within(used..c.rlen, 0);
        c.rlen -= used;
        c.phase = Phase::Head;
        if c.rbuf.len() > KEEP_BUFFER_MAX && c.rlen < READ_CHUNK {
            c.rbuf.truncate(READ_CHUNK);
            c.rbuf.shrink_to(READ_CHUNK);
        }
        let pending = c.rlen > 0;
        let undrained = c.undrained;
        let wait = match (pending, c.holds_buffers()) {
            (true, _) => cx.timeouts.header,
            // The first expiry releases the buffers (see `expired`).
            (false, true) => cx.timeouts.idle.min(cx.rate.ticks(IDLE_RELEASE)),
            (false, false) => cx.timeouts.idle,
        };
        self.set_timer(key, Some(now + wait), cx);
        // A pipelined request may be buffered, or bytes may wait in the socket that no edge
        // will announce (the last read stopped at the limit): the loop reads the connection
        // again, not this call, so a long pipeline is served iteratively, not by recursion.
        // Otherwise the next request's bytes will come with a new edge.
        if pending || undrained {
            self.again.push(key);
        }
    }

    /// The client closed or failed: drop its request the way its phase requires (S10).
    pub(super) fn gone(&mut self, key: usize, upstreams: &mut Upstreams, cx: &mut Cx) {
        let Some(c) = self.conns.get_mut(key) else { return };
        c.gone = true;
        let phase = c.phase;
        if let Some(slot) = c.req.take() {
            limits::settle(cx.gen, cx.limiter, cx.metrics, &mut self.requests[slot]);
            self.log_request(key, slot, Outcome::ClientGone, cx.now(), cx);
            let req = &mut self.requests[slot];
            self.buffered -= std::mem::take(&mut req.buffered);
            ShardMetrics::set(&cx.metrics.buffered, self.buffered);
            let (id, admitted) = (req.id, req.admission.is_some());
            let ended = Input::Complete { id, success: false, usage: Usage::NONE };
            match (phase, req.model) {
                (Phase::Queued, Some(model)) => {
                    ShardMetrics::bump(&cx.metrics.clients_gone);
                    cx.send(model, Input::Cancel(id));
                }
                (Phase::Upstream(up), Some(model)) => {
                    ShardMetrics::bump(&cx.metrics.clients_gone);
                    upstreams.close(up, cx);
                    cx.send(model, ended);
                }
                (Phase::Done, Some(model)) if admitted => cx.send(model, ended),
                _ => {}
            }
            self.requests.release(slot);
        }
        self.close(key, cx);
    }

    /// Closes a client connection whose last answer is flushed without destroying that answer:
    /// closing a socket with unread input, or receiving input after the close, makes the
    /// kernel send a reset, and a reset purges what it has not sent yet (the answers to
    /// pipelined requests before a malformed one, or the 400, 408 or 413 itself, when they
    /// wait for the client's receive window). So every close after an answer comes here: the
    /// shard half-closes (a FIN after the answer) and reads away its input until the client
    /// closes or [`LINGER`] passes (RFC 9112 9.6, nginx's lingering close). The connection
    /// still counts towards `max_connections` meanwhile. During a drain (S13) it closes at
    /// once instead: lingering must not hold the shutdown up.
    fn linger(&mut self, key: usize, cx: &mut Cx) {
        let shutting = cx.shutting_down();
        let c = &mut self.conns[key];
        if c.gone || c.hup || shutting {
            return self.close(key, cx);
        }
        c.close_notify();
        let _ = c.stream.shutdown(Shutdown::Write);
        c.phase = Phase::Lingering;
        c.rlen = 0;
        let deadline = cx.now() + cx.rate.ticks(LINGER);
        self.set_timer(key, Some(deadline), cx);
        self.discard_input(key, cx);
    }

    /// Reads and drops a lingering connection's input; closes it at the client's end.
    fn discard_input(&mut self, key: usize, cx: &mut Cx) {
        let c = &mut self.conns[key];
        if read_away(&mut c.stream, &mut self.scratch) {
            c.gone = true;
            self.close(key, cx);
        }
    }

    fn close(&mut self, key: usize, cx: &mut Cx) {
        self.set_timer(key, None, cx);
        let Some(mut c) = self.conns.try_remove(key) else { return };
        let _ = cx.registry.deregister(&mut c.stream);
        if c.tls_failed {
            ShardMetrics::bump(&cx.metrics.tls_errors);
        }
        if !c.gone {
            c.close_notify();
            discard_unread(&mut c.stream, &mut self.scratch);
        }
        if let Some(slot) = c.req.take() {
            limits::settle(cx.gen, cx.limiter, cx.metrics, &mut self.requests[slot]);
            self.buffered -= std::mem::take(&mut self.requests[slot].buffered);
            ShardMetrics::set(&cx.metrics.buffered, self.buffered);
            self.requests.release(slot);
        }
        self.open -= 1;
        ShardMetrics::set(&cx.metrics.open, self.open as u64);
        if self.accept_retry_at.is_some() {
            self.freed = true;
        }
    }

    /// Appends the access-log line of the request in `slot`, which ended with `outcome` at
    /// `now` (a no-op when the log is off).
    fn log_request(&mut self, key: usize, slot: u32, outcome: Outcome, now: Tick, cx: &Cx) {
        let Some(log) = &self.log else { return };
        let Some(c) = self.conns.get(key) else { return };
        let (gen, req) = (cx.gen, &self.requests[slot]);
        let model = req.model.map(|m| &gen.models[usize::from(m)]);
        // A request refused before it was routed logs the session header it came with.
        let (session, session_source) = match (req.session, req.head.session_id(&c.rbuf)) {
            (Session::None, Some(id)) if model.is_none() => (Some(id), "header"),
            (session, _) => (req.session_value(&c.rbuf), session.source_name()),
        };
        let mut generated = [0u8; 19];
        let request_id = match req.head.request_id {
            Some(span) => Some(span.get(&c.rbuf)),
            None if req.id.0 != 0 => Some(format_request_id(req.id, &mut generated)),
            None => None,
        };
        let admission = req.admission;
        let record = access_log::Record {
            time: crate::clock::wall_time(),
            request_id,
            method: req.head.method(&c.rbuf),
            path: req.head.path(&c.rbuf),
            model: model.map(|m| m.name.as_str()),
            tenant: gen.tenant_name(req.tenant),
            session,
            session_source,
            backend: model
                .zip(admission)
                .map(|(m, a)| m.backends[usize::from(a.backend)].authority.as_str()),
            status: req.status,
            lane: admission.map(|a| a.lane),
            queue_wait: admission.map(|a| cx.rate.duration(a.waited)),
            ttfb: req.ttfb.map(|t| cx.rate.duration(t)),
            total: cx.rate.duration(now.saturating_sub(req.started)),
            bytes_in: (req.raw_len.min(c.rlen)) as u64,
            bytes_out: req.bytes_out,
            outcome,
            rate_limited: req.limited.map(crate::server::rate_limit::Limit::name),
            tokens_reserved: req.tokens_reserved,
            tokens_used: req.tokens_used,
        };
        self.log_line.clear();
        access_log::format_line(&record, &mut self.log_line);
        log.push(&self.log_line);
    }
}
