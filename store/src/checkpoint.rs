//! Checkpoints: the blobs first, the manifest next, then the branch head.
//!
//! ```text
//! <root>/checkpoints/<id>/<file>          one object per blob (weights, optimizer state, ...)
//! <root>/checkpoints/<id>/MANIFEST.json   lineage, data frontier, names/sizes/crc32s of the blobs
//! <root>/branches/<branch>/HEAD.<n>       the branch heads (see `branch`)
//! ```
//!
//! A commit reads the branch head (generation `n`), writes every blob (create-only; blobs of at
//! least the multipart threshold as S3 multipart uploads), then the manifest with
//! `PutMode::Create`, then creates `HEAD.<n+1>` with `PutMode::Create` (BR-2). No step renames or
//! overwrites, so the protocol holds on S3 semantics. A crash at any point leaves either no
//! manifest (the checkpoint does not exist; its blobs are orphans for `gc`) or a complete
//! checkpoint that the head may or may not name yet.
//!
//! Invariants:
//! - CP-1: a checkpoint is committed iff `checkpoints/<id>/MANIFEST.json` exists; the manifest is
//!   written only after every blob it lists, and never overwritten.
//! - CP-2: a head only ever names a committed checkpoint: it is written after the manifest.
//! - CP-3: two writers racing to commit on one branch head: exactly one moves the head; the other
//!   gets `Conflict` (its checkpoint stays committed and listable, off any branch). With
//!   [`ExpectHead::Id`] a head moved by anyone since the caller last saw it is also a `Conflict`.
//! - CP-4: [`RunStore::read_checkpoint_file`] returns a blob only if its size and crc32 match the
//!   manifest; any mismatch, a missing blob or an unreadable manifest is `CorruptCheckpoint`.
//! - CP-5: checkpoint ids are `{step:08}-{8 hex}`; the hex part mixes the clock, the process id
//!   and a counter, so two branches committing the same step get different ids.
//! - CP-6: blob names are single plain key segments (KY-2), unique, and never `MANIFEST.json`.
//! - CP-7 (resume): [`RunStore::resume_point`] returns the newest checkpoint on the branch's
//!   lineage whose every blob verifies (CP-4), starting at the head; each one skipped on the way is
//!   reported with its reason and its corrupt blob is quarantined (QU-1). If none verifies it is an
//!   error, never "start from scratch".

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use object_store::{PutMultipartOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::key::{to_path, validate_branch, validate_segment};
use crate::root::{RunStore, DEFAULT_BRANCH};

/// The manifest format this build writes and reads.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;
const MANIFEST: &str = "MANIFEST.json";
/// Size of one part of a multipart blob upload (S3's minimum part size is 5 MiB).
const PART_BYTES: usize = 8 << 20;

/// What the committer believes the branch head is (CP-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectHead {
    /// Whatever the head is when the commit starts (still exactly one winner among racers).
    Current,
    /// The branch must have no head yet (a new branch).
    NoHead,
    /// The head must still name this checkpoint.
    Id(String),
    /// The head must still be at exactly this generation (a fenced life's commits, LV-3);
    /// `None`: the branch must have no head yet.
    Generation(Option<u64>),
}

/// A checkpoint passed over on the way to a verifiable one (CP-7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedCheckpoint {
    /// Its id.
    pub id: String,
    /// Why it could not be used.
    pub reason: String,
}

/// Where a run resumes: a verified checkpoint and its blobs.
#[derive(Debug, Clone)]
pub struct ResumePoint {
    /// The verified checkpoint.
    pub manifest: CheckpointManifest,
    /// Every blob of it, verified, in manifest order.
    pub files: Vec<(String, Bytes)>,
    /// The branch head when resume looked (differs from `manifest.id` after a fallback).
    pub head: String,
    /// Newer checkpoints of the lineage that failed verification, newest first.
    pub skipped: Vec<SkippedCheckpoint>,
}

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
    /// checkpoint was taken (in flight); a resumed run owes them first.
    #[serde(default)]
    pub pending_tasks: Vec<u64>,
    /// First task ids of the ranges trained on since the parent checkpoint, in training order.
    #[serde(default)]
    pub consumed_tasks: Vec<u64>,
    /// Batch seqs found or produced since the parent checkpoint and dropped (stale, or a lost
    /// future found on resume); their ranges were owed again.
    #[serde(default)]
    pub dropped_batches: Vec<u64>,
    /// First task ids of the ranges whose batch was used up by an update skipped as non-finite
    /// since the parent checkpoint (GD-1): handed out and not owed again, but never trained on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_tasks: Vec<u64>,
    /// The resume index: seqs of the batches handed out for `pending_tasks` (being sampled or
    /// ready to train) when the checkpoint was taken. A resume reads only these and the batches
    /// at or above `next_batch_seq`; every other batch of the branch is already trained on,
    /// dropped or superseded. `None` in checkpoints written before keel recorded it (a resume
    /// from one reads every batch of the branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_batch_seqs: Option<Vec<u64>>,
    /// Method state a resumed run continues from, by name (RTPO's tree position, the PATS bank
    /// version, ARMOR's reference resets); JSON values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub method_state: BTreeMap<String, String>,
}

