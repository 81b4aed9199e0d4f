//! `[tracking] tensorboard = true`: the run's events as TensorBoard event files in the run root
//! (local or S3; `tensorboard --logdir <run root>/tensorboard`), one TensorBoard run per branch.
//!
//! Object stores have no append, so events are buffered and written as create-only segment
//! files `tensorboard/<branch>/events.out.tfevents.<first step>.<last step>.<written>.keel`
//! (`written` = Unix milliseconds and a sequence number, so two segments of one step differ), each a
//! complete event file, at every checkpoint, every `tracking.flush_every_steps` steps, on a
//! rewind and at the end. TensorBoard reads a run's files in name order, which is step order.
//!
//! What is logged: every numeric learner metric of a step (`train/<field>`), the batch's
//! `rollout/{success,reward,invalid_rate,max_lag}`, held-out `eval/success` at the evaluated
//! version, checkpoint ids (`checkpoint`, text), rewinds (`rewind`, text, on the abandoned
//! branch) and the effective config (`config`, text) once per branch.
//!
//! Invariants:
//! - TB-1 (no duplicate steps): a writer opened on a branch whose folder already holds segments
//!   drops every point at or before the highest step written there, so a resumed run (crashed
//!   after flushing steps its checkpoint does not cover) never logs a step twice.
//! - TB-2 (never overwrites): segments are create-only; a failed write is counted as dropped
//!   events and training goes on.
//! - TB-3 (no half-written files): a segment whose write a kill interrupted (a local staging
//!   file, ST-10) is removed when the branch is opened again, so TensorBoard never reads steps
//!   the new life logs again.

use bytes::Bytes;
use keel_store::RunStore;

use super::event_file::{append, file_version, scalars, text, Event};
use super::{eval_values, step_values, Tracker};
use crate::events::TrainEvent;

/// The folder of TensorBoard runs under the run root.
pub const TENSORBOARD_DIR: &str = "tensorboard";

/// Buffers events and writes them as segment files of the current branch's folder.
pub struct TensorBoardWriter {
    store: RunStore,
    io: tokio::runtime::Handle,
    config_text: String,
    branch: String,
    /// Highest step already in the branch's folder when it was opened (TB-1).
    written_through: Option<u64>,
    buffer: Vec<u8>,
    points: u64,
    steps: (Option<u64>, u64),
    since_flush: u64,
    flush_every: u64,
    seq: u64,
    dropped: u64,
}

/// The step range a segment file name records, `(first, last)`.
fn segment_steps(key: &str) -> Option<(u64, u64)> {
    let name = key.rsplit('/').next()?;
    let rest = name.strip_prefix("events.out.tfevents.")?;
    let parts: Vec<&str> = rest.split('.').collect();
    match parts.as_slice() {
        [first, last, _, "keel"] => Some((first.parse().ok()?, last.parse().ok()?)),
        _ => None,
    }
}

use crate::process::unix_secs as now;

impl TensorBoardWriter {
    /// A writer on `branch`, which logs `config_text` once when the branch's folder is new.
    pub fn open(
        store: RunStore,
        io: tokio::runtime::Handle,
        branch: &str,
        config_text: String,
        flush_every: u64,
    ) -> Self {
        let mut w = TensorBoardWriter {
            store,
            io,
            config_text,
            branch: String::new(),
            written_through: None,
            buffer: Vec::new(),
            points: 0,
            steps: (None, 0),
            since_flush: 0,
            flush_every: flush_every.max(1),
            seq: 0,
            dropped: 0,
        };
        w.switch(branch, 0);
        w
    }

    fn dir(&self) -> String {
        format!("{TENSORBOARD_DIR}/{}", self.branch)
    }

    /// Starts writing to `branch`'s folder (TB-1); a new folder gets the config at `step`.
    fn switch(&mut self, branch: &str, step: u64) {
        self.branch = branch.to_string();
        // A life killed mid-write may have left a staging file that TensorBoard would read
        // (TB-3); this process is the branch folder's only writer.
        match self.store.remove_interrupted_writes(&self.dir()) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                files = n,
                "tensorboard: removed interrupted event-file writes"
            ),
            Err(e) => tracing::warn!(error = %e, "tensorboard: cannot clean interrupted writes"),
        }
        let listed = self
            .io
            .block_on(self.store.list_objects(&self.dir()))
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "tensorboard: cannot list the branch's event files");
                Vec::new()
            });
        self.written_through = listed
            .iter()
            .filter_map(|k| segment_steps(k))
            .map(|(_, last)| last)
            .max();
        if self.written_through.is_none() {
            let config = text(now(), step, "config", &self.config_text);
            self.push(step, &config);
        }
    }

    /// Buffers `event` at `step`, unless the step is already written (TB-1).
    fn push(&mut self, step: u64, event: &Event) {
        if self.written_through.is_some_and(|w| step <= w) {
            return;
        }
        if self.buffer.is_empty() {
            append(&file_version(now()), &mut self.buffer);
        }
        append(event, &mut self.buffer);
        self.points += 1;
        let (first, last) = &mut self.steps;
        first.get_or_insert(step);
        *last = (*last).max(step);
    }

    /// Writes the buffered events as one segment file (TB-2).
    fn write_segment(&mut self) {
        let (Some(first), last) = self.steps else {
            return;
        };
        self.seq += 1;
        let written = (now() * 1000.0) as u64;
        let key = format!(
            "{}/events.out.tfevents.{first:010}.{last:010}.{written:013}{:04}.keel",
            self.dir(),
            self.seq % 10_000
        );
        let bytes = Bytes::from(std::mem::take(&mut self.buffer));
        if let Err(e) = self.io.block_on(self.store.create_object(&key, bytes)) {
            tracing::warn!(error = %e, key, "tensorboard: could not write an event file");
            self.dropped += self.points;
        }
        self.points = 0;
        self.steps = (None, 0);
        self.since_flush = 0;
    }
}

impl Tracker for TensorBoardWriter {
    fn name(&self) -> &'static str {
        "tensorboard"
    }

    fn handle(&mut self, ev: &TrainEvent) {
        if let Some((step, values)) = step_values(ev) {
            self.push(step, &scalars(now(), step, &values));
            self.since_flush += 1;
            if self.since_flush >= self.flush_every {
                self.write_segment();
            }
            return;
        }
        if let Some((version, values)) = eval_values(ev) {
            self.push(version, &scalars(now(), version, &values));
            return;
        }
        match ev {
            TrainEvent::Checkpoint { id, step, .. } => {
                self.push(*step, &text(now(), *step, "checkpoint", id));
                self.write_segment();
            }
            TrainEvent::Rewind {
                from_step,
                to_step,
                to_checkpoint,
                branch,
                reason,
                ..
            } => {
                let note = format!(
                    "rewound to {to_checkpoint} (step {to_step}) on branch {branch}: {reason}"
                );
                self.push(*from_step, &text(now(), *from_step, "rewind", &note));
                self.write_segment();
                self.switch(branch, *to_step);
            }
            _ => {}
        }
    }

    fn finish(&mut self) -> u64 {
        self.write_segment();
        std::mem::take(&mut self.dropped)
    }

    fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_carry_their_step_range() {
        assert_eq!(
            segment_steps(
                "tensorboard/main/events.out.tfevents.0000000003.0000000050.17961252929700001.keel"
            ),
            Some((3, 50))
        );
        assert_eq!(
            segment_steps("tensorboard/main/events.out.tfevents.1.host"),
            None
        );
    }
}
