//! Dr. MAS agent-wise advantage normalisation (spec §8.2), and the vanilla multi-agent GRPO it
//! replaces.
//!
//! Each record is one agent invocation with `(uid, traj, agent, score)`:
//! ```text
//! vanilla  : per (uid, traj): s̄ = mean of its records' scores;  mean/std over {s̄} of the uid
//!            (one value per trajectory);  every record of traj gets (s̄ − mean)/(std + ε)
//! Dr. MAS  : key = (uid, agent);  pool = every record's score of that agent in that uid
//!            A_rec = (score − mean_pool)/(std_pool + ε)        (norm_adv_by_std_in_grpo)
//! ```
//! Statistics as GRPO's (unbiased std; singleton → mean 0, std 1), ε = 1e-6.
//!
//! Invariants:
//! - MA-1: with a single agent, Dr. MAS equals GRPO over records.
//! - MA-2: one agent's scores never change another agent's advantages in the same group.

use std::collections::HashMap;

use crate::algo::grpo::group_advantages;

/// Dr. MAS advantages, one per record (module doc).
pub fn drmas_advantages(
    scores: &[f64],
    uids: &[u64],
    agents: &[u32],
    normalize_std: bool,
    eps: f64,
) -> Vec<f64> {
    let keys: Vec<(u64, u32)> = uids.iter().copied().zip(agents.iter().copied()).collect();
    group_advantages(scores, &keys, normalize_std, eps)
}

/// Vanilla multi-agent GRPO (trajectory-averaged scores), one advantage per record.
pub fn multi_agent_grpo_advantages(
    scores: &[f64],
    uids: &[u64],
    trajs: &[u64],
    normalize_std: bool,
    eps: f64,
) -> Vec<f64> {
    let mut per_traj: HashMap<(u64, u64), (f64, f64)> = HashMap::new();
    for ((s, u), t) in scores.iter().zip(uids).zip(trajs) {
        let e = per_traj.entry((*u, *t)).or_insert((0.0, 0.0));
        e.0 += s;
        e.1 += 1.0;
    }
    let mut order: Vec<(u64, u64)> = per_traj.keys().copied().collect();
    order.sort_unstable();
    let means: Vec<f64> = order
        .iter()
        .map(|k| per_traj[k].0 / per_traj[k].1)
        .collect();
    let group_keys: Vec<u64> = order.iter().map(|k| k.0).collect();
    let adv = group_advantages(&means, &group_keys, normalize_std, eps);
    let by_traj: HashMap<(u64, u64), f64> = order.into_iter().zip(adv).collect();
    uids.iter()
        .zip(trajs)
        .map(|(u, t)| by_traj.get(&(*u, *t)).copied().unwrap_or(0.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::grpo::GRPO_EPS;

    #[test]
    fn dm1_single_agent_equals_grpo() {
        let s = [1.0, 0.0, 0.0, 1.0];
        let a = drmas_advantages(&s, &[3; 4], &[0; 4], true, GRPO_EPS);
        let g = group_advantages(&s, &[3u64; 4], true, GRPO_EPS);
        assert_eq!(a, g);
        assert!((a[0] - 0.866024).abs() < 2e-6);
    }

    #[test]
    fn dm2_agents_are_normalised_separately() {
        // Agent 0 scores around 10, agent 1 around 0: each is centred on its own mean.
        let s = [10.0, 12.0, 0.0, 1.0];
        let a = drmas_advantages(&s, &[7; 4], &[0, 0, 1, 1], false, GRPO_EPS);
        assert_eq!(a, vec![-1.0, 1.0, -0.5, 0.5]);
        let b = drmas_advantages(
            &[10.0, 12.0, 5.0, 9.0],
            &[7; 4],
            &[0, 0, 1, 1],
            false,
            GRPO_EPS,
        );
        assert_eq!(&a[..2], &b[..2]);
    }

    #[test]
    fn vanilla_multi_agent_averages_per_trajectory() {
        // Traj 1 records [1, 0] → 0.5; traj 2 record [0] → 0. Group mean 0.25, Dr.GRPO form.
        let a =
            multi_agent_grpo_advantages(&[1.0, 0.0, 0.0], &[5, 5, 5], &[1, 1, 2], false, GRPO_EPS);
        assert_eq!(a, vec![0.25, 0.25, -0.25]);
    }
}
