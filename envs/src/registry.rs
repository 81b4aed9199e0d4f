//! The environment registry: names, one-line descriptions, difficulty ranges; [`build_env`]
//! from an [`EnvConfig`], or [`make_env`] for a built-in by name.
//!
//! Invariants:
//! - RG-1 Every name in [`ENVS`] builds with every difficulty in its range, and its tokenizer
//!   covers every word it emits (EN-6; `suite_tests` checks it).
//! - RG-2 `external` is the only entry that needs a `url`; it is the HTTP+JSON protocol client.
//! - RG-3 `dataset` and `agent` are the entries that need files (`train_file`, `eval_file`);
//!   like `external` they have no difficulty (their rows are their tasks).
//! - RG-4 `agent` also needs `[env.agent] command`; one builder starts one gateway (GTW-1), which
//!   every instance it builds shares.

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::agent::gateway::Gateway;
use crate::agent::journal::{Journal, RecordStore};
use crate::agent::{AgentConfig, AgentEnv};
use crate::dataset::{Dataset, DatasetConfig, DatasetEnv, RewardClient};
use crate::env::Env;
use crate::error::{quote, EnvError};
use crate::external::ExternalConfig;
use crate::tokenizer::Tokenizer;

/// One registered environment.
#[derive(Clone, Copy, Debug)]
pub struct EnvInfo {
    /// Registry name.
    pub name: &'static str,
    /// Largest difficulty (the smallest is 1).
    pub max_difficulty: usize,
    /// Agents taking turns (1 for single-agent envs).
    pub agents: usize,
    /// One line for `keel env list`.
    pub about: &'static str,
}

/// Every environment keel knows, in `keel env list` order.
pub const ENVS: &[EnvInfo] = &[
    EnvInfo {
        name: "calc",
        max_difficulty: 4,
        agents: 1,
        about: "tool-integrated arithmetic: `calc A op B`, `answer N`; difficulty = operations",
    },
    EnvInfo {
        name: "search-qa",
        max_difficulty: 3,
        agents: 1,
        about: "multi-hop QA over a generated knowledge base with a BM25 `search` tool; F1 reward",
    },
    EnvInfo {
        name: "household",
        max_difficulty: 4,
        agents: 1,
        about: "ALFWorld-like rooms: pick, clean, heat, cool, examine, pick-two",
    },
    EnvInfo {
        name: "shop",
        max_difficulty: 4,
        agents: 1,
        about: "WebShop-like catalog: search, click, select options, buy; attribute-match reward",
    },
    EnvInfo {
        name: "sokoban",
        max_difficulty: 4,
        agents: 1,
        about: "box-pushing grid puzzles rendered as text",
    },
    EnvInfo {
        name: "solver-verifier",
        max_difficulty: 4,
        agents: 2,
        about: "Dr. MAS math: a solver proposes, a verifier accepts or rejects (2 loops)",
    },
    EnvInfo {
        name: "search-team",
        max_difficulty: 3,
        agents: 3,
        about: "Dr. MAS search: a router, a searcher and an answerer",
    },
    EnvInfo {
        name: "external",
        max_difficulty: 0,
        agents: 1,
        about: "any env served over keel's HTTP+JSON protocol (set `url`)",
    },
    EnvInfo {
        name: "dataset",
        max_difficulty: 0,
        agents: 1,
        about: "rows of a verl-format JSONL/Parquet prompt dataset, verifier-scored (set `train_file`, `eval_file`)",
    },
    EnvInfo {
        name: "agent",
        max_difficulty: 0,
        agents: 1,
        about: "your own agent program, calling the policy through keel's OpenAI-compatible gateway, on a dataset's rows (set [env.agent] command and [env.dataset])",
    },
];

/// Which environment to build and how hard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Registry name (see [`ENVS`]).
    pub name: String,
    /// The difficulty knob (sets the horizon), from 1 to the env's maximum.
    pub difficulty: usize,
    /// The external env server, for `name = "external"`.
    pub external: Option<ExternalConfig>,
    /// The dataset, for `name = "dataset"` and `name = "agent"` (its tasks).
    pub dataset: Option<DatasetConfig>,
    /// The agent program, for `name = "agent"`.
    pub agent: Option<AgentConfig>,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            name: "calc".into(),
            difficulty: 2,
            external: None,
            dataset: None,
            agent: None,
        }
    }
}

