//! The client side of a shard: reading requests, routing them, queueing them with their
//! scheduler, acting on its decisions, answering, and ending requests (S10, S12, S14).

use super::*;

impl Shard {
    // ----- client side -----

    /// Reads what the client sent, then moves its request along.
    pub(super) fn read_client(&mut self, key: usize) {
        if self.client(key).phase == Phase::Lingering {
            return self.discard_input(key);
        }
        loop {
            let limit = self.read_limit(key);
            let c = self.client(key);
            // Whether the socket is known to be empty; if the read stopped at the limit
            // instead, bytes may wait that no new edge will announce.
            let mut drained = false;
            while !c.gone && c.rlen < limit {
                if c.rbuf.len() == c.rlen {
                    let grow = c.rbuf.len().clamp(4096, READ_CHUNK);
                    c.rbuf.resize(c.rbuf.len() + grow, 0);
                }
                let end = c.rbuf.len().min(limit);
                let want = end - c.rlen;
                match c.stream.read(&mut c.rbuf[c.rlen..end]) {
                    Ok(0) => c.gone = true,
                    Ok(n) => {
                        c.rlen += n;
                        if n < want && !c.hup {
                            // A short read drained the socket: the next byte brings a new
                            // edge, so the read that would only say EAGAIN is skipped.
                            drained = true;
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        drained = true;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => c.gone = true,
                }
            }
            c.undrained = !drained && !c.gone;
            let gone = c.gone;
            self.advance(key);
            if drained || gone || !self.conns.contains(key) {
                return;
            }
            // Read on only when the read stopped at a limit that the new phase raised above
            // what is buffered now (a parsed head lets its body in; a dispatched request, the
            // next head). Answering a pipelined request drops its bytes, so this compares
            // with the buffer after `advance`, not before.
            if self.read_limit(key) <= self.client(key).rlen {
                return;
            }
        }
    }

    /// How many bytes the client's buffer may hold now: a request being read may fill its
    /// limits (the parser reports the overflow); later phases keep room for one pipelined head.
    pub(super) fn read_limit(&self, key: usize) -> usize {
        let Some(Conn::Client(c)) = self.conns.get(key) else { return 0 };
        let limits = &self.gen.limits;
        let head_max = limits.max_header_bytes;
        match (c.phase, &c.req) {
            (Phase::Head, _) => head_max + 1,
            (Phase::Body, Some(req)) => match req.head.framing {
                Framing::ContentLength(n) => req.head.head_len + n as usize,
                // Chunk framing adds bytes; the decoder enforces the decoded limit.
                _ => usize::MAX,
            },
            (_, Some(req)) => req.raw_len + head_max,
            _ => head_max,
        }
    }

    /// Moves the client's request through the phases as far as its bytes allow.
    pub(super) fn advance(&mut self, key: usize) {
        loop {
            let phase = self.client(key).phase;
            let progressed = match phase {
                Phase::Head => self.parse_head(key),
                Phase::Body => self.read_body(key),
                Phase::Queued | Phase::Upstream(_) | Phase::Done | Phase::Lingering => false,
            };
            if !self.conns.contains(key) {
                return;
            }
            if !progressed {
                break;
            }
        }
        let c = self.client(key);
        if c.gone {
            self.client_gone(key);
        }
    }

    pub(super) fn parse_head(&mut self, key: usize) -> bool {
        let limits = &self.gen.limits;
        let Conn::Client(c) = &mut self.conns[key] else { return false };
        if c.rlen == 0 {
            return false;
        }
        let parsed = parse_request_head(&c.rbuf[..c.rlen], limits);
        let now = self.clock.now();
        match parsed {
            Err(e) => {
                self.protocol_error(key, e, None);
                false
            }
            Ok(None) => {
                // Bytes of a head arrived: the header timeout runs from the first of them.
                if c.req.is_none() && !c.gone {
                    let deadline = now + self.timeouts.header;
                    if self.wheel_deadline(key).is_none_or(|d| d > deadline) {
                        self.set_timer(key, Some(deadline));
                    }
                }
                false
            }
            Ok(Some(head)) => {
                let expect = head.expect_continue && head.framing != Framing::None;
                let keep_alive = head.keep_alive;
                let decoder = (head.framing == Framing::Chunked)
                    .then(|| ChunkedDecoder::new(limits.chunked(), Side::Downstream));
                let raw_len = head.head_len;
                c.req = Some(Box::new(Request {
                    head,
                    id: RequestId(0),
                    model: None,
                    decoder,
                    decoded: Vec::new(),
                    raw_len,
                    started: now,
                    streaming: false,
                    model_token: 0..0,
                    admission: None,
                    buffered: 0,
                    reconnected: false,
                    forwarded_at: 0,
                    first_byte_sent: false,
                    status: 0,
                    keep_alive,
                    complete: None,
                    bytes_out: 0,
                    ttfb: None,
                    failure: None,
                    usage: UsageScanner::new(),
                }));
                c.phase = Phase::Body;
                if expect {
                    c.wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                let deadline = now + self.timeouts.body;
                self.set_timer(key, Some(deadline));
                if expect {
                    self.flush_client(key);
                }
                true
            }
        }
    }

    /// Checks whether the body is complete; dispatches the request when it is.
    pub(super) fn read_body(&mut self, key: usize) -> bool {
        let Conn::Client(c) = &mut self.conns[key] else { return false };
        let req = c.req.as_mut().expect("a request in the body phase");
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
                        self.protocol_error(key, e, model);
                        return false;
                    }
                }
            }
        };
        if !complete {
            return false;
        }
        self.set_timer(key, None);
        self.dispatch(key);
        true
    }

    /// Routes a complete request.
    pub(super) fn dispatch(&mut self, key: usize) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let req = c.req.as_ref().expect("a request to dispatch");
        let method = req.head.method(&c.rbuf);
        let path = req.head.path(&c.rbuf);
        if method == b"POST" && path.starts_with(b"/v1/") {
            return self.inference(key);
        }
        let gen = Arc::clone(&self.gen);
        // HEAD is GET without the content (RFC 9110 9.3.2; `respond` leaves the body out).
        let method = if method == b"HEAD" { b"GET".as_slice() } else { method };
        match (method, path) {
            (b"GET", b"/v1/models") => self.respond(key, 200, &gen.models_json),
            (b"GET", b"/healthz") => self.respond(key, 200, br#"{"status":"ok"}"#),
            (b"GET", b"/readyz") if gen.ready() => {
                self.respond(key, 200, br#"{"status":"ready"}"#);
            }
            (b"GET", b"/readyz") => self.respond(
                key,
                503,
                br#"{"status":"not ready","reason":"a model has no healthy backend"}"#,
            ),
            _ => self.router_error(key, 404, "model_not_found", "unknown path", None),
        }
    }

    /// An inference request: find its model and session, and queue it.
    pub(super) fn inference(&mut self, key: usize) {
        let shared = Arc::clone(&self.shared);
        let gen = Arc::clone(&self.gen);
        let shard = self.index;
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let req = c.req.as_mut().expect("a request");
        let body = match req.decoder {
            Some(_) => &req.decoded[..],
            None => &c.rbuf[req.head.head_len..req.raw_len],
        };
        // One pass finds the model and, when a model hashes prompts, the prompt's block hashes
        // (into the shard's scratch vector; copied into the model's pool slot below).
        if let Some(block) = gen.prompt_block_bytes {
            if self.prompt_hasher.block_bytes() != block {
                self.prompt_hasher = PromptHasher::new(block);
            }
        }
        let hasher =
            gen.prompt_block_bytes.map(|_| (&mut self.prompt_hasher, &mut self.prompt_scratch));
        let field = match find_model_and_prompt(body, hasher) {
            Ok((field, _)) => field,
            Err(e) => {
                let message = e.to_string();
                return self.router_error(key, 400, "invalid_request", &message, None);
            }
        };
        let Some(&model) = gen.by_name.get(&*field.value) else {
            let message = format!("model {:?} is not configured", &*field.value);
            return self.router_error(key, 404, "model_not_found", &message, None);
        };
        let streaming = field.stream;
        let token = field.token.clone();
        let body_len = body.len();
        req.model = Some(model);
        req.streaming = streaming;
        req.model_token = token;
        let m = &gen.models[usize::from(model)];
        let session = if m.session_header == gen.limits.session_header {
            Ok(req.head.session_id(&c.rbuf))
        } else {
            session_value(req.head.headers.get(&c.rbuf, &m.session_header))
        };
        let session = match session {
            Ok(session) => session.map(hash_session),
            Err(message) => {
                return self.router_error(key, 400, "invalid_request", message, Some(model));
            }
        };
        if shared.shutting_down.load(Ordering::Acquire) {
            return self.router_error(key, 503, "unavailable", "shutting down", Some(model));
        }
        let held = req.raw_len as u64 + req.decoded.len() as u64;
        if self.buffered + held > gen.config.server.max_buffered_bytes {
            let message = "buffered request bytes budget exhausted";
            return self.router_error(key, 503, "unavailable", message, Some(model));
        }
        self.serial += 1;
        let serial = self.serial << KEY_BITS | key as u64;
        let id = RequestId::new(shard, serial);
        let prompt = match &m.prompts {
            Some(pool)
                if m.config.queue.prefix_block_bytes as usize
                    == self.prompt_hasher.block_bytes() =>
            {
                match pool.acquire() {
                    Some(slot) => {
                        let scratch = &self.prompt_scratch;
                        pool.with(slot, |hashes| {
                            hashes.clear();
                            hashes.extend_from_slice(scratch);
                        });
                        slot
                    }
                    None => NO_PROMPT,
                }
            }
            Some(pool) => {
                // Another model's block size: a second pass at this model's.
                let body = match req.decoder {
                    Some(_) => &req.decoded[..],
                    None => &c.rbuf[req.head.head_len..req.raw_len],
                };
                let block = m.config.queue.prefix_block_bytes as usize;
                hash_prompt(pool, &mut self.prompt_hasher, block, body)
            }
            None => NO_PROMPT,
        };
        let arrival = Arrival {
            id,
            session,
            prompt_bytes: u32::try_from(body_len).unwrap_or(u32::MAX),
            streaming: req.streaming,
            prompt,
        };
        if m.inbox.push_quiet(Input::Arrive(arrival)).is_err() {
            if let (Some(pool), true) = (&m.prompts, prompt != NO_PROMPT) {
                pool.release(prompt);
            }
            let message = "the model's scheduler inbox is full";
            return self.router_error(key, 503, "unavailable", message, Some(model));
        }
        self.dirty[usize::from(model)] = true;
        req.id = id;
        req.buffered = held;
        c.phase = Phase::Queued;
        self.buffered += held;
        ShardMetrics::set(&self.metrics.buffered, self.buffered);
    }

    /// A scheduler's decision about one of this shard's requests.
    pub(super) fn decision(&mut self, output: Output) {
        // An admission may name a backend that a reload added and this shard has not seen yet.
        self.refresh();
        let id = match output {
            Output::Admit { id, .. } | Output::Reject { id, .. } => id,
        };
        let key = (id.0 & ((1 << KEY_BITS) - 1)) as usize;
        let Some(Conn::Client(c)) = self.conns.get_mut(key) else { return };
        let current = c.phase == Phase::Queued && c.req.as_ref().is_some_and(|r| r.id == id);
        if !current {
            // The client left (a Cancel is on its way or was handled): nothing to do.
            return;
        }
        let req = c.req.as_mut().expect("queued request");
        self.buffered -= std::mem::take(&mut req.buffered);
        ShardMetrics::set(&self.metrics.buffered, self.buffered);
        let model = req.model;
        match output {
            Output::Admit { backend, lane, waited, .. } => {
                req.admission = Some(Admission { backend, lane, waited });
                if let Some(m) = model {
                    let wait = self.rate.duration(waited);
                    self.metrics.models[usize::from(m)].queue_wait[lane as usize].observe(wait);
                }
                self.forward(key);
            }
            Output::Reject { reason, .. } => {
                let (status, code, message) = match reason {
                    RejectReason::QueueTimeout => {
                        (504, "queue_timeout", "waited in the queue longer than queue.timeout")
                    }
                    RejectReason::QueueFull => (429, "queue_full", "the model's queue is full"),
                    RejectReason::ShuttingDown => (503, "unavailable", "shutting down"),
                    RejectReason::RetriesExhausted => {
                        (502, "upstream_error", "no backend could take the request")
                    }
                };
                self.router_error(key, status, code, message, model);
            }
        }
    }

    /// Writes a router answer with `status` and a JSON error body, then ends the request.
    pub(super) fn router_error(
        &mut self,
        key: usize,
        status: u16,
        code: &str,
        message: &str,
        model: Option<u16>,
    ) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let keep_alive = c.req.as_ref().is_some_and(|r| r.keep_alive) && !c.closing;
        let version = c.req.as_ref().map_or(Version::Http11, |r| r.head.version);
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let keep_alive = keep_alive && !shutting;
        let start = c.wbuf.len();
        match connection_header(version, keep_alive) {
            Some(h) => write_error(status, code, message, &mut c.wbuf, &[h]),
            None => write_error(status, code, message, &mut c.wbuf, &[]),
        }
        if is_head_request(c) {
            // RFC 9110 9.3.2: no content in an answer to HEAD (its Content-Length stays).
            let head_end = c.wbuf[start..].windows(4).position(|w| w == b"\r\n\r\n");
            c.wbuf.truncate(start + head_end.expect("write_error ends its head") + 4);
        }
        self.finish_response(key, status, keep_alive, model);
    }

    /// Writes a router answer with `status` and a JSON body, then ends the request.
    pub(super) fn respond(&mut self, key: usize, status: u16, body: &[u8]) {
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let keep_alive = c.req.as_ref().is_some_and(|r| r.keep_alive) && !shutting;
        let version = c.req.as_ref().map_or(Version::Http11, |r| r.head.version);
        let w = &mut c.wbuf;
        w.extend_from_slice(b"HTTP/1.1 ");
        w.extend_from_slice(crate::protocol::decimal(u64::from(status), &mut [0; 20]));
        w.push(b' ');
        w.extend_from_slice(crate::protocol::reason_phrase(status).as_bytes());
        w.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
        w.extend_from_slice(crate::protocol::decimal(body.len() as u64, &mut [0; 20]));
        w.extend_from_slice(b"\r\n");
        if let Some((name, value)) = connection_header(version, keep_alive) {
            w.extend_from_slice(name.as_bytes());
            w.extend_from_slice(b": ");
            w.extend_from_slice(value);
            w.extend_from_slice(b"\r\n");
        }
        w.extend_from_slice(b"\r\n");
        if !is_head_request(c) {
            c.wbuf.extend_from_slice(body);
        }
        self.finish_response(key, status, keep_alive, None);
    }

    /// A framing error: answer and close (the connection cannot be trusted).
    pub(super) fn protocol_error(&mut self, key: usize, e: ProtocolError, model: Option<u16>) {
        let c = self.client(key);
        write_protocol_error(e, &mut c.wbuf);
        self.finish_response(key, e.status(), false, model);
    }

    /// The router's response is in the write buffer: count it and flush it.
    pub(super) fn finish_response(
        &mut self,
        key: usize,
        status: u16,
        keep_alive: bool,
        model: Option<u16>,
    ) {
        match model {
            Some(m) => self.metrics.models[usize::from(m)].count_status(status),
            None => self.metrics.count_other_status(status),
        }
        let c = self.client(key);
        if let Some(req) = c.req.as_mut() {
            req.status = status;
            req.keep_alive = keep_alive;
            req.complete = Some(false);
        } else {
            c.closing = true;
        }
        c.closing |= !keep_alive;
        c.phase = Phase::Done;
        self.set_timer(key, None);
        self.flush_client(key);
    }

    /// Writes what the client's buffer holds; ends the request once its response is out.
    pub(super) fn flush_client(&mut self, key: usize) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let mut progressed = false;
        while c.wpos < c.wbuf.len() {
            match c.stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => {
                    c.gone = true;
                    break;
                }
                Ok(n) => {
                    c.wpos += n;
                    progressed = true;
                    if let Some(req) = c.req.as_mut() {
                        req.bytes_out += n as u64;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    c.gone = true;
                    break;
                }
            }
        }
        if c.wpos == c.wbuf.len() {
            c.wbuf.clear();
            c.wpos = 0;
        }
        if c.gone {
            return self.client_gone(key);
        }
        let pending = c.wbuf.len() - c.wpos;
        // A client that stops reading its response: the send timeout is `idle_timeout`, from
        // the last byte it accepted.
        let sending = matches!(c.phase, Phase::Upstream(_) | Phase::Done);
        if sending && pending > 0 && (progressed || c.timer.is_none()) {
            let deadline = self.clock.now() + self.timeouts.idle;
            self.set_timer(key, Some(deadline));
        } else if sending && pending == 0 && c.timer.is_some() {
            self.set_timer(key, None);
        }
        let Conn::Client(c) = &mut self.conns[key] else { return };
        match c.phase {
            Phase::Done if pending == 0 => self.end_request(key),
            Phase::Upstream(up) if pending < CLIENT_HIGH_WATER / 2 => {
                if matches!(self.conns.get(up), Some(Conn::Upstream(u)) if u.paused) {
                    self.upstream(up).paused = false;
                    self.upstream_readable(up);
                }
            }
            _ => {}
        }
    }

    /// The response is flushed: report the end to the scheduler, then serve the next request
    /// on the connection or close it.
    pub(super) fn end_request(&mut self, key: usize) {
        let now = self.clock.now();
        let c = self.client(key);
        let Some(req) = c.req.take() else {
            // An answer without a request (a malformed head, a 408 before one): it closes, and
            // the client may still be sending.
            return self.linger(key);
        };
        if let (Some(admission), Some(model)) = (req.admission, req.model) {
            let success = req.complete == Some(true);
            let _ = admission;
            let seen = req.usage.usage();
            let usage = Usage {
                prompt_tokens: seen.prompt_tokens.unwrap_or(0),
                cached_tokens: seen.cached_tokens.unwrap_or(Usage::UNKNOWN_CACHED),
            };
            self.send(model, Input::Complete { id: req.id, success, usage });
        }
        if let Some(model) = req.model {
            let elapsed = self.rate.duration(now.saturating_sub(req.started));
            self.metrics.models[usize::from(model)].duration.observe(elapsed);
        }
        let outcome = match (req.failure, req.ttfb) {
            (Some(kind), _) => Outcome::UpstreamFailed(kind),
            (None, Some(_)) => Outcome::Relayed,
            (None, None) => Outcome::Router,
        };
        self.log_request(key, &req, outcome, now);
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let c = self.client(key);
        let closing = c.closing || !req.keep_alive || shutting;
        if closing {
            return self.linger(key);
        }
        // Drop the request's bytes; a pipelined request may follow.
        let used = req.raw_len.min(c.rlen);
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
            (true, _) => self.timeouts.header,
            // The first expiry releases the buffers (see `Shard::expired`).
            (false, true) => self.timeouts.idle.min(self.rate.ticks(IDLE_RELEASE)),
            (false, false) => self.timeouts.idle,
        };
        let deadline = now + wait;
        self.set_timer(key, Some(deadline));
        // A pipelined request may be buffered, or bytes may wait in the socket that no edge
        // will announce (the last read stopped at the limit): the loop reads the connection
        // again, not this call, so a long pipeline is served iteratively, not by recursion.
        // Otherwise the next request's bytes will come with a new edge.
        if pending || undrained {
            self.again.push(key);
        }
    }

    /// The client closed or failed: drop its request the way its phase requires (S10).
    pub(super) fn client_gone(&mut self, key: usize) {
        let Some(Conn::Client(c)) = self.conns.get_mut(key) else { return };
        c.gone = true;
        let phase = c.phase;
        let req = c.req.take();
        if let Some(mut req) = req {
            self.log_request(key, &req, Outcome::ClientGone, self.clock.now());
            self.buffered -= std::mem::take(&mut req.buffered);
            ShardMetrics::set(&self.metrics.buffered, self.buffered);
            match (phase, req.model) {
                (Phase::Queued, Some(model)) => {
                    ShardMetrics::bump(&self.metrics.clients_gone);
                    self.send(model, Input::Cancel(req.id));
                }
                (Phase::Upstream(up), Some(model)) => {
                    ShardMetrics::bump(&self.metrics.clients_gone);
                    self.close_upstream(up);
                    self.send(
                        model,
                        Input::Complete { id: req.id, success: false, usage: Usage::NONE },
                    );
                }
                (Phase::Done, Some(model)) if req.admission.is_some() => {
                    self.send(
                        model,
                        Input::Complete { id: req.id, success: false, usage: Usage::NONE },
                    );
                }
                _ => {}
            }
        }
        self.close_client(key);
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
    pub(super) fn linger(&mut self, key: usize) {
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let c = self.client(key);
        if c.gone || c.hup || shutting {
            return self.close_client(key);
        }
        let _ = c.stream.shutdown(Shutdown::Write);
        c.phase = Phase::Lingering;
        c.rlen = 0;
        let deadline = self.clock.now() + self.rate.ticks(LINGER);
        self.set_timer(key, Some(deadline));
        self.discard_input(key);
    }

    /// Reads and drops a lingering connection's input; closes it at the client's end.
    fn discard_input(&mut self, key: usize) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        if read_away(&mut c.stream, &mut self.scratch) {
            self.client(key).gone = true;
            self.close_client(key);
        }
    }

    pub(super) fn close_client(&mut self, key: usize) {
        self.set_timer(key, None);
        if let Some(Conn::Client(mut c)) = self.conns.try_remove(key) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            if !c.gone {
                discard_unread(&mut c.stream, &mut self.scratch);
            }
            if let Some(mut req) = c.req.take() {
                self.buffered -= std::mem::take(&mut req.buffered);
                ShardMetrics::set(&self.metrics.buffered, self.buffered);
            }
            self.clients -= 1;
            ShardMetrics::set(&self.metrics.open, self.clients as u64);
        }
    }

    /// Appends the access-log line of `req`, which ended with `outcome` at `now` (a no-op
    /// when the log is off).
    pub(super) fn log_request(&mut self, key: usize, req: &Request, outcome: Outcome, now: Tick) {
        let Some(log) = &self.log else { return };
        let Some(Conn::Client(c)) = self.conns.get(key) else { return };
        let gen = &self.gen;
        let model = req.model.map(|m| &gen.models[usize::from(m)]);
        let session = match model {
            Some(m) if m.session_header != gen.limits.session_header => {
                session_value(req.head.headers.get(&c.rbuf, &m.session_header)).ok().flatten()
            }
            _ => req.head.session_id(&c.rbuf),
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
            session,
            backend: model
                .zip(admission)
                .map(|(m, a)| m.backends[usize::from(a.backend)].authority.as_str()),
            status: req.status,
            lane: admission.map(|a| a.lane),
            queue_wait: admission.map(|a| self.rate.duration(a.waited)),
            ttfb: req.ttfb.map(|t| self.rate.duration(t)),
            total: self.rate.duration(now.saturating_sub(req.started)),
            bytes_in: (req.raw_len.min(c.rlen)) as u64,
            bytes_out: req.bytes_out,
            outcome,
        };
        self.log_line.clear();
        access_log::format_line(&record, &mut self.log_line);
        log.push(&self.log_line);
    }
}

