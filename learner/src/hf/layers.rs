//! The building blocks of the Llama/Qwen decoder, written to match transformers' modules op for
//! op: RMSNorm, rotary position embeddings, linear layers with optional bias.
//!
//! Invariants:
//! - LY-1 (RMSNorm): `weight · x · rsqrt(mean(x²) + eps)` through libtorch's `rms_norm` (one
//!   fused op; it accumulates in f32 for bf16 inputs). In f32 this equals `LlamaRMSNorm` up to
//!   float reassociation; in bf16 it may differ from it by one rounding of the product.
//! - LY-2 (RoPE): `inv_freq` is computed in f32 from `rope_theta` and the scaling exactly as
//!   transformers does; angles `position · inv_freq` are formed in f32, `cos`/`sin` are cast to
//!   the activation kind, and `x·cos + rotate_half(x)·sin` is applied per head, computed as
//!   `x·cos + roll(x, D/2)·sin±` with `sin± = [−sin₁, sin₂]` (the same products, fewer ops).
//! - LY-3: a [`RopeTable`] built for `max_len` positions gives, for any position below it, the
//!   same `cos`/`sin` as one computed for that position alone (it is a pure function of the
//!   position), so prefill, cached decode and the learner's forward agree.

use tch::{Device, Kind, Tensor};

use super::config::{HfConfig, RopeScaling};
use super::error::HfError;

/// A linear layer `x Wᵀ + b` with HF's `[out, in]` weight layout, and its LoRA adapter when
/// it has one (applied by [`Linear::forward_with`], `hf::lora`).
pub(crate) struct Linear {
    pub(crate) w: Tensor,
    pub(crate) b: Option<Tensor>,
    pub(crate) lora: Option<super::lora::Adapter>,
}

impl Linear {
    /// A linear layer without an adapter.
    pub(crate) fn plain(w: Tensor, b: Option<Tensor>) -> Self {
        Linear { w, b, lora: None }
    }

    /// `x Wᵀ + b` (never the adapter: heads have none).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, HfError> {
        Ok(x.f_linear(&self.w, self.b.as_ref())?)
    }
}

/// RMSNorm over the last dimension (LY-1), libtorch's fused `rms_norm`.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor, HfError> {
    let d = x.size().last().copied().unwrap_or(0);
    Ok(x.f_rms_norm([d], Some(weight), eps)?)
}

/// `inv_freq` of the config's RoPE (LY-2), f32 on `device`, `[head_dim / 2]`.
pub(crate) fn inv_freq(cfg: &HfConfig, device: Device) -> Result<Tensor, HfError> {
    let d = cfg.head_dim as i64;
    let exps = Tensor::f_arange_start_step(0, d, 2, (Kind::Int64, device))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(d as f64)?;
    let base = Tensor::f_full([d / 2], cfg.rope_theta, (Kind::Float, device))?;
    let inv = base.f_pow(&exps)?.f_reciprocal()?;
    Ok(match cfg.rope_scaling {
        RopeScaling::Default => inv,
        RopeScaling::Linear { factor } => inv.f_div_scalar(factor)?,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        } => {
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            let wavelen = inv
                .f_reciprocal()?
                .f_mul_scalar(2.0 * std::f64::consts::PI)?;
            let scaled = inv.f_div_scalar(factor)?;
            let llama = scaled.f_where_self(&wavelen.f_gt(low_wavelen)?, &inv)?;
            let smooth = wavelen
                .f_reciprocal()?
                .f_mul_scalar(old)?
                .f_sub_scalar(low_freq_factor)?
                .f_div_scalar(high_freq_factor - low_freq_factor)?;
            let one_minus = smooth.f_neg()?.f_add_scalar(1.0)?;
            let smoothed = one_minus
                .f_mul(&llama)?
                .f_div_scalar(factor)?
                .f_add(&smooth.f_mul(&llama)?)?;
            let medium = wavelen
                .f_lt(high_wavelen)?
                .f_logical_not()?
                .f_logical_and(&wavelen.f_gt(low_wavelen)?.f_logical_not()?)?;
            smoothed.f_where_self(&medium, &llama)?
        }
    })
}

/// Precomputed `cos`/`sin` rows for positions `0..max_len` (LY-3), `[max_len, head_dim]` in
/// the activation kind.
pub struct RopeTable {
    cos: Tensor,
    /// `[−sin, sin]` over the two halves of the head (LY-2).
    sin: Tensor,
}

impl RopeTable {
    /// Builds the table for `max_len` positions.
    pub fn new(cfg: &HfConfig, max_len: i64, device: Device, kind: Kind) -> Result<Self, HfError> {
        let inv = inv_freq(cfg, device)?;
        let pos = Tensor::f_arange(max_len, (Kind::Float, device))?;
        let freqs = pos.f_unsqueeze(1)?.f_mul(&inv.f_unsqueeze(0)?)?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
        let sin = freqs.f_sin()?;
        let signed = Tensor::f_cat(&[&sin.f_neg()?, &sin], -1)?;
        Ok(RopeTable {
            cos: emb.f_cos()?.f_to_kind(kind)?,
            sin: signed.f_to_kind(kind)?,
        })
    }

    /// Number of positions covered.
    pub fn len(&self) -> i64 {
        self.cos.size()[0]
    }

    /// Whether the table covers no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `cos`, `sin` for `positions` `[B, T]` i64 → `[B, 1, T, head_dim]` each.
    pub(crate) fn at(&self, positions: &Tensor) -> Result<(Tensor, Tensor), HfError> {
        let size = positions.size();
        let flat = positions.f_reshape([-1])?;
        let pick = |t: &Tensor| -> Result<Tensor, HfError> {
            Ok(t.f_index_select(0, &flat)?
                .f_reshape([size[0], 1, size[1], -1])?)
        };
        Ok((pick(&self.cos)?, pick(&self.sin)?))
    }

    /// `cos`, `sin` for positions `0..t` → `[1, 1, t, head_dim]` each.
    pub(crate) fn prefix(&self, t: i64) -> Result<(Tensor, Tensor), HfError> {
        let pick = |x: &Tensor| -> Result<Tensor, HfError> {
            Ok(x.f_narrow(0, 0, t)?.f_reshape([1, 1, t, -1])?)
        };
        Ok((pick(&self.cos)?, pick(&self.sin)?))
    }
}

/// `x·cos + rotate_half(x)·sin` for `x` `[B, H, T, D]`, with the signed `sin` of the table
/// (LY-2).
/// Scaled dot-product attention (libtorch's fused kernel) over `[B, heads, T, d]` queries and
/// `[B, kv_heads, S, d]` keys/values, with grouped-query heads expanded by the kernel; `mask`
/// (true = attend) or `is_causal` selects the visible keys.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    is_causal: bool,
) -> Result<Tensor, HfError> {
    Ok(Tensor::f_scaled_dot_product_attention(
        q, k, v, mask, 0.0, is_causal, None, true,
    )?)
}

pub(crate) fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, HfError> {
    let half = x.size()[3] / 2;
    Ok(x.f_mul(cos)?.f_add(&x.f_roll([half], [3])?.f_mul(sin)?)?)
}
