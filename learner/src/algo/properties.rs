//! Property tests across the policy losses (LR-8): whatever the values at mask-0 positions —
//! observation tokens and padding, even NaN — they receive no gradient and do not change the
//! aggregated loss.

use proptest::prelude::*;
use tch::{Kind, Tensor};

use crate::algo::aggregation::{agg_loss, AggDenominators, AggMode};
use crate::algo::armor::{armor_loss, ArmorInputs, ArmorLoss, RenormAdv, ReplaceOld};
use crate::algo::gspo::gspo_loss;
use crate::algo::kl::{masked_kl, KlEstimator};
use crate::algo::ppo::{vanilla_ppo, ClipBounds};
use crate::algo::reinforce::reinforce_loss;
use crate::algo::sao::dis_loss;
use crate::algo::sorl::turn_level_loss;

const T: usize = 6;

/// (logp, old, ref, advantage, mask, turn) of one cell.
type Cell = (f64, f64, f64, f64, bool, i64);

/// Every loss kind, aggregated with `mode`.
fn losses(
    logp: &Tensor,
    old: &Tensor,
    rf: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    turns: &Tensor,
    mode: AggMode,
) -> Vec<Tensor> {
    let den = AggDenominators::of(mask, None);
    let clip = ClipBounds {
        low: 0.2,
        high: 0.28,
        dual: Some(3.0),
    };
    let anchor_rows = mask.ones_like().select(1, 0);
    let armor = |opt: &ArmorLoss| {
        let inputs = ArmorInputs {
            logp,
            old_logp: old,
            ref_logp: rf,
            adv,
            mask,
            anchor_rows: &anchor_rows,
        };
        armor_loss(&inputs, opt, 0.875, clip)
            .expect("armor loss")
            .0
            .loss
    };
    let per_token = [
        vanilla_ppo(logp, old, adv, mask, clip).loss,
        gspo_loss(logp, old, adv, mask, clip).loss,
        turn_level_loss(logp, old, adv, mask, turns, T as i64, clip, Some(1.0))
            .0
            .loss,
        dis_loss(logp, old, adv, mask, 0.3, 5.0).0,
        armor(&ArmorLoss::default()),
        armor(&ArmorLoss {
            replace_old: ReplaceOld::Mix,
            renorm_adv: RenormAdv::Seq,
            replace_on_anchors_only: false,
            ..ArmorLoss::default()
        }),
        reinforce_loss(logp, old, adv, mask, Some(2.0)),
        masked_kl(logp, rf, mask, KlEstimator::K3),
        masked_kl(logp, rf, mask, KlEstimator::K1Plus),
    ];
    per_token
        .iter()
        .map(|l| agg_loss(l, mask, mode, &den))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn lr6_masked_positions_get_no_gradient_and_do_not_matter(
        cells in proptest::collection::vec((-3.0f64..-0.05, -3.0f64..-0.05, -3.0f64..-0.05, -2.0f64..2.0, proptest::bool::ANY, 0i64..3), 2 * T),
        mode_ix in 0usize..4,
    ) {
        let mode = [AggMode::TokenMean, AggMode::SeqMeanTokenMean, AggMode::SeqMeanTokenSum, AggMode::SeqMeanTokenSumNorm][mode_ix];
        let col = |f: &dyn Fn(&Cell) -> f64| Tensor::from_slice(&cells.iter().map(f).collect::<Vec<_>>()).view([2, T as i64]);
        let mask = col(&|c| f64::from(u8::from(c.4)));
        let turns = Tensor::from_slice(&cells.iter().map(|c| c.5).collect::<Vec<_>>()).view([2, T as i64]);
        let (old, rf, adv) = (col(&|c| c.1), col(&|c| c.2), col(&|c| c.3));
        let x0 = col(&|c| c.0);
        // Poison the masked positions of a second copy: NaN log-probs, huge advantages.
        let keep = mask.gt(0.0);
        let nan = Tensor::full([2, T as i64], f64::NAN, (Kind::Double, tch::Device::Cpu));
        let poisoned = x0.where_self(&keep, &nan);
        let adv_poisoned = adv.where_self(&keep, &(adv.ones_like() * 1e30));
        let clean = losses(&x0, &old, &rf, &adv, &mask, &turns, mode);
        let x = poisoned.set_requires_grad(true);
        let dirty = losses(&x, &old, &rf, &adv_poisoned, &mask, &turns, mode);
        for (k, (a, b)) in clean.iter().zip(&dirty).enumerate() {
            let (va, vb) = (a.double_value(&[]), b.double_value(&[]));
            prop_assert!((va - vb).abs() <= 1e-9 * (1.0 + va.abs()), "loss {}: {} vs {}", k, va, vb);
            let mut xg = x.shallow_clone();
            xg.zero_grad();
            b.backward();
            let g = x.grad().where_self(&keep.logical_not(), &x.zeros_like());
            let g = Vec::<f64>::try_from(&g.view([-1])).unwrap_or_default();
            prop_assert!(g.iter().all(|v| *v == 0.0), "loss {}: gradient at a masked position {:?}", k, g);
        }
    }
}
