//! What a run allocates, bounded from its config before anything is written (issue 32 item 6).
//!
//! Invariants:
//! - VB-1: every key that sizes an allocation has a hard cap (the maximum of its declared range,
//!   `config::key::Range::Int`, checked by its section; and episodes per
//!   batch = `rollout.tasks_per_batch × rollout.group_size` at most [`MAX_EPISODES_PER_BATCH`]),
//!   so no product of keys can overflow and no count can ask for terabytes; the caps are orders
//!   of magnitude above any run keel can serve on one machine.
//! - VB-2: a lower bound of the learner's peak host memory — f32 weights, gradients and Adam's
//!   two moments of every parameter (16 bytes each; with `[model.lora]` only the frozen base's
//!   weights at `model.dtype`, since the adapters are tiny), plus one sequence's activations and
//!   logits — must fit the machine's memory (`MemTotal` of /proc/meminfo; skipped where it
//!   cannot be read). It is a lower bound: a config it refuses cannot run; one it passes may
//!   still need more.
//! - VB-3: `run.threads` is at most [`THREADS_PER_CORE`] × the machine's cores (and fits
//!   torch's `i32`).
//! - VB-4: the KV cache a generator allocates up front for one batch — `2 · layers · (slots + 1)
//!   · model.context_len · KV width` elements at `model.dtype`, slots = episodes per batch
//!   (`rollout.tasks_per_batch × rollout.group_size`) at most [`MAX_SAMPLER_SLOTS`], as
//!   `learner::hf::KvCache::new` allocates it for `actors::rollout`'s sampler — must fit the
//!   machine's memory on its own (it lives wherever a generator runs, so it is not added to
//!   VB-2's learner bound, which a `keel trainer` holds on another machine).
//!
//! Validation (`TrainConfig::validate`, CF-3) runs these checks on the built-in model's shape;
//! `TrainConfig::preflight` runs VB-2 and VB-4 again with a model folder's own shape.

use crate::config::{ConfigError, TrainConfig};

/// The most episodes one batch may hold (VB-1): `rollout.tasks_per_batch × rollout.group_size`.
pub const MAX_EPISODES_PER_BATCH: u64 = 1 << 16;

/// `run.threads` may be at most this many threads per core of the machine (VB-3).
pub const THREADS_PER_CORE: usize = 4;

/// The most sequences one sampler decodes at once (VB-4): `actors::rollout`'s
/// `MAX_SAMPLER_SLOTS`, which sizes the generator's KV cache.
pub const MAX_SAMPLER_SLOTS: u64 = 256;

/// The shape VB-2 and VB-4 estimate memory from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    /// Scalar parameters.
    pub params: f64,
    /// Hidden width.
    pub hidden: f64,
    /// Layers.
    pub layers: f64,
    /// Vocabulary (0 when not known yet: the built-in model's comes from the env).
    pub vocab: f64,
    /// Width of one position's keys (= of its values): key/value heads × head width.
    pub kv_width: f64,
}

impl ModelShape {
    /// The built-in model's shape (SwiGLU MLP of width 4·d: 16·d² per layer), vocabulary left
    /// out.
    pub fn tiny(cfg: &TrainConfig) -> Self {
        let (d, l) = (cfg.model.d_model as f64, cfg.model.n_layer as f64);
        ModelShape {
            params: 16.0 * d * d * l,
            hidden: d,
            layers: l,
            vocab: 0.0,
            // As many key/value heads as heads (`TinyShape::hf_config`): keys are d wide.
            kv_width: d,
        }
    }

    /// A model folder's shape.
    pub fn of_folder(hf: &keel_learner::hf::HfConfig) -> Self {
        ModelShape {
            params: hf.n_params() as f64,
            hidden: hf.hidden_size as f64,
            layers: hf.num_hidden_layers as f64,
            vocab: hf.vocab_size as f64,
            kv_width: (hf.num_key_value_heads * hf.head_dim) as f64,
        }
    }

    /// VB-2's lower bound of the learner's peak memory, in bytes, for `cfg`'s context length,
    /// dtype and LoRA setting.
    pub fn min_bytes(&self, cfg: &TrainConfig) -> f64 {
        let states = if cfg.lora_config().is_some() {
            element_bytes(cfg) * self.params
        } else {
            16.0 * self.params
        };
        let sequence =
            cfg.model.context_len as f64 * (8.0 * self.layers * self.hidden + self.vocab) * 4.0;
        states + sequence
    }

