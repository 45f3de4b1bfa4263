//! SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
//! OOPSLA 2014), as in Vigna's reference `splitmix64.c`: a 64-bit state advanced by the odd
//! constant [`GAMMA`], and each state put through a bijective finaliser (Stafford's "Mix13"
//! variant of MurmurHash3's `fmix64`). Fast and statistically good; not cryptographic.
//!
//! The crate uses it two ways, defined once here:
//! - [`mix`], a seedless hash of a 64-bit word: the scheduler's request-id table
//!   (`scheduler::queue`), the simulated engine's block chain and token ids (`sim::cache`,
//!   `sim::tokens`) and the bench's synthetic text (`bench::workload`);
//! - [`SplitMix64`], a seeded sequence: arrivals and think times of synthetic workloads, and
//!   the random choices of tests and benches.
//!
//! Their outputs are part of what a seed means (the same workload, the same simulated cache,
//! the same answer text for a seed), so the constants must not change.

/// The increment of the state: 2^64 divided by the golden ratio, rounded to odd.
pub const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output for the state `x`: `x + GAMMA` through the finaliser, which is
/// `SplitMix64::new(x).next_u64()`. A bijection of `u64` whose output bits each depend on every
/// input bit, so sequential inputs give unrelated outputs.
pub const fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded SplitMix64 sequence: the `n`th output (from 0) is `mix(seed + n * GAMMA)`.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    /// The state the next output is mixed from.
    state: u64,
}

impl SplitMix64 {
    /// The sequence of `seed`: any value, 0 included.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next output, uniform over `u64`.
    pub fn next_u64(&mut self) -> u64 {
        let output = mix(self.state);
        self.state = self.state.wrapping_add(GAMMA);
        output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_zero_gives_the_reference_outputs() {
        // The first outputs of Vigna's splitmix64.c with x = 0.
        let mut rng = SplitMix64::new(0);
        let outputs = [rng.next_u64(), rng.next_u64(), rng.next_u64()];
        assert_eq!(outputs, [0xe220_a839_7b1d_cdaf, 0x6e78_9e6a_a1b9_65f4, 0x06c4_5d18_8009_454f]);
    }

    #[test]
    fn the_nth_output_is_mix_of_the_seed_plus_n_gammas() {
        for seed in [0, 1, 7, GAMMA, u64::MAX] {
            let mut rng = SplitMix64::new(seed);
            for n in 0..100u64 {
                assert_eq!(rng.next_u64(), mix(seed.wrapping_add(n.wrapping_mul(GAMMA))));
            }
        }
    }
}
