//! Async mode never trains on a token older than the staleness bound: every trained batch is
//! checked independently from what the store holds and the step that consumed it.

use std::sync::{Arc, Mutex};

use keel_actors::{run_job, JobOptions, TrainConfig, TrainEvent, TrainMetrics};
use keel_integration::tiny_config;
use keel_store::RunStore;

#[test]
fn async_mode_never_trains_beyond_the_bound() {
    tch::set_num_threads(1);
    let mut cfg = TrainConfig::from_toml(&tiny_config(8, 4, "async", 1)).expect("config");
    cfg.rollout.generators = 2; // two batches in flight at once: the second is always one version old
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    let steps = Arc::new(Mutex::new(Vec::new()));
    let sink_steps = steps.clone();
    let sink = Arc::new(move |ev: &TrainEvent| {
        if let TrainEvent::Step {
            step,
            batch_seq,
            max_lag,
            ..
        } = ev
        {
            sink_steps
                .lock()
                .expect("lock")
                .push((*step, *batch_seq, *max_lag));
        }
    });
    let metrics = TrainMetrics::new("async-test").expect("metrics");
    let outcome =
        run_job(cfg, store.clone(), metrics, sink, JobOptions::default()).expect("async run");
    assert_eq!(outcome.final_step, 8);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let steps = steps.lock().expect("lock").clone();
    assert_eq!(steps.len(), 8);
    let mut max_seen = 0;
    for (step, batch_seq, reported_lag) in steps {
        let buf = rt
            .block_on(store.get_batch(&store.batch_key(batch_seq)))
            .expect("stored batch");
        let trained_at = step - 1; // the version the learner held when it used this batch
        for traj in buf.archived().trajectories.iter() {
            for turn in traj.turns.iter() {
                let sampled = turn.policy_version.to_native();
                assert!(
                    sampled <= trained_at,
                    "batch {batch_seq} sampled by a future version"
                );
                let lag = trained_at - sampled;
                assert!(
                    lag <= 1,
                    "batch {batch_seq}: a token {lag} versions old was trained at step {step}"
                );
                max_seen = max_seen.max(lag);
            }
        }
        assert!(reported_lag <= 1);
    }
    assert_eq!(
        max_seen, 1,
        "async mode should actually overlap sampling and training"
    );
}
