//! `keel arena GRID.toml`: seed methods against their baselines on the same envs, seeds and
//! budget, with and without a stress setting, as one command.
//!
//! `grid` expands the grid file into cells, `runner` runs them as `keel train` processes (each
//! an ordinary run root, so a cell resumes like any run), `stats` reads each finished cell's
//! metrics log, `table`, `ladder` and `plots` write what a user compares.
//!
//! Invariants:
//! - AA-1: the table and plots are written from the finished cells whatever happened to the
//!   others (failed, stopped, not yet run), and say how many seeds each row holds (AT-1); the
//!   command exits non-zero when a cell failed or the grid was stopped before every cell
//!   finished.
//! - AA-2: a rerun of the same grid skips the finished cells and resumes the unfinished ones
//!   (AR-1); `--table-only` only reads.

pub mod grid;
pub mod ladder;
pub mod plots;
pub mod runner;
pub mod stats;
pub mod table;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use keel_store::RunStore;

use runner::Layout;
use table::Finished;

/// `keel arena`.
#[derive(Args, Debug)]
pub struct ArenaArgs {
    /// The grid file (e.g. recipes/arena/smoke.toml).
    pub grid: PathBuf,
    /// Cells run at the same time, each its own `keel train` process.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// The grid's folder (default runs/arena/<arena.name or the file's stem>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run nothing: write the table and plots from the cells already finished.
    #[arg(long)]
    pub table_only: bool,
    /// A Hugging Face model folder every cell trains (`model.path`, as `keel train --model`;
    /// e.g. `$(bash scripts/fetch_smollm2.sh)`).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// Runs `keel arena`.
pub fn run(args: ArenaArgs) -> Result<()> {
    if args.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let grid = grid::load(&args.grid, args.model.as_deref())?;
    let layout = Layout {
        dir: args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("runs/arena").join(&grid.name)),
    };
    let mut failed = Vec::new();
    let mut stopped = false;
    if !args.table_only {
        let pending = runner::prepare(&grid, &layout)?;
        eprintln!(
            "arena {}: {} cells, {} finished before, {} to run, {} at a time, under {}",
            grid.name,
            grid.cells.len(),
            grid.cells.len() - pending.len(),
            pending.len(),
            args.jobs,
            layout.dir.display()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        crate::term_signals::spawn("keel-arena-signals", move |mut signals| async move {
            let sig = signals.next().await;
            eprintln!(
                "{}: stopping the running cells (they checkpoint and exit)",
                sig.name()
            );
            flag.store(true, Ordering::SeqCst);
        })?;
        let total = pending.len();
        let mut ended = 0;
        let summary = runner::run(
            &grid,
            &layout,
            &pending,
            args.jobs,
            &stop,
            |cell, secs, why| {
                ended += 1;
                match why {
                    None => eprintln!("[{ended}/{total}] {cell}: finished in {secs:.0} s"),
                    Some(why) => {
                        eprintln!("[{ended}/{total}] {cell}: not finished after {secs:.0} s: {why}")
                    }
                }
            },
        )?;
        failed = summary.failed;
        stopped = !summary.stopped.is_empty();
    }
    let done = read_finished(&grid, &layout)?;
    let command = match &args.model {
        Some(m) => format!("keel arena {} --model {}", args.grid.display(), m.display()),
        None => format!("keel arena {}", args.grid.display()),
    };
    let md = table::markdown(&grid, &done, &command);
    let files = [
        ("table.md", md),
        ("table.csv", table::csv(&grid, &done)),
        ("cells.csv", table::cells_csv(&grid, &done)),
    ];
    std::fs::create_dir_all(&layout.dir)
        .with_context(|| format!("cannot create {}", layout.dir.display()))?;
    for (name, text) in files {
        let path = layout.dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let text = crate::report::load_font();
    let figures = plots::write_all(&grid, &done, &layout.plots(), text)?;
    eprintln!(
        "{} of {} cells finished; wrote {}/table.md, table.csv, cells.csv and {figures} figures{}",
        done.len(),
        grid.cells.len(),
        layout.dir.display(),
        if text {
            ""
        } else {
            " (no font found: plots without text)"
        }
    );
    if !failed.is_empty() {
        let list: Vec<String> = failed
            .iter()
            .map(|(c, why)| format!("{c} ({why})"))
            .collect();
        bail!(
            "{} cell(s) failed: {}; their output is in {}/cells/<cell>.log, and a rerun resumes them",
            failed.len(),
            list.join("; "),
            layout.dir.display()
        );
    }
    if stopped {
        bail!("stopped before every cell finished; a rerun resumes the rest");
    }
    Ok(())
}

/// Each finished cell's stats, from its run root's metrics log (AST-1).
fn read_finished(grid: &grid::Grid, layout: &Layout) -> Result<Finished> {
    let rt = keel_actors::process::current_thread_runtime()?;
    let mut done = Finished::new();
    for c in grid.cells.iter().filter(|c| layout.finished(&c.name)) {
        let root = layout.run_root(&c.name);
        let root_text = root.to_string_lossy().into_owned();
        let store = RunStore::open(&root_text)
            .with_context(|| format!("cannot open cell {}'s run root {root_text}", c.name))?;
        let text = rt
            .block_on(keel_actors::jsonl::read_log(&store))
            .with_context(|| format!("cannot read cell {}'s metrics log", c.name))?;
        let log = crate::report::parse_log(&text);
        let outcome = std::fs::read_to_string(layout.outcome(&c.name))
            .with_context(|| format!("cannot read cell {}'s outcome", c.name))?;
        let outcome: serde_json::Value = serde_json::from_str(&outcome)
            .with_context(|| format!("cell {}: unreadable outcome", c.name))?;
        let mut s = stats::cell_stats(&log, &grid.arena);
        s.collapsed = outcome.get("collapsed").is_some();
        done.insert(c.name.clone(), s);
    }
    Ok(done)
}
