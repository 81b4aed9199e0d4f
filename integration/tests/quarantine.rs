//! A corrupt rollout batch found when a run resumes is moved under `quarantine/`, counted, and the
//! run continues (JB-7, QU-1); the accounting of task ranges still holds. The resume reads only
//! the batches its checkpoint may reuse (DF-4): an old, trained-on batch is not read again.

use keel_integration::{check_accounting, guarded_output, tiny_config_unguarded, train_command};
use keel_store::RunStore;

#[test]
fn a_corrupt_batch_on_resume_is_quarantined_and_the_run_continues() {
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config_unguarded(20, 5, "async", 2)).expect("config");
    let root = dir.path().join("run");
    let summary = root.with_extension("json");
    let train = |steps: &str| {
        guarded_output(train_command(&config, &root, &["--steps", steps]).env("KEEL_LOG", "error"))
            .status
    };
    assert!(train("20").success());
    // A batch stored after the head checkpoint (what a generator that outlived the trainer
    // leaves) is one the resume reads (DF-4); damage it.
    let head = keel_integration::checkpoints(&root)
        .into_iter()
        .max_by_key(|m| m.step)
        .expect("a checkpoint");
    let old = root.join("batches").join("0000000003-l0000000001.krb");
    let name = format!("{:010}-l0000000009.krb", head.data.next_batch_seq);
    let victim = root.join("batches").join(&name);
    let mut bytes = std::fs::read(&old).expect("batch 3");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&victim, &bytes).expect("a corrupt batch after the checkpoint");
    // An old batch, trained on before the checkpoint, is never read again: damaging it changes
    // nothing.
    std::fs::write(&old, &bytes).expect("corrupt an old batch");

    assert!(
        train("30").success(),
        "the resumed run must continue past a corrupt batch"
    );
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["quarantined_batches"], serde_json::json!(1));
    assert_eq!(outcome["final_step"], serde_json::json!(30));
    assert!(!victim.exists(), "the corrupt batch left batches/");
    assert!(root.join("quarantine/batches").join(&name).exists());
    assert!(root
        .join("quarantine/batches")
        .join(format!("{name}.reason.txt"))
        .exists());
    assert!(
        old.exists(),
        "an old batch the resume does not read stays where it is"
    );
    let store = RunStore::open(root.to_str().expect("utf8")).expect("open");
    let (head, _) = check_accounting(&rt, &store, 6, "after the quarantine").expect("a checkpoint");
    assert_eq!(head.step, 30);
}
