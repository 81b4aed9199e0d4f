//! Parity of keel's algorithm library with verl's own `core_algos` (the reference code, not the
//! spec): `tests/python/make_verl_vectors.py` ran verl's functions on seeded float64 inputs and
//! recorded their outputs and autograd gradients in `tests/parity/verl_core_algos.json`; this
//! test feeds keel the same inputs and compares. No Python runs here.
//!
//! Covered (verl function → keel): `agg_loss` → `agg_loss` (all five modes, global
//! denominators over a micro-batch split), `compute_policy_loss_vanilla` → `vanilla_ppo`
//! (clip, clip-higher, dual-clip on/off, the ±20 log-ratio clamp), `compute_policy_loss_gspo` →
//! `gspo_loss` (its clamp at 10), `compute_policy_loss_bypass_mode` with `loss_type =
//! "reinforce"` (token-level IS weights truncated at 2.0) → `reinforce_loss`, `kl_penalty` → `kl_penalty`/`masked_kl` (k1, abs, k2, k3 with
//! its clamps, "+" forms), `compute_gae_advantage_return` → `try_gae` + `masked_whiten`,
//! `compute_grpo_outcome_advantage` → `group_advantages` (GRPO, Dr. GRPO), `compute_value_loss` →
//! `value_loss` + `value_clip_frac`, `entropy_from_logits` / `logprobs_from_logits` →
//! `token_entropy` / `token_logprobs`.
//!
//! Tolerance: `|keel − verl| ≤ 1e-7·max(1, |verl|)` (float64 on both sides). The one source of
//! difference above rounding is verl's epsilon: `seq-mean-token-mean` divides each sequence by
//! `n_i + 1e-8` and verl's metric means by `Σm + 1e-8`, where keel divides by `n_i` and
//! `max(Σm, 1)` (a relative 1e-8/n_i, largest at 1e-9 here).
//!
//! Deliberate differences, asserted as such:
//! - GAE: verl carries the running advantage through mask-0 (observation) positions and
//!   whitens every position; keel's advantages and returns are 0 there (AD-2, AD-4). Only mask-1
//!   positions are compared, and keel's zeros are checked.
//! - `kl_penalty` itself matches verl at every position; `masked_kl` (what the learner uses)
//!   equals it at mask-1 positions and is 0 elsewhere (KL-4).
//! - Dual-clip off (`ClipBounds::dual = None`) equals verl with an unreachable `clip_ratio_c`.

use std::path::Path;

use keel_learner::algo::aggregation::{
    agg_loss, agg_loss_local, masked_mean_value, AggDenominators, AggMode,
};
use keel_learner::algo::gae::{masked_whiten, try_gae};
use keel_learner::algo::grpo::group_advantages;
use keel_learner::algo::gspo::gspo_loss;
use keel_learner::algo::kl::{kl_penalty, masked_kl, KlEstimator};
use keel_learner::algo::ppo::{vanilla_ppo, ClipBounds};
use keel_learner::algo::reinforce::reinforce_loss;
use keel_learner::algo::value::{value_clip_frac, value_loss};
use keel_learner::{token_entropy, token_logprobs};
use serde_json::Value;
use support::{matrix, num, values, Diffs};
use tch::Tensor;

mod support;

fn vectors() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parity/verl_core_algos.json");
    let text = std::fs::read_to_string(&path).expect("the committed verl vectors");
    serde_json::from_str(&text).expect("json")
}

fn mode(v: &Value) -> AggMode {
    serde_json::from_value(v.clone()).expect("an aggregation mode")
}

fn scale(v: &Value) -> Option<f64> {
    v.as_f64()
}

#[test]
fn agg_loss_matches_verl_in_every_mode_and_over_micro_batches() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["agg_loss"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let (loss, mask) = (matrix(&case["loss"]), matrix(&case["mask"]));
        let (m, h) = (mode(&case["mode"]), scale(&case["scale"]));
        let whole = agg_loss_local(&loss, &mask, m, h).double_value(&[]);
        diffs.scalar(&format!("agg_loss:{name}"), whole, num(&case["expected"]));
        // AG-1: the rows as two micro-batches under the whole mini-batch's denominators.
        let den = AggDenominators::of(&mask, h);
        let split: f64 = [(0, 2), (2, 3)]
            .iter()
            .map(|&(start, len)| {
                agg_loss(
                    &loss.narrow(0, start, len),
                    &mask.narrow(0, start, len),
                    m,
                    &den,
                )
                .double_value(&[])
            })
            .sum();
        diffs.scalar(
            &format!("agg_loss (split):{name}"),
            split,
            num(&case["expected_split"]),
        );
    }
    diffs.report();
}

