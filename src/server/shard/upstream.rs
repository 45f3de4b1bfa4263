//! The upstream side of a shard: forwarding admitted requests over pooled or new
//! connections, relaying responses as they arrive, retries and failures (SPEC 2.6-2.9).

use super::*;

impl Shard {
    /// Sends the admitted request of client `key` to its backend over a pooled or new
    /// connection.
    pub(super) fn forward(&mut self, key: usize) {
        let gen = Arc::clone(&self.gen);
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let req = c.req.as_mut().expect("an admitted request");
        let model = req.model.expect("an inference request");
        let admission = req.admission.expect("admitted");
        let m = &gen.models[usize::from(model)];
        let backend = &m.backends[usize::from(admission.backend)];
        let body = request_body(req, &c.rbuf);
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        // Only the head is built here: the body goes out from the client's buffer, the model
        // token replaced on the way when rewriting (see `flush_upstream`), never copied.
        let body_len = match &m.upstream_model_json {
            Some(json) => body.len() - req.model_token.len() + json.len(),
            None => body.len(),
        };
        let mut request_id = [0u8; 19];
        let request_id = format_request_id(req.id, &mut request_id);
        let info = ForwardInfo {
            client_addr: c.peer,
            request_id,
            default_host: backend.authority.as_bytes(),
            body_len: body_len as u64,
        };
        write_upstream_head(&req.head, &c.rbuf, &mut out, &info);
        let was_head = req.head.method(&c.rbuf) == b"HEAD";
        req.forwarded_at = self.clock.now();
        let addr = backend.addr;
        let up = match self.pools[usize::from(model)][usize::from(admission.backend)].pop() {
            Some(up) => {
                self.set_timer(up, None);
                up
            }
            None => match self.connect(model, admission.backend, addr) {
                Ok(up) => up,
                Err(_) => {
                    self.scratch = out;
                    return self.upstream_failed_before_connect(key, model, admission.backend);
                }
            },
        };
        let u = self.upstream(up);
        u.client = key;
        // The request bytes move into the connection; its old buffer becomes the scratch.
        std::mem::swap(&mut u.wbuf, &mut out);
        out.clear();
        u.wpos = 0;
        u.rlen = 0;
        u.eof = false;
        u.framing = None;
        u.body = BodyRelay::default();
        u.got_bytes = false;
        u.paused = false;
        u.request_was_head = was_head;
        let connecting = u.state == UpState::Connecting;
        if !connecting {
            u.state = UpState::Busy;
        }
        self.scratch = out;
        self.client(key).phase = Phase::Upstream(up);
        let now = self.clock.now();
        let deadline = match connecting {
            true => now + self.timeouts.connect,
            false => now + self.timeouts.upstream_header,
        };
        self.set_timer(up, Some(deadline));
        if !connecting {
            self.flush_upstream(up);
        }
    }

    /// Opens a connection to a backend; it is `Connecting` until writable.
    pub(super) fn connect(
        &mut self,
        model: u16,
        backend: u16,
        addr: std::net::SocketAddr,
    ) -> io::Result<usize> {
        let mut stream = TcpStream::connect(addr)?;
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        let interest = Interest::READABLE | Interest::WRITABLE;
        self.poll.registry().register(&mut stream, Token(key), interest)?;
        entry.insert(Conn::Upstream(Upstream {
            stream,
            model,
            backend,
            state: UpState::Connecting,
            client: usize::MAX,
            reused: false,
            wbuf: Vec::new(),
            wpos: 0,
            rbuf: Vec::new(),
            rlen: 0,
            eof: false,
            hup: false,
            timer: None,
            framing: None,
            plan: RelayPlan { framing: ResponseFraming::None, keep_alive: false },
            body: BodyRelay::default(),
            keep_alive: false,
            got_bytes: false,
            paused: false,
            request_was_head: false,
        }));
        Ok(key)
    }

    /// `connect` itself failed: retry through the scheduler.
    pub(super) fn upstream_failed_before_connect(&mut self, key: usize, model: u16, backend: u16) {
        self.metrics.models[usize::from(model)]
            .count_upstream_error(backend, UpstreamError::Connect);
        self.retry(key);
    }

    /// Sends the request back to its scheduler for another backend (SPEC 2.8).
    pub(super) fn retry(&mut self, key: usize) {
        let c = self.client(key);
        let req = c.req.as_mut().expect("an admitted request");
        req.admission = None;
        req.reconnected = false;
        let id = req.id;
        let model = req.model.expect("an inference request");
        c.phase = Phase::Queued;
        self.send(model, Input::Retry(id));
    }

