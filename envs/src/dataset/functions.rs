//! verl's function-calling tools for dataset rows: a row whose `extra_info.tools_kwargs` names
//! verl tools (verl's `examples/data_preprocess/gsm8k_multiturn_w_tool.py`) is a multi-turn
//! episode in which the model calls them in the Hermes format that verl's `ToolAgentLoop`
//! parses (`HermesToolParser`):
//!
//! ```text
//! <tool_call>
//! {"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}
//! </tool_call>
//! ```
//!
//! Each call is answered by a `tool` message (Qwen's template renders it as a
//! `<tool_response>` inside a user turn). The one tool keel has is `calc_gsm8k_reward`,
//! verl's `Gsm8kTool`; verl ships no calculator function tool (keel's word calculator stays
//! `extra_info.tools = ["calculator"]`).
//!
//! Invariants:
//! - VT-1 A response holds tool calls exactly when verl's Hermes parser finds one: it contains
//!   both `<tool_call>` and `</tool_call>`, and a `<tool_call>…</tool_call>` span (shortest,
//!   left to right) is a JSON object with a string `name` and an `arguments` member. Spans that
//!   are not are dropped (verl logs and skips them); a response with none is the final answer.
//! - VT-2 As verl's default `multi_turn.max_parallel_calls = 1`, only the first call of a
//!   response runs; its answer is one `tool` observation.
//! - VT-3 A call runs as verl's `ToolAgentLoop._call_tool` and `Gsm8kTool.execute`: a fresh tool
//!   instance per call (so its tool reward is 0.0 for a correct answer and -0.05 otherwise,
//!   verl's "not improved" penalty against a fresh 0.0); `answer` is `str()` of the argument
//!   (default `""`), prefixed `#### ` unless it starts so, scored by verl's gsm8k `flexible`
//!   method against the row's `create_kwargs.ground_truth`; the observation is verl's
//!   `Current parsed answer='72' reward=1.0` (Python `repr`s: `reward=0` when no number
//!   parses). An unknown tool name or non-object arguments answer verl's
//!   `Error when executing tool: …` text. Texts over verl's `max_tool_response_length = 256`
//!   characters are cut in the middle as verl's default `tool_response_truncate_side`.
//! - VT-4 Tool rewards never add to the episode's reward (verl records them in
//!   `extra_fields["tool_rewards"]` and no reward manager reads them); the turn's reward is 0.

use serde_json::{json, Value};

use crate::verify::verl::{gsm8k_extract, Gsm8kMethod};

/// verl's `Gsm8kTool` name.
pub const GSM8K_REWARD: &str = "calc_gsm8k_reward";
/// verl's default `multi_turn.max_tool_response_length` (VT-3).
const MAX_RESPONSE_CHARS: usize = 256;
const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";

/// A verl function tool a row may call (DR-6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FunctionTool {
    /// verl's `calc_gsm8k_reward` with the row's `create_kwargs.ground_truth`.
    Gsm8kReward {
        /// The answer the tool's scorer compares with (as a string, verl's `==`).
        ground_truth: String,
    },
}

impl FunctionTool {
    /// The tool's function name.
    pub fn name(&self) -> &'static str {
        match self {
            FunctionTool::Gsm8kReward { .. } => GSM8K_REWARD,
        }
    }

    /// The OpenAI function schema the chat template renders (verl's
    /// `examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml`).
    pub fn schema(&self) -> Value {
        match self {
            FunctionTool::Gsm8kReward { .. } => json!({
                "type": "function",
                "function": {
                    "name": GSM8K_REWARD,
                    "description": "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "answer": {
                                "type": "string",
                                "description": "The model's answer to the GSM8K math problem, must be a digits"
                            }
                        },
                        "required": ["answer"]
                    }
                }
            }),
        }
    }

    /// The call the oracle makes: the tool's own ground truth as the answer.
    pub fn oracle_call(&self) -> String {
        match self {
            FunctionTool::Gsm8kReward { ground_truth } => {
                call_text(GSM8K_REWARD, &json!({ "answer": ground_truth }))
            }
        }
    }
}

/// A call in the Hermes format as Qwen's template writes an assistant's `tool_calls`:
/// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` (JSON as Python's `json.dumps`).
pub fn call_text(name: &str, arguments: &Value) -> String {
    format!(
        "{CALL_START}\n{{\"name\": {}, \"arguments\": {}}}\n{CALL_END}",
        py_json(&Value::String(name.into())),
        py_json(arguments)
    )
}

