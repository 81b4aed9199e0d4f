//! AdamW over tch tensors with explicit, serialisable state (tch's built-in optimizers cannot
//! save theirs, and an exact resume needs it).
//!
//! One step, for each parameter `p` with a defined gradient `g` and `t` its own step counter
//! after incrementing (per parameter, as PyTorch's `state['step']`):
//! ```text
//! p ← p · (1 − lr·wd)                         (decoupled decay; only parameters with ≥ 2 dims)
//! m ← β1·m + (1 − β1)·g
//! v ← β2·v + (1 − β2)·g²
//! p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
//! ```
//!
//! Invariants:
//! - OP-1: the state is exactly (`m`, `v` and step counter per parameter, and the number of
//!   `step` calls); `to_safetensors` writes all of it (`<param>.exp_avg` / `<param>.exp_avg_sq`,
//!   `<param>.step` as an f32 scalar like PyTorch's, the call count in the metadata) and
//!   `load_safetensors` restores it, so a resumed run continues bit-identically.
//!   Hyper-parameters are the caller's and are not restored.
//! - OP-2: weight decay applies to matrices and embeddings (≥ 2 dims), never to biases or
//!   LayerNorm parameters (1 dim).
//! - OP-3: parameters are kept in name order; a parameter whose gradient has never been
//!   defined is skipped by `step`. `zero_grad` zeroes gradients in place (tch cannot reset them
//!   to None), so once a gradient exists the parameter keeps moving with its momentum in later
//!   steps even if it gets no new gradient — PyTorch's `set_to_none=False` behaviour.
//! - OP-5: `step_where` moves only the parameters it is asked to; frozen ones keep their values,
//!   moments and step counters exactly, so a shared optimizer's critic-only steps never change
//!   the policy parameters' bias correction. `clip_grad_norm_where` measures and rescales only
//!   the gradients of the parameters that will move.
//! - OP-6 (master weights): a parameter stored in a reduced-precision kind (bf16, f16) gets an
//!   f32 master copy; the moments are f32 and the update above runs on the master, which is
//!   then copied, rounded to nearest, into the parameter. Updates smaller than the parameter
//!   kind's spacing therefore accumulate instead of being lost. Masters are part of the state
//!   (`<param>.master`), so a bf16 run resumes bit-identically. An f32 parameter is its own
//!   master.
//! - OP-7 (sharded state, ZeRO-1): after [`AdamW::shard`] a rank holds moments, step counters
//!   and masters only for the parameters it owns; `step_where` moves only those, and the state
//!   file holds only those (with the shard's place in its metadata). Because the state is keyed
//!   by parameter name, [`AdamW::load_shards`] restores a rank from the files of any number of
//!   ranks (or from one unsharded file): resharding is picking by name.
//! - OP-4: `clip_grad_norm` returns the pre-clip global L2 norm and rescales only when that norm
//!   is finite and above the bound (coefficient `max_norm / (norm + 1e-6)`, as PyTorch).

use std::collections::{HashMap, HashSet};

use tch::{nn, Tensor};

use crate::error::LearnerError;
use crate::tensor_io;

/// AdamW hyper-parameters.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay coefficient (see OP-2).
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// PyTorch's defaults (β = (0.9, 0.999), ε = 1e-8) at `lr` and `weight_decay`.
    pub fn torch_default(lr: f64, weight_decay: f64) -> Self {
        AdamWConfig {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }
}

struct ParamState {
    name: String,
    param: Tensor,
    /// The f32 master of a reduced-precision parameter (OP-6).
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Updates applied to this parameter: a 0-dim f32 CPU tensor (OP-1, OP-5).
    step: Tensor,
    decay: bool,
    /// This rank keeps and steps this parameter's state (OP-7; always true without ranks).
    owned: bool,
    /// The rank that owns this parameter's state (OP-7; 0 without ranks).
    owner: usize,
}

impl ParamState {
    /// The tensor the update runs on: the master, else the parameter itself (a shallow clone
    /// sharing its storage).
    fn weights(&self) -> Tensor {
        self.master.as_ref().unwrap_or(&self.param).shallow_clone()
    }
}

