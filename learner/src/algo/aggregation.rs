//! Loss aggregation (spec §1.2, verl `agg_loss`): how per-token losses `L[b, t]` become one
//! scalar.
//!
//! With `S_i = Σ_t m_{i,t}·L_{i,t}`, `n_i = Σ_t m_{i,t}`, and *global* denominators taken over
//! the whole optimizer mini-batch (not the micro-batch being evaluated):
//! ```text
//! token-mean              : Σ_i S_i / N_tok                 N_tok = Σ_i n_i
//! token-sum               : Σ_i S_i
//! seq-mean-token-sum      : Σ_i S_i / N_seq                 N_seq = #{i : n_i > 0}
//! seq-mean-token-mean     : Σ_{i: n_i>0} (S_i / n_i) / N_seq
//! seq-mean-token-sum-norm : Σ_i S_i / (N_seq · H)           H = constant, or the padded length T
//! ```
//! `seq-mean-token-sum-norm` follows verl as it is now (0.9.1, checked by
//! `learner/tests/verl_parity.rs`): the sequence mean, then `/ H`. The spec's §1.2 and older verl
//! (e.g. the fork in Hesse73/ARMOR: `sum(S_i) / H`) have no `1/N_seq`; where they disagree the
//! current reference code wins.
//!
//! Invariants:
//! - AG-1 (micro-batch independence): the denominators are fixed by [`AggDenominators::of`] on
//!   the whole mini-batch, so summing `agg_loss` over any split of its rows into micro-batches
//!   gives the full-batch value (verl's global-denominator form).
//! - AG-2 (empty sequences): a sequence with no valid token contributes nothing and is not
//!   counted in `N_seq`.
//! - AG-3 (masking): mask-0 entries are *selected away* (`where`), not multiplied by 0, so a NaN
//!   or inf at a masked position reaches neither the value nor the gradient.
//! - AG-4 (empty batch): a denominator of 0 is replaced by 1, so an all-masked batch gives 0.

use tch::{Kind, Tensor};

/// The aggregation modes of verl's `loss_agg_mode`, spelled as in verl.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AggMode {
    /// Global valid-token mean.
    TokenMean,
    /// Sum over valid tokens.
    TokenSum,
    /// Mean over sequences of each sequence's token sum.
    SeqMeanTokenSum,
    /// Mean over sequences of each sequence's token mean.
    SeqMeanTokenMean,
    /// Mean over sequences of each sequence's token sum divided by a length `H` (Dr. GRPO).
    SeqMeanTokenSumNorm,
}

impl AggMode {
    /// verl's spelling (`token-mean`, …).
    pub fn name(self) -> &'static str {
        match self {
            AggMode::TokenMean => "token-mean",
            AggMode::TokenSum => "token-sum",
            AggMode::SeqMeanTokenSum => "seq-mean-token-sum",
            AggMode::SeqMeanTokenMean => "seq-mean-token-mean",
            AggMode::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        }
    }
}

/// The global denominators of one optimizer mini-batch (AG-1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AggDenominators {
    /// `N_tok`: valid tokens in the mini-batch.
    pub tokens: f64,
    /// `N_seq`: sequences with at least one valid token (AG-2).
    pub seqs: f64,
    /// `H` of `seq-mean-token-sum-norm`.
    pub scale: f64,
}

impl AggDenominators {
    /// Denominators of the mini-batch whose mask is `mask` `[B, T]`; `scale` is `H` (None: the
    /// padded length `T`, verl's default).
    pub fn of(mask: &Tensor, scale: Option<f64>) -> Self {
        let keep = mask.gt(0.0).to_kind(Kind::Double);
        let tokens = keep.sum(Kind::Double).double_value(&[]);
        let seqs = keep
            .sum_dim_intlist(1, false, Kind::Double)
            .gt(0.0)
            .sum(Kind::Double)
            .double_value(&[]);
        let t = *mask.size().last().unwrap_or(&1) as f64;
        AggDenominators {
            tokens,
            seqs,
            scale: scale.unwrap_or(t),
        }
    }
}

/// Per-sequence token sums `S_i` and counts `n_i` (AG-3): `[B]` each, in `loss`'s kind.
fn seq_sums(loss: &Tensor, mask: &Tensor) -> (Tensor, Tensor) {
    let keep = mask.gt(0.0);
    let zero = Tensor::zeros([], (loss.kind(), loss.device()));
    let m = mask.to_kind(loss.kind());
    let s = (loss * &m)
        .where_self(&keep, &zero)
        .sum_dim_intlist(1, false, loss.kind());
    let n = m
        .where_self(&keep, &zero)
        .sum_dim_intlist(1, false, loss.kind());
    (s, n)
}

