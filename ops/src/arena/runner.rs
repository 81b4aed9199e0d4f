//! Runs a grid's cells as `keel train` processes, at most `jobs` at a time.
//!
//! Layout under the grid's folder (`runs/arena/<grid>/` by default):
//! `<cell>/` is the cell's run root (an ordinary one: lineage, metrics log, resume);
//! `cells/<cell>.toml` its config, `cells/<cell>.log` the output of its lives, and
//! `cells/<cell>.json` the `keel train --summary-json` outcome of the life that finished it.
//!
//! Invariants:
//! - AR-1: a cell is finished exactly when `cells/<cell>.json` exists; it is written (renamed
//!   from `.part`) only after a life exited 0 having reached `arena.steps`, or as
//!   `{"collapsed": …}` after a life exited with `COLLAPSED_EXIT` (the collapse guard spent its
//!   rewinds: an outcome of the experiment, which a rerun would only repeat). A cell cut short
//!   by a kill, a signal or any other failure is not finished and its next run resumes it.
//! - AR-2: a cell whose stored config differs from the grid's is refused before anything runs
//!   (resuming it under another config would mix two experiments in one run root).
//! - AR-3: SIGTERM / SIGINT to the arena stops launching cells and passes SIGTERM on to the
//!   running ones, which checkpoint and exit (`keel train`'s preemption); each child also gets
//!   SIGTERM if the arena itself dies (PR_SET_PDEATHSIG), so no cell trains on unattended.
//! - AR-4: a failed cell does not stop the others; the arena reports every failure at the end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::grid::{Cell, Grid};

/// Where a grid's files live.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The grid's folder.
    pub dir: PathBuf,
}

impl Layout {
    /// A cell's run root.
    pub fn run_root(&self, cell: &str) -> PathBuf {
        self.dir.join(cell)
    }
    fn side(&self, cell: &str, ext: &str) -> PathBuf {
        self.dir.join("cells").join(format!("{cell}.{ext}"))
    }
    /// A cell's config file.
    pub fn config(&self, cell: &str) -> PathBuf {
        self.side(cell, "toml")
    }
    /// The output of a cell's lives.
    pub fn log(&self, cell: &str) -> PathBuf {
        self.side(cell, "log")
    }
    /// A finished cell's outcome (AR-1).
    pub fn outcome(&self, cell: &str) -> PathBuf {
        self.side(cell, "json")
    }
    /// Plots.
    pub fn plots(&self) -> PathBuf {
        self.dir.join("plots")
    }
    /// Whether the cell is finished (AR-1).
    pub fn finished(&self, cell: &str) -> bool {
        self.outcome(cell).is_file()
    }
}

/// What a run of the grid did.
#[derive(Debug, Default)]
pub struct RunSummary {
    /// Cells this run finished.
    pub finished: Vec<String>,
    /// Cells that failed, with why.
    pub failed: Vec<(String, String)>,
    /// Cells not started or stopped because of a signal.
    pub stopped: Vec<String>,
}

