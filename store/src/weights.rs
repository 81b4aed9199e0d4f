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
//! - WT-5: a delta set (`base: Some(b)`) stores each model as zstd(new XOR base) against the full
//!   set `b` of the same life; its pointer records the size and crc32 of the stored blob *and*
//!   of the decoded weights, and a reader checks both. A delta's base is always a full set, so
//!   decoding reads at most two sets. Between RL steps most low-precision weights do not change,
//!   so the XOR is mostly zero bytes and compresses to a small fraction of the full size.
//! - WT-6: a policy pointer carries its publisher's provenance probe ([`WeightsProbe`]) when
//!   the publisher has one; a reader that loads the weights scores the probe and refuses them
//!   when the log-probs differ (stale, half-applied or cached weights).

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
    /// The blobs, `model-<k>.safetensors` (or `model-<k>.delta.zst`) in model order, with the
    /// size and crc32 of the stored bytes.
    pub files: Vec<FileEntry>,
    /// WT-5: the full set these blobs are deltas against (`None`: full weights).
    #[serde(default)]
    pub base: Option<WeightsId>,
    /// WT-5: size and crc32 of each decoded model (the safetensors bytes), in model order.
    #[serde(default)]
    pub decoded: Vec<FileEntry>,
    /// When (Unix ms).
    pub published_unix_ms: u64,
    /// WT-6: the publisher's log-probs on the provenance probe, per model (policy weights
    /// published by a learner; `None` for references and older pointers).
    #[serde(default)]
    pub probe: Option<WeightsProbe>,
}

/// WT-6: what a reader checks loaded weights against: the learner's per-token log-probs on the
/// fixed probe sequence (`keel_learner::probe`), for each model, and where they were computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsProbe {
    /// Per model (model order): the log-probs of probe tokens 1.. given their prefix.
    pub logp: Vec<Vec<f32>>,
    /// The device they were computed on (`cpu`, `cuda:0`).
    pub device: String,
    /// The dtype of the weights they were computed with (`float32`, `bfloat16`).
    pub dtype: String,
}

impl WeightsPointer {
    /// Bytes of every stored blob together.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Bytes of the decoded weights.
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded.iter().map(|f| f.size).sum()
    }
}

/// zstd level of weight deltas: fast, and the XOR of two nearby versions is mostly zeros.
const DELTA_ZSTD_LEVEL: i32 = 1;

/// WT-5: zstd(new XOR base), or `None` when the shapes differ (a delta is then pointless).
pub fn encode_delta(new: &[u8], base: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
    if new.len() != base.len() {
        return Ok(None);
    }
    let xor: Vec<u8> = new.iter().zip(base).map(|(a, b)| a ^ b).collect();
    zstd::bulk::compress(&xor, DELTA_ZSTD_LEVEL)
        .map(Some)
        .map_err(|e| StoreError::Encode(format!("weight delta: {e}")))
}

/// WT-5: the weights a delta encodes against `base`.
pub fn decode_delta(delta: &[u8], base: &[u8]) -> Result<Vec<u8>, StoreError> {
    let xor = zstd::bulk::decompress(delta, base.len())
        .map_err(|e| StoreError::Decompress(format!("weight delta: {e}")))?;
    if xor.len() != base.len() {
        return Err(StoreError::Decompress(format!(
            "weight delta decodes to {} bytes, its base has {}",
            xor.len(),
            base.len()
        )));
    }
    Ok(xor.iter().zip(base).map(|(a, b)| a ^ b).collect())
}

impl RunStore {
    fn weights_dir(&self, life: u64) -> String {
        self.branch_dir(&format!("weights/{life:010}"))
    }

    /// The key of the pointer of `id` published by `life`.
    pub fn weights_pointer_key(&self, life: u64, id: WeightsId) -> String {
        format!("{}/{}.json", self.weights_dir(life), id.name())
    }

