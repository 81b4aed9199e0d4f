//! What a run allocates, bounded from its config before anything is written (issue 32 item 6).
//!
//! Invariants:
//! - VB-1: every key that sizes an allocation has a hard cap ([`SIZE_CAPS`], and episodes per
//!   batch = `rollout.tasks_per_batch × rollout.group_size` at most [`MAX_EPISODES_PER_BATCH`]),
//!   so no product of keys can overflow and no count can ask for terabytes; the caps are orders
//!   of magnitude above any run keel can serve on one machine.
//! - VB-2: a lower bound of the learner's peak host memory — f32 weights, gradients and Adam's
//!   two moments of every parameter (16 bytes each), plus one sequence's activations and
//!   logits — must fit the machine's memory (`MemTotal` of /proc/meminfo; skipped where it
//!   cannot be read). It is a lower bound: a config it refuses cannot run; one it passes may
//!   still need more.
//! - VB-3: `run.threads` is at most [`THREADS_PER_CORE`] × the machine's cores (and fits
//!   torch's `i32`).
//!
//! Validation (`TrainConfig::validate`, CF-3) runs these checks on the built-in model's shape;
//! `TrainConfig::preflight` runs VB-2 again with a model folder's own shape.

use crate::config::{ConfigError, TrainConfig};

/// The largest value each size key may take (VB-1).
pub const SIZE_CAPS: [(&str, u64); 14] = [
    ("model.context_len", 1 << 20),
    ("model.d_model", 1 << 16),
    ("model.n_layer", 1 << 10),
    ("model.n_head", 1 << 10),
    ("sft.batch_size", 1 << 16),
    ("sft.demos", 10_000_000),
    ("rollout.tasks_per_batch", 1 << 16),
    ("rollout.group_size", 1 << 10),
    ("rollout.max_turn_tokens", 1 << 20),
    ("rollout.generators", 1 << 10),
    ("rollout.env_shards", 1 << 10),
    ("rollout.eval_tasks", 1_000_000),
    ("env.concurrency", 1 << 16),
    ("run.steps", 1 << 40),
];

/// The most episodes one batch may hold (VB-1): `rollout.tasks_per_batch × rollout.group_size`.
pub const MAX_EPISODES_PER_BATCH: u64 = 1 << 16;

/// `run.threads` may be at most this many threads per core of the machine (VB-3).
pub const THREADS_PER_CORE: usize = 4;

/// The shape VB-2 estimates memory from.
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
        }
    }

    /// A model folder's shape.
    pub fn of_folder(hf: &keel_learner::hf::HfConfig) -> Self {
        ModelShape {
            params: hf.n_params() as f64,
            hidden: hf.hidden_size as f64,
            layers: hf.num_hidden_layers as f64,
            vocab: hf.vocab_size as f64,
        }
    }

    /// VB-2's lower bound of the learner's peak memory, in bytes, at `context_len` tokens.
    pub fn min_bytes(&self, context_len: usize) -> f64 {
        let states = 16.0 * self.params;
        let sequence = context_len as f64 * (8.0 * self.layers * self.hidden + self.vocab) * 4.0;
        states + sequence
    }
}

fn too_big(key: &str, reason: String) -> ConfigError {
    ConfigError::OutOfRange {
        key: key.into(),
        reason,
    }
}

/// The value of size key `key` in `cfg`.
fn size_of(cfg: &TrainConfig, key: &str) -> u64 {
    let (m, s, r) = (&cfg.model, &cfg.sft, &cfg.rollout);
    let v = match key {
        "model.context_len" => m.context_len,
        "model.d_model" => m.d_model,
        "model.n_layer" => m.n_layer,
        "model.n_head" => m.n_head,
        "sft.batch_size" => s.batch_size,
        "sft.demos" => s.demos,
        "rollout.tasks_per_batch" => r.tasks_per_batch,
        "rollout.group_size" => r.group_size,
        "rollout.max_turn_tokens" => r.max_turn_tokens,
        "rollout.generators" => r.generators,
        "rollout.env_shards" => r.env_shards,
        "rollout.eval_tasks" => r.eval_tasks,
        "env.concurrency" => cfg.env.concurrency,
        "run.steps" => return cfg.run.steps,
        _ => 0,
    };
    v as u64
}

/// VB-1 and VB-3: the caps of every size key and of `run.threads`.
pub fn check_caps(cfg: &TrainConfig) -> Result<(), ConfigError> {
    for (key, cap) in SIZE_CAPS {
        let v = size_of(cfg, key);
        if v > cap {
            return Err(too_big(key, format!("must be at most {cap}, got {v}")));
        }
    }
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

/// VB-2: the learner's lower-bound peak memory for `shape` fits `memory` bytes.
pub fn check_memory(cfg: &TrainConfig, shape: &ModelShape, memory: f64) -> Result<(), ConfigError> {
    let need = shape.min_bytes(cfg.model.context_len);
    if need > memory {
        let gib = |b: f64| b / f64::from(1u32 << 30);
        return Err(too_big(
            "model",
            format!(
                "a model of {:.3e} parameters at model.context_len = {} needs at least {:.1} GiB \
                 (f32 weights, gradients and Adam moments, one sequence's activations); this \
                 machine has {:.1} GiB",
                shape.params,
                cfg.model.context_len,
                gib(need),
                gib(memory)
            ),
        ));
    }
    Ok(())
}

/// VB-1..3 on the built-in model's shape (what `TrainConfig::validate` runs).
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
        };
        let c = TrainConfig::default();
        assert!(check_memory(&c, &small, 1e12).is_ok());
        assert!(check_memory(&c, &small, 1e6).is_err());
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
