//! Every algorithm preset trains the quickstart env for a few steps, in-process, without a
//! non-finite loss or metric (issue 4's CI check). One short run per preset on the tiny config:
//! a short SFT warm start (so that trajectories have several turns), then three RL steps.

use std::sync::{Arc, Mutex};

use keel_actors::{run_job, JobOptions, TrainConfig, TrainEvent, TrainMetrics};
use keel_integration::tiny_config;
use keel_learner::{LearnerConfig, Preset};
use keel_store::RunStore;

const STEPS: u64 = 3;

fn run_preset(p: Preset) -> Vec<serde_json::Value> {
    run_learner(
        &p.name(),
        LearnerConfig {
            critic_warmup: if p == Preset::Sao { Some(1) } else { None },
            ..LearnerConfig::for_preset(p)
        },
    )
}

/// The step metrics of a short run of `learner` (named `label` in messages).
fn run_learner(label: &str, learner: LearnerConfig) -> Vec<serde_json::Value> {
    let mut cfg = TrainConfig::from_toml(&tiny_config(STEPS, 100, "sync", 0)).expect("config");
    cfg.sft.steps = 60;
    cfg.rollout.eval_tasks = 4;
    cfg.rollout.tasks_per_batch = 3;
    cfg.learner = learner;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    let steps = Arc::new(Mutex::new(Vec::new()));
    let sink_steps = steps.clone();
    let sink = Arc::new(move |ev: &TrainEvent| {
        if let TrainEvent::Step { metrics, .. } = ev {
            sink_steps
                .lock()
                .expect("lock")
                .push(serde_json::to_value(metrics).expect("json"));
        }
    });
    let metrics = TrainMetrics::new(&format!("preset-{label}")).expect("metrics");
    let outcome = run_job(cfg, store, metrics, sink, JobOptions::default())
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(outcome.final_step, STEPS, "{label}");
    let out = steps.lock().expect("lock").clone();
    out
}

#[test]
fn every_preset_trains_the_quickstart_env_without_nan() {
    tch::set_num_threads(1);
    let start = std::time::Instant::now();
    for p in Preset::ALL {
        let steps = run_preset(p);
        assert_eq!(steps.len() as u64, STEPS, "{}", p.name());
        for (i, m) in steps.iter().enumerate() {
            for (k, v) in m.as_object().expect("metrics object") {
                assert!(
                    v.as_f64().is_none_or(f64::is_finite),
                    "{} step {i}: {k} = {v}",
                    p.name()
                );
            }
            let actor_steps = m["actor_steps"].as_f64().unwrap_or(0.0);
            let critic_steps = m["critic_steps"].as_f64().unwrap_or(0.0);
            assert!(
                actor_steps + critic_steps > 0.0,
                "{} step {i} took no optimizer step",
                p.name()
            );
        }
        eprintln!(
            "{:<8} ok after {:.1}s",
            p.name(),
            start.elapsed().as_secs_f64()
        );
    }
}

/// `learner.policy_loss = "reinforce"` (verl's bypass-mode REINFORCE) trains end to end: every
/// step takes an actor step, reports finite metrics, and no PPO clipping (its clip fraction is 0).
#[test]
fn the_reinforce_loss_is_selectable_and_trains() {
    tch::set_num_threads(1);
    let steps = run_learner(
        "grpo+reinforce",
        LearnerConfig {
            policy_loss: Some(keel_learner::learner_config::PolicyLossChoice::Reinforce),
            ..LearnerConfig::for_preset(Preset::Grpo)
        },
    );
    assert_eq!(steps.len() as u64, STEPS);
    for (i, m) in steps.iter().enumerate() {
        assert!(m["actor_steps"].as_f64().unwrap_or(0.0) > 0.0, "step {i}");
        assert!(
            m["loss"].as_f64().is_some_and(f64::is_finite),
            "step {i}: {m}"
        );
        assert_eq!(m["clip_frac"].as_f64(), Some(0.0), "step {i}: no PPO clip");
    }
}
