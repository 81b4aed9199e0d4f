//! GiGPO advantages (spec §2.2, ARLArena `compute_gigpo_outcome_advantage`): an
//! episode-relative part plus a step-level part over anchor-state groups.
//!
//! Records are turns `k` of episodes `j` in group `uid`:
//! ```text
//! episode part : pool P_uid = { score_{j,k} : every turn of every episode in uid }
//!                A_ep = (score − mean_P)/(std_P + ε)   [mean_std_norm]   or  score − mean_P  [mean_norm]
//!                (|P| = 1 → mean 0, std 1)
//! step returns : G_{j,k} = r_{j,k} + γ·G_{j,k+1}          (γ = 0.95, backwards over the episode)
//! step groups  : turns of one uid whose anchor state (observation) is identical, or with
//!                the similarity option (ARL-Arena `enable_similarity`, threshold τ = 0.95):
//!                in record order, a turn joins the first cluster of its uid whose first
//!                observation `rep` has SequenceMatcher(None, obs, rep).ratio() ≥ τ, else it
//!                starts a cluster ([`similarity_groups`])
//!                A_step = (G − mean_g)/(std_g + ε)  or  G − mean_g   (singleton → A_step = 0)
//! A_{j,k}      = A_ep + ω·A_step                           (ω = 1)
//! ```
//! `score_{j,k} = R_j − c·[turn k invalid]` and `r_{j,k}` the step reward minus the same
//! penalty (the caller applies the penalty, [`crate::algo::dapo::invalid_action_penalty`]).
//!
//! Invariants:
//! - GG-1: a singleton step group contributes 0 (its mean is its own value).
//! - GG-2: with one turn per episode and every anchor distinct, GiGPO equals GRPO over episodes.
//! - GG-3: similarity groups never span two uids, and identical observations always share one.

use std::collections::HashMap;

use crate::algo::grpo::{group_advantages, group_stats};
use crate::algo::sequence_ratio::sequence_ratio;

/// How GiGPO normalises both parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GigpoNorm {
    /// Subtract the mean and divide by the std (ALFWorld SAMPO script).
    MeanStdNorm,
    /// Subtract the mean only (WebShop SAMPO script).
    MeanNorm,
}

/// One turn-record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRecord {
    /// Group id (task instance).
    pub uid: u64,
    /// Episode id.
    pub traj: u64,
    /// Anchor-state key: a hash of the observation the turn answered.
    pub anchor: u64,
    /// Episode score of this record (`R_j` minus this turn's penalty).
    pub score: f64,
    /// Step reward of this turn (minus its penalty).
    pub step_reward: f64,
}

/// ARL-Arena's default similarity threshold (`similarity_thresh`).
pub const SIMILARITY_THRESHOLD: f64 = 0.95;

/// Step-group keys by similarity (module doc, GG-3): record `i` gets the index of the first
/// record of its cluster. `uids[i]` and `texts[i]` are record `i`'s group and observation.
pub fn similarity_groups(uids: &[u64], texts: &[&str], threshold: f64) -> Vec<u64> {
    // Per uid, the clusters' first records, in creation order.
    let mut clusters: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut out = Vec::with_capacity(uids.len());
    for (i, (&uid, &text)) in uids.iter().zip(texts).enumerate() {
        let reps = clusters.entry(uid).or_default();
        let found = reps
            .iter()
            .copied()
            .find(|&r| sequence_ratio(text, texts[r]) >= threshold);
        out.push(match found {
            Some(r) => r as u64,
            None => {
                reps.push(i);
                i as u64
            }
        });
    }
    out
}

/// `G_k = r_k + γ·G_{k+1}` over one episode's step rewards.
pub fn discounted_returns(step_rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut out = vec![0.0; step_rewards.len()];
    let mut g = 0.0;
    for k in (0..step_rewards.len()).rev() {
        g = step_rewards[k] + gamma * g;
        out[k] = g;
    }
    out
}

