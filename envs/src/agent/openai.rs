//! The OpenAI chat-completions wire shapes the gateway reads and writes, as the `openai`
//! Python client (1.x) sends and parses them, and the translation between the model's text and
//! `tool_calls`.
//!
//! Invariants:
//! - OAI-1 A request's message content is a string, `null`, or a list of `{"type": "text"}`
//!   parts (joined); any other part (images, audio) is refused, naming the message. Unknown
//!   request and message fields are ignored (clients send `refusal`, `audio`, `function_call`
//!   echoes).
//! - OAI-2 A response's text holds tool calls exactly when the request offered `tools` and the
//!   text parses as calls in the template family's format: Hermes `<tool_call>{json}</tool_call>`
//!   spans (Qwen2.5, Qwen3; verl's `HermesToolParser`, VT-1) or a whole-text JSON object with
//!   `name` and `parameters` / `arguments` (Llama 3.1's JSON tool calls). A text that does not
//!   parse is returned as plain content, never as an error. The calls' `arguments` are JSON
//!   text, as the API sends them; the content is the text outside the calls, `null` when empty.
//! - OAI-3 A call id is `call_<episode call>_<index>`: stable for one stored answer, so a replayed
//!   answer is the same bytes.
//! - OAI-4 The SSE form of an answer carries the same message as the JSON form: a role chunk,
//!   the content (with the log-probs when asked), each tool call whole, a chunk with
//!   `finish_reason`, then `data: [DONE]`.
//! - OAI-5 `logprobs: true` returns every sampled content token (the stop token excluded) with
//!   its log-probability under the sampling distribution at `rollout.temperature`: exactly the
//!   behaviour log-probs stored with the episode, which the learner's ratio starts from. The
//!   tokens are decoded for an episode whose first call asks; a later call of an episode whose
//!   first did not gets `logprobs: null`.
//!   `top_logprobs` > 0 is refused (400): keel keeps only the sampled token's. `finish_reason`
//!   is `tool_calls` when calls parsed, `length` when the turn hit `rollout.max_turn_tokens`,
//!   else `stop`.
//! - OAI-6 `POST /v1/completions` (text completions) takes one string prompt (or a list of
//!   one) and answers a `text_completion` with the sampled text; `max_tokens` defaults to 16 as
//!   in the OpenAI API; `logprobs: 0` returns each sampled token with its log-prob (`tokens`,
//!   `token_logprobs`, `text_offset`; `top_logprobs` null). Token-id prompts, several prompts,
//!   `echo`, `suffix`, `best_of` > 1 and `logprobs` > 0 are refused (400) naming the field. The
//!   SSE form carries the text in one chunk, then a chunk with `finish_reason`, then
//!   `data: [DONE]`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::dataset::functions::parse_calls;

/// A `POST /v1/chat/completions` body (the fields keel reads).
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// The model name (any; the gateway serves the policy being trained).
    #[serde(default)]
    pub model: String,
    /// The conversation.
    pub messages: Vec<InMessage>,
    /// OpenAI function tools (`[{"type": "function", "function": {...}}]`).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Sampling temperature (must be the run's, or absent).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Most tokens of the answer.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// The newer spelling of `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Stop sequences: a string or a list of strings (the turn ends at the first).
    #[serde(default)]
    pub stop: Option<Value>,
    /// Answers per request (only 1).
    #[serde(default)]
    pub n: Option<u64>,
    /// Server-sent events instead of one JSON body.
    #[serde(default)]
    pub stream: bool,
    /// Return the sampled tokens' log-probs.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token (not served: keel keeps the sampled token's log-prob only).
    #[serde(default)]
    pub top_logprobs: Option<u64>,
    /// The `Idempotency-Key` header: a retry with the same key gets the same answer (AGT-2).
    #[serde(skip)]
    pub idempotency_key: Option<String>,
    /// The text a `/v1/completions` call continues (OAI-6, AGT-8); `None` for a chat call,
    /// whose `messages` are then the conversation.
    #[serde(skip)]
    pub prompt: Option<String>,
}

