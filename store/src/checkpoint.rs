//! Checkpoints: the blobs first, the manifest last, then the HEAD pointer.
//!
//! ```text
//! <root>/checkpoints/<id>/<file>          one object per blob (weights, optimizer state, ...)
//! <root>/checkpoints/<id>/MANIFEST.json   names, sizes and crc32s of the blobs, plus metadata
//! <root>/checkpoints/HEAD                 the id of the latest committed checkpoint
//! ```
//!
//! A commit writes every blob, then the manifest with `PutMode::Create`, then moves HEAD. A crash
//! at any point leaves either no manifest (the checkpoint does not exist; its blobs are garbage)
//! or a complete checkpoint that HEAD may or may not name yet.
//!
//! HEAD moves by a conditional put: `PutMode::Update` with the e-tag/version from a `head()` when
//! HEAD exists, `PutMode::Create` when it does not. Where the backend answers `NotImplemented` for
//! conditional puts (the local filesystem backend does for `Update`), HEAD is written with a
//! plain put instead, which is still atomic there (write to a staging file, then rename); on such
//! a backend two concurrent committers are not detected, and the last one wins.
//!
//! Invariants:
//! - CK-1: a checkpoint is committed iff `checkpoints/<id>/MANIFEST.json` exists; the manifest is
//!   written only after every blob it lists, and never overwritten.
//! - CK-2: HEAD only ever names a committed checkpoint: it is written after the manifest.
//! - CK-3: where the backend supports conditional puts, a HEAD moved by another writer between our
//!   read and our write makes the commit fail with `Conflict` (the new checkpoint stays committed
//!   and listable) instead of silently replacing the other writer's HEAD.
//! - CK-4: [`RunStore::read_checkpoint_file`] returns a blob only if its size and crc32 match the
//!   manifest; any mismatch, a missing blob or an unreadable manifest is `CorruptCheckpoint`.
//! - CK-5: checkpoint ids are `{step:08}-{8 hex}`; the hex part mixes the clock, the process id
//!   and a counter, so two branches committing the same step get different ids.
//! - CK-6: blob names are single plain key segments (KY-2), unique, and never `MANIFEST.json`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutMode, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::key::{to_path, validate_segment};
use crate::root::RunStore;

/// The manifest format this build writes and reads.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;
const MANIFEST: &str = "MANIFEST.json";

/// Where the data stream stood when the checkpoint was taken, so training resumes exactly there.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct DataPosition {
    /// The next task index the task sampler will hand out.
    pub next_task_index: u64,
    /// The next batch sequence number the learner expects.
    pub next_batch_seq: u64,
    /// Batch seqs trained on since the parent checkpoint.
    pub consumed_batches: Vec<u64>,
    /// First task ids of task ranges handed out to generators but not yet trained on when the
    /// checkpoint was taken; a resumed run owes them first.
    #[serde(default)]
    pub pending_tasks: Vec<u64>,
}

/// One blob of a checkpoint, as recorded in its manifest.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileEntry {
    /// The blob's name inside the checkpoint (one key segment).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// crc32 (IEEE) of the bytes.
    pub crc32: u32,
}

/// The committed description of a checkpoint (`checkpoints/<id>/MANIFEST.json`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CheckpointManifest {
    /// Manifest format version ([`CHECKPOINT_FORMAT_VERSION`]).
    pub format_version: u32,
    /// `{step:08}-{8 hex}` (CK-5).
    pub id: String,
    /// The checkpoint training resumed from, if any.
    pub parent: Option<String>,
    /// Optimizer step.
    pub step: u64,
    /// Policy version of the saved weights.
    pub policy_version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Hash of the run configuration that produced it.
    pub config_hash: String,
    /// The reference/anchor model this run regularises against, if any.
    pub reference: Option<String>,
    /// Free-form labels.
    pub tags: Vec<String>,
    /// The blobs, in the order given at commit.
    pub files: Vec<FileEntry>,
    /// Where the data stream stood.
    pub data: DataPosition,
    /// Scalar metrics at commit time (all finite).
    pub metrics: BTreeMap<String, f64>,
}

/// What the learner hands to [`RunStore::commit_checkpoint`].
#[derive(Debug, Clone)]
pub struct NewCheckpoint {
    /// The checkpoint training resumed from, if any.
    pub parent: Option<String>,
    /// Optimizer step.
    pub step: u64,
    /// Policy version of the saved weights.
    pub policy_version: u64,
    /// Hash of the run configuration.
    pub config_hash: String,
    /// The reference/anchor model, if any.
    pub reference: Option<String>,
    /// Free-form labels.
    pub tags: Vec<String>,
    /// Where the data stream stands.
    pub data: DataPosition,
    /// Scalar metrics; every value must be finite.
    pub metrics: BTreeMap<String, f64>,
    /// The blobs: (name, bytes); names follow CK-6.
    pub files: Vec<(String, Bytes)>,
}

