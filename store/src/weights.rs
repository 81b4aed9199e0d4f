//! Published policy weights, for generators in other processes.
//!
//! ```text
//! <root>/weights/<life>/e0000-v0000000007/model-0.safetensors   blobs of one version
//! <root>/weights/<life>/e0000-v0000000007.json                  its pointer (sizes, crc32)
//! <root>/weights/<life>/reference-000002/model-0.safetensors    ARMOR's reference, serial 2
//! <root>/weights/<life>/reference-000002.json
//! <root>/branches/<b>/weights/…                                 the same for any other branch
//! ```
//!
//! Invariants:
//! - WT-1: a pointer is written create-only after every blob it names, so a pointer that can be
//!   read names weights that are all there; weights are identified by (life, epoch, version) and
//!   never rewritten (a new life or a rewind writes under a new name).
//! - WT-2: every blob is checked against its pointer's size and crc32 before it is used; a
//!   mismatch is `CorruptObject`, never weights.
//! - WT-3: [`RunStore::newest_weights`] orders pointers by (epoch, version): a rewind's weights
//!   (a new epoch) are newer than every version of the abandoned branch.
//! - WT-4: pruning removes pointers before their blobs, so a reader never finds a pointer whose
//!   blobs are half gone.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::checkpoint::FileEntry;
use crate::error::StoreError;
use crate::root::RunStore;

const POINTER_FORMAT: &str = "keel.weights.v1";

/// Which weights a pointer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WeightsId {
    /// Policy version `version` of board epoch `epoch` (WB-3).
    Policy {
        /// Rewinds before it.
        epoch: u64,
        /// The policy version.
        version: u64,
    },
    /// The reference policy, publication `serial` (WB-4).
    Reference {
        /// Publication number.
        serial: u64,
    },
}

impl WeightsId {
    /// The name of its pointer (without `.json`) and blob folder.
    pub fn name(&self) -> String {
        match self {
            WeightsId::Policy { epoch, version } => format!("e{epoch:04}-v{version:010}"),
            WeightsId::Reference { serial } => format!("reference-{serial:06}"),
        }
    }

    fn parse(name: &str) -> Option<WeightsId> {
        let digits = |s: &str| -> Option<u64> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        if let Some(serial) = name.strip_prefix("reference-") {
            return Some(WeightsId::Reference {
                serial: digits(serial)?,
            });
        }
        let (e, v) = name.strip_prefix('e')?.split_once("-v")?;
        Some(WeightsId::Policy {
            epoch: digits(e)?,
            version: digits(v)?,
        })
    }
}

/// A published set of weights: one safetensors blob per model (Dr. MAS: several).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsPointer {
    /// Format tag.
    pub format: String,
    /// The trainer life that published them.
    pub life: u64,
    /// Which weights.
    pub id: WeightsId,
    /// ARMOR: the policy version a reference was copied at.
    pub copied_at: u64,
    /// The blobs, `model-<k>.safetensors` in model order, with size and crc32.
    pub files: Vec<FileEntry>,
    /// When (Unix ms).
    pub published_unix_ms: u64,
}

impl WeightsPointer {
    /// Bytes of every blob together.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

impl RunStore {
    fn weights_dir(&self, life: u64) -> String {
        self.branch_dir(&format!("weights/{life:010}"))
    }

    /// The key of the pointer of `id` published by `life`.
    pub fn weights_pointer_key(&self, life: u64, id: WeightsId) -> String {
        format!("{}/{}.json", self.weights_dir(life), id.name())
    }

