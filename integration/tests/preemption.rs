//! Spot preemption: SIGTERM makes `keel train` finish the current update, commit a checkpoint
//! within `run.sigterm_grace_s` and exit 0 (CT-5, JB-6, PE-1); the next start resumes from that
//! checkpoint and finishes with every task range accounted for.

use std::process::Command;
use std::time::{Duration, Instant};

use keel_integration::{check_accounting, spawn_train, tiny_config_unguarded};
use keel_store::RunStore;

#[test]
fn sigterm_commits_a_checkpoint_within_the_grace_period_and_exits_zero() {
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = 300;
    // Checkpoints every 1000 steps: the only one after SFT is the one SIGTERM asks for.
    let toml = tiny_config_unguarded(steps, 1000, "async", 2)
        .replace("threads = 1", "threads = 1\nsigterm_grace_s = 30");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, toml).expect("config");
    let root = dir.path().join("run");
    let summary = root.with_extension("json");
    let train = || spawn_train(&config, &root, &[]);
    let store = RunStore::open(root.to_str().expect("utf8")).expect("open");
    let mut child = train();
    let deadline = Instant::now() + Duration::from_secs(300);
    while rt
        .block_on(store.latest_checkpoint())
        .ok()
        .flatten()
        .is_none()
    {
        assert!(Instant::now() < deadline, "no SFT checkpoint within 300 s");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "training ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500)); // some RL steps, batches in flight
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(kill.success());
    let status = child.wait().expect("wait");
    let took = sent.elapsed();
    assert!(status.success(), "SIGTERM must end in exit 0, got {status}");
    assert!(
        took < Duration::from_secs(30),
        "stopping took {took:?}, over the grace period"
    );
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["stopped"], serde_json::json!(true), "{outcome}");
    let stopped_at = outcome["final_step"].as_u64().expect("final_step");
    assert!(
        stopped_at > 0 && stopped_at < steps,
        "stopped at {stopped_at}"
    );
    let (head, _) = check_accounting(&rt, &store, 6, "after SIGTERM").expect("a checkpoint");
    assert_eq!(head.step, stopped_at, "the stop checkpoint is the head");
    assert_eq!(outcome["last_checkpoint"], serde_json::json!(head.id));

    let status = train().wait().expect("resume");
    assert!(status.success());
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["resumed_from"], serde_json::json!(head.id));
    assert_eq!(outcome["final_step"], serde_json::json!(steps));
    let (end, _) = check_accounting(&rt, &store, 6, "after the resumed run").expect("a checkpoint");
    assert_eq!(end.step, steps);
}
