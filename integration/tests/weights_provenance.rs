//! Weight provenance (WB-5, PV-1, PV-2): every stored turn records the digest of the weights
//! that sampled it, one digest per policy version, also for weights taken by episodes in
//! flight; a generator whose reload did not happen (`faults.skip_weight_reload`) refuses to
//! sample with an error naming the version and the backend.

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_actors::{run_job, JobOptions, TrainConfig, TrainMetrics};
use keel_integration::{tiny_config_unguarded, MethodRun};
use keel_store::RunStore;

/// (policy version → digests seen) over every turn of every batch of the run's only life.
fn digests_by_version(store: &RunStore, batches: u64) -> BTreeMap<u64, Vec<u64>> {
    let rt = keel_integration::test_rt();
    let writer = store.clone().with_writer("l0000000001").expect("writer");
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for seq in 0..batches {
        let Ok(buf) = rt.block_on(store.get_batch(&writer.batch_key(seq))) else {
            continue;
        };
        for traj in buf.archived().trajectories.iter() {
            for turn in traj.turns.iter() {
                let d = seen.entry(turn.policy_version.to_native()).or_default();
                let digest = turn.weights_digest.to_native();
                if !d.contains(&digest) {
                    d.push(digest);
                }
            }
        }
    }
    seen
}

/// Async with in-flight updates: episodes take newer weights between decode steps (RO-10), and
/// each of their turns records the digest of the version that sampled it.
#[test]
fn every_turn_records_the_digest_of_the_weights_that_sampled_it() {
    tch::set_num_threads(1);
    let toml = MethodRun {
        steps: 6,
        checkpoint_every: 6,
        mode: "async",
        bound: 2,
        latency_ms: 25.0,
        ..MethodRun::new("grpo")
    }
    .toml();
    let mut cfg = TrainConfig::from_toml(&toml).expect("config");
    cfg.rollout.generators = 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    let metrics = TrainMetrics::new("provenance-digest").expect("metrics");
    let outcome = run_job(
        cfg,
        store.clone(),
        metrics,
        Arc::new(|_| {}),
        JobOptions::default(),
    )
    .expect("run");
    assert_eq!(outcome.final_step, 6);
    let seen = digests_by_version(&store, 32);
    assert!(seen.len() >= 3, "turns of several versions: {seen:?}");
    let mut all = Vec::new();
    for (version, digests) in &seen {
        assert_eq!(
            digests.len(),
            1,
            "version {version} has one digest: {digests:?}"
        );
        assert_ne!(digests[0], 0, "version {version}: a digest is recorded");
        all.push(digests[0]);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        seen.len(),
        "each version has its own digest: {seen:?}"
    );
}

/// PV-2 → PV-1: with the reload skipped, the generator still holds version 0's tensors when
/// version 1 is due; the probe refuses them and the run ends naming version 1.
#[test]
fn a_generator_whose_reload_did_not_happen_refuses_to_sample() {
    tch::set_num_threads(1);
    let toml = tiny_config_unguarded(3, 3, "sync", 1) + "\n[faults]\nskip_weight_reload = true\n";
    let cfg = TrainConfig::from_toml(&toml).expect("config");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    let metrics = TrainMetrics::new("provenance-skip").expect("metrics");
    let err = run_job(cfg, store, metrics, Arc::new(|_| {}), JobOptions::default())
        .expect_err("stale weights must not be sampled");
    let text = format!("{err:#}");
    assert!(
        text.contains("policy version 1") && text.contains("provenance probe"),
        "{text}"
    );
    assert!(text.contains("keel backend"), "{text}");
}
