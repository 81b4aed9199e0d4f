//! A Hugging Face tokenizer (`tokenizer.json` through the `tokenizers` crate) and its chat
//! template (Jinja, rendered with minijinja the way transformers renders it).
//!
//! Invariants:
//! - HT-1: the chat template is `chat_template.jinja` when present, else
//!   `tokenizer_config.json`'s `chat_template` (a string, or the entry named `default` of a
//!   list), exactly as transformers picks it.
//! - HT-2: templates render with `trim_blocks` and `lstrip_blocks`, Python string methods
//!   (`strip`, `startswith`, `split`, …), `raise_exception(msg)` as an error, `tojson` (as
//!   transformers' `json.dumps`: key order kept, `", "`/`": "` separators, `indent=N`) and
//!   `strftime_now(format)` (today's local date, as transformers provides it), with
//!   `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and the template kwargs
//!   (`model.chat_template_kwargs`, e.g. `enable_thinking`; verl's
//!   `data.apply_chat_template_kwargs`) in the context. A kwarg named like a built-in
//!   variable overrides it (`date_string` pins Llama 3's date).
//! - HT-3: the chat template renders messages; it never re-renders an episode's history
//!   (token-in/token-out, CC-2).
//! - HT-4 (stop tokens): the ids that end a turn are the union of the tokenizer's eos token
//!   and the `eos_token_id` (one id or a list) of config.json and generation_config.json, as
//!   transformers' `generate` stops on them. A checkpoint carries them folded into its
//!   tokenizer_config.json as `keel_stop_token_ids` (with the chat template, HT-1).

use std::path::Path;

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde_json::Value;

use super::error::HfError;

/// The tokenizer file of a Hugging Face folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The tokenizer settings (special tokens, chat template) of a Hugging Face folder.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// The key under which a checkpoint's tokenizer_config.json carries the model's stop token
/// ids (HT-4).
pub const STOP_IDS_KEY: &str = "keel_stop_token_ids";

/// Reads `dir/name`, `None` when it does not exist.
fn read_optional(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, HfError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(HfError::io(&path, e)),
    }
}

/// Parses `dir/name` as JSON, `Null` when it does not exist.
fn read_json(dir: &Path, name: &str) -> Result<Value, HfError> {
    match read_optional(dir, name)? {
        Some(b) => serde_json::from_slice(&b).map_err(|source| HfError::Json {
            path: dir.join(name),
            source,
        }),
        None => Ok(Value::Null),
    }
}

/// The `eos_token_id` ids (one id or a list) of a config.json or generation_config.json.
fn eos_ids_of(v: &Value) -> Vec<u32> {
    let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    match v.get("eos_token_id") {
        Some(Value::Array(list)) => list.iter().filter_map(one).collect(),
        Some(x) => one(x).into_iter().collect(),
        None => Vec::new(),
    }
}

/// The stop ids that config.json and generation_config.json of `dir` name (HT-4).
pub fn folder_stop_ids(dir: &Path) -> Result<Vec<u32>, HfError> {
    let mut ids = eos_ids_of(&read_json(dir, "config.json")?);
    ids.extend(eos_ids_of(&read_json(dir, "generation_config.json")?));
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The tokenizer files of model folder `dir` as a checkpoint carries them: `tokenizer.json`
/// and `tokenizer_config.json`, with `chat_template.jinja` (when present) folded into the
/// config's `chat_template` (HT-1) and the folder's stop ids into `keel_stop_token_ids`
/// (HT-4), so that the pair is self-contained.
pub fn folder_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, HfError> {
    let tokenizer = read_optional(dir, TOKENIZER_FILE)?
        .ok_or_else(|| HfError::Tokenizer(format!("{} has no {TOKENIZER_FILE}", dir.display())))?;
    let mut cfg = match read_json(dir, TOKENIZER_CONFIG_FILE)? {
        Value::Null => Value::Object(Default::default()),
        v => v,
    };
    let template = match read_optional(dir, "chat_template.jinja")? {
        Some(jinja) => Some(
            String::from_utf8(jinja)
                .map_err(|e| HfError::Tokenizer(format!("chat_template.jinja: {e}")))?,
        ),
        None => None,
    };
    let stop_ids = folder_stop_ids(dir)?;
    if let Value::Object(map) = &mut cfg {
        if let Some(text) = template {
            map.insert("chat_template".into(), Value::String(text));
        }
        if !stop_ids.is_empty() {
            map.insert(STOP_IDS_KEY.into(), serde_json::json!(stop_ids));
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

/// `strftime_now(format)` of transformers' template context: the local date and time in a
/// strftime `format`; a format chrono cannot write is a template error, never a panic.
fn strftime_now(format: String) -> Result<String, JinjaError> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        )
    })?;
    Ok(out)
}

