//! The metrics log through `keel train` (JL-1..4): a run on a new branch from an old checkpoint
//! leaves the other branch's lines alone (before, `--from`/`--branch` truncated them), a resumed
//! run logs each step once, and every line says when it was logged.

use keel_integration::{checkpoints, read_events, run_train, step_events, tiny_config_unguarded};

fn steps_of(events: &[serde_json::Value], branch: &str) -> Vec<u64> {
    step_events(events)
        .iter()
        .filter(|e| e["branch"] == branch)
        .filter_map(|e| e["step"].as_u64())
        .collect()
}

#[test]
fn a_branch_from_an_old_checkpoint_keeps_the_other_branchs_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("keel.toml");
    std::fs::write(&config, tiny_config_unguarded(6, 2, "sync", 0)).expect("config");
    let root = dir.path().join("run");
    run_train(&config, &root, &["--steps", "4"]);
    // Resumed to 6 steps: steps 1..4 once, then 5 and 6.
    run_train(&config, &root, &[]);
    let at2 = checkpoints(&root)
        .into_iter()
        .find(|m| m.step == 2)
        .expect("a checkpoint at step 2");
    run_train(
        &config,
        &root,
        &["--from", &at2.id, "--branch", "side", "--steps", "4"],
    );
    let events = read_events(&root);
    assert_eq!(steps_of(&events, "main"), [1, 2, 3, 4, 5, 6]);
    assert_eq!(steps_of(&events, "side"), [3, 4]);
    assert!(
        events
            .iter()
            .all(|e| e["unix_ms"].as_u64().is_some_and(|t| t > 0)
                && e["elapsed_s"].as_f64().is_some_and(|s| s >= 0.0)),
        "every line has its time"
    );
    let stamps: Vec<u64> = events
        .iter()
        .filter_map(|e| e["unix_ms"].as_u64())
        .collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "the stream is in the order the lives ran"
    );
}
