//! The metrics log as typed events for tests (EVT-1): tests read `TrainEvent` values, never
//! JSON paths.

use keel_actors::events::{LoggedEvent, TrainEvent};

/// Every line of a local run root's metrics log as `keel report` reads them (JL-2), in order,
/// with its clock fields (empty before the first segment is stored).
pub fn logged_events(root: &std::path::Path) -> Vec<LoggedEvent> {
    crate::read_events(root)
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
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step { step, branch, .. } => Some((*step, branch.clone())),
            _ => None,
        })
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
