//! Parity of keel's ARMOR loss with ARMOR's own actor update (Hesse73/ARMOR @ 3e393f7):
//! `tests/python/make_armor_vectors.py` executed the mixed-probability block of its
//! `dp_actor.py` `update_policy` with its `compute_policy_loss_vanilla` on one seeded float64
//! batch under every option of the public code, and recorded the loss, its autograd gradient and
//! the clip metrics in `tests/parity/armor_actor.json`. No Python runs here.
//!
//! Covered: the mixture with the reference (r = 15/16 and 7/8), with the constant 1 and with
//! π_old; `mix_probs_on_ref_only`; `replace_old_probs` with each `replace_method` (ref, mix,
//! avg, max) × `replace_on_ref_only` × `renorm_adv` (none, token, seq) × `replace_on_adv`, with
//! and without mixing; the `mix` replacement at its own ratio (`replace_ratio`, the replacement's
//! `mix_probs_main_ratio`): with ratio mixing off (`mix_probs = False`, a configuration one
//! shared ratio cannot express) and with both on at different ratios (the reference's
//! replacement and mixing steps run with a ratio each); on a batch with a fully-masked row, an
//! observation gap, garbage at masked positions, a log-ratio past the ±20 clamp and dual-clip
//! (c = 10) hits.
//!
//! Tolerance as `support::REL`; the metrics differ by verl's `1e-8` in `masked_mean`'s
//! denominator only. Deliberate difference (not in these vectors, asserted in `algo::armor`'s
//! AM-4 test): with `renorm_adv = "seq"` a fully-masked *anchor* row makes the reference's loss
//! NaN (0/0 in its row mean); keel gives that row weight 1.

use std::path::Path;

use keel_learner::algo::armor::{armor_loss, ArmorInputs, ArmorLoss, ARMOR_CLIP};
use keel_learner::masked_mean;
use serde_json::Value;
use support::{matrix, num, Diffs};
use tch::Tensor;

mod support;

fn vectors() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parity/armor_actor.json");
    let text = std::fs::read_to_string(&path).expect("the committed ARMOR vectors");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn armor_loss_matches_the_armor_actor_update_under_every_option() {
    let all = vectors();
    let inp = &all["inputs"];
    let (old, rf, adv, mask) = (
        matrix(&inp["old_log_prob"]),
        matrix(&inp["ref_log_prob"]),
        matrix(&inp["advantages"]),
        matrix(&inp["mask"]),
    );
    let anchors: Vec<f64> = serde_json::from_value(inp["anchor"].clone()).expect("anchor flags");
    let anchor_rows = Tensor::from_slice(&anchors);
    let clip = ARMOR_CLIP;
    let mut diffs = Diffs::new("ARMOR");
    let cases = all["cases"].as_array().expect("cases");
    assert!(cases.len() >= 100, "every option combination");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let opt: ArmorLoss = serde_json::from_value(case["options"].clone()).expect("options");
        let lp = matrix(&inp["log_prob"]).set_requires_grad(true);
        let inputs = ArmorInputs {
            logp: &lp,
            old_logp: &old,
            ref_logp: &rf,
            adv: &adv,
            mask: &mask,
            anchor_rows: &anchor_rows,
        };
        let r = opt.ratio(f64::NAN);
        let (l, stats) = armor_loss(&inputs, &opt, r, clip).expect("loss");
        // ARMOR's scripts aggregate with token-mean.
        let loss = masked_mean(&l.loss, &mask);
        diffs.loss_and_grad(
            "update_policy (mixed) loss",
            name,
            &loss,
            &lp,
            &case["loss"],
            &case["grad"],
        );
        diffs.scalar(
            &format!("pg_clipfrac:{name}"),
            l.stats.clip_frac,
            num(&case["pg_clipfrac"]),
        );
        diffs.scalar(
            &format!("pg_clipfrac_lower:{name}"),
            l.stats.clip_frac_dual,
            num(&case["pg_clipfrac_lower"]),
        );
        diffs.scalar(
            &format!("ppo_kl:{name}"),
            l.stats.approx_kl,
            num(&case["ppo_kl"]),
        );
        if let Some(w) = case["renorm_weight_mean"].as_f64() {
            diffs.scalar(
                &format!("actor/renorm_weight_mean:{name}"),
                stats.renorm_weight_mean,
                w,
            );
        }
    }
    diffs.report();
}

#[test]
fn the_vectors_cover_every_option_value() {
    let all = vectors();
    let seen = |key: &str| -> std::collections::BTreeSet<String> {
        all["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(|c| c["options"][key].to_string())
            .collect()
    };
    assert_eq!(seen("mix_partner").len(), 3);
    assert_eq!(seen("replace_old").len(), 5);
    assert_eq!(seen("renorm_adv").len(), 3);
    for flag in [
        "mix_on_anchors_only",
        "replace_on_anchors_only",
        "replace_on_advantage",
    ] {
        assert_eq!(seen(flag).len(), 2, "{flag}");
    }
}

#[test]
fn the_vectors_cover_the_replacements_own_ratio() {
    let all = vectors();
    let ratios: Vec<(f64, f64)> = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter_map(|c| {
            let o = &c["options"];
            Some((o["mix_ratio"].as_f64()?, o["replace_ratio"].as_f64()?))
        })
        .collect();
    let mixing_off = ratios.iter().filter(|(r, rr)| *r == 1.0 && *rr < 1.0);
    let both_on = ratios
        .iter()
        .filter(|(r, rr)| *r < 1.0 && *rr < 1.0 && r != rr);
    assert!(mixing_off.count() >= 12, "replace = mix, ratio mixing off");
    assert!(both_on.count() >= 12, "both on at different ratios");
}