/// The answer length of a text completion that names none (the OpenAI API's default).
pub const TEXT_DEFAULT_MAX_TOKENS: u64 = 16;

/// A `POST /v1/completions` body (the fields keel reads, OAI-6).
#[derive(Clone, Debug, Deserialize)]
pub struct TextRequest {
    /// The model name (any).
    #[serde(default)]
    pub model: String,
    /// The text to continue: a string, or a list of one string.
    pub prompt: Value,
    /// Sampling temperature (must be the run's, or absent).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Most tokens of the answer ([`TEXT_DEFAULT_MAX_TOKENS`] when absent).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Stop sequences: a string or a list of strings.
    #[serde(default)]
    pub stop: Option<Value>,
    /// Answers per request (only 1).
    #[serde(default)]
    pub n: Option<u64>,
    /// Candidates sampled per answer (only 1).
    #[serde(default)]
    pub best_of: Option<u64>,
    /// Server-sent events instead of one JSON body.
    #[serde(default)]
    pub stream: bool,
    /// `0`: return the sampled tokens' log-probs; more asks for alternatives (not served).
    #[serde(default)]
    pub logprobs: Option<u64>,
    /// Return the prompt before the answer (not served).
    #[serde(default)]
    pub echo: bool,
    /// Text after the insertion point (not served).
    #[serde(default)]
    pub suffix: Option<String>,
}

impl TextRequest {
    /// The call as its episode takes it: a [`ChatRequest`] with `prompt` set and no messages;
    /// `Err` names what keel does not serve (OAI-6).
    pub fn into_call(self) -> Result<ChatRequest, String> {
        let prompt = match &self.prompt {
            Value::String(s) => s.clone(),
            Value::Array(a) if a.len() == 1 && a[0].is_string() => {
                a[0].as_str().unwrap_or_default().to_string()
            }
            _ => return Err("prompt must be one string (token-id prompts and several prompts are not served: a call is one turn of one episode)".into()),
        };
        if self.echo {
            return Err("echo is not served: the answer is the sampled text only".into());
        }
        if self.suffix.is_some() {
            return Err("suffix is not served: the model continues the prompt".into());
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err("best_of > 1 is not served: one answer per call".into());
        }
        if self.logprobs.is_some_and(|k| k > 0) {
            return Err("logprobs > 0 asks for alternatives, which keel does not keep: logprobs = 0 returns each sampled token's log-prob".into());
        }
        Ok(ChatRequest {
            model: self.model,
            messages: Vec::new(),
            tools: None,
            temperature: self.temperature,
            max_tokens: Some(self.max_tokens.unwrap_or(TEXT_DEFAULT_MAX_TOKENS)),
            max_completion_tokens: None,
            stop: self.stop,
            n: self.n,
            stream: self.stream,
            logprobs: Some(self.logprobs.is_some()),
            top_logprobs: None,
            idempotency_key: None,
            prompt: Some(prompt),
        })
    }
}

/// Most stop sequences a call may send (the OpenAI API's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;

impl ChatRequest {
    /// The call's stop sequences: `stop` as one string or a list of at most
    /// [`MAX_STOP_SEQUENCES`] non-empty strings.
    pub fn stop_sequences(&self) -> Result<Vec<String>, String> {
        let stops = match &self.stop {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or("stop must be a string or a list of strings")?,
            Some(_) => return Err("stop must be a string or a list of strings".into()),
        };
        if stops.len() > MAX_STOP_SEQUENCES || stops.iter().any(String::is_empty) {
            return Err(format!(
                "stop takes at most {MAX_STOP_SEQUENCES} non-empty strings"
            ));
        }
        Ok(stops)
    }

    /// The call's `max_completion_tokens` (or its older spelling `max_tokens`).
    pub fn max_answer_tokens(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }
}

