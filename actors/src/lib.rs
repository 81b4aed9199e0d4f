//! keel's actor runtime: supervised generators, environment shards, a learner and a controller,
//! wired together through the object store.
//!
//! Data flow: the controller admits generation (AS-1) → a generator samples episodes against env
//! shards (RO-1..4) and writes the batch to the store (GN-2) → the controller hands the batch's
//! key to the learner, which reads it from the store (LA-1), checks staleness (LA-2) and updates
//! → the controller publishes the new weights (CT-1) and commits checkpoints (CT-2).
#![deny(missing_docs)]

pub mod agent_records;
pub mod config;
pub mod controller;
pub mod demo_tokens;
pub mod env_shard;
pub mod error;
pub mod eval;
pub mod events;
pub mod faults;
pub mod footprint;
pub mod frontier;
pub mod generator;
pub mod guard;
pub mod job;
pub mod jsonl;
pub mod learner_actor;
pub mod learner_ranks;
pub mod method;
pub mod metrics;
pub mod parts;
pub mod pats_seed;
pub mod process;
pub mod provenance;
pub mod remote;
pub mod rollout;
pub mod seeds;
pub mod setup;
pub mod stored_batches;
pub mod supervision;
pub mod tracking;
pub mod vllm;
pub mod weights;

pub use config::{ConfigError, Mode, TrainConfig};
pub use error::ActorError;
pub use events::{EventSink, TrainEvent};
pub use job::{run_job, JobOptions, JobOutcome, Role};
pub use metrics::TrainMetrics;
pub use process::StopSignal;
pub use remote::{run_generator, GeneratorExit};
