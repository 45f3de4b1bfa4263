//! The upstream side of a shard, [`Upstreams`]: its connections to the backends and their
//! keep-alive pools, forwarding admitted requests over pooled or new connections, relaying
//! responses as they arrive, retries and failures (SPEC 2.6-2.9). An exchange's client side is
//! [`Clients`]': the relay writes into the client's buffer and hands the flush to it.
//!
//! A busy connection has one timer: `connect_timeout` while connecting, `header_timeout` from
//! the request's send until the response head, and after the head, when the response goes on,
//! `read_timeout` of silence. The last is checked lazily: a read only notes its tick
//! (`Upstream::last_read`), and the timer, when it fires, either finds the backend silent for
//! `read_timeout` (a hung engine: the response is cut, as when a backend dies mid-stream) or
//! moves to `read_timeout` after the last read. A connection paused for a slow client is not
//! silent: the client is.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};

use mio::net::TcpStream;
use mio::Interest;
use slab::Slab;

use crate::clock::Tick;
use crate::protocol::{
    parse_response_head_into, write_client_response_head, write_upstream_head, Authorization,
    BodyRelay, ClientInfo, ForwardInfo, RelayPlan, ResponseFraming, ResponseHead,
};
use crate::scheduler::{Input, Lane};
use crate::server::metrics::{ShardMetrics, UpstreamError};
use crate::server::Generation;
use crate::wheel::TimerKey;

use super::client::Clients;
use super::connection::{Client, Phase};
use super::request::{format_request_id, Request};
use super::{Cx, Occasional, Owner, CLIENT_HIGH_WATER, READ_CHUNK};

/// `Upstream::client` of a connection that serves no client.
const NO_CLIENT: usize = usize::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpState {
    Connecting,
    Busy,
    Idle,
}

/// A connection to a backend.
#[derive(Debug)]
struct Upstream {
    stream: TcpStream,
    model: u16,
    backend: u16,
    /// The backend's address when this connection was opened (a host name may move).
    addr: SocketAddr,
    state: UpState,
    /// The client key while busy ([`NO_CLIENT`] otherwise).
    client: usize,
    /// Taken from the pool (the connection served a request before).
    reused: bool,
    wbuf: Vec<u8>,
    wpos: usize,
    rbuf: Vec<u8>,
    rlen: usize,
    eof: bool,
    /// epoll reported the peer's FIN: read to the end, short reads included.
    hup: bool,
    timer: Option<TimerKey>,
    /// Response head parsed: its framing upstream, and the relay plan to the client.
    framing: Option<ResponseFraming>,
    plan: RelayPlan,
    /// The body being relayed (framing, bytes left, chunked pass-through or decoder).
    body: BodyRelay,
    keep_alive: bool,
    /// Any response byte received (then nothing is retryable).
    got_bytes: bool,
    /// Stopped reading because the client's buffer is full.
    paused: bool,
    request_was_head: bool,
    /// When the last read brought bytes (the `read_timeout` check, module doc).
    last_read: Tick,
}

impl Upstream {
    fn new(stream: TcpStream, model: u16, backend: u16, addr: SocketAddr) -> Upstream {
        Upstream {
            stream,
            model,
            backend,
            addr,
            state: UpState::Connecting,
            client: NO_CLIENT,
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
            last_read: 0,
        }
    }

    /// Starts an exchange for client `client`: the request head in `head` moves into the
    /// connection, and its old buffer comes back in `head`, emptied.
    fn start(&mut self, client: usize, head: &mut Vec<u8>, was_head: bool) {
        self.client = client;
        std::mem::swap(&mut self.wbuf, head);
        head.clear();
        self.wpos = 0;
        self.rlen = 0;
        self.eof = false;
        self.framing = None;
        self.body = BodyRelay::default();
        self.got_bytes = false;
        self.paused = false;
        self.request_was_head = was_head;
        if self.state != UpState::Connecting {
            self.state = UpState::Busy;
        }
    }

