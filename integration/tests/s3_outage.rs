//! An S3 outage of tens of seconds pauses a run and loses nothing (ST-7): the test kills its own
//! SeaweedFS server mid-run, keeps it down for 20 s, restarts it on the same data, and the run
//! finishes with every task range accounted for.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_integration::{check_accounting, keel_bin, tiny_config_unguarded, OwnSeaweed};
use keel_store::RunStore;

#[test]
fn a_20_second_s3_outage_pauses_the_run_and_loses_nothing() {
    let mut server = OwnSeaweed::start();
    eprintln!("own seaweedfs on {}", server.endpoint);
    // This test binary talks only to its own server.
    std::env::set_var("AWS_ENDPOINT_URL", &server.endpoint);
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = 150;
    let toml = tiny_config_unguarded(steps, 2, "async", 2);
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, toml).expect("config");
    let root = keel_integration::s3_root("outage");
    let summary = dir.path().join("summary.json");
    let log = dir.path().join("train.log");
    let mut child = Command::new(keel_bin())
        .args(["train", "--no-progress", "--config"])
        .arg(&config)
        .args(["--run-root", &root])
        .arg("--summary-json")
        .arg(&summary)
        .env("AWS_ENDPOINT_URL", &server.endpoint)
        .env("KEEL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start keel train");
    let store = RunStore::open(&root).expect("open");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(
            Instant::now() < deadline,
            "no checkpoint past step 6 within 300 s"
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "training ended before the outage"
        );
        if rt
            .block_on(store.latest_checkpoint())
            .ok()
            .flatten()
            .is_some_and(|m| m.step >= 6)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("killing seaweedfs");
    server.kill();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(20));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "training died during the outage: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    eprintln!("restarting seaweedfs");
    server.restart();
    eprintln!("outage lasted {:.1} s", down.elapsed().as_secs_f64());
    let status = child.wait().expect("wait");
    assert!(
        status.success(),
        "run failed after the outage: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["final_step"], serde_json::json!(steps));
    let (head, _) = check_accounting(&rt, &store, 6, "after the outage").expect("a checkpoint");
    assert_eq!(head.step, steps);
}

/// HL-1/HL-2: storage that never comes back ends the run within its retry budget plus a few seconds
/// (it took three budgets one after another: the failing write, the metrics log, the life end).
#[test]
fn killed_storage_ends_the_run_within_the_retry_budget() {
    let mut server = OwnSeaweed::start();
    std::env::set_var("AWS_ENDPOINT_URL", &server.endpoint);
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config_unguarded(100_000, 2, "async", 2)).expect("config");
    let root = keel_integration::s3_root("dead-storage");
    let log = dir.path().join("train.log");
    let budget = 10;
    let mut child = keel_integration::Guarded::spawn(
        Command::new(keel_bin())
            .args(["train", "--no-progress", "--config"])
            .arg(&config)
            .args(["--run-root", &root])
            .env("AWS_ENDPOINT_URL", &server.endpoint)
            .env("KEEL_S3_RETRY_TIMEOUT_S", budget.to_string())
            .env("KEEL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log")),
    )
    .expect("start keel train");
    let store = RunStore::open(&root).expect("open");
    let reached = |rt: &tokio::runtime::Runtime| {
        rt.block_on(store.latest_checkpoint())
            .ok()
            .flatten()
            .is_some_and(|m| m.step >= 2)
    };
    while !reached(&rt) {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the run ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
    let killed = Instant::now();
    let status = child.wait().expect("wait");
    let took = killed.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !status.success(),
        "the run cannot succeed without storage:\n{text}"
    );
    eprintln!("storage killed: the run failed after {took:?} (retry budget {budget} s)");
    assert!(
        took < Duration::from_secs(2 * budget),
        "failing took {took:?}, more than twice the {budget} s retry budget:\n{text}"
    );
}
