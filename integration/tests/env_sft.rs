//! The SFT warm start per environment: the tiny transformer, trained briefly on noised oracle
//! demonstrations, reaches a nonzero (and usually imperfect) held-out success in every built-in
//! env. Evaluated by the one evaluation function (`keel_actors::eval`, EV-4..6): pass@1 of one
//! greedy episode per held-out task, through a real generator and env shard.
//!
//! Each env is one test so that they run in parallel. `calc` and `solver-verifier` take a few
//! seconds and run by default; the others take about a minute each on 2 cores and are marked
//! `#[ignore]`: `scripts/test.sh --slow` runs them with everything else (or alone:
//! `cargo nextest run -p keel-integration --test env_sft --run-ignored all`).

use keel_actors::demo_tokens::render_demonstration;
use keel_actors::eval::{evaluate_weights, EvalPlan};
use keel_actors::weights::PublishedWeights;
use keel_actors::TrainConfig;
use keel_envs::{demonstrations, make_env, task_seed, Split, Tokenizer};
use keel_learner::{Learner, LearnerConfig, TrainBatch};

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
    // The run config the evaluation's generator samples under: this env, this model shape.
    let mut cfg = TrainConfig::default();
    cfg.env.name = name.to_string();
    cfg.env.difficulty = difficulty;
    cfg.model.context_len = CONTEXT;
    cfg.rollout.max_turn_tokens = max_turn_tokens;
    cfg.run.device = "cpu".into();
    cfg.run.seed = 3;
    let codec = || cfg.chat_codec(&tok).expect("codec");
    let data: Vec<(Vec<u32>, Vec<u8>)> = demonstrations(&mut [env.as_mut()], &tok, &seeds, 0.15, 7)
        .expect("demos")
        .iter()
        .map(|d| render_demonstration(&codec(), d, "").expect("render"))
        .filter(|(tokens, _)| tokens.len() <= CONTEXT)
        .collect();
    assert!(
        data.len() > demos / 2,
        "{name}: most demonstrations must fit the context"
    );
    let spec = cfg.model_spec(&tok, tch::Device::Cpu).expect("spec");
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
    let scratch = tempfile::tempdir().expect("tempdir");
    let store = keel_store::RunStore::open(scratch.path().to_str().expect("utf-8")).expect("store");
    let plan = EvalPlan {
        tasks: 40,
        samples: 0,
        temperature: 1.0,
        batch_seq: 1 << 40,
    };
    let report = evaluate_weights(&cfg, &store, PublishedWeights::single(0, weights), &plan)
        .expect("evaluate");
    println!("{name} d{difficulty}: SFT held-out {}", report.describe());
    report.pass_at_1()
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