/// The largest task index or batch sequence number a data position may hold (2^40: batch keys
/// have 10 digits, and evaluation batches are numbered from 2^40 on).
pub const MAX_DATA_POSITION: u64 = 1 << 40;

impl DataPosition {
    /// Whether these values are ones keel could have written: every task index and batch seq
    /// below [`MAX_DATA_POSITION`], and the ranges and batches it names below `next_task_index`
    /// and `next_batch_seq`. A resume plans from them; a manifest failing this is corrupt.
    pub fn check(&self) -> Result<(), String> {
        let tasks = self.next_task_index;
        let seqs = self.next_batch_seq;
        if tasks > MAX_DATA_POSITION || seqs > MAX_DATA_POSITION {
            return Err(format!(
                "data position next_task_index {tasks} / next_batch_seq {seqs} is beyond {MAX_DATA_POSITION}"
            ));
        }
        let task_lists = [
            ("pending_tasks", &self.pending_tasks),
            ("consumed_tasks", &self.consumed_tasks),
            ("skipped_tasks", &self.skipped_tasks),
        ];
        for (name, list) in task_lists {
            if let Some(t) = list.iter().find(|&&t| t >= tasks) {
                return Err(format!(
                    "{name} holds {t}, not below next_task_index {tasks}"
                ));
            }
        }
        let no_index = Vec::new();
        let seq_lists = [
            ("consumed_batches", &self.consumed_batches),
            ("dropped_batches", &self.dropped_batches),
            (
                "pending_batch_seqs",
                self.pending_batch_seqs.as_ref().unwrap_or(&no_index),
            ),
        ];
        for (name, list) in seq_lists {
            if let Some(s) = list.iter().find(|&&s| s >= seqs) {
                return Err(format!("{name} holds {s}, not below next_batch_seq {seqs}"));
            }
        }
        Ok(())
    }

    /// Whether a resume from this position may reuse the stored batch `seq` of its branch (DF-4):
    /// one handed out for a pending range, or one produced after the checkpoint. Every other
    /// batch was trained on, dropped or superseded before it; without an index (a checkpoint
    /// written before keel recorded one) every batch may be.
    pub fn may_reuse_batch(&self, seq: u64) -> bool {
        seq >= self.next_batch_seq
            || self
                .pending_batch_seqs
                .as_ref()
                .is_none_or(|seqs| seqs.contains(&seq))
    }

    /// The lowest batch seq [`DataPosition::may_reuse_batch`] accepts.
    pub fn first_reusable_batch(&self) -> u64 {
        match &self.pending_batch_seqs {
            Some(seqs) => seqs
                .iter()
                .copied()
                .min()
                .map_or(self.next_batch_seq, |s| s.min(self.next_batch_seq)),
            None => 0,
        }
    }
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
    /// `{step:08}-{8 hex}` (CP-5).
    pub id: String,
    /// The checkpoint training resumed from, if any.
    pub parent: Option<String>,
    /// The branch it was committed on.
    #[serde(default = "default_branch")]
    pub branch: String,
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
    /// The blobs: (name, bytes); names follow CP-6.
    pub files: Vec<(String, Bytes)>,
}

fn default_branch() -> String {
    DEFAULT_BRANCH.to_string()
}

fn corrupt(id: &str, reason: String) -> StoreError {
    StoreError::CorruptCheckpoint {
        id: id.to_string(),
        reason,
    }
}

/// Parses and checks the `MANIFEST.json` bytes of checkpoint `id`: JSON of this format version
/// naming `id` itself; anything else is `CorruptCheckpoint`.
pub fn parse_manifest(id: &str, bytes: &[u8]) -> Result<CheckpointManifest, StoreError> {
    let manifest: CheckpointManifest = serde_json::from_slice(bytes)
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
    manifest
        .data
        .check()
        .map_err(|reason| corrupt(id, format!("MANIFEST.json: {reason}")))?;
    Ok(manifest)
}

impl RunStore {
    /// Commits a checkpoint on this handle's branch, expecting whatever head it has now.
    pub async fn commit_checkpoint(
        &self,
        ckpt: NewCheckpoint,
    ) -> Result<CheckpointManifest, StoreError> {
        let branch = self.branch().to_string();
        self.commit_checkpoint_on(&branch, ckpt, ExpectHead::Current)
            .await
    }