    /// Stores `models` as the weights `id` of `life` (WT-1): blobs, then the pointer.
    pub async fn publish_weights(
        &self,
        life: u64,
        id: WeightsId,
        copied_at: u64,
        models: &[Bytes],
    ) -> Result<WeightsPointer, StoreError> {
        let dir = format!("{}/{}", self.weights_dir(life), id.name());
        let files: Vec<FileEntry> = models
            .iter()
            .enumerate()
            .map(|(k, b)| FileEntry {
                name: format!("model-{k}.safetensors"),
                size: b.len() as u64,
                crc32: crc32fast::hash(b),
            })
            .collect();
        let puts = files.iter().zip(models).map(|(f, b)| {
            let key = self.full_key(&format!("{dir}/{}", f.name));
            let b = b.clone();
            async move { self.put_blob(&key, b).await }
        });
        futures::future::try_join_all(puts).await?;
        let pointer = WeightsPointer {
            format: POINTER_FORMAT.into(),
            life,
            id,
            copied_at,
            files,
            published_unix_ms: u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0),
        };
        let body = Bytes::from(serde_json::to_vec_pretty(&pointer)?);
        match self
            .create_idempotent(&self.full_key(&self.weights_pointer_key(life, id)), body)
            .await
        {
            Ok(()) => Ok(pointer),
            // The same weights published again (same blobs): the first pointer stands (WT-1).
            Err(StoreError::AlreadyExists { key }) => {
                let existing = self.weights_pointer(life, id).await?;
                if existing.files == pointer.files {
                    Ok(existing)
                } else {
                    Err(StoreError::AlreadyExists { key })
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The pointer of `id` published by `life`.
    pub async fn weights_pointer(
        &self,
        life: u64,
        id: WeightsId,
    ) -> Result<WeightsPointer, StoreError> {
        let key = self.weights_pointer_key(life, id);
        let bytes = self.get_object(&key).await?;
        let p: WeightsPointer =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::CorruptObject {
                key: key.clone(),
                reason: format!("not a weights pointer: {e}"),
            })?;
        if p.format != POINTER_FORMAT || p.life != life || p.id != id {
            return Err(StoreError::CorruptObject {
                key,
                reason: format!(
                    "format {:?} names life {} {:?}, expected life {life} {id:?}",
                    p.format, p.life, p.id
                ),
            });
        }
        Ok(p)
    }

    /// Reads and checks every blob of `pointer` (WT-2), in model order.
    pub async fn read_weights(&self, pointer: &WeightsPointer) -> Result<Vec<Bytes>, StoreError> {
        let dir = format!("{}/{}", self.weights_dir(pointer.life), pointer.id.name());
        let reads = pointer.files.iter().map(|f| {
            let key = format!("{dir}/{}", f.name);
            async move {
                crate::key::validate_segment(&f.name)?;
                let bytes = self.get_object(&key).await?;
                if bytes.len() as u64 != f.size || crc32fast::hash(&bytes) != f.crc32 {
                    return Err(StoreError::CorruptObject {
                        key,
                        reason: format!(
                            "{} bytes with crc32 {:08x}; the pointer says {} bytes, {:08x}",
                            bytes.len(),
                            crc32fast::hash(&bytes),
                            f.size,
                            f.crc32
                        ),
                    });
                }
                Ok(bytes)
            }
        });
        futures::future::try_join_all(reads).await
    }

    /// Every weights id `life` has a pointer for, ascending (WT-3: policy by epoch, version).
    pub async fn weights_ids(&self, life: u64) -> Result<Vec<WeightsId>, StoreError> {
        let dir = self.weights_dir(life);
        let mut ids: Vec<WeightsId> = self
            .list_objects(&dir)
            .await?
            .iter()
            .filter_map(|k| {
                let rest = k.strip_prefix(&dir)?.strip_prefix('/')?;
                WeightsId::parse(rest.strip_suffix(".json")?)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// The newest policy weights `life` published (WT-3).
    pub async fn newest_weights(&self, life: u64) -> Result<Option<WeightsId>, StoreError> {
        Ok(self
            .weights_ids(life)
            .await?
            .into_iter()
            .filter(|id| matches!(id, WeightsId::Policy { .. }))
            .max())
    }

    /// Deletes the weights of `life` that `keep` refuses (WT-4: pointer first, then blobs);
    /// returns how many sets went.
    pub async fn prune_weights(
        &self,
        life: u64,
        keep: impl Fn(&WeightsId) -> bool,
    ) -> Result<usize, StoreError> {
        let dir = self.weights_dir(life);
        let mut pruned = 0;
        for id in self.weights_ids(life).await? {
            if keep(&id) {
                continue;
            }
            let name = id.name();
            self.delete_full(&self.full_key(&format!("{dir}/{name}.json")))
                .await?;
            for meta in self.list_rel(&format!("{dir}/{name}")).await? {
                self.delete_full(meta.location.as_ref()).await?;
            }
            pruned += 1;
        }
        Ok(pruned)
    }

    /// Deletes every weights set of lives before `life` (they can serve no order any more).
    pub async fn prune_older_lives_weights(&self, life: u64) -> Result<usize, StoreError> {
        let root = self.branch_dir("weights");
        let mut pruned = 0;
        for meta in self.list_rel(&root).await? {
            let key = meta.location.to_string();
            let older = key
                .strip_prefix(&self.full_key(&root))
                .and_then(|r| r.strip_prefix('/'))
                .and_then(|r| r.split('/').next())
                .and_then(|l| l.parse::<u64>().ok())
                .is_some_and(|l| l < life);
            if older {
                self.delete_full(&key).await?;
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_backends::each_backend;

    #[test]
    fn ids_round_trip_their_names_and_order_by_epoch_then_version() {
        for id in [
            WeightsId::Policy {
                epoch: 2,
                version: 31,
            },
            WeightsId::Reference { serial: 4 },
        ] {
            assert_eq!(WeightsId::parse(&id.name()), Some(id));
        }
        assert!(
            WeightsId::Policy {
                epoch: 1,
                version: 0
            } > WeightsId::Policy {
                epoch: 0,
                version: 99
            }
        );
        assert_eq!(WeightsId::parse("e1-vx"), None);
    }

    #[tokio::test]
    async fn wt1_wt2_wt4_weights_round_trip_are_checked_and_pruned() {
        each_backend("wt", |store| async move {
            let v = |version| WeightsId::Policy { epoch: 0, version };
            for version in 0..3 {
                let models = vec![Bytes::from(vec![version as u8; 64]), Bytes::from_static(b"agent")];
                store.publish_weights(5, v(version), 0, &models).await.expect("publish");
            }
            assert_eq!(store.newest_weights(5).await.expect("newest"), Some(v(2)));
            let p = store.weights_pointer(5, v(1)).await.expect("pointer");
            let blobs = store.read_weights(&p).await.expect("read");
            assert_eq!(blobs[0].as_ref(), &[1u8; 64][..]);
            assert_eq!(blobs[1].as_ref(), b"agent");
            // A damaged blob is refused (WT-2).
            let key = format!("weights/0000000005/{}/model-1.safetensors", v(1).name());
            store.put_object(&key, Bytes::from_static(b"agenT")).await.expect("damage");
            assert!(matches!(
                store.read_weights(&p).await,
                Err(StoreError::CorruptObject { .. })
            ));
            let pruned = store
                .prune_weights(5, |id| *id == v(2))
                .await
                .expect("prune");
            assert_eq!(pruned, 2);
            assert_eq!(store.weights_ids(5).await.expect("ids"), vec![v(2)]);
            assert!(store.list_objects("weights/0000000005/e0000-v0000000000").await.expect("list").is_empty());
            store.publish_weights(6, v(0), 0, &[Bytes::from_static(b"x")]).await.expect("life 6");
            assert!(store.prune_older_lives_weights(6).await.expect("older") > 0);
            assert!(store.weights_ids(5).await.expect("ids").is_empty());
            assert_eq!(store.weights_ids(6).await.expect("ids"), vec![v(0)]);
        })
        .await;
    }
}