fn corrupt(id: &str, reason: String) -> StoreError {
    StoreError::CorruptCheckpoint {
        id: id.to_string(),
        reason,
    }
}

impl RunStore {
    /// Commits a checkpoint: blobs, then the manifest (CK-1), then HEAD (CK-2, CK-3).
    pub async fn commit_checkpoint(
        &self,
        ckpt: NewCheckpoint,
    ) -> Result<CheckpointManifest, StoreError> {
        check_new(&ckpt)?;
        let id = new_id(ckpt.step, &ckpt.config_hash);
        let files: Vec<FileEntry> = ckpt
            .files
            .iter()
            .map(|(name, bytes)| FileEntry {
                name: name.clone(),
                size: bytes.len() as u64,
                crc32: crc32fast::hash(bytes),
            })
            .collect();
        let puts = ckpt.files.into_iter().map(|(name, bytes)| {
            let key = self.full_key(&format!("checkpoints/{id}/{name}"));
            async move { self.put_full(&key, bytes, PutMode::Create).await }
        });
        futures::future::try_join_all(puts).await?;

        let manifest = CheckpointManifest {
            format_version: CHECKPOINT_FORMAT_VERSION,
            id: id.clone(),
            parent: ckpt.parent,
            step: ckpt.step,
            policy_version: ckpt.policy_version,
            created_unix_ms: u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0),
            config_hash: ckpt.config_hash,
            reference: ckpt.reference,
            tags: ckpt.tags,
            files,
            data: ckpt.data,
            metrics: ckpt.metrics,
        };
        let body = Bytes::from(serde_json::to_vec_pretty(&manifest)?);
        self.put_full(&self.manifest_key(&id), body, PutMode::Create)
            .await?;
        self.move_head(&id).await?;
        tracing::info!(id = %id, step = manifest.step, root = self.root_url(), "committed checkpoint");
        Ok(manifest)
    }

    /// The checkpoint HEAD names, or `None` when no checkpoint was ever committed.
    pub async fn latest_checkpoint(&self) -> Result<Option<CheckpointManifest>, StoreError> {
        let head = match self.get_full(&self.head_key()).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let id = std::str::from_utf8(&head)
            .map_err(|_| corrupt("HEAD", "checkpoints/HEAD is not UTF-8".into()))?
            .trim();
        validate_segment(id)
            .map_err(|e| corrupt("HEAD", format!("checkpoints/HEAD does not hold an id: {e}")))?;
        match self.read_manifest(id).await? {
            Some(manifest) => Ok(Some(manifest)),
            None => Err(corrupt(
                id,
                "HEAD names it but its MANIFEST.json does not exist".into(),
            )),
        }
    }

    /// Every committed checkpoint (CK-1), sorted by step, then creation time, then id.
    pub async fn list_checkpoints(&self) -> Result<Vec<CheckpointManifest>, StoreError> {
        let dir = self.full_key("checkpoints");
        let listing = self
            .backend()
            .list_with_delimiter(Some(&to_path(&dir)?))
            .await
            .map_err(|e| StoreError::from_object_store(&dir, e))?;
        let mut manifests = Vec::new();
        for prefix in listing.common_prefixes {
            let Some(id) = prefix.filename() else {
                continue;
            };
            if validate_segment(id).is_err() {
                continue;
            }
            // A directory without a manifest is an uncommitted checkpoint: not listed (CK-1).
            if let Some(manifest) = self.read_manifest(id).await? {
                manifests.push(manifest);
            }
        }
        manifests.sort_by(|a, b| {
            (a.step, a.created_unix_ms, &a.id).cmp(&(b.step, b.created_unix_ms, &b.id))
        });
        Ok(manifests)
    }

    /// Reads blob `name` of a checkpoint and verifies its size and crc32 (CK-4).
    pub async fn read_checkpoint_file(
        &self,
        manifest: &CheckpointManifest,
        name: &str,
    ) -> Result<Bytes, StoreError> {
        validate_segment(name)?;
        let id = manifest.id.as_str();
        validate_segment(id)
            .map_err(|e| corrupt(id, format!("the manifest id is not a plain name: {e}")))?;
        let key = self.full_key(&format!("checkpoints/{id}/{name}"));
        let Some(entry) = manifest.files.iter().find(|f| f.name == name) else {
            return Err(StoreError::NotFound { key });
        };
        let bytes = match self.get_full(&key).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => {
                return Err(corrupt(
                    id,
                    format!("file {name} is listed in the manifest but missing"),
                ))
            }
            Err(e) => return Err(e),
        };
        if bytes.len() as u64 != entry.size {
            return Err(corrupt(
                id,
                format!(
                    "file {name} is {} bytes, the manifest says {}",
                    bytes.len(),
                    entry.size
                ),
            ));
        }
        let crc = crc32fast::hash(&bytes);
        if crc != entry.crc32 {
            return Err(corrupt(
                id,
                format!(
                    "file {name} has crc32 {crc:#010x}, the manifest says {:#010x}",
                    entry.crc32
                ),
            ));
        }
        Ok(bytes)
    }

    fn head_key(&self) -> String {
        self.full_key("checkpoints/HEAD")
    }

    fn manifest_key(&self, id: &str) -> String {
        self.full_key(&format!("checkpoints/{id}/{MANIFEST}"))
    }

    /// The manifest of `id`, `None` if it does not exist, `CorruptCheckpoint` if it does not parse.
    async fn read_manifest(&self, id: &str) -> Result<Option<CheckpointManifest>, StoreError> {
        let bytes = match self.get_full(&self.manifest_key(id)).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let manifest: CheckpointManifest = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(id, format!("MANIFEST.json does not parse: {e}")))?;
        if manifest.format_version != CHECKPOINT_FORMAT_VERSION {
            return Err(corrupt(
                id,
                format!(
                    "manifest format version {} is not {CHECKPOINT_FORMAT_VERSION}; \
                     read it with the keel version that wrote it",
                    manifest.format_version
                ),
            ));
        }
        if manifest.id != id {
            return Err(corrupt(
                id,
                format!("its manifest claims id {:?}", manifest.id),
            ));
        }
        Ok(Some(manifest))
    }

    /// Points HEAD at `id` with a conditional put where the backend has one (CK-3).
    async fn move_head(&self, id: &str) -> Result<(), StoreError> {
        let key = self.head_key();
        let path = to_path(&key)?;
        let mode = match self.backend().head(&path).await {
            Ok(meta) => PutMode::Update(UpdateVersion {
                e_tag: meta.e_tag,
                version: meta.version,
            }),
            Err(e) => match StoreError::from_object_store(&key, e) {
                StoreError::NotFound { .. } => PutMode::Create,
                other => return Err(other),
            },
        };
        let body = Bytes::from(format!("{id}\n"));
        match self.put_full(&key, body.clone(), mode).await {
            Ok(_) => Ok(()),
            Err(StoreError::ObjectStore {
                source: object_store::Error::NotImplemented { .. },
                ..
            }) => {
                tracing::debug!(
                    root = self.root_url(),
                    "no conditional puts here; plain put of HEAD"
                );
                self.put_full(&key, body, PutMode::Overwrite)
                    .await
                    .map(|_| ())
            }
            Err(StoreError::AlreadyExists { key }) => Err(StoreError::Conflict { key }),
            Err(e) => Err(e),
        }
    }
}

/// Checks CK-6 and that the manifest will round-trip through JSON.
fn check_new(ckpt: &NewCheckpoint) -> Result<(), StoreError> {
    let invalid = |reason: String| StoreError::InvalidCheckpoint { reason };
    if let Some(parent) = &ckpt.parent {
        validate_segment(parent)?;
    }
    let mut names = std::collections::HashSet::new();
    for (name, _) in &ckpt.files {
        validate_segment(name)?;
        if name == MANIFEST {
            return Err(invalid(format!(
                "file name {MANIFEST} is reserved for the manifest"
            )));
        }
        if !names.insert(name.as_str()) {
            return Err(invalid(format!("file name {name} is given twice")));
        }
    }
    if let Some((name, value)) = ckpt.metrics.iter().find(|(_, v)| !v.is_finite()) {
        return Err(invalid(format!(
            "metric {name} is {value}; JSON cannot hold non-finite numbers"
        )));
    }
    Ok(())
}

/// `{step:08}-{8 hex}` with the hex from the clock, the process id and a counter (CK-5).
fn new_id(step: u64, config_hash: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = crc32fast::Hasher::new();
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(&step.to_le_bytes());
    h.update(config_hash.as_bytes());
    format!("{step:08}-{:08x}", h.finalize())
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