/// S16: a pool slot holding the chained block hashes of `body`'s prompt, or [`NO_PROMPT`] when
/// the pool is exhausted (the request then goes as if nothing of it were cached).
fn hash_prompt(pool: &PromptPool, hasher: &mut PromptHasher, block: usize, body: &[u8]) -> u32 {
    let Some(slot) = pool.acquire() else { return NO_PROMPT };
    if hasher.block_bytes() != block {
        *hasher = PromptHasher::new(block);
    }
    pool.with(slot, |hashes| hasher.hash_body(body, hashes));
    slot
}

/// Whether the client's current request is a `HEAD` (its answer carries no content).
fn is_head_request(c: &Client) -> bool {
    c.req.as_ref().is_some_and(|r| r.head.method(&c.rbuf) == b"HEAD")
}

/// Bytes of unread input discarded at most before closing a client connection, and per read
/// event of a lingering one.
const DISCARD_MAX: usize = 256 << 10;

/// Half-closes `stream` and reads away the input that has already arrived, at most
/// [`DISCARD_MAX`] bytes, before it is dropped: closing a socket with unread input makes the
/// kernel send a reset instead of a FIN, and a reset discards the responses still queued for
/// the client (the answers to pipelined requests before a malformed one, or the 400, 408 or
/// 413 itself). RFC 9112 9.6 asks for this "lingering close"; input that arrives after the
/// close can still reset the connection, as with any server that does not keep the socket.
pub(super) fn discard_unread(stream: &mut TcpStream, scratch: &mut Vec<u8>) {
    let _ = stream.shutdown(Shutdown::Write);
    read_away(stream, scratch);
}

/// Reads and drops what `stream` holds, at most [`DISCARD_MAX`] bytes (a flood's next bytes
/// bring a new edge); true when the peer closed or the connection failed.
fn read_away(stream: &mut TcpStream, scratch: &mut Vec<u8>) -> bool {
    scratch.clear();
    scratch.resize(16 << 10, 0);
    let mut discarded = 0;
    let closed = loop {
        if discarded >= DISCARD_MAX {
            break false;
        }
        match stream.read(scratch) {
            Ok(0) => break true,
            Ok(n) => discarded += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break true,
        }
    };
    scratch.clear();
    closed
}
