//! `keel train --from <ckpt> --branch B` starts a new branch whose root's parent is that
//! checkpoint (JB-5); the two branches coexist in one run root with their own heads and batches,
//! and `keel ckpt tag|verify|gc --dry-run` work on the result.

use std::process::{Command, Stdio};

use keel_integration::{check_accounting, keel_bin, tiny_config_unguarded};
use keel_store::RunStore;

fn keel(args: &[&str]) -> std::process::Output {
    Command::new(keel_bin())
        .args(args)
        .env("KEEL_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run keel")
}

#[test]
fn a_branch_from_a_checkpoint_coexists_with_main() {
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config_unguarded(10, 5, "sync", 1)).expect("config");
    let (cfg, root) = (config.to_str().expect("utf8"), dir.path().join("run"));
    let root = root.to_str().expect("utf8");
    let out = keel(&[
        "train",
        "--no-progress",
        "--config",
        cfg,
        "--run-root",
        root,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = RunStore::open(root).expect("open");
    let main_head = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("some");
    let fork = rt
        .block_on(store.ancestry(&main_head.id))
        .expect("ancestry")
        .into_iter()
        .find(|m| m.step == 5)
        .expect("step 5");

    let out = keel(&[
        "train",
        "--no-progress",
        "--config",
        cfg,
        "--run-root",
        root,
        "--from",
        &fork.id,
        "--branch",
        "exp",
        "--steps",
        "12",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exp = store.on_branch("exp").expect("branch");
    let (exp_head, lineage) = check_accounting(&rt, &exp, 6, "branch exp").expect("a checkpoint");
    assert_eq!(exp_head.step, 12);
    assert_eq!(exp_head.branch, "exp");
    assert!(
        lineage.iter().any(|m| m.id == fork.id),
        "the branch descends from the fork point"
    );
    let first = lineage
        .iter()
        .rev()
        .find(|m| m.branch == "exp")
        .expect("branch root");
    assert_eq!(first.parent.as_deref(), Some(fork.id.as_str()));
    assert_eq!(
        rt.block_on(store.latest_checkpoint()).expect("head"),
        Some(main_head.clone()),
        "main is untouched"
    );
    let names: Vec<String> = rt
        .block_on(store.list_branches())
        .expect("branches")
        .into_iter()
        .map(|h| h.branch)
        .collect();
    assert_eq!(names, vec!["exp".to_string(), "main".to_string()]);
    assert!(
        !rt.block_on(exp.list_batches()).expect("batches").is_empty(),
        "the branch has its own batches"
    );

    let out = keel(&["ckpt", "tag", &fork.id, "pinned", "--run-root", root]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = keel(&["ckpt", "verify", &exp_head.id, "--run-root", root]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("ok:"));
    let out = keel(&[
        "ckpt",
        "gc",
        "--dry-run",
        "--keep-last",
        "1",
        "--run-root",
        root,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains("dry run")
            && text.contains(&format!("keep     {}", fork.id)),
        "{text}"
    );
    let out = keel(&["ckpt", "lineage", "--run-root", root]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("exp"));
}