/// Whether a parameter of `kind` needs an f32 master (OP-6).
fn reduced(kind: tch::Kind) -> bool {
    !matches!(kind, tch::Kind::Float | tch::Kind::Double)
}

/// The `steps` entry of a state file's metadata.
fn state_steps(metadata: &HashMap<String, String>) -> Result<u64, LearnerError> {
    metadata
        .get("steps")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| {
            LearnerError::mismatch(
                "optimizer.safetensors",
                "metadata `steps` is missing or not an integer",
            )
        })
}

/// AdamW with decoupled weight decay and bias correction.
pub struct AdamW {
    cfg: AdamWConfig,
    params: Vec<ParamState>,
    steps: u64,
    /// (rank, ranks) once sharded (OP-7).
    shard_place: Option<(usize, usize)>,
}

impl AdamW {
    /// Tracks every trainable variable of `vs`, with zeroed moments and step counter 0.
    pub fn new(vs: &nn::VarStore, cfg: AdamWConfig) -> Self {
        let mut vars: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let params = tch::no_grad(|| {
            vars.into_iter()
                .map(|(name, param)| {
                    let master =
                        reduced(param.kind()).then(|| param.detach().to_kind(tch::Kind::Float));
                    let full = master.as_ref().unwrap_or(&param);
                    ParamState {
                        decay: param.dim() >= 2,
                        exp_avg: full.zeros_like(),
                        exp_avg_sq: full.zeros_like(),
                        step: Tensor::zeros([], (tch::Kind::Float, tch::Device::Cpu)),
                        master,
                        name,
                        param,
                        owned: true,
                        owner: 0,
                    }
                })
                .collect()
        });
        AdamW {
            cfg,
            params,
            steps: 0,
            shard_place: None,
        }
    }

    /// Sets the learning rate used by the next `step`.
    pub fn set_lr(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }

    /// The current hyper-parameters.
    pub fn config(&self) -> AdamWConfig {
        self.cfg
    }

