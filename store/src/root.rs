//! A run root: the directory (local) or bucket prefix (S3) that holds everything one run writes.
//!
//! ```text
//! <root>/batches/0000000012-l0000000003.krb      rollout batches of branch `main`, framed (`frame`)
//! <root>/branches/<b>/batches/0000000012.krb      rollout batches of any other branch `b`
//! <root>/branches/<b>/HEAD.0000000007            branch heads (see `branch`)
//! <root>/checkpoints/<id>/...                    checkpoints (see `checkpoint`)
//! <root>/tags/<tag>/<id>                         tags added after commit (see `lineage`)
//! <root>/lives/, weights/, orders/, results/      trainer lives, published weights, work orders
//! <root>/quarantine/<rel key>                    corrupt objects moved aside (see `quarantine`)
//! <root>/<any rel key>                           other objects, through put_object / get_object
//! ```
//!
//! A [`RunStore`] handle is scoped to one branch ([`RunStore::on_branch`], default
//! [`DEFAULT_BRANCH`]): its batches, its `latest_checkpoint` and its commits are that branch's.
//!
//! Invariants:
//! - ST-1: a batch object is never overwritten: [`RunStore::put_batch`] writes with
//!   `PutMode::Create`, so a second put of the same `batch_seq` fails with `AlreadyExists` and
//!   leaves the first untouched.
//! - ST-2: nothing a caller passes can name an object outside the run root: every relative key is
//!   checked by KY-1 (see `key`), and batch keys are built from the sequence number alone.
//! - ST-3: [`RunStore::list_batches`] returns every stored batch once, sorted by `batch_seq`
//!   (numerically, not lexically), and ignores objects that are not `<digits>[-<writer>].krb`
//!   directly in the batch folder.
//! - ST-12: a handle tagged with a writer ([`RunStore::with_writer`]: a trainer life, a
//!   generator process) stores batch `n` at `<n>-<writer>.krb`, so writers of different lives or
//!   processes never race for a key; readers take keys from listings or from whoever wrote them.
//! - ST-4: [`RunStore::get_batch`] returns only batches that pass every frame check (FR-1..FR-4);
//!   a failure names the corrupt key.
//! - ST-5: writes are atomic (all or nothing) on both backends; the local backend also fsyncs
//!   files and directories before a write returns, matching S3's durability.
//! - ST-6: S3 settings come only from the standard `AWS_*` environment; they are never logged.
//! - ST-7: transient S3 failures (connection refused, timeouts, 5xx) are retried with exponential
//!   backoff (0.1 s doubling to 5 s) for up to [`s3_retry_timeout`] per request, so an outage of
//!   tens of seconds pauses the caller and loses nothing.
//! - ST-9: object_store does not retry conditional (create-only / CAS) puts on transport errors;
//!   `put_full` does, within the same time budget, and a create-only retry that finds its own
//!   bytes already there succeeds (the first attempt landed).
//! - ST-8: two branches never share a batch object: batch keys live under the branch's own
//!   prefix, so branches of one run root can train at the same time.
//! - ST-11: an `http://` S3 endpoint that is not loopback is used, with a warning that
//!   credentials and data travel unencrypted.
//! - ST-10: a local write that was killed leaves at most a staging file `<key>#<n>` beside its
//!   key ('#' is never in a key, KY-1): listings never show it, and
//!   [`RunStore::remove_interrupted_writes`] removes it.
//! - ST-14: listings skip names keel never writes, on both backends: an object whose key breaks
//!   KY-1 (a control character, an odd segment) is left out with one warning naming it escaped,
//!   and the rest is listed; on S3, where object_store fails a whole listing page for such a
//!   name, the page is bisected around it (LI-1, LI-2 in `listing`). Such a name is never
//!   fatal and never reported as a credentials problem.
//! - ST-13: a local run root never follows a symbolic link: reading a key that is a link, or lies
//!   under one inside the root, is refused ([`StoreError::Link`]) before anything is read (and a
//!   write or delete under a linked folder before anything is written or removed), so a
//!   planted link can never bring a file from outside the root into it (quarantine moves the
//!   link itself, QU-3); listings list a link by its own name and never walk into a linked
//!   folder (LI-3).

