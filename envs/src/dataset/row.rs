//! One dataset row in verl's layout, parsed and checked:
//!
//! ```json
//! {"data_source": "openai/gsm8k",
//!  "prompt": [{"role": "system", "content": "…"}, {"role": "user", "content": "…"}],
//!  "reward_model": {"style": "rule", "ground_truth": "72"},
//!  "extra_info": {"split": "train", "index": 0, "tools": ["calculator"], "documents": ["…"]}}
//! ```
//!
//! The prompt may also be a plain string (one user message), and the two keys that hold the
//! prompt and the answer are configurable dotted paths (`env.dataset.prompt_key`, default `prompt`;
//! `env.dataset.answer_key`, default `reward_model.ground_truth`), so OpenRLHF-style JSONL
//! (`{"input": "…", "label": "…"}`) reads with `prompt_key = "input"`, `answer_key = "label"`.
//!
//! Invariants:
//! - DR-1 A parsed row has at least one message, its last message is the user's, every role is
//!   `system`, `user`, `assistant` or `tool` (a tool response of an earlier turn, rendered by
//!   the chat template), and every content is a non-empty string.
//! - DR-2 A parsed row has at least one non-empty ground truth (a string, a number, or a list of
//!   them: any one of them answers the row).
//! - DR-3 Every error names the file, the 1-based row and the field (a dotted path).
//! - DR-4 The oracle's answer to a row (its first ground truth as the verifier expects answers
//!   written, VF-4: `#### 72` under verl's `gsm8k`) scores 1 under its verifier (the oracle
//!   solves every row); a row where it does not is refused, since no answer could ever be
//!   rewarded (verl's gsm8k scorer never matches a ground truth `1,000`).
//! - DR-5 Tools are `calculator` (alias `calc`) and `search`; `search` needs at least one
//!   document in `extra_info.documents`.
//! - DR-6 verl's tool rows (`extra_info.tools_kwargs`, written by verl's
//!   `gsm8k_multiturn_w_tool.py`) get the function tools they name that keel has
//!   ([`super::functions`]: `calc_gsm8k_reward`, whose `create_kwargs.ground_truth` must be a
//!   string); a tool keel does not have, `need_tools_kwargs = true` with no tool, and an
//!   `interaction_kwargs.name` (a verl interaction, `multi_turn.interaction_config_path`) are
//!   refused, naming the field and what keel runs. `interaction_kwargs` without a `name` (verl's
//!   tool rows carry `{query, ground_truth}` there) is ignored, as verl's tool agent loop does
//!   when no interaction is configured; `execute_kwargs`, `calc_reward_kwargs` and
//!   `release_kwargs` are ignored as verl's agent loop ignores them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::functions::{FunctionTool, GSM8K_REWARD};
use crate::error::EnvError;
use crate::verify::Verifier;

/// One chat message of a prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text.
    pub content: String,
    /// An assistant message's function calls, OpenAI-shaped (`{"type": "function", "function":
    /// {"name", "arguments"}}`, the arguments a JSON object), rendered by the chat template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
}

/// A built-in tool a row may use (DR-5): the agentic episode's actions besides the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tool {
    /// `calc A OP B`: the calculator of the built-in `calc` env.
    Calculator,
    /// `search WORDS`: BM25 over the row's `extra_info.documents`, as in `search-qa`.
    Search,
}

impl Tool {
    fn parse(name: &str) -> Option<Tool> {
        match name {
            "calculator" | "calc" => Some(Tool::Calculator),
            "search" => Some(Tool::Search),
            _ => None,
        }
    }

    /// The action word that calls it.
    pub fn word(self) -> &'static str {
        match self {
            Tool::Calculator => "calc",
            Tool::Search => "search",
        }
    }
}

/// Where a row's fields are and how they are scored.
#[derive(Clone, Debug, PartialEq)]
pub struct RowSchema {
    /// Dotted path of the prompt (`prompt`).
    pub prompt_key: String,
    /// Dotted path of the ground truth (`reward_model.ground_truth`).
    pub answer_key: String,
    /// The configured verifier; `None` chooses by `data_source` (VF-2).
    pub verifier: Option<Verifier>,
    /// Whether a reward service scores answers: the ground truth may then be any JSON value
    /// (test cases, a rubric) and DR-4 does not apply.
    pub own_reward: bool,
}