/// GiGPO advantage of every record (module doc). Records of one episode must appear in turn
/// order; episodes may interleave.
pub fn gigpo_advantages(
    records: &[StepRecord],
    gamma: f64,
    omega: f64,
    norm: GigpoNorm,
    eps: f64,
) -> Vec<f64> {
    let std_norm = norm == GigpoNorm::MeanStdNorm;
    let scores: Vec<f64> = records.iter().map(|r| r.score).collect();
    let uids: Vec<u64> = records.iter().map(|r| r.uid).collect();
    let episode = group_advantages(&scores, &uids, std_norm, eps);
    // Step returns per episode, in record order.
    let mut by_traj: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        by_traj.entry((r.uid, r.traj)).or_default().push(i);
    }
    let mut returns = vec![0.0; records.len()];
    for idx in by_traj.values() {
        let rs: Vec<f64> = idx.iter().map(|&i| records[i].step_reward).collect();
        for (&i, g) in idx.iter().zip(discounted_returns(&rs, gamma)) {
            returns[i] = g;
        }
    }
    let keys: Vec<(u64, u64)> = records.iter().map(|r| (r.uid, r.anchor)).collect();
    let mut sizes: HashMap<(u64, u64), usize> = HashMap::new();
    for k in &keys {
        *sizes.entry(*k).or_default() += 1;
    }
    let stats = group_stats(&returns, &keys);
    (0..records.len())
        .map(|i| {
            let step = if sizes[&keys[i]] == 1 {
                0.0 // GG-1
            } else {
                let (mean, std) = stats[&keys[i]];
                if std_norm {
                    (returns[i] - mean) / (std + eps)
                } else {
                    returns[i] - mean
                }
            };
            episode[i] + omega * step
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::grpo::GRPO_EPS;

    fn rec(uid: u64, traj: u64, anchor: u64, score: f64, step_reward: f64) -> StepRecord {
        StepRecord {
            uid,
            traj,
            anchor,
            score,
            step_reward,
        }
    }

    #[test]
    fn discounted_returns_go_backwards() {
        let g = discounted_returns(&[0.0, 0.0, 1.0], 0.95);
        assert!((g[0] - 0.9025).abs() < 1e-12 && (g[1] - 0.95).abs() < 1e-12 && g[2] == 1.0);
    }

    #[test]
    fn gg2_one_turn_distinct_anchors_is_grpo() {
        let recs = [
            rec(1, 0, 10, 1.0, 1.0),
            rec(1, 1, 11, 0.0, 0.0),
            rec(1, 2, 12, 0.0, 0.0),
            rec(1, 3, 13, 1.0, 1.0),
        ];
        let a = gigpo_advantages(&recs, 0.95, 1.0, GigpoNorm::MeanStdNorm, GRPO_EPS);
        for (x, want) in a.iter().zip([0.866024, -0.866024, -0.866024, 0.866024]) {
            assert!((x - want).abs() < 2e-6, "{a:?}");
        }
    }

    #[test]
    fn shared_anchor_states_add_a_step_advantage() {
        // Two episodes, both start in anchor 7; episode 0 reaches reward on its second turn.
        // Episode scores: ep0 = 1 (two records), ep1 = 0 (two records) → pool [1,1,0,0].
        let recs = [
            rec(1, 0, 7, 1.0, 0.0),
            rec(1, 0, 8, 1.0, 1.0),
            rec(1, 1, 7, 0.0, 0.0),
            rec(1, 1, 9, 0.0, 0.0),
        ];
        let a = gigpo_advantages(&recs, 0.5, 1.0, GigpoNorm::MeanNorm, GRPO_EPS);
        // Episode part: ±0.5. Step part: anchor 7 group returns [0.5, 0] → ±0.25; anchors 8, 9
        // are singletons → 0 (GG-1).
        assert_eq!(a, vec![0.75, 0.5, -0.75, -0.5]);
    }
}