impl EnvConfig {
    /// A built-in env at `difficulty`.
    pub fn new(name: &str, difficulty: usize) -> Self {
        EnvConfig {
            name: name.into(),
            difficulty,
            external: None,
            dataset: None,
            agent: None,
        }
    }

    /// Checks the name, the difficulty range and the external section (RG-2).
    pub fn validate(&self) -> Result<&'static EnvInfo, EnvError> {
        let info = ENVS
            .iter()
            .find(|e| e.name == self.name)
            .ok_or_else(|| unknown_env(&self.name))?;
        if info.name == "external" {
            let ext = self.external.as_ref().ok_or(EnvError::InvalidConfig {
                env: "external",
                field: "url",
                value: "(none)".into(),
                expected: "the base URL of an env server, e.g. http://127.0.0.1:8770",
            })?;
            ext.validate()?;
        } else if info.name == "dataset" || info.name == "agent" {
            let data = self.dataset.as_ref().ok_or(EnvError::InvalidConfig {
                env: "dataset",
                field: "train_file",
                value: "(none)".into(),
                expected: "a .jsonl or .parquet file of training rows",
            })?;
            data.validate()?;
            if info.name == "agent" {
                let agent = self.agent.as_ref().ok_or(EnvError::InvalidConfig {
                    env: "agent",
                    field: "command",
                    value: "(none)".into(),
                    expected:
                        "the agent program and its arguments, e.g. [\"python3\", \"agent.py\"]",
                })?;
                agent.validate()?;
            }
        } else if !(1..=info.max_difficulty).contains(&self.difficulty) {
            return Err(EnvError::InvalidConfig {
                env: info.name,
                field: "difficulty",
                value: self.difficulty.to_string(),
                expected: if info.max_difficulty == 3 {
                    "an integer in 1..=3"
                } else {
                    "an integer in 1..=4"
                },
            });
        }
        Ok(info)
    }
}

fn unknown_env(name: &str) -> EnvError {
    EnvError::UnknownEnv {
        name: quote(name),
        known: ENVS.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
    }
}

/// The built-in environment `name` at `difficulty` (`calc`: operations per task).
pub fn make_env(name: &str, difficulty: usize) -> Result<Box<dyn Env>, EnvError> {
    build_env(&EnvConfig::new(name, difficulty))
}

/// The environment `cfg` describes (validated first), built-in or external.
pub fn build_env(cfg: &EnvConfig) -> Result<Box<dyn Env>, EnvError> {
    EnvBuilder::new(cfg)?.build()
}

/// Builds env instances of one config; an external env's server is connected once and its
/// client shared by every instance (EX-4), a dataset is read once and its rows shared (DS-1).
#[derive(Clone)]
pub struct EnvBuilder {
    cfg: EnvConfig,
    shared: Shared,
}

/// What every instance of one builder shares.
#[derive(Clone)]
enum Shared {
    Nothing,
    External(crate::external::ExternalClient),
    Dataset(Arc<Dataset>, Option<Arc<RewardClient>>),
    Agent(
        Arc<AgentConfig>,
        Arc<Gateway>,
        Option<Arc<Journal>>,
        Arc<Dataset>,
        Option<Arc<RewardClient>>,
    ),
}

impl EnvBuilder {
    /// Checks the config (and connects to an external env's server, or reads a dataset).
    pub fn new(cfg: &EnvConfig) -> Result<Self, EnvError> {
        Self::recording(cfg, None)
    }

    /// [`EnvBuilder::new`], whose `agent` env records every answered call in `records` (the
    /// run's store) before answering it, and takes up an earlier process's episodes (AJ-1..4).
    pub fn recording(
        cfg: &EnvConfig,
        records: Option<Arc<dyn RecordStore>>,
    ) -> Result<Self, EnvError> {
        cfg.validate()?;
        let shared = match cfg.name.as_str() {
            "external" => Shared::External(crate::external::ExternalClient::connect(
                cfg.external.clone().unwrap_or_default(),
            )?),
            "dataset" => {
                let (rows, reward) = load_dataset(cfg)?;
                Shared::Dataset(rows, reward)
            }
            "agent" => {
                let (rows, reward) = load_dataset(cfg)?;
                let agent = cfg.agent.clone().unwrap_or_default();
                let gateway = Arc::new(agent.bind_gateway()?);
                let journal = match records {
                    Some(store) => Some(Arc::new(agent.open_journal(store, &gateway)?)),
                    None => None,
                };
                gateway.serve()?;
                Shared::Agent(Arc::new(agent), gateway, journal, rows, reward)
            }
            _ => Shared::Nothing,
        };
        Ok(EnvBuilder {
            cfg: cfg.clone(),
            shared,
        })
    }

