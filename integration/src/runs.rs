//! `keel train` runs as the process-level tests drive them: the one command line, its captured
//! output, and the one kill loop.
//!
//! Every process started here runs under [`Guarded`] (PG-1/2), also the ones whose output a
//! test reads. A kill waits for progress — a checkpoint, a metrics-log event, a file — never for
//! a span of wall time; its deadline only ends a test whose run stopped making progress.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use keel_actors::events::TrainEvent;

use crate::events::train_events;
use crate::{keel_bin, log_tail, run_train, test_rt, Guarded, MethodRun};

/// How long a kill waits for its progress before the test fails.
pub const PROGRESS_DEADLINE: Duration = Duration::from_secs(300);

/// `keel train --no-progress --config <config> --run-root <root> --summary-json <root>.json
/// [extra]`; stdout, stderr and `KEEL_LOG` are the caller's to set.
pub fn train_command(config: &Path, root: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(keel_bin());
    cmd.args(["train", "--no-progress", "--config"])
        .arg(config)
        .arg("--run-root")
        .arg(root)
        .arg("--summary-json")
        .arg(root.with_extension("json"))
        .args(extra);
    cmd
}

/// Runs `cmd` to its end under the process guard and answers its status, stdout and stderr.
pub fn guarded_output(cmd: &mut Command) -> Output {
    let mut child = Guarded::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
        .expect("start the process");
    let stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || read_all(stderr));
    let stdout = child.stdout.take().map(read_all).unwrap_or_default();
    let stderr = reader.join().expect("stderr reader");
    let status = child.wait().expect("wait");
    Output {
        status,
        stdout,
        stderr,
    }
}

fn read_all(mut from: impl std::io::Read) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = from.read_to_end(&mut out);
    out
}

/// Runs `keel train` (see [`train_command`]) to its end; answers its output, success or not.
pub fn train_output(config: &Path, root: &Path, extra: &[&str]) -> Output {
    guarded_output(&mut train_command(config, root, extra))
}

/// Writes `toml` to `<dir>/keel.toml` and runs `keel train` on run root `<dir>/run` to its end
/// (see [`train_output`]).
pub fn train_toml_output(dir: &Path, toml: &str) -> Output {
    let config = dir.join("keel.toml");
    std::fs::write(&config, toml).expect("write config");
    train_output(&config, &dir.join("run"), &[])
}

/// Runs `run` to its end in a fresh folder, as `<folder>/<name>.toml` on run root
/// `<folder>/<name>`, and checks that it reached `run.steps`; answers (folder, run root, summary,
/// events of the metrics log).
pub fn train_method(
    run: &MethodRun,
    name: &str,
) -> (
    tempfile::TempDir,
    PathBuf,
    serde_json::Value,
    Vec<TrainEvent>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = run.write(dir.path(), name);
    let root = dir.path().join(name);
    let summary = run_train(&config, &root, &[]);
    assert_eq!(
        summary["final_step"],
        serde_json::json!(run.steps),
        "{name}"
    );
    let events = train_events(&root);
    (dir, root, summary, events)
}

/// Waits until `ready()` holds, polled every `every`, then SIGKILLs `child` and reaps it. Panics,
/// with `log()` in the message, when the child exits first or no progress came within
/// [`PROGRESS_DEADLINE`].
pub fn kill_once(
    child: &mut Child,
    what: &str,
    every: Duration,
    log: impl Fn() -> String,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + PROGRESS_DEADLINE;
    while !ready() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the run exited ({status}) before {what}:\n{}", log());
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within {PROGRESS_DEADLINE:?}:\n{}",
            log()
        );
        std::thread::sleep(every);
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
}

/// Starts `keel train` on `root` ([`crate::spawn_train`]) and SIGKILLs it once `ready()` holds
/// (polled every 20 ms, see [`kill_once`]).
pub fn train_killed_when(config: &Path, root: &Path, what: &str, ready: impl FnMut() -> bool) {
    let mut child = crate::spawn_train(config, root, &[]);
    kill_once(
        &mut child,
        what,
        Duration::from_millis(20),
        || log_tail(root),
        ready,
    );
}

/// The step of the head checkpoint of a local run root (`None` before the first one).
pub fn head_step(root: &Path) -> Option<u64> {
    if !root.exists() {
        return None;
    }
    let store = keel_store::RunStore::open(root.to_str()?).ok()?;
    let head = test_rt().block_on(store.latest_checkpoint()).ok().flatten();
    head.map(|m| m.step)
}

/// SIGKILLs the `keel train` run `child` on local `root` once its head checkpoint is at `step`
/// or later (see [`kill_once`]).
pub fn kill_at_checkpoint(child: &mut Child, root: &Path, step: u64) {
    kill_once(
        child,
        &format!("a checkpoint at step {step} or later"),
        Duration::from_millis(20),
        || log_tail(root),
        || head_step(root).is_some_and(|s| s >= step),
    );
}

/// Waits for `child` to exit and answers its status; past `timeout` SIGKILLs and reaps it and
/// panics with `log()` in the message.
pub fn wait_exit(
    child: &mut Child,
    timeout: Duration,
    log: impl Fn() -> String,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not exit within {timeout:?}\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `ok()` holds, polled every 100 ms; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
