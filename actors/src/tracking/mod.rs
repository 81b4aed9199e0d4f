//! Experiment trackers beside Prometheus (`[tracking]`): TensorBoard event files in the run
//! root and an MLflow tracking server. Each tracker runs on its own thread behind a bounded
//! queue; the controller only offers events to the queues.
//!
//! Invariants:
//! - TR-1 (never in the way): offering an event never blocks; an event that does not fit a full
//!   queue, and every event a tracker finally fails to deliver, is counted in
//!   `keel_tracking_events_dropped_total{tracker}` and training goes on.
//! - TR-2 (flush at the end): [`Trackers::finish`] delivers everything still queued before the
//!   job returns.
//! - TR-3 (lossless resume): trackers take the events as the metrics log holds them; a resumed
//!   job first replays the log it kept (every event through its checkpoint's step), and each
//!   tracker skips what it already delivered (TB-1, ML-1), so points that a killed process
//!   queued but never delivered are delivered by the next life, and none twice.

pub mod event_file;
pub mod mlflow;
pub mod tensorboard;

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;

use crate::events::{LoggedEvent, TrainEvent};
use crate::metrics::BranchCounter;
use serde_json::Value;

/// Events a tracker's queue holds before new ones are dropped (TR-1).
pub const QUEUE_EVENTS: usize = 4096;

pub use crate::config::TrackingSection;

/// One tracker: turns events into its own records.
pub trait Tracker: Send {
    /// Its label in `keel_tracking_events_dropped_total`.
    fn name(&self) -> &'static str;
    /// Records one event, as the metrics log holds it (may buffer). Events at or before a
    /// step the tracker already delivered are ignored, so replaying history is harmless.
    fn handle(&mut self, ev: &TrainEvent);
    /// Events dropped since the last call.
    fn take_dropped(&mut self) -> u64;
    /// Delivers everything buffered; returns the events dropped since the last report.
    fn finish(&mut self) -> u64;
}

/// The scalars of a step event: the batch's rollout numbers and every finite learner
/// statistic, by name (as the metrics log holds them: non-finite ones are `null` there).
pub(crate) fn step_values(ev: &TrainEvent) -> Option<(u64, Vec<(String, f64)>)> {
    let TrainEvent::Step {
        step,
        metrics,
        success,
        reward,
        invalid_rate,
        max_lag,
        ..
    } = ev
    else {
        return None;
    };
    let rollout = [
        ("success", *success),
        ("reward", *reward),
        ("invalid_rate", *invalid_rate),
        ("max_lag", *max_lag as f64),
    ];
    let mut train: Vec<(&str, f64)> = metrics.named().collect();
    // Statistics in name order, as the log's JSON object lists them.
    train.sort_by(|a, b| a.0.cmp(b.0));
    let values = rollout
        .iter()
        .map(|(k, x)| (format!("rollout/{k}"), *x))
        .chain(train.iter().map(|(k, x)| (format!("train/{k}"), *x)))
        .filter(|(_, x)| x.is_finite())
        .collect();
    Some((*step, values))
}

/// The scalars of an eval event, at its policy version: pass@1 (0 when not finite) and
/// avg@k when measured.
pub(crate) fn eval_values(ev: &TrainEvent) -> Option<(u64, Vec<(String, f64)>)> {
    let TrainEvent::Eval {
        version,
        success,
        avg_at_k,
        ..
    } = ev
    else {
        return None;
    };
    let pass = if success.is_finite() { *success } else { 0.0 };
    let mut values = vec![("eval/success".to_string(), pass)];
    if let Some(avg) = avg_at_k.filter(|x| x.is_finite()) {
        values.push(("eval/avg_at_k".into(), avg));
    }
    Some((*version, values))
}

/// The effective config flattened to `section.key` = value (MLflow params).
pub fn flatten_config(value: &Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, x, out);
                }
            }
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    walk("", value, &mut out);
    out
}

/// The trackers `[tracking]` turns on for a job on `branch` of `store`.
pub fn from_config(
    cfg: &crate::config::TrainConfig,
    store: &keel_store::RunStore,
    io: &tokio::runtime::Handle,
    branch: &str,
) -> Vec<Box<dyn Tracker>> {
    let t = &cfg.tracking;
    let mut out: Vec<Box<dyn Tracker>> = Vec::new();
    if t.tensorboard {
        // Both trackers get the config as a person sees it: URL credentials redacted (RD-1).
        let text = cfg.to_toml();
        out.push(Box::new(tensorboard::TensorBoardWriter::open(
            store.clone(),
            io.clone(),
            branch,
            format!("```toml\n{text}\n```"),
            t.flush_every_steps,
        )));
    }
    if !t.mlflow_url.is_empty() {
        let id = mlflow::RunIdentity {
            root: store.root_url().to_string(),
            name: cfg.run.name.clone(),
            preset: cfg.learner.algo.name(),
            env: cfg.env.name.clone(),
            params: flatten_config(&serde_json::to_value(cfg.redacted()).unwrap_or_default()),
        };
        out.push(Box::new(mlflow::MlflowTracker::new(
            &t.mlflow_url,
            &t.mlflow_experiment,
            id,
            branch,
            t.flush_every_steps,
        )));
    }
    out
}

struct Worker {
    name: &'static str,
    tx: Option<SyncSender<TrainEvent>>,
    join: Option<JoinHandle<()>>,
}

/// The running trackers.
pub struct Trackers {
    workers: Vec<Worker>,
    dropped: BranchCounter,
}

