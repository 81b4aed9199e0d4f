//! The collapse guard on real runs with injected faults (`[faults]`, a testing aid): non-finite
//! steps are skipped and K of them in a row rewind to the newest healthy checkpoint on a new
//! branch (GD-1, GD-2, CT-4); a learning-rate blow-up is caught as a spike and rewound with a
//! lower rate; with no rewinds left the run ends with an error (GD-5); a later run follows the
//! rewind to the new branch (GD-6) and keeps the rewinds and the cut rate (GD-7).

use std::path::Path;
use std::process::{Command, Output};

use keel_actors::events::TrainEvent;
use keel_integration::events::{rewinds, skipped_steps, step_branches, step_events, train_events};
use keel_integration::{keel_bin, tiny_config, train_toml_output};

fn events(dir: &Path) -> Vec<TrainEvent> {
    train_events(&dir.join("run"))
}

/// `(step, branch)` of the last step event.
fn last_step(events: &[TrainEvent]) -> Option<(u64, String)> {
    step_branches(events).pop()
}

/// The crash harness's books on `branch` after a rewind: along its lineage every task range is
/// trained at most once, and trained + pending ranges are exactly those handed out (the ranges
/// trained on the abandoned branch after the healthy checkpoint are owed again, not lost).
fn assert_accounted(dir: &Path, branch: &str) {
    let rt = keel_integration::test_rt();
    let root = dir.join("run");
    let store = keel_store::RunStore::open(root.to_str().expect("utf8"))
        .and_then(|s| s.on_branch(branch))
        .expect("open the run root");
    keel_integration::check_accounting(&rt, &store, TASKS_PER_BATCH, branch).expect("a checkpoint");
}

/// `rollout.tasks_per_batch` of `tiny_config`.
const TASKS_PER_BATCH: u64 = 6;

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn gd2_consecutive_nan_steps_rewind_to_the_newest_healthy_checkpoint_on_a_new_branch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg =
        tiny_config(10, 2, "sync", 1) + "\n[faults]\nnan_loss_at_step = 5\nnan_loss_count = 3\n";
    let out = train_toml_output(dir.path(), &cfg);
    assert!(out.status.success(), "{}", text(&out));
    let ev = events(dir.path());
    let skipped = skipped_steps(&ev);
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(
        skipped
            .iter()
            .all(|(step, what)| *step == 4 && what == "loss"),
        "{skipped:?}"
    );
    let rewinds = rewinds(&ev);
    assert_eq!(rewinds.len(), 1, "{rewinds:?}");
    let r = &rewinds[0];
    assert_eq!(
        (r.kind.as_str(), r.from_step, r.to_step),
        ("nonfinite", 4, 4)
    );
    assert_eq!(r.branch, "rewind-1");
    assert_eq!(
        last_step(&ev),
        Some((10, "rewind-1".to_string())),
        "the run finished on the new branch"
    );
    assert_accounted(dir.path(), "rewind-1");
    assert!(
        step_events(&ev).iter().all(|s| s.metrics.loss.is_finite()),
        "no NaN reached an update"
    );

    // The lineage records the new branch, its reason, and its parent: the healthy step-4 checkpoint.
    let lineage = Command::new(keel_bin())
        .args(["ckpt", "lineage", "--run-root"])
        .arg(dir.path().join("run"))
        .output()
        .expect("lineage");
    let tree = text(&lineage);
    assert!(lineage.status.success(), "{tree}");
    let branch_start = tree
        .lines()
        .find(|l| l.contains("branch rewind-1 [rewind, anomaly-nonfinite"))
        .unwrap_or_else(|| panic!("{tree}"));
    let parent_line = tree
        .lines()
        .take_while(|l| *l != branch_start)
        .last()
        .expect("parent line");
    assert!(
        parent_line.contains("step 4  branch main [healthy, rewound-to-rewind-1]"),
        "{tree}"
    );
    assert!(tree.contains("<- HEAD rewind-1"), "{tree}");

    // GD-6: a later `keel train` on the run root continues the new branch, not the abandoned one.
    let more = tiny_config(12, 2, "sync", 1);
    let out = train_toml_output(dir.path(), &more);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("branch: rewind-1"), "{t}");
    assert_eq!(
        last_step(&events(dir.path())),
        Some((12, "rewind-1".to_string())),
        "resumed on the rewind branch"
    );

    // And the report plots both branches.
    let report = Command::new(keel_bin())
        .args(["report", "--no-progress"])
        .arg(dir.path().join("run"))
        .output()
        .expect("report");
    assert!(report.status.success(), "{}", text(&report));
    let summary =
        std::fs::read_to_string(dir.path().join("run/report/summary.md")).expect("summary");
    assert!(
        summary.contains("`rewind-1`") && summary.contains("non-finite loss"),
        "{summary}"
    );
    assert!(
        dir.path().join("run/report/grad_norm.png").exists()
            && dir.path().join("run/report/kl.svg").exists()
    );
}

