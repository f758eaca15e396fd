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
