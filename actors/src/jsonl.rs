//! The run's metrics log: one JSON line per event, stored as append-only segments.
//!
//! Each trainer life writes under its branch's `metrics/<life>/`: first `life.json` (its branch,
//! start time and the step it resumed at), then segments `<seq>.jsonl`, each holding the lines
//! logged since the previous one. Every object is create-only, as everything else in the store,
//! so a write costs what its lines cost however long the run is, and nothing written is ever
//! rewritten or lost by a failed read. [`read_log`] merges every life of every branch into the
//! one stream `keel report`, the trackers and the tests read.
//!
//! Invariants:
//! - JL-1: lines are stored in the order they were logged; a segment that failed to store is
//!   stored again with the same bytes and the same name before any later one (a segment whose
//!   create found it already there was stored by the failed attempt).
//! - JL-2: the merged stream holds each step once per branch of history: when a life resumes
//!   branch `b` at step `k` (or starts `b` afresh), the lines of `b` after `k` that earlier
//!   lives logged (a future that was lost) are left out. Other branches are never touched. A
//!   line belongs to the branch its life started on until a `rewind` line moves it.
//! - JL-3: every line carries `unix_ms` (the wall clock of `crate::process`, PR-3) and
//!   `elapsed_s` (seconds since its life started).
//! - JL-4: segments are stored at most every `run.metrics_log_flush_ms` (1 s by default) while
//!   lines come in, and at `flush`: a run makes at most one object per interval of its log,
//!   whatever its event rate, and a line is stored within one interval.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_store::{RunStore, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The folder of the metrics log under a branch's part of the run root.
pub const METRICS_DIR: &str = "metrics";

/// What a life records before its first line (`metrics/<life>/life.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LifeLog {
    /// The trainer life.
    pub life: u64,
    /// The branch it started on.
    pub branch: String,
    /// The step of the checkpoint it resumed from (`None`: a fresh start).
    pub resumed_at_step: Option<u64>,
    /// When it started (µs since the Unix epoch): the order of lives in the merged stream.
    pub started_unix_us: u64,
}

/// Appends JSON lines to the run's metrics log (one trainer life's part of it).
pub struct MetricsLog {
    started: Instant,
    tx: Option<mpsc::Sender<String>>,
    writer: Option<JoinHandle<()>>,
}

/// The folder of `life`'s log on `store`'s branch.
fn life_dir(store: &RunStore, life: u64) -> String {
    store.branch_dir(&format!("{METRICS_DIR}/{life:010}"))
}

