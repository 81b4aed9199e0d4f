//! `keel-bench-metrics-log`: the run's metrics log must not slow down as the run gets long.
//!
//! Step events of a realistic size (~700 bytes, as `keel train` logs them) on a local run root:
//! 1. the training loop's cost per `MetricsLog::append` around event 1,000 and around event
//!    100,000 of one life;
//! 2. logging and storing 1,000 events (`open` … `flush`) on an empty run root, and on one that
//!    already holds a 99,000-event log (a long run's next life);
//! 3. the baseline, measured in the same run: the log kept as one object rewritten whole on
//!    every event (keel's earlier design), per event at 1,000 and at 100,000 lines;
//! 4. reading the whole 100,000-event log back as `keel report` does.
//!
//! ```text
//! cargo run -p keel-integration --bin keel-bench-metrics-log -- [--events 100000]
//! (the workspace's dev profile is optimised)
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use keel_actors::jsonl::{read_log, MetricsLog};
use keel_store::RunStore;
use serde_json::{json, Value};

fn step_event(step: u64) -> Value {
    let metrics: serde_json::Map<String, Value> = [
        "loss",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_frac",
        "grad_norm",
        "adv_mean",
        "adv_std",
        "adv_min",
        "adv_max",
        "tokens_per_s",
        "step_seconds",
        "mean_reward",
        "turn_ratio_mean",
        "ctn_trigger_frac",
        "groups_total",
        "groups_kept",
    ]
    .iter()
    .enumerate()
    .map(|(i, k)| {
        (
            (*k).to_string(),
            json!(0.123_456_789 * (i as f64 + step as f64 % 7.0)),
        )
    })
    .collect();
    json!({
        "event": "step", "step": step, "total": 100_000, "batch_seq": step,
        "metrics": metrics, "success": 0.5, "invalid_rate": 0.0, "max_lag": 1,
        "branch": "main", "reward": 0.25,
    })
}

/// `run.metrics_log_flush_ms`'s default.
const FLUSH: Duration = Duration::from_secs(1);

fn per_event(d: Duration, n: u64) -> f64 {
    d.as_secs_f64() / n as f64 * 1e6
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let events: u64 = match args.iter().position(|a| a == "--events") {
        Some(i) => args.get(i + 1).context("--events N")?.parse()?,
        None => 100_000,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("run");
    let store = RunStore::open(root.to_str().context("utf-8")?)?;
    let line_bytes = step_event(1).to_string().len();
    println!("{events} step events of {line_bytes} bytes on local disk");

    // 1. append cost inside one long life.
    let window = 1_000.min(events / 2);
    let mut log = MetricsLog::open(store.clone(), rt.handle().clone(), 1, None, FLUSH)?;
    let (mut early, mut late) = (Duration::ZERO, Duration::ZERO);
    for step in 1..=events {
        let ev = step_event(step);
        let t = Instant::now();
        log.append(&ev);
        let spent = t.elapsed();
        if step > window / 2 && step <= window + window / 2 {
            early += spent;
        }
        if step > events - window {
            late += spent;
        }
    }
    let t = Instant::now();
    log.flush();
    let flush = t.elapsed();
    let (a1, a2) = (per_event(early, window), per_event(late, window));
    println!(
        "append: {a1:.2} us/event around event {window}, {a2:.2} us/event around event {events} ({:.2}x); final flush {:.0} ms",
        a2 / a1,
        flush.as_secs_f64() * 1e3
    );

    // 2. log + store 1,000 events: empty root vs one holding the long log.
    let fresh_dir = tempfile::tempdir()?;
    let fresh = RunStore::open(fresh_dir.path().to_str().context("utf-8")?)?;
    let store_1000 = |s: &RunStore, life: u64, from: u64| -> Result<Duration> {
        let t = Instant::now();
        let mut log = MetricsLog::open(s.clone(), rt.handle().clone(), life, Some(from), FLUSH)?;
        for step in from + 1..=from + window {
            log.append(&step_event(step));
        }
        log.flush();
        Ok(t.elapsed())
    };
    let short = store_1000(&fresh, 1, 0)?;
    let long = store_1000(&store, 2, events)?;
    println!(
        "log + store {window} events: {:.1} us/event on an empty root, {:.1} us/event after {events} ({:.2}x)",
        per_event(short, window),
        per_event(long, window),
        long.as_secs_f64() / short.as_secs_f64()
    );

    // 3. baseline: one object rewritten whole per event.
    let rewrite = |lines: u64| -> Result<f64> {
        let text: String = (1..=lines)
            .map(|s| step_event(s).to_string() + "\n")
            .collect();
        let body = Bytes::from(text);
        let reps = 5;
        let t = Instant::now();
        for _ in 0..reps {
            rt.block_on(store.put_object("baseline-metrics.jsonl", body.clone()))?;
        }
        Ok(per_event(t.elapsed(), reps))
    };
    let (b1, b2) = (rewrite(window)?, rewrite(events)?);
    println!(
        "baseline (rewrite whole per event): {b1:.1} us/event at {window} lines, {b2:.1} us/event at {events} lines ({:.1}x)",
        b2 / b1
    );

    // 4. reading it back.
    let t = Instant::now();
    let text = rt.block_on(read_log(&store))?;
    let n = text.lines().count();
    let segments = rt
        .block_on(store.list_objects("metrics"))?
        .iter()
        .filter(|k| k.ends_with(".jsonl"))
        .count();
    println!(
        "read_log: {n} lines from {segments} segments in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