/// `text` up to the first occurrence of any of `stops` (the OpenAI API leaves the stop
/// sequence out of the answer), and whether one occurred.
pub fn cut_at_stop<'t>(text: &'t str, stops: &[String]) -> (&'t str, bool) {
    match stops.iter().filter_map(|s| text.find(s.as_str())).min() {
        Some(at) => (&text[..at], true),
        None => (text, false),
    }
}

/// One message of a request (OAI-1).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct InMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, `null`, or text parts.
    #[serde(default)]
    pub content: Option<Value>,
    /// An assistant message's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

impl InMessage {
    /// The message's text (OAI-1); parts that are not text are an error naming them.
    pub fn text(&self) -> Result<String, String> {
        match &self.content {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| match (p.get("type"), p.get("text")) {
                    (Some(t), Some(Value::String(s))) if t == "text" => Ok(s.as_str()),
                    _ => Err(format!(
                        "a {} message holds a content part keel cannot render (only text parts)",
                        self.role
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|texts| texts.concat()),
            Some(_) => Err(format!(
                "a {} message's content is neither a string nor a list of parts",
                self.role
            )),
        }
    }

    /// The calls of an assistant message as (name, arguments) with the arguments parsed, for
    /// comparing an echoed answer with the one given.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.tool_calls
            .iter()
            .flatten()
            .filter_map(|c| {
                let f = c.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                let args = match f.get("arguments")? {
                    Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                    other => other.clone(),
                };
                Some((name, args))
            })
            .collect()
    }
}

/// One tool call the model made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The function name.
    pub name: String,
    /// Its arguments (any JSON value).
    pub arguments: Value,
}

/// One sampled token of an answer and its log-prob (OAI-5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token decoded alone.
    pub token: String,
    /// Its log-probability at the run's temperature.
    pub logprob: f32,
}

/// The assistant message answering one call (OAI-2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// Text outside the calls; `None` when empty and there are calls.
    pub content: Option<String>,
    /// The calls (empty: a plain answer).
    pub tool_calls: Vec<ToolCall>,
    /// The sampled tokens' log-probs, when asked (OAI-5).
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Tokens of the prompt the policy saw (the whole episode so far).
    pub prompt_tokens: usize,
    /// Tokens sampled.
    pub completion_tokens: usize,
    /// The turn stopped at `rollout.max_turn_tokens` (`finish_reason` "length").
    #[serde(default)]
    pub truncated: bool,
}

impl Answer {
    /// The answer for the model's raw `text`, parsing calls when `tools` were offered (OAI-2).
    pub fn from_text(text: &str, tools_offered: bool) -> Answer {
        let calls = match tools_offered {
            true => parse_tool_calls(text),
            false => None,
        };
        match calls {
            Some((calls, rest)) => Answer {
                content: (!rest.trim().is_empty()).then(|| rest.trim().to_string()),
                tool_calls: calls,
                logprobs: None,
                prompt_tokens: 0,
                completion_tokens: 0,
                truncated: false,
            },
            None => Answer {
                content: Some(text.to_string()),
                tool_calls: Vec::new(),
                logprobs: None,
                prompt_tokens: 0,
                completion_tokens: 0,
                truncated: false,
            },
        }
    }

