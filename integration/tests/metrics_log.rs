//! The metrics log through `keel train` (JL-1..4): a run on a new branch from an old checkpoint
//! leaves the other branch's lines alone (before, `--from`/`--branch` truncated them), a resumed
//! run logs each step once, and every line says when it was logged.

use keel_integration::events::{logged_events, step_branches, train_events};
use keel_integration::{checkpoints, run_train, tiny_config_unguarded};

fn steps_of(root: &std::path::Path, branch: &str) -> Vec<u64> {
    step_branches(&train_events(root))
        .into_iter()
        .filter(|(_, b)| b == branch)
        .map(|(step, _)| step)
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
    assert_eq!(steps_of(&root, "main"), [1, 2, 3, 4, 5, 6]);
    assert_eq!(steps_of(&root, "side"), [3, 4]);
    let lines = logged_events(&root);
    assert!(
        lines
            .iter()
            .all(|l| l.unix_ms.is_some_and(|t| t > 0) && l.elapsed_s.is_some_and(|s| s >= 0.0)),
        "every line has its time"
    );
    let stamps: Vec<u64> = lines.iter().filter_map(|l| l.unix_ms).collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "the stream is in the order the lives ran"
    );
}
