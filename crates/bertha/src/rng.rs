//! Seeded random streams: every draw of a run (initialisation, data order,
//! masks, dropout) comes from a generator named by `(seed, purpose, step)`,
//! so a run resumed at any step repeats an uninterrupted one exactly.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A generator for one purpose at one step: the same `(seed, purpose,
/// step)` always gives the same stream, whatever happened before.
pub fn rng_for(seed: u64, purpose: u64, step: u64) -> StdRng {
    let mut x = seed
        ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ step.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    // splitmix64 finaliser: nearby inputs give unrelated seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    StdRng::seed_from_u64(x ^ (x >> 31))
}

/// The first number of that stream, as a seed for another generator
/// (dropout's).
pub fn seed_for(seed: u64, purpose: u64, step: u64) -> u64 {
    rng_for(seed, purpose, step).random()
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))`,
/// element for element: PyTorch's CPU generator (MT19937 seeded as
/// `std::mt19937(seed)`) and its Fisher–Yates loop. transformers' Trainer
/// and sentence-transformers draw each epoch's order this way (seed + epoch),
/// so a bertha run with the same seed reads the same batches as theirs.
pub fn torch_randperm(n: usize, seed: u64) -> Vec<usize> {
    let mut mt = Mt19937::new(seed);
    let mut r: Vec<usize> = (0..n).collect();
    // torch draws 32 bits below this size and 64 above it.
    let small = (n as u64) < u64::from(u32::MAX / 20);
    for i in 0..n.saturating_sub(1) {
        let draw = if small {
            u64::from(mt.next_u32())
        } else {
            (u64::from(mt.next_u32()) << 32) | u64::from(mt.next_u32())
        };
        let z = (draw % (n - i) as u64) as usize;
        r.swap(i, i + z);
    }
    r
}

/// The 32-bit Mersenne Twister (`std::mt19937`), as PyTorch's CPU
/// generator runs it.
struct Mt19937 {
    state: [u32; 624],
    next: usize,
}

impl Mt19937 {
    fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for j in 1..624 {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        Self { state, next: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.next >= 624 {
            for k in 0..624 {
                let y = (self.state[k] & 0x8000_0000) | (self.state[(k + 1) % 624] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.state[k] = self.state[(k + 397) % 624] ^ (y >> 1) ^ mag;
            }
            self.next = 0;
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against `torch.randperm(n, generator=torch.Generator().manual_seed(s))`
    /// from PyTorch 2 (its first and last elements).
    #[test]
    fn torch_randperm_is_pytorchs() {
        assert_eq!(torch_randperm(10, 1), [5, 6, 1, 2, 0, 8, 9, 3, 7, 4]);
        let p = torch_randperm(5749, 0);
        assert_eq!(p[..5], [52, 4948, 905, 19, 2597]);
        assert_eq!(p[5746..], [961, 3381, 3164]);
        assert_eq!(torch_randperm(5749, 3)[..5], [2976, 2241, 4170, 2268, 3764]);
        let q = torch_randperm(100_000, 42);
        assert_eq!(q[..5], [37542, 60279, 68544, 70051, 15790]);
        assert_eq!(q[99_997..], [44288, 94835, 53243]);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert!(sorted.iter().enumerate().all(|(i, &v)| i == v));
        assert!(torch_randperm(0, 0).is_empty() && torch_randperm(1, 0) == [0]);
    }
}