impl Default for RowSchema {
    fn default() -> Self {
        RowSchema {
            prompt_key: "prompt".into(),
            answer_key: "reward_model.ground_truth".into(),
            verifier: None,
            own_reward: false,
        }
    }
}

/// A checked row (DR-1..DR-5).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The prompt's messages; the last is the user's (DR-1).
    pub messages: Vec<PromptMessage>,
    /// verl's `data_source` (empty when absent): the task type and the verifier's key.
    pub data_source: String,
    /// Accepted answers (DR-2).
    pub ground_truths: Vec<String>,
    /// The ground truth as the row holds it (what a reward service receives).
    pub ground_truth: Value,
    /// How answers are scored.
    pub verifier: Verifier,
    /// The oracle's answer: the first ground truth written for the verifier (VF-4, DR-4).
    pub oracle: String,
    /// Tools of an agentic row (empty: single-turn).
    pub tools: Vec<Tool>,
    /// verl function tools of a `tools_kwargs` row (DR-6; empty: none).
    pub functions: Vec<FunctionTool>,
    /// The search tool's corpus.
    pub documents: Vec<String>,
    /// `extra_info` as given (`null` when absent); sent to a reward service.
    pub extra_info: Value,
}

/// The value at a dotted `path` of `value`.
fn at<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(value, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

struct RowError<'a> {
    file: &'a str,
    row: usize,
}

impl RowError<'_> {
    fn at(&self, field: &str, reason: impl Into<String>) -> EnvError {
        EnvError::Dataset {
            file: self.file.to_string(),
            row: self.row,
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

impl Row {
    /// Parses row `number` (1-based) of `file` (DR-1..DR-5).
    pub fn parse(
        value: &Value,
        schema: &RowSchema,
        file: &str,
        number: usize,
    ) -> Result<Row, EnvError> {
        let err = RowError { file, row: number };
        if !value.is_object() {
            return Err(err.at("", "a row must be a JSON object"));
        }
        let messages = parse_prompt(value, &schema.prompt_key, &err)?;
        let data_source = match at(value, "data_source") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(err.at("data_source", format!("must be a string, got {other}")))
            }
        };
        let ground_truth = at(value, &schema.answer_key)
            .cloned()
            .unwrap_or(Value::Null);
        let ground_truths = match parse_answers(value, &schema.answer_key, &err) {
            Err(_) if schema.own_reward && !ground_truth.is_null() => {
                vec![ground_truth.to_string()]
            }
            other => other?,
        };
        let extra_info = at(value, "extra_info").cloned().unwrap_or(Value::Null);
        let tools = parse_tools(value, &err)?;
        let functions = parse_functions(value, &err)?;
        let documents = match at(value, "extra_info.documents") {
            None => Vec::new(),
            Some(v) => string_list(v)
                .ok_or_else(|| err.at("extra_info.documents", "must be a list of strings"))?,
        };
        if tools.contains(&Tool::Search) && documents.iter().all(|d| d.trim().is_empty()) {
            return Err(err.at(
                "extra_info.documents",
                "a row with the search tool needs at least one non-empty document to search",
            ));
        }
        let verifier = schema
            .verifier
            .unwrap_or_else(|| Verifier::for_data_source(&data_source));
        let oracle = verifier.oracle_answer(&ground_truths[0]);
        let row = Row {
            messages,
            data_source,
            ground_truths,
            ground_truth,
            verifier,
            oracle,
            tools,
            functions,
            documents,
            extra_info,
        };
        if !schema.own_reward && row.score(&row.oracle) < 1.0 {
            return Err(err.at(
                &schema.answer_key,
                format!(
                    "the ground truth {:?} does not pass its own `{}` verifier (answered {:?}), so no answer could be rewarded; set env.dataset.verifier or fix the row",
                    row.ground_truths[0], row.verifier, row.oracle
                ),
            ));
        }
        Ok(row)
    }

    /// The user's prompt: the last message's text.
    pub fn prompt(&self) -> &str {
        self.messages.last().map_or("", |m| m.content.as_str())
    }

    /// The messages before the prompt (a system prompt, few-shot turns).
    pub fn preamble(&self) -> &[PromptMessage] {
        &self.messages[..self.messages.len().saturating_sub(1)]
    }

    /// 1.0 when `answer` matches any ground truth under the row's verifier, else 0.0.
    pub fn score(&self, answer: &str) -> f32 {
        self.ground_truths
            .iter()
            .map(|truth| self.verifier.score(answer, truth))
            .fold(0.0, f32::max)
    }

    /// Whether the episode is multi-turn (word tools or verl function tools).
    pub fn agentic(&self) -> bool {
        !self.tools.is_empty() || !self.functions.is_empty()
    }

    /// The OpenAI function schemas of the row's verl tools (rendered by the chat template).
    pub fn tool_schemas(&self) -> Vec<Value> {
        self.functions.iter().map(FunctionTool::schema).collect()
    }

    /// The text of every field the model reads or may write, for a word-level vocabulary
    /// (with the oracle's tool calls and their answers).
    pub fn texts(&self) -> impl Iterator<Item = String> + '_ {
        let calls = self.functions.iter().flat_map(|f| {
            let call = f.oracle_call();
            let answer = super::functions::parse_calls(&call)
                .first()
                .map(|c| super::functions::execute(&self.functions, c).text)
                .unwrap_or_default();
            [call, answer]
        });
        self.messages
            .iter()
            .map(|m| m.content.as_str())
            .chain(self.ground_truths.iter().map(String::as_str))
            .chain([self.oracle.as_str()])
            .chain(self.documents.iter().map(String::as_str))
            .map(str::to_string)
            .chain(calls)
    }
}

