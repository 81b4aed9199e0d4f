//! Lineage: the tree of checkpoints (each manifest names its parent), tags, and the queries the
//! CLI and the collapse guard need.
//!
//! ```text
//! <root>/tags/<tag>/<id>          a tag added after commit (empty object)
//! <root>/collected/<id>.json      the manifest of a checkpoint removed by gc (a tombstone)
//! ```
//!
//! Invariants:
//! - LN-1: a checkpoint's tags are the tags in its manifest plus every `tags/<tag>/<id>` object;
//!   tagging never rewrites a manifest (manifests are immutable, CP-1).
//! - LN-2: [`RunStore::ancestry`] walks parent links from a checkpoint to its root; a parent
//!   removed by gc appears as its tombstone, tagged `collected`; the walk ends at a root, at a
//!   parent that is gone without a tombstone, or at a cycle (never loops).
//! - LN-3: [`RunStore::newest_tagged_on_lineage`] returns the newest checkpoint on the lineage of
//!   the branch head that carries the tag and still exists (never a tombstone).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use bytes::Bytes;
use object_store::PutMode;

use crate::checkpoint::CheckpointManifest;
use crate::error::StoreError;
use crate::key::{validate_name, validate_segment};
use crate::root::RunStore;

/// Tag given to tombstones of collected checkpoints in lineage walks.
pub const COLLECTED_TAG: &str = "collected";

/// The (tag, checkpoint id) a tag object's relative key `tags/<tag>/<id>` names; `None` for any
/// other key, or one whose parts are not valid names (KY-1).
pub fn parse_tag_key(rel: &str) -> Option<(&str, &str)> {
    let mut parts = rel.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("tags"), Some(tag), Some(id), None)
            if validate_name(tag).is_ok() && validate_segment(id).is_ok() =>
        {
            Some((tag, id))
        }
        _ => None,
    }
}

impl RunStore {
    /// Adds `tag` to committed checkpoint `id` (LN-1).
    pub async fn tag_checkpoint(&self, id: &str, tag: &str) -> Result<(), StoreError> {
        validate_name(tag)?;
        self.checkpoint(id).await?;
        self.put_full(
            &self.full_key(&format!("tags/{tag}/{id}")),
            Bytes::new(),
            PutMode::Overwrite,
        )
        .await?;
        Ok(())
    }