use std::path::Path as FsPath;
use std::sync::Arc;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::list::PaginatedListStore;
use object_store::local::LocalFileSystem;
use object_store::{
    BackoffConfig, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutResult,
    RetryConfig,
};

use crate::batch::{BatchBuf, RolloutBatch};
use crate::error::StoreError;
use crate::frame::{decode_batch, encode_batch};
use crate::health::Health;
use crate::key::{join, to_path, validate_branch, validate_rel_key, validate_segment};
use crate::listing::Lister;

/// The branch a run root trains on unless told otherwise.
pub const DEFAULT_BRANCH: &str = "main";
/// How long one S3 request is retried before its error surfaces (ST-7): 60 s, or
/// `KEEL_S3_RETRY_TIMEOUT_S` seconds (read once per process).
pub fn s3_retry_timeout() -> std::time::Duration {
    static BUDGET: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let secs = std::env::var("KEEL_S3_RETRY_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s >= 1)
            .unwrap_or(60);
        std::time::Duration::from_secs(secs)
    })
}

/// Checkpoint blobs at least this large are uploaded in parts by default.
pub const DEFAULT_MULTIPART_BYTES: u64 = 16 << 20;

/// zstd level used for rollout batches: fast to write, ~3-4x on token streams.
pub const BATCH_ZSTD_LEVEL: i32 = 3;

/// The full key of a stored rollout batch, relative to the object store (prefix included),
/// e.g. `run-7/batches/0000000012.krb`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchKey(pub String);

impl BatchKey {
    /// The batch sequence number encoded in the key's file name, if it has the `<digits>.krb` form.
    pub fn batch_seq(&self) -> Option<u64> {
        let name = self.0.rsplit('/').next()?;
        let stem = name.strip_suffix(".krb")?;
        // `<seq>.krb`, or `<seq>-<writer>.krb` for a batch of a tagged writer (ST-12).
        let digits = stem.split_once('-').map_or(stem, |(seq, _)| seq);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }
}

impl std::fmt::Display for BatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A handle on one run root. Cheap to clone; clones share the backend connection.
#[derive(Clone)]
pub struct RunStore {
    inner: Arc<Inner>,
    branch: String,
    multipart_bytes: u64,
    /// ST-12: the tag this handle's batches carry in their keys (a trainer life, a generator
    /// process), so that two writers never race for one batch key.
    writer: Option<String>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    /// Key prefix inside the backend, without leading or trailing `/`; empty for local roots.
    prefix: String,
    root_url: String,
    /// The directory of a local root (None for S3).
    local_dir: Option<std::path::PathBuf>,
    /// How this root is listed (LI-1..4).
    lister: Lister,
    /// Whether an S3 store is down (HL-2; `None` for local roots, HL-3).
    health: Option<Health>,
    /// How long an S3 request is retried (ST-7, HL-1).
    budget: std::time::Duration,
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The backend's Display names the bucket or directory only, never credentials (ST-6).
        f.debug_struct("RunStore")
            .field("root", &self.inner.root_url)
            .field("backend", &self.inner.store.to_string())
            .field("prefix", &self.inner.prefix)
            .field("branch", &self.branch)
            .finish()
    }
}

impl RunStore {
    /// Opens a run root: a local directory path (created if missing; relative paths allowed),
    /// a `file://` URL, or `s3://bucket/prefix`.
    ///
    /// S3 settings come from the standard AWS environment (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` or
    /// `AWS_ENDPOINT`); with an `http://` endpoint, plain HTTP and path-style requests are used.
    pub fn open(root: &str) -> Result<RunStore, StoreError> {
        Self::open_with(root, AmazonS3Builder::from_env(), s3_retry_timeout())
    }

