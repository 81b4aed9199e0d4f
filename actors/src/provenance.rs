//! Weight provenance on load (WB-5, WT-6): after a generator loads a published policy version
//! it scores the learner's probe (`keel_learner::probe`) with every loaded model and refuses to
//! sample when the log-probs differ beyond the tolerance (exact for the built-in sampler on
//! the learner's device type and dtype).
//!
//! Invariants:
//! - PV-1: a version with a probe is never sampled from unless every model passed [`verify`];
//!   a version without one (weights read from a checkpoint) is not checked.
//! - PV-2: `faults.skip_weight_reload` makes a generator keep its old tensors when it should
//!   load a newer version (a reload that did not happen): a fault injection for tests, which
//!   PV-1 must catch.

use keel_learner::hf::model::dtype_name;
use keel_learner::hf::HfModel;
use keel_learner::probe::{device_name, probe_logprobs, probe_tolerance};

use crate::error::ActorError;
use crate::weights::PublishedWeights;

/// PV-1: checks `models` (model order) against `weights`' probe.
pub fn verify(
    models: &[HfModel],
    weights: &PublishedWeights,
    backend: &'static str,
) -> Result<(), ActorError> {
    let Some(probe) = &weights.probe else {
        return Ok(());
    };
    for (k, (model, want)) in models.iter().zip(&probe.logp).enumerate() {
        let got = probe_logprobs(model)?;
        let device = device_name(model.device());
        let dtype = dtype_name(model.options().kind);
        let tolerance = probe_tolerance((&probe.device, &probe.dtype), (&device, dtype));
        compare(weights, backend, k, &got, want, tolerance)?;
    }
    Ok(())
}

/// PV-1: `got` against `want`, element by element: more than `tolerance` apart anywhere (or of
/// another length) is the provenance error of `weights`' model `model` on `backend`.
pub fn compare(
    weights: &PublishedWeights,
    backend: &'static str,
    model: usize,
    got: &[f32],
    want: &[f32],
    tolerance: f64,
) -> Result<(), ActorError> {
    let diff = if got.len() == want.len() {
        got.iter()
            .zip(want)
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max)
    } else {
        f64::INFINITY
    };
    if diff > tolerance || diff.is_nan() {
        return Err(ActorError::Provenance {
            version: weights.version,
            digest: weights.digest,
            backend,
            model,
            diff,
            tolerance,
        });
    }
    Ok(())
}