    /// Tags added after commit, by checkpoint id.
    pub async fn added_tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, StoreError> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for meta in self.list_rel("tags").await? {
            let Some(rel) = self.rel_key(meta.location.as_ref()) else {
                continue;
            };
            if let Some((tag, id)) = parse_tag_key(rel) {
                out.entry(id.to_string())
                    .or_default()
                    .insert(tag.to_string());
            }
        }
        Ok(out)
    }

    /// `manifest` with the tags added after commit merged in (LN-1).
    pub fn with_added_tags(
        mut manifest: CheckpointManifest,
        added: &BTreeMap<String, BTreeSet<String>>,
    ) -> CheckpointManifest {
        if let Some(tags) = added.get(&manifest.id) {
            for t in tags {
                if !manifest.tags.contains(t) {
                    manifest.tags.push(t.clone());
                }
            }
        }
        manifest
    }

    /// The manifest of `id`, or its gc tombstone tagged `collected`, or `None`.
    async fn manifest_or_tombstone(
        &self,
        id: &str,
    ) -> Result<Option<CheckpointManifest>, StoreError> {
        if let Some(m) = self.read_manifest(id).await? {
            return Ok(Some(m));
        }
        match self.get_object(&format!("collected/{id}.json")).await {
            Ok(bytes) => {
                let mut m: CheckpointManifest = serde_json::from_slice(&bytes)?;
                m.tags.push(COLLECTED_TAG.to_string());
                Ok(Some(m))
            }
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `id` and its ancestors, newest first, with added tags merged in (LN-2).
    pub async fn ancestry(&self, id: &str) -> Result<Vec<CheckpointManifest>, StoreError> {
        validate_segment(id)?;
        let added = self.added_tags().await?;
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut next = Some(id.to_string());
        while let Some(cur) = next.take() {
            if !seen.insert(cur.clone()) {
                break;
            }
            let Some(m) = self.manifest_or_tombstone(&cur).await? else {
                if out.is_empty() {
                    return Err(StoreError::NotFound {
                        key: self.manifest_key(&cur),
                    });
                }
                break;
            };
            next = m.parent.clone();
            out.push(Self::with_added_tags(m, &added));
        }
        Ok(out)
    }

    /// The newest checkpoint carrying `tag` on the lineage of this branch's head (LN-3).
    pub async fn newest_tagged_on_lineage(
        &self,
        tag: &str,
    ) -> Result<Option<CheckpointManifest>, StoreError> {
        let Some(head) = self.branch_head(self.branch()).await? else {
            return Ok(None);
        };
        Ok(self.ancestry(&head.id).await?.into_iter().find(|m| {
            m.tags.iter().any(|t| t == tag) && !m.tags.iter().any(|t| t == COLLECTED_TAG)
        }))
    }

    /// Every committed checkpoint with added tags merged in, sorted by step, time, id.
    pub async fn list_checkpoints_tagged(&self) -> Result<Vec<CheckpointManifest>, StoreError> {
        let added = self.added_tags().await?;
        Ok(self
            .list_checkpoints()
            .await?
            .into_iter()
            .map(|m| Self::with_added_tags(m, &added))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::tests::new_ckpt;
    use crate::checkpoint::ExpectHead;
    use crate::test_backends::each_backend;

    #[tokio::test]
    async fn ln1_ln3_tags_and_newest_tagged_on_lineage() {
        each_backend("ln3", |store| async move {
            let a = store.commit_checkpoint(new_ckpt(1, None)).await.expect("a");
            let b = store
                .commit_checkpoint(new_ckpt(2, Some(a.id.clone())))
                .await
                .expect("b");
            let c = store
                .commit_checkpoint(new_ckpt(3, Some(b.id.clone())))
                .await
                .expect("c");
            assert_eq!(
                store.newest_tagged_on_lineage("healthy").await.expect("q"),
                None
            );
            store.tag_checkpoint(&a.id, "healthy").await.expect("tag a");
            store.tag_checkpoint(&b.id, "healthy").await.expect("tag b");
            assert!(store
                .tag_checkpoint("00000009-00000000", "healthy")
                .await
                .is_err());
            assert!(store.tag_checkpoint(&a.id, "../x").await.is_err());
            let found = store
                .newest_tagged_on_lineage("healthy")
                .await
                .expect("q")
                .expect("some");
            assert_eq!(found.id, b.id);
            // A checkpoint off the lineage (another branch) does not count.
            let side = store.on_branch("side").expect("branch");
            let d = side
                .commit_checkpoint_on("side", new_ckpt(4, Some(c.id.clone())), ExpectHead::NoHead)
                .await
                .expect("d");
            store.tag_checkpoint(&d.id, "healthy").await.expect("tag d");
            assert_eq!(
                store
                    .newest_tagged_on_lineage("healthy")
                    .await
                    .expect("q")
                    .map(|m| m.id),
                Some(b.id.clone())
            );
            assert_eq!(
                side.newest_tagged_on_lineage("healthy")
                    .await
                    .expect("q")
                    .map(|m| m.id),
                Some(d.id.clone())
            );
            let chain: Vec<_> = side
                .ancestry(&d.id)
                .await
                .expect("ancestry")
                .into_iter()
                .map(|m| m.id)
                .collect();
            assert_eq!(chain, vec![d.id, c.id, b.id.clone(), a.id]);
            let listed = store.list_checkpoints_tagged().await.expect("list");
            assert!(listed
                .iter()
                .find(|m| m.id == b.id)
                .expect("b")
                .tags
                .contains(&"healthy".to_string()));
        })
        .await;
    }
}