    /// A fresh env instance.
    pub fn build(&self) -> Result<Box<dyn Env>, EnvError> {
        match &self.shared {
            Shared::External(client) => Ok(Box::new(client.env())),
            Shared::Dataset(data, reward) => {
                Ok(Box::new(DatasetEnv::new(data.clone(), reward.clone())))
            }
            Shared::Agent(agent, gateway, journal, data, reward) => Ok(Box::new(AgentEnv::new(
                agent.clone(),
                gateway.clone(),
                journal.clone(),
                data.clone(),
                reward.clone(),
            ))),
            Shared::Nothing => build_builtin(&self.cfg),
        }
    }
}

/// The rows of `cfg.dataset` and its reward service, read once per builder (DS-1).
fn load_dataset(cfg: &EnvConfig) -> Result<(Arc<Dataset>, Option<Arc<RewardClient>>), EnvError> {
    let data = cfg.dataset.clone().unwrap_or_default();
    let rows = Arc::new(Dataset::load(&data)?);
    let reward = match data.reward.enabled() {
        true => Some(RewardClient::connect(&data.reward)?),
        false => None,
    };
    Ok((rows, reward))
}

fn build_builtin(cfg: &EnvConfig) -> Result<Box<dyn Env>, EnvError> {
    let d = cfg.difficulty;
    Ok(match cfg.name.as_str() {
        "calc" => Box::new(crate::calc::CalcEnv::new(crate::calc::CalcConfig {
            n_ops: d,
        })),
        "search-qa" => Box::new(crate::search_qa::SearchQaEnv::new(d)),
        "household" => Box::new(crate::household::HouseholdEnv::new(d)),
        "shop" => Box::new(crate::shop::ShopEnv::new(d)),
        "sokoban" => Box::new(crate::sokoban::SokobanEnv::new(d)),
        "solver-verifier" => Box::new(crate::solver_verifier::SolverVerifierEnv::new(d)),
        "search-team" => Box::new(crate::search_team::SearchTeamEnv::new(d)),
        other => return Err(unknown_env(other)),
    })
}

/// The tokenizer of the env `cfg` describes (connects to an external server to ask for its
/// vocabulary).
pub fn tokenizer_for(cfg: &EnvConfig) -> Result<Tokenizer, EnvError> {
    match cfg.name.as_str() {
        "calc" => Ok(Tokenizer::calc()),
        // The agent env's words are its dataset's: no gateway is started (and no port taken)
        // to learn them.
        "agent" => {
            cfg.validate()?;
            let rows = Dataset::load(&cfg.dataset.clone().unwrap_or_default())?;
            Ok(Tokenizer::from_words(rows.vocabulary()))
        }
        _ => Ok(Tokenizer::for_env(build_env(cfg)?.as_ref())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn make_env_by_name_and_errors() {
        let env = make_env("calc", 3).unwrap();
        assert_eq!(env.name(), "calc");
        assert_eq!(env.max_turns(), 5);
        assert!(matches!(
            make_env("calc", 0),
            Err(EnvError::InvalidConfig { .. })
        ));
        assert_eq!(
            make_env("search-qa", 4).err().unwrap().to_string(),
            "invalid search-qa config: difficulty = 4, expected an integer in 1..=3; fix the `difficulty` key"
        );
        let err = make_env("maze", 2).err().unwrap();
        assert_eq!(
            err.to_string(),
            "unknown environment `maze`; known environments: calc, search-qa, household, shop, sokoban, solver-verifier, search-team, external, dataset, agent"
        );
        assert!(matches!(
            make_env("external", 1),
            Err(EnvError::InvalidConfig { field: "url", .. })
        ));
    }
}