fn parse_prompt(
    value: &Value,
    key: &str,
    err: &RowError<'_>,
) -> Result<Vec<PromptMessage>, EnvError> {
    let messages = match at(value, key) {
        None => {
            return Err(err.at(
                key,
                "missing (the prompt: a list of {role, content} messages or a string)",
            ))
        }
        Some(Value::String(text)) => vec![PromptMessage {
            tool_calls: Vec::new(),
            role: "user".into(),
            content: text.clone(),
        }],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let field = format!("{key}.{i}");
                let role = m
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| err.at(&format!("{field}.role"), "missing or not a string"))?;
                if !["system", "user", "assistant", "tool"].contains(&role) {
                    return Err(err.at(
                        &format!("{field}.role"),
                        format!("must be system, user, assistant or tool, got {role:?}"),
                    ));
                }
                let content = m.get("content").and_then(Value::as_str).ok_or_else(|| {
                    err.at(&format!("{field}.content"), "missing or not a string")
                })?;
                Ok(PromptMessage {
                    tool_calls: Vec::new(),
                    role: role.into(),
                    content: content.into(),
                })
            })
            .collect::<Result<Vec<_>, EnvError>>()?,
        Some(other) => {
            return Err(err.at(
                key,
                format!(
                    "must be a list of {{role, content}} messages or a string, got {}",
                    kind(other)
                ),
            ))
        }
    };
    if let Some(i) = messages.iter().position(|m| m.content.trim().is_empty()) {
        return Err(err.at(&format!("{key}.{i}.content"), "is empty"));
    }
    match messages.last() {
        None => Err(err.at(key, "has no messages")),
        Some(m) if m.role != "user" => Err(err.at(
            key,
            format!(
                "the last message must be the user's (the model answers it), got {:?}",
                m.role
            ),
        )),
        Some(_) => Ok(messages),
    }
}

fn parse_answers(value: &Value, key: &str, err: &RowError<'_>) -> Result<Vec<String>, EnvError> {
    let one = |v: &Value| match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let answers = match at(value, key) {
        None => return Err(err.at(key, "missing (the ground truth the verifier compares with)")),
        Some(Value::Array(items)) => items.iter().map(one).collect::<Option<Vec<_>>>(),
        Some(v) => one(v).map(|a| vec![a]),
    };
    match answers {
        Some(a) if !a.is_empty() => Ok(a),
        _ => Err(err.at(
            key,
            "must be a non-empty string, a number, or a non-empty list of them",
        )),
    }
}

