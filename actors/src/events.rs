//! Progress events: what the runtime tells its front end (progress bar, logs, JSONL), and
//! the one typed reader of them (the report, the trackers and the tests read `TrainEvent`s).
//!
//! Invariants:
//! - EVT-1: a `TrainEvent` is written by its `Serialize` (the metrics log's lines, what trackers
//!   receive) and read back by its `Deserialize`: the same names, no JSON paths elsewhere.
//! - EVT-2: reading is lenient as the log's readers always were: a missing field reads as its
//!   default (numbers 0, text empty), a missing or `null` float as NaN (JSON writes a
//!   non-finite float as `null`), so "absent" and "not finite" read alike; a line of an unknown
//!   event reads as no event, never as an error.
//! - EVT-3: a `method` event's `detail` is a [`MethodDetail`]: the numbers a method records,
//!   each written only when the method set it, and the rest of its record (PATS's review) kept
//!   as written. A `detail` that does not read as one reads as the empty detail, not as a lost
//!   event.

use std::sync::Arc;

use keel_learner::StepMetrics;
use serde::{Deserialize, Serialize};

/// Something worth telling the user about.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    /// The SFT warm start finished.
    SftDone {
        /// Steps taken.
        #[serde(default)]
        steps: u64,
        /// Final cross-entropy.
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        loss: f64,
    },
    /// Something a method's runtime did: dynamic-sampling re-rolls, an RTPO depth, a PATS
    /// review, an ARMOR reference reset (`method` says which; `detail` is its record, EVT-3).
    Method {
        /// Policy version when it happened.
        #[serde(default)]
        step: u64,
        /// `generate`, `rtpo`, `pats` or `armor`.
        #[serde(default)]
        method: String,
        /// What happened.
        #[serde(default, deserialize_with = "detail_or_empty")]
        detail: MethodDetail,
    },
    /// A held-out evaluation finished.
    Eval {
        /// `before_rl` or `after_rl`.
        #[serde(default)]
        phase: String,
        /// Policy version evaluated.
        #[serde(default)]
        version: u64,
        /// pass@1: the success rate of one greedy episode per task (EV-5).
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        success: f64,
        /// Held-out tasks evaluated.
        #[serde(default)]
        episodes: usize,
        /// How `success` was decoded: `greedy`.
        #[serde(default)]
        decoding: String,
        /// avg@k: the mean success of `samples` episodes per task sampled at `temperature`
        /// (`None` when `rollout.eval_samples = 0`).
        avg_at_k: Option<f64>,
        /// k of avg@k.
        #[serde(default)]
        samples: usize,
        /// Temperature of the avg@k pass.
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        temperature: f64,
    },
    /// The run resumed from a checkpoint.
    Resumed {
        /// Checkpoint id.
        #[serde(default)]
        checkpoint: String,
        /// Its step.
        #[serde(default)]
        step: u64,
        /// Stored batches reused.
        #[serde(default)]
        reused_batches: usize,
        /// Stored batches dropped.
        #[serde(default)]
        dropped_batches: usize,
    },
    /// One RL step finished.
    Step {
        /// Learner step (= policy version).
        #[serde(default)]
        step: u64,
        /// Total steps planned.
        #[serde(default)]
        total: u64,
        /// The batch trained on.
        #[serde(default)]
        batch_seq: u64,
        /// Learner metrics.
        #[serde(default)]
        metrics: Box<StepMetrics>,
        /// Success rate of the trained batch.
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        success: f64,
        /// Invalid actions per turn in the batch.
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        invalid_rate: f64,
        /// Largest policy-version lag of a trained turn.
        #[serde(default)]
        max_lag: u64,
        /// The branch the step was taken on (`main`, or `rewind-<n>` after a rewind).
        #[serde(default)]
        branch: String,
        /// Mean final reward of the batch.
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        reward: f64,
    },
    /// A generator stored a training batch.
    Rollout {
        /// The batch.
        #[serde(default)]
        batch_seq: u64,
        /// The policy version it was sampled with.
        #[serde(default)]
        policy_version: u64,
        /// Episodes it holds (failed ones excluded).
        #[serde(default)]
        episodes: usize,
        /// Episodes that failed in their env while it was sampled: counted, never trained
        /// (an agent that died or timed out, a reward service that failed, RO-4).
        #[serde(default)]
        failed_episodes: usize,
        /// Seconds from the first reset to the last episode's end (store write excluded).
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        sample_seconds: f64,
        /// Sampler decode steps.
        #[serde(default)]
        decode_steps: u64,
        /// Of those, steps with at least 90% of the sampler's slots busy.
        #[serde(default)]
        busy_decode_steps: u64,
        /// Newer weight versions taken while it was sampled (RO-10, async).
        #[serde(default)]
        weight_updates: u64,
        /// vLLM: requests a weight swap aborted, resubmitted with their partial tokens (VQ-2).
        #[serde(default)]
        resubmitted_requests: u64,
        /// Tokens sampled (re-rolled episodes included).
        #[serde(default)]
        sampled_tokens: u64,
    },
    /// The learner refused a non-finite update; the step was skipped (GD-1).
    Skipped {
        /// The policy version that stays.
        #[serde(default)]
        step: u64,
        /// The batch that was consumed without an update.
        #[serde(default)]
        batch_seq: u64,
        /// What was non-finite (`loss`, `gradient norm`).
        #[serde(default)]
        what: String,
    },
    /// The collapse guard rewound to a healthy checkpoint on a new branch (CT-4).
    Rewind {
        /// The policy version when the anomaly was seen.
        #[serde(default)]
        from_step: u64,
        /// The step of the healthy checkpoint rewound to.
        #[serde(default)]
        to_step: u64,
        /// Its id.
        #[serde(default)]
        to_checkpoint: String,
        /// The new branch.
        #[serde(default)]
        branch: String,
        /// `nonfinite`, `grad_norm_spike` or `kl_spike`.
        #[serde(default)]
        kind: String,
        /// The anomaly, in words.
        #[serde(default)]
        reason: String,
        /// The learning rate from now on.
        #[serde(default = "nan", deserialize_with = "nan_if_null")]
        lr: f64,
    },
    /// A batch was dropped (staleness bound or lost future).
    Dropped {
        /// The batch.
        #[serde(default)]
        batch_seq: u64,
        /// Why.
        #[serde(default)]
        reason: String,
    },
    /// A checkpoint was committed.
    Checkpoint {
        /// Its id.
        #[serde(default)]
        id: String,
        /// Its step.
        #[serde(default)]
        step: u64,
        /// The checkpoint it continues (None for a root), as its manifest records it.
        parent: Option<String>,
    },
}

