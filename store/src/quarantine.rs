//! Quarantine: corrupt objects are moved aside, not deleted and not retried forever.
//!
//! ```text
//! <root>/quarantine/<rel key>              the corrupt bytes, as found
//! <root>/quarantine/<rel key>.reason.txt   why it was moved, and when
//! ```
//!
//! Invariants:
//! - QU-1: an object leaves its place only after its bytes are stored under `quarantine/`; a
//!   crash in between leaves it in both places, never in neither.
//! - QU-2: nothing under `quarantine/` is read by training: batch listings and checkpoint
//!   listings look only under `batches/`, `branches/` and `checkpoints/`.
//! - QU-3: a symbolic link in a local root is quarantined by name: the link itself is moved,
//!   its target is never read (ST-13).

use bytes::Bytes;
use object_store::PutMode;

use crate::error::StoreError;
use crate::key::validate_rel_key;
use crate::root::{BatchKey, RunStore};

/// The folder corrupt objects are moved to.
pub const QUARANTINE_DIR: &str = "quarantine";

impl RunStore {
    /// Moves the object at `rel_key` to `quarantine/<rel_key>` (QU-1) and records `reason`.
    /// Returns the new relative key, or `None` if the object was already gone.
    pub async fn quarantine(
        &self,
        rel_key: &str,
        reason: &str,
    ) -> Result<Option<String>, StoreError> {
        validate_rel_key(rel_key)?;
        if rel_key.starts_with("quarantine/") {
            return Ok(Some(rel_key.to_string()));
        }
        let dest = format!("{QUARANTINE_DIR}/{rel_key}");
        let bytes = match self.get_full(&self.full_key(rel_key)).await {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(StoreError::Link { link, .. }) => {
                return self
                    .quarantine_link(rel_key, &link, &dest, reason)
                    .map(Some)
            }
            Err(e) => return Err(e),
        };
        self.put_full(&self.full_key(&dest), bytes, PutMode::Overwrite)
            .await?;
        let note = format!(
            "{}\n{reason}\n",
            chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
        );
        self.put_full(
            &self.full_key(&format!("{dest}.reason.txt")),
            Bytes::from(note),
            PutMode::Overwrite,
        )
        .await?;
        self.delete_full(&self.full_key(rel_key)).await?;
        tracing::warn!(key = rel_key, to = %dest, reason, "quarantined a corrupt object");
        Ok(Some(dest))
    }

    /// QU-3: moves the link `link` (on the path of `rel_key`) under `quarantine/` without
    /// reading its target, with a note of why.
    fn quarantine_link(
        &self,
        rel_key: &str,
        link: &str,
        dest: &str,
        reason: &str,
    ) -> Result<String, StoreError> {
        let io = |path: &std::path::Path| {
            let path = path.display().to_string();
            move |source| StoreError::LocalIo { path, source }
        };
        let Some(dir) = self.local_dir() else {
            return Err(StoreError::Link {
                key: rel_key.into(),
                link: link.into(),
            });
        };
        let link_path = std::path::PathBuf::from(link);
        let rel_link = link_path
            .strip_prefix(dir)
            .map_err(|_| StoreError::Link {
                key: rel_key.into(),
                link: link.into(),
            })?
            .to_path_buf();
        let target = dir.join(QUARANTINE_DIR).join(&rel_link);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::rename(&link_path, &target).map_err(io(&link_path))?;
        let note = format!(
            "{}
{reason}
a symbolic link, moved without reading its target (QU-3)
",
            chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
        );
        let note_path = target.with_file_name(format!(
            "{}.reason.txt",
            target
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().to_string())
        ));
        std::fs::write(&note_path, note).map_err(io(&note_path))?;
        tracing::warn!(key = rel_key, link, to = %dest, reason, "quarantined a symbolic link");
        Ok(format!("{QUARANTINE_DIR}/{}", rel_link.display()))
    }

    /// Quarantines a stored rollout batch by its key.
    pub async fn quarantine_batch(
        &self,
        key: &BatchKey,
        reason: &str,
    ) -> Result<Option<String>, StoreError> {
        let rel = self.rel_key(&key.0).ok_or_else(|| StoreError::InvalidKey {
            key: key.0.clone(),
            reason: "the batch key is not under this run root".into(),
        })?;
        self.quarantine(rel, reason).await
    }

    /// Relative keys of every quarantined object (without the `.reason.txt` notes).
    pub async fn list_quarantine(&self) -> Result<Vec<String>, StoreError> {
        let mut keys: Vec<String> = self
            .list_rel(QUARANTINE_DIR)
            .await?
            .into_iter()
            .filter_map(|m| self.rel_key(m.location.as_ref()).map(str::to_string))
            .filter(|k| !k.ends_with(".reason.txt"))
            .collect();
        keys.sort();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use crate::batch::tests::sample_batch;
    use crate::error::StoreError;
    use crate::test_backends::{each_backend, flip_byte};

    #[tokio::test]
    async fn qu1_qu2_corrupt_batch_is_moved_aside_and_no_longer_listed() {
        each_backend("qu1", |store| async move {
            store.put_batch(&sample_batch(1)).await.expect("put");
            store.put_batch(&sample_batch(2)).await.expect("put");
            flip_byte(&store, "batches/0000000002.krb", 30).await;
            let key = store.batch_key(2);
            let err = store.get_batch(&key).await.expect_err("corrupt");
            assert!(matches!(err, StoreError::CorruptBatch { .. }));
            let dest = store
                .quarantine_batch(&key, &err.to_string())
                .await
                .expect("quarantine");
            assert_eq!(dest.as_deref(), Some("quarantine/batches/0000000002.krb"));
            assert_eq!(
                store.list_batches().await.expect("list"),
                vec![store.batch_key(1)]
            );
            assert_eq!(
                store.list_quarantine().await.expect("q"),
                vec!["quarantine/batches/0000000002.krb".to_string()]
            );
            let note = store
                .get_object("quarantine/batches/0000000002.krb.reason.txt")
                .await
                .expect("note");
            assert!(String::from_utf8_lossy(&note).contains("corrupt"));
            // Already gone: nothing to do.
            assert_eq!(
                store.quarantine_batch(&key, "again").await.expect("gone"),
                None
            );
        })
        .await;
    }
}
