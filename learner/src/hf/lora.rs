//! LoRA adapters on the decoder's linear layers, in PEFT's layout and arithmetic, so a keel
//! adapter is a PEFT adapter and back.
//!
//! A targeted linear layer `y = x Wᵀ + b` becomes `y = x Wᵀ + b + (drop(x) Aᵀ) Bᵀ · α / r` with
//! `A` `[r, in]` and `B` `[out, r]`, named `<module>.lora_A.weight` / `<module>.lora_B.weight`
//! (PEFT's names without the `base_model.model.` prefix its files add).
//!
//! Invariants:
//! - LO-1 (targets): a `target_modules` entry selects every linear module whose full name equals
//!   it or ends with `.<entry>` (PEFT's rule); `all-linear` selects every linear module of the
//!   decoder (never the LM head). An entry that selects nothing is an error listing the
//!   model's linear modules.
//! - LO-2 (init, PEFT's default): `A` ~ U(−1/√in, 1/√in) (kaiming-uniform with a = √5) drawn
//!   from a ChaCha8 stream seeded with `seed`, in module order; `B` = 0. A fresh adapter
//!   therefore leaves every output exactly the base model's.
//! - LO-3 (precision): adapters are f32 whatever the base kind (PEFT's
//!   `autocast_adapter_dtype`); the update is computed in f32 and added to the base output
//!   before rounding to the activation kind.
//! - LO-4 (frozen base): with adapters, every base parameter has `requires_grad = false`; only
//!   adapters (and a value head, PEFT's `modules_to_save`) are trained, so the optimizer holds
//!   only their state. The base's content hash ([`HfModel::base_hash`]) identifies it in
//!   checkpoints, which store only the trained parameters.
//! - LO-5 (dropout): dropout applies only in a training forward ([`HfModel::train_pass`]); its
//!   masks come from torch's generator, which the learner seeds per step, so a resumed run
//!   draws the same masks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use super::error::HfError;
use super::layers::Linear;
use super::model::HfModel;

/// The linear modules of a decoder layer, in the order adapters are initialised (LO-2).
pub const LINEAR_MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// The `target_modules` entry that selects every linear module (LO-1).
pub const ALL_LINEAR: &str = "all-linear";

/// `[model.lora]`: rank, scaling, dropout and which modules get adapters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Adapter rank `r`.
    pub rank: usize,
    /// `α`: the update is scaled by `α / r`.
    pub alpha: f64,
    /// Dropout on the adapter's input in training forwards.
    pub dropout: f64,
    /// Module names or suffixes (`q_proj`, `self_attn.v_proj`, …) or `all-linear` (LO-1).
    pub target_modules: Vec<String>,
    /// Seed of `A`'s initialisation (LO-2).
    pub seed: u64,
}

