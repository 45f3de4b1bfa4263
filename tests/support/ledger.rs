//! Accounting for the fault-injection and hostile-input tests (SPEC S14): every request a test
//! sends gets exactly one outcome, and when traffic stops every queue and inflight count is 0.
//!
//! The test writes down what it saw, request by request: a response with its status, or its
//! own departure (the client vanished before any response byte, or in the middle of one).
//! [`Ledger::settle`] then checks the router's side against it:
//! - through `/debug/queue`: every model's queue empty, inflight 0, every backend's inflight and
//!   held grace slots 0;
//! - through `/metrics`: the responses the router counted, per status (model-bound ones in
//!   `warmpath_requests_total`, the rest in `warmpath_router_responses_total`), are exactly the
//!   ones the clients read; `warmpath_clients_gone_total` is exactly the departures of clients
//!   whose request was queued or forwarded; no request bytes stay buffered.
//!
//! A response counted twice, one lost, a slot never released or a cancel never delivered all
//! make `settle` fail.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::Value;

use super::client;
use super::{wait_until, Deadline, PATIENCE, POLL};

/// What the clients of one test saw.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    sent: u64,
    answered: BTreeMap<u16, u64>,
    /// Clients that left before any response byte (their request was queued or forwarded).
    vanished: u64,
    /// Clients that left after the response head (counted in `answered` too).
    left_mid_response: u64,
    /// Clients that left before their request was complete (no outcome the router counts).
    abandoned: u64,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A request was sent.
    pub fn sent(&mut self) {
        self.sent += 1;
    }

    /// A response with `status` was read for one request sent.
    pub fn answered(&mut self, status: u16) {
        *self.answered.entry(status).or_default() += 1;
    }

    /// A request was sent and answered with `status`.
    pub fn exchange(&mut self, status: u16) {
        self.sent();
        self.answered(status);
    }

    /// The client of a queued or forwarded request left before any response byte.
    pub fn vanished(&mut self) {
        self.vanished += 1;
    }

    /// The client left in the middle of a response whose status it had read (already
    /// [`answered`](Ledger::answered)).
    pub fn left_mid_response(&mut self) {
        self.left_mid_response += 1;
    }

    /// The client left before its request was complete: the router never had a request.
    pub fn abandoned(&mut self) {
        self.abandoned += 1;
    }

    /// Responses read, all statuses.
    pub fn answers(&self) -> u64 {
        self.answered.values().sum()
    }

    /// Checks the ledger itself (each request sent has one outcome), then waits (at most
    /// [`PATIENCE`]) for the router's queues, inflight counts and counters to agree with it.
    pub fn settle(&self, admin: SocketAddr) {
        let outcomes = self.answers() + self.vanished + self.abandoned;
        assert_eq!(self.sent, outcomes, "each request sent has exactly one outcome: {self:?}");
        assert_idle(admin);
        let expected_gone = self.vanished + self.left_mid_response;
        let deadline = Deadline::after(PATIENCE);
        loop {
            let text = client::metrics(admin);
            let counted = router_statuses(&text);
            let gone = client::metric(&text, "warmpath_clients_gone_total", &[]).unwrap_or(0.0);
            let buffered = client::metric(&text, "warmpath_buffered_bytes", &[]).unwrap_or(0.0);
            if counted == self.answered && gone as u64 == expected_gone && buffered == 0.0 {
                return;
            }
            assert!(
                !deadline.passed(),
                "the router counted responses {counted:?}, {gone} clients gone and {buffered} \
                 bytes buffered; the ledger says {self:?}"
            );
            std::thread::sleep(POLL);
        }
    }
}

/// Waits until every model of the router has an empty queue, no request in flight and no held
/// slot on any backend (`/debug/queue`).
pub fn assert_idle(admin: SocketAddr) {
    wait_until("every queue empty and every inflight count 0", PATIENCE, || {
        let all = client::debug_queue(admin);
        let models = all["models"].as_array().cloned().unwrap_or_default();
        models.iter().all(model_idle).then_some(())
    });
}

fn model_idle(model: &Value) -> bool {
    let backends = model["backends"].as_array().cloned().unwrap_or_default();
    model["queued"].as_u64() == Some(0)
        && model["inflight"].as_u64() == Some(0)
        && backends
            .iter()
            .all(|b| b["inflight"].as_u64() == Some(0) && b["held_slots"].as_u64() == Some(0))
}

/// Responses the router counted, by status: `warmpath_requests_total` summed over models plus
/// `warmpath_router_responses_total`.
fn router_statuses(text: &str) -> BTreeMap<u16, u64> {
    let mut statuses = BTreeMap::new();
    for line in text.lines() {
        let counted = ["warmpath_requests_total{", "warmpath_router_responses_total{"]
            .iter()
            .any(|prefix| line.starts_with(prefix));
        if !counted {
            continue;
        }
        let status = line
            .split("status=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|s| s.parse::<u16>().ok());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(status), Some(value)) = (status, value) {
            *statuses.entry(status).or_default() += value as u64;
        }
    }
    statuses
}
