//! GRPO outcome advantages (spec §1.4, verl `compute_grpo_outcome_advantage`) and Dr. GRPO
//! (§1.5), over any grouping key — the building block of Dr. MAS, RTPO and GiGPO too.
//!
//! Per group `g` of scores sharing a key:
//! ```text
//! |g| = 1 :  mean = 0, std = 1                 (a singleton keeps its raw score — verl)
//! otherwise: mean = mean(s), std = sqrt(Σ(s − mean)² / (n − 1))      (unbiased, torch.std)
//! A_i = (s_i − mean) / (std + ε)   normalize_std (GRPO),   A_i = s_i − mean   (Dr. GRPO)
//! ```
//! ε = 1e-6. Token advantages are `A_{i,t} = A_i·m_{i,t}`.
//!
//! Segments (RB-4): an episode split into several trajectories counts once in its group. Its
//! score in the group's mean and std is the mean of its segments' scores, and each segment is
//! normalised by that group: `A_i = (s_i − mean_g) / (std_g + ε)` ([`episode_advantages`]). With
//! one trajectory per episode this is `group_advantages`.
//!
//! Invariants:
//! - AD-1: a group whose scores are all equal (size ≥ 2) gets advantage 0 for every member.
//! - GR-1: groups are independent: changing one group's scores never changes another's
//!   advantages.

use std::collections::HashMap;
use std::hash::Hash;

/// GRPO's ε (verl 1e-6).
pub const GRPO_EPS: f64 = 1e-6;

/// Mean and std of each group as GRPO defines them (module doc).
pub fn group_stats<K: Hash + Eq + Clone>(scores: &[f64], keys: &[K]) -> HashMap<K, (f64, f64)> {
    let mut groups: HashMap<K, Vec<f64>> = HashMap::new();
    for (s, k) in scores.iter().zip(keys) {
        groups.entry(k.clone()).or_default().push(*s);
    }
    groups
        .into_iter()
        .map(|(k, xs)| {
            if xs.len() == 1 {
                return (k, (0.0, 1.0));
            }
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (k, (mean, var.sqrt()))
        })
        .collect()
}

/// Group-relative advantages of `scores` grouped by `keys` (parallel slices; module doc).
/// Extra scores or keys beyond the shorter slice are ignored.
pub fn group_advantages<K: Hash + Eq + Clone>(
    scores: &[f64],
    keys: &[K],
    normalize_std: bool,
    eps: f64,
) -> Vec<f64> {
    let stats = group_stats(scores, keys);
    scores
        .iter()
        .zip(keys)
        .map(|(s, k)| relative(*s, stats.get(k), normalize_std, eps))
        .collect()
}

/// A score relative to its group's `(mean, std)` (module doc); no stats = a singleton's.
fn relative(s: f64, stats: Option<&(f64, f64)>, normalize_std: bool, eps: f64) -> f64 {
    let (mean, std) = stats.copied().unwrap_or((0.0, 1.0));
    match normalize_std {
        true => (s - mean) / (std + eps),
        false => s - mean,
    }
}

/// GRPO over episodes that may be split into segments (module doc, RB-4): `episodes[i]` is the
/// episode row i belongs to; each episode is one sample of its group (the group of its first
/// row), scoring the mean of its rows' scores.
pub fn episode_advantages(
    scores: &[f64],
    keys: &[u64],
    episodes: &[u64],
    normalize_std: bool,
    eps: f64,
) -> Vec<f64> {
    let mut index: HashMap<u64, usize> = HashMap::new();
    let (mut sums, mut counts, mut ep_keys) = (Vec::new(), Vec::new(), Vec::new());
    for ((s, k), e) in scores.iter().zip(keys).zip(episodes) {
        let j = *index.entry(*e).or_insert_with(|| {
            sums.push(0.0);
            counts.push(0.0);
            ep_keys.push(*k);
            sums.len() - 1
        });
        sums[j] += s;
        counts[j] += 1.0;
    }
    let means: Vec<f64> = sums.iter().zip(&counts).map(|(s, n)| s / n).collect();
    let stats = group_stats(&means, &ep_keys);
    scores
        .iter()
        .zip(episodes)
        .map(|(s, e)| {
            let group = index.get(e).and_then(|&j| stats.get(&ep_keys[j]));
            relative(*s, group, normalize_std, eps)
        })
        .collect()
}

