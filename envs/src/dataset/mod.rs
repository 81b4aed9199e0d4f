//! `dataset`: an environment whose tasks are the rows of a prompt dataset in verl's layout
//! (JSONL or Parquet; see [`row`] for the row format and [`file`] for the formats), scored by
//! a built-in verifier ([`crate::verify`]).
//!
//! A row without tools is a single-turn episode: the prompt is the row's last user message (the
//! messages before it are the [`Env::preamble`]), the agent's one response is the answer, and
//! the reward is 1 when the verifier accepts it. A row naming tools is a multi-turn episode of
//! up to `max_turns` turns: a response starting with `calc` (`calc A OP B`, the calculator of
//! the built-in `calc` env) or `search` (BM25 over the row's documents, as in `search-qa`)
//! calls that tool and the episode goes on with its result; any other response is the final
//! answer (a leading `answer` word is dropped for the verifiers, DS-7). A verl tool row
//! (`extra_info.tools_kwargs`, DR-6) is a multi-turn episode with verl's function tools
//! ([`functions`]): the template shows their schemas ([`Env::tools`]), a response holding a
//! Hermes `<tool_call>` is answered by a `tool` message, and a response without one is the
//! final answer (verl's `ToolAgentLoop`).
//!
//! Training task `i` is row `RowOrder::row(i)` of the train file, held-out task `i` is row
//! `i mod n` of the eval file (see [`crate::row_order`]): the task index a seed encodes
//! ([`crate::task_index`]) is the dataset position, so checkpoints' data frontier records
//! dataset positions exactly.
//!
//! Invariants (beside EN-1..EN-10 of `env`):
//! - DS-1 The files are read and checked once per [`Dataset::load`]; every env instance of one
//!   builder shares the rows (no per-episode I/O).
//! - DS-2 `max_turns` is 1 when no row names a tool (word or function tool), else the
//!   configured `max_turns`.
//! - DS-3 The oracle answers a row's [`Row::oracle`] (its first ground truth written for the
//!   verifier, VF-4), which its verifier accepts (DR-4).
//! - DS-4 The vocabulary is the env's action and observation words, then every word of every
//!   row's messages, ground truths, oracle answers and documents in file order (the built-in
//!   word-level model can encode every row); with a calculator row, also `calc`'s numbers.
//! - DS-5 With a reward service (`reward.url`), the final answer of a model's response
//!   ([`Env::try_step_response`]) is scored by the service ([`reward`], RC-1..3), which receives
//!   the raw response unchanged — verl's `solution_str`: untrimmed, reasoning and a leading
//!   `answer` word included. Its reward is passed through: any finite float (verl's `math_dapo`
//!   ±1, format penalties; the one exception to EN-5's `[0, 1]`; `success()` is a reward ≥ 1).
//!   Rows are not held to DR-4. A service failure or a non-finite reward fails the episode
//!   (`try_step_response` errs), it never becomes a reward.
//! - DS-6 Keel's own actions ([`Env::step`] / [`Env::try_step`]: the oracle, SFT demonstrations
//!   and their planted mistakes, the random policy, `keel env play`) are scored by the row's
//!   verifier and never sent to the service; the oracle's answer scores 1 (DS-3) even on a row
//!   not held to DR-4.
//! - DS-7 Word tool calls and verifiers read the response's visible text (AX-1: a leading
//!   reasoning block dropped, trimmed), and verifiers read it without a leading `answer` word.
//! - DS-8 On a verl tool row, function calls are parsed from the raw response (verl's Hermes
//!   parser reads the whole decoded turn, reasoning included; VT-1); the turn's observation
//!   has role `tool` and reward 0 (VT-4). A response without a parsed call, or any response on
//!   the row's last allowed turn (verl's `max_assistant_turns` ends the loop before parsing),
//!   is the final answer, scored as DS-5/DS-6 score a single-turn answer: the final response
//!   alone, where verl scores the decoded text of every turn after the prompt (the same
//!   verdict when the final turn holds the last `#### N`). The oracle first calls
//!   `calc_gsm8k_reward` with the tool's ground truth, then answers (DS-3).

pub mod file;
pub mod functions;
pub mod reward;
pub mod row;
mod tools;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::lexicon::WordList;
use crate::row_order::RowOrder;
use crate::snapshot::EnvSnapshot;
use crate::split::{task_index, Split};
use crate::verify::Verifier;
pub use reward::{RewardClient, RewardConfig};
pub use row::{PromptMessage, Row, RowSchema, Tool};