impl Trackers {
    /// Starts one thread per tracker.
    pub fn start(trackers: Vec<Box<dyn Tracker>>, dropped: BranchCounter) -> Self {
        let workers = trackers
            .into_iter()
            .map(|mut t| {
                let name = t.name();
                let (tx, rx) = sync_channel::<TrainEvent>(QUEUE_EVENTS);
                let counter = dropped.clone();
                let join = std::thread::Builder::new()
                    .name(format!("keel-{name}"))
                    .spawn(move || {
                        while let Ok(ev) = rx.recv() {
                            t.handle(&ev);
                            counter.inc_for(name, t.take_dropped());
                        }
                        counter.inc_for(name, t.finish());
                    })
                    .map_err(|e| tracing::warn!(error = %e, tracker = name, "cannot start the tracker thread"))
                    .ok();
                Worker {
                    name,
                    tx: join.is_some().then_some(tx),
                    join,
                }
            })
            .collect();
        Trackers { workers, dropped }
    }

    /// Offers `ev` (a metrics log line) to every tracker without blocking (TR-1); a line of an
    /// event keel does not know is no event (EVT-2).
    pub fn offer(&self, ev: &Value) {
        let Some(ev) = LoggedEvent::from_value(ev).event else {
            return;
        };
        for w in &self.workers {
            let Some(tx) = &w.tx else {
                self.dropped.inc_for(w.name, 1);
                continue;
            };
            match tx.try_send(ev.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.dropped.inc_for(w.name, 1)
                }
            }
        }
    }

    /// Hands the kept history of a resumed job to every tracker, waiting for queue room (TR-3):
    /// the step events of `branch` and the evals and checkpoints.
    pub fn replay(&self, history: &[Value], branch: &str) {
        let wanted = |ev: &TrainEvent| match ev {
            TrainEvent::Step { branch: b, .. } => b.is_empty() || b == branch,
            TrainEvent::Eval { .. } | TrainEvent::Checkpoint { .. } => true,
            _ => false,
        };
        for ev in crate::events::events_of(history)
            .iter()
            .filter(|ev| wanted(ev))
        {
            for w in &self.workers {
                if let Some(tx) = &w.tx {
                    if tx.send(ev.clone()).is_err() {
                        self.dropped.inc_for(w.name, 1);
                    }
                }
            }
        }
    }

    /// Closes the queues and waits until every tracker has delivered what it holds (TR-2).
    pub fn finish(mut self) {
        for w in &mut self.workers {
            w.tx.take();
        }
        for w in &mut self.workers {
            if let Some(j) = w.join.take() {
                let _ = j.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::TrainMetrics;
    use std::sync::mpsc::{channel, Receiver};
    use std::sync::{Arc, Mutex};

    /// Blocks on its first event until released; reports 3 undelivered events at the end.
    struct Stuck {
        entered: Mutex<std::sync::mpsc::Sender<()>>,
        release: Arc<Mutex<Receiver<()>>>,
        seen: Arc<Mutex<usize>>,
    }

    impl Tracker for Stuck {
        fn name(&self) -> &'static str {
            "stuck"
        }
        fn handle(&mut self, _: &TrainEvent) {
            let mut seen = self.seen.lock().expect("seen");
            if *seen == 0 {
                let _ = self.entered.lock().expect("tx").send(());
                let _ = self.release.lock().expect("rx").recv();
            }
            *seen += 1;
        }
        fn take_dropped(&mut self) -> u64 {
            0
        }
        fn finish(&mut self) -> u64 {
            3
        }
    }

    fn dropped(metrics: &TrainMetrics) -> u64 {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with("keel_tracking_events_dropped_total") && l.contains("stuck"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn tr1_a_stuck_tracker_never_blocks_and_its_losses_are_counted() {
        let metrics = TrainMetrics::new("t").expect("metrics");
        let (tx, rx) = channel();
        let (entered_tx, entered) = channel();
        let seen = Arc::new(Mutex::new(0));
        let stuck = Stuck {
            entered: Mutex::new(entered_tx),
            release: Arc::new(Mutex::new(rx)),
            seen: seen.clone(),
        };
        let trackers = Trackers::start(vec![Box::new(stuck)], metrics.tracking_dropped.clone());
        let extra = 500;
        trackers.offer(&serde_json::json!({"event": "step", "step": 0}));
        entered.recv().expect("the tracker took the first event");
        for i in 0..QUEUE_EVENTS + extra {
            trackers.offer(&serde_json::json!({"event": "step", "step": i + 1}));
        }
        // The first event is being handled, the queue holds QUEUE_EVENTS, the rest is dropped.
        assert_eq!(dropped(&metrics), extra as u64);
        tx.send(()).expect("release");
        trackers.finish();
        assert_eq!(
            *seen.lock().expect("seen"),
            QUEUE_EVENTS + 1,
            "TR-2: the queue is delivered"
        );
        assert_eq!(
            dropped(&metrics),
            extra as u64 + 3,
            "what finish reports is counted"
        );
    }

    #[test]
    fn the_config_flattens_to_section_keys() {
        let flat = flatten_config(&serde_json::json!({"run": {"seed": 7, "name": "q"}, "x": [1]}));
        assert!(flat.contains(&("run.seed".into(), "7".into())));
        assert!(flat.contains(&("run.name".into(), "q".into())));
        assert!(flat.contains(&("x".into(), "[1]".into())));
    }
}