/// GRPO on f32 rewards and u64 group ids (the trajectory-level form the learner uses).
pub fn grpo_advantages(
    rewards: &[f32],
    group_ids: &[u64],
    normalize_std: bool,
    eps: f32,
) -> Vec<f32> {
    let scores: Vec<f64> = rewards.iter().map(|&r| f64::from(r)).collect();
    group_advantages(&scores, group_ids, normalize_std, f64::from(eps))
        .into_iter()
        .map(|a| a as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < tol, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn spec_vectors() {
        let g = [0u64; 4];
        close(
            &grpo_advantages(&[1.0, 0.0, 0.0, 1.0], &g, true, 1e-6),
            &[0.866024, -0.866024, -0.866024, 0.866024],
            2e-6,
        );
        close(
            &grpo_advantages(&[1.0, 0.0, 0.0, 1.0], &g, false, 1e-6),
            &[0.5, -0.5, -0.5, 0.5],
            1e-7,
        );
        close(
            &grpo_advantages(&[1.0, 0.0, 0.0, 0.0], &g, true, 1e-6),
            &[1.499997, -0.499999, -0.499999, -0.499999],
            2e-6,
        );
    }

    #[test]
    fn segments_count_once_per_episode() {
        // Episodes 10 (two segments, reward 1), 11 and 12 (reward 0): the group is [1, 0, 0],
        // not [1, 1, 0, 0].
        let scores = [1.0, 1.0, 0.0, 0.0];
        let split = episode_advantages(&scores, &[7; 4], &[10, 10, 11, 12], true, GRPO_EPS);
        let whole = group_advantages(&[1.0, 0.0, 0.0], &[7; 3], true, GRPO_EPS);
        assert_eq!(split, vec![whole[0], whole[0], whole[1], whole[2]]);
        // One trajectory per episode: exactly group_advantages.
        let (s, k) = ([0.5, 0.0, 1.0, 0.25], [1, 1, 2, 2]);
        assert_eq!(
            episode_advantages(&s, &k, &[0, 1, 2, 3], false, GRPO_EPS),
            group_advantages(&s, &k, false, GRPO_EPS)
        );
        // A segment's own penalty stays its own; the group sees the episode's mean.
        let a = episode_advantages(&[1.0, 0.5, 0.0], &[3; 3], &[5, 5, 6], false, GRPO_EPS);
        assert_eq!(a, vec![1.0 - 0.375, 0.5 - 0.375, -0.375]);
    }

    #[test]
    fn singleton_group_keeps_its_raw_score() {
        let s = grpo_advantages(&[0.25], &[1], true, 1e-6);
        assert!((s[0] - 0.25 / (1.0 + 1e-6)).abs() < 1e-7);
        assert_eq!(grpo_advantages(&[0.25], &[1], false, 1e-6), vec![0.25]);
    }

    #[test]
    fn gr1_groups_are_independent() {
        let a = grpo_advantages(&[0.7, 0.7, 0.7, 1.0, 0.0], &[5, 5, 5, 9, 9], true, 1e-6);
        let b = grpo_advantages(&[0.7, 0.7, 0.7, 3.0, -1.0], &[5, 5, 5, 9, 9], true, 1e-6);
        assert_eq!(&a[..3], &b[..3]);
        assert!(a[3] > 0.0 && a[4] < 0.0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// AD-1: a constant-reward group has advantage 0, with or without std normalisation.
        #[test]
        fn ad1_constant_reward_group_advantages_are_zero(
            c in -10.0f32..10.0, n in 2usize..9, others in proptest::collection::vec(-3.0f32..3.0, 0..6), norm in proptest::bool::ANY,
        ) {
            let mut rewards = vec![c; n];
            let mut ids = vec![1u64; n];
            rewards.extend(&others);
            ids.extend(std::iter::repeat_n(2u64, others.len()));
            let a = grpo_advantages(&rewards, &ids, norm, 1e-6);
            prop_assert!(a[..n].iter().all(|&x| x.abs() < 1e-6), "{:?}", a);
        }
    }
}