    /// Parses the response head once it is complete and writes the client's head (S12's debug
    /// headers when `server.debug_headers`); `Relayed` with the head's length.
    /// `head` is the shard's one response head, parsed into in place.
    fn relay_head(
        &mut self,
        head: &mut ResponseHead,
        c: &mut Client,
        req: &mut Request,
        cx: &mut Cx,
    ) -> HeadRelay {
        let gen = cx.gen;
        let max_head = gen.config.server.max_header_bytes as usize;
        let rbuf = &self.rbuf[..self.rlen];
        match parse_response_head_into(rbuf, max_head, self.request_was_head, head) {
            Ok(true) => {}
            Ok(false) => return HeadRelay::Incomplete,
            Err(_) => return HeadRelay::Malformed,
        }
        let head = &*head;
        if head.is_interim() {
            if head.status == 101 {
                return HeadRelay::Malformed;
            }
            self.rbuf.copy_within(head.head_len..self.rlen, 0);
            self.rlen -= head.head_len;
            return HeadRelay::Interim;
        }
        let model = usize::from(self.model);
        let ttfb = cx.now().saturating_sub(req.forwarded_at);
        req.ttfb = Some(ttfb);
        cx.metrics.models[model].ttfb.observe(cx.rate.duration(ttfb));
        // During a drain (S13) the connection closes after this response.
        let keep_alive = req.keep_alive && !cx.shutting_down();
        let client = ClientInfo { version: req.head.version, keep_alive };
        let admission = req.admission.expect("admitted");
        if !req.streaming {
            // Issue [10]: the head is an unstreamed response's first byte (a streamed one's
            // is its first body byte, below).
            let ttft = cx.rate.duration(cx.now().saturating_sub(req.started));
            cx.metrics.observe_ttft(self.model, req.tenant, admission.turn, admission.warm, ttft);
        }
        let mut wait = [0u8; 20];
        let wait = crate::protocol::decimal(
            u64::try_from(cx.rate.duration(admission.waited).as_micros()).unwrap_or(u64::MAX),
            &mut wait,
        );
        let backend = &gen.models[model].backends[usize::from(admission.backend)];
        let debug: [(&str, &[u8]); 4] = [
            ("x-warmpath-lane", lane_name(admission.lane)),
            ("x-warmpath-queue-wait-us", wait),
            ("x-warmpath-backend", backend.authority.as_bytes()),
            ("x-warmpath-session-source", req.session.source_name().as_bytes()),
        ];
        let extra: &[(&str, &[u8])] = if gen.config.server.debug_headers { &debug } else { &[] };
        let plan = write_client_response_head(head, &self.rbuf, &mut c.wbuf, &client, extra);
        self.plan = plan;
        self.framing = Some(head.framing);
        self.keep_alive = head.keep_alive;
        self.body = BodyRelay::new(head.framing, plan.framing);
        req.usage.reset();
        req.status = head.status;
        req.keep_alive = plan.keep_alive;
        if let Some(timer) = self.timer.take() {
            cx.wheel.cancel(timer);
        }
        cx.metrics.count_status(self.model, req.tenant, head.status);
        if head.status == 401 {
            key_refused(self.model, admission.backend, cx);
        }
        HeadRelay::Relayed(head.head_len)
    }
}

/// A 401 from `backend`: when the model sends its own engine key, the engine refused the
/// router's key, not the client's, which the client cannot fix: counted, and said on stderr at a
/// shard's 1st, 2nd, 4th, 8th... refusal by that backend (a wrong key refuses every request, and
/// the log should say so without repeating it at every request).
fn key_refused(model: u16, backend: u16, cx: &Cx) {
    let m = &cx.gen.models[usize::from(model)];
    // The model sends its engine key exactly when its configuration names a key file.
    let Some(path) = &m.config.backend_api_key_file else { return };
    let count = cx.metrics.models[usize::from(model)].count_key_refused(backend);
    if count.is_power_of_two() {
        eprintln!(
            "warmpath: shard {}: backend {} of model {} answered 401 to the engine key read \
             from {} ({count} so far on this shard): the engine refuses the key; check the \
             file against the engine's --api-key (warmpath_backend_key_refused_total)",
            cx.shard,
            m.backends[usize::from(backend)].authority,
            m.name,
            path.display(),
        );
    }
}