    /// Stores `models` as the weights `id` of `life` (WT-1): blobs, then the pointer. With
    /// `base = Some((b, blobs))` (the full set `b` and its models) each model whose size matches
    /// is stored as a delta against it when that is smaller (WT-5); the set is then a delta set
    /// only if every model is.
    pub async fn publish_weights(
        &self,
        life: u64,
        id: WeightsId,
        copied_at: u64,
        models: &[Bytes],
        base: Option<(WeightsId, &[Bytes])>,
        probe: Option<&WeightsProbe>,
    ) -> Result<WeightsPointer, StoreError> {
        let dir = format!("{}/{}", self.weights_dir(life), id.name());
        let decoded: Vec<FileEntry> = models
            .iter()
            .enumerate()
            .map(|(k, b)| FileEntry {
                name: format!("model-{k}.safetensors"),
                size: b.len() as u64,
                crc32: crc32fast::hash(b),
            })
            .collect();
        let deltas = match base {
            Some((base_id, base_models)) if base_models.len() == models.len() => {
                let mut out = Vec::with_capacity(models.len());
                for (new, old) in models.iter().zip(base_models) {
                    match encode_delta(new, old)? {
                        Some(d) if d.len() < new.len() / 2 => out.push(Bytes::from(d)),
                        _ => break,
                    }
                }
                (out.len() == models.len()).then_some((base_id, out))
            }
            _ => None,
        };
        let (base, stored): (Option<WeightsId>, Vec<Bytes>) = match deltas {
            Some((b, d)) => (Some(b), d),
            None => (None, models.to_vec()),
        };
        let files: Vec<FileEntry> = stored
            .iter()
            .enumerate()
            .map(|(k, b)| FileEntry {
                name: match base {
                    Some(_) => format!("model-{k}.delta.zst"),
                    None => format!("model-{k}.safetensors"),
                },
                size: b.len() as u64,
                crc32: crc32fast::hash(b),
            })
            .collect();
        let models = &stored;
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
            base,
            decoded,
            published_unix_ms: u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0),
            probe: probe.cloned(),
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

    /// The decoded models of `pointer` (WT-2, WT-5), in model order; a delta set's base is
    /// taken from `cache` when it holds it (the last full set a reader decoded), else read.
    pub async fn load_weights(
        &self,
        pointer: &WeightsPointer,
        cache: Option<&(WeightsId, Vec<Bytes>)>,
    ) -> Result<Vec<Bytes>, StoreError> {
        let stored = self.read_weights(pointer).await?;
        let Some(base_id) = pointer.base else {
            return Ok(stored);
        };
        let base = match cache {
            Some((id, blobs)) if *id == base_id => blobs.clone(),
            _ => {
                let bp = self.weights_pointer(pointer.life, base_id).await?;
                if bp.base.is_some() {
                    return Err(StoreError::CorruptObject {
                        key: self.weights_pointer_key(pointer.life, base_id),
                        reason: "the base of a delta is itself a delta".into(),
                    });
                }
                self.read_weights(&bp).await?
            }
        };
        let key = self.weights_pointer_key(pointer.life, pointer.id);
        if base.len() != stored.len() || pointer.decoded.len() != stored.len() {
            return Err(StoreError::CorruptObject {
                key,
                reason: "a delta set and its base name different numbers of models".into(),
            });
        }
        let mut out = Vec::with_capacity(stored.len());
        for ((delta, old), want) in stored.iter().zip(&base).zip(&pointer.decoded) {
            let full = decode_delta(delta, old)?;
            if full.len() as u64 != want.size || crc32fast::hash(&full) != want.crc32 {
                return Err(StoreError::CorruptObject {
                    key,
                    reason: format!("{} decodes to other bytes than the pointer says", want.name),
                });
            }
            out.push(Bytes::from(full));
        }
        Ok(out)
    }

    /// Reads and checks every stored blob of `pointer` (WT-2), in model order (a delta set's
    /// blobs as stored: see [`RunStore::load_weights`]).
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

