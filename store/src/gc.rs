//! Lineage-aware retention and garbage collection.
//!
//! Invariants:
//! - GC-1 (kept): the newest `keep_last` checkpoints on each branch head's lineage; every tagged
//!   checkpoint (LN-1) except that of the `healthy` tag, which the collapse guard puts on most
//!   checkpoints, only the newest on each branch head's lineage is kept (the one a rewind would
//!   use); and, transitively, every checkpoint a kept one still needs: its reference anchor and the
//!   fork point its branch started from (`keel train --from`).
//! - GC-2: a collected checkpoint leaves a tombstone (`collected/<id>.json`, its manifest) before
//!   its manifest and then its blobs are deleted, so lineage stays printable (LN-2) and a crash
//!   mid-collection leaves only orphan blobs, which the next run of gc removes.
//! - GC-3: orphans are objects under `checkpoints/<id>/` without a manifest (a failed or
//!   interrupted commit) whose newest object is older than `orphan_min_age`, so a commit in
//!   progress is never collected from under its writer.
//! - GC-4: branch head generations below the newest two are removed; the head itself never is.
//! - GC-5: [`RunStore::plan_gc`] only reads; `--dry-run` prints its plan.
//! - GC-6: method state objects (`state/…`, `branches/<b>/state/…`: RTPO trunk records, PATS
//!   bank versions) are collected when no kept checkpoint's `method_state` names them and they
//!   are older than `orphan_min_age` (a running job's newest ones are not named yet).
//! - GC-7: a branch's rollout batches are collected when no kept checkpoint of that branch may
//!   still reuse them on a resume (`DataPosition::may_reuse_batch`, DF-4: below every kept
//!   checkpoint's `next_batch_seq` and named by none of their resume indexes). A branch with no
//!   kept checkpoint, or one whose kept checkpoint predates the index, keeps all its batches;
//!   batches of a running job are at or above its head's `next_batch_seq`, so none is collected
//!   from under it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;

use crate::checkpoint::CheckpointManifest;
use crate::error::StoreError;
use crate::root::RunStore;

/// The tag the collapse guard gives checkpoints with no anomaly since the previous one.
pub const HEALTHY_TAG: &str = "healthy";

/// What a gc run keeps and removes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Kept checkpoint ids, each with why.
    pub keep: BTreeMap<String, String>,
    /// Committed checkpoints to collect (GC-2).
    pub collect: Vec<String>,
    /// Relative keys of orphan blobs (GC-3).
    pub orphans: Vec<String>,
    /// Relative keys of superseded head generations (GC-4).
    pub stale_heads: Vec<String>,
    /// Relative keys of method state objects no kept checkpoint names (GC-6).
    pub stale_state: Vec<String>,
    /// Relative keys of rollout batches no kept checkpoint may reuse (GC-7).
    pub stale_batches: Vec<String>,
}

