//! `keel-store`: keel's object store — rollout-batch archives and checkpoints, on local disk or S3.
//!
//! Generators write [`RolloutBatch`]es with [`RunStore::put_batch`]; the learner lists them,
//! reads them zero-copy through [`BatchBuf`], and commits [`CheckpointManifest`]s with
//! [`RunStore::commit_checkpoint`]. Module map, in data-flow order:
//!
//! - [`batch`] — the rollout data model and the zero-copy view of a stored batch.
//! - [`frame`] — the `.krb` byte format (magic, version, length, crc32, zstd(rkyv)).
//! - [`root`] — a run root on an object store; batch keys, generic objects, key validation.
//! - [`checkpoint`] — the checkpoint commit protocol (blobs, manifest, branch head) and resume.
//! - [`branch`] — branch heads moved by create-only puts (the compare-and-swap).
//! - [`lineage`] — tags, ancestry, "newest checkpoint tagged T on the lineage of the head".
//! - [`lives`] — trainer lives: the fencing tokens of the one writer of a branch.
//! - [`weights`] — policy weights published for generators in other processes.
//! - [`gc`] — lineage-aware retention and orphan collection.
//! - [`survey`] — what a run root holds, damaged heads and manifests included.
//! - [`quarantine`] — corrupt objects moved aside under `quarantine/`.
//! - `listing` — listings that skip odd names and never follow links (LI-1..4).
//! - `health` — the retry budget as a deadline: a dead S3 store fails within it (HL-1..3).
//! - [`error`] — [`StoreError`].
//!
//! Invariants (each module states its own, numbered, and its tests are named after them):
//! - KS-1: the store never overwrites a rollout batch or a checkpoint manifest (ST-1, CP-1).
//! - KS-2: nothing read from the store is trusted before it is checked: batches by frame checks
//!   and bytecheck (FR-1..FR-4), checkpoint blobs by size and crc32 (CP-4).
//! - KS-3: no key a caller gives can leave the run root (ST-2, KY-1, KY-4).
//! - KS-4: every commit is atomic on S3 semantics (no rename): create-only blobs, create-only
//!   manifest, create-only head generation (CP-1..3, BR-2).

#![deny(missing_docs)]

pub mod batch;
pub mod branch;
pub mod checkpoint;
pub mod error;
pub mod frame;
pub mod gc;
mod health;
mod key;
pub mod lineage;
mod listing;
pub mod lives;
pub mod model_sync;
pub mod quarantine;
pub mod root;
pub mod survey;
#[cfg(test)]
mod test_backends;
pub mod weights;

pub use batch::{
    ArchivedRolloutBatch, ArchivedSource, ArchivedTrajectory, ArchivedTurn, BatchBuf, RolloutBatch,
    Source, Trajectory, Turn, VersionChange,
};
pub use branch::BranchHead;
pub use checkpoint::{
    CheckpointManifest, DataPosition, ExpectHead, FileEntry, NewCheckpoint, ResumePoint,
    SkippedCheckpoint,
};
pub use error::StoreError;
pub use gc::GcPlan;
pub use key::{validate_name, validate_rel_key};
pub use lineage::COLLECTED_TAG;
pub use lives::{LifeEnd, LifeRecord};
pub use model_sync::{sync_model_folder, SyncReport};
pub use root::{BatchKey, RunStore, DEFAULT_BRANCH};
pub use survey::{HeadState, Survey};
pub use weights::{WeightsId, WeightsPointer, WeightsProbe};