    /// The message as the API returns it (OAI-2, OAI-3).
    pub fn message(&self, call: usize) -> Value {
        let mut m = json!({"role": "assistant", "content": self.content});
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = Value::Array(
                self.tool_calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        json!({
                            "id": format!("call_{call}_{i}"),
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments.to_string()},
                        })
                    })
                    .collect(),
            );
        }
        m
    }

    /// Whether `echo` (the assistant message an agent sends back in its history) is this
    /// answer: same text (a missing text is empty) and the same calls.
    pub fn matches(&self, echo: &InMessage) -> bool {
        let text = echo.text().unwrap_or_default();
        let calls: Vec<(String, Value)> = self
            .tool_calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect();
        echo.role == "assistant"
            && text == self.content.clone().unwrap_or_default()
            && (echo.tool_calls.is_none() || echo.calls() == calls)
    }

    fn finish_reason(&self) -> &'static str {
        match (self.tool_calls.is_empty(), self.truncated) {
            (false, _) => "tool_calls",
            (true, true) => "length",
            (true, false) => "stop",
        }
    }

    fn logprobs_json(&self) -> Value {
        match &self.logprobs {
            None => Value::Null,
            Some(lps) => json!({"content": lps.iter().map(|lp| json!({
                "token": lp.token, "logprob": lp.logprob, "bytes": lp.token.as_bytes(),
                "top_logprobs": [],
            })).collect::<Vec<_>>(), "refusal": null}),
        }
    }

    /// The `chat.completion` body.
    pub fn completion(&self, id: &str, model: &str, created: u64, call: usize) -> Value {
        json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": self.message(call),
                "logprobs": self.logprobs_json(),
                "finish_reason": self.finish_reason(),
            }],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        })
    }

    /// The answer's text (a text completion's: no calls are parsed, OAI-6).
    fn text(&self) -> &str {
        self.content.as_deref().unwrap_or_default()
    }

    /// The legacy log-probs object of a text completion (OAI-6).
    fn text_logprobs(&self) -> Value {
        let Some(lps) = &self.logprobs else {
            return Value::Null;
        };
        let offsets: Vec<usize> = lps
            .iter()
            .scan(0, |at, lp| {
                let start = *at;
                *at += lp.token.len();
                Some(start)
            })
            .collect();
        json!({
            "tokens": lps.iter().map(|lp| &lp.token).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
            "top_logprobs": null,
            "text_offset": offsets,
        })
    }

    /// The `text_completion` body (OAI-6).
    pub fn text_completion(&self, id: &str, model: &str, created: u64) -> Value {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "text": self.text(),
                "logprobs": self.text_logprobs(),
                "finish_reason": self.finish_reason(),
            }],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        })
    }

    /// The text completion's event stream (OAI-6).
    pub fn text_sse(&self, id: &str, model: &str, created: u64) -> String {
        let chunk = |text: &str, logprobs: Value, finish: Value| {
            json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            })
        };
        let events = [
            chunk(self.text(), self.text_logprobs(), Value::Null),
            chunk("", Value::Null, json!(self.finish_reason())),
        ];
        let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        out
    }

    /// The `chat.completion.chunk` event stream (OAI-4).
    pub fn sse(&self, id: &str, model: &str, created: u64, call: usize) -> String {
        let chunk = |delta: Value, finish: Value| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            })
        };
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        if let Some(text) = &self.content {
            let mut content = chunk(json!({"content": text}), Value::Null);
            content["choices"][0]["logprobs"] = self.logprobs_json();
            events.push(content);
        }
        if let Some(Value::Array(calls)) = self.message(call).get("tool_calls") {
            for (i, c) in calls.iter().enumerate() {
                let mut c = c.clone();
                c["index"] = json!(i);
                events.push(chunk(json!({"tool_calls": [c]}), Value::Null));
            }
        }
        events.push(chunk(json!({}), json!(self.finish_reason())));
        let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        out
    }
}

/// The calls in `text` and the text outside them (OAI-2); `None` when it holds none.
pub fn parse_tool_calls(text: &str) -> Option<(Vec<ToolCall>, String)> {
    let hermes = parse_calls(text);
    if !hermes.is_empty() {
        let mut rest = String::new();
        let mut tail = text;
        while let Some(start) = tail.find("<tool_call>") {
            rest.push_str(&tail[..start]);
            match tail[start..].find("</tool_call>") {
                Some(end) => tail = &tail[start + end + "</tool_call>".len()..],
                None => {
                    tail = "";
                }
            }
        }
        rest.push_str(tail);
        let calls = hermes
            .into_iter()
            .map(|c| ToolCall {
                name: c.name,
                arguments: c.arguments,
            })
            .collect();
        return Some((calls, rest));
    }
    // Llama 3.1: the whole answer is one JSON object {"name", "parameters"}.
    let v: Value = serde_json::from_str(crate::action::visible(text)).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = v.get("parameters").or_else(|| v.get("arguments"))?.clone();
    Some((vec![ToolCall { name, arguments }], String::new()))
}

