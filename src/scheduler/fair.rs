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
//! The backlogged tenants are a *front* tenant and a 4-ary [`IndexedHeap`] of the others (4
//! levels for 100 tenants where a binary heap has 7), the front, when there is one, going before
//! every tenant in the heap. A tenant that enters before the head (typically at key `V`, the
//! smallest, after it drained) becomes the front without a sift (the old front, if any, moves
//! into the heap), and when the front is served and drains again it leaves without one: a
//! tenant whose every request is admitted as soon as it arrives (a light tenant, or a heavy
//! weight against even arrivals) costs no heap operation. The order is the same as one heap's:
//! the head is always the smallest (key, index). The heap is preallocated for every tenant of
//! the configuration (up to `generation::TENANTS_MAX`); per-tenant state is 40 bytes.

use super::heap::{HeapArena, IndexedHeap, NOT_IN_HEAP};

/// Virtual time per estimated prompt token at weight 1: a charge is `tokens × SCALE /
/// weight`, so weights up to 1,000 keep three significant digits.
pub const SCALE: u64 = 1000;

/// [`Tenant::position`] of the front tenant.
const FRONT: u32 = NOT_IN_HEAP - 1;

/// Children per node of the tenant heap.
const TENANT_HEAP_ARITY: usize = 4;

/// One tenant's fair-share and S4/S5 state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tenant {
    pub weight: u32,
    /// Position in the tenant heap, [`FRONT`] as the front tenant, or [`NOT_IN_HEAP`] while
    /// it has nothing queued.
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

/// Every tenant's state, the backlogged tenants by key (the front and the heap), and the
/// virtual time.
#[derive(Debug)]
pub(crate) struct Fair {
    table: Table,
    /// The front tenant, before every tenant in the heap, or [`NO_TENANT`].
    front: u32,
    heap: IndexedHeap<TENANT_HEAP_ARITY>,
    vtime: u64,
}

impl Fair {
    /// Tenant 0 (no tenant, weight 1) and one tenant per weight in `weights` (tenant `t` has
    /// `weights[t - 1]`).
    pub fn new(weights: &[u16]) -> Fair {
        let mut fair = Fair {
            table: Table(Vec::new()),
            front: NO_TENANT,
            heap: IndexedHeap::with_capacity(0),
            vtime: 0,
        };
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
        if self.front != NO_TENANT {
            return Some(self.front as u16);
        }
        self.heap.peek().map(|t| t as u16)
    }

    /// The tenants with requests queued: the front, then the heap in heap-array order.
    pub fn backlogged_tenants(&self) -> impl Iterator<Item = u16> + '_ {
        let front = (self.front != NO_TENANT).then_some(self.front);
        front.into_iter().chain(self.heap.indices()).map(|t| t as u16)
    }

    /// Whether tenant `tenant` with `key` goes before the top of the heap (or the heap is empty).
    fn before_heap(&self, key: u64, tenant: u32) -> bool {
        self.heap.peek().is_none_or(|top| {
            let top_key = self.table.0[top as usize].key;
            key < top_key || (key == top_key && tenant < top)
        })
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
        let (key, tenant) = (state.key, u32::from(tenant));
        let front = self.front;
        if front == NO_TENANT {
            if self.before_heap(key, tenant) {
                self.set_front(tenant);
            } else {
                self.heap.push(key, tenant, &mut self.table);
            }
            return;
        }
        let front_key = self.table.0[front as usize].key;
        if key < front_key || (key == front_key && tenant < front) {
            // The old front goes before every tenant in the heap: it sifts up to the top.
            self.heap.push(front_key, front, &mut self.table);
            self.set_front(tenant);
        } else {
            self.heap.push(key, tenant, &mut self.table);
        }
    }

    fn set_front(&mut self, tenant: u32) {
        self.front = tenant;
        self.table.0[tenant as usize].position = FRONT;
    }

    /// Takes `tenant` (backlogged) out of the order.
    fn take_out(&mut self, tenant: u16, position: u32) {
        if position == FRONT {
            self.front = NO_TENANT;
            self.table.0[usize::from(tenant)].position = NOT_IN_HEAP;
        } else {
            self.heap.remove(position, &mut self.table);
        }
    }

    /// `tenant` has nothing queued any more.
    pub fn leave(&mut self, tenant: u16) {
        let position = self.get(tenant).position;
        debug_assert!(position != NOT_IN_HEAP, "tenant {tenant} left twice");
        self.take_out(tenant, position);
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
        if !queued {
            return self.take_out(tenant, position);
        }
        state.key = state.finish;
        let key = state.key;
        if position == FRONT {
            // Served, the front takes its place among the others: back into the heap.
            self.front = NO_TENANT;
            if self.before_heap(key, u32::from(tenant)) {
                self.set_front(u32::from(tenant));
            } else {
                self.heap.push(key, u32::from(tenant), &mut self.table);
            }
        } else {
            // The key only grows (`finish >= start`): a sift down places it.
            self.heap.increase(position, key, &mut self.table);
        }
    }

    /// A request of `tenant` costing `tokens` was admitted outside tenant order (a grace hit).
    pub fn charge_direct(&mut self, tenant: u16, tokens: u64) {
        let state = &mut self.table.0[usize::from(tenant)];
        state.finish = state.finish.max(self.vtime).saturating_add(charge(tokens, state.weight));
    }

    /// Appends the first `k` backlogged tenants in key order to `out`; `frontier` is scratch.
    pub fn first_k(&self, k: usize, frontier: &mut Vec<u32>, out: &mut Vec<u32>) {
        if k > 0 && self.front != NO_TENANT {
            out.push(self.front);
            return self.heap.first_k(k - 1, &self.table, frontier, out);
        }
        self.heap.first_k(k, &self.table, frontier, out);
    }

    pub fn heap_bytes(&self) -> usize {
        self.table.0.capacity() * std::mem::size_of::<Tenant>() + self.heap.heap_bytes()
    }

    /// Checks the heap and the front (before the heap's top), and that exactly the tenants
    /// `queued` says have requests are in the order.
    pub fn check_invariants(&self, queued: impl Fn(u16) -> u32) {
        self.heap.check_invariants(&self.table, |t| self.table.0[t as usize].position);
        if self.front != NO_TENANT {
            let front = &self.table.0[self.front as usize];
            assert_eq!(front.position, FRONT, "the front tenant's position");
            assert!(self.before_heap(front.key, self.front), "the front after the heap's top");
        }
        for (t, state) in self.table.0.iter().enumerate() {
            let in_order = state.position != NOT_IN_HEAP;
            assert_eq!(in_order, queued(t as u16) > 0, "tenant {t} heap membership");
            let is_front = self.front == t as u32;
            assert_eq!(state.position == FRONT, is_front, "tenant {t} front");
        }
    }
}