/// `json.dumps(v, ensure_ascii=False)`: `, ` and `: ` separators.
fn py_json(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(py_json).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(fields) => {
            let inner: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}: {}", py_json(&Value::String(k.clone())), py_json(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionCall {
    /// The function name.
    pub name: String,
    /// The arguments as the model wrote them (any JSON value).
    pub arguments: Value,
}

/// The calls verl's `HermesToolParser` extracts from `text` (VT-1), in order.
pub fn parse_calls(text: &str) -> Vec<FunctionCall> {
    if !text.contains(CALL_START) || !text.contains(CALL_END) {
        return Vec::new();
    }
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(CALL_START) {
        let after = &rest[start + CALL_START.len()..];
        let Some(end) = after.find(CALL_END) else {
            break;
        };
        if let Some(call) = parse_call(&after[..end]) {
            calls.push(call);
        }
        rest = &after[end + CALL_END.len()..];
    }
    calls
}

fn parse_call(body: &str) -> Option<FunctionCall> {
    let value: Value = serde_json::from_str(body).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = value.get("arguments")?.clone();
    Some(FunctionCall { name, arguments })
}

/// What one call answered (VT-3).
#[derive(Clone, Debug, PartialEq)]
pub struct Answered {
    /// The `tool` message's text.
    pub text: String,
    /// verl's tool reward (computed, never added: VT-4).
    pub tool_reward: f32,
    /// Whether the tool ran (false: verl's `Error when executing tool` answer).
    pub ran: bool,
}

/// Runs `call` against the row's `tools` as verl's `_call_tool` does (VT-3).
pub fn execute(tools: &[FunctionTool], call: &FunctionCall) -> Answered {
    let Some(tool) = tools.iter().find(|t| t.name() == call.name) else {
        // verl: `self.tools[tool_name]` raises KeyError, whose str() is the key's repr.
        return error(&py_repr_str(&call.name));
    };
    let Value::Object(params) = &call.arguments else {
        return error(&format!(
            "'{}' object has no attribute 'get'",
            py_type(&call.arguments)
        ));
    };
    match tool {
        FunctionTool::Gsm8kReward { ground_truth } => {
            let answer = match params.get("answer") {
                None => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => py_str(other),
            };
            let response = match answer.starts_with("#### ") {
                true => answer.clone(),
                false => format!("#### {answer}"),
            };
            // verl's gsm8k.compute_score(method="flexible", format_score=0.0, score=1.0):
            // int 0 when nothing parses, else 1.0 or 0.0.
            let (reward, shown) = match gsm8k_extract(&response, Gsm8kMethod::Flexible) {
                None => (0.0, "0"),
                Some(parsed) if parsed == *ground_truth => (1.0, "1.0"),
                Some(_) => (0.0, "0.0"),
            };
            let tool_reward = if reward > 0.0 { 0.0 } else { -0.05 };
            Answered {
                text: truncate(&format!(
                    "Current parsed answer={} reward={shown}",
                    py_repr_str(&answer)
                )),
                tool_reward,
                ran: true,
            }
        }
    }
}

fn error(what: &str) -> Answered {
    Answered {
        text: truncate(&format!("Error when executing tool: {what}")),
        tool_reward: 0.0,
        ran: false,
    }
}

/// verl's middle truncation of a long tool response (VT-3), counted in characters.
fn truncate(text: &str) -> String {
    let n = text.chars().count();
    if n <= MAX_RESPONSE_CHARS {
        return text.to_string();
    }
    let half = MAX_RESPONSE_CHARS / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(n - half).collect();
    format!("{head}...(truncated)...{tail}")
}

/// Python's type name of a JSON value.
fn py_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `str()` of a JSON value as `json.loads` returns it.
fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