    /// Deletes the weights of `life` that `keep` refuses and no kept delta set is based on
    /// (WT-4: pointer first, then blobs; WT-5); returns how many sets went.
    pub async fn prune_weights(
        &self,
        life: u64,
        keep: impl Fn(&WeightsId) -> bool,
    ) -> Result<usize, StoreError> {
        let dir = self.weights_dir(life);
        let ids = self.weights_ids(life).await?;
        let mut kept: std::collections::BTreeSet<WeightsId> =
            ids.iter().copied().filter(|id| keep(id)).collect();
        for id in kept.clone() {
            if let Some(base) = self.weights_pointer(life, id).await?.base {
                kept.insert(base);
            }
        }
        let mut pruned = 0;
        for id in ids {
            if kept.contains(&id) {
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

    /// WT-6: a pointer's probe reads back bit for bit (f32 through JSON); an older pointer
    /// without one reads as `None`.
    #[tokio::test]
    async fn wt6_the_probe_survives_the_pointer() {
        each_backend("wt6", |store| async move {
            let id = WeightsId::Policy {
                epoch: 0,
                version: 1,
            };
            let probe = WeightsProbe {
                logp: vec![
                    vec![-1.0e-7, -2.718_281_7e-3, f32::MIN_POSITIVE - 9.0],
                    vec![-0.1],
                ],
                device: "cpu".into(),
                dtype: "float32".into(),
            };
            let models = [Bytes::from_static(b"a"), Bytes::from_static(b"b")];
            store
                .publish_weights(2, id, 0, &models, None, Some(&probe))
                .await
                .expect("publish");
            let p = store.weights_pointer(2, id).await.expect("pointer");
            assert_eq!(p.probe.as_ref(), Some(&probe));
            let mut old = serde_json::to_value(&p).expect("json");
            old.as_object_mut().expect("object").remove("probe");
            let old: WeightsPointer = serde_json::from_value(old).expect("older pointer");
            assert_eq!(old.probe, None);
        })
        .await;
    }

    #[tokio::test]
    async fn wt1_wt2_wt4_weights_round_trip_are_checked_and_pruned() {
        each_backend("wt", |store| async move {
            let v = |version| WeightsId::Policy { epoch: 0, version };
            for version in 0..3 {
                let models = vec![
                    Bytes::from(vec![version as u8; 64]),
                    Bytes::from_static(b"agent"),
                ];
                store
                    .publish_weights(5, v(version), 0, &models, None, None)
                    .await
                    .expect("publish");
            }
            assert_eq!(store.newest_weights(5).await.expect("newest"), Some(v(2)));
            let p = store.weights_pointer(5, v(1)).await.expect("pointer");
            let blobs = store.read_weights(&p).await.expect("read");
            assert_eq!(blobs[0].as_ref(), &[1u8; 64][..]);
            assert_eq!(blobs[1].as_ref(), b"agent");
            // A damaged blob is refused (WT-2).
            let key = format!("weights/0000000005/{}/model-1.safetensors", v(1).name());
            store
                .put_object(&key, Bytes::from_static(b"agenT"))
                .await
                .expect("damage");
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
            assert!(store
                .list_objects("weights/0000000005/e0000-v0000000000")
                .await
                .expect("list")
                .is_empty());
            store
                .publish_weights(6, v(0), 0, &[Bytes::from_static(b"x")], None, None)
                .await
                .expect("life 6");
            assert!(store.prune_older_lives_weights(6).await.expect("older") > 0);
            assert!(store.weights_ids(5).await.expect("ids").is_empty());
            assert_eq!(store.weights_ids(6).await.expect("ids"), vec![v(0)]);
        })
        .await;
    }

    #[tokio::test]
    async fn wt5_deltas_decode_to_the_new_weights_and_keep_their_base() {
        each_backend("wt5", |store| async move {
            let v = |version| WeightsId::Policy { epoch: 0, version };
            let full: Vec<u8> = (0..40_000u32)
                .flat_map(|i| (i as f32).to_le_bytes())
                .collect();
            let mut next = full.clone();
            for i in (0..next.len()).step_by(997) {
                next[i] ^= 0x5a; // a few bytes change between versions
            }
            let base = [Bytes::from(full.clone())];
            let p0 = store
                .publish_weights(1, v(0), 0, &base, None, None)
                .await
                .expect("full");
            assert_eq!(p0.base, None);
            let p1 = store
                .publish_weights(
                    1,
                    v(1),
                    0,
                    &[Bytes::from(next.clone())],
                    Some((v(0), &base)),
                    None,
                )
                .await
                .expect("delta");
            assert_eq!(p1.base, Some(v(0)));
            assert!(
                p1.bytes() * 10 < p1.decoded_bytes(),
                "{} of {}",
                p1.bytes(),
                p1.decoded_bytes()
            );
            let got = store.load_weights(&p1, None).await.expect("decode");
            assert_eq!(got[0].as_ref(), &next[..]);
            let cache = (v(0), base.to_vec());
            let got = store
                .load_weights(&p1, Some(&cache))
                .await
                .expect("from cache");
            assert_eq!(got[0].as_ref(), &next[..]);
            // A wrong base in the cache is not used: the pointer names its own.
            let wrong = (v(7), vec![Bytes::from(vec![0u8; full.len()])]);
            assert_eq!(
                store
                    .load_weights(&p1, Some(&wrong))
                    .await
                    .expect("read base")[0]
                    .as_ref(),
                &next[..]
            );
            // Incompressible changes are stored in full.
            let noise: Vec<u8> = (0..full.len()).map(|i| (i * 7919 % 251) as u8).collect();
            let p2 = store
                .publish_weights(1, v(2), 0, &[Bytes::from(noise)], Some((v(0), &base)), None)
                .await
                .expect("full again");
            assert_eq!(p2.base, None);
            // Pruning keeps the base of a kept delta.
            store
                .prune_weights(1, |id| *id == v(1))
                .await
                .expect("prune");
            assert_eq!(store.weights_ids(1).await.expect("ids"), vec![v(0), v(1)]);
            assert_eq!(
                store.load_weights(&p1, None).await.expect("still")[0].as_ref(),
                &next[..]
            );
        })
        .await;
    }
}