/// What a method's runtime did, as its `Method` event records it (EVT-3). Each method writes
/// some of the numbers; the others are absent (`None`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MethodDetail {
    /// `generate` / `rtpo`: the batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_seq: Option<u64>,
    /// `rtpo`: the depth trained (0 = the last turn's boundary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth: Option<u64>,
    /// `rtpo`: the tree's depths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depths: Option<u64>,
    /// `rtpo`: the tree's first task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_task: Option<u64>,
    /// `generate`: prompt tokens of the batch's episodes (PATS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// `armor`: the step of a reference reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_reset_at: Option<u64>,
    /// `generate`: the most turns of an RTPO trunk batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtpo_trunk_depth: Option<u64>,
    /// `generate`: of the prompt tokens, scaffold tokens (PATS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaffold_tokens: Option<u64>,
    /// `generate`: generation passes, when dynamic sampling re-rolled or left uniform groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tries: Option<u64>,
    /// `generate`: uniform groups left after the last pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uniform_groups: Option<u64>,
    /// `pats`: the bank version after the review.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// `pats`: the bank version the review started from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_before: Option<u64>,
    /// The rest of the method's record, as written (`pats`: the review's `step`, `types`,
    /// `pressure` and `entries`).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

impl MethodDetail {
    /// The detail of a method's whole `record` (PATS's review): its numbers above, the rest
    /// in `other`; empty when it does not serialize as a JSON object.
    pub fn of_record<T: Serialize>(record: &T) -> Self {
        serde_json::to_value(record)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }
}

/// As JSON (keys in order, as the metrics log holds it).
impl std::fmt::Display for MethodDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_value(self) {
            Ok(v) => write!(f, "{v}"),
            Err(_) => write!(f, "{{}}"),
        }
    }
}

/// A `detail` as written, or the empty detail when it is not one (EVT-3).
fn detail_or_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<MethodDetail, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(MethodDetail::deserialize(&v).unwrap_or_default())
}

/// Receives events; must be cheap (called on the controller's thread).
pub type EventSink = Arc<dyn Fn(&TrainEvent) + Send + Sync>;

/// A sink that drops every event.
pub fn no_events() -> EventSink {
    Arc::new(|_| {})
}

/// A missing float of an event (EVT-2).
fn nan() -> f64 {
    f64::NAN
}

/// A float of an event; `null` (a non-finite float as JSON writes it) reads as NaN (EVT-2).
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The clock fields the metrics log adds to every line (JL-3).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct Clock {
    unix_ms: Option<u64>,
    elapsed_s: Option<f64>,
}

