//! Multi-turn text episodes through a Hugging Face tokenizer and its chat template,
//! token-in / token-out: the one way keel turns env text into model tokens and sampled tokens
//! back into responses, for the built-in tiny model (its word-level tokenizer.json and
//! template) and for a real checkpoint alike.
//!
//! How a turn is rendered follows verl's agent loop (`ToolAgentLoop._handle_processing_tools_state`
//! → `AgentLoopBase.apply_chat_template(add_messages, remove_system_prompt=True)`, with the
//! system prompt from `verl.utils.chat_template.initialize_system_prompt`): the new messages are
//! rendered alone with the generation prompt and the template's preamble is cut off. keel adds
//! back the text the template puts between an assistant turn's end and the next message (the
//! `\n` after Qwen's `<|im_end|>`), which verl drops, so that for templates whose history is
//! stable the episode is token for token what transformers renders for the whole conversation.
//!
//! Invariants:
//! - CC-1 (first prompt): the chat template applied to the task's preamble (a system prompt or
//!   earlier turns, usually none) and the env's prompt as the user message after it, with the
//!   generation prompt, encoded without adding special tokens again.
//! - CC-2 (observations): an observation's tokens are `separator + render(new messages,
//!   generation prompt)` with the template's system preamble cut off, where `separator` is what
//!   the template renders after an assistant turn's end-of-turn token and the preamble is
//!   verl's `initialize_system_prompt` (the text of `[user ""]` less one user block of
//!   `[user "", user ""]`). After a turn that did not end with the end-of-turn token (another
//!   stop token, or cut at `max_turn_tokens`), the end-of-turn token comes first. History is
//!   never re-tokenised (HT-3).
//! - CC-3 (responses): a demonstrated action is `encode(before + text + after) + [end of
//!   turn]`, where `before`/`after` are the template's own text around a final assistant
//!   message's content (Qwen3's empty `<think>\n\n</think>\n\n` with thinking on, nothing for
//!   most templates); a sampled turn's response is its tokens decoded up to the first stop token
//!   with special tokens dropped, untrimmed (verl's `solution_str`; reasoning text included).
//! - CC-4: the end-of-turn token is the tokenizer's eos token; the sampler stops at any of the
//!   stop ids (HT-4). A tokenizer without a chat template or an eos token in its vocabulary is
//!   refused, naming what is missing.
//! - CC-5 (template check, at construction, never mid-run): a probe conversation (with and
//!   without a system message, three user turns, two assistant turns) is rendered turn by turn
//!   (CC-1..3) and whole. `strict`: the two texts must be equal. `template` (default): they
//!   must hold every message's content in the same order, with the same text before the first
//!   and after the last content; what differs is the template's own text around earlier
//!   assistant turns (Qwen3 drops their `<think>` block once a user turn follows, Qwen2.5 and
//!   Llama 3 differ in nothing). `off`: no probe. Any template that cannot render a turn alone,
//!   or fails the probe, is refused with the difference shown.

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use super::error::HfError;
use super::sampler::Detokenize;
use super::tokenizer::{ChatMessage, HfTokenizer};

/// How strictly turn-by-turn rendering must agree with rendering the whole conversation
/// (CC-5); `model.chat_template_check`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TemplateCheck {
    /// Token-in/token-out must equal the whole conversation's rendering.
    Strict,
    /// Only the template's own text around earlier assistant turns may differ.
    #[default]
    Template,
    /// No check.
    Off,
}

impl TemplateCheck {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateCheck::Strict => "strict",
            TemplateCheck::Template => "template",
            TemplateCheck::Off => "off",
        }
    }
}

/// Renders episodes of text turns as tokens (CC-1..5).
pub struct ChatCodec {
    /// Shared with the samplers' detokenizers ([`ChatCodec::detokenizer`]).
    tok: Arc<HfTokenizer>,
    eos: String,
    end_of_turn: u32,
    stop_ids: Vec<u32>,
    /// Template text after an assistant turn's end-of-turn token (CC-2).
    separator: String,
    /// Template text before any message, cut from turns rendered alone (CC-2).
    system_prefix: String,
    /// Template text before and after a demonstrated action's content (CC-3).
    action_before: String,
    action_after: String,
}