/// Where a dataset is and how its rows are read and ordered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatasetConfig {
    /// The training rows (a local `.jsonl` or `.parquet` path).
    pub train_file: PathBuf,
    /// The held-out rows.
    pub eval_file: PathBuf,
    /// `auto` (by `data_source`, VF-2/3), `exact`, `numeric`, `choice`, `gsm8k` or `math`.
    pub verifier: String,
    /// Dotted path of the prompt in a row.
    pub prompt_key: String,
    /// Dotted path of the ground truth in a row.
    pub answer_key: String,
    /// Whether each epoch visits the training rows in a fresh seeded order.
    pub shuffle: bool,
    /// The shuffle seed.
    pub shuffle_seed: u64,
    /// Turns of a row with tools (DS-2).
    pub max_turns: usize,
    /// A reward service that scores answers instead of the verifiers (DS-5).
    pub reward: RewardConfig,
}

impl Default for DatasetConfig {
    fn default() -> Self {
        let schema = RowSchema::default();
        DatasetConfig {
            train_file: PathBuf::new(),
            eval_file: PathBuf::new(),
            verifier: "auto".into(),
            prompt_key: schema.prompt_key,
            answer_key: schema.answer_key,
            shuffle: true,
            shuffle_seed: 0,
            max_turns: 4,
            reward: RewardConfig::default(),
        }
    }
}

impl DatasetConfig {
    /// Checks the keys without reading the files.
    pub fn validate(&self) -> Result<(), EnvError> {
        let bad = |field, value: String, expected| {
            Err(EnvError::InvalidConfig {
                env: "dataset",
                field,
                value,
                expected,
            })
        };
        if self.train_file.as_os_str().is_empty() {
            return bad(
                "train_file",
                "(none)".into(),
                "a .jsonl or .parquet file of training rows",
            );
        }
        if self.eval_file.as_os_str().is_empty() {
            return bad(
                "eval_file",
                "(none)".into(),
                "a .jsonl or .parquet file of held-out rows",
            );
        }
        file::Format::of(&self.train_file)?;
        file::Format::of(&self.eval_file)?;
        if self.verifier != "auto" && self.verifier.parse::<Verifier>().is_err() {
            return bad(
                "verifier",
                self.verifier.clone(),
                "auto, exact, numeric, choice, gsm8k or math",
            );
        }
        if self.prompt_key.is_empty() {
            return bad(
                "prompt_key",
                "(empty)".into(),
                "a dotted path such as `prompt`",
            );
        }
        if self.answer_key.is_empty() {
            return bad(
                "answer_key",
                "(empty)".into(),
                "a dotted path such as `reward_model.ground_truth`",
            );
        }
        if !(2..=64).contains(&self.max_turns) {
            return bad(
                "max_turns",
                self.max_turns.to_string(),
                "an integer in 2..=64",
            );
        }
        self.reward.validate()
    }

    /// How rows are parsed.
    pub fn schema(&self) -> RowSchema {
        RowSchema {
            prompt_key: self.prompt_key.clone(),
            answer_key: self.answer_key.clone(),
            verifier: self.verifier.parse().ok(),
            own_reward: self.reward.enabled(),
        }
    }
}

/// Reads and checks every row of `path` (DR-1..DR-5).
pub fn read_rows(path: &Path, schema: &RowSchema) -> Result<Vec<Row>, EnvError> {
    let raw = file::read(path)?;
    let name = path.display().to_string();
    raw.rows
        .iter()
        .map(|r| Row::parse(&r.value, schema, &name, r.number))
        .collect()
}

/// The loaded rows of a dataset, shared by its env instances (DS-1).
#[derive(Debug)]
pub struct Dataset {
    train: Vec<Row>,
    eval: Vec<Row>,
    order: Mutex<RowOrder>,
    max_turns: usize,
    vocabulary: Vec<String>,
}

impl Dataset {
    /// Reads and checks both files (DS-1).
    pub fn load(cfg: &DatasetConfig) -> Result<Dataset, EnvError> {
        cfg.validate()?;
        let schema = cfg.schema();
        let train = read_rows(&cfg.train_file, &schema)?;
        let eval = read_rows(&cfg.eval_file, &schema)?;
        let order =
            RowOrder::new(train.len() as u64, cfg.shuffle_seed, cfg.shuffle).ok_or_else(|| {
                file::file_error(
                    &cfg.train_file,
                    "holds more rows than keel can order (2^32 - 1)",
                )
            })?;
        let agentic = train.iter().chain(&eval).any(Row::agentic);
        let max_turns = if agentic { cfg.max_turns } else { 1 };
        let vocabulary = vocabulary(&train, &eval);
        Ok(Dataset {
            train,
            eval,
            order: Mutex::new(order),
            max_turns,
            vocabulary,
        })
    }

