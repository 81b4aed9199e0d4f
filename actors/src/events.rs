//! Progress events: what the runtime tells its front end (progress bar, logs, JSONL).

use std::sync::Arc;

use keel_learner::StepMetrics;
use serde::Serialize;

/// Something worth telling the user about.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    /// The SFT warm start finished.
    SftDone {
        /// Steps taken.
        steps: u64,
        /// Final cross-entropy.
        loss: f64,
    },
    /// Something a method's runtime did: dynamic-sampling re-rolls, an RTPO depth, a PATS
    /// review, an ARMOR reference reset (`method` says which; `detail` is its record).
    Method {
        /// Policy version when it happened.
        step: u64,
        /// `generate`, `rtpo`, `pats` or `armor`.
        method: String,
        /// What happened.
        detail: serde_json::Value,
    },
    /// A held-out evaluation finished.
    Eval {
        /// `before_rl` or `after_rl`.
        phase: String,
        /// Policy version evaluated.
        version: u64,
        /// pass@1: the success rate of one greedy episode per task (EV-5).
        success: f64,
        /// Held-out tasks evaluated.
        episodes: usize,
        /// How `success` was decoded: `greedy`.
        decoding: String,
        /// avg@k: the mean success of `samples` episodes per task sampled at `temperature`
        /// (`None` when `rollout.eval_samples = 0`).
        avg_at_k: Option<f64>,
        /// k of avg@k.
        samples: usize,
        /// Temperature of the avg@k pass.
        temperature: f64,
    },
    /// The run resumed from a checkpoint.
    Resumed {
        /// Checkpoint id.
        checkpoint: String,
        /// Its step.
        step: u64,
        /// Stored batches reused.
        reused_batches: usize,
        /// Stored batches dropped.
        dropped_batches: usize,
    },
    /// One RL step finished.
    Step {
        /// Learner step (= policy version).
        step: u64,
        /// Total steps planned.
        total: u64,
        /// The batch trained on.
        batch_seq: u64,
        /// Learner metrics.
        metrics: Box<StepMetrics>,
        /// Success rate of the trained batch.
        success: f64,
        /// Invalid actions per turn in the batch.
        invalid_rate: f64,
        /// Largest policy-version lag of a trained turn.
        max_lag: u64,
        /// The branch the step was taken on (`main`, or `rewind-<n>` after a rewind).
        branch: String,
        /// Mean final reward of the batch.
        reward: f64,
    },
    /// A generator stored a training batch.
    Rollout {
        /// The batch.
        batch_seq: u64,
        /// The policy version it was sampled with.
        policy_version: u64,
        /// Episodes it holds (failed ones excluded).
        episodes: usize,
        /// Seconds from the first reset to the last episode's end (store write excluded).
        sample_seconds: f64,
        /// Sampler decode steps.
        decode_steps: u64,
        /// Of those, steps with at least 90% of the sampler's slots busy.
        busy_decode_steps: u64,
        /// Newer weight versions taken while it was sampled (RO-10, async).
        weight_updates: u64,
    },
    /// The learner refused a non-finite update; the step was skipped (GD-1).
    Skipped {
        /// The policy version that stays.
        step: u64,
        /// The batch that was consumed without an update.
        batch_seq: u64,
        /// What was non-finite (`loss`, `gradient norm`).
        what: String,
    },
    /// The collapse guard rewound to a healthy checkpoint on a new branch (CT-4).
    Rewind {
        /// The policy version when the anomaly was seen.
        from_step: u64,
        /// The step of the healthy checkpoint rewound to.
        to_step: u64,
        /// Its id.
        to_checkpoint: String,
        /// The new branch.
        branch: String,
        /// `nonfinite`, `grad_norm_spike` or `kl_spike`.
        kind: String,
        /// The anomaly, in words.
        reason: String,
        /// The learning rate from now on.
        lr: f64,
    },
    /// A batch was dropped (staleness bound or lost future).
    Dropped {
        /// The batch.
        batch_seq: u64,
        /// Why.
        reason: String,
    },
    /// A checkpoint was committed.
    Checkpoint {
        /// Its id.
        id: String,
        /// Its step.
        step: u64,
        /// The checkpoint it continues (None for a root), as its manifest records it.
        parent: Option<String>,
    },
}

/// Receives events; must be cheap (called on the controller's thread).
pub type EventSink = Arc<dyn Fn(&TrainEvent) + Send + Sync>;

/// A sink that drops every event.
pub fn no_events() -> EventSink {
    Arc::new(|_| {})
}
