//! The one error type of `keel-store`.
//!
//! Invariants:
//! - ER-1: every failure the store, the network, a file on disk or a caller can cause surfaces as a
//!   [`StoreError`] variant; nothing in this crate panics on bad input.
//! - ER-2: each message says what happened, which object it concerns, and what to do next.
//! - ER-3: messages never contain credentials; object-store errors carry only the object key and
//!   the backend's own error text.

use thiserror::Error;

/// Everything that can go wrong reading or writing a run root.
#[derive(Error, Debug)]
pub enum StoreError {
    /// The bytes do not start with the rollout-batch magic `KEELRB\0\0`.
    #[error(
        "not a keel rollout batch: the first 8 bytes are not the magic \"KEELRB\\0\\0\"; \
         check that the key points at a .krb object written by keel"
    )]
    BadMagic,

    /// The frame was written in a format version this build cannot read.
    #[error(
        "rollout batch format version {found} is not supported (this keel reads version {}); \
         read it with the keel version that wrote it, or regenerate the batch",
        crate::frame::BATCH_FORMAT_VERSION
    )]
    UnsupportedVersion {
        /// The version found in the frame header.
        found: u32,
    },

    /// The frame is shorter than its header says.
    #[error(
        "rollout batch is truncated: expected {expected} bytes, found {found}; \
         the write was interrupted or the object was cut short — regenerate the batch"
    )]
    Truncated {
        /// Bytes the header (or the header itself) requires.
        expected: u64,
        /// Bytes actually present.
        found: u64,
    },

    /// The frame is longer than its header says.
    #[error(
        "rollout batch has trailing bytes: header says {expected} bytes in total, found {found}; \
         the object was corrupted or concatenated — regenerate the batch"
    )]
    TrailingBytes {
        /// Bytes the header says the frame has.
        expected: u64,
        /// Bytes actually present.
        found: u64,
    },

    /// The payload checksum does not match the one in the header.
    #[error(
        "rollout batch checksum mismatch: header says crc32 {expected:#010x}, payload has \
         {found:#010x}; the object is corrupt — quarantine it and regenerate the batch"
    )]
    ChecksumMismatch {
        /// The crc32 stored in the header.
        expected: u32,
        /// The crc32 computed over the payload.
        found: u32,
    },

    /// The zstd payload could not be decompressed (or decompresses to more than the limit).
    #[error("rollout batch payload could not be decompressed: {0}; regenerate the batch")]
    Decompress(String),

    /// The decompressed bytes are not a valid rkyv archive of a `RolloutBatch`.
    #[error(
        "rollout batch archive failed validation: {0}; the object is corrupt or was written by an \
         incompatible keel build — regenerate the batch"
    )]
    InvalidArchive(String),

    /// A rollout batch could not be serialized or compressed.
    #[error("could not encode rollout batch: {0}")]
    Encode(String),

    /// A rollout batch breaks the data-model rules checked by `RolloutBatch::validate`.
    #[error("invalid rollout batch: {reason}; fix the producer that built it")]
    InvalidBatch {
        /// Which rule was broken, and where.
        reason: String,
    },

    /// A stored rollout batch failed to decode; `source` says how.
    #[error("rollout batch {key} is corrupt: {source}")]
    CorruptBatch {
        /// The object key of the batch.
        key: String,
        /// The decoding failure.
        #[source]
        source: Box<StoreError>,
    },

    /// The object store backend failed.
    #[error("object store error on {key}: {source}; {}", store_hint(.source))]
    ObjectStore {
        /// The object key the operation was on.
        key: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },

    /// The object does not exist.
    #[error("object {key} not found; check the run root and the key")]
    NotFound {
        /// The missing object's key.
        key: String,
    },

    /// The object already exists and this store never overwrites it.
    #[error(
        "object {key} already exists and is never overwritten; use a new sequence number or id"
    )]
    AlreadyExists {
        /// The existing object's key.
        key: String,
    },

    /// Another writer changed an object between our read and our conditional write.
    #[error(
        "{key} was changed by another writer during this update; another process is writing \
         the same run root — stop it, re-read the latest state and retry"
    )]
    Conflict {
        /// The contended object's key.
        key: String,
    },

    /// A newer trainer life owns the branch (LV-2): this trainer must stop without writing.
    #[error(
        "trainer life {life} of branch {branch} was superseded by {winner}, which owns the run \
         root now; this trainer stops without writing (start only one trainer per branch)"
    )]
    Superseded {
        /// The branch.
        branch: String,
        /// This trainer's life.
        life: u64,
        /// The newest life, described.
        winner: String,
    },

    /// A small control object (life record, weights pointer, work order) failed its checks.
    #[error("{key} is corrupt: {reason}")]
    CorruptObject {
        /// Its key.
        key: String,
        /// What was wrong.
        reason: String,
    },

    /// A caller-supplied key could escape the run root or is not portable.
    #[error("invalid object key {key:?}: {reason}; use a relative path of plain segments")]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The run root could not be opened.
    #[error(
        "invalid run root {root:?}: {reason}; use a local directory, a file:// URL or \
         s3://bucket/prefix"
    )]
    InvalidRoot {
        /// The root as given.
        root: String,
        /// Why it could not be opened.
        reason: String,
    },

    /// A checkpoint's manifest, HEAD or blobs are inconsistent.
    #[error(
        "checkpoint {id} is corrupt: {reason}; resume from an earlier checkpoint \
         (`keel ckpt list RUN_ROOT` shows them) or repair the run root"
    )]
    CorruptCheckpoint {
        /// The checkpoint id.
        id: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A branch has a head but no checkpoint on its lineage passes verification (CP-7).
    #[error(
        "branch {branch} has no verifiable checkpoint (tried: {skipped}); restore the run root \
         from a backup or start a new branch with `keel train --from <checkpoint>`"
    )]
    NoVerifiableCheckpoint {
        /// The branch.
        branch: String,
        /// Each checkpoint tried and why it failed.
        skipped: String,
    },

    /// A checkpoint to commit breaks a rule (bad metric value, duplicate or reserved file name).
    #[error("invalid checkpoint: {reason}; fix the caller that built it")]
    InvalidCheckpoint {
        /// Which rule was broken.
        reason: String,
    },

    /// A listing met an object name that object_store cannot represent in a way the listing
    /// could not route around (ST-14 routes around control characters and odd segments).
    #[error(
        "an object under {dir} has a name keel never writes ({reason}); remove that object from \
         the run root (keel never creates such names)"
    )]
    ForeignName {
        /// The folder being listed.
        dir: String,
        /// What object_store said of the name.
        reason: String,
    },

    /// The S3 store did not answer within the retry budget (HL-1), or is down (HL-2).
    #[error(
        "the object store did not answer for {key} within its {budget_s} s retry budget; check \
         that the S3 endpoint (AWS_ENDPOINT_URL) is up and reachable from this machine"
    )]
    Unreachable {
        /// The key (or folder) of the operation.
        key: String,
        /// The retry budget in seconds (ST-7).
        budget_s: u64,
    },

    /// A key of a local run root is a symbolic link, or lies under one (ST-13).
    #[error(
        "object {key} is a symbolic link or lies under one ({link}); keel never follows links \
         in a local run root: remove the link"
    )]
    Link {
        /// The object's key.
        key: String,
        /// The link on its path.
        link: String,
    },

    /// A file of a local run root could not be read or removed.
    #[error("local run root {path}: {source}")]
    LocalIo {
        /// The file or folder.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A local model cache file could not be read or written.
    #[error("model cache {path}: {reason}")]
    ModelCache {
        /// The cache file or folder.
        path: String,
        /// What failed.
        reason: String,
    },

    /// JSON (de)serialization failed.
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),
}