/// Python's `json.dumps` separators with no indent: `", "` between items, `": "` after keys.
struct PythonCompact;

/// `", "` before every item but the first.
fn comma<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        comma(w, first)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        comma(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// transformers' `tojson` filter (`json.dumps(x, ensure_ascii=False, indent=indent)`): keys in
/// their order, non-ASCII kept, Python's separators, nothing HTML-escaped (HT-2).
fn tojson(value: minijinja::Value, kwargs: minijinja::value::Kwargs) -> Result<String, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &value,
                &mut serde_json::Serializer::with_formatter(&mut out, fmt),
            )
        }
        None => serde::Serialize::serialize(
            &value,
            &mut serde_json::Serializer::with_formatter(&mut out, PythonCompact),
        ),
    };
    written.map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    String::from_utf8(out)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// One chat message.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant message's function calls (`{"type": "function", "function": {"name",
    /// "arguments"}}`), which the template renders in its own format; absent when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
            tool_calls: Vec::new(),
        }
    }
}

/// A loaded tokenizer with its chat template and special tokens.
pub struct HfTokenizer {
    tok: tokenizers::Tokenizer,
    template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The config files' eos ids (HT-4), without the tokenizer's own eos token.
    config_stop_ids: Vec<u32>,
    /// Extra template variables (HT-2).
    template_kwargs: serde_json::Map<String, Value>,
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
    /// Loads `dir/tokenizer.json`, `dir/tokenizer_config.json`, the chat template (HT-1) and
    /// the stop ids of `dir`'s config files (HT-4).
    pub fn load(dir: &Path) -> Result<Self, HfError> {
        let path = dir.join(TOKENIZER_FILE);
        let tok = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| tok_err(&path.display().to_string(), e))?;
        let mut cfg = read_json(dir, TOKENIZER_CONFIG_FILE)?;
        let jinja = dir.join("chat_template.jinja");
        let template = if jinja.exists() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| HfError::io(&jinja, e))?)
        } else {
            None
        };
        if let Value::Object(map) = &mut cfg {
            map.insert(
                STOP_IDS_KEY.into(),
                serde_json::json!(folder_stop_ids(dir)?),
            );
        } else {
            cfg = serde_json::json!({ STOP_IDS_KEY: folder_stop_ids(dir)? });
        }
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
        let config_stop_ids = cfg
            .get(STOP_IDS_KEY)
            .and_then(Value::as_array)
            .map(|ids| {
                ids.iter()
                    .filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect()
            })
            .unwrap_or_default();
        HfTokenizer {
            tok,
            template,
            bos_token: special(cfg, "bos_token"),
            eos_token: special(cfg, "eos_token"),
            config_stop_ids,
            template_kwargs: serde_json::Map::new(),
        }
    }

    /// The same tokenizer rendering its chat template with the extra variables `kwargs`
    /// (HT-2), e.g. `{"enable_thinking": false}`.
    pub fn with_template_kwargs(mut self, kwargs: serde_json::Map<String, Value>) -> Self {
        self.template_kwargs = kwargs;
        self
    }

    /// The turn-ending ids (HT-4): the eos token's id first (when in the vocabulary), then the
    /// config files' other eos ids, each once.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .eos_token
            .as_deref()
            .and_then(|t| self.token_id(t))
            .into_iter()
            .collect();
        for &id in &self.config_stop_ids {
            if !ids.contains(&id) && (id as usize) < self.vocab_size() {
                ids.push(id);
            }
        }
        ids
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
        self.apply_chat_template_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders the chat template with `tools` (OpenAI function schemas, as transformers'
    /// `apply_chat_template(tools=...)`; none = the variable is undefined) (HT-2).
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
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
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template("chat", template)
            .map_err(|e| tok_err("chat template", e))?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| tok_err("chat template", e))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).map_err(|e| tok_err("messages", e))?,
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );
        ctx.insert(
            "bos_token".into(),
            Value::String(self.bos_token.clone().unwrap_or_default()),
        );
        ctx.insert(
            "eos_token".into(),
            Value::String(self.eos_token.clone().unwrap_or_default()),
        );
        if !tools.is_empty() {
            ctx.insert("tools".into(), Value::Array(tools.to_vec()));
        }
        for (k, v) in &self.template_kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        let ctx = minijinja::Value::from_serialize(&ctx);
        tmpl.render(ctx).map_err(|e| tok_err("chat template", e))
    }
}