/// An async rewind with generation orders still out (RW-1): those orders belong to the abandoned
/// branch, so the new branch's first checkpoint must not count their ranges as pending (it
/// would hold ranges at or past its own frontier, and the commit would be refused as corrupt:
/// the arena's SAMPO stress cells hit it).
#[test]
fn gd2_an_async_rewind_with_orders_in_flight_continues_on_the_new_branch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = keel_integration::MethodRun {
        steps: 10,
        checkpoint_every: 2,
        mode: "async",
        bound: 4,
        guard: true,
        latency_ms: 2.0,
        ..keel_integration::MethodRun::new("grpo")
    }
    .toml()
        + "\n[faults]\nnan_loss_at_step = 5\nnan_loss_count = 3\n";
    let out = train_toml_output(dir.path(), &cfg);
    assert!(out.status.success(), "{}", text(&out));
    let ev = events(dir.path());
    let rewinds = rewinds(&ev);
    assert_eq!(rewinds.len(), 1, "{rewinds:?}");
    assert_eq!(rewinds[0].branch, "rewind-1");
    assert_eq!(last_step(&ev), Some((10, "rewind-1".to_string())));
    assert_accounted(dir.path(), "rewind-1");
}

#[test]
fn gd2_a_learning_rate_blowup_is_caught_as_a_spike_and_rewound_with_a_lower_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg =
        tiny_config(12, 3, "sync", 1) + "\n[faults]\nlr_blowup_at_step = 8\nlr_blowup_to = 1.0\n";
    let out = train_toml_output(dir.path(), &cfg);
    assert!(out.status.success(), "{}", text(&out));
    let ev = events(dir.path());
    let rewinds = rewinds(&ev);
    assert!(
        !rewinds.is_empty(),
        "the blow-up went unnoticed: {}",
        text(&out)
    );
    let r = &rewinds[0];
    assert!(
        ["kl_spike", "grad_norm_spike", "nonfinite"].contains(&r.kind.as_str()),
        "{r:?}"
    );
    assert!(r.from_step >= 8, "{r:?}");
    assert_eq!(
        r.to_step, 6,
        "newest healthy checkpoint before the blow-up: {r:?}"
    );
    assert!(
        r.lr > 0.0 && r.lr < 0.01,
        "the rate after the rewind is lowered: {r:?}"
    );
    assert_eq!(last_step(&ev).map(|(step, _)| step), Some(12));
    let last_rewind = rewinds.last().expect("a rewind");
    assert_accounted(dir.path(), &last_rewind.branch);
}

#[test]
fn gd5_with_no_rewinds_left_the_run_exits_3_naming_the_anomaly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = tiny_config(8, 2, "sync", 1)
        + "\n[guard]\nmax_rewinds = 0\nmax_consecutive_skips = 2\n\n[faults]\nnan_loss_at_step = 3\nnan_loss_count = 2\n";
    let out = train_toml_output(dir.path(), &cfg);
    let t = text(&out);
    assert_eq!(
        out.status.code(),
        Some(3),
        "a collapse exits 3, other errors 1: {t}"
    );
    assert!(
        t.contains("training collapsed: 2 consecutive steps with a non-finite loss"),
        "{t}"
    );
}

