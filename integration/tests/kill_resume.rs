//! A `keel train` process SIGKILLed mid-training resumes from its last committed checkpoint
//! (step and weights verified) and finishes; in sync mode on CPU the resumed run ends with
//! weights bit-identical to an uninterrupted run of the same config.

use keel_integration::{head_weights, kill_at_checkpoint, spawn_train, test_rt, tiny_config};
use keel_store::RunStore;

#[test]
fn sigkill_mid_training_resumes_from_last_checkpoint_and_matches_uninterrupted_run() {
    let rt = test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config(30, 3, "sync", 1)).expect("config");

    // Run 1: killed once it has committed a checkpoint past step 6.
    let root = dir.path().join("killed");
    let summary = dir.path().join("killed.json");
    kill_at_checkpoint(&mut spawn_train(&config, &root, &[]), &root, 6);
    let store = RunStore::open(root.to_str().expect("utf8")).expect("open");
    let at_kill = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("checkpoint");
    assert!(
        at_kill.step >= 6 && at_kill.step < 30,
        "killed at step {}",
        at_kill.step
    );
    let weights_at_kill = rt
        .block_on(store.read_checkpoint_file(&at_kill, "model.safetensors"))
        .expect("weights");

    // Restart on the same run root: it must resume from that checkpoint and finish.
    let status = spawn_train(&config, &root, &[]).wait().expect("resume run");
    assert!(status.success(), "resumed run failed: {status}");
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["resumed_from"], serde_json::json!(at_kill.id));
    assert_eq!(outcome["final_step"], serde_json::json!(30));
    // The resumed run's first checkpoint descends from the one it resumed from.
    let all = rt.block_on(store.list_checkpoints()).expect("list");
    let child_ckpt = all
        .iter()
        .find(|m| m.parent.as_deref() == Some(at_kill.id.as_str()))
        .expect("a child checkpoint");
    assert_eq!(child_ckpt.step, at_kill.step + 3);
    // The checkpoint it resumed from is intact and verifiable.
    let again = rt
        .block_on(store.read_checkpoint_file(&at_kill, "model.safetensors"))
        .expect("weights");
    assert_eq!(again, weights_at_kill);

    // Run 2: the same config, never interrupted.
    let clean_root = dir.path().join("clean");
    let status = spawn_train(&config, &clean_root, &[])
        .wait()
        .expect("clean run");
    assert!(status.success());
    let (step_a, w_a) = head_weights(&rt, &root);
    let (step_b, w_b) = head_weights(&rt, &clean_root);
    assert_eq!((step_a, step_b), (30, 30));
    assert!(
        w_a == w_b,
        "resumed run's final weights differ from the uninterrupted run's"
    );
    // RL really moved the weights (the comparison above is not between two untouched models).
    let sft = all
        .iter()
        .find(|m| m.step == 0)
        .expect("the SFT checkpoint");
    let w_sft = rt
        .block_on(store.read_checkpoint_file(sft, "model.safetensors"))
        .expect("sft weights");
    assert!(w_sft.to_vec() != w_a, "RL did not change the weights");
}