/// Python's `repr()` of a JSON value as `json.loads` returns it.
fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => py_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => py_repr_str(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(py_repr).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(fields) => {
            let inner: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}: {}", py_repr_str(k), py_repr(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// Python's `repr()` of a finite float: the shortest round-trip digits, fixed notation for
/// exponents in -4..16, else `1e+16`-style.
fn py_float(f: f64) -> String {
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let fixed = format!("{f}");
        if fixed.contains('.') {
            fixed
        } else {
            format!("{fixed}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Python's `repr()` of a `str`: single quotes unless the text holds `'` and no `"`; `\\`,
/// the quote, `\t`, `\n`, `\r` and non-printable characters escaped.
pub(crate) fn py_repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let code = c as u32;
                match code {
                    0..=0xff => out.push_str(&format!("\\x{code:02x}")),
                    0x100..=0xffff => out.push_str(&format!("\\u{code:04x}")),
                    _ => out.push_str(&format!("\\U{code:08x}")),
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str.isprintable` for the characters a model plausibly writes: control and
/// format characters, and separators other than the ASCII space, are not printable.
fn py_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c as u32,
            0xa0 | 0xad | 0x1680 | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x206f
            | 0x3000 | 0xfeff | 0xfff9..=0xfffb))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gsm8k(truth: &str) -> Vec<FunctionTool> {
        vec![FunctionTool::Gsm8kReward {
            ground_truth: truth.into(),
        }]
    }

    fn run(truth: &str, response: &str) -> Vec<Answered> {
        parse_calls(response)
            .iter()
            .map(|c| execute(&gsm8k(truth), c))
            .collect()
    }

    #[test]
    fn vt1_hermes_calls_parse_as_verl_parses_them() {
        let text = "I think 72.\n<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>";
        assert_eq!(
            parse_calls(text),
            vec![FunctionCall {
                name: GSM8K_REWARD.into(),
                arguments: json!({"answer": "72"}),
            }]
        );
        // No end tag: no call at all. A span that is not a call is dropped.
        assert!(parse_calls("<tool_call>{\"name\": \"x\", \"arguments\": {}}").is_empty());
        let two = "<tool_call>{oops}</tool_call> <tool_call>[1]</tool_call>\
                   <tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>\
                   <tool_call>{\"name\": \"f\"}</tool_call>\
                   <tool_call>{\"name\": \"g\", \"arguments\": \"7\"}</tool_call>";
        let calls = parse_calls(two);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "g");
        let oracle = FunctionTool::Gsm8kReward {
            ground_truth: "72".into(),
        }
        .oracle_call();
        assert_eq!(
            oracle,
            "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>"
        );
        assert_eq!(parse_calls(&oracle)[0].arguments, json!({"answer": "72"}));
    }

    #[test]
    fn vt3_gsm8k_tool_answers_as_verl() {
        let call = |args: &str| {
            format!("<tool_call>\n{{\"name\": \"calc_gsm8k_reward\", \"arguments\": {args}}}\n</tool_call>")
        };
        let cases = [
            (
                r#"{"answer": "72"}"#,
                "Current parsed answer='72' reward=1.0",
                0.0,
            ),
            (
                "{\"answer\": \"#### 72\"}",
                "Current parsed answer='#### 72' reward=1.0",
                0.0,
            ),
            (
                r#"{"answer": 72}"#,
                "Current parsed answer='72' reward=1.0",
                0.0,
            ),
            (
                r#"{"answer": "71"}"#,
                "Current parsed answer='71' reward=0.0",
                -0.05,
            ),
            (
                r#"{"answer": "seventy"}"#,
                "Current parsed answer='seventy' reward=0",
                -0.05,
            ),
            (r#"{}"#, "Current parsed answer='' reward=0", -0.05),
            (
                r#"{"answer": 72.0}"#,
                "Current parsed answer='72.0' reward=0.0",
                -0.05,
            ),
            (
                r#"{"answer": "it's 72"}"#,
                "Current parsed answer=\"it's 72\" reward=1.0",
                0.0,
            ),
            (
                r#"{"answer": [7, 2]}"#,
                "Current parsed answer='[7, 2]' reward=0.0",
                -0.05,
            ),
            (
                r#""72""#,
                "Error when executing tool: 'str' object has no attribute 'get'",
                0.0,
            ),
        ];
        for (args, text, tool_reward) in cases {
            let got = run("72", &call(args));
            assert_eq!(got.len(), 1, "{args}");
            assert_eq!(got[0].text, text, "{args}");
            assert_eq!(got[0].tool_reward, tool_reward, "{args}");
        }
        let unknown = "<tool_call>{\"name\": \"calc\", \"arguments\": {}}</tool_call>";
        assert_eq!(
            run("72", unknown)[0].text,
            "Error when executing tool: 'calc'"
        );
    }

    #[test]
    fn vt3_python_reprs_and_truncation() {
        assert_eq!(py_repr_str("a\\b\n'\""), "'a\\\\b\\n\\'\"'");
        assert_eq!(py_repr_str("\u{7}\u{a0}é"), "'\\x07\\xa0é'");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(0.00001), "1e-05");
        assert_eq!(py_float(2.5), "2.5");
        assert_eq!(
            py_repr(&json!({"a": null, "b": true})),
            "{'a': None, 'b': True}"
        );
        let long = "9".repeat(300);
        let got = run("1", &call_text(GSM8K_REWARD, &json!({ "answer": long })));
        let text = &got[0].text;
        assert!(text.starts_with("Current parsed answer='999"));
        assert!(text.contains("...(truncated)..."));
        assert_eq!(text.chars().count(), 256 + "...(truncated)...".len());
    }
}
