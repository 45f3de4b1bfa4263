//! Fair share across tenants (issue \[11\], [`super::fair`]): the weighted split under
//! saturation, FIFO within a tenant's lane, no credit banked while idle, S4 per tenant, and the
//! differential test against the reference with tenants always configured.

use proptest::prelude::*;

use super::*;
use crate::ring::prompt_pool::NO_PROMPT;
use crate::splitmix::SplitMix64;

fn params(weights: &[u16]) -> Params {
    Params {
        boost: true,
        routing: Routing::SessionAffinity,
        backends: 1,
        queue_timeout: None,
        max_queued: 10_000,
        inflight_per_backend: 1,
        inflight_learned: false,
        prefill_tokens_per_backend: Budget::Tokens(0),
        max_sessions: 1000,
        max_overtakes: 16,
        boosted_streak_max: 0,
        grace_period: 0,
        max_retries: 2,
        eject_after_failures: 0,
        metrics_stale_after: u64::MAX / 4,
        timer_resolution: 1 << 10,
        prefix: PrefixParams::DEFAULT,
        tenant_weights: weights.to_vec(),
    }
}

/// A scheduler with one slot: each completion admits exactly one queued request.
struct Slot {
    s: Scheduler,
    now: Tick,
    next_id: u64,
    out: Vec<Output>,
    /// Per request id: (tenant, tokens).
    sent: Vec<(u16, u64)>,
    /// Admissions in order: (id, lane).
    admitted: Vec<(u64, Lane)>,
}

impl Slot {
    fn new(weights: &[u16]) -> Slot {
        Slot {
            s: Scheduler::new(params(weights), 0),
            now: 0,
            next_id: 0,
            out: Vec::new(),
            sent: vec![(0, 0)],
            admitted: Vec::new(),
        }
    }

    fn send(&mut self, input: Input) {
        self.now += 1;
        self.out.clear();
        self.s.handle(self.now, input, &mut self.out);
        self.s.check_invariants();
        for output in &self.out {
            if let Output::Admit { id, lane, .. } = *output {
                self.admitted.push((id.0, lane));
            }
        }
    }

    fn arrive(&mut self, tenant: u16, tokens: u32, session: Option<u64>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.sent.push((tenant, u64::from(tokens)));
        let arrival = Arrival {
            id: RequestId(id),
            session,
            prompt_bytes: tokens * 4,
            streaming: false,
            prompt: NO_PROMPT,
            tenant,
        };
        self.send(Input::Arrive(arrival));
        id
    }

    fn complete(&mut self, id: u64) {
        let input = Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE };
        self.send(input);
    }

    /// Completes the request admitted last; returns the one admitted in its place.
    fn turn(&mut self) -> Option<u64> {
        let before = self.admitted.len();
        let (last, _) = *self.admitted.last()?;
        self.complete(last);
        (self.admitted.len() > before).then(|| self.admitted[before].0)
    }

    fn tenant(&self, id: u64) -> u16 {
        self.sent[id as usize].0
    }

    fn tokens(&self, id: u64) -> u64 {
        self.sent[id as usize].1
    }
}

/// Two tenants of weights 3:1, both saturating with prompts of 200 to 1,000 tokens: over every
/// window of 400 admissions, the admitted estimated prompt tokens split 3:1 within 5 %.
#[test]
fn two_saturating_tenants_split_admitted_tokens_by_weight() {
    let mut h = Slot::new(&[3, 1]);
    let mut rng = SplitMix64::new(11);
    let mut size = || 200 + (rng.next_u64() % 801) as u32;
    for _ in 0..50 {
        h.arrive(1, size(), None);
        h.arrive(2, size(), None);
    }
    let mut order = Vec::new();
    for _ in 0..4000 {
        let id = h.turn().expect("both tenants stay backlogged");
        order.push(id);
        // Keep the admitted request's tenant as deep as before.
        h.arrive(h.tenant(id), size(), None);
    }
    for start in (0..order.len() - 400).step_by(50) {
        let (mut a, mut b) = (0, 0);
        for &id in &order[start..start + 400] {
            match h.tenant(id) {
                1 => a += h.tokens(id),
                _ => b += h.tokens(id),
            }
        }
        let ratio = a as f64 / b as f64;
        assert!((2.85..=3.15).contains(&ratio), "window at {start}: {a} / {b} = {ratio:.3}");
    }
}

/// With equal prompts, weights 3:1 admit exactly three of one tenant per one of the other in
/// every window of four admissions once both are backlogged.
#[test]
fn equal_prompts_interleave_three_to_one() {
    let mut h = Slot::new(&[3, 1]);
    for _ in 0..40 {
        h.arrive(1, 100, None);
        h.arrive(2, 100, None);
    }
    let mut tenants = Vec::new();
    for _ in 0..40 {
        let id = h.turn().expect("backlogged");
        tenants.push(h.tenant(id));
    }
    for window in tenants.chunks(4) {
        assert_eq!(window.iter().filter(|&&t| t == 1).count(), 3, "{tenants:?}");
    }
}

/// A tenant that was idle while another was served alone re-enters at the virtual time: it
/// does not get the whole slot until it has "caught up". After its return, at every point,
/// its normalised service exceeds the other's by at most one request's charge (a quantum).
#[test]
fn an_idle_tenant_returning_banks_no_credit() {
    let mut h = Slot::new(&[1, 1]);
    for _ in 0..20 {
        h.arrive(1, 500, None);
    }
    for _ in 0..500 {
        let id = h.turn().expect("tenant 1 backlogged");
        h.arrive(h.tenant(id), 500, None);
    }
    for _ in 0..100 {
        h.arrive(2, 500, None);
    }
    let (mut a, mut b) = (0i64, 0i64);
    let mut seen_b = false;
    for _ in 0..200 {
        let id = h.turn().expect("backlogged");
        let tokens = h.tokens(id) as i64;
        match h.tenant(id) {
            1 => {
                a += tokens;
                h.arrive(1, 500, None);
            }
            _ => {
                b += tokens;
                seen_b = true;
            }
        }
        assert!(b - a <= 500, "the returning tenant got {b} tokens against {a}");
        assert!(a - b <= 1000, "the returning tenant is starved: {b} tokens against {a}");
    }
    assert!(seen_b);
}

