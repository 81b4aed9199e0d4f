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

/// RO-13: SIGTERM during the evaluation before RL ends it at the next decode step: the process
/// exits 0 without waiting out the evaluation or the grace period (before, it sat in the
/// evaluation and the grace period ended it with exit 1). The evaluation is made long (2 s per
/// env step, one env call at a time) and the signal is sent once SFT reports its end, after
/// which the next thing the job does is that evaluation; the assertions are on what the run
/// did (no evaluation reported, no RL step, no checkpoint), never on the clock.
#[test]
fn sigterm_during_the_evaluation_before_rl_stops_it_and_exits_zero() {
    use keel_actors::events::TrainEvent;
    use keel_integration::events::train_events;
    let dir = tempfile::tempdir().expect("tempdir");
    let run = keel_integration::MethodRun {
        latency_ms: 2000.0,
        ..keel_integration::MethodRun::new("grpo")
    };
    let toml = run
        .toml()
        .replace("[env]\n", "[env]\nconcurrency = 1\n")
        .replace("threads = 1", "threads = 1\nsigterm_grace_s = 600");
    let config = dir.path().join("slow-eval.toml");
    std::fs::write(&config, toml).expect("config");
    let root = dir.path().join("run");
    let summary = root.with_extension("json");
    let mut child = spawn_train(&config, &root, &[]);
    let sft_done = |events: &[TrainEvent]| {
        events
            .iter()
            .any(|e| matches!(e, TrainEvent::SftDone { .. }))
    };
    while !sft_done(&train_events(&root)) {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "training ended before SFT reported its end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    keel_integration::roles::signal(&child.id().to_string(), "-TERM");
    let status = child.wait().expect("wait");
    assert!(status.success(), "SIGTERM must end in exit 0, got {status}");
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["stopped"], serde_json::json!(true), "{outcome}");
    assert_eq!(outcome["final_step"], serde_json::json!(0), "{outcome}");
    assert_eq!(
        outcome["last_checkpoint"],
        serde_json::Value::Null,
        "{outcome}"
    );
    let evals = train_events(&root)
        .into_iter()
        .filter(|e| matches!(e, TrainEvent::Eval { .. }))
        .count();
    assert_eq!(evals, 0, "the evaluation was interrupted, not finished");
}