    /// [`RunStore::open`] with the S3 settings and the retry budget given (tests).
    pub(crate) fn open_with(
        root: &str,
        s3_settings: AmazonS3Builder,
        budget: std::time::Duration,
    ) -> Result<RunStore, StoreError> {
        let bad = |reason: String| StoreError::InvalidRoot {
            root: root.to_string(),
            reason,
        };
        if root.trim().is_empty() {
            return Err(bad("the root is empty".into()));
        }
        let mut local_dir = None;
        let mut pager: Option<Arc<dyn PaginatedListStore>> = None;
        let (store, prefix): (Arc<dyn ObjectStore>, String) = if root.contains("://") {
            let url = url::Url::parse(root).map_err(|e| bad(format!("not a valid URL: {e}")))?;
            if !url.username().is_empty() || url.password().is_some() {
                // Never echo credentials (ST-6): report the root without its user info.
                let mut shown = url.clone();
                let _ = shown.set_username("");
                let _ = shown.set_password(None);
                return Err(StoreError::InvalidRoot {
                    root: shown.to_string(),
                    reason: "credentials in the URL are not accepted; set AWS_* variables".into(),
                });
            }
            match url.scheme() {
                "s3" => {
                    let (s3, prefix) = open_s3(&url, s3_settings, budget).map_err(bad)?;
                    pager = Some(s3.clone());
                    (s3, prefix)
                }
                "file" => {
                    let path = url
                        .to_file_path()
                        .map_err(|()| bad("the file:// URL is not a local absolute path".into()))?;
                    let store = open_local(&path).map_err(bad)?;
                    local_dir = Some(path);
                    (store, String::new())
                }
                other => return Err(bad(format!("unsupported scheme {other:?}"))),
            }
        } else {
            let store = open_local(FsPath::new(root)).map_err(bad)?;
            local_dir = Some(FsPath::new(root).to_path_buf());
            (store, String::new())
        };
        tracing::debug!(root, backend = %store, "opened run root");
        let lister = match (&local_dir, pager) {
            (Some(dir), _) => Lister::Local(dir.clone()),
            (None, Some(pager)) => Lister::S3(pager),
            (None, None) => return Err(bad("no way to list this root".into())),
        };
        Ok(RunStore {
            inner: Arc::new(Inner {
                store,
                prefix,
                root_url: root.to_string(),
                health: pager_health(&local_dir),
                local_dir,
                lister,
                budget,
            }),
            branch: DEFAULT_BRANCH.to_string(),
            multipart_bytes: DEFAULT_MULTIPART_BYTES,
            writer: None,
        })
    }

    /// The same run root, scoped to branch `name` (validated by KY-4).
    pub fn on_branch(&self, name: &str) -> Result<RunStore, StoreError> {
        validate_branch(name)?;
        let mut other = self.clone();
        other.branch = name.to_string();
        Ok(other)
    }

    /// The branch this handle reads and commits on.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// Checkpoint blobs of at least `bytes` bytes are uploaded in parts (S3 multipart).
    pub fn with_multipart_threshold(mut self, bytes: u64) -> RunStore {
        self.multipart_bytes = bytes.max(1);
        self
    }

    /// The multipart threshold in bytes.
    pub fn multipart_threshold(&self) -> u64 {
        self.multipart_bytes
    }

    /// The relative folder of this branch's batches (ST-8).
    pub fn batch_dir(&self) -> String {
        self.branch_dir("batches")
    }

    /// The relative folder `name` of this branch: `name` on `main`, `branches/<b>/name` else.
    pub fn branch_dir(&self, name: &str) -> String {
        if self.branch == DEFAULT_BRANCH {
            name.to_string()
        } else {
            format!("branches/{}/{name}", self.branch)
        }
    }

    /// The root as the user gave it, for messages.
    pub fn root_url(&self) -> &str {
        &self.inner.root_url
    }

    /// The key this handle stores batch `batch_seq` under: `<prefix>/batches/{batch_seq:010}.krb`,
    /// or `…/{batch_seq:010}-<writer>.krb` for a tagged writer (ST-12).
    pub fn batch_key(&self, batch_seq: u64) -> BatchKey {
        let name = match &self.writer {
            Some(w) => format!("{batch_seq:010}-{w}.krb"),
            None => format!("{batch_seq:010}.krb"),
        };
        BatchKey(self.full_key(&format!("{}/{name}", self.batch_dir())))
    }

    /// The same run root, writing batches under keys tagged `writer` (ST-12; 1-64 of
    /// `[A-Za-z0-9._-]`).
    pub fn with_writer(mut self, writer: &str) -> Result<RunStore, StoreError> {
        validate_segment(writer)?;
        self.writer = Some(writer.to_string());
        Ok(self)
    }