/// Aggregates `loss` `[B, T]` over `mask` with the mini-batch denominators `den` (module doc).
pub fn agg_loss(loss: &Tensor, mask: &Tensor, mode: AggMode, den: &AggDenominators) -> Tensor {
    let (s, n) = seq_sums(loss, mask);
    let total = s.sum(loss.kind());
    let seqs = den.seqs.max(1.0);
    match mode {
        AggMode::TokenMean => total / den.tokens.max(1.0),
        AggMode::TokenSum => total,
        AggMode::SeqMeanTokenSum => total / seqs,
        AggMode::SeqMeanTokenMean => (s / n.clamp_min(1.0)).sum(loss.kind()) / seqs,
        AggMode::SeqMeanTokenSumNorm => total / (seqs * den.scale.max(f64::MIN_POSITIVE)),
    }
}

/// Layout P from layout C (spec §0.1): each turn becomes its own record. Returns `x` `[B, T]`
/// repeated as `[B·K, T]` and the mask split so that row `b·K + k` keeps only turn `k`'s tokens
/// (`turn_ids` `[B, T]` i64, `k` turns at most). "seq" aggregation modes over the result average
/// over turn records, as verl-agent does; token modes are unchanged.
pub fn turn_records(x: &Tensor, mask: &Tensor, turn_ids: &Tensor, k: i64) -> (Tensor, Tensor) {
    let size = x.size();
    let (b, t) = (size[0], size[1]);
    let ks = Tensor::arange(k, (Kind::Int64, x.device())).view([1, k, 1]);
    let of_turn = turn_ids.unsqueeze(1).eq_tensor(&ks).to_kind(mask.kind());
    let m = (mask.unsqueeze(1) * of_turn).reshape([b * k, t]);
    let xs = x.unsqueeze(1).expand([b, k, t], false).reshape([b * k, t]);
    (xs, m)
}

/// `agg_loss` with the denominators of `mask` itself (a single micro-batch).
pub fn agg_loss_local(loss: &Tensor, mask: &Tensor, mode: AggMode, scale: Option<f64>) -> Tensor {
    agg_loss(loss, mask, mode, &AggDenominators::of(mask, scale))
}

/// `Σ m·x / max(Σ m, 1)` (token-mean with local denominators); a scalar of `x`'s kind.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Tensor {
    agg_loss_local(x, mask, AggMode::TokenMean, None)
}