/// The text of a sampled turn: its tokens before the first stop token, decoded.
fn response_text(tok: &HfTokenizer, stop_ids: &[u32], ids: &[u32]) -> Result<String, HfError> {
    let end = ids
        .iter()
        .position(|t| stop_ids.contains(t))
        .unwrap_or(ids.len());
    tok.decode(&ids[..end], true)
}

const PROBE_USER: [&str; 3] = ["keelprobeuserone", "keelprobeusertwo", "keelprobeuserthree"];
const PROBE_ASSISTANT: [&str; 2] = ["keelprobeassistantone", "keelprobeassistanttwo"];
const PROBE_SYSTEM: &str = "keelprobesystem";

fn template_err(reason: String) -> HfError {
    HfError::Tokenizer(format!("chat template: {reason}"))
}

impl ChatCodec {
    /// A codec over `tok` (CC-4), its template probed under `check` (CC-5).
    pub fn new(tok: HfTokenizer, check: TemplateCheck) -> Result<Self, HfError> {
        if !tok.has_chat_template() {
            return Err(HfError::Tokenizer(
                "the tokenizer has no chat template (chat_template.jinja or tokenizer_config.json `chat_template`); keel renders episodes with it".into(),
            ));
        }
        let eos = tok.eos_token().map(str::to_string).ok_or_else(|| {
            HfError::Tokenizer("tokenizer_config.json names no `eos_token` (it ends a turn)".into())
        })?;
        let end_of_turn = tok.token_id(&eos).ok_or_else(|| {
            HfError::Tokenizer(format!("the eos token `{eos}` is not in the vocabulary"))
        })?;
        let stop_ids = tok.stop_ids();
        let system_prefix = system_prefix(&tok)?;
        let (separator, action_before, action_after) = turn_frame(&tok, &eos)?;
        let codec = ChatCodec {
            tok: Arc::new(tok),
            eos,
            end_of_turn,
            stop_ids,
            separator,
            system_prefix,
            action_before,
            action_after,
        };
        if check != TemplateCheck::Off {
            for system in [false, true] {
                codec.probe(system, check)?;
            }
        }
        Ok(codec)
    }