/// [`Fair::front`] when there is no front tenant.
const NO_TENANT: u32 = u32::MAX;

/// Virtual time of `tokens` (at least 1) at `weight`.
pub fn charge(tokens: u64, weight: u32) -> u64 {
    tokens.max(1).saturating_mul(SCALE) / u64::from(weight.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of the tenant arrives.
        Arrive(u16),
        /// The head's request of `tokens` is admitted in tenant order.
        Admit(u64),
        /// A request of the tenant is admitted outside the order (a grace hit).
        Direct(u16, u64),
        /// A queued request of the tenant is cancelled.
        Cancel(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u16..6).prop_map(Op::Arrive),
            (1u64..2000).prop_map(Op::Admit),
            (0u16..6, 1u64..2000).prop_map(|(t, c)| Op::Direct(t, c)),
            (0u16..6).prop_map(Op::Cancel),
        ]
    }

    proptest! {
        /// The front slot and the heap give the order one sorted list gives: the head is
        /// always the smallest (key, tenant) of the tenants with requests queued, keys
        /// following the SFQ rules restated here.
        #[test]
        fn head_is_the_smallest_key_then_index(ops in proptest::collection::vec(op(), 0..400)) {
            let weights = [1u16, 3, 2, 1, 4];
            let mut fair = Fair::new(&weights);
            let weight = |t: u16| if t == 0 { 1 } else { u32::from(weights[usize::from(t) - 1]) };
            let (mut queued, mut key, mut finish, mut vtime) = ([0u32; 6], [0u64; 6], [0u64; 6], 0);
            for op in ops {
                match op {
                    Op::Arrive(t) => {
                        queued[usize::from(t)] += 1;
                        if queued[usize::from(t)] == 1 {
                            key[usize::from(t)] = finish[usize::from(t)].max(vtime);
                            fair.enter(t);
                        }
                    }
                    Op::Admit(tokens) => {
                        let Some(head) = fair.head() else { continue };
                        let h = usize::from(head);
                        let start = key[h];
                        vtime = vtime.max(start);
                        finish[h] = finish[h].max(start) + charge(tokens, weight(head));
                        queued[h] -= 1;
                        key[h] = finish[h];
                        fair.served(head, tokens, queued[h] > 0);
                    }
                    Op::Direct(t, tokens) => {
                        let f = &mut finish[usize::from(t)];
                        *f = (*f).max(vtime) + charge(tokens, weight(t));
                        fair.charge_direct(t, tokens);
                    }
                    Op::Cancel(t) => {
                        if queued[usize::from(t)] == 0 {
                            continue;
                        }
                        queued[usize::from(t)] -= 1;
                        if queued[usize::from(t)] == 0 {
                            fair.leave(t);
                        }
                    }
                }
                fair.check_invariants(|t| queued[usize::from(t)]);
                let expected = (0u16..6).filter(|&t| queued[usize::from(t)] > 0)
                    .min_by_key(|&t| (key[usize::from(t)], t));
                prop_assert_eq!(fair.head(), expected);
                let mut order: Vec<u16> = (0u16..6).filter(|&t| queued[usize::from(t)] > 0).collect();
                order.sort_by_key(|&t| (key[usize::from(t)], t));
                let (mut frontier, mut first) = (Vec::new(), Vec::new());
                fair.first_k(order.len(), &mut frontier, &mut first);
                let first: Vec<u16> = first.iter().map(|&t| t as u16).collect();
                prop_assert_eq!(first, order);
            }
        }
    }
}