    /// VB-4: the bytes of the KV cache one generator allocates for a batch of `cfg` (0 when the
    /// run samples no training batch).
    pub fn kv_cache_bytes(&self, cfg: &TrainConfig) -> f64 {
        if cfg.run.steps == 0 {
            return 0.0;
        }
        let episodes = cfg.rollout.tasks_per_batch as u64 * cfg.rollout.group_size as u64;
        let slots = episodes.clamp(1, MAX_SAMPLER_SLOTS) + 1;
        2.0 * self.layers
            * slots as f64
            * cfg.model.context_len as f64
            * self.kv_width
            * element_bytes(cfg)
    }
}

/// Bytes of one weight or activation element at `model.dtype` (bf16: 2, else f32: 4).
fn element_bytes(cfg: &TrainConfig) -> f64 {
    match cfg.model.dtype.as_str() {
        "bfloat16" | "bf16" => 2.0,
        _ => 4.0,
    }
}

fn too_big(key: &str, reason: String) -> ConfigError {
    ConfigError::OutOfRange {
        key: key.into(),
        reason,
    }
}

/// VB-1 and VB-3: the cap of episodes per batch and of `run.threads` (each size key's own cap
/// is the maximum of its declared range, checked by its section).
pub fn check_caps(cfg: &TrainConfig) -> Result<(), ConfigError> {
    let (tasks, group) = (
        cfg.rollout.tasks_per_batch as u64,
        cfg.rollout.group_size as u64,
    );
    if tasks * group > MAX_EPISODES_PER_BATCH {
        return Err(too_big(
            "rollout.group_size",
            format!(
                "rollout.tasks_per_batch × rollout.group_size ({tasks} × {group}) must be at most \
                 {MAX_EPISODES_PER_BATCH} episodes per batch"
            ),
        ));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limit = (THREADS_PER_CORE * cores).min(i32::MAX as usize);
    if cfg.run.threads > limit {
        return Err(too_big(
            "run.threads",
            format!(
                "must be at most {limit} ({THREADS_PER_CORE} × the {cores} cores of this \
                 machine; 0 = torch's default), got {}",
                cfg.run.threads
            ),
        ));
    }
    Ok(())
}

/// The machine's memory in bytes (`MemTotal`), where /proc/meminfo can be read.
pub fn machine_memory() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

/// VB-2 and VB-4: the learner's lower-bound peak memory and one generator's KV cache for
/// `shape` each fit `memory` bytes.
pub fn check_memory(cfg: &TrainConfig, shape: &ModelShape, memory: f64) -> Result<(), ConfigError> {
    let gib = |b: f64| b / f64::from(1u32 << 30);
    let need = shape.min_bytes(cfg);
    if need > memory {
        let states = if cfg.lora_config().is_some() {
            "the frozen weights"
        } else {
            "f32 weights, gradients and Adam moments"
        };
        return Err(too_big(
            "model",
            format!(
                "a model of {:.3e} parameters at model.context_len = {} needs at least {:.1} GiB \
                 ({states}, one sequence's activations); this machine has {:.1} GiB",
                shape.params,
                cfg.model.context_len,
                gib(need),
                gib(memory)
            ),
        ));
    }
    let kv = shape.kv_cache_bytes(cfg);
    if kv > memory {
        let episodes = cfg.rollout.tasks_per_batch as u64 * cfg.rollout.group_size as u64;
        return Err(too_big(
            "model.context_len",
            format!(
                "{} is too long for the KV cache a generator allocates: {} tokens × {} \
                 sequences (the {episodes} episodes of rollout.tasks_per_batch × \
                 rollout.group_size, at most {MAX_SAMPLER_SLOTS}, plus one) × {} layers need \
                 {:.1} GiB; this machine has {:.1} GiB (lower model.context_len or the \
                 episodes per batch, or use model.dtype = \"bfloat16\")",
                cfg.model.context_len,
                cfg.model.context_len,
                episodes.clamp(1, MAX_SAMPLER_SLOTS) + 1,
                shape.layers,
                gib(kv),
                gib(memory)
            ),
        ));
    }
    Ok(())
}

/// VB-1..4 on the built-in model's shape (what `TrainConfig::validate` runs).
pub fn check(cfg: &TrainConfig) -> Result<(), ConfigError> {
    check_caps(cfg)?;
    if cfg.model.path.is_empty() {
        if let Some(memory) = machine_memory() {
            check_memory(cfg, &ModelShape::tiny(cfg), memory)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(cfg: &TrainConfig) -> String {
        match cfg.validate() {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted: {cfg:?}"),
        }
    }

    #[test]
    fn vb1_absurd_sizes_are_refused_naming_their_key() {
        let mut c = TrainConfig::default();
        c.rollout.group_size = 100_000;
        assert!(
            refused(&c).contains("rollout.group_size"),
            "{}",
            refused(&c)
        );
        let mut c = TrainConfig::default();
        c.sft.demos = 1_000_000_000_000;
        assert!(refused(&c).contains("sft.demos"));
        let mut c = TrainConfig::default();
        c.rollout.eval_tasks = 1_000_000_000_000;
        assert!(refused(&c).contains("rollout.eval_tasks"));
        let mut c = TrainConfig::default();
        c.rollout.tasks_per_batch = 4096;
        c.rollout.group_size = 64;
        assert!(
            refused(&c).contains("episodes per batch"),
            "{}",
            refused(&c)
        );
    }

    #[test]
    fn vb2_a_model_larger_than_memory_is_refused() {
        let mut c = TrainConfig::default();
        c.model.d_model = 1 << 16;
        c.model.n_head = 1 << 8;
        c.model.n_layer = 1 << 10;
        let text = refused(&c);
        assert!(
            text.contains("needs at least") && text.contains("GiB"),
            "{text}"
        );
        // The shape of a real folder counts its vocabulary too.
        let small = ModelShape {
            params: 1e6,
            hidden: 64.0,
            layers: 2.0,
            vocab: 50_000.0,
            kv_width: 64.0,
        };
        let c = TrainConfig::default();
        assert!(check_memory(&c, &small, 1e12).is_ok());
        assert!(check_memory(&c, &small, 1e6).is_err());
    }

    /// A 1.5e9-parameter model (Qwen2.5-1.5B's shape) on a 23 GiB machine.
    fn qwen_1_5b() -> ModelShape {
        ModelShape {
            params: 1.54e9,
            hidden: 1536.0,
            layers: 28.0,
            vocab: 151_936.0,
            kv_width: 256.0,
        }
    }

    #[test]
    fn vb2_lora_counts_only_the_frozen_weights() {
        let memory = 23.0 * f64::from(1u32 << 30);
        let mut c = TrainConfig::default();
        c.model.context_len = 1024;
        c.rollout.tasks_per_batch = 4;
        c.rollout.group_size = 4;
        let full = check_memory(&c, &qwen_1_5b(), memory).map(|_| ());
        assert!(
            full.as_ref()
                .is_err_and(|e| e.to_string().contains("Adam moments")),
            "{full:?}"
        );
        c.model.lora.rank = 8;
        assert!(check_memory(&c, &qwen_1_5b(), memory).is_ok());
        c.model.dtype = "bfloat16".into();
        assert_eq!(
            qwen_1_5b().min_bytes(&c),
            2.0 * 1.54e9 + 1024.0 * (8.0 * 28.0 * 1536.0 + 151_936.0) * 4.0
        );
    }

    #[test]
    fn vb4_a_kv_cache_larger_than_memory_is_refused_naming_the_context() {
        // KvCache::new's size for 16 episodes: 2 · layers · 17 slots · context · kv width · 4 B.
        let mut c = TrainConfig::default();
        c.model.context_len = 4096;
        c.rollout.tasks_per_batch = 4;
        c.rollout.group_size = 4;
        assert_eq!(
            qwen_1_5b().kv_cache_bytes(&c),
            2.0 * 28.0 * 17.0 * 4096.0 * 256.0 * 4.0
        );
        // More episodes than a sampler's slots: the slots bound it.
        c.rollout.group_size = 1024;
        assert_eq!(
            qwen_1_5b().kv_cache_bytes(&c),
            2.0 * 28.0 * 257.0 * 4096.0 * 256.0 * 4.0
        );
        // The built-in model at a long context: the learner's bound fits 64 GiB, the cache
        // (2 · 8 · 257 · 131072 · 256 · 4 B = 514 GiB) does not.
        let memory = 64.0 * f64::from(1u32 << 30);
        c.model.context_len = 131_072;
        (c.model.d_model, c.model.n_layer, c.model.n_head) = (256, 8, 4);
        c.rollout.group_size = 64;
        let tiny = ModelShape::tiny(&c);
        assert!(tiny.min_bytes(&c) < memory);
        let text = check_memory(&c, &tiny, memory)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            text.contains("model.context_len")
                && text.contains("KV cache")
                && text.contains("514.0 GiB"),
            "{text}"
        );
        // No training batch, no cache.
        c.run.steps = 0;
        assert!(check_memory(&c, &tiny, memory).is_ok());
    }

    #[test]
    fn vb3_threads_are_bounded_by_the_machine() {
        let mut c = TrainConfig::default();
        c.run.threads = 1 << 31;
        assert!(refused(&c).contains("run.threads"));
        c.run.threads = 1;
        assert!(c.validate().is_ok());
    }
}