/// Every string inside a JSON text (method_state values name their objects' keys).
fn json_strings(text: &str, out: &mut BTreeSet<String>) {
    fn walk(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::String(s) => {
                out.insert(s.clone());
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            serde_json::Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        walk(&v, out);
    }
}

/// What branch `branch` (head `head`) keeps by itself (GC-1): its newest healthy
/// checkpoint and its last `keep_last` checkpoints along the parent chain, each with why.
fn branch_roots(
    head: &str,
    branch: &str,
    by_id: &HashMap<&str, &CheckpointManifest>,
    keep_last: usize,
) -> Vec<(String, String)> {
    let mut roots = Vec::new();
    let mut cur = Some(head.to_string());
    while let Some(id) = cur.take() {
        let Some(m) = by_id.get(id.as_str()) else {
            break;
        };
        if m.tags.iter().any(|t| t == HEALTHY_TAG) {
            roots.push((id.clone(), format!("newest healthy of branch {branch}")));
            break;
        }
        cur = m.parent.clone();
    }
    let mut cur = Some(head.to_string());
    let mut n = 0;
    while let Some(id) = cur.take() {
        let Some(m) = by_id.get(id.as_str()) else {
            break;
        };
        if n >= keep_last {
            break;
        }
        roots.push((id.clone(), format!("last {keep_last} of branch {branch}")));
        n += 1;
        cur = m.parent.clone();
    }
    roots
}

/// Every checkpoint `roots` keep, with the first reason found (GC-1, transitively): a kept
/// checkpoint keeps its reference anchor and its branch's fork point (the first ancestor
/// committed on another branch).
fn kept_closure(
    mut todo: Vec<(String, String)>,
    by_id: &HashMap<&str, &CheckpointManifest>,
) -> BTreeMap<String, String> {
    let mut keep = BTreeMap::new();
    while let Some((id, why)) = todo.pop() {
        if keep.contains_key(&id) {
            continue;
        }
        let Some(m) = by_id.get(id.as_str()) else {
            continue;
        };
        keep.insert(id.clone(), why);
        if let Some(r) = &m.reference {
            todo.push((r.clone(), format!("reference anchor of {id}")));
        }
        let mut cur = m.parent.clone();
        while let Some(p) = cur.take() {
            let Some(pm) = by_id.get(p.as_str()) else {
                break;
            };
            if pm.branch != m.branch {
                todo.push((p.clone(), format!("fork point of branch {}", m.branch)));
                break;
            }
            cur = pm.parent.clone();
        }
    }
    keep
}

impl RunStore {
    /// Plans retention (GC-1..GC-5) without changing anything.
    pub async fn plan_gc(
        &self,
        keep_last: usize,
        orphan_min_age: Duration,
    ) -> Result<GcPlan, StoreError> {
        let all = self.list_checkpoints_tagged().await?;
        let by_id: HashMap<&str, &CheckpointManifest> =
            all.iter().map(|m| (m.id.as_str(), m)).collect();
        let mut plan = GcPlan::default();
        let mut roots: Vec<(String, String)> = Vec::new();
        for head in self.list_branches().await? {
            roots.extend(branch_roots(&head.id, &head.branch, &by_id, keep_last));
            for (_, rel) in self
                .head_generations(&head.branch)
                .await?
                .into_iter()
                .rev()
                .skip(2)
            {
                plan.stale_heads.push(rel);
            }
        }
        for m in &all {
            if m.tags.iter().any(|t| t != HEALTHY_TAG) {
                roots.push((m.id.clone(), format!("tagged {}", m.tags.join(","))));
            }
        }
        plan.keep = kept_closure(roots, &by_id);
        plan.collect = all
            .iter()
            .filter(|m| !plan.keep.contains_key(&m.id))
            .map(|m| m.id.clone())
            .collect();
        let committed: BTreeSet<&str> = all.iter().map(|m| m.id.as_str()).collect();
        let now = chrono::Utc::now();
        plan.orphans = self.orphan_files(&committed, now, orphan_min_age).await?;
        plan.stale_state = self
            .stale_state(&plan.keep, &by_id, now, orphan_min_age)
            .await?;
        plan.stale_batches = self.stale_batches(&plan, &by_id).await?;
        Ok(plan)
    }

    /// GC-3: the files of checkpoint folders that no committed manifest names and whose newest
    /// file is at least `min_age` old (a commit in progress is younger).
    async fn orphan_files(
        &self,
        committed: &BTreeSet<&str>,
        now: chrono::DateTime<chrono::Utc>,
        min_age: Duration,
    ) -> Result<Vec<String>, StoreError> {
        let mut dirs: BTreeMap<String, (Vec<String>, chrono::DateTime<chrono::Utc>)> =
            BTreeMap::new();
        for meta in self.list_rel("checkpoints").await? {
            let Some(rel) = self.rel_key(meta.location.as_ref()) else {
                continue;
            };
            let mut parts = rel.splitn(3, '/');
            let (Some("checkpoints"), Some(id), Some(_)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let e = dirs
                .entry(id.to_string())
                .or_insert_with(|| (Vec::new(), meta.last_modified));
            e.0.push(rel.to_string());
            e.1 = e.1.max(meta.last_modified);
        }
        let mut orphans = Vec::new();
        for (id, (keys, newest)) in dirs {
            let age = (now - newest).to_std().unwrap_or(Duration::ZERO);
            if !committed.contains(id.as_str()) && age >= min_age {
                orphans.extend(keys);
            }
        }
        Ok(orphans)
    }

    /// GC-6: method state objects (the run's and its branches') that no kept checkpoint names
    /// and that are at least `min_age` old, sorted.
    async fn stale_state(
        &self,
        keep: &BTreeMap<String, String>,
        by_id: &HashMap<&str, &CheckpointManifest>,
        now: chrono::DateTime<chrono::Utc>,
        min_age: Duration,
    ) -> Result<Vec<String>, StoreError> {
        let mut named = BTreeSet::new();
        for id in keep.keys() {
            if let Some(m) = by_id.get(id.as_str()) {
                for text in m.data.method_state.values() {
                    json_strings(text, &mut named);
                }
            }
        }
        let mut state = self.list_rel("state").await?;
        state.extend(
            self.list_rel("branches")
                .await?
                .into_iter()
                .filter(|meta| meta.location.as_ref().contains("/state/")),
        );
        let mut stale = Vec::new();
        for meta in state {
            let Some(rel) = self.rel_key(meta.location.as_ref()) else {
                continue;
            };
            let age = (now - meta.last_modified)
                .to_std()
                .unwrap_or(Duration::ZERO);
            if !named.contains(rel) && age >= min_age {
                stale.push(rel.to_string());
            }
        }
        stale.sort();
        Ok(stale)
    }

    /// GC-7: per branch, the batches that no kept checkpoint of the branch may reuse.
    async fn stale_batches(
        &self,
        plan: &GcPlan,
        by_id: &HashMap<&str, &CheckpointManifest>,
    ) -> Result<Vec<String>, StoreError> {
        let mut kept_by_branch: BTreeMap<&str, Vec<&CheckpointManifest>> = BTreeMap::new();
        for id in plan.keep.keys() {
            if let Some(m) = by_id.get(id.as_str()) {
                kept_by_branch.entry(m.branch.as_str()).or_default().push(m);
            }
        }
        let mut stale = Vec::new();
        for (branch, kept) in kept_by_branch {
            if kept.iter().any(|m| m.data.pending_batch_seqs.is_none()) {
                continue; // a checkpoint without a resume index may reuse any batch
            }
            let store = self.on_branch(branch)?;
            for key in store.list_batches().await? {
                let Some(seq) = key.batch_seq() else { continue };
                if kept.iter().any(|m| m.data.may_reuse_batch(seq)) {
                    continue;
                }
                if let Some(rel) = self.rel_key(&key.0) {
                    stale.push(rel.to_string());
                }
            }
        }
        Ok(stale)
    }

    /// Carries out a plan from [`RunStore::plan_gc`] (GC-2 order: tombstone, manifest, blobs).
    pub async fn apply_gc(&self, plan: &GcPlan) -> Result<(), StoreError> {
        for id in &plan.collect {
            let m = self.checkpoint(id).await?;
            let body = Bytes::from(serde_json::to_vec_pretty(&m)?);
            self.put_object(&format!("collected/{id}.json"), body)
                .await?;
            self.delete_full(&self.manifest_key(id)).await?;
            for f in &m.files {
                self.delete_full(&self.full_key(&format!("checkpoints/{id}/{}", f.name)))
                    .await?;
            }
        }
        for rel in plan
            .orphans
            .iter()
            .chain(&plan.stale_heads)
            .chain(&plan.stale_state)
            .chain(&plan.stale_batches)
        {
            self.delete_full(&self.full_key(rel)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tests::new_ckpt;
    use crate::checkpoint::ExpectHead;
    use crate::lineage::COLLECTED_TAG;
    use crate::test_backends::each_backend;

    #[tokio::test]
    async fn gc1_gc5_keeps_last_tagged_anchors_and_fork_points() {
        each_backend("gc1", |store| async move {
            // root(ref) <- c1 <- c2 <- c3 <- c4 <- c5   on main; side forks from c2.
            let mut root = new_ckpt(0, None);
            root.tags = vec![];
            root.reference = None;
            let root = store.commit_checkpoint(root).await.expect("root");
            let mut ids = vec![root.id.clone()];
            for step in 1..=5 {
                let mut c = new_ckpt(step, ids.last().cloned());
                c.tags = vec![];
                c.reference = Some(root.id.clone());
                ids.push(store.commit_checkpoint(c).await.expect("commit").id);
            }
            let mut s = new_ckpt(3, Some(ids[2].clone()));
            s.tags = vec![];
            s.reference = None;
            let side = store
                .commit_checkpoint_on("side", s, ExpectHead::NoHead)
                .await
                .expect("side");
            store.tag_checkpoint(&ids[3], "pinned").await.expect("tag");
            // `healthy` on many checkpoints pins only the newest on each lineage: ids[2], not ids[1].
            store
                .tag_checkpoint(&ids[1], HEALTHY_TAG)
                .await
                .expect("tag");
            store
                .tag_checkpoint(&ids[2], HEALTHY_TAG)
                .await
                .expect("tag");
            // A failed commit: a blob without a manifest.
            store
                .put_object(
                    "checkpoints/00000009-deadbeef/model.safetensors",
                    Bytes::from_static(b"x"),
                )
                .await
                .expect("orphan");

            let plan = store.plan_gc(2, Duration::ZERO).await.expect("plan");
            let kept: BTreeSet<&str> = plan.keep.keys().map(String::as_str).collect();
            let want: BTreeSet<&str> = [&ids[0], &ids[2], &ids[3], &ids[4], &ids[5], &side.id]
                .into_iter()
                .map(String::as_str)
                .collect();
            assert_eq!(kept, want, "{plan:#?}");
            assert_eq!(plan.collect, vec![ids[1].clone()]);
            assert_eq!(
                plan.orphans,
                vec!["checkpoints/00000009-deadbeef/model.safetensors".to_string()]
            );
            assert_eq!(plan.stale_heads.len(), 4, "{:?}", plan.stale_heads);
            // Planning changed nothing (GC-5).
            assert_eq!(store.list_checkpoints().await.expect("list").len(), 7);

            store.apply_gc(&plan).await.expect("apply");
            assert_eq!(store.list_checkpoints().await.expect("list").len(), 6);
            assert!(store.checkpoint(&ids[1]).await.is_err());
            let chain = store.ancestry(&ids[5]).await.expect("ancestry");
            assert_eq!(chain.len(), 6);
            assert!(chain[4].tags.contains(&COLLECTED_TAG.to_string()));
            assert_eq!(
                store.latest_checkpoint().await.expect("head").map(|m| m.id),
                Some(ids[5].clone())
            );
            let again = store.plan_gc(2, Duration::ZERO).await.expect("plan");
            assert!(
                again.collect.is_empty()
                    && again.orphans.is_empty()
                    && again.stale_heads.is_empty(),
                "{again:#?}"
            );
            // A fresh orphan survives a min age.
            store
                .put_object("checkpoints/00000010-deadbeef/x", Bytes::from_static(b"x"))
                .await
                .expect("orphan");
            let young = store
                .plan_gc(2, Duration::from_secs(3600))
                .await
                .expect("plan");
            assert!(young.orphans.is_empty());
        })
        .await;
    }

    #[tokio::test]
    async fn gc7_batches_no_kept_checkpoint_may_reuse_are_collected() {
        each_backend("gc7", |store| async move {
            use crate::batch::tests::sample_batch;
            for seq in 0..10 {
                store.put_batch(&sample_batch(seq)).await.expect("batch");
            }
            let side = store.on_branch("side").expect("side");
            side.put_batch(&sample_batch(0)).await.expect("side batch");
            // Two checkpoints on main; gc keeps the newest only. The older one (next batch 4)
            // would need batches from 3 on; the kept one needs 6 (pending) and 8.. .
            let mut old = new_ckpt(4, None);
            old.tags = vec![];
            old.reference = None;
            old.data.next_batch_seq = 4;
            old.data.consumed_batches = vec![];
            old.data.pending_batch_seqs = Some(vec![3]);
            let old = store.commit_checkpoint(old).await.expect("commit");
            let mut head = new_ckpt(8, Some(old.id.clone()));
            head.tags = vec![];
            head.reference = None;
            head.data.next_batch_seq = 8;
            head.data.consumed_batches = vec![];
            head.data.pending_batch_seqs = Some(vec![6]);
            store.commit_checkpoint(head).await.expect("commit");

            let plan = store.plan_gc(1, Duration::ZERO).await.expect("plan");
            let seqs: Vec<u64> = plan
                .stale_batches
                .iter()
                .map(|k| crate::root::BatchKey(k.clone()).batch_seq().expect("seq"))
                .collect();
            assert_eq!(seqs, vec![0, 1, 2, 3, 4, 5, 7], "{plan:#?}");
            assert!(
                plan.stale_batches.iter().all(|k| k.starts_with("batches/")),
                "a branch without a checkpoint keeps its batches: {plan:#?}"
            );
            let keep_both = store.plan_gc(2, Duration::ZERO).await.expect("plan");
            assert_eq!(keep_both.stale_batches.len(), 3, "{keep_both:#?}");

            store.apply_gc(&plan).await.expect("apply");
            let left: Vec<u64> = store
                .list_batches()
                .await
                .expect("list")
                .iter()
                .map(|k| k.batch_seq().expect("seq"))
                .collect();
            assert_eq!(left, vec![6, 8, 9]);
            assert_eq!(side.list_batches().await.expect("side").len(), 1);

            // A kept checkpoint written before the resume index keeps every batch.
            let mut legacy = new_ckpt(
                10,
                store.latest_checkpoint().await.expect("head").map(|m| m.id),
            );
            legacy.tags = vec![];
            legacy.reference = None;
            legacy.data.pending_batch_seqs = None;
            store.commit_checkpoint(legacy).await.expect("commit");
            let plan = store.plan_gc(1, Duration::ZERO).await.expect("plan");
            assert!(plan.stale_batches.is_empty(), "{plan:#?}");
        })
        .await;
    }

    #[tokio::test]
    async fn gc6_method_state_objects_no_kept_checkpoint_names_are_collected() {
        each_backend("gc6", |store| async move {
            for key in [
                "state/pats/scaffold-000002-a.json",
                "state/pats/scaffold-000003-a.json",
                "branches/side/state/rtpo/trunk-0000000001-b.json",
            ] {
                store
                    .put_object(key, Bytes::from_static(b"{}"))
                    .await
                    .expect("state object");
            }
            let mut c = new_ckpt(1, None);
            c.tags = vec![];
            c.reference = None;
            c.data.method_state = std::collections::BTreeMap::from([(
                "pats".to_string(),
                r#"{"key":"state/pats/scaffold-000003-a.json","version":3}"#.to_string(),
            )]);
            store.commit_checkpoint(c).await.expect("commit");
            let young = store
                .plan_gc(2, Duration::from_secs(3600))
                .await
                .expect("plan");
            assert!(young.stale_state.is_empty(), "{young:#?}");
            let plan = store.plan_gc(2, Duration::ZERO).await.expect("plan");
            assert_eq!(
                plan.stale_state,
                vec![
                    "branches/side/state/rtpo/trunk-0000000001-b.json".to_string(),
                    "state/pats/scaffold-000002-a.json".to_string(),
                ]
            );
            store.apply_gc(&plan).await.expect("apply");
            assert!(store
                .get_object("state/pats/scaffold-000003-a.json")
                .await
                .is_ok());
            assert!(store
                .get_object("state/pats/scaffold-000002-a.json")
                .await
                .is_err());
        })
        .await;
    }
}
