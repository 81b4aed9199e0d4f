//! Errors of the actor runtime.

use keel_envs::EnvError;
use keel_learner::LearnerError;
use keel_store::StoreError;

/// Anything that can stop a training job.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// The object store failed (after its own retries).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The learner failed (tch error, non-finite loss, bad checkpoint contents).
    #[error("learner: {0}")]
    Learner(#[from] LearnerError),
    /// The environment layer failed (e.g. a word the tokenizer does not know).
    #[error("environment: {0}")]
    Env(#[from] EnvError),
    /// The configuration is invalid.
    #[error("config: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// An actor's mailbox was closed (the actor died and was not restarted).
    #[error("actor mailbox closed: {0}")]
    Mailbox(String),
    /// An actor kind panicked more often than its restart budget allows (SV-2).
    #[error("{kind} actors restarted {restarts} times, over their budget of {budget}; see the log for the panics")]
    RestartBudgetExhausted {
        /// Actor kind.
        kind: &'static str,
        /// Restarts so far.
        restarts: u32,
        /// The budget.
        budget: u32,
    },
    /// A batch was older than the staleness bound allows (AS-1).
    #[error("batch {batch_seq} has a turn {lag} versions old, over the staleness bound {bound}")]
    Stale {
        /// The batch.
        batch_seq: u64,
        /// Its oldest turn's lag.
        lag: u64,
        /// The bound.
        bound: u64,
    },
    /// The learner panicked in an update (LA-6): its state is not trusted any more.
    #[error(
        "the learner panicked while {during}: {message}; its weights may be half updated, so the \
         run stops here and a new run resumes from the last committed checkpoint"
    )]
    LearnerPanicked {
        /// What it was doing.
        during: &'static str,
        /// The panic's message.
        message: String,
    },
    /// A generator panicked mid-batch; the batch is retried.
    #[error("generator panicked: {0}")]
    GeneratorPanicked(String),
    /// The inference engine (a vLLM server) failed to start or answered an error.
    #[error("inference engine: {0}")]
    Engine(String),
    /// The inference engine's server died mid-batch; it restarts (under the generators'
    /// restart budget) and the batch's tasks are sampled again.
    #[error("the vLLM server died and restarts: {0}")]
    EngineRestarted(String),
    /// A learner rank exited and the ranked run failed with it (LK-5).
    #[error("{ranks}; the run failed with it: {cause}")]
    RankExited {
        /// Which followers exited, and how.
        ranks: String,
        /// The error rank 0 saw.
        cause: Box<ActorError>,
    },
    /// A stop request (SIGTERM) ended an evaluation between two decode steps (RO-13).
    #[error("the evaluation was interrupted by a stop request")]
    Interrupted,
    /// Loaded weights failed their provenance probe (WB-5): the generator refuses to sample.
    #[error("policy version {version} (weights digest {digest:016x}) failed its provenance probe on the {backend} backend: model {model}'s log-probs differ from the learner's by {diff:.3e} nats (tolerance {tolerance:e}); the loaded weights are not the published ones (stale, partly applied, or a cache kept across the reload)")]
    Provenance {
        /// The policy version loaded.
        version: u64,
        /// Its digest.
        digest: u64,
        /// The generation backend (`keel`).
        backend: &'static str,
        /// Which model (0 = the main one).
        model: usize,
        /// Largest absolute difference of the probe's log-probs.
        diff: f64,
        /// The allowed difference.
        tolerance: f64,
    },
    /// A generator rank did not answer a work order in time; its range is issued again.
    #[error("generator rank {rank} did not answer work order {batch_seq} within {waited_s:.0} s; its tasks are issued again")]
    RankSilent {
        /// The rank.
        rank: u32,
        /// The order's batch.
        batch_seq: u64,
        /// Seconds waited.
        waited_s: f64,
    },
    /// A work order cannot be served as written (its weights are gone, RM-6); its range is
    /// issued again and the rank stays available.
    #[error("generator rank {rank} could not serve work order {batch_seq} ({reason}); its tasks are issued again")]
    OrderVoid {
        /// The rank.
        rank: u32,
        /// The order's batch.
        batch_seq: u64,
        /// Why, in words.
        reason: String,
    },
    /// A generator process answered a work order with an error it cannot retry.
    #[error("generator rank {rank} failed work order {batch_seq}: {message}")]
    RemoteFailed {
        /// The rank.
        rank: u32,
        /// The order's batch.
        batch_seq: u64,
        /// Its error, in words.
        message: String,
    },
    /// Every episode of a training batch failed in its env; the batch is retried.
    #[error("every one of the {failed} episodes of batch {batch_seq} failed in its environment; the last failure: {last_failure}")]
    AllEpisodesFailed {
        /// The batch.
        batch_seq: u64,
        /// Episodes that failed.
        failed: usize,
        /// The last episode failure, in words.
        last_failure: String,
    },
    /// The env failed every episode of several batches in a row (CT-8): the run ends.
    #[error("env `{env}` failed every episode of {batches} training batches in a row; the last failure: {last_failure}")]
    EnvFailing {
        /// The env's name.
        env: String,
        /// Batches that failed in a row.
        batches: u32,
        /// The last episode failure, in words.
        last_failure: String,
    },
    /// The checkpoint to resume from does not fit this run.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// The collapse guard saw an anomaly after spending its rewinds (GD-5), or found no healthy
    /// checkpoint to rewind to.
    #[error("training collapsed: {reason}; {rewinds} rewinds done (guard.max_rewinds); inspect `keel report` and the lineage (`keel ckpt lineage`), then lower learner.lr or fix the data")]
    Collapse {
        /// The anomaly.
        reason: String,
        /// Rewinds done before giving up.
        rewinds: u32,
    },
    /// A bug or an impossible state.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<keel_learner::hf::HfError> for ActorError {
    fn from(e: keel_learner::hf::HfError) -> Self {
        ActorError::Learner(LearnerError::from(e))
    }
}