#[test]
fn policy_losses_and_their_gradients_match_verl() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["policy_loss"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let kind = case["kind"].as_str().expect("kind");
        let lp = matrix(&case["log_prob"]).set_requires_grad(true);
        let old = matrix(&case["old_log_prob"]);
        let adv = matrix(&case["advantages"]);
        let mask = matrix(&case["mask"]);
        let clip = ClipBounds {
            low: num(&case["clip_low"]),
            high: num(&case["clip_high"]),
            dual: case["clip_c"].as_f64(),
        };
        let what = format!("compute_policy_loss_{kind}");
        if kind == "reinforce" {
            // verl's bypass mode, loss_type "reinforce" (behaviour log-probs as `old`).
            let per_token = reinforce_loss(&lp, &old, &adv, &mask, case["is_threshold"].as_f64());
            let loss = agg_loss_local(&per_token, &mask, mode(&case["agg_mode"]), None);
            diffs.loss_and_grad(&what, name, &loss, &lp, &case["loss"], &case["grad"]);
            diffs.scalar(
                &format!("ppo_kl:{name}"),
                masked_mean_value(&(&old - lp.detach()), &mask),
                num(&case["ppo_kl"]),
            );
            continue;
        }
        let out = match kind {
            "vanilla" => vanilla_ppo(&lp, &old, &adv, &mask, clip),
            "gspo" => gspo_loss(&lp, &old, &adv, &mask, clip),
            other => panic!("unknown policy loss kind {other}"),
        };
        let loss = agg_loss_local(&out.loss, &mask, mode(&case["agg_mode"]), None);
        diffs.loss_and_grad(&what, name, &loss, &lp, &case["loss"], &case["grad"]);
        let s = out.stats;
        diffs.scalar(
            &format!("pg_clipfrac:{name}"),
            s.clip_frac,
            num(&case["pg_clipfrac"]),
        );
        diffs.scalar(&format!("ppo_kl:{name}"), s.approx_kl, num(&case["ppo_kl"]));
        diffs.scalar(
            &format!("pg_clipfrac_lower:{name}"),
            s.clip_frac_dual,
            num(&case["pg_clipfrac_lower"]),
        );
    }
    diffs.report();
}

#[test]
fn kl_estimators_match_verl_with_their_clamps_and_straight_through_gradients() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["kl"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let est: KlEstimator =
            serde_json::from_value(case["estimator"].clone()).expect("estimator");
        let lp = matrix(&case["logprob"]).set_requires_grad(true);
        let reference = matrix(&case["ref_logprob"]);
        let mask = matrix(&case["mask"]);
        let kl = kl_penalty(&lp, &reference, est);
        diffs.tensor(&format!("kl_penalty:{name}"), &kl, &case["value"], None);
        let masked = masked_kl(&lp, &reference, &mask, est);
        diffs.tensor(
            &format!("kl_penalty (masked):{name}"),
            &masked,
            &case["value"],
            Some(&mask),
        );
        assert!(
            values(&(&masked * (1.0 - &mask))).iter().all(|&x| x == 0.0),
            "{name}: masked_kl is 0 at mask-0 positions (KL-4)"
        );
        let mean = agg_loss_local(&masked, &mask, AggMode::TokenMean, None);
        let what = "kl_penalty token-mean";
        diffs.loss_and_grad(what, name, &mean, &lp, &case["token_mean"], &case["grad"]);
    }
    diffs.report();
}