impl MetricsLog {
    /// Starts life `life`'s part of the log on `store`'s branch, resumed at `resumed_at_step`
    /// (JL-2), storing a segment at most every `flush_every` (JL-4); stores its `life.json`
    /// before returning.
    pub fn open(
        store: RunStore,
        io: tokio::runtime::Handle,
        life: u64,
        resumed_at_step: Option<u64>,
        flush_every: Duration,
    ) -> Result<Self, StoreError> {
        let record = LifeLog {
            life,
            branch: store.branch().to_string(),
            resumed_at_step,
            started_unix_us: crate::process::since_epoch().as_micros() as u64,
        };
        let dir = life_dir(&store, life);
        let body = serde_json::to_vec_pretty(&record).map_err(|e| StoreError::CorruptObject {
            key: format!("{dir}/life.json"),
            reason: e.to_string(),
        })?;
        match io.block_on(store.create_object(&format!("{dir}/life.json"), body.into())) {
            Ok(()) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
        let (tx, rx) = mpsc::channel::<String>();
        let writer =
            std::thread::spawn(move || write_segments(&store, &io, &dir, &rx, flush_every));
        Ok(Self {
            started: Instant::now(),
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    /// Appends one JSON value as a line, with its time (JL-3); it is stored within one flush
    /// interval (JL-4).
    pub fn append(&mut self, value: &Value) {
        let mut value = value.clone();
        if let Value::Object(map) = &mut value {
            map.entry("unix_ms")
                .or_insert_with(|| crate::process::unix_ms().into());
            map.entry("elapsed_s")
                .or_insert_with(|| self.started.elapsed().as_secs_f64().into());
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(value.to_string());
        }
    }

    /// Stores every line appended so far and waits for it.
    pub fn flush(mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The writer thread: lines from `rx` into segments `dir/<seq>.jsonl` (JL-1, JL-4).
fn write_segments(
    store: &RunStore,
    io: &tokio::runtime::Handle,
    dir: &str,
    rx: &mpsc::Receiver<String>,
    flush_every: Duration,
) {
    let mut seq = 0u64;
    let mut failed: Option<Bytes> = None; // a segment to store again, byte for byte (JL-1)
    let mut pending = String::new();
    let mut open = true;
    loop {
        let started = Instant::now();
        if failed.is_none() && pending.is_empty() {
            match rx.recv() {
                Ok(line) => push_line(&mut pending, &line),
                Err(_) => break,
            }
        }
        // Gather what comes in during the rest of the interval (JL-4); all at once at the end.
        while open {
            let left = flush_every.saturating_sub(started.elapsed());
            match rx.recv_timeout(left) {
                Ok(line) => push_line(&mut pending, &line),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        }
        let body = match failed.take() {
            Some(body) => body,
            None => Bytes::from(std::mem::take(&mut pending)),
        };
        let key = format!("{dir}/{seq:010}.jsonl");
        match io.block_on(store.create_object(&key, body.clone())) {
            // AlreadyExists: the attempt that reported an error had stored it.
            Ok(()) | Err(StoreError::AlreadyExists { .. }) => seq += 1,
            Err(e) if open => {
                tracing::warn!(error = %e, key, "could not store a metrics log segment; trying again");
                failed = Some(body);
            }
            Err(e) => {
                let lost = body.iter().filter(|&&b| b == b'\n').count() + pending.lines().count();
                tracing::error!(error = %e, key, lost, "could not store the metrics log's last lines");
                break;
            }
        }
        if !open && failed.is_none() && pending.is_empty() {
            break;
        }
    }
}

fn push_line(buf: &mut String, line: &str) {
    buf.push_str(line);
    buf.push('\n');
}

/// One life's part of the log as read back.
struct LifePart {
    record: LifeLog,
    lines: Vec<String>,
}

/// The metrics folders of every branch of `store`'s root (`metrics/` is `main`'s).
async fn metrics_dirs(store: &RunStore) -> Result<Vec<String>, StoreError> {
    let mut dirs = vec![store
        .on_branch(keel_store::DEFAULT_BRANCH)?
        .branch_dir(METRICS_DIR)];
    for name in store.branch_names().await? {
        let dir = store.on_branch(&name)?.branch_dir(METRICS_DIR);
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    Ok(dirs)
}

/// Every life's `life.json` and segments on every branch of `store`'s root, oldest life first.
async fn read_parts(store: &RunStore) -> Result<Vec<LifePart>, StoreError> {
    let mut parts: Vec<LifePart> = Vec::new();
    for dir in metrics_dirs(store).await? {
        let mut keys = store.list_objects(&dir).await?;
        keys.sort();
        for key in keys.iter().filter(|k| k.ends_with("/life.json")) {
            let bytes = store.get_object(key).await?;
            let record: LifeLog =
                serde_json::from_slice(&bytes).map_err(|e| StoreError::CorruptObject {
                    key: key.clone(),
                    reason: e.to_string(),
                })?;
            let life_dir = key.trim_end_matches("life.json");
            let mut lines = Vec::new();
            // Zero-padded names: the sorted keys are in segment order (JL-1).
            for seg in keys
                .iter()
                .filter(|k| k.starts_with(life_dir) && k.ends_with(".jsonl"))
            {
                let text = store.get_object(seg).await?;
                lines.extend(
                    String::from_utf8_lossy(&text)
                        .lines()
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_string),
                );
            }
            parts.push(LifePart { record, lines });
        }
    }
    parts.sort_by_key(|p| (p.record.started_unix_us, p.record.life));
    Ok(parts)
}

/// The whole metrics log of `store`'s run root as one JSONL stream, every branch, in the
/// order the lives ran (JL-2). Lines that are not JSON are kept where they were.
pub async fn read_log(store: &RunStore) -> Result<String, StoreError> {
    let mut stream: Vec<(String, Option<u64>, String)> = Vec::new(); // (branch, step, line)
    for part in read_parts(store).await? {
        let mut branch = part.record.branch.clone();
        // JL-2: the earlier lives' lines of this branch after the resumed step were a future
        // that was lost.
        let keep = part.record.resumed_at_step;
        stream.retain(|(b, step, _)| {
            *b != branch || step.is_none_or(|s| keep.is_some_and(|k| s <= k))
        });
        for line in part.lines {
            let value = serde_json::from_str::<Value>(&line).ok();
            let step = value.as_ref().and_then(|v| v.get("step")?.as_u64());
            let rewind_to = value.as_ref().and_then(|v| {
                (v.get("event")?.as_str()? == "rewind")
                    .then(|| v.get("branch")?.as_str().map(str::to_string))
                    .flatten()
            });
            stream.push((branch.clone(), step, line));
            if let Some(b) = rewind_to {
                branch = b;
            }
        }
    }
    let mut out = String::new();
    for (_, _, line) in stream {
        push_line(&mut out, &line);
    }
    Ok(out)
}

/// The events of [`read_log`], parsed (lines that are not JSON are left out).
pub async fn read_events(store: &RunStore) -> Result<Vec<Value>, StoreError> {
    Ok(read_log(store)
        .await?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn write(
        store: &RunStore,
        io: &tokio::runtime::Runtime,
        life: u64,
        resumed: Option<u64>,
        lines: &[Value],
    ) {
        let mut log = MetricsLog::open(
            store.clone(),
            io.handle().clone(),
            life,
            resumed,
            Duration::from_secs(1),
        )
        .expect("open");
        for l in lines {
            log.append(l);
        }
        log.flush();
    }

    fn step(n: u64) -> Value {
        serde_json::json!({"event": "step", "step": n})
    }

    fn steps(events: &[Value]) -> Vec<(u64, Option<String>)> {
        events
            .iter()
            .filter_map(|e| {
                Some((
                    e.get("step")?.as_u64()?,
                    e.get("mark").and_then(|m| m.as_str()).map(str::to_string),
                ))
            })
            .collect()
    }

    #[test]
    fn jl2_a_resume_drops_the_lost_future_of_its_branch_only() {
        let dir = tempfile::tempdir().expect("dir");
        let rt = rt();
        let root = RunStore::open(dir.path().to_str().expect("utf-8")).expect("open");
        write(&root, &rt, 1, None, &[step(1), step(2), step(3)]);
        // Another branch from step 1, then main resumes at step 2: main's 3 was lost.
        let side = root.on_branch("side").expect("branch");
        write(
            &side,
            &rt,
            1,
            Some(1),
            &[serde_json::json!({"event": "step", "step": 2, "mark": "side"})],
        );
        write(&root, &rt, 2, Some(2), &[step(3), step(4)]);
        let events = rt.block_on(read_events(&root)).expect("read");
        assert_eq!(
            steps(&events),
            [
                (1, None),
                (2, None),
                (2, Some("side".into())),
                (3, None),
                (4, None)
            ]
        );
        assert!(events
            .iter()
            .all(|e| e["unix_ms"].as_u64().is_some_and(|t| t > 0)
                && e["elapsed_s"].as_f64().is_some_and(|s| s >= 0.0)));
        // A fresh start of main drops main's lines, not the other branch's.
        write(&root, &rt, 3, None, &[step(1)]);
        let events = rt.block_on(read_events(&root)).expect("read");
        assert_eq!(steps(&events), [(2, Some("side".into())), (1, None)]);
    }

    #[test]
    fn jl2_lines_after_a_rewind_belong_to_the_new_branch() {
        let dir = tempfile::tempdir().expect("dir");
        let rt = rt();
        let root = RunStore::open(dir.path().to_str().expect("utf-8")).expect("open");
        let rewind = serde_json::json!({"event": "rewind", "branch": "rewind-1", "from_step": 3, "to_step": 2});
        write(
            &root,
            &rt,
            1,
            None,
            &[step(1), step(2), step(3), rewind, step(3), step(4)],
        );
        // A new life on rewind-1 resumes at 3: rewind-1's 4 is dropped, main's 3 stays.
        let rb = root.on_branch("rewind-1").expect("branch");
        write(&rb, &rt, 1, Some(3), &[step(4)]);
        let events = rt.block_on(read_events(&root)).expect("read");
        let got: Vec<u64> = events
            .iter()
            .filter_map(|e| e.get("step")?.as_u64())
            .collect();
        assert_eq!(got, [1, 2, 3, 3, 4]);
    }

    #[test]
    fn jl4_segments_gather_the_lines_of_an_interval() {
        let dir = tempfile::tempdir().expect("dir");
        let rt = rt();
        let root = RunStore::open(dir.path().to_str().expect("utf-8")).expect("open");
        write(&root, &rt, 1, None, &(0..500).map(step).collect::<Vec<_>>());
        let keys = rt.block_on(root.list_objects(METRICS_DIR)).expect("list");
        let segments = keys.iter().filter(|k| k.ends_with(".jsonl")).count();
        assert!(
            segments <= 2,
            "{segments} segments for 500 lines logged at once"
        );
        let events = rt.block_on(read_events(&root)).expect("read");
        assert_eq!(events.len(), 500);
    }
}
