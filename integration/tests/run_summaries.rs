//! What a run says about itself when it ends (issue 32 item 10): a run stopped after a
//! collapse-guard rewind names the branch its last checkpoint is on, prints no NaN for the
//! evaluation it did not run, and `keel report` counts the dropped batches the run counted.

use std::process::{Command, Stdio};

use keel_integration::{keel_bin, test_rt, train_command, Guarded, MethodRun};
use keel_store::RunStore;

#[test]
fn a_run_stopped_after_a_rewind_reports_its_branch_and_drops_truthfully() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let toml = MethodRun {
        steps: 100_000,
        checkpoint_every: 2,
        mode: "async",
        bound: 4,
        guard: true,
        latency_ms: 2.0,
        ..MethodRun::new("grpo")
    }
    .toml()
        + "\n[faults]\nnan_loss_at_step = 5\nnan_loss_count = 3\n";
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, toml).expect("config");
    let root = dir.path().join("run");
    let summary = root.with_extension("json");
    let stdout = dir.path().join("stdout.txt");
    let mut child = Guarded::spawn(
        train_command(&cfg, &root, &[])
            .env("KEEL_LOG", "warn")
            .stdout(std::fs::File::create(&stdout).expect("stdout"))
            .stderr(Stdio::null()),
    )
    .expect("start keel train");
    // Progress, not time: SIGTERM once the rewind branch has a checkpoint past the poisoned step.
    let store = RunStore::open(root.to_str().expect("utf-8")).expect("open");
    loop {
        let head = rt.block_on(store.branch_head("rewind-1")).ok().flatten();
        let step = head
            .and_then(|h| rt.block_on(store.ancestry(&h.id)).ok())
            .and_then(|a| a.into_iter().next())
            .map_or(0, |m| m.step);
        if step >= 6 {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("keel train ended ({status}) before the rewind branch got a checkpoint");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = child.wait().expect("wait");
    let printed = std::fs::read_to_string(&stdout).expect("stdout");
    assert!(status.success(), "{status}: {printed}");
    assert!(
        printed.contains("committed on branch rewind-1"),
        "the stop message names the checkpoint's branch:\n{printed}"
    );
    assert!(!printed.contains("NaN"), "{printed}");
    assert!(printed.contains("not evaluated"), "{printed}");
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["branch"], "rewind-1", "{outcome}");
    let dropped = outcome["dropped_batches"]
        .as_u64()
        .expect("dropped_batches");
    let report = Command::new(keel_bin())
        .args(["report", "--no-progress"])
        .arg(&root)
        .output()
        .expect("keel report");
    assert!(report.status.success(), "{report:?}");
    let md = std::fs::read_to_string(root.join("report/summary.md")).expect("summary.md");
    assert!(
        md.contains(&format!("Batches dropped: {dropped}.")),
        "the run printed {dropped} dropped batches:\n{md}"
    );
    eprintln!("dropped batches: {dropped}");
}