/// Token-mean of `x` as an `f64` metric (no gradient).
pub fn masked_mean_value(x: &Tensor, mask: &Tensor) -> f64 {
    tch::no_grad(|| masked_mean(&x.detach().to_kind(Kind::Double), mask).double_value(&[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_records_average_over_turns() {
        // One trajectory: turn 0 has losses [1, 3] (mean 2), turn 1 has [10] (mean 10).
        let loss = Tensor::from_slice(&[0f32, 1., 3., 0., 10.]).view([1, 5]);
        let mask = Tensor::from_slice(&[0f32, 1., 1., 0., 1.]).view([1, 5]);
        let turns = Tensor::from_slice(&[0i64, 0, 0, 0, 1]).view([1, 5]);
        let (l, m) = turn_records(&loss, &mask, &turns, 2);
        let v = agg_loss_local(&l, &m, AggMode::SeqMeanTokenMean, None).double_value(&[]);
        assert!((v - 6.0).abs() < 1e-6, "{v}");
        let tm = agg_loss_local(&l, &m, AggMode::TokenMean, None).double_value(&[]);
        let direct = agg_loss_local(&loss, &mask, AggMode::TokenMean, None).double_value(&[]);
        assert!((tm - direct).abs() < 1e-6);
    }
    use proptest::prelude::*;

    fn spec_inputs() -> (Tensor, Tensor) {
        let l = Tensor::from_slice(&[1.0f64, 2., 0., 3., 0., 0.]).view([2, 3]);
        let m = Tensor::from_slice(&[1.0f64, 1., 0., 1., 0., 0.]).view([2, 3]);
        (l, m)
    }

    #[test]
    fn spec_vectors() {
        let (l, m) = spec_inputs();
        let v = |mode, h| agg_loss_local(&l, &m, mode, h).double_value(&[]);
        assert_eq!(v(AggMode::TokenMean, None), 2.0);
        assert_eq!(v(AggMode::TokenSum, None), 6.0);
        assert_eq!(v(AggMode::SeqMeanTokenSum, None), 3.0);
        assert_eq!(v(AggMode::SeqMeanTokenMean, None), 2.25);
        assert_eq!(v(AggMode::SeqMeanTokenSumNorm, Some(3.0)), 1.0);
        // Default H is the padded length (3 here).
        assert_eq!(v(AggMode::SeqMeanTokenSumNorm, None), 1.0);
    }

    #[test]
    fn ag2_empty_sequences_are_not_counted() {
        let l = Tensor::from_slice(&[1.0f64, 2., 5., 7.]).view([2, 2]);
        let m = Tensor::from_slice(&[1.0f64, 1., 0., 0.]).view([2, 2]);
        assert_eq!(
            agg_loss_local(&l, &m, AggMode::SeqMeanTokenMean, None).double_value(&[]),
            1.5
        );
        assert_eq!(
            agg_loss_local(&l, &m, AggMode::SeqMeanTokenSum, None).double_value(&[]),
            3.0
        );
    }

    #[test]
    fn ag3_masked_nan_does_not_leak() {
        let mut l = Tensor::from_slice(&[1.0f64, f64::NAN])
            .view([1, 2])
            .set_requires_grad(true);
        let m = Tensor::from_slice(&[1.0f64, 0.]).view([1, 2]);
        for mode in [
            AggMode::TokenMean,
            AggMode::SeqMeanTokenMean,
            AggMode::SeqMeanTokenSumNorm,
        ] {
            let out = agg_loss_local(&l, &m, mode, None);
            assert!(out.double_value(&[]).is_finite());
            l.zero_grad();
            out.backward();
            let g = Vec::<f64>::try_from(&l.grad().view([-1])).expect("grad");
            assert_eq!(g[1], 0.0);
        }
    }

    #[test]
    fn ag4_all_masked_is_zero() {
        let l = Tensor::from_slice(&[1.0f64, 2.]).view([1, 2]);
        let m = Tensor::zeros([1, 2], (Kind::Double, tch::Device::Cpu));
        for mode in [
            AggMode::TokenMean,
            AggMode::SeqMeanTokenMean,
            AggMode::SeqMeanTokenSum,
        ] {
            assert_eq!(agg_loss_local(&l, &m, mode, None).double_value(&[]), 0.0);
        }
    }

    const MODES: [AggMode; 5] = [
        AggMode::TokenMean,
        AggMode::TokenSum,
        AggMode::SeqMeanTokenSum,
        AggMode::SeqMeanTokenMean,
        AggMode::SeqMeanTokenSumNorm,
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// AG-1: any split of the rows into micro-batches sums to the full-batch value.
        #[test]
        fn ag1_aggregation_is_invariant_to_micro_batch_split(
            rows in proptest::collection::vec(
                proptest::collection::vec((-5.0f64..5.0, proptest::bool::ANY), 4), 1..7),
            cuts in proptest::collection::vec(proptest::bool::ANY, 6),
            mode_ix in 0usize..5,
        ) {
            let b = rows.len();
            let loss: Vec<f64> = rows.iter().flatten().map(|(x, _)| *x).collect();
            let mask: Vec<f64> = rows.iter().flatten().map(|(_, k)| f64::from(u8::from(*k))).collect();
            let l = Tensor::from_slice(&loss).view([b as i64, 4]);
            let m = Tensor::from_slice(&mask).view([b as i64, 4]);
            let mode = MODES[mode_ix];
            let den = AggDenominators::of(&m, None);
            let full = agg_loss(&l, &m, mode, &den).double_value(&[]);
            let mut parts = 0.0;
            let mut start = 0;
            for (i, cut) in cuts.iter().enumerate().take(b) {
                if i + 1 == b || *cut {
                    let len = (i + 1 - start) as i64;
                    parts += agg_loss(&l.narrow(0, start as i64, len), &m.narrow(0, start as i64, len), mode, &den)
                        .double_value(&[]);
                    start = i + 1;
                }
            }
            prop_assert!((full - parts).abs() < 1e-9, "{:?}: full {} vs parts {}", mode, full, parts);
        }
    }
}
