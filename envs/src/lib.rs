//! keel's built-in multi-turn text environments, their oracles, tokenizer and demonstrations,
//! and the client of external environments.
//!
//! - [`mod@env`]: the [`Env`] trait every environment implements (EN-1..EN-9); [`action`]: the
//!   visible text of a raw sampled response (AX-1).
//! - Built-in envs: [`calc`], [`search_qa`], [`household`], [`shop`], [`sokoban`], and the
//!   multi-agent [`solver_verifier`] and [`search_team`] (Dr. MAS).
//! - [`dataset`]: [`dataset::DatasetEnv`], the rows of a verl-format prompt dataset (JSONL or
//!   Parquet) scored by the built-in verifiers of [`verify`], single-turn or with tools.
//! - [`external`]: [`ExternalEnv`], an env served by another process over HTTP+JSON.
//! - [`registry`]: names, [`EnvConfig`], [`build_env`], [`make_env`], [`tokenizer_for`].
//! - [`snapshot`]: serializable state at turn boundaries (RTPO).
//! - [`latency`]: simulated long-tailed step latency.
//! - [`evaluate`]: oracle / random / model evaluation with confidence intervals.
//! - [`split`]: disjoint train and held-out eval task seeds.
//! - [`tokenizer`]: the word-level tokenizer over an env's declared vocabulary, and its Hugging
//!   Face export (`tokenizer.json`, `tokenizer_config.json`).
//! - [`demo`]: oracle demonstrations as text episodes (rendered into tokens by the runtime's chat codec).
//! - [`scaffold`]: PATS, the training-only scaffold bank of skills and mistakes.
//! - [`bm25`], [`lexicon`]: the ranking function and the procedural word lists.
//!
//! Everything is deterministic: tasks are functions of their seed, demonstrations of their seeds.

#![deny(missing_docs)]

pub mod action;
pub mod agent;
pub mod bm25;
pub mod calc;
pub mod dataset;
pub mod demo;
pub mod env;
pub mod error;
pub mod evaluate;
pub mod external;
pub mod household;
mod http_json;
pub mod latency;
pub mod lexicon;
pub mod redact;
pub mod registry;
pub mod row_order;
pub mod scaffold;
pub mod search_qa;
pub mod search_team;
pub mod shop;
pub mod snapshot;
pub mod sokoban;
pub mod solver_verifier;
pub mod split;
pub mod tokenizer;
pub mod verify;

#[cfg(test)]
mod suite_tests;

pub use agent::journal::RecordStore;
pub use agent::{AgentConfig, AgentEnv};
pub use calc::{CalcConfig, CalcEnv};
pub use dataset::{Dataset, DatasetConfig, DatasetEnv, PromptMessage};
pub use demo::{demonstrations, DemoTurn, Demonstration};
pub use env::{
    fnv1a64, Env, Resumed, ResumedNext, SampledToken, SampledTurn, Segment, StepOutcome, TurnLimits,
};
pub use error::EnvError;
pub use external::{ExternalClient, ExternalConfig, ExternalEnv};
pub use latency::LatencyModel;
pub use redact::redact_url;
pub use registry::{build_env, make_env, tokenizer_for, EnvBuilder, EnvConfig, EnvInfo, ENVS};
pub use scaffold::{ScaffoldConfig, ScaffoldController, ScaffoldError, ScaffoldState};
pub use snapshot::EnvSnapshot;
pub use split::{task_index, task_seed, Split};
pub use tokenizer::{SpecialTokens, Tokenizer};