impl LoraConfig {
    /// Checks the numbers (keys as in `[model.lora]`).
    pub fn validate(&self) -> Result<(), HfError> {
        if self.rank == 0 {
            return Err(bad_key("model.lora.rank", "must be >= 1, got 0"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(bad_key(
                "model.lora.alpha",
                format!("must be finite and > 0, got {}", self.alpha),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(bad_key(
                "model.lora.dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            ));
        }
        if self.target_modules.is_empty() {
            return Err(bad_key(
                "model.lora.target_modules",
                format!("must name at least one module (e.g. [\"q_proj\", \"v_proj\"] or [\"{ALL_LINEAR}\"])"),
            ));
        }
        Ok(())
    }

    /// `α / r`.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the module `name` (e.g. `model.layers.0.self_attn.q_proj`) gets an adapter
    /// (LO-1).
    fn targets(&self, name: &str) -> bool {
        self.target_modules
            .iter()
            .any(|t| t == ALL_LINEAR || name == t || name.ends_with(&format!(".{t}")))
    }

    /// The targeted modules of a model with `layers` decoder layers, in init order (LO-1).
    pub fn resolve(&self, layers: usize) -> Result<Vec<(usize, usize, String)>, HfError> {
        self.validate()?;
        let names: Vec<(usize, usize, String)> = (0..layers)
            .flat_map(|l| {
                LINEAR_MODULES
                    .iter()
                    .enumerate()
                    .map(move |(m, s)| (l, m, format!("model.layers.{l}.{s}")))
            })
            .collect();
        for t in &self.target_modules {
            let probe = LoraConfig {
                target_modules: vec![t.clone()],
                ..self.clone()
            };
            if !names.iter().any(|(_, _, n)| probe.targets(n)) {
                return Err(bad_key(
                    "model.lora.target_modules",
                    format!(
                        "{t:?} selects no linear module of this model; its linear modules are {} (per layer, model.layers.N.<name>) or \"{ALL_LINEAR}\"",
                        LINEAR_MODULES.join(", ")
                    ),
                ));
            }
        }
        Ok(names
            .into_iter()
            .filter(|(_, _, n)| self.targets(n))
            .collect())
    }

    /// PEFT's `adapter_config.json` for these adapters on `base` (a path or hub name).
    pub fn peft_config(&self, base: &str, modules: &[String]) -> Value {
        let mut short: Vec<String> = modules
            .iter()
            .filter_map(|m| m.rsplit('.').next().map(str::to_string))
            .collect();
        short.sort();
        short.dedup();
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": short,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
        })
    }
}

/// One module's adapter (LO-3: f32).
pub(crate) struct Adapter {
    pub(crate) a: Tensor,
    pub(crate) b: Tensor,
}

/// The adapters' settings on a model, and whether they are applied.
pub(crate) struct LoraState {
    pub(crate) cfg: LoraConfig,
    /// False for the base view (the reference policy of a LoRA run): adapters are skipped.
    pub(crate) active: bool,
    /// True during a training forward: dropout applies (LO-5).
    pub(crate) training: AtomicBool,
    /// The base's content hash, computed once (the base never changes, LO-4).
    pub(crate) base_hash: OnceLock<String>,
}

impl LoraState {
    pub(crate) fn new(cfg: LoraConfig, active: bool) -> Self {
        LoraState {
            cfg,
            active,
            training: AtomicBool::new(false),
            base_hash: OnceLock::new(),
        }
    }
}

/// How a linear layer applies its adapter in one forward.
#[derive(Clone, Copy)]
pub(crate) enum AdapterMode {
    /// No adapter (none attached, or the base view).
    Off,
    /// `scaling`, and dropout `p` (0 outside training).
    On { scaling: f64, dropout: f64 },
}

impl Linear {
    /// `x Wᵀ + b`, plus the adapter's update when `mode` says so (LO-3).
    pub(crate) fn forward_with(&self, x: &Tensor, mode: AdapterMode) -> Result<Tensor, HfError> {
        let base = x.f_linear(&self.w, self.b.as_ref())?;
        let (AdapterMode::On { scaling, dropout }, Some(ad)) = (mode, &self.lora) else {
            return Ok(base);
        };
        let mut h = x.f_to_kind(Kind::Float)?;
        if dropout > 0.0 {
            h = h.f_dropout(dropout, true)?;
        }
        let delta = h
            .f_linear(&ad.a, None::<Tensor>)?
            .f_linear(&ad.b, None::<Tensor>)?
            .f_mul_scalar(scaling)?;
        let kind = base.kind();
        Ok(base
            .f_to_kind(Kind::Float)?
            .f_add(&delta)?
            .f_to_kind(kind)?)
    }
}

/// An out-of-range `[model.lora]` key (reported as a config key, not a config.json field).
pub(crate) fn bad_key(key: &str, reason: impl Into<String>) -> HfError {
    HfError::Learner(crate::error::LearnerError::config(key, reason))
}

/// `A`'s initial values (LO-2): U(−1/√in, 1/√in) from `rng`.
fn kaiming_uniform(rng: &mut ChaCha8Rng, rank: i64, inp: i64) -> Result<Tensor, HfError> {
    let bound = 1.0 / (inp as f64).sqrt();
    let values: Vec<f32> = (0..rank * inp)
        .map(|_| ((rng.gen::<f64>() * 2.0 - 1.0) * bound) as f32)
        .collect();
    Ok(Tensor::f_from_slice(&values)?.f_reshape([rank, inp])?)
}

/// Whether a parameter name is an adapter's.
pub fn is_adapter(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

impl HfModel {
    /// Attaches fresh adapters (LO-1, LO-2) and freezes the base (LO-4). The value head, when
    /// there is one, stays trainable.
    pub fn with_lora(mut self, cfg: &LoraConfig) -> Result<Self, HfError> {
        if self.lora.is_some() {
            return Err(HfError::input("this model already has LoRA adapters"));
        }
        let targets = cfg.resolve(self.layers.len())?;
        tch::no_grad(|| -> Result<(), HfError> {
            for (name, t) in self.named_parameters() {
                if !name.starts_with("score.") {
                    let _ = t.shallow_clone().f_requires_grad_(false)?;
                }
            }
            Ok(())
        })?;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let r = cfg.rank as i64;
        for (l, m, name) in targets {
            let lin = self.linear(l, m);
            let size = lin.w.size();
            let (out, inp) = (size[0], size[1]);
            let a = kaiming_uniform(&mut rng, r, inp)?;
            let b = Tensor::f_zeros([out, r], (Kind::Float, Device::Cpu))?;
            let dev = self.device();
            let a =
                self.add_adapter_var(&format!("{name}.lora_A.weight"), a.f_to_device(dev)?, true);
            let b =
                self.add_adapter_var(&format!("{name}.lora_B.weight"), b.f_to_device(dev)?, true);
            self.linear_mut(l, m).lora = Some(Adapter { a, b });
        }
        self.lora = Some(LoraState::new(cfg.clone(), true));
        Ok(self)
    }

    /// The LoRA settings, when the model has adapters.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|s| &s.cfg)
    }

    /// How the linear layers apply their adapters in the current forward.
    pub(crate) fn adapter_mode(&self) -> AdapterMode {
        match &self.lora {
            Some(s) if s.active => AdapterMode::On {
                scaling: s.cfg.scaling(),
                dropout: if s.training.load(Ordering::Relaxed) {
                    s.cfg.dropout
                } else {
                    0.0
                },
            },
            _ => AdapterMode::Off,
        }
    }

    /// Marks the start (true) or end (false) of a training forward (LO-5).
    pub(crate) fn set_training(&self, on: bool) {
        if let Some(s) = &self.lora {
            s.training.store(on, Ordering::Relaxed);
        }
    }

    /// The parameters a checkpoint, the weight board and the optimizer carry: with adapters,
    /// the adapters and any value head (LO-4); without, every parameter. Sorted by name.
    pub fn trained_parameters(&self) -> Vec<(String, Tensor)> {
        let all = self.named_parameters();
        if self.lora.is_none() {
            return all;
        }
        all.into_iter()
            .filter(|(n, _)| is_adapter(n) || n.starts_with("score."))
            .collect()
    }

    /// The frozen base's parameters (every parameter that is not trained), sorted by name.
    fn base_parameters(&self) -> Vec<(String, Tensor)> {
        self.named_parameters()
            .into_iter()
            .filter(|(n, _)| !is_adapter(n) && !n.starts_with("score."))
            .collect()
    }

    /// `sha256:<hex>` of the base's parameters (names, kinds, shapes, bytes, in name order),
    /// computed once (LO-4); `None` without adapters.
    pub fn base_hash(&self) -> Result<Option<String>, HfError> {
        let Some(state) = &self.lora else {
            return Ok(None);
        };
        if let Some(h) = state.base_hash.get() {
            return Ok(Some(h.clone()));
        }
        let mut hasher = Sha256::new();
        for (name, t) in self.base_parameters() {
            hasher.update(name.as_bytes());
            hasher.update(format!("{:?}{:?}", t.kind(), t.size()).as_bytes());
            hasher.update(super::weights::tensor_bytes(&t)?);
        }
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let h = format!("sha256:{hex}");
        let _ = state.base_hash.set(h.clone());
        Ok(Some(h))
    }

    /// A second model on the same base tensors (shared, not copied) with its own copy of the
    /// adapters and value head; `active = false` gives the base model with adapters off (the
    /// reference policy of a LoRA run), whose adapters read as zeros (an adapter of zeros
    /// changes no output, LO-2). Nothing of it is trainable.
    pub fn adapter_view(&self, active: bool) -> Result<HfModel, HfError> {
        let Some(state) = &self.lora else {
            return Err(HfError::input(
                "adapter_view needs a model with LoRA adapters",
            ));
        };
        let mut view = self.share_base(!active)?;
        let view_state = LoraState::new(state.cfg.clone(), active);
        if let Some(h) = state.base_hash.get() {
            let _ = view_state.base_hash.set(h.clone());
        }
        view.lora = Some(view_state);
        Ok(view)
    }

    /// The plain model with every adapter merged into its base weight,
    /// `W + (B A) · α / r` computed in f32 then rounded to the parameter kind, as PEFT's
    /// `merge_and_unload` does; a model without adapters is copied.
    pub fn merged(&self) -> Result<HfModel, HfError> {
        let scaling = self.lora.as_ref().map_or(0.0, |s| s.cfg.scaling());
        let mut merged = std::collections::HashMap::new();
        for l in 0..self.layers.len() {
            for (m, module) in LINEAR_MODULES.iter().enumerate() {
                let lin = self.linear(l, m);
                if let Some(ad) = &lin.lora {
                    let w = tch::no_grad(|| -> Result<Tensor, HfError> {
                        let delta = ad.b.f_matmul(&ad.a)?.f_mul_scalar(scaling)?;
                        Ok(lin
                            .w
                            .f_to_kind(Kind::Float)?
                            .f_add(&delta)?
                            .f_to_kind(lin.w.kind())?)
                    })?;
                    merged.insert(format!("model.layers.{l}.{module}.weight"), w);
                }
            }
        }
        self.plain_copy(&merged)
    }

    /// PEFT's `adapter_model.safetensors` tensors: the adapters under
    /// `base_model.model.<name>` (LO-1); the value head is not part of a causal-LM adapter.
    pub fn peft_tensors(&self) -> Vec<(String, Tensor)> {
        self.named_parameters()
            .into_iter()
            .filter(|(n, _)| is_adapter(n))
            .map(|(n, t)| (format!("base_model.model.{n}"), t))
            .collect()
    }

    /// The names of the modules that carry adapters.
    pub fn adapted_modules(&self) -> Vec<String> {
        let mut out = Vec::new();
        for l in 0..self.layers.len() {
            for (m, s) in LINEAR_MODULES.iter().enumerate() {
                if self.linear(l, m).lora.is_some() {
                    out.push(format!("model.layers.{l}.{s}"));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_models::{tiny, tiny_spec};

    fn lora(rank: usize, targets: &[&str]) -> LoraConfig {
        LoraConfig {
            rank,
            alpha: 2.0 * rank as f64,
            dropout: 0.0,
            target_modules: targets.iter().map(|t| t.to_string()).collect(),
            seed: 5,
        }
    }

    fn logits(m: &HfModel) -> Tensor {
        let toks = Tensor::from_slice(&[1i64, 4, 5, 6, 7, 3]).view([1, 6]);
        tch::no_grad(|| m.forward(&toks)).expect("forward").0
    }

    /// Gives every adapter's `B` non-zero values, so adapters change the outputs.
    fn perturb(m: &HfModel) {
        tch::no_grad(|| {
            for (n, t) in m.named_parameters() {
                if n.contains(".lora_B.") {
                    t.shallow_clone().copy_(&(t.randn_like() * 0.05));
                }
            }
        });
    }

    #[test]
    fn lo1_targets_follow_peft_and_unknown_names_fail() {
        let m = tiny(12, false, 1).with_lora(&lora(4, &["q_proj", "mlp.down_proj"]));
        let m = m.expect("lora");
        assert_eq!(
            m.adapted_modules(),
            [
                "model.layers.0.self_attn.q_proj",
                "model.layers.0.mlp.down_proj",
                "model.layers.1.self_attn.q_proj",
                "model.layers.1.mlp.down_proj"
            ]
        );
        let all = tiny(12, false, 1)
            .with_lora(&lora(2, &[ALL_LINEAR]))
            .expect("all");
        assert_eq!(all.adapted_modules().len(), 14);
        let e = tiny(12, false, 1)
            .with_lora(&lora(2, &["qproj"]))
            .err()
            .expect("unknown module")
            .to_string();
        assert!(
            e.contains("model.lora.target_modules") && e.contains("q_proj"),
            "{e}"
        );
        let e = tiny(12, false, 1)
            .with_lora(&lora(0, &["q_proj"]))
            .err()
            .expect("rank 0");
        assert!(e.to_string().contains("model.lora.rank"), "{e}");
    }

    #[test]
    fn lo2_lo4_fresh_adapters_change_nothing_and_only_they_train() {
        tch::set_num_threads(1);
        let base = tiny(12, true, 3);
        let want = logits(&base);
        let m = tiny(12, true, 3)
            .with_lora(&lora(4, &[ALL_LINEAR]))
            .expect("lora");
        assert!(
            logits(&m).equal(&want),
            "B = 0: the base's outputs bit for bit"
        );
        let trained: Vec<String> = m.trained_parameters().into_iter().map(|(n, _)| n).collect();
        assert!(trained
            .iter()
            .all(|n| is_adapter(n) || n.starts_with("score.")));
        assert_eq!(trained.len(), 2 * 14 + 2);
        for (n, t) in m.named_parameters() {
            assert_eq!(t.requires_grad(), trained.contains(&n), "{n}");
        }
        let again = tiny(12, true, 3)
            .with_lora(&lora(4, &[ALL_LINEAR]))
            .expect("lora");
        for ((n, a), (_, b)) in m.named_parameters().iter().zip(again.named_parameters()) {
            assert!(a.equal(&b), "LO-2: {n} is a pure function of the seed");
        }
        let h1 = m.base_hash().expect("hash").expect("some");
        assert_eq!(Some(h1.clone()), again.base_hash().expect("hash"));
        let other = tiny(12, true, 4)
            .with_lora(&lora(4, &[ALL_LINEAR]))
            .expect("lora");
        assert_ne!(Some(h1), other.base_hash().expect("hash"));
    }

    #[test]
    fn hs3_merged_and_view_models_agree_with_the_adapted_one() {
        tch::set_num_threads(1);
        let m = tiny(12, false, 2).with_lora(&lora(4, &["q_proj", "v_proj", "up_proj"]));
        let m = m.expect("lora");
        perturb(&m);
        let ours = logits(&m);
        let base = logits(&tiny(12, false, 2));
        assert!(
            (&ours - &base).abs().max().double_value(&[]) > 1e-4,
            "adapters act"
        );
        let merged = m.merged().expect("merged");
        assert!(merged.lora().is_none());
        let diff = (logits(&merged) - &ours).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "merged logits differ by {diff}");
        let off = m.adapter_view(false).expect("off");
        assert!(
            logits(&off).equal(&base),
            "adapters off = the base, bit for bit"
        );
        let on = m.adapter_view(true).expect("on");
        assert!(logits(&on).equal(&ours), "a view computes the same");
        let (pw, vw) = (&m.layers[0].q.w, &on.layers[0].q.w);
        assert_eq!(
            pw.data_ptr(),
            vw.data_ptr(),
            "the base is shared, not copied"
        );
        let zeros = off.to_safetensors().expect("zeros");
        let mut loaded = tiny_spec(12, false, 2)
            .build()
            .expect("b")
            .with_lora(&lora(4, &["q_proj", "v_proj", "up_proj"]))
            .expect("l");
        loaded.load_safetensors(&zeros).expect("load");
        assert!(
            logits(&loaded).equal(&base),
            "zero adapters published = the base"
        );
    }

    #[test]
    fn hs3_peft_export_names_and_config() {
        let m = tiny(12, false, 2)
            .with_lora(&lora(4, &["q_proj", "v_proj"]))
            .expect("lora");
        let dir = tempfile::tempdir().expect("tmp");
        m.save_peft(dir.path(), "/models/base").expect("peft");
        let cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("adapter_config.json")).expect("cfg"),
        )
        .expect("json");
        assert_eq!(cfg["r"], 4);
        assert_eq!(cfg["target_modules"], json!(["q_proj", "v_proj"]));
        assert_eq!(cfg["base_model_name_or_path"], "/models/base");
        let back =
            super::super::weights::read_folder_file(&dir.path().join("adapter_model.safetensors"))
                .expect("read");
        assert!(back.contains_key("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"));
        assert_eq!(back.len(), 8);
    }
}
