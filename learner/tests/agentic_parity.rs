//! Parity of keel's agentic advantage estimators with the reference repositories' own code:
//! GiGPO as ARL-Arena computes it for SAMPO (`compute_gigpo_outcome_advantage`, episode part +
//! anchor-state step groups, both normalisations, γ 0.95 and 1) and Dr. MAS's agent-wise GRPO
//! next to the vanilla multi-agent GRPO it replaces (`compute_grpo_outcome_advantage` with and
//! without `group_by_agent_id`, with and without the std). `tests/python/make_agentic_vectors.py`
//! ran the reference functions on layout-P records (one row per turn / agent invocation) with
//! singleton and flat groups, an anchor shared across prompt groups (it must not join them) and
//! invalid-action penalties; the vectors are committed, no Python runs here. GiGPO's similarity
//! option is covered too: `build_step_group` with `enable_similarity` at four thresholds (groups
//! never merged across prompt groups), and difflib's `SequenceMatcher.ratio` itself on every
//! ordered pair of the observations, past its 200-character autojunk length.
//!
//! Tolerance: Dr. MAS 1e-12 (float64 on both sides). GiGPO 1e-6 relative: the reference computes
//! the step returns in float32 (`compute_step_discounted_returns`), keel in float64.
//! SequenceMatcher ratios 1e-12 (both compute 2·M/T in float64).

use std::path::Path;

use keel_learner::algo::drmas::{drmas_advantages, multi_agent_grpo_advantages};
use keel_learner::algo::gigpo::{
    discounted_returns, gigpo_advantages, similarity_groups, GigpoNorm, StepRecord,
    SIMILARITY_THRESHOLD,
};
use keel_learner::algo::grpo::GRPO_EPS;
use keel_learner::algo::sequence_ratio::sequence_ratio;
use serde_json::Value;

fn vectors() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parity/agentic_advantages.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the committed vectors"))
        .expect("json")
}

fn list<T: serde::de::DeserializeOwned>(case: &Value, key: &str) -> Vec<T> {
    serde_json::from_value(case[key].clone()).unwrap_or_else(|e| panic!("{key}: {e}"))
}

fn assert_close(what: &str, keel: &[f64], reference: &[f64], rel: f64) -> f64 {
    assert_eq!(keel.len(), reference.len(), "{what}: lengths");
    let mut worst: f64 = 0.0;
    for (i, (k, r)) in keel.iter().zip(reference).enumerate() {
        let d = (k - r).abs();
        assert!(
            d <= rel * r.abs().max(1.0),
            "{what}[{i}]: keel {k} vs reference {r} (diff {d:e})\nkeel {keel:?}\nref  {reference:?}"
        );
        worst = worst.max(d);
    }
    worst
}

/// Runs one GiGPO case with step groups `anchor`; answers the largest difference.
fn gigpo_case(case: &Value, anchor: &[u64]) -> f64 {
    let name = case["name"].as_str().expect("name");
    let (uid, traj) = (list::<u64>(case, "uid"), list::<u64>(case, "traj"));
    let (score, step_reward) = (list::<f64>(case, "score"), list::<f64>(case, "step_reward"));
    let gamma = case["gamma"].as_f64().expect("gamma");
    let records: Vec<StepRecord> = (0..uid.len())
        .map(|i| StepRecord {
            uid: uid[i],
            traj: traj[i],
            anchor: anchor[i],
            score: score[i],
            step_reward: step_reward[i],
        })
        .collect();
    // The reference's step returns, episode by episode.
    let mut returns = vec![0.0; records.len()];
    for t in traj
        .iter()
        .copied()
        .collect::<std::collections::BTreeSet<_>>()
    {
        let idx: Vec<usize> = (0..traj.len()).filter(|&i| traj[i] == t).collect();
        let rs: Vec<f64> = idx.iter().map(|&i| step_reward[i]).collect();
        for (&i, g) in idx.iter().zip(discounted_returns(&rs, gamma)) {
            returns[i] = g;
        }
    }
    let worst = assert_close(
        &format!("{name} returns"),
        &returns,
        &list::<f64>(case, "returns"),
        1e-6,
    );
    let norm = match case["mode"].as_str() {
        Some("mean_norm") => GigpoNorm::MeanNorm,
        Some("mean_std_norm") => GigpoNorm::MeanStdNorm,
        other => panic!("unknown mode {other:?}"),
    };
    let adv = gigpo_advantages(&records, gamma, 1.0, norm, GRPO_EPS);
    worst.max(assert_close(
        name,
        &adv,
        &list::<f64>(case, "advantages"),
        1e-6,
    ))
}

