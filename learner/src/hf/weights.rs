//! Safetensors files of a Hugging Face model folder: single (`model.safetensors`) or sharded
//! (`model.safetensors.index.json` + shards), read into CPU tensors and written back in the
//! layout transformers loads.
//!
//! Invariants:
//! - HW-1: reading keeps each tensor's stored dtype (F32, BF16 or F16; anything else is an
//!   error naming the tensor); conversion to the run's dtype and device happens in the model.
//! - HW-2: writing stores every tensor under its HF name in its own dtype, in name order,
//!   splitting into shards of at most `max_shard_bytes` (a larger tensor gets a shard of its
//!   own); more than one shard also writes the index with `metadata.total_size` and
//!   `weight_map`, exactly as `save_pretrained` does. Every file carries `format: pt`.
//! - HW-3: a shard named by the index but absent is an error; a tensor named twice is an error.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use super::error::HfError;

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

fn kind_of(dtype: Dtype, name: &str) -> Result<Kind, HfError> {
    match dtype {
        Dtype::F32 => Ok(Kind::Float),
        Dtype::BF16 => Ok(Kind::BFloat16),
        Dtype::F16 => Ok(Kind::Half),
        other => Err(HfError::weights(
            name,
            format!("dtype {other:?} is not supported (F32, BF16, F16)"),
        )),
    }
}

fn dtype_of(kind: Kind, name: &str) -> Result<Dtype, HfError> {
    match kind {
        Kind::Float => Ok(Dtype::F32),
        Kind::BFloat16 => Ok(Dtype::BF16),
        Kind::Half => Ok(Dtype::F16),
        other => Err(HfError::weights(
            name,
            format!("cannot save kind {other:?} (F32, BF16, F16)"),
        )),
    }
}

/// The safetensors files of `dir`: the shards listed in the index, else the single file.
fn weight_files(dir: &Path) -> Result<Vec<String>, HfError> {
    let index = dir.join(INDEX_FILE);
    if !index.exists() {
        return Ok(vec![SINGLE_FILE.to_string()]);
    }
    let text = std::fs::read_to_string(&index).map_err(|e| HfError::io(&index, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|source| HfError::Json {
        path: index.clone(),
        source,
    })?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| HfError::weights(INDEX_FILE, "has no `weight_map` object"))?;
    let mut files: Vec<String> = Vec::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| HfError::weights(name, "index maps it to a non-string"))?;
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    files.sort();
    Ok(files)
}

/// Reads every tensor of the folder's weight files as CPU tensors in their stored dtype (HW-1,
/// HW-3).
pub fn read_folder(dir: &Path) -> Result<HashMap<String, Tensor>, HfError> {
    let mut out = HashMap::new();
    for file in weight_files(dir)? {
        read_into(&dir.join(&file), &mut out)?;
    }
    Ok(out)
}

/// The name and shape of every tensor of the folder's weight files, read from the files'
/// headers only (nothing is loaded): what [`super::HfModel::check_folder`] compares.
pub fn folder_shapes(dir: &Path) -> Result<HashMap<String, Vec<i64>>, HfError> {
    use std::io::Read;
    let mut out = HashMap::new();
    for file in weight_files(dir)? {
        let path = dir.join(&file);
        let mut f = std::fs::File::open(&path).map_err(|e| HfError::io(&path, e))?;
        let mut len = [0u8; 8];
        f.read_exact(&mut len).map_err(|e| HfError::io(&path, e))?;
        let len = u64::from_le_bytes(len);
        let size = f.metadata().map_err(|e| HfError::io(&path, e))?.len();
        if len > size.saturating_sub(8) || len > 100 << 20 {
            return Err(HfError::weights(
                &file,
                format!("header length {len} does not fit the file of {size} bytes"),
            ));
        }
        let mut header = vec![0u8; len as usize];
        f.read_exact(&mut header)
            .map_err(|e| HfError::io(&path, e))?;
        let v: serde_json::Map<String, Value> =
            serde_json::from_slice(&header).map_err(|source| HfError::Json {
                path: path.clone(),
                source,
            })?;
        for (name, t) in v.into_iter().filter(|(n, _)| n != "__metadata__") {
            let shape = t
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|s| s.iter().map(|d| d.as_i64()).collect::<Option<Vec<i64>>>())
                .ok_or_else(|| {
                    HfError::weights(&name, format!("{file}: no shape in the header"))
                })?;
            if out.insert(name.clone(), shape).is_some() {
                return Err(HfError::weights(&name, "stored twice (HW-3)"));
            }
        }
    }
    Ok(out)
}