/// Writes each pending cell's config (refusing changed ones, AR-2); answers the pending cells.
pub fn prepare<'g>(grid: &'g Grid, layout: &Layout) -> Result<Vec<&'g Cell>> {
    let cells_dir = layout.dir.join("cells");
    std::fs::create_dir_all(&cells_dir)
        .with_context(|| format!("cannot create {}", cells_dir.display()))?;
    let mut changed = Vec::new();
    for c in &grid.cells {
        let path = layout.config(&c.name);
        match std::fs::read_to_string(&path) {
            Ok(old) if old != c.config_text => changed.push(c.name.clone()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }
    if !changed.is_empty() {
        bail!(
            "the grid changed the config of {} cell(s) that already ran ({}); resuming them would mix two experiments. Delete those cells' folders and their cells/<cell>.* files under {}, or give the grid another arena.name",
            changed.len(),
            changed.join(", "),
            layout.dir.display()
        );
    }
    let mut pending = Vec::new();
    for c in &grid.cells {
        let path = layout.config(&c.name);
        if !path.exists() {
            write_atomic(&path, c.config_text.as_bytes())?;
        }
        if !layout.finished(&c.name) {
            pending.push(c);
        }
    }
    Ok(pending)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let part = path.with_extension("part");
    std::fs::write(&part, bytes).with_context(|| format!("cannot write {}", part.display()))?;
    std::fs::rename(&part, path).with_context(|| format!("cannot write {}", path.display()))
}

struct Running {
    cell: String,
    child: Child,
    started: Instant,
}

fn spawn(layout: &Layout, cell: &Cell) -> Result<Child> {
    let exe = std::env::current_exe().context("cannot find the keel binary")?;
    let log_path = layout.log(&cell.name);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let err = log.try_clone()?;
    let part = layout.outcome(&cell.name).with_extension("json.part");
    let _ = std::fs::remove_file(&part);
    let mut cmd = Command::new(exe);
    cmd.args(["train", "--no-progress", "--metrics-port", "0", "--config"])
        .arg(layout.config(&cell.name))
        .arg("--run-root")
        .arg(layout.run_root(&cell.name))
        .arg("--summary-json")
        .arg(&part)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    // AR-3: the child is told to stop when the arena dies, whatever killed it.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .with_context(|| format!("cannot start cell {}", cell.name))
}

/// Why a life that exited did not finish its cell, or `None` when it did (AR-1).
fn judge(layout: &Layout, cell: &str, steps: u64, status: ExitStatus) -> Result<Option<String>> {
    let part = layout.outcome(cell).with_extension("json.part");
    if !status.success() {
        let log = std::fs::read_to_string(layout.log(cell)).unwrap_or_default();
        if status.code() == Some(crate::COLLAPSED_EXIT) {
            let reason = log
                .lines()
                .rev()
                .find(|l| l.contains("training collapsed"))
                .unwrap_or("");
            let outcome = serde_json::json!({ "collapsed": reason });
            write_atomic(&layout.outcome(cell), outcome.to_string().as_bytes())?;
            return Ok(None);
        }
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Ok(Some(format!("{status}: {}", tail.join(" | "))));
    }
    let text = std::fs::read_to_string(&part).with_context(|| {
        format!(
            "cell {cell} exited 0 without its summary {}",
            part.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("cell {cell}: unreadable summary {}", part.display()))?;
    let final_step = v.get("final_step").and_then(serde_json::Value::as_u64);
    let stopped = v.get("stopped").and_then(serde_json::Value::as_bool) == Some(true);
    if stopped || final_step != Some(steps) {
        return Ok(Some(format!("stopped at step {final_step:?} of {steps}")));
    }
    std::fs::rename(&part, layout.outcome(cell))
        .with_context(|| format!("cannot record cell {cell} as finished"))?;
    Ok(None)
}

/// Runs the pending cells, `jobs` at a time, until all ended or `stop` is set (AR-1..4).
/// `on_end(cell, seconds, failure)` is told about each life as it ends.
pub fn run(
    grid: &Grid,
    layout: &Layout,
    pending: &[&Cell],
    jobs: usize,
    stop: &Arc<AtomicBool>,
    mut on_end: impl FnMut(&str, f64, Option<&str>),
) -> Result<RunSummary> {
    let mut summary = RunSummary::default();
    let mut queue = pending.iter();
    let mut running: Vec<Running> = Vec::new();
    let mut signalled = false;
    loop {
        if stop.load(Ordering::SeqCst) && !signalled {
            signalled = true;
            for r in &running {
                if let Ok(pid) = i32::try_from(r.child.id()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
            }
        }
        while !signalled && running.len() < jobs.max(1) {
            let Some(cell) = queue.next() else { break };
            running.push(Running {
                cell: cell.name.clone(),
                child: spawn(layout, cell)?,
                started: Instant::now(),
            });
        }
        if running.is_empty() {
            break;
        }
        let mut still = Vec::new();
        for mut r in running {
            match r.child.try_wait()? {
                None => still.push(r),
                Some(status) => {
                    let secs = r.started.elapsed().as_secs_f64();
                    match judge(layout, &r.cell, grid.arena.steps, status)? {
                        None => {
                            on_end(&r.cell, secs, None);
                            summary.finished.push(r.cell);
                        }
                        Some(why) if signalled => {
                            on_end(&r.cell, secs, Some(&why));
                            summary.stopped.push(r.cell);
                        }
                        Some(why) => {
                            on_end(&r.cell, secs, Some(&why));
                            summary.failed.push((r.cell, why));
                        }
                    }
                }
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(200));
    }
    if signalled {
        summary.stopped.extend(queue.map(|c| c.name.clone()));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> ExitStatus {
        Command::new("sh")
            .args(["-c", &format!("exit {code}")])
            .status()
            .expect("sh")
    }

    /// AR-1: a life that exited `COLLAPSED_EXIT` finishes its cell as collapsed; one that exited
    /// 1 leaves it unfinished with the log's tail as the reason.
    #[test]
    fn ar1_a_collapse_finishes_the_cell_and_an_error_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout {
            dir: dir.path().to_path_buf(),
        };
        std::fs::create_dir_all(dir.path().join("cells")).expect("cells");
        let log = "step 9\nerror: training collapsed: KL 0.2 spiked over its recent median 0.0; 3 rewinds done\n";
        std::fs::write(layout.log("a"), log).expect("log");
        std::fs::write(layout.log("b"), "error: store: disk full\n").expect("log");
        assert_eq!(
            judge(&layout, "a", 40, exit(crate::COLLAPSED_EXIT)).expect("judge"),
            None
        );
        assert!(layout.finished("a"));
        let outcome: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(layout.outcome("a")).expect("outcome"))
                .expect("json");
        assert!(outcome["collapsed"]
            .as_str()
            .is_some_and(|r| r.contains("KL 0.2 spiked")));
        let why = judge(&layout, "b", 40, exit(1)).expect("judge");
        assert!(why.is_some_and(|w| w.contains("disk full")));
        assert!(!layout.finished("b"));
    }
}
