//! Syncing a Hugging Face model folder stored under an object-store prefix (`s3://bucket/
//! models/qwen`) into a local cache folder, so `keel train --model s3://…` loads it from disk.
//!
//! Invariants:
//! - MC-1: every object directly under the prefix (config.json, safetensors shards and their
//!   index, tokenizer files, chat template) lands in the cache folder under its own name; keys
//!   in sub-folders are skipped.
//! - MC-2: a file is downloaded again unless the cache manifest (`.keel-sync.json`) records it
//!   with the object's current size and ETag and the local file still has the recorded size
//!   and CRC32: a changed object or a damaged cache file is never used.
//! - MC-3: a download is written to a temporary file, checked against the object's size, then
//!   renamed into place; the manifest is rewritten after every file, so an interrupted sync
//!   resumes where it stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::root::RunStore;

/// The cache manifest's name inside the cache folder.
pub const SYNC_MANIFEST: &str = ".keel-sync.json";

/// What the manifest records per file (MC-2).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct CachedFile {
    size: u64,
    e_tag: Option<String>,
    crc32: u32,
}

/// What a sync did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncReport {
    /// Files downloaded.
    pub downloaded: Vec<String>,
    /// Files already in the cache and verified.
    pub cached: Vec<String>,
}

fn cache_err(path: &Path, reason: impl std::fmt::Display) -> StoreError {
    StoreError::ModelCache {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Size and CRC32 of a local file, if it exists.
fn local_crc(path: &Path) -> Option<(u64, u32)> {
    let bytes = std::fs::read(path).ok()?;
    Some((bytes.len() as u64, crc32fast::hash(&bytes)))
}

fn read_manifest(dir: &Path) -> BTreeMap<String, CachedFile> {
    std::fs::read(dir.join(SYNC_MANIFEST))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_manifest(dir: &Path, m: &BTreeMap<String, CachedFile>) -> Result<(), StoreError> {
    let path = dir.join(SYNC_MANIFEST);
    let tmp = dir.join(format!("{SYNC_MANIFEST}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(m)?).map_err(|e| cache_err(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| cache_err(&path, e))
}

/// Syncs the objects directly under `store`'s root into `dir` (MC-1..3).
pub async fn sync_model_folder(store: &RunStore, dir: &Path) -> Result<SyncReport, StoreError> {
    std::fs::create_dir_all(dir).map_err(|e| cache_err(dir, e))?;
    let prefix = store.full_key("");
    // LI-1..4: one level, odd names and links left out.
    let listed = store.list_level(&prefix).await?.objects;
    let mut manifest = read_manifest(dir);
    let mut report = SyncReport::default();
    for meta in listed {
        let full = meta.location.to_string();
        let Some(name) = store.rel_key(&full) else {
            continue;
        };
        if name.contains('/') || name.starts_with('.') {
            continue;
        }
        let path: PathBuf = dir.join(name);
        let fresh = manifest.get(name).is_some_and(|c| {
            c.size == meta.size
                && c.e_tag == meta.e_tag
                && local_crc(&path) == Some((c.size, c.crc32))
        });
        if fresh {
            report.cached.push(name.to_string());
            continue;
        }
        let bytes = store.get_object(name).await?;
        if bytes.len() as u64 != meta.size {
            return Err(cache_err(
                &path,
                format!(
                    "downloaded {} bytes, the object has {}",
                    bytes.len(),
                    meta.size
                ),
            ));
        }
        let tmp = dir.join(format!(".{name}.partial"));
        std::fs::write(&tmp, &bytes).map_err(|e| cache_err(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| cache_err(&path, e))?;
        manifest.insert(
            name.to_string(),
            CachedFile {
                size: meta.size,
                e_tag: meta.e_tag.clone(),
                crc32: crc32fast::hash(&bytes),
            },
        );
        write_manifest(dir, &manifest)?;
        report.downloaded.push(name.to_string());
    }
    if report.downloaded.is_empty() && report.cached.is_empty() {
        return Err(StoreError::NotFound {
            key: format!("{prefix}/config.json"),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_backends::each_backend;
    use bytes::Bytes;

    #[tokio::test]
    async fn mc1_mc2_mc3_sync_downloads_once_and_never_uses_a_stale_file() {
        each_backend("model-sync", |store| async move {
            let files = [
                ("config.json", "{\"a\": 1}"),
                ("model.safetensors", "weights"),
            ];
            for (name, text) in files {
                store
                    .put_object(name, Bytes::from(text))
                    .await
                    .expect("put");
            }
            store
                .put_object("sub/ignored.txt", Bytes::from("x"))
                .await
                .expect("put");
            let cache = tempfile::tempdir().expect("cache");
            let first = sync_model_folder(&store, cache.path()).await.expect("sync");
            assert_eq!(first.downloaded.len(), 2, "{first:?}");
            for (name, text) in files {
                assert_eq!(
                    std::fs::read_to_string(cache.path().join(name)).expect("file"),
                    text
                );
            }
            assert!(
                !cache.path().join("sub").exists(),
                "MC-1: sub-folders are skipped"
            );
            let again = sync_model_folder(&store, cache.path())
                .await
                .expect("again");
            assert!(
                again.downloaded.is_empty() && again.cached.len() == 2,
                "{again:?}"
            );
            // A damaged cache file and a changed object are both downloaded again (MC-2).
            std::fs::write(cache.path().join("model.safetensors"), "weightz").expect("damage");
            store
                .put_object("config.json", Bytes::from("{\"a\": 22}"))
                .await
                .expect("change");
            let third = sync_model_folder(&store, cache.path())
                .await
                .expect("third");
            let mut got = third.downloaded.clone();
            got.sort();
            assert_eq!(got, vec!["config.json", "model.safetensors"]);
            assert_eq!(
                std::fs::read_to_string(cache.path().join("model.safetensors")).expect("file"),
                "weights"
            );
        })
        .await;
    }
}