    /// The token that ends an agent turn (CC-4).
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    /// The ids the sampler stops a turn at (CC-4, HT-4), the end-of-turn token first.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.tok.vocab_size()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &HfTokenizer {
        &self.tok
    }

    /// The first prompt of an episode after its `preamble` messages (CC-1).
    pub fn prompt(&self, preamble: &[ChatMessage], text: &str) -> Result<Vec<u32>, HfError> {
        self.prompt_with_tools(preamble, text, &[])
    }

    /// The first prompt with `tools` (OpenAI function schemas) rendered by the template, as
    /// transformers' `apply_chat_template(tools=...)` (CC-1). Later turns never repeat them.
    pub fn prompt_with_tools(
        &self,
        preamble: &[ChatMessage],
        text: &str,
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>, HfError> {
        let mut messages = preamble.to_vec();
        messages.push(ChatMessage::new("user", text));
        self.conversation(&messages, tools)
    }

    /// A whole conversation as a prompt, `tools` rendered and the assistant's turn opened
    /// (CC-1): the first prompt, or a new segment's (an agent that rewrote its history, RB-4).
    pub fn conversation(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>, HfError> {
        let rendered = self
            .tok
            .apply_chat_template_with_tools(messages, tools, true)?;
        self.tok.encode(&rendered, false)
    }

    /// Raw text as the tokenizer encodes it, no template: a text completion's prompt or what a
    /// later prompt adds (an agent calling `/v1/completions`). `first` adds the tokenizer's
    /// special tokens (its BOS, if it has one), as an inference server encodes a prompt.
    pub fn text(&self, text: &str, first: bool) -> Result<Vec<u32>, HfError> {
        self.tok.encode(text, first)
    }

    /// The tokens a user observation appends after a turn whose last token is `last` (CC-2).
    pub fn observation(&self, last: Option<u32>, text: &str) -> Result<Vec<u32>, HfError> {
        self.observation_messages(last, &[ChatMessage::new("user", text)])
    }

    /// The tokens new `messages` (user or tool turns) append after a turn whose last token is
    /// `last` (CC-2).
    pub fn observation_messages(
        &self,
        last: Option<u32>,
        messages: &[ChatMessage],
    ) -> Result<Vec<u32>, HfError> {
        let mut ids = Vec::new();
        if last != Some(self.end_of_turn) {
            ids.push(self.end_of_turn);
        }
        ids.extend(self.tok.encode(&self.turn_text(messages)?, false)?);
        Ok(ids)
    }

    /// The text after an end-of-turn token that opens `messages` and the next assistant turn.
    fn turn_text(&self, messages: &[ChatMessage]) -> Result<String, HfError> {
        let alone = self.tok.apply_chat_template(messages, true)?;
        let rest = alone.strip_prefix(&self.system_prefix).ok_or_else(|| {
            template_err(format!(
                "a turn rendered alone does not start with the template's preamble {:?}",
                self.system_prefix
            ))
        })?;
        Ok(format!("{}{rest}", self.separator))
    }

    /// A demonstrated action: its tokens and the end-of-turn token (CC-3).
    pub fn action(&self, text: &str) -> Result<Vec<u32>, HfError> {
        let framed = format!("{}{text}{}", self.action_before, self.action_after);
        let mut ids = self.tok.encode(&framed, false)?;
        ids.push(self.end_of_turn);
        Ok(ids)
    }

    /// The response text of a sampled turn (CC-3): decoded up to the first stop token,
    /// special tokens dropped, untrimmed.
    pub fn response_text(&self, ids: &[u32]) -> Result<String, HfError> {
        response_text(&self.tok, &self.stop_ids, ids)
    }

    /// [`ChatCodec::response_text`] as a sampler's detokenizer (stop strings, SA-3).
    pub fn detokenizer(&self) -> Detokenize {
        let (tok, stop_ids) = (self.tok.clone(), self.stop_ids.clone());
        Box::new(move |ids: &[u32]| response_text(&tok, &stop_ids, ids))
    }

    /// The content tokens of a sampled turn (those before its first stop token), each decoded
    /// alone as [`ChatCodec::response_text`] decodes (a piece of a multi-byte character comes
    /// out lossily), for callers that report per-token log-probs.
    pub fn token_texts(&self, ids: &[u32]) -> Result<Vec<String>, HfError> {
        ids.iter()
            .take_while(|t| !self.stop_ids.contains(t))
            .map(|&t| self.tok.decode(&[t], true))
            .collect()
    }

    /// Number of tokens of `text` alone.
    pub fn count(&self, text: &str) -> Result<usize, HfError> {
        Ok(self.tok.encode(text, false)?.len())
    }

    /// CC-5 on the probe conversation, with or without a system message.
    fn probe(&self, system: bool, check: TemplateCheck) -> Result<(), HfError> {
        let mut messages = Vec::new();
        if system {
            messages.push(ChatMessage::new("system", PROBE_SYSTEM));
        }
        messages.push(ChatMessage::new("user", PROBE_USER[0]));
        let mut turns = self.tok.apply_chat_template(&messages, true)?;
        for (a, u) in PROBE_ASSISTANT.iter().zip(&PROBE_USER[1..]) {
            turns.push_str(&format!(
                "{}{a}{}{}",
                self.action_before, self.action_after, self.eos
            ));
            turns.push_str(&self.turn_text(&[ChatMessage::new("user", u)])?);
            messages.push(ChatMessage::new("assistant", a));
            messages.push(ChatMessage::new("user", u));
        }
        let whole = self.tok.apply_chat_template(&messages, true)?;
        let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        let agrees = match check {
            TemplateCheck::Strict => turns == whole,
            _ => same_outside_history(&turns, &whole, &contents),
        };
        if agrees {
            return Ok(());
        }
        let at = turns
            .bytes()
            .zip(whole.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let excerpt = |s: &str| {
            s.get(at.saturating_sub(20)..)
                .unwrap_or(s)
                .chars()
                .take(80)
                .collect::<String>()
        };
        Err(template_err(format!(
            "rendering turn by turn (token-in/token-out) differs from rendering the whole conversation{} under model.chat_template_check = \"{}\": turn by turn {:?}…, whole {:?}… ({})",
            if system { " with a system message" } else { "" },
            check.as_str(),
            excerpt(&turns),
            excerpt(&whole),
            match check {
                TemplateCheck::Strict => "\"template\" tolerates differences in the template's own text around earlier assistant turns",
                _ => "the difference is in message text or in the last turn, which keel cannot append token-in/token-out; \"off\" trains on the turn-by-turn rendering anyway",
            }
        )))
    }
}

/// The template's preamble: the text before the first message (CC-2), verl's
/// `initialize_system_prompt` on text.
fn system_prefix(tok: &HfTokenizer) -> Result<String, HfError> {
    let empty = ChatMessage::new("user", "");
    let one = tok.apply_chat_template(std::slice::from_ref(&empty), false)?;
    let two = tok.apply_chat_template(&[empty.clone(), empty], false)?;
    let block = two.len().checked_sub(one.len()).unwrap_or(usize::MAX);
    one.get(..one.len().saturating_sub(block))
        .filter(|p| block <= one.len() && two.starts_with(p))
        .map(str::to_string)
        .ok_or_else(|| {
            template_err(
                "cannot find the text it renders before the first message (two user turns do not extend one)".into(),
            )
        })
}

/// `(separator, before, after)`: the text after an assistant turn's end-of-turn token, and the
/// text around a final assistant message's content (CC-2, CC-3).
fn turn_frame(tok: &HfTokenizer, eos: &str) -> Result<(String, String, String), HfError> {
    let (user, assistant) = (PROBE_USER[0], PROBE_ASSISTANT[0]);
    let prompt = tok.apply_chat_template(&[ChatMessage::new("user", user)], true)?;
    let done = tok.apply_chat_template(
        &[
            ChatMessage::new("user", user),
            ChatMessage::new("assistant", assistant),
        ],
        false,
    )?;
    let content = done
        .rfind(assistant)
        .ok_or_else(|| template_err("it drops an assistant message's text".into()))?;
    let after_content = &done[content + assistant.len()..];
    let end = after_content.find(eos).ok_or_else(|| {
        template_err(format!(
            "it does not end an assistant turn with the eos token `{eos}`"
        ))
    })?;
    let separator = after_content[end + eos.len()..].to_string();
    let after = after_content[..end].to_string();
    let before = done
        .get(..content)
        .and_then(|head| head.strip_prefix(prompt.as_str()))
        .unwrap_or("")
        .to_string();
    Ok((separator, before, after))
}

/// CC-5's `template` rule: every content in order in both texts, with equal text before the
/// first and after the last.
fn same_outside_history(turns: &str, whole: &str, contents: &[&str]) -> bool {
    let split = |text: &str| -> Option<(usize, usize)> {
        let mut at = 0;
        let mut first = None;
        for c in contents {
            let i = text[at..].find(c)? + at;
            first.get_or_insert(i);
            at = i + c.len();
        }
        Some((first.unwrap_or(0), at))
    };
    match (split(turns), split(whole)) {
        (Some((f1, l1)), Some((f2, l2))) => {
            turns[..f1] == whole[..f2] && turns[l1..] == whole[l2..]
        }
        _ => false,
    }
}