    /// Number of `step` calls so far (restored by `load_safetensors`).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Zeroes every defined gradient in place (OP-3).
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.param.zero_grad();
        }
    }

    /// Global L2 norm of all defined gradients before clipping; rescales them to `max_norm`
    /// when larger (OP-4). A non-finite norm is returned as is and nothing is rescaled.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        self.clip_grad_norm_where(max_norm, |_| true)
    }

    /// [`AdamW::clip_grad_norm`] over the gradients of the parameters whose name satisfies
    /// `trainable` only (OP-5): the norm, and the rescaling, of what `step_where` will move.
    pub fn clip_grad_norm_where(&mut self, max_norm: f64, trainable: impl Fn(&str) -> bool) -> f64 {
        let grads: Vec<Tensor> = self
            .params
            .iter()
            .filter(|p| trainable(&p.name))
            .map(|p| p.param.grad())
            .filter(|g| g.defined())
            .collect();
        if grads.is_empty() {
            return 0.0;
        }
        let norms: Vec<Tensor> = grads
            .iter()
            .map(|g| {
                g.to_kind(tch::Kind::Float)
                    .norm()
                    .to_kind(tch::Kind::Double)
            })
            .collect();
        let total = Tensor::stack(&norms, 0).norm().double_value(&[]);
        if total.is_finite() && total > max_norm {
            let coef = max_norm / (total + 1e-6);
            tch::no_grad(|| {
                for mut g in grads {
                    let _ = g.g_mul_scalar_(coef);
                }
            });
        }
        total
    }

    /// Applies one AdamW update to every parameter with a defined gradient.
    pub fn step(&mut self) {
        self.step_where(|_| true)
    }

    /// Like [`AdamW::step`], but only parameters whose name satisfies `trainable` move; the
    /// others keep their values and moments (OP-5, frozen parameter groups).
    pub fn step_where(&mut self, trainable: impl Fn(&str) -> bool) {
        self.steps += 1;
        let AdamWConfig {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.cfg;
        tch::no_grad(|| {
            for p in &mut self.params {
                let g = p.param.grad();
                if !p.owned || !g.defined() || !trainable(&p.name) {
                    continue;
                }
                let _ = p.step.g_add_scalar_(1.0);
                let t = p.step.double_value(&[]) as i32;
                let bc1 = 1.0 - beta1.powi(t);
                let bc2_sqrt = (1.0 - beta2.powi(t)).sqrt();
                let g = g.to_kind(p.exp_avg.kind());
                let mut w = p.weights();
                if p.decay && weight_decay != 0.0 {
                    let _ = w.g_mul_scalar_(1.0 - lr * weight_decay);
                }
                let _ = p.exp_avg.g_mul_scalar_(beta1);
                let _ = p.exp_avg.g_add_(&(&g * (1.0 - beta1)));
                let _ = p.exp_avg_sq.g_mul_scalar_(beta2);
                let _ = p.exp_avg_sq.g_add_(&(g.square() * (1.0 - beta2)));
                let denom = p.exp_avg_sq.sqrt() / bc2_sqrt + eps;
                let _ = w.g_sub_(&(&p.exp_avg / denom * (lr / bc1)));
                if p.master.is_some() {
                    p.param.copy_(&w);
                }
            }
        });
    }

    /// The parameters in state order (OP-3) with the rank that owns each (OP-7; 0 unsharded).
    pub(crate) fn parameters(&self) -> impl Iterator<Item = (&str, &Tensor, usize)> {
        self.params
            .iter()
            .map(|p| (p.name.as_str(), &p.param, p.owner))
    }

    /// Gives parameter `i` (state order) to rank `owners[i]`, keeps the state of those rank
    /// `place.0` owns and frees the rest (OP-7). `place` = (rank, ranks), recorded in the state
    /// file's metadata.
    pub(crate) fn shard(&mut self, owners: &[usize], place: (usize, usize)) {
        for (p, &owner) in self.params.iter_mut().zip(owners) {
            p.owner = owner;
            p.owned = owner == place.0;
            if !p.owned {
                let empty = Tensor::zeros([0], (tch::Kind::Float, tch::Device::Cpu));
                p.exp_avg = empty.shallow_clone();
                p.exp_avg_sq = empty;
                p.master = None;
            }
        }
        self.shard_place = Some(place);
    }

    /// Bytes of the state this rank holds: moments and f32 masters of its owned parameters
    /// (OP-7: about 1/N of the whole with N ranks).
    pub fn state_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        self.params
            .iter()
            .map(|p| bytes(&p.exp_avg) + bytes(&p.exp_avg_sq) + p.master.as_ref().map_or(0, bytes))
            .sum()
    }

    /// Every state name this optimizer can hold, owned or not, with its shape (OP-7).
    fn known_state(&self) -> HashMap<String, Vec<i64>> {
        let mut out = HashMap::new();
        for p in &self.params {
            let shape = p.param.size();
            out.insert(format!("{}.exp_avg", p.name), shape.clone());
            out.insert(format!("{}.exp_avg_sq", p.name), shape.clone());
            out.insert(format!("{}.step", p.name), Vec::new());
            if reduced(p.param.kind()) {
                out.insert(format!("{}.master", p.name), shape);
            }
        }
        out
    }

    /// Restores this rank's owned state from the state files of any number of ranks, or from
    /// one unsharded file (OP-7). On error nothing is changed.
    pub fn load_shards(&mut self, files: &[&[u8]]) -> Result<(), LearnerError> {
        let (tensors, steps) = self.decode_shards(files)?;
        self.commit_state(&tensors, steps)
    }

    /// Checks state files of any sharding against this rank's owned state without changing
    /// anything (OP-7): each owned tensor must be found exactly once, and every file must
    /// agree on the step count.
    pub(crate) fn decode_shards(
        &self,
        files: &[&[u8]],
    ) -> Result<(Vec<Tensor>, u64), LearnerError> {
        let known = self.known_state();
        let wanted_list = self.state_names();
        let wanted: HashSet<String> = wanted_list.iter().map(|(n, _)| n.clone()).collect();
        let mut found: HashMap<String, Tensor> = HashMap::new();
        let mut steps: Option<u64> = None;
        for bytes in files {
            let (tensors, meta) = tensor_io::decode_subset(bytes, &known, &wanted, "optimizer")?;
            let file_steps = state_steps(&meta)?;
            if steps.is_some_and(|s| s != file_steps) {
                return Err(LearnerError::mismatch(
                    "optimizer.safetensors",
                    format!(
                        "the shard files disagree on the step count ({steps:?} and {file_steps})"
                    ),
                ));
            }
            steps = Some(file_steps);
            for (name, t) in tensors {
                if found.insert(name.clone(), t).is_some() {
                    return Err(LearnerError::mismatch(
                        &name,
                        "held by two optimizer shard files",
                    ));
                }
            }
        }
        let mut ordered = Vec::with_capacity(wanted_list.len());
        for (name, _) in &wanted_list {
            ordered.push(found.remove(name).ok_or_else(|| {
                LearnerError::mismatch(name, "missing from every optimizer shard file")
            })?);
        }
        Ok((ordered, steps.unwrap_or(0)))
    }

    /// The state tensors in file order: moments and step counter of every parameter, then its
    /// master (OP-1, OP-6).
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(4 * self.params.len());
        for p in self.params.iter().filter(|p| p.owned) {
            out.push((format!("{}.exp_avg", p.name), p.exp_avg.shallow_clone()));
            out.push((
                format!("{}.exp_avg_sq", p.name),
                p.exp_avg_sq.shallow_clone(),
            ));
            out.push((format!("{}.step", p.name), p.step.shallow_clone()));
            if let Some(m) = &p.master {
                out.push((format!("{}.master", p.name), m.shallow_clone()));
            }
        }
        out
    }

    fn state_names(&self) -> Vec<(String, Vec<i64>)> {
        self.state_tensors()
            .into_iter()
            .map(|(n, t)| (n, t.size()))
            .collect()
    }

    /// The whole state (OP-1, OP-6) as an in-memory safetensors buffer.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, LearnerError> {
        let tensors = self.state_tensors();
        // A single key: safetensors writes metadata from a HashMap, so more keys would make
        // the header's byte order vary between runs.
        let mut meta = HashMap::from([("steps".to_string(), self.steps.to_string())]);
        if let Some((rank, ranks)) = self.shard_place {
            meta.insert("shard".into(), format!("{rank}/{ranks}"));
        }
        tensor_io::encode(&tensors, Some(meta))
    }

    /// Checks a state buffer against this optimizer's parameters without changing anything.
    pub(crate) fn decode_state(&self, bytes: &[u8]) -> Result<(Vec<Tensor>, u64), LearnerError> {
        let decoded = tensor_io::decode_checked(bytes, &self.state_names(), "optimizer")?;
        let steps = state_steps(&decoded.metadata)?;
        Ok((decoded.tensors, steps))
    }

    /// Installs state checked by `decode_state`.
    pub(crate) fn commit_state(
        &mut self,
        tensors: &[Tensor],
        steps: u64,
    ) -> Result<(), LearnerError> {
        let targets: Vec<Tensor> = self.state_tensors().into_iter().map(|(_, t)| t).collect();
        tensor_io::commit(&targets, tensors)?;
        self.steps = steps;
        Ok(())
    }

    /// Restores moments and step counter (OP-1). On error nothing is changed.
    pub fn load_safetensors(&mut self, bytes: &[u8]) -> Result<(), LearnerError> {
        let (tensors, steps) = self.decode_state(bytes)?;
        self.commit_state(&tensors, steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn cfg(lr: f64, wd: f64) -> AdamWConfig {
        AdamWConfig {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: wd,
        }
    }

    fn store(init: &[f32]) -> (nn::VarStore, Tensor) {
        let vs = nn::VarStore::new(Device::Cpu);
        let x = vs
            .root()
            .var_copy("x", &Tensor::from_slice(init).view([1, -1]));
        (vs, x)
    }

    fn values(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(&t.flatten(0, -1).to_kind(Kind::Double)).expect("values")
    }

    #[test]
    fn converges_on_a_quadratic() {
        tch::set_num_threads(1);
        let (vs, x) = store(&[3.0, -2.0, 0.5]);
        let target = Tensor::from_slice(&[1.0f32, 1.0, -1.0]).view([1, 3]);
        let mut opt = AdamW::new(&vs, cfg(0.05, 0.0));
        for _ in 0..600 {
            opt.zero_grad();
            (&x - &target).square().sum(Kind::Float).backward();
            opt.step();
        }
        for (got, want) in values(&x).iter().zip([1.0, 1.0, -1.0]) {
            assert!((got - want).abs() < 1e-2, "{got} vs {want}");
        }
        assert_eq!(opt.steps(), 600);
    }

    #[test]
    fn two_steps_match_the_formula() {
        tch::set_num_threads(1);
        let (vs, x) = store(&[1.0, -2.0]);
        let c = cfg(0.1, 0.01);
        let mut opt = AdamW::new(&vs, c);
        // loss = Σ x³/3 → g = x².
        let mut p = [1.0f64, -2.0];
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        for t in 1..=2 {
            opt.zero_grad();
            (x.pow_tensor_scalar(3) / 3.0).sum(Kind::Float).backward();
            opt.step();
            for i in 0..2 {
                let g = p[i] * p[i];
                p[i] *= 1.0 - c.lr * c.weight_decay;
                m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g;
                v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g * g;
                let mh = m[i] / (1.0 - c.beta1.powi(t));
                let vh = v[i] / (1.0 - c.beta2.powi(t));
                p[i] -= c.lr * mh / (vh.sqrt() + c.eps);
            }
        }
        for (got, want) in values(&x).iter().zip(p) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn op4_clip_returns_pre_clip_norm_and_rescales() {
        tch::set_num_threads(1);
        let (vs, x) = store(&[3.0, 4.0]);
        let mut opt = AdamW::new(&vs, cfg(0.1, 0.0));
        (x.square() / 2.0).sum(Kind::Float).backward(); // g = x, |g| = 5
        let n = opt.clip_grad_norm(1.0);
        assert!((n - 5.0).abs() < 1e-6);
        let g = values(&x.grad());
        assert!(((g[0] * g[0] + g[1] * g[1]).sqrt() - 1.0).abs() < 1e-5);
    }

    #[test]
    fn op1_state_round_trip_continues_identically() {
        tch::set_num_threads(1);
        let run = |opt: &mut AdamW, x: &Tensor, n: usize| {
            for _ in 0..n {
                opt.zero_grad();
                (x.square() * x).sum(Kind::Float).backward();
                opt.step();
            }
        };
        let (vs_a, xa) = store(&[0.3, -0.7, 1.1]);
        let mut a = AdamW::new(&vs_a, cfg(0.01, 0.1));
        run(&mut a, &xa, 3);
        let (vs_b, xb) = store(&[0.0, 0.0, 0.0]);
        let mut b = AdamW::new(&vs_b, cfg(0.01, 0.1));
        tch::no_grad(|| xb.shallow_clone().copy_(&xa));
        b.load_safetensors(&a.to_safetensors().expect("save"))
            .expect("load");
        assert_eq!(b.steps(), 3);
        run(&mut a, &xa, 4);
        run(&mut b, &xb, 4);
        assert_eq!(values(&xa), values(&xb));
        let (vs_c, _) = store(&[0.0, 0.0]);
        let mut c = AdamW::new(&vs_c, cfg(0.01, 0.1));
        let e = c
            .load_safetensors(&a.to_safetensors().expect("save"))
            .expect_err("shape");
        assert!(e.to_string().contains("x.exp_avg"), "{e}");
    }

    #[test]
    fn op5_step_where_freezes_the_rest() {
        tch::set_num_threads(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let a = vs.root().var_copy("a", &Tensor::from_slice(&[1.0f32]));
        let b = vs.root().var_copy("b", &Tensor::from_slice(&[1.0f32]));
        let mut opt = AdamW::new(&vs, cfg(0.1, 0.0));
        (&a * 2.0 + &b * 3.0).sum(Kind::Float).backward();
        opt.step_where(|n| n == "a");
        assert!(values(&a)[0] < 1.0);
        assert_eq!(values(&b)[0], 1.0);
        // Per-parameter counters: b's bias correction has not moved.
        let count = |opt: &AdamW, name: &str| {
            opt.params
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.step.double_value(&[]))
        };
        assert_eq!((count(&opt, "a"), count(&opt, "b")), (Some(1.0), Some(0.0)));
        // b's first real update is then exactly a fresh optimizer's first update.
        let vs2 = nn::VarStore::new(Device::Cpu);
        let b2 = vs2.root().var_copy("b", &Tensor::from_slice(&[1.0f32]));
        let mut fresh = AdamW::new(&vs2, cfg(0.1, 0.0));
        (&b2 * 3.0).sum(Kind::Float).backward();
        fresh.step();
        opt.zero_grad();
        (&a * 2.0 + &b * 3.0).sum(Kind::Float).backward();
        opt.step_where(|n| n == "b");
        assert_eq!(values(&b), values(&b2));
        let back = {
            let mut o = AdamW::new(&vs, cfg(0.1, 0.0));
            o.load_safetensors(&opt.to_safetensors().expect("save"))
                .expect("load");
            (count(&o, "a"), count(&o, "b"), o.steps())
        };
        assert_eq!(back, (Some(1.0), Some(1.0), 2), "OP-1: counters are state");
    }

    #[test]
    fn op5_clip_where_measures_and_scales_only_what_moves() {
        tch::set_num_threads(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let a = vs.root().var_copy("a", &Tensor::from_slice(&[1.0f32]));
        let b = vs.root().var_copy("b", &Tensor::from_slice(&[1.0f32]));
        let mut opt = AdamW::new(&vs, cfg(0.1, 0.0));
        (&a * 3.0 + &b * 400.0).sum(Kind::Float).backward();
        let norm = opt.clip_grad_norm_where(1.0, |n| n == "a");
        assert!((norm - 3.0).abs() < 1e-6, "{norm}");
        assert!((values(&a.grad())[0] - 1.0 / (3.0 + 1e-6) * 3.0).abs() < 1e-6);
        assert_eq!(
            values(&b.grad())[0],
            400.0,
            "a frozen gradient is left alone"
        );
    }

    #[test]
    fn op6_bf16_parameters_keep_f32_masters_that_accumulate_small_updates() {
        tch::set_num_threads(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let bf16 = |v: &[f32]| Tensor::from_slice(v).view([1, -1]).to_kind(Kind::BFloat16);
        let x = vs.root().add("x", bf16(&[1.0, 1.0]), true);
        let run = |opt: &mut AdamW, n: usize| {
            for _ in 0..n {
                opt.zero_grad();
                // A constant gradient: each Adam step moves the weight by ≈ lr = 1e-3, a
                // quarter of bf16's spacing below 1.0 (2^-8).
                x.sum(Kind::Float).backward();
                opt.step();
            }
        };
        let mut opt = AdamW::new(&vs, cfg(1e-3, 0.0));
        run(&mut opt, 10);
        let master = values(
            &opt.params[0]
                .master
                .as_ref()
                .expect("master")
                .shallow_clone(),
        );
        assert!((master[0] - 0.99).abs() < 1e-5, "{master:?}");
        let stored = values(&x);
        assert_eq!(
            stored,
            values(&Tensor::from_slice(&master).to_kind(Kind::BFloat16)),
            "the parameter is its master rounded to bf16"
        );
        assert!(
            stored[0] < 1.0,
            "without a master every step would round back to 1.0"
        );
        // The masters are state: a restored optimizer continues bit-identically.
        let bytes = opt.to_safetensors().expect("save");
        let vs_b = nn::VarStore::new(Device::Cpu);
        let xb = vs_b.root().add("x", bf16(&[0.0, 0.0]), true);
        let mut b = AdamW::new(&vs_b, cfg(1e-3, 0.0));
        b.load_safetensors(&bytes).expect("load");
        tch::no_grad(|| xb.shallow_clone().copy_(&x));
        run(&mut opt, 5);
        for _ in 0..5 {
            b.zero_grad();
            xb.sum(Kind::Float).backward();
            b.step();
        }
        assert_eq!(values(&x), values(&xb));
        let mut f32_opt = AdamW::new(&store(&[1.0, 1.0]).0, cfg(1e-3, 0.0));
        let e = f32_opt
            .load_safetensors(&bytes)
            .expect_err("no master in f32");
        assert!(e.to_string().contains("x.master"), "{e}");
    }
}