#[test]
fn gigpo_matches_arl_arena_in_both_normalisations() {
    let all = vectors();
    let mut worst: f64 = 0.0;
    for case in all["gigpo"].as_array().expect("cases") {
        worst = worst.max(gigpo_case(case, &list::<u64>(case, "anchor")));
    }
    println!("agentic parity: compute_gigpo_outcome_advantage max |diff| {worst:.3e}");
}

/// ARL-Arena's `build_step_group(..., enable_similarity=True, similarity_thresh)` and the
/// advantages over those groups: the same clusters (named by their first record) and values.
#[test]
fn gigpo_similarity_groups_match_arl_arena() {
    let all = vectors();
    let mut worst: f64 = 0.0;
    let cases = all["gigpo_similarity"].as_array().expect("cases");
    assert!(cases.len() >= 8);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let texts = list::<String>(case, "text");
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let threshold = case["similarity_thresh"].as_f64().expect("threshold");
        let groups = similarity_groups(&list::<u64>(case, "uid"), &texts, threshold);
        assert_eq!(
            groups,
            list::<u64>(case, "step_group_first"),
            "{name}: clusters"
        );
        worst = worst.max(gigpo_case(case, &groups));
    }
    println!("agentic parity: build_step_group (similarity) + advantages max |diff| {worst:.3e}");
}

/// `difflib.SequenceMatcher(None, a, b).ratio()` for every ordered pair of the observations,
/// including 258-character ones where difflib's autojunk makes the ratio asymmetric.
#[test]
fn sequence_ratio_matches_difflib_including_autojunk() {
    let all = vectors();
    let mut worst: f64 = 0.0;
    let pairs = all["sequence_matcher"].as_array().expect("pairs");
    for p in pairs {
        let (a, b) = (p["a"].as_str().expect("a"), p["b"].as_str().expect("b"));
        let reference = p["ratio"].as_f64().expect("ratio");
        let keel = sequence_ratio(a, b);
        let d = (keel - reference).abs();
        assert!(
            d <= 1e-12,
            "ratio({a:?}, {b:?}): keel {keel} vs difflib {reference}"
        );
        assert_eq!(
            keel >= SIMILARITY_THRESHOLD,
            p["similar_095"].as_bool().expect("flag"),
            "are_similar({a:?}, {b:?})"
        );
        worst = worst.max(d);
    }
    assert!(
        pairs.iter().any(|p| {
            let r = p["ratio"].as_f64().unwrap_or(0.0);
            let back = pairs
                .iter()
                .find(|q| q["a"] == p["b"] && q["b"] == p["a"])
                .and_then(|q| q["ratio"].as_f64())
                .unwrap_or(r);
            (r - back).abs() > 0.1
        }),
        "the vectors exercise difflib's asymmetric autojunk"
    );
    println!("agentic parity: difflib SequenceMatcher.ratio max |diff| {worst:.3e}");
}

#[test]
fn dr_mas_and_vanilla_multi_agent_grpo_match_the_drmas_code() {
    let all = vectors();
    let mut worst: f64 = 0.0;
    for case in all["drmas"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let (uid, traj, agent) = (
            list::<u64>(case, "uid"),
            list::<u64>(case, "traj"),
            list::<u32>(case, "agent"),
        );
        let score = list::<f64>(case, "score");
        let norm = case["norm_adv_by_std"].as_bool().expect("flag");
        let adv = if case["group_by_agent_id"].as_bool().expect("flag") {
            drmas_advantages(&score, &uid, &agent, norm, GRPO_EPS)
        } else {
            multi_agent_grpo_advantages(&score, &uid, &traj, norm, GRPO_EPS)
        };
        worst = worst.max(assert_close(
            name,
            &adv,
            &list::<f64>(case, "advantages"),
            1e-12,
        ));
    }
    println!("agentic parity: DrMAS compute_grpo_outcome_advantage max |diff| {worst:.3e}");
}