/// An HTTP error answer in the API's error shape.
pub fn error_body(message: &str, kind: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oa2_hermes_calls_parse_and_the_rest_is_content() {
        let text = "let me add\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"a\": 2}}\n</tool_call>";
        let a = Answer::from_text(text, true);
        assert_eq!(a.content.as_deref(), Some("let me add"));
        assert_eq!(a.tool_calls[0].name, "calculator");
        assert_eq!(a.tool_calls[0].arguments, json!({"a": 2}));
        let m = a.message(3);
        assert_eq!(m["tool_calls"][0]["id"], "call_3_0");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"a\":2}");
        // Without tools offered the same text is content.
        assert!(Answer::from_text(text, false).tool_calls.is_empty());
    }

    #[test]
    fn oa2_llama_json_calls_and_unparseable_text() {
        let a = Answer::from_text("{\"name\": \"f\", \"parameters\": {\"x\": 1}}", true);
        assert_eq!(a.tool_calls.len(), 1);
        assert_eq!(a.content, None);
        let b = Answer::from_text("<tool_call>{not json</tool_call>", true);
        assert!(b.tool_calls.is_empty());
        assert_eq!(
            b.content.as_deref(),
            Some("<tool_call>{not json</tool_call>")
        );
    }

    #[test]
    fn an_echoed_answer_matches_as_the_client_sends_it_back() {
        let a = Answer::from_text(
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>",
            true,
        );
        let echo: InMessage = serde_json::from_value(json!({
            "role": "assistant", "content": null, "refusal": null,
            "tool_calls": [{"id": "call_0_0", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]
        }))
        .expect("message");
        assert!(a.matches(&echo));
        let other: InMessage =
            serde_json::from_value(json!({"role": "assistant", "content": "changed"})).expect("m");
        assert!(!a.matches(&other));
    }

    #[test]
    fn oa1_text_parts_join_and_images_are_refused() {
        let m: InMessage = serde_json::from_value(json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}))
        .expect("m");
        assert_eq!(m.text().expect("text"), "ab");
        let img: InMessage = serde_json::from_value(json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}))
        .expect("m");
        assert!(img.text().is_err());
    }

    #[test]
    fn oa4_the_stream_carries_the_same_message() {
        let a = Answer::from_text(
            "hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            true,
        );
        let sse = a.sse("id", "m", 1, 0);
        assert!(sse.ends_with("data: [DONE]\n\n"));
        assert!(sse.contains("\"finish_reason\":\"tool_calls\""));
        assert!(sse.contains("\"content\":\"hi\""));
    }

    #[test]
    fn oa5_logprobs_and_a_length_finish() {
        let mut a = Answer::from_text("42", false);
        a.truncated = true;
        a.logprobs = Some(vec![TokenLogprob {
            token: "42".into(),
            logprob: -0.5,
        }]);
        let body = a.completion("id", "m", 1, 0);
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(choice["logprobs"]["content"][0]["token"], "42");
        assert_eq!(choice["logprobs"]["content"][0]["logprob"], -0.5);
        assert_eq!(choice["logprobs"]["content"][0]["bytes"], json!([52, 50]));
        assert!(a.sse("id", "m", 1, 0).contains("\"logprob\":-0.5"));
        a.logprobs = None;
        assert_eq!(
            a.completion("id", "m", 1, 0)["choices"][0]["logprobs"],
            Value::Null
        );
    }
}
