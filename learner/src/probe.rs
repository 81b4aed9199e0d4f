//! The weights provenance probe: a fixed token sequence and a model's log-probs on it. The
//! learner publishes its log-probs with every policy version; a generator that loaded the
//! version scores the same sequence and compares (`keel_actors::provenance`), which catches
//! stale weights, a reload that applied part of the tensors and caches kept across a reload.
//!
//! Invariants:
//! - PB-1: the probe's tokens depend only on the vocabulary size: [`PROBE_LEN`] ids drawn by
//!   splitmix64 from a fixed seed, so every process derives the same sequence.
//! - PB-2: [`probe_logprobs`] is `log p(token_t | tokens_<t)` for t = 1.. at temperature 1, one
//!   forward without gradient of the unpadded `[1, PROBE_LEN]` sequence: two models with the
//!   same weights, kind and device give bit-identical values.
//! - PB-3: [`probe_tolerance`] is 0 (bit-exact) for the same device type and dtype, and a
//!   documented bound otherwise: 1e-3 nats in float32 (kernels of another device or engine sum
//!   in another order, and the error grows with depth: vLLM on CPU measured ≤ 8e-5 on a
//!   2-layer model, 1.8e-4 on SmolLM2-135M's 30 layers; a skipped reload or a kept prefix cache
//!   still exceeds it in the engine tests), 0.25 in 16-bit formats.

use tch::{Kind, Tensor};

use crate::error::LearnerError;
use crate::hf::HfModel;
use crate::logprobs::token_logprobs;

/// Tokens in the probe sequence.
pub const PROBE_LEN: usize = 32;

/// The seed of the probe's tokens (PB-1).
const PROBE_SEED: u64 = 0x6b65_656c_7072_6f62; // "keelprob"

/// The probe's token ids for a vocabulary of `vocab` (PB-1).
pub fn probe_tokens(vocab: usize) -> Vec<i64> {
    let mut state = PROBE_SEED;
    (0..PROBE_LEN)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z % vocab.max(1) as u64) as i64
        })
        .collect()
}

/// `model`'s log-probs of probe tokens 1.. given their prefix (PB-2).
pub fn probe_logprobs(model: &HfModel) -> Result<Vec<f32>, LearnerError> {
    sequence_logprobs(model, &probe_tokens(model.config().vocab_size), 1.0)
}

/// `log_softmax(logits / temperature)` of `ids_t` given `ids_<t`, for t = 1..: one forward
/// without gradient of the unpadded `[1, len]` sequence (PB-2; what the learner recomputes for
/// sampled tokens, RO-2).
pub fn sequence_logprobs(
    model: &HfModel,
    ids: &[i64],
    temperature: f64,
) -> Result<Vec<f32>, LearnerError> {
    let len = ids.len() as i64;
    let tokens = Tensor::f_from_slice(ids)?
        .f_reshape([1, len])?
        .f_to_device(model.device())?;
    let (logits, _) = tch::no_grad(|| model.forward(&tokens))?;
    let mut logits = logits.f_to_kind(Kind::Float)?;
    if temperature != 1.0 {
        logits = logits.f_div_scalar(temperature)?;
    }
    let logp = token_logprobs(&logits, &tokens)
        .f_narrow(1, 1, len - 1)?
        .f_reshape([-1])?
        .f_to_device(tch::Device::Cpu)?;
    Ok(Vec::<f32>::try_from(&logp)?)
}

/// The device type of a device name (`cuda:1` → `cuda`).
fn device_type(device: &str) -> &str {
    device.split(':').next().unwrap_or(device)
}

/// How far a reader's probe log-probs may be from the publisher's (PB-3), in nats.
pub fn probe_tolerance(published: (&str, &str), loaded: (&str, &str)) -> f64 {
    let ((p_dev, p_dtype), (l_dev, l_dtype)) = (published, loaded);
    if device_type(p_dev) == device_type(l_dev) && p_dtype == l_dtype {
        0.0
    } else if p_dtype == "float32" && l_dtype == "float32" {
        1e-3
    } else {
        0.25
    }
}

/// The name of `device` (`cpu`, `cuda:0`).
pub fn device_name(device: tch::Device) -> String {
    match device {
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        tch::Device::Mps => "mps".into(),
        tch::Device::Vulkan => "vulkan".into(),
        tch::Device::Cpu => "cpu".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_models::tiny;

    #[test]
    fn pb1_tokens_depend_only_on_the_vocabulary() {
        let a = probe_tokens(1000);
        assert_eq!(a, probe_tokens(1000));
        assert_eq!(a.len(), PROBE_LEN);
        assert!(a.iter().all(|&t| (0..1000).contains(&t)));
        assert!(a.windows(2).any(|w| w[0] != w[1]));
        assert_ne!(a, probe_tokens(999));
    }

    /// PB-2: a model loaded from another's weights scores the probe bit for bit; a model with
    /// other weights does not.
    #[test]
    fn pb2_the_same_weights_score_the_probe_bit_for_bit() {
        let a = tiny(12, false, 3);
        let mut b = tiny(12, false, 4);
        let pa = probe_logprobs(&a).expect("a");
        assert_eq!(pa.len(), PROBE_LEN - 1);
        assert!(pa.iter().all(|x| x.is_finite() && *x < 0.0));
        assert_ne!(pa, probe_logprobs(&b).expect("b before"));
        b.load_safetensors(&a.to_safetensors().expect("save"))
            .expect("load");
        assert_eq!(pa, probe_logprobs(&b).expect("b after"));
    }

    #[test]
    fn pb3_exact_on_the_same_device_and_dtype_only() {
        assert_eq!(
            probe_tolerance(("cuda:0", "float32"), ("cuda:1", "float32")),
            0.0
        );
        assert_eq!(
            probe_tolerance(("cuda:0", "float32"), ("cpu", "float32")),
            1e-3
        );
        assert_eq!(
            probe_tolerance(("cpu", "bfloat16"), ("cpu", "float32")),
            0.25
        );
    }
}