/// Reads every tensor of one safetensors file (HW-1).
pub fn read_folder_file(path: &Path) -> Result<HashMap<String, Tensor>, HfError> {
    let mut out = HashMap::new();
    read_into(path, &mut out)?;
    Ok(out)
}

/// Adds the tensors of the file `path` to `out`; a name already there is an error (HW-3).
fn read_into(path: &Path, out: &mut HashMap<String, Tensor>) -> Result<(), HfError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| HfError::io(path, e))?;
    let st =
        SafeTensors::deserialize(&bytes).map_err(|e| HfError::weights(&file, e.to_string()))?;
    for (name, view) in st.tensors() {
        let kind = kind_of(view.dtype(), &name)?;
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, kind)?;
        if out.insert(name.clone(), t).is_some() {
            return Err(HfError::weights(
                &name,
                "appears in more than one weight file",
            ));
        }
    }
    Ok(())
}

/// Raw little-endian bytes of a tensor (moved to the CPU, made contiguous).
pub(crate) fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>, HfError> {
    let t = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
    let numel = t.numel();
    let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut bytes, numel)?;
    Ok(bytes)
}

/// Writes `tensors` into the safetensors file `path`, each in its own kind, with `metadata`.
fn write_file(
    path: &Path,
    tensors: &[&(String, Tensor)],
    metadata: &HashMap<String, String>,
) -> Result<(), HfError> {
    let mut owned = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        owned.push((
            name.as_str(),
            dtype_of(t.kind(), name)?,
            shape,
            tensor_bytes(t)?,
        ));
    }
    let mut views = Vec::with_capacity(owned.len());
    for (name, dtype, shape, bytes) in &owned {
        views.push((*name, TensorView::new(*dtype, shape.clone(), bytes)?));
    }
    safetensors::tensor::serialize_to_file(views, Some(metadata.clone()), path)?;
    Ok(())
}

/// Writes `tensors` as the single safetensors file `path` (`format: pt`), in name order.
pub fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), HfError> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    write_file(path, &sorted, &metadata)
}

/// Writes `tensors` (HF names) into `dir` as one file or as shards with an index (HW-2).
pub fn write_folder(
    dir: &Path,
    tensors: &[(String, Tensor)],
    max_shard_bytes: usize,
) -> Result<(), HfError> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut shards: Vec<Vec<&(String, Tensor)>> = vec![Vec::new()];
    let mut current = 0usize;
    let mut total = 0usize;
    for entry in sorted {
        let size = entry.1.numel() * entry.1.kind().elt_size_in_bytes();
        if current > 0 && current + size > max_shard_bytes {
            shards.push(Vec::new());
            current = 0;
        }
        current += size;
        total += size;
        if let Some(last) = shards.last_mut() {
            last.push(entry);
        }
    }
    let n = shards.len();
    let mut weight_map = BTreeMap::new();
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    for (i, shard) in shards.iter().enumerate() {
        let file = if n == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
        };
        for (name, _) in shard {
            weight_map.insert(name.clone(), file.clone());
        }
        write_file(&dir.join(&file), shard, &metadata)?;
    }
    if n > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(&index).map_err(|source| HfError::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, text).map_err(|e| HfError::io(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hw2_sharded_round_trip_keeps_dtypes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]);
        let b = Tensor::from_slice(&[0.5f32, -1.5]).to_kind(Kind::BFloat16);
        let tensors = vec![
            ("b.weight".to_string(), b.shallow_clone()),
            ("a.weight".to_string(), a.shallow_clone()),
        ];
        write_folder(dir.path(), &tensors, 8).expect("write");
        assert!(dir.path().join(INDEX_FILE).exists());
        assert!(dir.path().join("model-00002-of-00002.safetensors").exists());
        let back = read_folder(dir.path()).expect("read");
        assert_eq!(back["b.weight"].kind(), Kind::BFloat16);
        assert!(back["a.weight"].equal(&a) && back["b.weight"].equal(&b));
        std::fs::remove_file(dir.path().join("model-00001-of-00002.safetensors")).expect("rm");
        assert!(
            read_folder(dir.path()).is_err(),
            "HW-3: a missing shard is an error"
        );
    }
}
