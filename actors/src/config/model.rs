//! `[model]` and `[model.lora]`: a Hugging Face model folder (`path`), or the built-in tiny
//! Llama-shaped model (vocabulary from the env, MD-1), and the LoRA adapters trained on it.
//!
//! Invariants:
//! - CM-1: the built-in model's `d_model` splits into `n_head` heads of even width (RoPE
//!   rotates pairs of channels).

use serde::{Deserialize, Serialize};

use super::key::{at_least, ints, Bound, Key, Range, POSITIVE};
use super::ConfigError;

/// `[model]`: a Hugging Face model folder (`path`), or the built-in tiny Llama-shaped model
/// (vocabulary from the env, MD-1).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A Hugging Face model folder to train; empty = the built-in tiny model.
    pub path: String,
    /// Parameter kind: `float32`, or `bfloat16` (bf16 weights and activations, f32 master
    /// weights and optimizer state).
    pub dtype: String,
    /// Folder of the separate critic's first weights (its trunk; a `score` head in it is kept,
    /// else it starts at zero); empty = a copy of the policy at the first update.
    pub critic_path: String,
    /// Longest token sequence (prompt + all turns).
    pub context_len: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// Attention heads (must divide d_model).
    pub n_head: usize,
    /// `[model.lora]`: LoRA adapters on the frozen model (rank 0 = full fine-tuning).
    pub lora: LoraSection,
    /// Extra variables of the chat template (HT-2), e.g. `enable_thinking = false`.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// How turn-by-turn rendering must agree with the whole conversation's (CC-5).
    pub chat_template_check: keel_learner::hf::TemplateCheck,
}

/// `[model.lora]`: train low-rank adapters instead of the whole model (verl's `lora_rank`,
/// `lora_alpha`, `target_modules`; PEFT's `lora_dropout`). `rank = 0` trains every weight.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// Adapter rank; 0 = no adapters (full fine-tuning).
    pub rank: usize,
    /// Scaling numerator: the update is `B A x · alpha / rank`.
    pub alpha: f64,
    /// Dropout on the adapters' input during training.
    pub dropout: f64,
    /// Linear modules that get adapters: names or suffixes, or `all-linear`.
    pub target_modules: Vec<String>,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            rank: 0,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: vec![keel_learner::hf::lora::ALL_LINEAR.to_string()],
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: String::new(),
            dtype: "float32".into(),
            critic_path: String::new(),
            context_len: 64,
            n_layer: 2,
            d_model: 64,
            n_head: 4,
            lora: LoraSection::default(),
            chat_template_kwargs: serde_json::Map::new(),
            chat_template_check: keel_learner::hf::TemplateCheck::default(),
        }
    }
}

const DTYPE: Key = Key::new("model.dtype", Range::Words(&["float32", "bfloat16"]), "Parameter and activation kind of every model. bfloat16 keeps f32 master weights and AdamW moments in the optimizer (the bf16 weights are the master rounded), so small updates are not lost; log-softmax and values are taken in f32.");
/// `model.context_len` (also bounded by the env's horizon and the machine, VB-2/4).
pub const CONTEXT_LEN: Key = Key::with_also("model.context_len", ints(16, 1 << 20), ">= the env's horizon, <= the model folder's positions; with the model, and with a generator's KV cache (keys and values of every layer for min(episodes per batch, 256) + 1 sequences of this length), fits the machine's memory", "Longest token sequence (prompt + all turns): every episode ends truncated (reward 0) before it would pass it, an observation past it is cut, and an episode whose first prompt leaves no room for a turn is dropped and counted (RO-11). The tiny Llama model's max_position_embeddings. With `--model DIR` and no value in the config file it defaults to the folder's max_position_embeddings.");
const N_LAYER: Key = Key::new(
    "model.n_layer",
    ints(1, 1 << 10),
    "Decoder layers of the built-in tiny Llama-shaped model.",
);
const D_MODEL: Key = Key::with_also(
    "model.d_model",
    ints(8, 1 << 16),
    "a multiple of model.n_head; 16 bytes per parameter fit the machine's memory",
    "Hidden size (the SwiGLU MLP is 4x as wide).",
);
const N_HEAD: Key = Key::with_also(
    "model.n_head",
    ints(1, 1 << 10),
    "splits model.d_model into heads of even width",
    "Attention heads (as many key/value heads); d_model / n_head must be even.",
);

