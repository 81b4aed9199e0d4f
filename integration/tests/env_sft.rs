//! The SFT warm start per environment: the tiny transformer, trained briefly on noised oracle
//! demonstrations, reaches a nonzero (and usually imperfect) held-out success in every built-in
//! env. Greedy evaluation through `ModelPolicy` (MP-1..MP-3).
//!
//! Each env is one test so that they run in parallel. `calc` and `solver-verifier` take a few
//! seconds and run by default; the others take about a minute each on 2 cores and are marked
//! `#[ignore]`: `scripts/test.sh --slow` runs them with everything else (or alone:
//! `cargo nextest run -p keel-integration --test env_sft --run-ignored all`).

use keel_actors::demo_tokens::render_demonstration;
use keel_actors::model_policy::ModelPolicy;
use keel_envs::evaluate::{evaluate, Transcript};
use keel_envs::{demonstrations, make_env, task_seed, Env, Split, Tokenizer};
use keel_learner::{Learner, LearnerConfig, ModelSpec, TinyShape, TrainBatch};

const CONTEXT: usize = 256;

/// Trains on `demos` noised demonstrations for `steps` steps; returns held-out greedy success.
fn sft_success(
    name: &str,
    difficulty: usize,
    demos: usize,
    steps: usize,
    max_turn_tokens: usize,
) -> f64 {
    tch::set_num_threads(1);
    let mut env = make_env(name, difficulty).expect("env");
    let tok = Tokenizer::for_env(env.as_ref());
    let seeds: Vec<u64> = (0..demos as u64)
        .map(|i| task_seed(Split::Train, (1 << 32) + i))
        .collect();
    let codec = || {
        keel_actors::TrainConfig::default()
            .chat_codec(&tok)
            .expect("codec")
    };
    let data: Vec<(Vec<u32>, Vec<u8>)> = demonstrations(env.as_mut(), &tok, &seeds, 0.15, 7)
        .expect("demos")
        .iter()
        .map(|d| render_demonstration(&codec(), d, "").expect("render"))
        .filter(|(tokens, _)| tokens.len() <= CONTEXT)
        .collect();
    assert!(
        data.len() > demos / 2,
        "{name}: most demonstrations must fit the context"
    );
    let sp = tok.special();
    let shape = TinyShape {
        vocab_size: tok.vocab_size(),
        context_len: CONTEXT,
        n_layer: 2,
        d_model: 64,
        n_head: 4,
        bos_token_id: sp.bos,
        eos_token_id: sp.eot,
        pad_token_id: sp.pad,
    };
    let spec = ModelSpec::tiny(&shape, tch::Device::Cpu, 3, false).expect("spec");
    let mut learner =
        Learner::new(spec.build().expect("model"), LearnerConfig::default(), 3).expect("learner");
    let batch_size = 32;
    for step in 0..steps {
        let start = (step * batch_size) % data.len();
        let picked: Vec<(Vec<u32>, Vec<u8>)> = (0..batch_size)
            .map(|k| data[(start + k) % data.len()].clone())
            .collect();
        let batch = TrainBatch::from_sequences(&picked, tch::Device::Cpu).expect("batch");
        learner.sft_step(&batch, 3e-3).expect("sft step");
    }
    let weights = learner.model().to_safetensors().expect("weights");
    let mut policy_model = spec.blank().expect("model");
    policy_model.load_safetensors(&weights).expect("load");
    let mut policy = ModelPolicy::new(policy_model, codec(), max_turn_tokens).expect("policy");
    let mut act = |e: &dyn Env, t: &Transcript| policy.act(e, t).expect("act");
    let report = evaluate(env.as_mut(), 40, &mut act);
    println!(
        "{name} d{difficulty}: SFT held-out success {:.3} (CI {:?}), reward {:.3}",
        report.success_rate(),
        report.ci95(),
        report.mean_reward
    );
    report.success_rate()
}

fn check(name: &str, difficulty: usize, steps: usize, max_turn_tokens: usize) {
    let s = sft_success(name, difficulty, 800, steps, max_turn_tokens);
    assert!(s > 0.0, "{name}: the SFT warm start never succeeds");
}

#[test]
fn sft_calc() {
    check("calc", 2, 150, 6);
}

#[test]
#[ignore = "slow: about a minute on 2 cores"]
fn sft_search_qa() {
    check("search-qa", 1, 600, 5);
}

#[test]
#[ignore = "slow: about a minute on 2 cores"]
fn sft_household() {
    check("household", 1, 150, 8);
}

#[test]
#[ignore = "slow: about a minute on 2 cores"]
fn sft_shop() {
    check("shop", 1, 300, 5);
}

#[test]
#[ignore = "slow: about two minutes on 2 cores"]
fn sft_sokoban() {
    check("sokoban", 1, 600, 2);
}

#[test]
fn sft_solver_verifier() {
    check("solver-verifier", 1, 150, 6);
}

#[test]
#[ignore = "slow: about a minute on 2 cores"]
fn sft_search_team() {
    check("search-team", 1, 400, 5);
}
