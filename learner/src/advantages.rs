//! Advantage estimators (spec §1.3, §1.4): GRPO group-normalised outcome advantages and GAE
//! over model tokens with observation tokens skipped.
//!
//! GRPO (verl `compute_grpo_outcome_advantage`), per group of trajectories sharing a group id:
//! ```text
//! |group| = 1 :  mean = 0, std = 1               (a singleton keeps its raw score)
//! otherwise   :  mean = mean(r), std = sqrt(Σ(r − mean)² / (n − 1))   (unbiased)
//! A_i = (r_i − mean) / (std + eps)   if normalize_std,   else   r_i − mean   (Dr. GRPO)
//! ```
//! GAE (verl `compute_gae_advantage_return`), backwards over t = T−1 … 0 with nextV = 0, g = 0:
//! ```text
//! δ_t = r_t + γ·nextV − V_t ;  if m_t = 1: g ← δ_t + γλ·g, nextV ← V_t ;  A_t = g
//! returns_t = A_t + V_t
//! ```
//!
//! Invariants:
//! - AD-1: a group whose rewards are all equal (size ≥ 2) gets advantage 0 for every member.
//! - AD-2: GAE reads rewards and values only at mask-1 positions; observation tokens (mask 0)
//!   are skipped, so the next model token's value bootstraps across them. Advantages and
//!   returns are 0 wherever the mask is 0 (verl would carry g there; SAO's choice, §10).
//! - AD-3: GAE runs on the CPU in f64 and returns tensors of the values' kind and device.
//! - AD-4: `masked_whiten` uses mean and unbiased variance over mask-1 entries of the whole
//!   batch, `(x − mean)/sqrt(var + 1e-8)`, and zeroes mask-0 entries.

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;

/// Per-trajectory GRPO advantages (see the module doc). `rewards` and `group_ids` are parallel.
///
/// # Panics
/// When the two slices differ in length (a caller bug: they come from the same batch).
pub fn grpo_advantages(rewards: &[f32], group_ids: &[u64], normalize_std: bool, eps: f32) -> Vec<f32> {
    assert_eq!(rewards.len(), group_ids.len(), "grpo_advantages: one group id per reward");
    let mut groups: HashMap<u64, Vec<f64>> = HashMap::new();
    for (&r, &g) in rewards.iter().zip(group_ids) {
        groups.entry(g).or_default().push(f64::from(r));
    }
    let stats: HashMap<u64, (f64, f64)> = groups
        .into_iter()
        .map(|(g, rs)| {
            let n = rs.len() as f64;
            if rs.len() == 1 {
                return (g, (0.0, 1.0));
            }
            let mean = rs.iter().sum::<f64>() / n;
            let var = rs.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (g, (mean, var.sqrt()))
        })
        .collect();
    rewards
        .iter()
        .zip(group_ids)
        .map(|(&r, g)| {
            let (mean, std) = stats[g];
            let centred = f64::from(r) - mean;
            let a = if normalize_std { centred / (std + f64::from(eps)) } else { centred };
            a as f32
        })
        .collect()
}

fn to_rows(t: &Tensor) -> Result<Vec<Vec<f64>>, LearnerError> {
    let t = t.f_detach()?.f_to_device(Device::Cpu)?.f_to_kind(Kind::Double)?;
    Ok(Vec::<Vec<f64>>::try_from(&t)?)
}

fn from_rows(rows: &[Vec<f64>], like: &Tensor) -> Result<Tensor, LearnerError> {
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    let size = like.size();
    Ok(Tensor::f_from_slice(&flat)?.f_reshape(size.as_slice())?.f_to_kind(like.kind())?.f_to_device(like.device())?)
}

/// GAE over model tokens (see the module doc, AD-2, AD-3). All inputs `[B, T]`; returns
/// `(advantages, returns)`, both 0 where `mask` is 0.
pub fn gae(rewards: &Tensor, values: &Tensor, mask: &Tensor, gamma: f64, lam: f64) -> (Tensor, Tensor) {
    match try_gae(rewards, values, mask, gamma, lam) {
        Ok(out) => out,
        Err(e) => panic!("gae: {e}"),
    }
}

/// Fallible form of [`gae`]: checks that the three tensors have the same 2-D shape.
pub fn try_gae(rewards: &Tensor, values: &Tensor, mask: &Tensor, gamma: f64, lam: f64) -> Result<(Tensor, Tensor), LearnerError> {
    let size = values.size();
    if size.len() != 2 || rewards.size() != size || mask.size() != size {
        return Err(LearnerError::input(format!(
            "gae needs equal [B, T] shapes, got rewards {:?}, values {:?}, mask {:?}",
            rewards.size(),
            size,
            mask.size()
        )));
    }
    let (r, v, m) = (to_rows(rewards)?, to_rows(values)?, to_rows(mask)?);
    let mut adv = vec![vec![0.0; size[1] as usize]; size[0] as usize];
    let mut ret = adv.clone();
    for b in 0..adv.len() {
        let (mut next_v, mut g) = (0.0, 0.0);
        for t in (0..adv[b].len()).rev() {
            if m[b][t] == 0.0 {
                continue;
            }
            let delta = r[b][t] + gamma * next_v - v[b][t];
            g = delta + gamma * lam * g;
            next_v = v[b][t];
            adv[b][t] = g;
            ret[b][t] = g + v[b][t];
        }
    }
    Ok((from_rows(&adv, values)?, from_rows(&ret, values)?))
}