    /// Commits a checkpoint on `branch`: blobs, then the manifest (CP-1), then the head
    /// (CP-2, CP-3). The parent is whatever `ckpt.parent` says (any checkpoint, on any branch),
    /// so "start branch X from checkpoint P" is `commit_checkpoint_on("X", {parent: P}, NoHead)`.
    pub async fn commit_checkpoint_on(
        &self,
        branch: &str,
        ckpt: NewCheckpoint,
        expect: ExpectHead,
    ) -> Result<CheckpointManifest, StoreError> {
        validate_branch(branch)?;
        check_new(&ckpt)?;
        let head = self.branch_head(branch).await?;
        let head_key =
            || crate::branch::head_rel_key(branch, head.as_ref().map_or(0, |h| h.generation));
        match (&expect, &head) {
            (ExpectHead::Current, _) | (ExpectHead::NoHead, None) => {}
            (ExpectHead::Id(want), Some(h)) if *want == h.id => {}
            (ExpectHead::Generation(None), None) => {}
            (ExpectHead::Generation(Some(g)), Some(h)) if *g == h.generation => {}
            _ => {
                return Err(StoreError::Conflict {
                    key: self.full_key(&head_key()),
                })
            }
        }
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
            async move { self.put_blob(&key, bytes).await }
        });
        futures::future::try_join_all(puts).await?;

        let manifest = CheckpointManifest {
            format_version: CHECKPOINT_FORMAT_VERSION,
            id: id.clone(),
            parent: ckpt.parent,
            branch: branch.to_string(),
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
        self.create_idempotent(&self.manifest_key(&id), body)
            .await?;
        self.advance_head(branch, head.map(|h| h.generation), &id)
            .await?;
        tracing::info!(id = %id, branch, step = manifest.step, root = self.root_url(), "committed checkpoint");
        Ok(manifest)
    }

    /// The checkpoint this branch's head names, or `None` when the branch has no checkpoint.
    /// The blobs are not verified here; [`RunStore::resume_point`] does that.
    pub async fn latest_checkpoint(&self) -> Result<Option<CheckpointManifest>, StoreError> {
        let Some(head) = self.branch_head(self.branch()).await? else {
            return Ok(None);
        };
        match self.read_manifest(&head.id).await? {
            Some(manifest) => Ok(Some(manifest)),
            None => Err(corrupt(
                &head.id,
                format!(
                    "the head of branch {} names it but its MANIFEST.json does not exist",
                    head.branch
                ),
            )),
        }
    }

    /// The manifest of checkpoint `id`; `NotFound` if it was never committed.
    pub async fn checkpoint(&self, id: &str) -> Result<CheckpointManifest, StoreError> {
        validate_segment(id)?;
        self.read_manifest(id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                key: self.manifest_key(id),
            })
    }

    /// Reads every blob of a checkpoint and verifies it against the manifest (CP-4).
    pub async fn verify_checkpoint(
        &self,
        manifest: &CheckpointManifest,
    ) -> Result<Vec<(String, Bytes)>, StoreError> {
        self.verify_files(manifest).await.map_err(|(_, e)| e)
    }

    /// Blobs verified, or the name of the blob that failed (if one did) and the error.
    async fn verify_files(
        &self,
        manifest: &CheckpointManifest,
    ) -> Result<Vec<(String, Bytes)>, (Option<String>, StoreError)> {
        let mut out = Vec::with_capacity(manifest.files.len());
        for f in &manifest.files {
            match self.read_checkpoint_file(manifest, &f.name).await {
                Ok(bytes) => out.push((f.name.clone(), bytes)),
                Err(e) => return Err((Some(f.name.clone()), e)),
            }
        }
        Ok(out)
    }

    /// The newest verifiable checkpoint on this branch's lineage (CP-7), or `None` when the branch
    /// has no head.
    pub async fn resume_point(&self) -> Result<Option<ResumePoint>, StoreError> {
        let Some(head) = self.branch_head(self.branch()).await? else {
            return Ok(None);
        };
        let mut skipped = Vec::new();
        let mut next = Some(head.id.clone());
        while let Some(id) = next.take() {
            let manifest = match self.read_manifest(&id).await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    skipped.push(SkippedCheckpoint {
                        id: id.clone(),
                        reason: "its MANIFEST.json does not exist".into(),
                    });
                    break;
                }
                Err(StoreError::CorruptCheckpoint { reason, .. }) => {
                    let _ = self
                        .quarantine(&format!("checkpoints/{id}/{MANIFEST}"), &reason)
                        .await;
                    skipped.push(SkippedCheckpoint { id, reason });
                    break;
                }
                Err(e) => return Err(e),
            };
            match self.verify_files(&manifest).await {
                Ok(files) => {
                    for s in &skipped {
                        tracing::warn!(skipped = %s.id, reason = %s.reason, resumed = %manifest.id,
                            "checkpoint failed verification; resuming from its newest verifiable ancestor");
                    }
                    return Ok(Some(ResumePoint {
                        manifest,
                        files,
                        head: head.id,
                        skipped,
                    }));
                }
                Err((name, StoreError::CorruptCheckpoint { reason, .. })) => {
                    if let Some(name) = name {
                        let _ = self
                            .quarantine(&format!("checkpoints/{id}/{name}"), &reason)
                            .await;
                    }
                    skipped.push(SkippedCheckpoint { id, reason });
                    next = manifest.parent.clone();
                }
                Err((_, e)) => return Err(e),
            }
        }
        Err(StoreError::NoVerifiableCheckpoint {
            branch: self.branch().to_string(),
            skipped: skipped
                .iter()
                .map(|s| format!("{}: {}", s.id, s.reason))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }

    /// Every committed checkpoint (CP-1), sorted by step, then creation time, then id.
    pub async fn list_checkpoints(&self) -> Result<Vec<CheckpointManifest>, StoreError> {
        let mut manifests = Vec::new();
        for id in self.checkpoint_ids().await? {
            // A directory without a manifest is an uncommitted checkpoint: not listed (CP-1).
            if let Some(manifest) = self.read_manifest(&id).await? {
                manifests.push(manifest);
            }
        }
        manifests.sort_by(|a, b| {
            (a.step, a.created_unix_ms, &a.id).cmp(&(b.step, b.created_unix_ms, &b.id))
        });
        Ok(manifests)
    }

    /// The ids of every checkpoint folder, committed or not (names that are not valid ids are
    /// left out).
    pub(crate) async fn checkpoint_ids(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.full_key("checkpoints");
        let listing = self.list_level(&dir).await?;
        Ok(listing
            .folders
            .iter()
            .filter_map(|p| p.rsplit('/').next())
            .filter(|id| validate_segment(id).is_ok())
            .map(str::to_string)
            .collect())
    }

    /// Reads blob `name` of a checkpoint and verifies its size and crc32 (CP-4).
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

    pub(crate) fn manifest_key(&self, id: &str) -> String {
        self.full_key(&format!("checkpoints/{id}/{MANIFEST}"))
    }

    /// The manifest of `id`, `None` if it does not exist, `CorruptCheckpoint` if it does not parse.
    pub(crate) async fn read_manifest(
        &self,
        id: &str,
    ) -> Result<Option<CheckpointManifest>, StoreError> {
        let bytes = match self.get_full(&self.manifest_key(id)).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        parse_manifest(id, &bytes).map(Some)
    }

    /// Writes one blob: create-only, or as a multipart upload at or above the threshold.
    pub(crate) async fn put_blob(&self, full_key: &str, bytes: Bytes) -> Result<(), StoreError> {
        if (bytes.len() as u64) < self.multipart_threshold() {
            return self.create_idempotent(full_key, bytes).await;
        }
        self.refuse_links_above(full_key)?;
        let path = to_path(full_key)?;
        let map = |e| StoreError::from_object_store(full_key, e);
        // HL-1: each step of the upload is one operation under the deadline.
        let mut upload = self
            .within_budget(full_key, async {
                self.backend()
                    .put_multipart_opts(&path, PutMultipartOptions::default())
                    .await
                    .map_err(map)
            })
            .await?;
        let part = PART_BYTES.max(self.multipart_threshold() as usize);
        let mut result = Ok(());
        for chunk in (0..bytes.len()).step_by(part) {
            let end = (chunk + part).min(bytes.len());
            let sent = upload.put_part(PutPayload::from(bytes.slice(chunk..end)));
            if let Err(e) = self
                .within_budget(full_key, async { sent.await.map_err(map) })
                .await
            {
                result = Err(e);
                break;
            }
        }
        if result.is_ok() {
            result = self
                .within_budget(full_key, async {
                    upload.complete().await.map(|_| ()).map_err(map)
                })
                .await;
            if result.is_ok() {
                return Ok(());
            }
        }
        let _ = self
            .within_budget(full_key, async { upload.abort().await.map_err(map) })
            .await;
        result
    }
}

/// Checks CP-6 and that the manifest will round-trip through JSON.
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
    // What parse_manifest would refuse is never written.
    ckpt.data.check().map_err(invalid)?;
    Ok(())
}

/// `{step:08}-{8 hex}` with the hex from the clock, the process id and a counter (CP-5).
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
pub(crate) mod tests;
