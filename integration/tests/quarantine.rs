//! A corrupt rollout batch found when a run resumes is moved under `quarantine/`, counted, and the
//! run continues (JB-7, QU-1); the accounting of task ranges still holds.

use std::process::{Command, Stdio};

use keel_integration::{check_accounting, keel_bin, tiny_config_unguarded};
use keel_store::RunStore;

#[test]
fn a_corrupt_batch_on_resume_is_quarantined_and_the_run_continues() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config_unguarded(20, 5, "async", 2)).expect("config");
    let root = dir.path().join("run");
    let summary = dir.path().join("summary.json");
    let train = |steps: &str| {
        Command::new(keel_bin())
            .args(["train", "--no-progress", "--steps", steps, "--config"])
            .arg(&config)
            .arg("--run-root")
            .arg(&root)
            .arg("--summary-json")
            .arg(&summary)
            .env("KEEL_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("keel train")
    };
    assert!(train("20").success());
    let victim = root.join("batches").join("0000000003-l0000000001.krb");
    let mut bytes = std::fs::read(&victim).expect("batch 3");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&victim, &bytes).expect("corrupt it");

    assert!(
        train("30").success(),
        "the resumed run must continue past a corrupt batch"
    );
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["quarantined_batches"], serde_json::json!(1));
    assert_eq!(outcome["final_step"], serde_json::json!(30));
    assert!(!victim.exists(), "the corrupt batch left batches/");
    assert!(root
        .join("quarantine/batches/0000000003-l0000000001.krb")
        .exists());
    assert!(root
        .join("quarantine/batches/0000000003-l0000000001.krb.reason.txt")
        .exists());
    let store = RunStore::open(root.to_str().expect("utf8")).expect("open");
    let (head, _) = check_accounting(&rt, &store, 6, "after the quarantine").expect("a checkpoint");
    assert_eq!(head.step, 30);
}