/// The keys of `[model]` and `[model.lora]`.
pub const KEYS: &[Key] = &[
    Key::new("model.path", Range::Text("a Hugging Face model folder (local or s3://), or empty"), "The model to train (config.json, safetensors, tokenizer.json with a chat template; `keel train --model DIR`); an s3:// folder is synced into $KEEL_MODEL_CACHE (default ~/.cache/keel/models) with checksums first; empty trains the built-in tiny Llama-shaped model over the env's vocabulary (model.n_layer, d_model, n_head)."),
    DTYPE,
    Key::new("model.critic_path", Range::Text("a Hugging Face model folder (local or s3://), or empty"), "First weights of the separate critic (learner.critic_model = \"separate\", SAO's default; `keel train --critic DIR`): its trunk, and its score head when present (else zero). Empty = a copy of the policy's trunk at the first RL update. Its vocab_size must cover the policy's."),
    Key::new("model.lora.rank", at_least(0), "LoRA (0 = off): rank of the adapters on the frozen model; 0 trains every weight. With adapters only they (and a shared value head) train, the optimizer holds only their state, checkpoints and the weight board carry only them (plus the base model's hash in learner.json), and the KL reference is the base with adapters off. `keel ckpt export` merges them into a plain folder; `--peft` writes adapter_config.json + adapter_model.safetensors instead."),
    Key::new("model.lora.alpha", POSITIVE, "LoRA scaling: the update is (B A x) * alpha / rank, as PEFT's lora_alpha."),
    Key::new("model.lora.dropout", Range::Real { lo: Bound::Closed(0.0), hi: Bound::Open(1.0) }, "LoRA dropout on the adapters' input in training forwards (masks seeded per step, so resumes are exact); must be 0 with learner.activation_checkpointing."),
    Key::new("model.lora.target_modules", Range::Text("module names or suffixes (q_proj, self_attn.v_proj, ...) or [\"all-linear\"]"), "Which linear modules get adapters, matched as PEFT does (a module's full name equals the entry or ends with .entry); an entry matching no module is an error listing the model's linear modules."),
    CONTEXT_LEN,
    Key::new("model.chat_template_kwargs", Range::Text("a table of template variables"), "Extra variables the chat template is rendered with, as transformers' apply_chat_template(**kwargs) and verl's data.apply_chat_template_kwargs: e.g. `enable_thinking = false` for Qwen3, `date_string = \"26 Jul 2024\"` to pin Llama 3's date (templates calling strftime_now get today's date otherwise)."),
    Key::new("model.chat_template_check", Range::Words(&["strict", "template", "off"]), "How turn-by-turn rendering (token-in/token-out: each observation is the template's rendering of the new turn alone, appended to the sampled tokens, as verl's agent loop) must agree with rendering the whole conversation, probed at start-up (CC-5): `strict` = identical; `template` = identical except the template's own text around earlier assistant turns (Qwen3 drops their <think> block once a user turn follows); `off` = no check. A template that fails is refused before anything runs."),
    N_LAYER,
    D_MODEL,
    N_HEAD,
];

impl ModelSection {
    /// Checks `[model]`'s own keys (the built-in model's shape, CM-1); LoRA is checked by the
    /// learner crate's own type (`TrainConfig::validate`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.kind()?;
        CONTEXT_LEN.check_int(self.context_len as u64)?;
        N_LAYER.check_int(self.n_layer as u64)?;
        N_HEAD.check_int(self.n_head as u64)?;
        D_MODEL.check_int(self.d_model as u64)?;
        if !self.d_model.is_multiple_of(self.n_head) {
            return Err(D_MODEL.error(format!(
                "must be a multiple of model.n_head ({}), got {}",
                self.n_head, self.d_model
            )));
        }
        if !(self.d_model / self.n_head).is_multiple_of(2) {
            return Err(N_HEAD.error(format!(
                "must split model.d_model ({}) into heads of even width (RoPE), got {}",
                self.d_model, self.n_head
            )));
        }
        Ok(())
    }

    /// The parameter kind of `model.dtype` (`f32` and `bf16` are accepted spellings).
    pub fn kind(&self) -> Result<tch::Kind, ConfigError> {
        match self.dtype.as_str() {
            "float32" | "f32" => Ok(tch::Kind::Float),
            "bfloat16" | "bf16" => Ok(tch::Kind::BFloat16),
            other => DTYPE.check_word(other).map(|()| tch::Kind::Float),
        }
    }
}