/// The `learner.json` `config.lr` of every checkpoint of the run root, by step (newest last).
fn checkpoint_lrs(dir: &Path) -> Vec<(u64, f64)> {
    let root = dir.join("run");
    let mut out: Vec<(u64, f64)> = keel_integration::checkpoints(&root)
        .iter()
        .map(|m| {
            let bytes = keel_integration::checkpoint_file(&root, m, "learner.json");
            let v: serde_json::Value = serde_json::from_slice(&bytes).expect("learner.json");
            (m.step, v["config"]["lr"].as_f64().expect("config.lr"))
        })
        .collect();
    out.sort_by_key(|(step, _)| *step);
    out
}

/// GD-7: a restarted run keeps the guard's rewinds and the learning rate they cut; before, a
/// restart gave it `max_rewinds` again and the original rate.
#[test]
fn gd7_a_restart_keeps_the_rewinds_and_the_cut_learning_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let guard = "\n[guard]\nmax_rewinds = 1\nmax_consecutive_skips = 1\nrewind_lr_factor = 0.5\n";
    let first = tiny_config(8, 2, "sync", 1) + guard + "\n[faults]\nnan_loss_at_step = 5\n";
    let out = train_toml_output(dir.path(), &first);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(rewinds(&events(dir.path())).len(), 1);
    let lrs = checkpoint_lrs(dir.path());
    let base = lrs.first().expect("checkpoints").1;
    let cut = lrs.last().expect("checkpoints").1;
    assert!((cut - base * 0.5).abs() < base * 1e-12, "{lrs:?}");

    // A new process on the rewind branch, with another fault at step 12: the one rewind is
    // spent, so the run must end naming the anomaly, at the cut rate until then.
    let second = tiny_config(14, 2, "sync", 1) + guard + "\n[faults]\nnan_loss_at_step = 12\n";
    let out = train_toml_output(dir.path(), &second);
    let t = text(&out);
    assert!(!out.status.success(), "a second rewind was allowed:\n{t}");
    assert!(t.contains("training collapsed"), "{t}");
    let lrs = checkpoint_lrs(dir.path());
    let resumed: Vec<f64> = lrs
        .iter()
        .filter(|(s, _)| *s > 8)
        .map(|(_, lr)| *lr)
        .collect();
    assert!(
        !resumed.is_empty(),
        "the second process committed nothing: {lrs:?}"
    );
    assert!(
        resumed.iter().all(|lr| (lr - cut).abs() < base * 1e-12),
        "the restart reset the rate: {lrs:?}"
    );
}

/// LA-6: a panic in the learner's update ends the run non-zero with a message that names it
/// (before, the actor was respawned uninitialised and the run ended with a mailbox error);
/// nothing is checkpointed after it, and a new run resumes from the last committed checkpoint.
#[test]
fn la6_a_learner_panic_ends_the_run_naming_it_and_a_new_run_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = tiny_config(8, 2, "sync", 1);
    let out = train_toml_output(
        dir.path(),
        &(base.clone() + "\n[faults]\nlearner_panic_at_step = 5\n"),
    );
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("the learner panicked while updating the policy: fault injection: the learner panicked before update 5"),
        "{t}"
    );
    assert!(!t.contains("mailbox"), "{t}");
    let steps = |dir: &Path| -> Vec<u64> {
        keel_integration::checkpoints(&dir.join("run"))
            .iter()
            .map(|m| m.step)
            .collect()
    };
    assert_eq!(
        steps(dir.path()).iter().max(),
        Some(&4),
        "nothing after the panic"
    );

    let out = train_toml_output(dir.path(), &base);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(steps(dir.path()).iter().max(), Some(&8));
}
