//! Named tensors to and from in-memory safetensors buffers (used by the model and the optimizer).
//!
//! Invariants:
//! - TI-1: `encode` writes every tensor as little-endian F32 (converted from its kind and moved
//!   to the CPU) under its given name; the bytes depend only on names, shapes and values.
//! - TI-2: `decode_checked` validates the whole buffer against the expected names and shapes
//!   before returning anything: a missing, unexpected, non-F32 or wrongly shaped tensor is a
//!   `Mismatch` naming that tensor. Nothing is copied until everything has been checked.
//! - TI-3: `commit` copies decoded values into existing tensors in place, without recording
//!   gradients, converting kind and device as needed.

use std::collections::{HashMap, HashSet};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;

/// Serialises `(name, tensor)` pairs (TI-1) with optional string metadata.
pub(crate) fn encode(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>, LearnerError> {
    let mut owned: Vec<(&str, Vec<usize>, Vec<u8>)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let flat = t
            .f_detach()?
            .f_to_device(Device::Cpu)?
            .f_to_kind(Kind::Float)?
            .f_contiguous()?;
        let shape: Vec<usize> = flat.size().iter().map(|&d| d as usize).collect();
        let numel = flat.numel();
        let mut values = vec![0f32; numel];
        flat.f_copy_data(&mut values, numel)?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        owned.push((name.as_str(), shape, bytes));
    }
    let mut views = Vec::with_capacity(owned.len());
    for (name, shape, bytes) in &owned {
        views.push((*name, TensorView::new(Dtype::F32, shape.clone(), bytes)?));
    }
    Ok(safetensors::tensor::serialize(views, metadata)?)
}

/// What a decoded buffer holds: CPU f32 tensors in the order of `expected`, and the metadata.
pub(crate) struct Decoded {
    /// One CPU f32 tensor per expected name, in the same order.
    pub tensors: Vec<Tensor>,
    /// The buffer's `__metadata__` map (empty when absent).
    pub metadata: HashMap<String, String>,
}

/// Parses `bytes` and checks it holds exactly the `expected` names and shapes (TI-2).
/// `what` names the file in messages (e.g. "model").
pub(crate) fn decode_checked(
    bytes: &[u8],
    expected: &[(String, Vec<i64>)],
    what: &str,
) -> Result<Decoded, LearnerError> {
    let st = SafeTensors::deserialize(bytes)?;
    let wanted: HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let mut extra: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|n| !wanted.contains(n))
        .collect();
    extra.sort_unstable();
    if let Some(name) = extra.first() {
        return Err(LearnerError::mismatch(
            name,
            format!("present in the {what} file but not a tensor of this {what}"),
        ));
    }
    let mut tensors = Vec::with_capacity(expected.len());
    for (name, shape) in expected {
        let view = st
            .tensor(name)
            .map_err(|_| LearnerError::mismatch(name, format!("missing from the {what} file")))?;
        tensors.push(decode_view(&view, name, shape, what)?);
    }
    let (_, meta) = SafeTensors::read_metadata(bytes)?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    Ok(Decoded { tensors, metadata })
}

/// One checked F32 tensor of a buffer (TI-2).
fn decode_view(
    view: &TensorView<'_>,
    name: &str,
    shape: &[i64],
    what: &str,
) -> Result<Tensor, LearnerError> {
    if view.dtype() != Dtype::F32 {
        return Err(LearnerError::mismatch(
            name,
            format!("dtype {:?} in the {what} file, expected F32", view.dtype()),
        ));
    }
    let got: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    if got != shape {
        return Err(LearnerError::mismatch(
            name,
            format!("shape {got:?} in the {what} file, expected {shape:?}"),
        ));
    }
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Tensor::f_from_slice(&values)?.f_reshape(shape)?)
}

/// Tensors by name.
pub(crate) type NamedTensors = HashMap<String, Tensor>;

/// The tensors of `bytes` whose names are `wanted`, checked (TI-2); every tensor of the buffer
/// must be one of `known` (name, shape), and those not wanted are not decoded. For state split
/// over several files (a sharded optimizer): returns what this file holds of `wanted`, by name.
pub(crate) fn decode_subset(
    bytes: &[u8],
    known: &HashMap<String, Vec<i64>>,
    wanted: &HashSet<String>,
    what: &str,
) -> Result<(NamedTensors, HashMap<String, String>), LearnerError> {
    let st = SafeTensors::deserialize(bytes)?;
    let mut out = HashMap::new();
    let mut names = st.names();
    names.sort_unstable();
    for name in names {
        let Some(shape) = known.get(name) else {
            return Err(LearnerError::mismatch(
                name,
                format!("present in the {what} file but not a tensor of this {what}"),
            ));
        };
        if wanted.contains(name) {
            let view = st.tensor(name)?;
            out.insert(name.to_string(), decode_view(&view, name, shape, what)?);
        }
    }
    let (_, meta) = SafeTensors::read_metadata(bytes)?;
    Ok((out, meta.metadata().clone().unwrap_or_default()))
}

/// Copies `sources[i]` into `targets[i]` in place, without gradient tracking (TI-3).
pub(crate) fn commit(targets: &[Tensor], sources: &[Tensor]) -> Result<(), LearnerError> {
    tch::no_grad(|| -> Result<(), LearnerError> {
        for (target, source) in targets.iter().zip(sources) {
            let mut target = target.shallow_clone();
            target.f_copy_(source)?;
        }
        Ok(())
    })
}