    /// Training rows.
    pub fn train_rows(&self) -> &[Row] {
        &self.train
    }

    /// Held-out rows.
    pub fn eval_rows(&self) -> &[Row] {
        &self.eval
    }

    /// The env's words (DS-4).
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// The training row of task `index`: one order shared by every env instance, so an
    /// epoch's permutation is computed once, not once per episode.
    fn train_row(&self, index: u64) -> usize {
        // A panic cannot leave a `RowOrder` half-updated (its cache is replaced whole).
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        order.row(index) as usize
    }

    fn row(&self, split: Split, index: usize) -> &Row {
        match split {
            Split::Train => &self.train[index],
            Split::Eval => &self.eval[index],
        }
    }
}

fn vocabulary(train: &[Row], eval: &[Row]) -> Vec<String> {
    let mut words = WordList::default();
    words.extend_text([tools::KEYWORDS]);
    let rows = || train.iter().chain(eval);
    if rows().any(|r| r.tools.contains(&Tool::Calculator)) {
        words.extend(crate::calc::vocabulary());
    }
    for r in rows() {
        words.extend_text(r.texts());
    }
    words.into_vec()
}

/// The state of one episode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct State {
    split: Split,
    row: usize,
    turns: usize,
    done: bool,
    solved: bool,
    /// Function tool calls made this episode (the oracle calls once, DS-8).
    #[serde(default)]
    calls: usize,
}

/// The `dataset` env: one episode per row. Until the first `reset` it is terminal (EN-4).
pub struct DatasetEnv {
    data: Arc<Dataset>,
    reward: Option<Arc<RewardClient>>,
    state: State,
}

impl DatasetEnv {
    /// An env over loaded rows, its answers scored by the rows' verifiers or by `reward`.
    pub fn new(data: Arc<Dataset>, reward: Option<Arc<RewardClient>>) -> Self {
        DatasetEnv {
            data,
            reward,
            state: State {
                split: Split::Train,
                row: 0,
                turns: 0,
                done: true,
                solved: false,
                calls: 0,
            },
        }
    }

    fn row(&self) -> &Row {
        self.data.row(self.state.split, self.state.row)
    }

    /// The row of the current task (the first row before any `reset`).
    pub fn current_row(&self) -> &Row {
        self.row()
    }

    /// The reward of a final raw response to the current row, as a model's last turn is
    /// scored: the reward service's, else the row's verifier's on its visible answer.
    pub fn score_final(&self, response: &str) -> Result<f32, EnvError> {
        let visible = crate::action::visible(response);
        self.final_reward(tools::answer_text(visible), Some(response))
    }

    /// The reward of a final answer: the service's for a model's raw `response` (DS-5), else
    /// the row's verifier's (DS-6).
    fn final_reward(&self, answer: &str, response: Option<&str>) -> Result<f32, EnvError> {
        let row = self.row();
        match (&self.reward, response) {
            (Some(client), Some(raw)) => client.score(
                &row.data_source,
                &row.messages,
                raw,
                &row.ground_truth,
                &row.extra_info,
            ),
            (Some(_), None) if answer == row.oracle => Ok(1.0),
            _ => Ok(row.score(answer)),
        }
    }

    /// One turn on the visible `action`; `response` is the raw text of a model's response.
    fn advance(&mut self, action: &str, response: Option<&str>) -> Result<StepOutcome, EnvError> {
        if self.state.done {
            return Ok(outcome_of(self, tools::INVALID.into(), 0.0, true, true));
        }
        let mut role = "";
        let called = match self.function_call(response.unwrap_or(action)) {
            Some(answered) => {
                role = "tool";
                Some(answered)
            }
            None if self.final_turn_of_function_row() => None,
            None => tools::call(self.row(), action),
        };
        let (observation, reward, invalid) = match called {
            Some(tools::Called { observation, valid }) => (observation, 0.0, !valid),
            None => {
                let reward = self.final_reward(tools::answer_text(action), response)?;
                self.state.done = true;
                self.state.solved = reward >= 1.0;
                (String::new(), reward, false)
            }
        };
        self.state.turns += 1;
        if self.state.turns >= self.turn_limit() {
            self.state.done = true;
        }
        let mut out = outcome_of(self, observation, reward, self.state.done, invalid);
        if role == "tool" {
            // DS-8: a function's answer is a `tool` message (Qwen's `<tool_response>`).
            out.messages = vec![PromptMessage {
                role: role.into(),
                content: out.observation.clone(),
                tool_calls: Vec::new(),
            }];
        }
        Ok(out)
    }