/// What reading a response head came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadRelay {
    /// Not all of it is here yet.
    Incomplete,
    /// A 1xx (other than 101) was skipped; the real head follows.
    Interim,
    Malformed,
    /// Relayed to the client; the head was this many bytes.
    Relayed(usize),
}

/// The `x-warmpath-lane` value of a lane.
fn lane_name(lane: Lane) -> &'static [u8] {
    match lane {
        Lane::Retry | Lane::Normal => b"normal",
        Lane::Boosted => b"boosted",
        Lane::Forced => b"forced",
    }
}

/// How an upstream exchange ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Nothing was received: the request may go elsewhere.
    Retryable(UpstreamError),
    /// Answer 502 if nothing was relayed yet, else cut the client stream.
    Fatal(UpstreamError),
}

/// The upstream connections and their keep-alive pools.
///
/// Client and upstream connections are in two slabs, one per room, rather than one slab of
/// both: each room then owns its connections, and the relay, which moves bytes from an
/// upstream connection's buffer to its client's, borrows one from each slab instead of two
/// entries of one slab (`get2_mut`) and a match on what each entry is. The cost is a tag bit
/// in the tokens and timers ([`Owner`]).
#[derive(Debug)]
pub(super) struct Upstreams {
    conns: Slab<Upstream>,
    /// Idle connections, `[model][backend]`.
    pools: Vec<Vec<Vec<usize>>>,
    /// The head of the request being forwarded (it swaps with the connection's old write
    /// buffer), and the relay's decoding scratch.
    scratch: Vec<u8>,
    /// The response head being relayed, parsed into in place (its header spans are 2 KiB).
    head: ResponseHead,
    /// When a connection the router could not open for want of its own resources was last
    /// logged.
    shortage_log: Occasional,
}

impl Upstreams {
    pub(super) fn new(gen: &Generation) -> Upstreams {
        Upstreams {
            conns: Slab::new(),
            pools: gen.models.iter().map(|m| vec![Vec::new(); m.backends.len()]).collect(),
            scratch: Vec::with_capacity(16 << 10),
            head: ResponseHead::EMPTY,
            shortage_log: Occasional::default(),
        }
    }

    /// A new generation: pools for its models and backends; idle connections to the backends
    /// it removed, or to an address a backend's host name no longer resolves to, close (busy
    /// ones finish their exchange and close instead of returning to the pool).
    pub(super) fn adopt(&mut self, cx: &mut Cx) {
        for (index, model) in cx.gen.models.iter().enumerate() {
            if index == self.pools.len() {
                self.pools.push(Vec::new());
            }
            self.pools[index].resize(model.backends.len(), Vec::new());
            for (backend, addr) in model.backends.iter().enumerate() {
                let pool = &self.pools[index][backend];
                let stale = |&up: &usize| !addr.live || self.conns[up].addr != addr.addr;
                let stale: Vec<usize> = pool.iter().copied().filter(stale).collect();
                for up in stale {
                    self.close(up, cx);
                }
            }
        }
    }

    fn set_timer(&mut self, up: usize, deadline: Option<Tick>, cx: &mut Cx) {
        if let Some(u) = self.conns.get_mut(up) {
            cx.set_timer(&mut u.timer, Owner::Upstream(up), deadline);
        }
    }

    // ----- forwarding -----