/// A tenant sending many more requests than another does not delay the other's requests
/// beyond one admission of its own: the light tenant's request goes next.
#[test]
fn a_light_tenant_is_not_queued_behind_a_heavy_one() {
    let mut h = Slot::new(&[1, 1]);
    for _ in 0..100 {
        h.arrive(1, 300, None);
    }
    for round in 0..10 {
        let light = h.arrive(2, 300, None);
        let next = h.turn().expect("backlogged");
        assert_eq!(next, light, "round {round}: the light tenant's request waits");
        h.turn();
    }
}

/// S4 counts boosted admissions per tenant: another tenant's boosted admissions do not force
/// this tenant's requests, and each tenant's own bound still holds.
#[test]
fn bounded_overtaking_holds_within_each_tenant() {
    let mut p = params(&[1, 1]);
    p.max_overtakes = 2;
    let mut h = Slot { s: Scheduler::new(p, 0), ..Slot::new(&[]) };
    // Sessions 1..=8 completed, each session's tenant by parity.
    for session in 1..=8u64 {
        let id = h.arrive((session % 2) as u16 + 1, 10, Some(session));
        h.complete(id);
    }
    let blocker = h.arrive(1, 10, None);
    assert_eq!(h.admitted.last().map(|a| a.0), Some(blocker));
    // Oldest completions first: they are overtaken by the later ones of their tenant.
    for session in 1..=8u64 {
        h.arrive((session % 2) as u16 + 1, 10, Some(session));
    }
    let first = h.admitted.len();
    while h.turn().is_some() {}
    let lanes: Vec<(u16, Lane)> =
        h.admitted[first..].iter().map(|&(id, lane)| (h.tenant(id), lane)).collect();
    let forced = lanes.iter().filter(|(_, lane)| *lane == Lane::Forced).count();
    assert!(forced > 0, "{lanes:?}");
    for tenant in [1, 2] {
        let own: Vec<u64> = h.admitted[first..]
            .iter()
            .filter(|&&(id, _)| h.tenant(id) == tenant)
            .map(|&(id, _)| id)
            .collect();
        // Tenant t's four follow-ups, most recent completion first, but the oldest is forced
        // after exactly max_overtakes boosted admissions of its own tenant.
        let oldest = *own.iter().min().unwrap();
        let at = own.iter().position(|&id| id == oldest).unwrap();
        assert_eq!(at, 2, "tenant {tenant}: oldest admitted at {at} in {own:?}");
    }
}

/// One configured tenant behaves exactly as no tenant: SPEC's S3 example, through tenant 1.
#[test]
fn one_tenant_is_the_single_queue() {
    for weights in [&[][..], &[7][..]] {
        let tenant = weights.len() as u16;
        let mut h = Slot::new(weights);
        for (id, session) in [(1, 10), (2, 20), (3, 30)] {
            let got = h.arrive(tenant, 1, Some(session));
            assert_eq!(got, id);
            h.complete(id);
        }
        let blocker = h.arrive(tenant, 1, None);
        for session in [20, 30, 10] {
            h.arrive(tenant, 1, Some(session));
        }
        let plain = h.arrive(tenant, 1, None);
        h.complete(blocker);
        let mut order = vec![h.admitted.last().unwrap().0];
        while let Some(id) = h.turn() {
            order.push(id);
        }
        assert_eq!(order, vec![6, 5, 7, plain], "weights {weights:?}");
    }
}

/// A reload that adds tenants: the new tenant's requests take their fair place at once.
#[test]
fn a_reload_adds_tenants() {
    let mut h = Slot::new(&[1]);
    for _ in 0..10 {
        h.arrive(1, 100, None);
    }
    let mut out = Vec::new();
    h.s.reconfigure(h.now, params(&[1, 1]), &[true], &mut out);
    let newcomer = h.arrive(2, 100, None);
    assert_eq!(h.turn(), Some(newcomer));
    // A tenant index beyond the scheduler's table counts as no tenant.
    let stray = h.arrive(9, 100, None);
    assert_eq!(h.s.queue.get(h.s.queue.find(stray).unwrap()).tenant, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Same-tenant FIFO within the normal lane: under any interleaving of tenants, sizes and
    /// completions, each tenant's first turns are admitted in arrival order.
    #[test]
    fn each_tenant_is_fifo_within_its_lane(
        steps in proptest::collection::vec((0u16..4, 1u32..2000, any::<bool>()), 1..300),
    ) {
        let mut h = Slot::new(&[1, 2, 5]);
        for (tenant, tokens, complete) in steps {
            h.arrive(tenant, tokens, None);
            if complete {
                h.turn();
            }
        }
        while h.turn().is_some() {}
        for tenant in 0..4 {
            let ids: Vec<u64> =
                h.admitted.iter().map(|a| a.0).filter(|&id| h.tenant(id) == tenant).collect();
            prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "tenant {}: {:?}", tenant, ids);
        }
    }

    /// The differential test against the reference with tenants always configured.
    #[test]
    fn matches_reference_model_with_tenants(
        data in proptest::collection::vec(any::<u8>(), 0..3000),
    ) {
        harness::run_with_tenants(&data);
    }
}
