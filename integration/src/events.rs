//! The metrics log as typed events for tests (EVT-1): tests read `TrainEvent` values, never
//! JSON paths. The queries several tests share live here: step events with their
//! `StepMetrics`, rewinds, and method records.

use keel_actors::events::{LoggedEvent, TrainEvent};
use keel_learner::StepMetrics;

/// Every line of a local run root's metrics log as `keel report` reads them (JL-2), in order,
/// with its clock fields (empty before the first segment is stored).
pub fn logged_events(root: &std::path::Path) -> Vec<LoggedEvent> {
    let store = keel_store::RunStore::open(root.to_str().expect("utf-8 run root")).expect("open");
    crate::test_rt()
        .block_on(keel_actors::jsonl::read_events(&store))
        .unwrap_or_default()
        .iter()
        .map(LoggedEvent::from_value)
        .collect()
}

/// Every event of a local run root's metrics log, in order (lines of unknown events left out).
pub fn train_events(root: &std::path::Path) -> Vec<TrainEvent> {
    logged_events(root)
        .into_iter()
        .filter_map(|l| l.event)
        .collect()
}

/// `(step, branch)` of every step event.
pub fn step_branches(events: &[TrainEvent]) -> Vec<(u64, String)> {
    step_events(events)
        .into_iter()
        .map(|s| (s.step, s.branch))
        .collect()
}

/// `(step, what)` of every skipped update (GD-1).
pub fn skipped_steps(events: &[TrainEvent]) -> Vec<(u64, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Skipped { step, what, .. } => Some((*step, what.clone())),
            _ => None,
        })
        .collect()
}

/// The fields of a step event (`TrainEvent::Step`) tests read.
#[derive(Debug, Clone)]
pub struct StepEvent {
    /// Learner step (= policy version).
    pub step: u64,
    /// The batch trained on.
    pub batch_seq: u64,
    /// Largest policy-version lag of a trained turn.
    pub max_lag: u64,
    /// The branch the step was taken on.
    pub branch: String,
    /// The learner's metrics.
    pub metrics: StepMetrics,
}

/// Every step event, in order.
pub fn step_events(events: &[TrainEvent]) -> Vec<StepEvent> {
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step {
                step,
                batch_seq,
                metrics,
                max_lag,
                branch,
                ..
            } => Some(StepEvent {
                step: *step,
                batch_seq: *batch_seq,
                max_lag: *max_lag,
                branch: branch.clone(),
                metrics: (**metrics).clone(),
            }),
            _ => None,
        })
        .collect()
}

/// Asserts every statistic of a step event's metrics is finite (a non-finite one is logged as
/// `null` and reads as NaN, EVT-2).
pub fn assert_finite_metrics(step: &StepEvent, context: &str) {
    for (name, v) in step.metrics.named() {
        assert!(
            v.is_finite(),
            "{context}: step {} metric {name} = {v}",
            step.step
        );
    }
}

/// The fields of a collapse-guard rewind (`TrainEvent::Rewind`, CT-4).
#[derive(Debug, Clone)]
pub struct Rewind {
    /// The policy version when the anomaly was seen.
    pub from_step: u64,
    /// The step of the healthy checkpoint rewound to.
    pub to_step: u64,
    /// Its id.
    pub to_checkpoint: String,
    /// The new branch.
    pub branch: String,
    /// `nonfinite`, `grad_norm_spike` or `kl_spike`.
    pub kind: String,
    /// The learning rate from now on.
    pub lr: f64,
}

/// Every rewind, in order.
pub fn rewinds(events: &[TrainEvent]) -> Vec<Rewind> {
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Rewind {
                from_step,
                to_step,
                to_checkpoint,
                branch,
                kind,
                lr,
                ..
            } => Some(Rewind {
                from_step: *from_step,
                to_step: *to_step,
                to_checkpoint: to_checkpoint.clone(),
                branch: branch.clone(),
                kind: kind.clone(),
                lr: *lr,
            }),
            _ => None,
        })
        .collect()
}

/// The record of a method event (`TrainEvent::Method`'s `detail`, EVT-3), as tests read it.
pub use keel_actors::events::MethodDetail as MethodRecord;

/// `(step, record)` of every method event of `method` (`generate`, `rtpo`, `pats`, `armor`).
pub fn method_records(events: &[TrainEvent], method: &str) -> Vec<(u64, MethodRecord)> {
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Method {
                step,
                method: m,
                detail,
            } if m == method => Some((*step, detail.clone())),
            _ => None,
        })
        .collect()
}
