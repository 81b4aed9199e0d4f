//! A Hugging Face tokenizer (`tokenizer.json` through the `tokenizers` crate) and its chat
//! template (Jinja, rendered with minijinja the way transformers renders it).
//!
//! Invariants:
//! - HT-1: the chat template is `chat_template.jinja` when present, else
//!   `tokenizer_config.json`'s `chat_template` (a string, or the entry named `default` of a
//!   list), exactly as transformers picks it.
//! - HT-2: templates render with `trim_blocks` and `lstrip_blocks`, Python string methods
//!   (`strip`, `startswith`, `split`, …), `raise_exception(msg)` as an error and `tojson`, with
//!   `messages`, `add_generation_prompt`, `bos_token` and `eos_token` in the context.
//! - HT-3: the chat template is for building the first prompt only; later turns append
//!   observation tokens to the sampled sequence (token-in/token-out), never re-render history.

use std::path::Path;

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde_json::Value;

use super::error::HfError;

/// The tokenizer file of a Hugging Face folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The tokenizer settings (special tokens, chat template) of a Hugging Face folder.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// The tokenizer files of model folder `dir` as a checkpoint carries them: `tokenizer.json`
/// and `tokenizer_config.json`, with `chat_template.jinja` (when present) folded into the
/// config's `chat_template` so that the pair is self-contained (HT-1).
pub fn folder_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, HfError> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, HfError> {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HfError::io(&path, e)),
        }
    };
    let tokenizer = read(TOKENIZER_FILE)?
        .ok_or_else(|| HfError::Tokenizer(format!("{} has no {TOKENIZER_FILE}", dir.display())))?;
    let mut cfg: Value = match read(TOKENIZER_CONFIG_FILE)? {
        Some(b) => serde_json::from_slice(&b).map_err(|source| HfError::Json {
            path: dir.join(TOKENIZER_CONFIG_FILE),
            source,
        })?,
        None => Value::Object(Default::default()),
    };
    if let Some(jinja) = read("chat_template.jinja")? {
        let text = String::from_utf8(jinja)
            .map_err(|e| HfError::Tokenizer(format!("chat_template.jinja: {e}")))?;
        if let Value::Object(map) = &mut cfg {
            map.insert("chat_template".into(), Value::String(text));
        }
    }
    Ok(vec![
        (TOKENIZER_FILE.to_string(), tokenizer),
        (
            TOKENIZER_CONFIG_FILE.to_string(),
            cfg.to_string().into_bytes(),
        ),
    ])
}

/// One chat message.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A loaded tokenizer with its chat template and special tokens.
pub struct HfTokenizer {
    tok: tokenizers::Tokenizer,
    template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

fn special(cfg: &Value, key: &str) -> Option<String> {
    match cfg.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn tok_err(what: &str, e: impl std::fmt::Display) -> HfError {
    HfError::Tokenizer(format!("{what}: {e}"))
}

impl HfTokenizer {
    /// Loads `dir/tokenizer.json`, `dir/tokenizer_config.json` and the chat template (HT-1).
    pub fn load(dir: &Path) -> Result<Self, HfError> {
        let path = dir.join(TOKENIZER_FILE);
        let tok = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| tok_err(&path.display().to_string(), e))?;
        let cfg_path = dir.join(TOKENIZER_CONFIG_FILE);
        let cfg: Value = if cfg_path.exists() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| HfError::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|source| HfError::Json {
                path: cfg_path.clone(),
                source,
            })?
        } else {
            Value::Null
        };
        let jinja = dir.join("chat_template.jinja");
        let template = if jinja.exists() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| HfError::io(&jinja, e))?)
        } else {
            None
        };
        Ok(Self::assemble(tok, &cfg, template))
    }

    /// A tokenizer from the contents of `tokenizer.json` and `tokenizer_config.json` (the
    /// files a checkpoint carries; the chat template is the config's, HT-1).
    pub fn from_json(tokenizer_json: &str, config_json: &str) -> Result<Self, HfError> {
        let tok: tokenizers::Tokenizer = tokenizer_json
            .parse()
            .map_err(|e| tok_err(TOKENIZER_FILE, e))?;
        let cfg: Value =
            serde_json::from_str(config_json).map_err(|e| tok_err(TOKENIZER_CONFIG_FILE, e))?;
        Ok(Self::assemble(tok, &cfg, None))
    }

    /// The chat template is `jinja` when given, else the config's (HT-1).
    fn assemble(tok: tokenizers::Tokenizer, cfg: &Value, jinja: Option<String>) -> Self {
        let template = jinja.or_else(|| match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        });
        HfTokenizer {
            tok,
            template,
            bos_token: special(cfg, "bos_token"),
            eos_token: special(cfg, "eos_token"),
        }
    }

    /// Whether a chat template was found.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Number of token ids (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, HfError> {
        let enc = self
            .tok
            .encode(text, add_special_tokens)
            .map_err(|e| tok_err("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, HfError> {
        self.tok
            .decode(ids, skip_special_tokens)
            .map_err(|e| tok_err("decode", e))
    }

    /// The id of a token string (e.g. `<|im_end|>`), if in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tok.token_to_id(token)
    }

    /// The eos token string from tokenizer_config.json.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders the chat template (HT-2).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, HfError> {
        let template = self
            .template
            .as_deref()
            .ok_or_else(|| HfError::Tokenizer("the folder has no chat template".into()))?;
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template("chat", template)
            .map_err(|e| tok_err("chat template", e))?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| tok_err("chat template", e))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        tmpl.render(ctx).map_err(|e| tok_err("chat template", e))
    }

    /// Renders the chat template and encodes it without adding special tokens again.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, HfError> {
        self.encode(
            &self.apply_chat_template(messages, add_generation_prompt)?,
            false,
        )
    }
}