/// One line of the metrics log, read (EVT-1): its event, if it is one keel knows, and the
/// clock fields the log adds.
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    /// The event (None for a line of an event this version does not know).
    pub event: Option<TrainEvent>,
    /// Wall clock of the line, in ms since the Unix epoch.
    pub unix_ms: Option<u64>,
    /// Seconds since its trainer life started.
    pub elapsed_s: Option<f64>,
}

impl LoggedEvent {
    /// Reads one JSON value of the log (EVT-2: an unknown event is `event: None`).
    pub fn from_value(v: &serde_json::Value) -> Self {
        let clock = Clock::deserialize(v).unwrap_or_default();
        LoggedEvent {
            event: TrainEvent::deserialize(v).ok(),
            unix_ms: clock.unix_ms,
            elapsed_s: clock.elapsed_s,
        }
    }

    /// Reads one line of the log; an error when it is not JSON.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        Ok(Self::from_value(&serde_json::from_str(line)?))
    }
}

/// The events of `values` (metrics log lines as JSON), in order; lines of unknown events are
/// left out (EVT-2).
pub fn events_of(values: &[serde_json::Value]) -> Vec<TrainEvent> {
    values
        .iter()
        .filter_map(|v| LoggedEvent::from_value(v).event)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evt1_an_event_reads_back_as_written() {
        let ev = TrainEvent::Checkpoint {
            id: "c1".into(),
            step: 3,
            parent: Some("c0".into()),
        };
        let v = serde_json::to_value(&ev).expect("json");
        let back = LoggedEvent::from_value(&v).event.expect("event");
        assert_eq!(serde_json::to_value(&back).expect("json"), v);
    }

    #[test]
    fn evt2_missing_and_null_floats_read_as_nan_unknown_events_as_none() {
        let line = r#"{"event":"step","step":2,"success":null,"elapsed_s":1.5}"#;
        let read = LoggedEvent::parse(line).expect("json");
        assert_eq!(read.elapsed_s, Some(1.5));
        match read.event {
            Some(TrainEvent::Step {
                step,
                success,
                reward,
                branch,
                ..
            }) => {
                assert_eq!(step, 2);
                assert!(success.is_nan() && reward.is_nan());
                assert!(branch.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let unknown = LoggedEvent::parse(r#"{"event":"future","unix_ms":5}"#).expect("json");
        assert!(unknown.event.is_none());
        assert_eq!(unknown.unix_ms, Some(5));
        assert!(LoggedEvent::parse("not json").is_err());
    }

    #[test]
    fn evt3_method_details_read_typed_and_write_back_as_logged() {
        let lines = [
            r#"{"event":"method","step":3,"method":"generate","detail":{"batch_seq":7,"prompt_tokens":90,"scaffold_tokens":12,"tries":2,"uniform_groups":1}}"#,
            r#"{"event":"method","step":4,"method":"rtpo","detail":{"batch_seq":8,"depth":0,"depths":2,"first_task":16}}"#,
            r#"{"event":"method","step":5,"method":"pats","detail":{"entries":3,"pressure":0.5,"step":5,"types":[{"mode":"tip","task_type":"add"}],"version":4,"version_before":3}}"#,
            r#"{"event":"method","step":6,"method":"armor","detail":{"reference_reset_at":6}}"#,
        ];
        let mut details = Vec::new();
        for line in lines {
            let logged: serde_json::Value = serde_json::from_str(line).expect("json");
            let ev = LoggedEvent::from_value(&logged).event.expect("event");
            assert_eq!(serde_json::to_value(&ev).expect("json"), logged, "{line}");
            match ev {
                TrainEvent::Method { detail, .. } => details.push(detail),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((details[0].tries, details[0].batch_seq), (Some(2), Some(7)));
        assert_eq!((details[1].depth, details[1].depths), (Some(0), Some(2)));
        assert_eq!(
            (details[2].version, details[2].version_before),
            (Some(4), Some(3))
        );
        assert!(details[2].other.contains_key("types") && details[0].other.is_empty());
        assert_eq!(details[3].reference_reset_at, Some(6));
        assert_eq!(details[3].to_string(), r#"{"reference_reset_at":6}"#);
        let odd = r#"{"event":"method","step":1,"method":"x","detail":[1]}"#;
        match LoggedEvent::parse(odd).expect("json").event {
            Some(TrainEvent::Method { detail, .. }) => assert_eq!(detail, MethodDetail::default()),
            other => panic!("{other:?}"),
        }
    }
}
