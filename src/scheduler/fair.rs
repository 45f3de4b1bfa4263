//! Fair share across tenants (issue \[11\]): start-time fair queuing over estimated prompt
//! tokens, one level above the lanes.
//!
//! The algorithm is Start-time Fair Queuing (Goyal, Vin and Cheng, SIGCOMM 1996), applied to
//! *tenants* rather than to requests. Each tenant `t` with weight `w_t` has a virtual *finish*
//! `F_t`, and while it has requests queued (it is *backlogged*) a fixed *key*, the virtual
//! start of its next admission. The scheduler keeps a virtual time `V`, the key of the last
//! tenant-ordered admission (it never decreases).
//! - A tenant that becomes backlogged enters the tenant heap with key `max(F_t, V)`: an idle
//!   tenant banks no credit (a quantum of zero; "at most one quantum" of issue \[11\]).
//! - Admission takes the tenant with the smallest key (ties: the lower tenant index) and,
//!   inside it, the request S3-S5 choose from *that tenant's* lanes. With key `S` and the
//!   request's estimated prompt tokens `c` (at least 1): `V = max(V, S)`,
//!   `F_t = max(F_t, S) + c × SCALE / w_t`, and the tenant takes the key `F_t` if it still has requests queued (a
//!   heap update that moves it to its place; a key never changes without it).
//! - A request admitted without the tenant order (a grace hit, S8) is charged to its tenant:
//!   `F_t = max(F_t, V) + c × SCALE / w_t`; the tenant's key, if queued, stays as it is and the
//!   charge counts at its next admission (through `max(F_t, S)`). A retried request (SPEC 2.8)
//!   is not charged again.
//!
//! With no tenants configured (tenant 0 alone) the scheduler skips the charge: one tenant's
//! order needs no virtual time.
//!
//! So the order of tenants changes only when a tenant is served, enters or leaves, and no
//! request's key changes while it is queued (kthena's fairness heap re-prioritised items in
//! the heap, breaking same-user FIFO: kthena issues #1771 and #1772). With one tenant (none
//! configured: tenant 0) the tenant level always picks tenant 0, and the lanes are exactly
//! those of SPEC S3-S5.
//!
//! Two backlogged tenants' normalised service (admitted tokens / weight) differs by at most
//! one request's charge each (SFQ's fairness bound), so two saturating tenants with weights
//! 3:1 split admitted tokens 3:1 up to one maximal request.
//!
//! The tenant heap is an [`IndexedHeap`] of tenant indices, preallocated for every tenant of
//! the configuration (up to `generation::TENANTS_MAX`); per-tenant state is 40 bytes.

use super::heap::{HeapArena, IndexedHeap, NOT_IN_HEAP};

/// Virtual time per estimated prompt token at weight 1: a charge is `tokens × SCALE /
/// weight`, so weights up to 1,000 keep three significant digits.
pub const SCALE: u64 = 1000;

/// One tenant's fair-share and S4/S5 state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tenant {
    pub weight: u32,
    /// Position in the tenant heap, or [`NOT_IN_HEAP`] while it has nothing queued.
    position: u32,
    /// Virtual start of its next admission while in the heap.
    pub key: u64,
    /// Virtual finish of its last charged admission.
    pub finish: u64,
    /// Its boosted admissions so far (S4).
    pub boosted_admits: u64,
    /// Its non-forced boosted admissions in a row while its normal requests wait (S5).
    pub streak: u32,
}

impl Tenant {
    const NEW: Tenant = Tenant {
        weight: 1,
        position: NOT_IN_HEAP,
        key: 0,
        finish: 0,
        boosted_admits: 0,
        streak: 0,
    };
}

/// The tenants as the heap sees them: positions, ties by the lower index.
#[derive(Debug)]
struct Table(Vec<Tenant>);

impl HeapArena for Table {
    fn set_heap_position(&mut self, index: u32, position: u32) {
        self.0[index as usize].position = position;
    }
    fn tie_before(&self, a: u32, b: u32) -> bool {
        a < b
    }
}

/// Every tenant's state, the heap of backlogged tenants by key, and the virtual time.
#[derive(Debug)]
pub(crate) struct Fair {
    table: Table,
    heap: IndexedHeap,
    vtime: u64,
}

impl Fair {
    /// Tenant 0 (no tenant, weight 1) and one tenant per weight in `weights` (tenant `t` has
    /// `weights[t - 1]`).
    pub fn new(weights: &[u16]) -> Fair {
        let mut fair =
            Fair { table: Table(Vec::new()), heap: IndexedHeap::with_capacity(0), vtime: 0 };
        fair.grow(weights);
        fair
    }