/// What to check for a backend error: credentials only when the store said so.
fn store_hint(source: &object_store::Error) -> &'static str {
    let credentials = "check the credentials in the AWS_* environment";
    match source {
        object_store::Error::Unauthenticated { .. }
        | object_store::Error::PermissionDenied { .. } => credentials,
        object_store::Error::Generic { .. }
            if source.to_string().to_lowercase().contains("credential") =>
        {
            credentials
        }
        object_store::Error::Generic { .. } => {
            "check that the S3 endpoint (AWS_ENDPOINT_URL) is up and reachable from this machine"
        }
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            "this store does not support what keel needs; use a local directory or an S3 store"
        }
        _ => "check the run root",
    }
}

impl StoreError {
    /// Maps a backend error on `key`, turning the cases callers act on into their own variants.
    pub(crate) fn from_object_store(key: &str, source: object_store::Error) -> StoreError {
        let key = key.to_string();
        match source {
            object_store::Error::NotFound { .. } => StoreError::NotFound { key },
            object_store::Error::AlreadyExists { .. } => StoreError::AlreadyExists { key },
            object_store::Error::Precondition { .. } => StoreError::Conflict { key },
            source @ object_store::Error::InvalidPath { .. } => StoreError::ForeignName {
                dir: key,
                reason: source.to_string(),
            },
            source => StoreError::ObjectStore { key, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_object_and_the_fix() {
        let e = StoreError::AlreadyExists {
            key: "run/batches/0000000001.krb".into(),
        };
        assert_eq!(
            e.to_string(),
            "object run/batches/0000000001.krb already exists and is never overwritten; \
             use a new sequence number or id"
        );
        let e = StoreError::UnsupportedVersion { found: 7 };
        assert!(e.to_string().contains("version 7"), "{e}");
        let reads = format!("reads version {}", crate::frame::BATCH_FORMAT_VERSION);
        assert!(e.to_string().contains(&reads), "{e}");
        let e = StoreError::ChecksumMismatch {
            expected: 1,
            found: 0xdead_beef,
        };
        assert!(e.to_string().contains("0x00000001"), "{e}");
        assert!(e.to_string().contains("0xdeadbeef"), "{e}");
    }

    /// Issue 32 item 7: only a credentials problem suggests credentials.
    #[test]
    fn hints_name_credentials_only_for_credential_errors() {
        let refused = object_store::Error::Generic {
            store: "S3",
            source: "error sending request: connection refused".into(),
        };
        let text = StoreError::from_object_store("k", refused).to_string();
        assert!(
            !text.contains("credentials") && text.contains("reachable"),
            "{text}"
        );
        let denied = object_store::Error::PermissionDenied {
            path: "p".into(),
            source: "403".into(),
        };
        let text = StoreError::from_object_store("k", denied).to_string();
        assert!(text.contains("credentials"), "{text}");
        let odd = object_store::Error::InvalidPath {
            source: object_store::path::Path::parse("a\nb").expect_err("odd"),
        };
        let text = StoreError::from_object_store("k", odd).to_string();
        assert!(!text.contains("credentials"), "{text}");
    }

    #[test]
    fn backend_errors_map_to_actionable_variants() {
        let nf = object_store::Error::NotFound {
            path: "p".into(),
            source: "gone".into(),
        };
        assert!(matches!(
            StoreError::from_object_store("k", nf),
            StoreError::NotFound { key } if key == "k"
        ));
        let ae = object_store::Error::AlreadyExists {
            path: "p".into(),
            source: "x".into(),
        };
        assert!(matches!(
            StoreError::from_object_store("k", ae),
            StoreError::AlreadyExists { .. }
        ));
        let pc = object_store::Error::Precondition {
            path: "p".into(),
            source: "x".into(),
        };
        assert!(matches!(
            StoreError::from_object_store("k", pc),
            StoreError::Conflict { .. }
        ));
    }
}
