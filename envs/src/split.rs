//! Disjoint train and held-out eval task seeds.
//!
//! `task_seed(split, index) = mix64(2·index + bit(split))`, where `mix64` is the splitmix64
//! output function (an increment by the golden gamma, then the xor-shift-multiply finalizer),
//! a bijection of `u64`, and `bit(Train) = 0`, `bit(Eval) = 1`.
//!
//! Invariants:
//! - SPL-1 For indices below 2^63, `task_seed` is injective over `(split, index)`: no train seed
//!   equals an eval seed, and no two indices of one split share a seed. (Indices are taken
//!   modulo 2^63.)
//! - SPL-2 The split is recoverable from the seed alone: `Split::of_seed(task_seed(s, i)) == s`.
//!   Any `u64` has a split this way, so environments can key task generation on it.
//! - SPL-3 Seeds are disjoint, and expressions are too: `calc` keeps a held-out bucket of
//!   expressions (fingerprint ≡ 0 mod 10) that only eval seeds generate and that eval seeds
//!   exclusively generate (see `calc`), so a held-out task is never a training task.
//! - SPL-4 `task_index(task_seed(s, i)) == (s, i)` for indices below 2^63.

use serde::{Deserialize, Serialize};

/// Which task population a seed belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Split {
    /// Tasks the policy trains on.
    Train,
    /// Held-out tasks for evaluation.
    Eval,
}

impl Split {
    /// The split a seed belongs to (SPL-2): the low bit of the inverse mix.
    pub fn of_seed(seed: u64) -> Split {
        if unmix64(seed) & 1 == 0 {
            Split::Train
        } else {
            Split::Eval
        }
    }

    fn bit(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::Eval => 1,
        }
    }
}

/// The `(split, index)` a seed was made from: the inverse of [`task_seed`] (SPL-4), so an
/// env whose tasks are rows of a file can map a seed back to its position in the data stream.
pub fn task_index(seed: u64) -> (Split, u64) {
    let x = unmix64(seed);
    (Split::of_seed(seed), x >> 1)
}

/// The seed of the `index`-th task of `split` (SPL-1).
pub fn task_seed(split: Split, index: u64) -> u64 {
    mix64(index.wrapping_mul(2) | split.bit())
}

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
const M1: u64 = 0xbf58_476d_1ce4_e5b9;
const M2: u64 = 0x94d0_49bb_1331_11eb;
const M1_INV: u64 = inverse_mod_2_64(M1);
const M2_INV: u64 = inverse_mod_2_64(M2);

/// The splitmix64 output function: a bijection of `u64` with good avalanche.
pub(crate) fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(M1);
    z = (z ^ (z >> 27)).wrapping_mul(M2);
    z ^ (z >> 31)
}

/// The inverse of [`mix64`].
fn unmix64(z: u64) -> u64 {
    let mut x = unxorshift(z, 31).wrapping_mul(M2_INV);
    x = unxorshift(x, 27).wrapping_mul(M1_INV);
    unxorshift(x, 30).wrapping_sub(GAMMA)
}

/// Inverts `y = x ^ (x >> s)`; each round fixes `s` more top bits.
fn unxorshift(y: u64, s: u32) -> u64 {
    let mut x = y;
    for _ in 0..(64 / s + 1) {
        x = y ^ (x >> s);
    }
    x
}

/// Multiplicative inverse of an odd `a` modulo 2^64 by Newton's iteration
/// (`x ← x(2 − a·x)` doubles the correct low bits; `x = a` is right to 3 bits).
const fn inverse_mod_2_64(a: u64) -> u64 {
    let mut x = a;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

#[cfg(test)]
mod tests {
    #[test]
    fn sp4_task_index_inverts_task_seed() {
        for split in [Split::Train, Split::Eval] {
            for i in [0u64, 1, 2, 41, 1 << 40, (1 << 63) - 1] {
                assert_eq!(task_index(task_seed(split, i)), (split, i));
            }
        }
    }

    use super::*;
    use std::collections::HashSet;

    #[test]
    fn inverses_are_inverses() {
        assert_eq!(M1.wrapping_mul(M1_INV), 1);
        assert_eq!(M2.wrapping_mul(M2_INV), 1);
    }

    #[test]
    fn unmix_inverts_mix() {
        for x in [0u64, 1, 2, 12345, u64::MAX, 1 << 63, 0xdead_beef_cafe_babe] {
            assert_eq!(unmix64(mix64(x)), x);
            assert_eq!(mix64(unmix64(x)), x);
        }
    }

    #[test]
    fn sp1_train_and_eval_seeds_are_disjoint() {
        let n = 100_000u64;
        let mut seen = HashSet::with_capacity(2 * n as usize);
        for i in 0..n {
            assert!(
                seen.insert(task_seed(Split::Train, i)),
                "train seed {i} repeats"
            );
        }
        for i in 0..n {
            assert!(
                seen.insert(task_seed(Split::Eval, i)),
                "eval seed {i} hits a train seed"
            );
        }
    }

    #[test]
    fn sp2_split_is_recoverable_from_the_seed() {
        for i in (0..10_000u64).chain([u64::MAX / 2, 1 << 62]) {
            assert_eq!(Split::of_seed(task_seed(Split::Train, i)), Split::Train);
            assert_eq!(Split::of_seed(task_seed(Split::Eval, i)), Split::Eval);
        }
    }

    #[test]
    fn arbitrary_seeds_fall_in_both_splits() {
        let evals = (0..10_000u64)
            .filter(|&s| Split::of_seed(s) == Split::Eval)
            .count();
        assert!((4_000..6_000).contains(&evals), "{evals}");
    }
}