    /// Tenants known: 1 + the configured ones.
    #[inline]
    pub fn len(&self) -> usize {
        self.table.0.len()
    }

    /// Room for every tenant of `weights` (a reload; never shrinks) and their new weights,
    /// which apply to later charges.
    pub fn grow(&mut self, weights: &[u16]) {
        let count = weights.len() + 1;
        if self.table.0.len() < count {
            self.table.0.resize(count, Tenant::NEW);
            self.heap.reserve_total(count);
        }
        for (tenant, &weight) in self.table.0[1..].iter_mut().zip(weights) {
            tenant.weight = u32::from(weight.max(1));
        }
    }

    #[inline]
    pub fn get(&self, tenant: u16) -> &Tenant {
        &self.table.0[usize::from(tenant)]
    }

    #[inline]
    pub fn get_mut(&mut self, tenant: u16) -> &mut Tenant {
        &mut self.table.0[usize::from(tenant)]
    }

    /// The backlogged tenant with the smallest key.
    #[inline]
    pub fn head(&self) -> Option<u16> {
        self.heap.peek().map(|t| t as u16)
    }

    /// The tenants with requests queued, in heap order.
    pub fn backlogged_tenants(&self) -> impl Iterator<Item = u16> + '_ {
        self.heap.indices().map(|t| t as u16)
    }

    /// Whether `tenant` is in the heap (has requests queued).
    #[inline]
    pub fn backlogged(&self, tenant: u16) -> bool {
        self.get(tenant).position != NOT_IN_HEAP
    }

    /// `tenant` became backlogged: it enters at `max(F_t, V)`.
    pub fn enter(&mut self, tenant: u16) {
        debug_assert!(!self.backlogged(tenant), "tenant {tenant} entered twice");
        let state = &mut self.table.0[usize::from(tenant)];
        state.key = state.finish.max(self.vtime);
        self.heap.push(state.key, u32::from(tenant), &mut self.table);
    }

    /// `tenant` has nothing queued any more.
    pub fn leave(&mut self, tenant: u16) {
        let position = self.get(tenant).position;
        debug_assert!(position != NOT_IN_HEAP, "tenant {tenant} left twice");
        self.heap.remove(position, &mut self.table);
    }

    /// A request of `tenant` costing `tokens` was admitted in tenant order; `queued` says
    /// whether the tenant still has requests queued.
    pub fn served(&mut self, tenant: u16, tokens: u64, queued: bool) {
        let state = &mut self.table.0[usize::from(tenant)];
        let position = state.position;
        debug_assert!(position != NOT_IN_HEAP, "tenant {tenant} served while not backlogged");
        let start = state.key;
        self.vtime = self.vtime.max(start);
        state.finish = state.finish.max(start).saturating_add(charge(tokens, state.weight));
        if queued {
            state.key = state.finish;
            let key = state.key;
            self.heap.update(position, key, &mut self.table);
        } else {
            self.heap.remove(position, &mut self.table);
        }
    }

    /// A request of `tenant` costing `tokens` was admitted outside tenant order (a grace hit).
    pub fn charge_direct(&mut self, tenant: u16, tokens: u64) {
        let state = &mut self.table.0[usize::from(tenant)];
        state.finish = state.finish.max(self.vtime).saturating_add(charge(tokens, state.weight));
    }

    /// Appends the first `k` backlogged tenants in key order to `out`; `frontier` is scratch.
    pub fn first_k(&self, k: usize, frontier: &mut Vec<u32>, out: &mut Vec<u32>) {
        self.heap.first_k(k, &self.table, frontier, out);
    }

    pub fn heap_bytes(&self) -> usize {
        self.table.0.capacity() * std::mem::size_of::<Tenant>() + self.heap.heap_bytes()
    }

    /// Checks the heap, and that exactly the tenants `queued` says have requests are in it.
    pub fn check_invariants(&self, queued: impl Fn(u16) -> u32) {
        self.heap.check_invariants(&self.table, |t| self.table.0[t as usize].position);
        for (t, state) in self.table.0.iter().enumerate() {
            let in_heap = state.position != NOT_IN_HEAP;
            assert_eq!(in_heap, queued(t as u16) > 0, "tenant {t} heap membership");
        }
    }
}

/// Virtual time of `tokens` (at least 1) at `weight`.
pub fn charge(tokens: u64, weight: u32) -> u64 {
    tokens.max(1).saturating_mul(SCALE) / u64::from(weight.max(1))
}
