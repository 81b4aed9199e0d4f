//! `keel-bench-rollout`: what streaming rollouts buy under long-tailed tool latency.
//!
//! Every cell is an ordinary in-process training run (`run_job`) of the built-in tiny model on
//! `calc` with the same seed, SFT warm start and Pareto step latency; only the mode and the
//! rollout layout change. The clock runs from the end of the before-RL evaluation to the last RL
//! step, so it is the wall time to `steps × tasks_per_batch × group_size` trained episodes.
//! Ratios are against the sync cell measured in the same run. With `--baseline-bin OLD_KEEL`,
//! the same sync job is also run as a whole `keel train` process by that binary and by this
//! build's `keel`, to compare two engines on identical work (total process wall time).
//!
//! ```text
//! cargo build --release -p keel-ops -p keel-integration --bin keel --bin keel-bench-rollout
//! target/release/keel-bench-rollout [--steps 8] [--concurrency 0 (= the default, sized from the episodes in flight)] [--baseline-bin /path/to/old/keel]
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use keel_actors::events::TrainEvent;
use keel_actors::{run_job, JobOptions, TrainConfig, TrainMetrics};
use keel_store::RunStore;

/// One configuration to time.
struct Cell {
    name: &'static str,
    /// `rollout.batch_invariant`.
    invariance: &'static str,
    mode: &'static str,
    generators: usize,
    staleness: u64,
    shards: usize,
    concurrency: usize,
}

/// What one cell measured.
struct Measured {
    rl_seconds: f64,
    episodes: u64,
    eval_after: f64,
    max_lag: u64,
    /// Mean learner seconds per step.
    learn_seconds: f64,
    /// Mean seconds to sample one batch.
    sample_seconds: f64,
    /// Decode steps with >= 90% of the slots busy, over all decode steps.
    utilization: f64,
}

/// What the event sink saw.
#[derive(Default)]
struct Seen {
    rl_start: Option<Instant>,
    last_step: Option<Instant>,
    max_lag: u64,
    learn: (f64, u64),
    sample: (f64, u64),
    decode: (u64, u64),
}

struct Args {
    steps: u64,
    /// `env.concurrency` of the sync and async cells (0: the key's default, sized from the
    /// episodes in flight).
    concurrency: usize,
    eval_tasks: usize,
    baseline_bin: Option<PathBuf>,
    skip_scaling: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        steps: 8,
        concurrency: 0,
        eval_tasks: 128,
        baseline_bin: None,
        skip_scaling: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--steps" => args.steps = value("--steps")?.parse().context("--steps")?,
            "--concurrency" => {
                args.concurrency = value("--concurrency")?.parse().context("--concurrency")?
            }
            "--eval-tasks" => {
                args.eval_tasks = value("--eval-tasks")?.parse().context("--eval-tasks")?
            }
            "--baseline-bin" => args.baseline_bin = Some(PathBuf::from(value("--baseline-bin")?)),
            "--skip-scaling" => args.skip_scaling = true,
            other => bail!(
                "unknown argument {other:?} (expected --steps N, --concurrency N, --eval-tasks N, --baseline-bin PATH, --skip-scaling)"
            ),
        }
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    Ok(args)
}

/// The TOML of a cell: defaults plus Pareto latency (20 ms minimum, tail index 1.2, cap 2 s).
fn cell_toml(c: &Cell, args: &Args) -> String {
    format!(
        r#"[run]
name = "bench-{name}"
seed = 7
steps = {steps}
mode = "{mode}"
staleness_bound = {staleness}
checkpoint_every = 1000
threads = 1

[env]
name = "calc"
latency = "pareto"
latency_ms = 20.0
latency_shape = 1.2
latency_cap_ms = 2000.0
concurrency = {concurrency}

[rollout]
{invariance}generators = {generators}
env_shards = {shards}
eval_tasks = {eval_tasks}
"#,
        name = c.name,
        // Only when not the default, so that an older `keel` (--baseline-bin) reads the config.
        invariance = match c.invariance {
            "auto" => String::new(),
            other => format!("batch_invariant = \"{other}\"\n"),
        },
        steps = args.steps,
        mode = c.mode,
        staleness = c.staleness.max(1),
        concurrency = c.concurrency,
        generators = c.generators,
        shards = c.shards,
        eval_tasks = args.eval_tasks,
    )
}

