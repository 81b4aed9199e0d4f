//! The terminal progress bar, fed by the runtime's events.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_actors::{EventSink, TrainEvent};

/// A progress bar over RL steps that also prints evaluations and checkpoints.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar over `steps` RL steps; hidden when `hidden` or when stderr is not a terminal.
    pub fn new(steps: u64, hidden: bool) -> Self {
        let bar = ProgressBar::new(steps);
        if hidden {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        let style = ProgressStyle::with_template(
            "{spinner} rl step {pos}/{len} [{elapsed_precise}<{eta_precise}] {wide_bar} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Self { bar }
    }

    /// The event sink driving this bar.
    pub fn sink(&self) -> EventSink {
        let bar = self.bar.clone();
        Arc::new(move |ev: &TrainEvent| {
            match ev {
                TrainEvent::SftDone { steps, loss } => {
                    bar.println(format!("sft: {steps} steps, final loss {loss:.3}"))
                }
                TrainEvent::Eval {
                    phase,
                    version,
                    success,
                    episodes,
                    decoding,
                    avg_at_k,
                    samples,
                    temperature,
                } => {
                    let sampled = avg_at_k
                        .map(|a| format!(", avg@{samples} (T={temperature}) {a:.3}"))
                        .unwrap_or_default();
                    bar.println(format!("eval {phase} (version {version}): pass@1 ({decoding}) {success:.3}{sampled} over {episodes} held-out tasks"))
                }
                TrainEvent::Resumed {
                    checkpoint,
                    step,
                    reused_batches,
                    dropped_batches,
                } => {
                    bar.set_position(*step);
                    bar.println(format!(
                    "resumed from checkpoint {checkpoint} at step {step} ({reused_batches} stored batches reused, {dropped_batches} dropped)"
                ))
                }
                TrainEvent::Step {
                    step,
                    metrics,
                    success,
                    ..
                } => {
                    bar.set_position(*step);
                    bar.set_message(format!(
                        "success {success:.2} loss {:.3} kl {:.4} gnorm {:.2} {:.0} tok/s",
                        metrics.loss, metrics.approx_kl, metrics.grad_norm, metrics.tokens_per_s
                    ));
                }
                TrainEvent::Dropped { batch_seq, reason } => {
                    bar.println(format!("dropped batch {batch_seq}: {reason}"))
                }
                TrainEvent::Checkpoint { id, step, .. } => {
                    bar.println(format!("checkpoint {id} at step {step}"))
                }
                TrainEvent::Skipped {
                    step,
                    batch_seq,
                    what,
                } => bar.println(format!(
                    "skipped batch {batch_seq} at step {step}: non-finite {what}"
                )),
                // Per-batch rollout numbers are for the metrics log and `keel report`.
                TrainEvent::Rollout { .. } => {}
                TrainEvent::Method {
                    step,
                    method,
                    detail,
                } => match method.as_str() {
                    // Per-batch generation details are for the metrics log, not the terminal.
                    "generate" => {}
                    _ => bar.println(format!("{method} at step {step}: {detail}")),
                },
                TrainEvent::Rewind {
                    from_step,
                    to_step,
                    to_checkpoint,
                    branch,
                    reason,
                    lr,
                    ..
                } => {
                    bar.set_position(*to_step);
                    bar.println(format!(
                    "collapse guard: {reason} at step {from_step}; rewound to {to_checkpoint} (step {to_step}) on branch {branch}, lr {lr:e}"
                ))
                }
            }
        })
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