#[test]
fn gae_matches_verl_on_model_tokens_and_is_zero_on_observations() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["gae"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let (r, v, mask) = (
            matrix(&case["rewards"]),
            matrix(&case["values"]),
            matrix(&case["mask"]),
        );
        let (adv, ret) =
            try_gae(&r, &v, &mask, num(&case["gamma"]), &[num(&case["lam"])]).expect("gae");
        diffs.tensor(
            &format!("compute_gae_advantage_return returns:{name}"),
            &ret,
            &case["returns"],
            Some(&mask),
        );
        let white = masked_whiten(&adv, &mask);
        diffs.tensor(
            &format!("compute_gae_advantage_return advantages:{name}"),
            &white,
            &case["advantages"],
            Some(&mask),
        );
        // The deliberate difference: keel is 0 off the mask, verl carries values there.
        let off = 1.0 - &mask;
        assert!(values(&(&white * &off)).iter().all(|&x| x == 0.0));
        assert!(values(&(&ret * &off)).iter().all(|&x| x == 0.0));
        let verl_off = values(&(matrix(&case["advantages"]) * &off));
        assert!(
            verl_off.iter().any(|&x| x != 0.0),
            "{name}: the vectors should show verl's carried values off the mask"
        );
    }
    diffs.report();
}

#[test]
fn grpo_and_dr_grpo_advantages_match_verl_with_singletons_and_flat_groups() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["grpo"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let scores: Vec<f64> = serde_json::from_value(case["scores"].clone()).expect("scores");
        let ids: Vec<u64> = serde_json::from_value(case["group_ids"].clone()).expect("ids");
        let expected: Vec<f64> =
            serde_json::from_value(case["advantages"].clone()).expect("advantages");
        let norm = case["norm_adv_by_std"].as_bool().expect("flag");
        let adv = group_advantages(&scores, &ids, norm, 1e-6);
        for (i, (k, v)) in adv.iter().zip(&expected).enumerate() {
            diffs.scalar(
                &format!("compute_grpo_outcome_advantage:{name}[{i}]"),
                *k,
                *v,
            );
        }
    }
    diffs.report();
}

#[test]
fn value_loss_and_vf_clipfrac_match_verl() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["value_loss"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let vp = matrix(&case["vpreds"]).set_requires_grad(true);
        let (old, ret, mask) = (
            matrix(&case["values"]),
            matrix(&case["returns"]),
            matrix(&case["mask"]),
        );
        let clip = case["clip"].as_f64();
        let m = mode(&case["agg_mode"]);
        let loss = value_loss(
            &vp,
            &old,
            &ret,
            &mask,
            clip,
            m,
            &AggDenominators::of(&mask, None),
        );
        diffs.scalar(
            &format!("vf_clipfrac:{name}"),
            value_clip_frac(&vp, &old, &ret, &mask, clip),
            num(&case["vf_clipfrac"]),
        );
        let what = "compute_value_loss";
        diffs.loss_and_grad(what, name, &loss, &vp, &case["loss"], &case["grad"]);
    }
    diffs.report();
}

#[test]
fn entropy_and_log_probs_match_verl_on_uniform_and_near_one_hot_logits() {
    let all = vectors();
    let mut diffs = Diffs::new("verl");
    for case in all["logits"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let rows: Vec<Vec<Vec<f64>>> =
            serde_json::from_value(case["logits"].clone()).expect("logits");
        let (b, t, v) = (
            rows.len() as i64,
            rows[0].len() as i64,
            rows[0][0].len() as i64,
        );
        let flat: Vec<f64> = rows.into_iter().flatten().flatten().collect();
        let logits = Tensor::from_slice(&flat).view([b, t, v]);
        let tokens: Vec<Vec<i64>> = serde_json::from_value(case["tokens"].clone()).expect("ids");
        let flat: Vec<i64> = tokens.into_iter().flatten().collect();
        let tokens = Tensor::from_slice(&flat).view([b, t]);
        // keel aligns out[t] with the distribution at t − 1 (LP-1): drop its first column and
        // verl's last.
        let ent = token_entropy(&logits).narrow(1, 1, t - 1);
        let verl_ent = matrix(&case["entropy"]).narrow(1, 0, t - 1);
        diffs.tensors(
            &format!("entropy_from_logits:{name}"),
            &ent,
            &verl_ent,
            None,
        );
        let lp = token_logprobs(&logits, &tokens).narrow(1, 1, t - 1);
        diffs.tensor(
            &format!("logprobs_from_logits:{name}"),
            &lp,
            &case["logprobs_next"],
            None,
        );
    }
    diffs.report();
}