    /// Whether this turn of a verl tool row is its last allowed one: its response is the final
    /// answer whatever it holds (DS-8).
    fn final_turn_of_function_row(&self) -> bool {
        !self.row().functions.is_empty() && self.state.turns + 1 >= self.turn_limit()
    }

    /// The answer to the first function call of `raw` on a verl tool row (VT-2, DS-8); `None`
    /// when the row has no function tools, the response holds no call, or the turn is the last.
    fn function_call(&mut self, raw: &str) -> Option<tools::Called> {
        if self.row().functions.is_empty() || self.final_turn_of_function_row() {
            return None;
        }
        let call = functions::parse_calls(raw).into_iter().next()?;
        let answered = functions::execute(&self.row().functions, &call);
        self.state.calls += 1;
        Some(tools::Called {
            observation: answered.text,
            valid: answered.ran,
        })
    }

    fn turn_limit(&self) -> usize {
        if !self.row().agentic() {
            1
        } else {
            self.data.max_turns
        }
    }
}

impl Env for DatasetEnv {
    fn name(&self) -> &str {
        "dataset"
    }

    fn reset(&mut self, task_seed: u64) -> String {
        let (split, row) = match task_index(task_seed) {
            (Split::Train, i) => (Split::Train, self.data.train_row(i)),
            (Split::Eval, i) => (Split::Eval, (i % self.data.eval.len() as u64) as usize),
        };
        self.state = State {
            split,
            row,
            turns: 0,
            done: false,
            solved: false,
            calls: 0,
        };
        self.row().prompt().to_string()
    }

    fn preamble(&self) -> Vec<PromptMessage> {
        self.row().preamble().to_vec()
    }

    fn tools(&self) -> Vec<serde_json::Value> {
        self.row().tool_schemas()
    }

    // keel calls `try_step` / `try_step_response` (env shards, demonstrations, `keel env`);
    // with a reward service `step_response` names the failure if another caller meets one (as
    // `ExternalEnv` does).
    fn step(&mut self, action: &str) -> StepOutcome {
        self.try_step(action).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Keel's own action, scored by the row's verifier (DS-6); never fails.
    fn try_step(&mut self, action: &str) -> Result<StepOutcome, EnvError> {
        self.advance(crate::action::visible(action), None)
    }

    fn step_response(&mut self, response: &str) -> StepOutcome {
        self.try_step_response(response)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A model's response: the visible text for tools and verifiers, the raw text for the
    /// reward service (DS-5, DS-7).
    fn try_step_response(&mut self, response: &str) -> Result<StepOutcome, EnvError> {
        self.advance(crate::action::visible(response), Some(response))
    }

    /// The row's answer; on a verl tool row, first a call of its tool with the tool's
    /// ground truth (DS-8), so demonstrations show the call format.
    fn oracle_action(&self) -> String {
        let row = self.row();
        match row.functions.first() {
            Some(f) if self.state.calls == 0 && self.state.turns + 1 < self.turn_limit() => {
                f.oracle_call()
            }
            _ => row.oracle.clone(),
        }
    }

    fn max_turns(&self) -> usize {
        self.data.max_turns
    }

    fn success(&self) -> bool {
        self.state.solved
    }

    fn vocabulary(&self) -> Vec<String> {
        self.data.vocabulary.clone()
    }

    fn admissible_actions(&self) -> Vec<String> {
        if self.state.done {
            Vec::new()
        } else {
            vec![self.oracle_action()]
        }
    }

    /// The row's `data_source` (or `dataset` when it has none).
    fn task_type(&self) -> String {
        match self.row().data_source.as_str() {
            "" => "dataset".into(),
            source => source.into(),
        }
    }

    fn anchor_state(&self) -> String {
        let split = match self.state.split {
            Split::Train => "train",
            Split::Eval => "eval",
        };
        let calls = match self.state.calls {
            0 => String::new(),
            n => format!(" calls {n}"),
        };
        format!(
            "{split} row {} done {}{calls}",
            self.state.row, self.state.done
        )
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("dataset", &self.state)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        let state: State = snapshot.decode("dataset")?;
        let rows = match state.split {
            Split::Train => self.data.train.len(),
            Split::Eval => self.data.eval.len(),
        };
        if state.row >= rows {
            return Err(EnvError::Snapshot {
                env: "dataset".into(),
                reason: format!("row {} is past the {rows} rows of this dataset", state.row),
            });
        }
        self.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
