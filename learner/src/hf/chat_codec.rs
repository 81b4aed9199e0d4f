//! Multi-turn text episodes through a Hugging Face tokenizer and its chat template,
//! token-in / token-out: the one way keel turns env text into model tokens and sampled tokens
//! back into actions, for the built-in tiny model (its word-level tokenizer.json and template)
//! and for a real checkpoint alike.
//!
//! Invariants:
//! - CC-1 (first prompt): the chat template applied to the task's preamble (a system prompt or
//!   earlier turns, usually none) and the env's prompt as the user message after it, with the
//!   generation prompt, encoded without adding special tokens again.
//! - CC-2 (observations): after a sampled action that ended with the end-of-turn token, an
//!   observation appends the template's text from just after that token to the end of the next
//!   generation prompt, taken from a rendering of the conversation so far with the observation
//!   as the next user message (verl's delta rendering). History is never re-tokenised (HT-3).
//! - CC-3 (actions): a demonstrated action is `encode(text) + [end of turn]`; a sampled turn is
//!   decoded up to its first end-of-turn token with special tokens dropped, then trimmed.
//! - CC-4: the end-of-turn token is the tokenizer's eos token; a tokenizer without a chat
//!   template or an eos token in its vocabulary is refused, naming what is missing.

use super::error::HfError;
use super::tokenizer::{ChatMessage, HfTokenizer};

/// Renders episodes of text turns as tokens (CC-1..4).
pub struct ChatCodec {
    tok: HfTokenizer,
    eos: String,
    end_of_turn: u32,
}

impl ChatCodec {
    /// A codec over `tok`; it must have a chat template and an eos token (CC-4).
    pub fn new(tok: HfTokenizer) -> Result<Self, HfError> {
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
        Ok(ChatCodec {
            tok,
            eos,
            end_of_turn,
        })
    }

    /// The token that ends an agent turn (CC-4): the sampler's stop token.
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
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
        let mut messages = preamble.to_vec();
        messages.push(ChatMessage::new("user", text));
        self.tok.encode_chat(&messages, true)
    }

    /// The tokens an observation appends after an action that ended its turn (CC-2).
    pub fn observation(&self, text: &str) -> Result<Vec<u32>, HfError> {
        let before = [
            ChatMessage::new("user", "x"),
            ChatMessage::new("assistant", "y"),
        ];
        let prefix = self.tok.apply_chat_template(&before, false)?;
        let cut = prefix
            .rfind(&self.eos)
            .map(|i| i + self.eos.len())
            .ok_or_else(|| {
                HfError::Tokenizer(format!(
                    "the chat template does not end an assistant turn with the eos token `{}`",
                    self.eos
                ))
            })?;
        let mut after = before.to_vec();
        after.push(ChatMessage::new("user", text));
        let full = self.tok.apply_chat_template(&after, true)?;
        if full.get(..cut) != prefix.get(..cut) {
            return Err(HfError::Tokenizer(
                "the chat template renders earlier turns differently once a user turn follows; keel cannot append observations token-in/token-out".into(),
            ));
        }
        self.tok.encode(&full[cut..], false)
    }

    /// A demonstrated action: its tokens and the end-of-turn token (CC-3).
    pub fn action(&self, text: &str) -> Result<Vec<u32>, HfError> {
        let mut ids = self.tok.encode(text, false)?;
        ids.push(self.end_of_turn);
        Ok(ids)
    }

    /// The action text of a sampled turn (CC-3).
    pub fn action_text(&self, ids: &[u32]) -> Result<String, HfError> {
        let end = ids
            .iter()
            .position(|&t| t == self.end_of_turn)
            .unwrap_or(ids.len());
        Ok(self.tok.decode(&ids[..end], true)?.trim().to_string())
    }

    /// Number of tokens of `text` alone.
    pub fn count(&self, text: &str) -> Result<usize, HfError> {
        Ok(self.tok.encode(text, false)?.len())
    }
}