fn parse_tools(value: &Value, err: &RowError<'_>) -> Result<Vec<Tool>, EnvError> {
    let (field, list) = match (at(value, "tools"), at(value, "extra_info.tools")) {
        (Some(v), _) => ("tools", v),
        (None, Some(v)) => ("extra_info.tools", v),
        (None, None) => return Ok(Vec::new()),
    };
    let names = string_list(list)
        .ok_or_else(|| err.at(field, "must be a list of tool names (calculator, search)"))?;
    let mut tools = Vec::new();
    for name in names {
        let tool = Tool::parse(&name).ok_or_else(|| {
            err.at(
                field,
                format!("unknown tool {name:?}; the built-in tools are calculator and search"),
            )
        })?;
        if !tools.contains(&tool) {
            tools.push(tool);
        }
    }
    Ok(tools)
}

/// What keel runs of verl's tools, said when a row names another (DR-6).
const KEEL_FUNCTIONS: &str = "keel runs verl's calc_gsm8k_reward (Gsm8kTool) as a function tool, and calculator and search as word tools in extra_info.tools";

/// verl's `extra_info.tools_kwargs` and `interaction_kwargs` (DR-6).
fn parse_functions(value: &Value, err: &RowError<'_>) -> Result<Vec<FunctionTool>, EnvError> {
    if let Some(name) = at(value, "extra_info.interaction_kwargs.name") {
        return Err(err.at(
            "extra_info.interaction_kwargs.name",
            format!(
                "names the verl interaction {name}, which keel does not have (verl's multi_turn.interaction_config_path); remove interaction_kwargs.name to train the row without one; {KEEL_FUNCTIONS}"
            ),
        ));
    }
    let field = "extra_info.tools_kwargs";
    let mut functions = Vec::new();
    match at(value, field) {
        None => {}
        Some(Value::Object(tools)) => {
            // Parquet gives every row the struct's every tool; absent ones are null.
            for (name, kwargs) in tools.iter().filter(|(_, v)| !v.is_null()) {
                functions.push(parse_function(
                    name,
                    kwargs,
                    &format!("{field}.{name}"),
                    err,
                )?);
            }
        }
        Some(other) => {
            return Err(err.at(
                field,
                format!(
                    "must be an object of tool name to its kwargs, got {}",
                    kind(other)
                ),
            ))
        }
    }
    if functions.is_empty() && at(value, "extra_info.need_tools_kwargs") == Some(&Value::Bool(true))
    {
        return Err(err.at(
            "extra_info.need_tools_kwargs",
            format!("is true but extra_info.tools_kwargs names no tool; {KEEL_FUNCTIONS}"),
        ));
    }
    Ok(functions)
}

fn parse_function(
    name: &str,
    kwargs: &Value,
    field: &str,
    err: &RowError<'_>,
) -> Result<FunctionTool, EnvError> {
    if name != GSM8K_REWARD {
        return Err(err.at(
            field,
            format!("unknown verl tool {name:?}; {KEEL_FUNCTIONS}"),
        ));
    }
    let truth_field = format!("{field}.create_kwargs.ground_truth");
    match at(kwargs, "create_kwargs.ground_truth") {
        Some(Value::String(truth)) if !truth.trim().is_empty() => Ok(FunctionTool::Gsm8kReward {
            ground_truth: truth.clone(),
        }),
        other => Err(err.at(
            &truth_field,
            format!(
                "must be a non-empty string (verl's Gsm8kTool compares the parsed answer with it as a string), got {}",
                other.map_or("nothing", kind)
            ),
        )),
    }
}