    /// Validates, encodes and stores `batch` under [`RunStore::batch_key`]; never overwrites (ST-1).
    pub async fn put_batch(&self, batch: &RolloutBatch) -> Result<BatchKey, StoreError> {
        let key = self.batch_key(batch.batch_seq);
        let owned = batch.clone();
        let framed = tokio::task::spawn_blocking(move || encode_batch(&owned, BATCH_ZSTD_LEVEL))
            .await
            .map_err(|e| StoreError::Encode(format!("encoder task failed: {e}")))??;
        self.put_full(&key.0, Bytes::from(framed), PutMode::Create)
            .await?;
        tracing::debug!(key = %key, "stored rollout batch");
        Ok(key)
    }

    /// Reads and fully checks a batch (ST-4). Decode failures come back as `CorruptBatch`.
    pub async fn get_batch(&self, key: &BatchKey) -> Result<BatchBuf, StoreError> {
        let bytes = match self.get_full(&key.0).await {
            Ok(bytes) => bytes,
            // ST-13: a link where a batch should be is not a batch keel wrote.
            Err(e @ StoreError::Link { .. }) => {
                return Err(StoreError::CorruptBatch {
                    key: key.0.clone(),
                    source: Box::new(e),
                })
            }
            Err(e) => return Err(e),
        };
        let decoded = tokio::task::spawn_blocking(move || decode_batch(&bytes))
            .await
            .map_err(|e| StoreError::InvalidArchive(format!("decoder task failed: {e}")));
        match decoded {
            Ok(Ok(buf)) => Ok(buf),
            Ok(Err(source)) | Err(source) => Err(StoreError::CorruptBatch {
                key: key.0.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// Every object under the full key `dir` (unsorted; LI-1..4).
    async fn list_full(&self, dir: &str) -> Result<Vec<object_store::ObjectMeta>, StoreError> {
        self.list_tree(dir, None).await
    }

    /// Every stored batch, sorted by `batch_seq` (ST-3).
    pub async fn list_batches(&self) -> Result<Vec<BatchKey>, StoreError> {
        self.list_batches_from(0).await
    }

    /// Every stored batch with `batch_seq >= first_seq`, sorted by `batch_seq` (ST-3). The
    /// listing starts after the key `…/batches/<first_seq:010>` (S3's `start-after`), so a run
    /// root with many old batches is not listed whole: the zero-padded names sort like their
    /// numbers.
    pub async fn list_batches_from(&self, first_seq: u64) -> Result<Vec<BatchKey>, StoreError> {
        let dir = self.full_key(&self.batch_dir());
        let offset = join(&dir, &format!("{first_seq:010}"));
        let metas = self.list_tree(&dir, Some(&offset)).await?;
        let mut keys: Vec<(u64, BatchKey)> = metas
            .into_iter()
            .filter_map(|meta| {
                let key = BatchKey(meta.location.to_string());
                // ST-3: only names directly in the folder; keel never writes batches deeper.
                let direct = key
                    .0
                    .strip_prefix(&dir)
                    .is_some_and(|rest| rest.matches('/').count() == 1);
                match key.batch_seq().filter(|_| direct) {
                    Some(seq) if seq >= first_seq => Some((seq, key)),
                    Some(_) => None,
                    None => {
                        tracing::debug!(key = %key, "ignoring non-batch object under batches/");
                        None
                    }
                }
            })
            .collect();
        keys.sort();
        Ok(keys.into_iter().map(|(_, key)| key).collect())
    }

    /// The keys (relative to the run root, sorted) of every object under the folder
    /// `rel_dir`; an absent folder is empty.
    pub async fn list_objects(&self, rel_dir: &str) -> Result<Vec<String>, StoreError> {
        validate_rel_key(rel_dir)?;
        let metas = self.list_full(&self.full_key(rel_dir)).await?;
        let root = self.full_key("");
        let mut keys: Vec<String> = metas
            .into_iter()
            .map(|m| {
                let full = m.location.to_string();
                full.strip_prefix(root.trim_end_matches('/'))
                    .map(|k| k.trim_start_matches('/').to_string())
                    .unwrap_or(full)
            })
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Removes what interrupted writes left in the folder `rel_dir` and returns how many files
    /// went. The local backend writes an object as a staging file `<key>#<n>` and renames it
    /// into place (ST-10); a process killed in between leaves the staging file, which no listing
    /// shows but a tool globbing the folder (TensorBoard) reads. S3 puts are atomic: nothing to
    /// do. Call it only on a folder that no other live process writes.
    pub fn remove_interrupted_writes(&self, rel_dir: &str) -> Result<usize, StoreError> {
        validate_rel_key(rel_dir)?;
        let Some(root) = &self.inner.local_dir else {
            return Ok(0);
        };
        let dir = root.join(self.full_key(rel_dir));
        let io = |path: &FsPath, source| StoreError::LocalIo {
            path: path.display().to_string(),
            source,
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io(&dir, e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| io(&dir, e))?;
            if entry.file_name().to_string_lossy().contains('#') {
                std::fs::remove_file(entry.path()).map_err(|e| io(&entry.path(), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Stores `bytes` at `rel_key` under the run root, overwriting any previous object.
    pub async fn put_object(&self, rel_key: &str, bytes: Bytes) -> Result<(), StoreError> {
        validate_rel_key(rel_key)?;
        self.put_full(&self.full_key(rel_key), bytes, PutMode::Overwrite)
            .await?;
        Ok(())
    }

    /// Stores `bytes` at `rel_key` under the run root, create-only: an existing object is
    /// `AlreadyExists` (a retried put whose first attempt landed counts as done, ST-9).
    pub async fn create_object(&self, rel_key: &str, bytes: Bytes) -> Result<(), StoreError> {
        validate_rel_key(rel_key)?;
        self.put_full(&self.full_key(rel_key), bytes, PutMode::Create)
            .await?;
        Ok(())
    }

    /// The key of this branch's method state object `name` (RTPO trunks, PATS banks):
    /// `state/<name>` on `main`, `branches/<b>/state/<name>` elsewhere (like batches, ST-8).
    pub fn state_key(&self, name: &str) -> String {
        format!("{}/{name}", self.branch_dir("state"))
    }

    /// Reads the object at `rel_key` under the run root.
    pub async fn get_object(&self, rel_key: &str) -> Result<Bytes, StoreError> {
        validate_rel_key(rel_key)?;
        self.get_full(&self.full_key(rel_key)).await
    }

    /// Deletes the object at `rel_key` under the run root; an absent one is no error.
    pub async fn delete_object(&self, rel_key: &str) -> Result<(), StoreError> {
        validate_rel_key(rel_key)?;
        self.delete_full(&self.full_key(rel_key)).await
    }

    // ---- crate-internal primitives, shared with `checkpoint` --------------------------------

    /// The backend.
    pub(crate) fn backend(&self) -> &dyn ObjectStore {
        self.inner.store.as_ref()
    }

    /// Joins the run prefix and an already validated relative key.
    pub(crate) fn full_key(&self, rel: &str) -> String {
        join(&self.inner.prefix, rel)
    }

    /// Writes `bytes` at a full key with `mode` (ST-9).
    ///
    /// object_store retries only requests it knows to be idempotent; a conditional PUT that dies
    /// on a transport error (connection reset, refused while the server restarts) comes back at
    /// once. Those are retried here with backoff for up to [`s3_retry_timeout`]. A create-only
    /// retry that finds the object already holding exactly `bytes` is the first attempt having
    /// landed, and counts as success.
    pub(crate) async fn put_full(
        &self,
        full_key: &str,
        bytes: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        self.within_budget(full_key, self.put_retrying(full_key, bytes, mode))
            .await
    }

    /// [`RunStore::put_full`]'s retries, within the budget (HL-1 bounds the last attempt).
    async fn put_retrying(
        &self,
        full_key: &str,
        bytes: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        let budget = self.budget();
        let started = std::time::Instant::now();
        let mut backoff = std::time::Duration::from_millis(100);
        let mut attempt = 0u32;
        loop {
            match self.put_once(full_key, bytes.clone(), mode.clone()).await {
                Err(StoreError::AlreadyExists { key })
                    if attempt > 0 && matches!(mode, PutMode::Create) =>
                {
                    return match self.get_once(full_key).await {
                        Ok(existing) if existing == bytes => Ok(PutResult {
                            e_tag: None,
                            version: None,
                            extensions: Default::default(),
                        }),
                        _ => Err(StoreError::AlreadyExists { key }),
                    };
                }
                Err(StoreError::ObjectStore {
                    key,
                    source: object_store::Error::Generic { store, source },
                }) if started.elapsed() < budget => {
                    attempt += 1;
                    tracing::warn!(key = %key, store, attempt, error = %source, "transient store error; retrying");
                    tokio::time::sleep(backoff.min(budget.saturating_sub(started.elapsed()))).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    async fn put_once(
        &self,
        full_key: &str,
        bytes: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        self.refuse_links_above(full_key)?;
        let path = to_path(full_key)?;
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.backend()
            .put_opts(&path, bytes.into(), opts)
            .await
            .map_err(|e| StoreError::from_object_store(full_key, e))
    }

    /// Deletes the object at a full key; a missing object is not an error.
    pub(crate) async fn delete_full(&self, full_key: &str) -> Result<(), StoreError> {
        self.refuse_links_above(full_key)?;
        let path = to_path(full_key)?;
        self.within_budget(full_key, async {
            match self.backend().delete(&path).await {
                Ok(()) => Ok(()),
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(StoreError::from_object_store(full_key, e)),
            }
        })
        .await
    }

    /// Every object under the relative folder `rel_dir` (recursively); empty if there is none.
    pub(crate) async fn list_rel(&self, rel_dir: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        validate_rel_key(rel_dir)?;
        self.list_tree(&self.full_key(rel_dir), None).await
    }

    /// The key relative to the run root of a full key, if it lies under the run root.
    pub(crate) fn rel_key<'a>(&self, full_key: &'a str) -> Option<&'a str> {
        if self.inner.prefix.is_empty() {
            return Some(full_key);
        }
        full_key
            .strip_prefix(self.inner.prefix.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
    }

    /// Creates the object at a full key unless it exists; if it exists with exactly `bytes`
    /// (a retried request whose first attempt landed), that counts as success.
    pub(crate) async fn create_idempotent(
        &self,
        full_key: &str,
        bytes: Bytes,
    ) -> Result<(), StoreError> {
        match self
            .put_full(full_key, bytes.clone(), PutMode::Create)
            .await
        {
            Ok(_) => Ok(()),
            Err(StoreError::AlreadyExists { key }) => match self.get_full(full_key).await {
                Ok(existing) if existing == bytes => Ok(()),
                _ => Err(StoreError::AlreadyExists { key }),
            },
            Err(e) => Err(e),
        }
    }

    /// Reads the whole object at a full key.
    pub(crate) async fn get_full(&self, full_key: &str) -> Result<Bytes, StoreError> {
        self.within_budget(full_key, self.get_once(full_key)).await
    }

    async fn get_once(&self, full_key: &str) -> Result<Bytes, StoreError> {
        self.refuse_links(full_key)?;
        let path = to_path(full_key)?;
        let map = |e| StoreError::from_object_store(full_key, e);
        self.backend()
            .get(&path)
            .await
            .map_err(map)?
            .bytes()
            .await
            .map_err(map)
    }
}

impl RunStore {
    /// ST-13: `Err(Link)` when the local file of `full_key`, or a folder above it inside the
    /// root, is a symbolic link; S3 roots have no links.
    pub(crate) fn refuse_links(&self, full_key: &str) -> Result<(), StoreError> {
        let Some(link) = self.link_in(full_key) else {
            return Ok(());
        };
        Err(StoreError::Link {
            key: full_key.to_string(),
            link: link.display().to_string(),
        })
    }

    /// ST-13 for writes and deletes: `Err(Link)` when a folder above the local file of
    /// `full_key` inside the root is a symbolic link (a write there would land outside the
    /// root). The key itself may be a link: a put replaces it and a delete removes it, neither
    /// touches its target.
    pub(crate) fn refuse_links_above(&self, full_key: &str) -> Result<(), StoreError> {
        let parent = full_key.rsplit_once('/').map_or("", |(dir, _)| dir);
        match self.link_in(parent) {
            Some(link) => Err(StoreError::Link {
                key: full_key.to_string(),
                link: link.display().to_string(),
            }),
            None => Ok(()),
        }
    }

    /// How this root is listed (LI-1..4).
    pub(crate) fn lister(&self) -> &Lister {
        &self.inner.lister
    }

    /// HL-2 state (`None` for a local root).
    pub(crate) fn health(&self) -> Option<&Health> {
        self.inner.health.as_ref()
    }

    /// How long an S3 request is retried (ST-7).
    pub(crate) fn budget(&self) -> std::time::Duration {
        self.inner.budget
    }

    /// The directory of a local root (`None` for S3).
    pub(crate) fn local_dir(&self) -> Option<&std::path::Path> {
        self.inner.local_dir.as_deref()
    }

    /// The first symbolic link on the local path of `full_key`, if any.
    pub(crate) fn link_in(&self, full_key: &str) -> Option<std::path::PathBuf> {
        let mut path = self.inner.local_dir.clone()?;
        for part in full_key.split('/').filter(|p| !p.is_empty()) {
            path.push(part);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => return Some(path),
                Ok(_) => {}
                Err(_) => return None, // missing: the read itself says NotFound
            }
        }
        None
    }
}

fn open_local(dir: &FsPath) -> Result<Arc<dyn ObjectStore>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create directory: {e}"))?;
    let fs = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| format!("cannot use directory: {e}"))?
        .with_fsync(true);
    Ok(Arc::new(fs))
}

/// HL-2 state for an S3 root; local roots have none (HL-3).
fn pager_health(local_dir: &Option<std::path::PathBuf>) -> Option<Health> {
    local_dir.is_none().then(Health::default)
}

fn open_s3(
    url: &url::Url,
    settings: AmazonS3Builder,
    budget: std::time::Duration,
) -> Result<(Arc<AmazonS3>, String), String> {
    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or("the s3:// URL has no bucket")?;
    if url.query().is_some() || url.fragment().is_some() {
        return Err("the s3:// URL must not have a query or fragment".into());
    }
    let prefix = url.path().trim_matches('/').to_string();
    if !prefix.is_empty() {
        validate_rel_key(&prefix).map_err(|e| format!("bad prefix: {e}"))?;
    }
    let s3 = configure_s3(settings, bucket)
        .with_retry(s3_retry(budget))
        .build()
        .map_err(|e| format!("cannot configure S3 from the AWS_* environment: {e}"))?;
    Ok((Arc::new(s3), prefix))
}

/// Backoff and retry budget of every S3 request (ST-7).
fn s3_retry(budget: std::time::Duration) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: std::time::Duration::from_millis(100),
            max_backoff: std::time::Duration::from_secs(5),
            base: 2.0,
        },
        // The jittered backoff (a random draw in [init, 2 × previous]) can stay short, so a
        // retry count would end a 20 s outage early: the timeout is the budget (ST-7).
        max_retries: 100_000,
        retry_timeout: budget,
    }
}

/// Whether `endpoint` is plain `http://` to a host other than loopback (warned about, ST-11).
fn plaintext_remote(endpoint: &str) -> bool {
    let Ok(url) = url::Url::parse(endpoint) else {
        return false;
    };
    if url.scheme() != "http" {
        return false;
    }
    match url.host() {
        Some(url::Host::Ipv4(ip)) => !ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => !ip.is_loopback(),
        Some(url::Host::Domain(d)) => d != "localhost",
        None => false,
    }
}

/// Sets the bucket and, for an `http://` endpoint (a local S3-compatible server), allows plain
/// HTTP and uses path-style requests.
fn configure_s3(builder: AmazonS3Builder, bucket: &str) -> AmazonS3Builder {
    let builder = builder.with_bucket_name(bucket);
    let endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
    if endpoint.as_deref().is_some_and(plaintext_remote) {
        tracing::warn!(
            endpoint = %endpoint.as_deref().unwrap_or_default(),
            "the S3 endpoint is plain HTTP and not on this machine: credentials and data travel unencrypted; use https:// unless the network is private"
        );
    }
    if endpoint.is_some_and(|e| e.starts_with("http://")) {
        builder
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
    } else {
        builder
    }
}

#[cfg(test)]
#[path = "root_tests.rs"]
mod tests;
