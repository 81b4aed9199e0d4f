//! A panicking environment never takes the run down: the env shard restarts under its
//! supervisor (ES-1, SV-1), the episodes it held are excluded (RO-4), and training finishes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keel_actors::env_shard::EnvFactory;
use keel_actors::{run_job, JobOptions, TrainConfig, TrainMetrics};
use keel_envs::{make_env, Env};
use keel_integration::{tiny_config, HookedEnv};
use keel_store::RunStore;

#[test]
fn panicking_env_restarts_its_shard_and_the_run_finishes() {
    tch::set_num_threads(1);
    let cfg = TrainConfig::from_toml(&tiny_config(6, 3, "sync", 1)).expect("config");
    let steps = Arc::new(AtomicU64::new(0));
    let counter = steps.clone();
    // The calc env, except that every 41st step across all instances panics.
    let factory: EnvFactory = Arc::new(move || {
        let counter = counter.clone();
        let hook = Arc::new(move |_seed: u64| {
            if counter.fetch_add(1, Ordering::SeqCst) % 41 == 40 {
                panic!("injected env failure");
            }
        });
        Ok(Box::new(HookedEnv::new(make_env("calc", 1)?, hook)) as Box<dyn Env>)
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
