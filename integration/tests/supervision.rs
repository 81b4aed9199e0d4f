//! A panicking environment never takes the run down: the env shard restarts under its
//! supervisor (ES-1, SV-1), the episodes it held are excluded (RO-4), and training finishes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keel_actors::env_shard::EnvFactory;
use keel_actors::{run_job, JobOptions, TrainConfig, TrainMetrics};
use keel_envs::{make_env, Env, StepOutcome};
use keel_integration::tiny_config;
use keel_store::RunStore;

/// The calc env, except that every 41st step across all instances panics.
struct FlakyEnv {
    inner: Box<dyn Env>,
    steps: Arc<AtomicU64>,
}

impl Env for FlakyEnv {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn reset(&mut self, task_seed: u64) -> String {
        self.inner.reset(task_seed)
    }
    fn step(&mut self, action: &str) -> StepOutcome {
        if self.steps.fetch_add(1, Ordering::SeqCst) % 41 == 40 {
            panic!("injected env failure");
        }
        self.inner.step(action)
    }
    fn oracle_action(&self) -> String {
        self.inner.oracle_action()
    }
    fn max_turns(&self) -> usize {
        self.inner.max_turns()
    }
    fn success(&self) -> bool {
        self.inner.success()
    }
    fn vocabulary(&self) -> Vec<String> {
        self.inner.vocabulary()
    }
    fn admissible_actions(&self) -> Vec<String> {
        self.inner.admissible_actions()
    }
    fn anchor_state(&self) -> String {
        self.inner.anchor_state()
    }
    fn snapshot(&self) -> Result<keel_envs::EnvSnapshot, keel_envs::EnvError> {
        self.inner.snapshot()
    }
    fn restore(&mut self, snapshot: &keel_envs::EnvSnapshot) -> Result<(), keel_envs::EnvError> {
        self.inner.restore(snapshot)
    }
}

#[test]
fn panicking_env_restarts_its_shard_and_the_run_finishes() {
    tch::set_num_threads(1);
    let cfg = TrainConfig::from_toml(&tiny_config(6, 3, "sync", 1)).expect("config");
    let steps = Arc::new(AtomicU64::new(0));
    let counter = steps.clone();
    let factory: EnvFactory = Arc::new(move || {
        Ok(Box::new(FlakyEnv {
            inner: make_env("calc", 1)?,
            steps: counter.clone(),
        }) as Box<dyn Env>)
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    let metrics = TrainMetrics::new("supervision-test").expect("metrics");
    let outcome = run_job(
        cfg,
        store,
        metrics,
        keel_actors::events::no_events(),
        JobOptions {
            env_factory: Some(factory),
            ..JobOptions::default()
        },
    )
    .expect("the run survives env panics");
    assert_eq!(outcome.final_step, 6);
    assert!(
        outcome.env_shard_restarts >= 1,
        "no restart recorded: {outcome:?}"
    );
    assert!(steps.load(Ordering::SeqCst) > 41);
}
