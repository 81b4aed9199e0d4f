//! The stored batches a resume may reuse, found through the checkpoint's resume index.
//!
//! Invariants:
//! - DF-4: a resume reads (downloads and validates) only the batches that DF-2 could reuse
//!   (`DataPosition::may_reuse_batch`): the ones the checkpoint's index names (handed out for its
//!   pending ranges) and every one at or above its `next_batch_seq`. The branch is listed from
//!   the lowest of those seqs on, so the cost of a resume follows the batches in flight at the
//!   checkpoint, not the run's length. A checkpoint written before the index existed (and a
//!   fresh start) reads every batch of the branch.
//! - DF-6 (JB-7): a corrupt batch among those read is moved to `quarantine/` (its range is owed again);
//!   it is never skipped silently.

use keel_store::checkpoint::MAX_DATA_POSITION;
use keel_store::{DataPosition, RunStore, StoreError};

use crate::frontier::FoundBatch;

/// What a scan of the store found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The readable batches the index names, with what DF-2 plans from.
    pub found: Vec<FoundBatch>,
    /// Corrupt batches moved to `quarantine/`: key and reason.
    pub quarantined: Vec<(String, String)>,
    /// Batch objects listed.
    pub listed: usize,
    /// Batch objects read (downloaded and validated).
    pub read: usize,
}

/// Reads the batches of `store`'s branch that a resume from `data` may reuse (DF-4),
/// quarantining corrupt ones (DF-6).
pub async fn scan(store: &RunStore, data: &DataPosition) -> Result<Scan, StoreError> {
    let keys = store.list_batches_from(data.first_reusable_batch()).await?;
    let mut scan = Scan {
        listed: keys.len(),
        ..Scan::default()
    };
    for key in keys {
        let Some(seq) = key.batch_seq() else { continue };
        if seq >= MAX_DATA_POSITION {
            tracing::warn!(key = %key, "ignoring a batch key beyond the largest batch seq keel writes");
            continue;
        }
        if !data.may_reuse_batch(seq) {
            continue;
        }
        scan.read += 1;
        let buf = match store.get_batch(&key).await {
            Ok(buf) => buf,
            Err(e @ StoreError::CorruptBatch { .. }) => {
                let reason = e.to_string();
                store.quarantine_batch(&key, &reason).await?;
                scan.quarantined.push((key.0, reason));
                continue;
            }
            Err(e) => return Err(e),
        };
        let b = buf.archived();
        let first_task = b.trajectories.iter().map(|t| t.task_id.to_native()).min();
        let versions = || {
            b.trajectories
                .iter()
                .flat_map(|t| t.turns.iter())
                .map(|t| t.policy_version.to_native())
        };
        let start = b.policy_version.to_native();
        if let Some(first_task) = first_task {
            scan.found.push(FoundBatch {
                key: key.0.clone(),
                batch_seq: b.batch_seq.to_native(),
                first_task,
                oldest_version: versions().min().unwrap_or(start),
                newest_version: versions().max().unwrap_or(start),
            });
        }
    }
    Ok(scan)
}