    /// Sends the admitted request of client `key` to its backend over a pooled or new
    /// connection.
    pub(super) fn forward(&mut self, key: usize, clients: &mut Clients, cx: &mut Cx) {
        let gen = cx.gen;
        let (c, req) = clients.exchange(key).expect("a client to forward for");
        let model = req.model.expect("an inference request");
        let admission = req.admission.expect("admitted");
        let m = &gen.models[usize::from(model)];
        let backend = &m.backends[usize::from(admission.backend)];
        let body = req.body(&c.rbuf);
        let mut head = std::mem::take(&mut self.scratch);
        head.clear();
        // Only the head is built here: the body goes out from the client's buffer, the model
        // token replaced on the way when rewriting (see `flush`), never copied.
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
            // The engines' own key, if they take one, in place of the client's; else, issue
            // [11]: a tenant's key is the router's business, not the engine's.
            authorization: match &m.backend_key {
                Some(key) => Authorization::Set(key.header_value()),
                None if req.tenant != crate::server::generation::NO_TENANT => Authorization::Strip,
                None => Authorization::Forward,
            },
        };
        write_upstream_head(&req.head, &c.rbuf, &mut head, &info);
        let was_head = req.is_head(&c.rbuf);
        req.forwarded_at = cx.now();
        let up = match self.pools[usize::from(model)][usize::from(admission.backend)].pop() {
            Some(up) => {
                self.set_timer(up, None, cx);
                up
            }
            None => match self.connect(model, admission.backend, backend.addr, cx) {
                Ok(up) => up,
                Err(e) => {
                    self.scratch = head;
                    if crate::control::probe::short_of_resources(&e) {
                        return self.short_of_resources(key, model, &e, clients, cx);
                    }
                    return self.failed_before_connect(key, model, admission.backend, clients, cx);
                }
            },
        };
        let u = &mut self.conns[up];
        u.start(key, &mut head, was_head);
        let connecting = u.state == UpState::Connecting;
        self.scratch = head;
        clients.exchange(key).expect("the client forwarded for").0.phase = Phase::Upstream(up);
        let wait = if connecting { cx.timeouts.connect } else { cx.timeouts.upstream_header };
        let deadline = cx.now() + wait;
        self.set_timer(up, Some(deadline), cx);
        if !connecting {
            self.flush(up, clients, cx);
        }
    }

    /// Opens a connection to a backend; it is `Connecting` until writable.
    fn connect(
        &mut self,
        model: u16,
        backend: u16,
        addr: SocketAddr,
        cx: &Cx,
    ) -> io::Result<usize> {
        let mut stream = TcpStream::connect(addr)?;
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if key >= Owner::UPSTREAM {
            return Err(io::Error::other("no upstream token left"));
        }
        let interest = Interest::READABLE | Interest::WRITABLE;
        cx.registry.register(&mut stream, Owner::Upstream(key).token(), interest)?;
        entry.insert(Upstream::new(stream, model, backend, addr));
        Ok(key)
    }

    /// `connect` itself failed: retry through the scheduler.
    fn failed_before_connect(
        &mut self,
        key: usize,
        model: u16,
        backend: u16,
        clients: &mut Clients,
        cx: &mut Cx,
    ) {
        cx.metrics.models[usize::from(model)].count_upstream_error(backend, UpstreamError::Connect);
        self.retry(key, clients, cx);
    }

    /// The router could not open a connection for want of its own descriptors or memory: the
    /// backend did nothing wrong, so nothing counts against it (no retry, no passive
    /// ejection, which would turn a local shortage into an outage of every backend). The
    /// request is answered 503 `unavailable` with `Retry-After`, like the other budgets the
    /// router runs out of, counted and logged once a minute at most.
    fn short_of_resources(
        &mut self,
        key: usize,
        model: u16,
        error: &io::Error,
        clients: &mut Clients,
        cx: &mut Cx,
    ) {
        ShardMetrics::bump(&cx.metrics.upstream_socket_errors);
        if self.shortage_log.due(cx) {
            eprintln!(
                "warmpath: shard {}: no upstream connection opened: {error}; such requests are \
                 answered 503 (warmpath_upstream_socket_errors_total counts them; raise the \
                 open-file limit, e.g. LimitNOFILE)",
                cx.shard
            );
        }
        let message = "the router is out of descriptors or memory for an upstream connection";
        clients.router_error(key, (503, "unavailable", message), Some(model), self, cx);
    }

    /// Sends the request back to its scheduler for another backend (SPEC 2.8).
    fn retry(&mut self, key: usize, clients: &mut Clients, cx: &mut Cx) {
        let (c, req) = clients.exchange(key).expect("a client to retry for");
        req.admission = None;
        req.reconnected = false;
        let (id, model) = (req.id, req.model.expect("an inference request"));
        c.phase = Phase::Queued;
        cx.send(model, Input::Retry(id));
    }

    /// Forwards the client's request again over a new connection (the pool is skipped).
    fn forward_fresh(&mut self, key: usize, clients: &mut Clients, cx: &mut Cx) {
        let (c, req) = clients.exchange(key).expect("a client to forward for");
        let model = usize::from(req.model.expect("model"));
        let backend = usize::from(req.admission.expect("admitted").backend);
        c.phase = Phase::Queued;
        // Drain the pool of that backend: its other idle connections are likely dead too.
        while let Some(up) = self.pools[model][backend].pop() {
            self.close(up, cx);
        }
        self.forward(key, clients, cx);
    }

    // ----- events -----

    /// A readiness event of connection `up`.
    pub(super) fn ready(
        &mut self,
        up: usize,
        readable: bool,
        writable: bool,
        hup: bool,
        clients: &mut Clients,
        cx: &mut Cx,
    ) {
        let Some(u) = self.conns.get_mut(up) else { return };
        u.hup |= hup;
        if writable {
            self.writable(up, clients, cx);
        }
        if readable && self.conns.contains(up) {
            self.readable(up, clients, cx);
        }
    }

    /// Connection `up`'s timer fired.
    pub(super) fn expired(&mut self, up: usize, clients: &mut Clients, cx: &mut Cx) {
        let Some(u) = self.conns.get_mut(up) else { return };
        u.timer = None;
        match u.state {
            UpState::Connecting => {
                self.failed(up, Failure::Retryable(UpstreamError::Connect), clients, cx);
            }
            UpState::Busy if u.framing.is_none() => {
                self.failed(up, Failure::Fatal(UpstreamError::Timeout), clients, cx);
            }
            UpState::Idle => self.close(up, cx),
            UpState::Busy => {
                // After the head: silent for `read_timeout` (module doc)?
                let now = cx.now();
                let since = if u.paused { now } else { u.last_read };
                let deadline = since.saturating_add(cx.timeouts.upstream_read);
                if deadline <= now {
                    self.failed(up, Failure::Fatal(UpstreamError::Timeout), clients, cx);
                } else {
                    self.set_timer(up, Some(deadline), cx);
                }
            }
        }
    }

    fn writable(&mut self, up: usize, clients: &mut Clients, cx: &mut Cx) {
        let u = &mut self.conns[up];
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
                return self.failed(up, Failure::Retryable(UpstreamError::Connect), clients, cx);
            }
            let _ = u.stream.set_nodelay(true);
            u.state = if u.client == NO_CLIENT { UpState::Idle } else { UpState::Busy };
            if u.state == UpState::Busy {
                let deadline = cx.now() + cx.timeouts.upstream_header;
                self.set_timer(up, Some(deadline), cx);
            }
        }
        self.flush(up, clients, cx);
    }

    /// Writes the request to the backend: the head from the connection's buffer, then the body
    /// straight from the client's buffer (with the model token swapped for `upstream_model`'s),
    /// in vectored writes.
    fn flush(&mut self, up: usize, clients: &mut Clients, cx: &mut Cx) {
        let Some(u) = self.conns.get_mut(up).filter(|u| u.state == UpState::Busy) else { return };
        // A busy connection has a client; `NO_CLIENT` is no slab key.
        let Some((c, req)) = clients.exchange(u.client) else { return };
        let body = req.body(&c.rbuf);
        let parts: [&[u8]; 4] = match &cx.gen.models[usize::from(u.model)].upstream_model_json {
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
            let reset = Failure::Retryable(UpstreamError::Reset);
            match u.stream.write_vectored(&slices[..used]) {
                Ok(0) => return self.failed(up, reset, clients, cx),
                Ok(n) => u.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.failed(up, reset, clients, cx),
            }
        }
    }

    // ----- the relay -----

    /// Reads what the backend sent. A busy connection relays each read as it arrives (SSE
    /// events are not held back); an idle pooled one that speaks or closes is dropped.
    fn readable(&mut self, up: usize, clients: &mut Clients, cx: &mut Cx) {
        let mut failed = false;
        loop {
            let Some(u) = self.conns.get_mut(up) else { return };
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
                Ok(_) if u.state == UpState::Idle => return self.close(up, cx),
                Ok(n) => {
                    u.rlen += n;
                    u.last_read = cx.now();
                    self.relay(up, clients, cx);
                    let (busy, hup) = match self.conns.get(up) {
                        Some(u) => (u.state == UpState::Busy, u.hup),
                        None => (false, false),
                    };
                    if !busy || n < want && !hup {
                        // Done, or a short read drained the socket (see `Client::fill`).
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
        self.ended(up, failed, clients, cx);
    }

    /// The backend closed (or the connection failed, `failed`): a close-delimited body ends
    /// here; any other exchange in progress ends early.
    fn ended(&mut self, up: usize, failed: bool, clients: &mut Clients, cx: &mut Cx) {
        let Some(u) = self.conns.get(up) else { return };
        if u.state == UpState::Idle || u.client == NO_CLIENT {
            return self.close(up, cx);
        }
        if !failed {
            self.relay(up, clients, cx);
        }
        let Some(u) = self.conns.get(up) else { return };
        if u.state == UpState::Busy && u.client != NO_CLIENT {
            let failure = match (u.got_bytes, u.framing) {
                (false, _) => Failure::Retryable(UpstreamError::Reset),
                (true, None) => Failure::Fatal(UpstreamError::Malformed),
                (true, Some(_)) => Failure::Fatal(UpstreamError::Truncated),
            };
            self.failed(up, failure, clients, cx);
        }
    }

    /// Resumes reading connection `up` if it paused for its client's full buffer.
    pub(super) fn resume(&mut self, up: usize, clients: &mut Clients, cx: &mut Cx) {
        if let Some(u) = self.conns.get_mut(up).filter(|u| u.paused) {
            u.paused = false;
            // The pause was the client's silence, not the backend's.
            u.last_read = cx.now();
            self.readable(up, clients, cx);
        }
    }

    /// Moves response bytes from the backend's buffer to the client's, as the framing says,
    /// and has the client flush them.
    fn relay(&mut self, up: usize, clients: &mut Clients, cx: &mut Cx) {
        let Some(u) = self.conns.get_mut(up) else { return };
        let client = u.client;
        // `NO_CLIENT` is no slab key: an upstream connection without a client relays nothing.
        let Some((c, req)) = clients.exchange(client) else { return };
        if u.rlen > 0 {
            u.got_bytes = true;
        }
        let mut consumed = 0;
        let head_now = u.framing.is_none();
        if head_now {
            match u.relay_head(&mut self.head, c, req, cx) {
                HeadRelay::Incomplete => return,
                HeadRelay::Interim => return self.relay(up, clients, cx),
                HeadRelay::Malformed => {
                    let failure = Failure::Fatal(UpstreamError::Malformed);
                    return self.failed(up, failure, clients, cx);
                }
                HeadRelay::Relayed(head_len) => consumed = head_len,
            }
        }
        let before = c.wbuf.len();
        let fed = u.body.feed(&u.rbuf[consumed..u.rlen], u.eof, &mut self.scratch, &mut c.wbuf);
        let (done, body_bytes) = match fed {
            Ok(progress) => {
                consumed += progress.consumed;
                (progress.done, progress.data > 0)
            }
            Err(_) => {
                return self.failed(up, Failure::Fatal(UpstreamError::Malformed), clients, cx)
            }
        };
        if (200..300).contains(&req.status) {
            // The client's bytes, as relayed: a chunked body passed through still carries its
            // size lines, which can only hide a value (protocol::usage), so no decoded copy is
            // made for this.
            req.usage.feed(&c.wbuf[before..]);
        }
        u.rbuf.copy_within(consumed..u.rlen, 0);
        u.rlen -= consumed;
        let first_byte = body_bytes && req.streaming && !req.first_byte_sent;
        req.first_byte_sent |= first_byte;
        let (id, model) = (req.id, u.model);
        // The head of a fixed-length body that has not begun waits for it, so that head and
        // body go out in one write: an engine that writes them apart (uvicorn sends the head
        // first) has the whole body already. A streamed head goes out at once: its first
        // event may be a long prefill away, and the client sees the status meanwhile.
        let fixed = matches!(u.framing, Some(ResponseFraming::ContentLength(_)));
        let hold_head = head_now && fixed && !body_bytes && !done;
        if done {
            u.body.finish(&mut c.wbuf);
            req.complete = Some((200..300).contains(&req.status));
            c.phase = Phase::Done;
            let reusable = u.keep_alive && u.rlen == 0 && !u.eof;
            u.client = NO_CLIENT;
            match reusable {
                true => self.return_to_pool(up, cx),
                false => self.close(up, cx),
            }
        } else {
            if head_now {
                // The response goes on: from now its silences are timed (module doc).
                let deadline = u.last_read.saturating_add(cx.timeouts.upstream_read);
                cx.set_timer(&mut u.timer, Owner::Upstream(up), Some(deadline));
            }
            if c.wbuf.len() - c.wpos >= CLIENT_HIGH_WATER {
                u.paused = true;
            }
        }
        if first_byte {
            if let Some(a) = req.admission {
                let ttft = cx.rate.duration(cx.now().saturating_sub(req.started));
                cx.metrics.observe_ttft(model, req.tenant, a.turn, a.warm, ttft);
            }
            cx.send(model, Input::FirstByte(id));
        }
        if !hold_head {
            clients.flush(client, self, cx);
        }
    }

    /// An upstream exchange failed. Retryable failures go back to the scheduler (after one
    /// fresh reconnect for a dead pooled connection); fatal ones answer 502 when nothing was
    /// relayed yet, or cut the client's stream.
    fn failed(&mut self, up: usize, failure: Failure, clients: &mut Clients, cx: &mut Cx) {
        let Some(u) = self.conns.get(up) else { return };
        let (model, backend, client, reused) = (u.model, u.backend, u.client, u.reused);
        self.close(up, cx);
        if client == NO_CLIENT {
            return;
        }
        let kind = match failure {
            Failure::Retryable(kind) | Failure::Fatal(kind) => kind,
        };
        let metrics = &cx.metrics.models[usize::from(model)];
        let Some((c, req)) = clients.exchange(client) else { return };
        match failure {
            Failure::Retryable(_) if reused && !req.reconnected => {
                // A pooled connection found dead: one fresh connection to the same backend.
                metrics.count_pool_reconnect();
                req.reconnected = true;
                c.phase = Phase::Queued;
                self.forward_fresh(client, clients, cx);
            }
            Failure::Retryable(_) => {
                metrics.count_upstream_error(backend, kind);
                self.retry(client, clients, cx);
            }
            Failure::Fatal(_) => {
                metrics.count_upstream_error(backend, kind);
                if req.status == 0 {
                    let message = match kind {
                        UpstreamError::Timeout => "the backend sent no response head in time",
                        _ => "the backend sent a malformed response",
                    };
                    let answer = (502, "upstream_error", message);
                    clients.router_error(client, answer, Some(model), self, cx);
                } else {
                    // Bytes were relayed: the status stands; end the stream without its end
                    // (no final chunk) and close.
                    req.complete = Some(false);
                    req.failure = Some(kind);
                    c.closing = true;
                    c.phase = Phase::Done;
                    clients.flush(client, self, cx);
                }
            }
        }
    }

    // ----- pools -----

    fn return_to_pool(&mut self, up: usize, cx: &mut Cx) {
        let max_idle = cx.gen.config.upstream.max_idle_per_backend as usize;
        let u = &mut self.conns[up];
        let (model, backend) = (usize::from(u.model), usize::from(u.backend));
        let moved = cx.gen.models[model].backends[backend].addr != u.addr;
        let pool = &mut self.pools[model][backend];
        if pool.len() >= max_idle || moved || cx.shutting_down() {
            return self.close(up, cx);
        }
        pool.push(up);
        u.state = UpState::Idle;
        u.reused = true;
        u.client = NO_CLIENT;
        let deadline = cx.now() + cx.timeouts.idle;
        self.set_timer(up, Some(deadline), cx);
    }

    /// Closes connection `up` (it leaves its pool if idle).
    pub(super) fn close(&mut self, up: usize, cx: &mut Cx) {
        self.set_timer(up, None, cx);
        let Some(mut u) = self.conns.try_remove(up) else { return };
        let _ = cx.registry.deregister(&mut u.stream);
        let _ = u.stream.shutdown(Shutdown::Both);
        let pool = &mut self.pools[usize::from(u.model)][usize::from(u.backend)];
        if let Some(i) = pool.iter().position(|&k| k == up) {
            pool.swap_remove(i);
        }
    }
}