/// `(x − mean)/sqrt(var + 1e-8)` with statistics over mask-1 entries, mask-0 entries set to 0
/// (AD-4). With fewer than two masked entries the variance is taken as 0.
pub fn masked_whiten(x: &Tensor, mask: &Tensor) -> Tensor {
    let keep = mask.gt(0.0);
    let n = mask.gt(0.0).sum(Kind::Double).double_value(&[]);
    if n == 0.0 {
        return x.zeros_like();
    }
    let xs = x.where_self(&keep, &x.zeros_like());
    let mean = xs.sum(Kind::Double) / n;
    let centred = (x.to_kind(Kind::Double) - &mean).where_self(&keep, &Tensor::zeros([], (Kind::Double, x.device())));
    let var = if n > 1.0 { centred.square().sum(Kind::Double) / (n - 1.0) } else { mean.zeros_like() };
    (centred * (var + 1e-8).rsqrt()).to_kind(x.kind())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < tol, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn grpo_matches_spec_vectors() {
        let g = [0u64; 4];
        close(&grpo_advantages(&[1.0, 0.0, 0.0, 1.0], &g, true, 1e-6), &[0.866024, -0.866024, -0.866024, 0.866024], 2e-6);
        close(&grpo_advantages(&[1.0, 0.0, 0.0, 1.0], &g, false, 1e-6), &[0.5, -0.5, -0.5, 0.5], 1e-7);
        close(&grpo_advantages(&[1.0, 0.0, 0.0, 0.0], &g, true, 1e-6), &[1.499997, -0.499999, -0.499999, -0.499999], 2e-6);
    }

    #[test]
    fn ad1_grpo_constant_group_is_zero_and_groups_are_independent() {
        let a = grpo_advantages(&[0.7, 0.7, 0.7, 1.0, 0.0], &[5, 5, 5, 9, 9], true, 1e-6);
        assert_eq!(&a[..3], &[0.0, 0.0, 0.0]);
        assert!(a[3] > 0.0 && a[4] < 0.0);
        // A singleton keeps its raw score (spec §1.4: mean 0, std 1).
        let s = grpo_advantages(&[0.25], &[1], true, 1e-6);
        assert!((s[0] - 0.25 / (1.0 + 1e-6)).abs() < 1e-7);
    }

    #[test]
    fn gae_matches_spec_vector() {
        // tokens [a,a,o,o,a], V=[.5,.6,0,0,.8], reward 1 on last, γ=1, λ=0.95.
        let mask = Tensor::from_slice(&[1f32, 1., 0., 0., 1.]).view([1, 5]);
        let values = Tensor::from_slice(&[0.5f32, 0.6, 0.0, 0.0, 0.8]).view([1, 5]);
        let rewards = Tensor::from_slice(&[0f32, 0., 0., 0., 1.]).view([1, 5]);
        let (adv, ret) = gae(&rewards, &values, &mask, 1.0, 0.95);
        let adv = Vec::<f32>::try_from(&adv.get(0)).expect("adv");
        close(&adv, &[0.4705, 0.39, 0.0, 0.0, 0.2], 1e-6);
        let ret = Vec::<f32>::try_from(&ret.get(0)).expect("ret");
        close(&ret, &[0.9705, 0.99, 0.0, 0.0, 1.0], 1e-6);
    }

    #[test]
    fn ad2_gae_ignores_masked_rewards_and_values() {
        let mask = Tensor::from_slice(&[1f32, 0., 1.]).view([1, 3]);
        let a = Tensor::from_slice(&[0f32, 5., 1.]).view([1, 3]);
        let v1 = Tensor::from_slice(&[0.1f32, 9., 0.3]).view([1, 3]);
        let v2 = Tensor::from_slice(&[0.1f32, -4., 0.3]).view([1, 3]);
        let b = Tensor::from_slice(&[0f32, -7., 1.]).view([1, 3]);
        let (x, _) = gae(&a, &v1, &mask, 0.9, 0.8);
        let (y, _) = gae(&b, &v2, &mask, 0.9, 0.8);
        assert_eq!(Vec::<f32>::try_from(&x.get(0)).expect("x"), Vec::<f32>::try_from(&y.get(0)).expect("y"));
    }

    #[test]
    fn ad4_whiten_has_zero_mean_unit_variance_on_mask() {
        let x = Tensor::from_slice(&[1f32, 2., 100., 3.]).view([1, 4]);
        let m = Tensor::from_slice(&[1f32, 1., 0., 1.]).view([1, 4]);
        let w = Vec::<f32>::try_from(&masked_whiten(&x, &m).get(0)).expect("w");
        close(&w, &[-1.0, 0.0, 0.0, 1.0], 1e-6);
    }
}
