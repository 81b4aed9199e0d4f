//! `[run]`: the job as a whole: name, seed, length, mode, checkpoints, device, signals.
//!
//! Invariants:
//! - CF-5: `run.name` is 1 to 64 characters of `[A-Za-z0-9_-]`, not starting with `-` (it
//!   becomes a metric label, an object-key segment and a default folder name).

use serde::{Deserialize, Serialize};

use super::key::{at_least, ints, Key, Range};
use super::ConfigError;

/// Whether generation waits for the learner (sync) or runs ahead of it (async).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Generate with version v, train, publish v+1, repeat: every token is on-policy.
    Sync,
    /// Generators sample while the learner trains, at most `staleness_bound` versions behind.
    Async,
}

/// `[run]`: the job as a whole.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Name of the run (recorded in every batch).
    pub name: String,
    /// Seed of everything: model init, task order, sampling, minibatch order.
    pub seed: u64,
    /// Number of RL steps (learner updates) in total.
    pub steps: u64,
    /// `sync` or `async`.
    pub mode: Mode,
    /// Async mode: the most policy versions between a sampled token and the update using it.
    pub staleness_bound: u64,
    /// Commit a checkpoint every this many RL steps (and at the end).
    pub checkpoint_every: u64,
    /// `cpu`, `cuda` or `auto` (CUDA when available).
    pub device: String,
    /// Torch intra-op threads (0 = torch's default).
    pub threads: usize,
    /// On SIGTERM/SIGINT (spot preemption): seconds to finish the current step, commit a
    /// checkpoint and exit 0; past it the process exits 1.
    pub sigterm_grace_s: u64,
    /// Checkpoint blobs of at least this many bytes are uploaded as S3 multipart uploads.
    pub checkpoint_multipart_bytes: u64,
    /// The metrics log stores a segment at most this often while events come in (JL-4).
    pub metrics_log_flush_ms: u64,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "quickstart".into(),
            seed: 7,
            steps: 200,
            mode: Mode::Sync,
            staleness_bound: 1,
            checkpoint_every: 25,
            device: "auto".into(),
            threads: 0,
            sigterm_grace_s: 60,
            checkpoint_multipart_bytes: 16 << 20,
            metrics_log_flush_ms: 1000,
        }
    }
}

const NAME: Key = Key::new(
    "run.name",
    Range::Text("1-64 chars of [A-Za-z0-9_-]"),
    "Name of the run; the `run` label of every metric and the default run root runs/<name>.",
);
const SEED: Key = Key::new(
    "run.seed",
    at_least(0),
    "Seed of everything: model init, task order, sampling, minibatch order.",
);
const STEPS: Key = Key::new(
    "run.steps",
    ints(1, 1 << 40),
    "RL steps (learner updates) in total.",
);
const MODE: Key = Key::new("run.mode", Range::Words(&["sync", "async"]), "sync: generate, train, publish, repeat; async: generators run ahead within run.staleness_bound.");
const STALENESS_BOUND: Key = Key::with_also(
    "run.staleness_bound",
    at_least(1),
    "in async mode",
    "Async: most policy versions between a sampled token and the update using it.",
);
const CHECKPOINT_EVERY: Key = Key::new(
    "run.checkpoint_every",
    at_least(1),
    "Commit a checkpoint every this many RL steps (and at the end).",
);
const DEVICE: Key = Key::new(
    "run.device",
    Range::Words(&["cpu", "cuda", "auto"]),
    "Torch device; auto = CUDA when available.",
);
/// `run.threads` (its bound is the machine's, VB-3).
pub const THREADS: Key = Key::with_also(
    "run.threads",
    at_least(0),
    "at most 4 x the machine's cores",
    "Torch intra-op threads (0 = torch's default).",
);
const SIGTERM_GRACE_S: Key = Key::new(
    "run.sigterm_grace_s",
    at_least(1),
    "On SIGTERM/SIGINT: seconds to finish the step, commit a checkpoint and exit 0 (else exit 1).",
);
const METRICS_LOG_FLUSH_MS: Key = Key::new("run.metrics_log_flush_ms", ints(0, 60_000), "The metrics log (metrics/ in the run root) stores a segment at most this often while events come in: how fresh `keel report` is, against how many objects a long run makes (0 = a segment whenever the writer is free).");
const CHECKPOINT_MULTIPART_BYTES: Key = Key::new("run.checkpoint_multipart_bytes", at_least(1), "Checkpoint blobs at least this large go up as S3 multipart uploads (parts of max(this, 8 MiB)).");

/// The keys of `[run]`, in the order `keel config explain` lists them.
pub const KEYS: &[Key] = &[
    NAME,
    SEED,
    STEPS,
    MODE,
    STALENESS_BOUND,
    CHECKPOINT_EVERY,
    DEVICE,
    THREADS,
    SIGTERM_GRACE_S,
    METRICS_LOG_FLUSH_MS,
    CHECKPOINT_MULTIPART_BYTES,
];

impl RunSection {
    /// Checks every key of `[run]` on its own (CF-3, CF-5).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && !self.name.starts_with('-')
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(NAME.error(format!(
                "must be 1 to 64 characters of [A-Za-z0-9_-], not starting with '-', got {:?}",
                self.name
            )));
        }
        STEPS.check_int(self.steps)?;
        CHECKPOINT_EVERY.check_int(self.checkpoint_every)?;
        SIGTERM_GRACE_S.check_int(self.sigterm_grace_s)?;
        METRICS_LOG_FLUSH_MS.check_int(self.metrics_log_flush_ms)?;
        CHECKPOINT_MULTIPART_BYTES.check_int(self.checkpoint_multipart_bytes)?;
        if self.mode == Mode::Async {
            STALENESS_BOUND.check_int(self.staleness_bound)?;
        }
        DEVICE.check_word(&self.device)
    }

    /// The staleness bound in force: 0 in sync mode.
    pub fn staleness_bound(&self) -> u64 {
        match self.mode {
            Mode::Sync => 0,
            Mode::Async => self.staleness_bound,
        }
    }
}
