//! GAE over model tokens with observation tokens skipped (spec §1.3, §3.2; verl
//! `compute_gae_advantage_return`, SAO's skip-observation GAE), and optional whitening.
//!
//! Backwards over t = T−1 … 0 with nextV = 0, g = 0, per row b with its own λ_b:
//! ```text
//! δ_t = r_t + γ·nextV − V_t ;  if m_t = 1: g ← δ_t + γλ_b·g, nextV ← V_t ;  A_t = g
//! returns_t = A_t + V_t
//! ```
//! Whitening (verl `masked_whiten`): `(A − mean)/sqrt(var + 1e-8)` over mask-1 entries of the
//! whole batch, variance unbiased.
//!
//! Invariants:
//! - AD-2: GAE reads rewards and values only at mask-1 positions; observation tokens (mask 0)
//!   are skipped, so the next model token's value bootstraps across them. Advantages and
//!   returns are 0 wherever the mask is 0 (verl would carry g there; SAO's choice, §10).
//! - AD-3: GAE runs on the CPU in f64 and returns tensors of the values' kind and device.
//! - AD-4: `masked_whiten` uses mean and unbiased variance over mask-1 entries of the whole
//!   batch, `(x − mean)/sqrt(var + 1e-8)`, and zeroes mask-0 entries.

use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;

fn to_rows(t: &Tensor) -> Result<Vec<Vec<f64>>, LearnerError> {
    let t = t
        .f_detach()?
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Double)?;
    Ok(Vec::<Vec<f64>>::try_from(&t)?)
}

fn from_rows(rows: &[Vec<f64>], like: &Tensor) -> Result<Tensor, LearnerError> {
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    let size = like.size();
    Ok(Tensor::f_from_slice(&flat)?
        .f_reshape(size.as_slice())?
        .f_to_kind(like.kind())?
        .f_to_device(like.device())?)
}

/// GAE over model tokens with one λ for every row (module doc, AD-2, AD-3). All inputs
/// `[B, T]`; returns `(advantages, returns)`, both 0 where `mask` is 0.
///
/// # Panics
/// When the shapes differ (use [`try_gae`] for unchecked input).
pub fn gae(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lam: f64,
) -> (Tensor, Tensor) {
    match try_gae(rewards, values, mask, gamma, &[lam]) {
        Ok(out) => out,
        Err(e) => panic!("gae: {e}"),
    }
}

/// Fallible GAE: checks that the three tensors have the same 2-D shape. `lams` holds one λ
/// per row (SAO's length-adaptive λ) or a single λ for all rows.
pub fn try_gae(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lams: &[f64],
) -> Result<(Tensor, Tensor), LearnerError> {
    let size = values.size();
    if size.len() != 2 || rewards.size() != size || mask.size() != size {
        return Err(LearnerError::input(format!(
            "gae needs equal [B, T] shapes, got rewards {:?}, values {:?}, mask {:?}",
            rewards.size(),
            size,
            mask.size()
        )));
    }
    if lams.len() != 1 && lams.len() != size[0] as usize {
        return Err(LearnerError::input(format!(
            "gae needs 1 or {} λ values, got {}",
            size[0],
            lams.len()
        )));
    }
    let (r, v, m) = (to_rows(rewards)?, to_rows(values)?, to_rows(mask)?);
    let mut adv = vec![vec![0.0; size[1] as usize]; size[0] as usize];
    let mut ret = adv.clone();
    for b in 0..adv.len() {
        let lam = if lams.len() == 1 { lams[0] } else { lams[b] };
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
    let centred = (x.to_kind(Kind::Double) - &mean)
        .where_self(&keep, &Tensor::zeros([], (Kind::Double, x.device())));
    let var = if n > 1.0 {
        centred.square().sum(Kind::Double) / (n - 1.0)
    } else {
        mean.zeros_like()
    };
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
        assert_eq!(
            Vec::<f32>::try_from(&x.get(0)).expect("x"),
            Vec::<f32>::try_from(&y.get(0)).expect("y")
        );
    }

    #[test]
    fn ad4_whiten_has_zero_mean_unit_variance_on_mask() {
        let x = Tensor::from_slice(&[1f32, 2., 100., 3.]).view([1, 4]);
        let m = Tensor::from_slice(&[1f32, 1., 0., 1.]).view([1, 4]);
        let w = Vec::<f32>::try_from(&masked_whiten(&x, &m).get(0)).expect("w");
        close(&w, &[-1.0, 0.0, 0.0, 1.0], 1e-6);
    }

    #[test]
    fn per_row_lambda_matches_single_row_runs() {
        let mask = Tensor::from_slice(&[0f64, 1., 1., 0., 1., 1.]).view([2, 3]);
        let values = Tensor::from_slice(&[0f64, 0.3, 0.1, 0., 0.2, 0.6]).view([2, 3]);
        let rewards = Tensor::from_slice(&[0f64, 0., 1., 0., 0., 0.5]).view([2, 3]);
        let (both, _) = try_gae(&rewards, &values, &mask, 1.0, &[0.9, 0.5]).expect("gae");
        for (b, lam) in [(0i64, 0.9), (1, 0.5)] {
            let (one, _) = gae(
                &rewards.narrow(0, b, 1),
                &values.narrow(0, b, 1),
                &mask.narrow(0, b, 1),
                1.0,
                lam,
            );
            assert_eq!(
                Vec::<f64>::try_from(&one.view([-1])).expect("one"),
                Vec::<f64>::try_from(&both.get(b)).expect("row")
            );
        }
        assert!(try_gae(&rewards, &values, &mask, 1.0, &[0.9, 0.5, 0.1]).is_err());
    }
}