fn run_cell(c: &Cell, args: &Args) -> Result<Measured> {
    let cfg = TrainConfig::from_toml(&cell_toml(c, args)).map_err(anyhow::Error::msg)?;
    let episodes = args.steps * (cfg.rollout.tasks_per_batch * cfg.rollout.group_size) as u64;
    let dir = tempfile::tempdir()?;
    let store = RunStore::open(dir.path().to_str().context("utf-8 temp dir")?)?;
    let metrics = TrainMetrics::new(&cfg.run.name)?;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let sink_seen = seen.clone();
    let sink = Arc::new(move |e: &TrainEvent| {
        if let Ok(mut s) = sink_seen.lock() {
            match e {
                TrainEvent::Eval { phase, .. } if phase == "before_rl" => {
                    s.rl_start = Some(Instant::now())
                }
                TrainEvent::Step {
                    max_lag, metrics, ..
                } => {
                    s.last_step = Some(Instant::now());
                    s.max_lag = s.max_lag.max(*max_lag);
                    s.learn.0 += metrics.step_seconds;
                    s.learn.1 += 1;
                }
                TrainEvent::Rollout {
                    sample_seconds,
                    decode_steps,
                    busy_decode_steps,
                    ..
                } if s.rl_start.is_some() => {
                    s.sample.0 += sample_seconds;
                    s.sample.1 += 1;
                    s.decode.0 += busy_decode_steps;
                    s.decode.1 += decode_steps;
                }
                _ => {}
            }
        }
    });
    let outcome = run_job(cfg, store, metrics, sink, JobOptions::default())?;
    let s = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("event log poisoned"))?;
    let (Some(start), Some(end)) = (s.rl_start, s.last_step) else {
        bail!("cell {}: no RL step was timed", c.name);
    };
    let mean = |(sum, n): (f64, u64)| sum / n.max(1) as f64;
    Ok(Measured {
        rl_seconds: end.duration_since(start).as_secs_f64(),
        episodes,
        eval_after: outcome.eval_after,
        max_lag: s.max_lag,
        learn_seconds: mean(s.learn),
        sample_seconds: mean(s.sample),
        utilization: s.decode.0 as f64 / s.decode.1.max(1) as f64,
    })
}

/// Wall time of a whole `keel train` process for the sync cell's config.
fn time_process(bin: &PathBuf, c: &Cell, args: &Args) -> Result<Duration> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("bench.toml");
    std::fs::write(&config, cell_toml(c, args))?;
    let root = dir.path().join("root");
    let t = Instant::now();
    let status = std::process::Command::new(bin)
        .arg("train")
        .arg("--config")
        .arg(&config)
        .arg("--run-root")
        .arg(&root)
        .arg("--no-progress")
        .arg("--metrics-port")
        .arg("0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("{} train failed: {status}", bin.display());
    }
    Ok(t.elapsed())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    tch::set_num_threads(1);
    let sync = Cell {
        name: "sync",
        invariance: "auto",
        mode: "sync",
        generators: 1,
        staleness: 0,
        shards: 1,
        concurrency: args.concurrency,
    };
    let mut cells = vec![Cell {
        name: "async-4gen-s4",
        invariance: "auto",
        mode: "async",
        generators: 4,
        staleness: 4,
        shards: 1,
        concurrency: args.concurrency,
    }];
    cells.push(Cell {
        name: "sync-not-invariant",
        invariance: "off",
        ..sync
    });
    if !args.skip_scaling {
        for (name, shards) in [("shards-1x4", 1), ("shards-2x4", 2), ("shards-4x4", 4)] {
            cells.push(Cell {
                name,
                invariance: "auto",
                mode: "sync",
                generators: 1,
                staleness: 0,
                shards,
                concurrency: 4,
            });
        }
    }
    println!(
        "calc, Pareto latency (20 ms, alpha 1.2, cap 2 s), {} RL steps, seed 7, env.concurrency {} (sync and async cells)",
        args.steps, args.concurrency
    );
    println!("| cell | RL wall s | episodes/s | vs sync | held-out success | max lag | learner s/step | sampling s/batch | sampler utilisation |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let base = run_cell(&sync, &args)?;
    let row = |name: &str, m: &Measured| {
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}x | {:.3} | {} | {:.2} | {:.2} | {:.3} |",
            m.rl_seconds,
            m.episodes as f64 / m.rl_seconds,
            base.rl_seconds / m.rl_seconds,
            m.eval_after,
            m.max_lag,
            m.learn_seconds,
            m.sample_seconds,
            m.utilization
        );
    };
    row(sync.name, &base);
    for c in &cells {
        let m = run_cell(c, &args)?;
        row(c.name, &m);
    }
    if let Some(old) = &args.baseline_bin {
        let new = std::env::current_exe()?
            .parent()
            .map(|d| d.join("keel"))
            .context("the directory of this binary")?;
        let t_old = time_process(old, &sync, &args)?;
        let t_new = time_process(&new, &sync, &args)?;
        println!(
            "whole `keel train` process, sync cell: baseline {} {:.1} s, this build {:.1} s: {:.2}x",
            old.display(),
            t_old.as_secs_f64(),
            t_new.as_secs_f64(),
            t_old.as_secs_f64() / t_new.as_secs_f64()
        );
    }
    Ok(())
}
