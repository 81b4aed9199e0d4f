//! The run's `metrics.jsonl`: one JSON line per event, kept as one object in the run root.
//!
//! Object stores have no append, so the log is rewritten whole by a writer thread; only the
//! newest content matters, so queued older snapshots are skipped.
//!
//! Invariants:
//! - JL-1: lines are written in the order they were logged; a write never replaces the object
//!   with older content than a previous write.
//! - JL-2: on resume, lines of steps after the restored checkpoint (a future that was lost) are
//!   removed, so each step appears once per branch of history.

use std::sync::mpsc;
use std::thread::JoinHandle;

use bytes::Bytes;
use keel_store::RunStore;

/// The object name of the metrics log under the run root.
pub const METRICS_LOG: &str = "metrics.jsonl";

/// Appends JSON lines to the run's metrics log.
pub struct MetricsLog {
    lines: String,
    tx: Option<mpsc::Sender<Bytes>>,
    writer: Option<JoinHandle<()>>,
}

impl MetricsLog {
    /// Opens the log, keeping existing lines whose `step` is at most `keep_through_step` (JL-2).
    pub fn open(
        store: RunStore,
        io: tokio::runtime::Handle,
        keep_through_step: Option<u64>,
    ) -> Self {
        let existing = io.block_on(store.get_object(METRICS_LOG)).ok();
        let mut lines = String::new();
        if let (Some(bytes), Some(keep)) = (existing, keep_through_step) {
            for line in String::from_utf8_lossy(&bytes).lines() {
                let step = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
                if step.is_none_or(|s| s <= keep) {
                    lines.push_str(line);
                    lines.push('\n');
                }
            }
        }
        let (tx, rx) = mpsc::channel::<Bytes>();
        let writer = std::thread::spawn(move || {
            while let Ok(mut latest) = rx.recv() {
                while let Ok(newer) = rx.try_recv() {
                    latest = newer;
                }
                if let Err(e) = io.block_on(store.put_object(METRICS_LOG, latest)) {
                    tracing::warn!(error = %e, "could not write metrics.jsonl; will retry with the next line");
                }
            }
        });
        Self {
            lines,
            tx: Some(tx),
            writer: Some(writer),
        }
    }

    /// The events kept or appended so far, in order.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.lines
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Appends one JSON value as a line and schedules a write.
    pub fn append(&mut self, value: &serde_json::Value) {
        self.lines.push_str(&value.to_string());
        self.lines.push('\n');
        if let Some(tx) = &self.tx {
            let _ = tx.send(Bytes::from(self.lines.clone()));
        }
    }

    /// Waits for every scheduled write.
    pub fn flush(mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