fn string_list(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Row, EnvError> {
        Row::parse(&v, &RowSchema::default(), "train.jsonl", 3)
    }

    #[test]
    fn dr1_dr2_verl_row_and_string_prompt() {
        let row = parse(json!({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "What is 6 times 12?"}],
            "reward_model": {"style": "rule", "ground_truth": 72},
            "extra_info": {"index": 4}
        }))
        .unwrap();
        assert_eq!(row.prompt(), "What is 6 times 12?");
        assert_eq!(row.preamble().len(), 1);
        assert_eq!(row.verifier, Verifier::Gsm8k);
        assert_eq!(row.ground_truths, vec!["72"]);
        assert_eq!(row.oracle, "#### 72");
        assert_eq!(row.score("so #### 72"), 1.0);
        assert_eq!(
            row.score("\\boxed{72}"),
            0.0,
            "verl's gsm8k reads `#### N` only"
        );
        let row = parse(json!({"prompt": "Capital of France?",
                               "reward_model": {"ground_truth": ["Paris", "paris, france"]}}))
        .unwrap();
        assert_eq!(row.messages[0].role, "user");
        assert_eq!(row.verifier, Verifier::Exact);
        assert_eq!(row.score("Paris, France"), 1.0);
    }

    #[test]
    fn dr3_errors_name_file_row_and_field() {
        let cases = [
            (json!({"reward_model": {"ground_truth": "1"}}), "dataset train.jsonl, row 3, field `prompt`: missing (the prompt: a list of {role, content} messages or a string)"),
            (json!({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "reward_model": {"ground_truth": "1"}}), "dataset train.jsonl, row 3, field `prompt`: the last message must be the user's (the model answers it), got \"assistant\""),
            (json!({"prompt": [{"role": "robot", "content": "hi"}], "reward_model": {"ground_truth": "1"}}), "dataset train.jsonl, row 3, field `prompt.0.role`: must be system, user, assistant or tool, got \"robot\""),
            (json!({"prompt": "hi", "reward_model": {"ground_truth": ""}}), "dataset train.jsonl, row 3, field `reward_model.ground_truth`: must be a non-empty string, a number, or a non-empty list of them"),
            (json!({"prompt": "hi", "reward_model": {"ground_truth": "1"}, "tools": ["browser"]}), "dataset train.jsonl, row 3, field `tools`: unknown tool \"browser\"; the built-in tools are calculator and search"),
            (json!({"prompt": "hi", "reward_model": {"ground_truth": "1"}, "tools": ["search"]}), "dataset train.jsonl, row 3, field `extra_info.documents`: a row with the search tool needs at least one non-empty document to search"),
            (json!({"prompt": 5, "reward_model": {"ground_truth": "1"}}), "dataset train.jsonl, row 3, field `prompt`: must be a list of {role, content} messages or a string, got a number"),
        ];
        for (row, want) in cases {
            assert_eq!(parse(row).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn dr4_a_truth_its_verifier_rejects_is_refused() {
        let schema = RowSchema {
            verifier: Some(Verifier::Choice),
            ..RowSchema::default()
        };
        let v = json!({"prompt": "pick", "reward_model": {"ground_truth": "B"}});
        assert!(Row::parse(&v, &schema, "f", 1).is_ok());
        let schema = RowSchema {
            verifier: Some(Verifier::Numeric),
            ..RowSchema::default()
        };
        // A non-number truth falls back to exact under `numeric` (VF) and passes.
        assert!(Row::parse(&v, &schema, "f", 1).is_ok());
        // verl's gsm8k never matches a truth with a thousands comma: no answer could pass.
        let v = json!({"data_source": "openai/gsm8k", "prompt": "how many",
                       "reward_model": {"ground_truth": "1,000"}});
        assert_eq!(
            Row::parse(&v, &RowSchema::default(), "f", 2).unwrap_err().to_string(),
            "dataset f, row 2, field `reward_model.ground_truth`: the ground truth \"1,000\" does not pass its own `gsm8k` verifier (answered \"#### 1,000\"), so no answer could be rewarded; set env.dataset.verifier or fix the row"
        );
    }

    #[test]
    fn dr5_tools_and_custom_keys() {
        let schema = RowSchema {
            prompt_key: "input".into(),
            answer_key: "label".into(),
            ..RowSchema::default()
        };
        let v = json!({"input": "who", "label": "bado",
                       "extra_info": {"tools": ["calc", "search", "calculator"], "documents": ["bado born in gelu"]}});
        let row = Row::parse(&v, &schema, "f", 1).unwrap();
        assert_eq!(row.tools, vec![Tool::Calculator, Tool::Search]);
        assert_eq!(row.documents.len(), 1);
        assert!(row.texts().any(|t| t == "bado born in gelu"));
    }
}