    // ----- upstream side -----

    pub(super) fn upstream_writable(&mut self, up: usize) {
        let u = self.upstream(up);
        if u.state == UpState::Connecting {
            let failed = match u.stream.take_error() {
                Ok(Some(_)) | Err(_) => true,
                Ok(None) => match u.stream.peer_addr() {
                    Ok(_) => false,
                    Err(e) if e.kind() == ErrorKind::NotConnected => return,
                    Err(_) => true,
                },
            };
            if failed {
                return self.upstream_failed(up, Failure::Retryable(UpstreamError::Connect));
            }
            let _ = u.stream.set_nodelay(true);
            u.state = if u.client == usize::MAX { UpState::Idle } else { UpState::Busy };
            if u.state == UpState::Busy {
                let deadline = self.clock.now() + self.timeouts.upstream_header;
                self.set_timer(up, Some(deadline));
            }
        }
        self.flush_upstream(up);
    }

    /// Writes the request to the backend: the head from the connection's buffer, then the body
    /// straight from the client's buffer (with the model token swapped for `upstream_model`'s),
    /// in vectored writes.
    pub(super) fn flush_upstream(&mut self, up: usize) {
        let gen = Arc::clone(&self.gen);
        let Some((Conn::Upstream(u), Conn::Client(c))) = get2(&mut self.conns, up) else {
            return;
        };
        if u.state != UpState::Busy {
            return;
        }
        let req = c.req.as_ref().expect("a forwarded request");
        let body = request_body(req, &c.rbuf);
        let parts: [&[u8]; 4] = match &gen.models[usize::from(u.model)].upstream_model_json {
            Some(json) => {
                let token = req.model_token.clone();
                [&u.wbuf, &body[..token.start], json, &body[token.end..]]
            }
            None => [&u.wbuf, body, &[], &[]],
        };
        let total: usize = parts.iter().map(|p| p.len()).sum();
        while u.wpos < total {
            let mut slices = [io::IoSlice::new(&[]); 4];
            let (mut used, mut skip) = (0, u.wpos);
            for part in parts {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                slices[used] = io::IoSlice::new(&part[skip..]);
                skip = 0;
                used += 1;
            }
            match u.stream.write_vectored(&slices[..used]) {
                Ok(0) => return self.upstream_failed(up, Failure::Retryable(UpstreamError::Reset)),
                Ok(n) => u.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    return self.upstream_failed(up, Failure::Retryable(UpstreamError::Reset))
                }
            }
        }
    }

    /// Reads what the backend sent. A busy connection relays each read as it arrives (SSE
    /// events are not held back); an idle pooled one that speaks or closes is dropped.
    pub(super) fn upstream_readable(&mut self, up: usize) {
        let mut failed = false;
        loop {
            let Some(Conn::Upstream(u)) = self.conns.get_mut(up) else { return };
            if u.state == UpState::Connecting || u.paused {
                return;
            }
            if u.eof {
                break;
            }
            if u.rbuf.len() == u.rlen {
                let grow = u.rbuf.len().clamp(4096, READ_CHUNK);
                u.rbuf.resize(u.rbuf.len() + grow, 0);
            }
            let want = u.rbuf.len() - u.rlen;
            match u.stream.read(&mut u.rbuf[u.rlen..]) {
                Ok(0) => u.eof = true,
                Ok(_) if u.state == UpState::Idle => return self.close_upstream(up),
                Ok(n) => {
                    u.rlen += n;
                    self.relay(up);
                    let busy = matches!(
                        self.conns.get(up),
                        Some(Conn::Upstream(u)) if u.state == UpState::Busy
                    );
                    let hup = matches!(self.conns.get(up), Some(Conn::Upstream(u)) if u.hup);
                    if !busy || n < want && !hup {
                        // Done, or a short read drained the socket (see `read_client`).
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        let Some(Conn::Upstream(u)) = self.conns.get(up) else { return };
        if u.state == UpState::Idle || u.client == usize::MAX {
            return self.close_upstream(up);
        }
        if !failed {
            // A close-delimited body ends here; anything else ends early.
            self.relay(up);
        }
        let Some(Conn::Upstream(u)) = self.conns.get(up) else { return };
        if u.state == UpState::Busy && u.client != usize::MAX {
            let failure = match (u.got_bytes, u.framing) {
                (false, _) => Failure::Retryable(UpstreamError::Reset),
                (true, None) => Failure::Fatal(UpstreamError::Malformed),
                (true, Some(_)) => Failure::Fatal(UpstreamError::Truncated),
            };
            self.upstream_failed(up, failure);
        }
    }

    /// Moves response bytes from the backend's buffer to the client's, as the framing says.
    pub(super) fn relay(&mut self, up: usize) {
        let debug_headers = self.gen.config.server.debug_headers;
        let gen = Arc::clone(&self.gen);
        let shared = Arc::clone(&self.shared);
        let max_head = gen.config.server.max_header_bytes as usize;
        let Some((Conn::Upstream(u), Conn::Client(c))) = get2(&mut self.conns, up) else {
            return;
        };
        if u.rlen > 0 {
            u.got_bytes = true;
        }
        let req = c.req.as_mut().expect("a forwarded request");
        let model = usize::from(u.model);
        let mut consumed = 0;
        if u.framing.is_none() {
            let head = match parse_response_head(&u.rbuf[..u.rlen], max_head, u.request_was_head) {
                Ok(Some(head)) => head,
                Ok(None) => return,
                Err(_) => {
                    return self.upstream_failed(up, Failure::Fatal(UpstreamError::Malformed))
                }
            };
            if head.is_interim() {
                if head.status == 101 {
                    return self.upstream_failed(up, Failure::Fatal(UpstreamError::Malformed));
                }
                u.rbuf.copy_within(head.head_len..u.rlen, 0);
                u.rlen -= head.head_len;
                return self.relay(up);
            }
            let now = self.clock.now();
            let ttfb = now.saturating_sub(req.forwarded_at);
            req.ttfb = Some(ttfb);
            self.metrics.models[model].ttfb.observe(self.rate.duration(ttfb));
            // During a drain (S13) the connection closes after this response.
            let shutting = shared.shutting_down.load(Ordering::Acquire);
            let client =
                ClientInfo { version: req.head.version, keep_alive: req.keep_alive && !shutting };
            let admission = req.admission.expect("admitted");
            let mut wait = [0u8; 20];
            let wait = crate::protocol::decimal(
                u64::try_from(self.rate.duration(admission.waited).as_micros()).unwrap_or(u64::MAX),
                &mut wait,
            );
            let backend =
                gen.models[model].backends[usize::from(admission.backend)].authority.as_bytes();
            let lane = match admission.lane {
                Lane::Retry | Lane::Normal => b"normal".as_slice(),
                Lane::Boosted => b"boosted",
                Lane::Forced => b"forced",
            };
            let debug: [(&str, &[u8]); 3] = [
                ("x-warmpath-lane", lane),
                ("x-warmpath-queue-wait-us", wait),
                ("x-warmpath-backend", backend),
            ];
            let extra: &[(&str, &[u8])] = if debug_headers { &debug } else { &[] };
            let plan = write_client_response_head(&head, &u.rbuf, &mut c.wbuf, &client, extra);
            u.plan = plan;
            u.framing = Some(head.framing);
            u.keep_alive = head.keep_alive;
            u.body = BodyRelay::new(head.framing, plan.framing);
            req.usage.reset();
            req.status = head.status;
            req.keep_alive = plan.keep_alive;
            consumed = head.head_len;
            let timer = u.timer.take();
            if let Some(timer) = timer {
                self.wheel.cancel(timer);
            }
            self.metrics.models[model].count_status(head.status);
        }
        let Some((Conn::Upstream(u), Conn::Client(c))) = get2(&mut self.conns, up) else {
            return;
        };
        let req = c.req.as_mut().expect("a forwarded request");
        let input = &u.rbuf[consumed..u.rlen];
        let before = c.wbuf.len();
        let done = match u.body.feed(input, u.eof, &mut self.scratch, &mut c.wbuf) {
            Ok(progress) => {
                consumed += progress.consumed;
                progress.done
            }
            Err(_) => return self.upstream_failed(up, Failure::Fatal(UpstreamError::Malformed)),
        };
        let body_bytes = c.wbuf.len() > before;
        if (200..300).contains(&req.status) {
            // The client-framed bytes: a chunk-size line between pieces can only hide a value
            // (protocol::usage), so no decoded copy is kept for this.
            req.usage.feed(&c.wbuf[before..]);
        }
        u.rbuf.copy_within(consumed..u.rlen, 0);
        u.rlen -= consumed;
        let first_byte = body_bytes && req.streaming && !req.first_byte_sent;
        if first_byte {
            req.first_byte_sent = true;
        }
        let id = req.id;
        let client = u.client;
        if done {
            u.body.finish(&mut c.wbuf);
            req.complete = Some((200..300).contains(&req.status));
            c.phase = Phase::Done;
            let reusable = u.keep_alive && u.rlen == 0 && !u.eof;
            u.client = usize::MAX;
            if reusable {
                self.return_to_pool(up);
            } else {
                self.close_upstream(up);
            }
        } else if c.wbuf.len() - c.wpos >= CLIENT_HIGH_WATER {
            u.paused = true;
        }
        if first_byte {
            self.send(model as u16, Input::FirstByte(id));
        }
        self.flush_client(client);
    }

    /// An upstream exchange failed. Retryable failures go back to the scheduler (after one
    /// fresh reconnect for a dead pooled connection); fatal ones answer 502 when nothing was
    /// relayed yet, or cut the client's stream.
    pub(super) fn upstream_failed(&mut self, up: usize, failure: Failure) {
        let Some(Conn::Upstream(u)) = self.conns.get(up) else { return };
        let (model, backend, client, reused) = (u.model, u.backend, u.client, u.reused);
        self.close_upstream(up);
        if client == usize::MAX {
            return;
        }
        let kind = match failure {
            Failure::Retryable(kind) | Failure::Fatal(kind) => kind,
        };
        let metrics = &self.metrics.models[usize::from(model)];
        let Some(Conn::Client(c)) = self.conns.get_mut(client) else { return };
        let req = c.req.as_mut().expect("a forwarded request");
        match failure {
            Failure::Retryable(_) if reused && !req.reconnected => {
                // A pooled connection found dead: one fresh connection to the same backend.
                metrics.count_pool_reconnect();
                req.reconnected = true;
                c.phase = Phase::Queued;
                self.forward_fresh(client);
            }
            Failure::Retryable(_) => {
                metrics.count_upstream_error(backend, kind);
                self.retry(client);
            }
            Failure::Fatal(_) => {
                metrics.count_upstream_error(backend, kind);
                if req.status == 0 {
                    let message = match kind {
                        UpstreamError::Timeout => "the backend sent no response head in time",
                        _ => "the backend sent a malformed response",
                    };
                    self.router_error(client, 502, "upstream_error", message, Some(model));
                } else {
                    // Bytes were relayed: the status stands; end the stream without its end
                    // (no final chunk) and close.
                    req.complete = Some(false);
                    req.failure = Some(kind);
                    c.closing = true;
                    c.phase = Phase::Done;
                    self.flush_client(client);
                }
            }
        }
    }

    /// Forwards the client's request again over a new connection (the pool is skipped).
    pub(super) fn forward_fresh(&mut self, key: usize) {
        let c = self.client(key);
        let req = c.req.as_ref().expect("an admitted request");
        let (model, backend) =
            (req.model.expect("model"), req.admission.expect("admitted").backend);
        // Drain the pool of that backend: its other idle connections are likely dead too.
        let idle = std::mem::take(&mut self.pools[usize::from(model)][usize::from(backend)]);
        for up in idle {
            self.close_upstream(up);
        }
        self.client(key).phase = Phase::Queued;
        self.forward(key);
    }

    pub(super) fn return_to_pool(&mut self, up: usize) {
        let max_idle = self.gen.config.upstream.max_idle_per_backend as usize;
        let u = self.upstream(up);
        let (model, backend) = (usize::from(u.model), usize::from(u.backend));
        let pool = &mut self.pools[model][backend];
        if pool.len() >= max_idle || self.shared.shutting_down.load(Ordering::Acquire) {
            return self.close_upstream(up);
        }
        pool.push(up);
        let u = self.upstream(up);
        u.state = UpState::Idle;
        u.reused = true;
        u.client = usize::MAX;
        let deadline = self.clock.now() + self.timeouts.idle;
        self.set_timer(up, Some(deadline));
    }

    pub(super) fn close_upstream(&mut self, up: usize) {
        self.set_timer(up, None);
        if let Some(Conn::Upstream(mut u)) = self.conns.try_remove(up) {
            let _ = self.poll.registry().deregister(&mut u.stream);
            let _ = u.stream.shutdown(Shutdown::Both);
            let pool = &mut self.pools[usize::from(u.model)][usize::from(u.backend)];
            if let Some(i) = pool.iter().position(|&k| k == up) {
                pool.swap_remove(i);
            }
        }
    }
}
