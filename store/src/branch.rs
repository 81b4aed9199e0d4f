//! Branch heads: which checkpoint each branch of a run root continues from.
//!
//! ```text
//! <root>/branches/<name>/HEAD.0000000001   "<checkpoint id>\n"   generation 1
//! <root>/branches/<name>/HEAD.0000000002   "<checkpoint id>\n"   generation 2 (the head)
//! ```
//!
//! A head is never rewritten. Moving a branch from generation `n` creates `HEAD.<n+1>` with a
//! create-only put (`PutMode::Create`: `If-None-Match: *` on S3, a link that refuses to replace an
//! existing file on local disk). The create-only put *is* the compare-and-swap: of several writers
//! that read generation `n` and race, exactly one creates `HEAD.<n+1>`; the others get
//! [`StoreError::Conflict`]. No rename and no `PutMode::Update` is needed, so the protocol is the
//! same on every backend (the local backend has no conditional update).
//!
//! Invariants:
//! - BR-1: the head of a branch is its `HEAD.<n>` with the largest `n`; no head means the branch
//!   has no checkpoint yet.
//! - BR-2: [`RunStore::advance_head`] succeeds for exactly one of several writers expecting the
//!   same generation; the losers get `Conflict` and the head they lost to stays.
//! - BR-3: a head is written only after the manifest it names (CP-2), so it always names a
//!   committed checkpoint; garbage collection deletes only generations below the newest two.

use bytes::Bytes;

use crate::error::StoreError;
use crate::key::{validate_branch, validate_segment};
use crate::root::RunStore;

/// One branch's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchHead {
    /// The branch name (KY-4).
    pub branch: String,
    /// The head's generation (1 for the first checkpoint of the branch).
    pub generation: u64,
    /// The checkpoint it names.
    pub id: String,
}

/// The relative key of generation `generation` of `branch`'s head.
pub(crate) fn head_rel_key(branch: &str, generation: u64) -> String {
    format!("branches/{branch}/HEAD.{generation:010}")
}

/// The generation a head object's file name encodes (`HEAD.<digits>`).
pub fn parse_generation(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("HEAD.")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl RunStore {
    /// Every generation of `branch`'s head, ascending, with the object's relative key.
    pub(crate) async fn head_generations(
        &self,
        branch: &str,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        validate_branch(branch)?;
        let dir = self.full_key(&format!("branches/{branch}"));
        let listing = self.list_level(&dir).await?;
        let mut gens: Vec<(u64, String)> = listing
            .objects
            .iter()
            .filter_map(|m| {
                let g = parse_generation(m.location.filename()?)?;
                Some((g, head_rel_key(branch, g)))
            })
            .collect();
        gens.sort();
        Ok(gens)
    }

    /// The head of `branch` (BR-1), or `None` if the branch has no checkpoint.
    pub async fn branch_head(&self, branch: &str) -> Result<Option<BranchHead>, StoreError> {
        let Some((generation, rel)) = self.head_generations(branch).await?.pop() else {
            return Ok(None);
        };
        let bytes = self.get_full(&self.full_key(&rel)).await?;
        let id = parse_head(&rel, &bytes)?;
        Ok(Some(BranchHead {
            branch: branch.to_string(),
            generation,
            id,
        }))
    }

    /// Every branch of the run root with its head, sorted by name.
    pub async fn list_branches(&self) -> Result<Vec<BranchHead>, StoreError> {
        let mut heads = Vec::new();
        for name in self.branch_names().await? {
            if let Some(head) = self.branch_head(&name).await? {
                heads.push(head);
            }
        }
        Ok(heads)
    }

    /// The names of the run root's branches that hold anything, a head or not, sorted.
    pub async fn branch_names(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.full_key("branches");
        let listing = self.list_level(&dir).await?;
        let mut names: Vec<String> = listing
            .folders
            .iter()
            .filter_map(|p| p.rsplit('/').next())
            .filter(|name| validate_branch(name).is_ok())
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Moves `branch` from generation `from` (`None`: the branch has no head yet) to `id` with a
    /// create-only put (BR-2). `Conflict` when another writer moved it first.
    pub async fn advance_head(
        &self,
        branch: &str,
        from: Option<u64>,
        id: &str,
    ) -> Result<BranchHead, StoreError> {
        validate_branch(branch)?;
        validate_segment(id)?;
        let generation = from.unwrap_or(0) + 1;
        let key = self.full_key(&head_rel_key(branch, generation));
        match self
            .create_idempotent(&key, Bytes::from(format!("{id}\n")))
            .await
        {
            Ok(()) => Ok(BranchHead {
                branch: branch.to_string(),
                generation,
                id: id.to_string(),
            }),
            Err(StoreError::AlreadyExists { key }) => Err(StoreError::Conflict { key }),
            Err(e) => Err(e),
        }
    }
}

/// The checkpoint id a head object (`rel`, its bytes) names: UTF-8, one valid key segment.
pub fn parse_head(rel: &str, bytes: &[u8]) -> Result<String, StoreError> {
    let corrupt = |reason: String| StoreError::CorruptCheckpoint {
        id: rel.to_string(),
        reason,
    };
    let id = std::str::from_utf8(bytes)
        .map_err(|_| corrupt("the head is not UTF-8".into()))?
        .trim();
    validate_segment(id).map_err(|e| corrupt(format!("the head does not hold an id: {e}")))?;
    Ok(id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_backends::each_backend;

    #[test]
    fn generations_parse_only_head_files() {
        assert_eq!(parse_generation("HEAD.0000000012"), Some(12));
        assert_eq!(parse_generation("HEAD."), None);
        assert_eq!(parse_generation("HEAD.12x"), None);
        assert_eq!(parse_generation("batches"), None);
    }

    #[tokio::test]
    async fn br1_br2_heads_advance_and_racers_conflict() {
        each_backend("br2", |store| async move {
            assert_eq!(store.branch_head("main").await.expect("no head"), None);
            let h1 = store.advance_head("main", None, "a").await.expect("first");
            assert_eq!(h1.generation, 1);
            // A second writer that also saw "no head" loses.
            assert!(matches!(
                store.advance_head("main", None, "b").await,
                Err(StoreError::Conflict { .. })
            ));
            let h2 = store
                .advance_head("main", Some(1), "c")
                .await
                .expect("second");
            assert_eq!(store.branch_head("main").await.expect("head"), Some(h2));
            // Eight racers from generation 2: exactly one wins.
            let racers = (0..8).map(|i| {
                let s = store.clone();
                async move { s.advance_head("main", Some(2), &format!("r{i}")).await }
            });
            let results = futures::future::join_all(racers).await;
            let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(winners.len(), 1, "{results:?}");
            assert!(results
                .iter()
                .filter(|r| r.is_err())
                .all(|r| matches!(r, Err(StoreError::Conflict { .. }))));
            let head = store
                .branch_head("main")
                .await
                .expect("head")
                .expect("some");
            assert_eq!((head.generation, &head.id), (3, &winners[0].id));
            store.advance_head("side", None, "c").await.expect("side");
            let names: Vec<_> = store
                .list_branches()
                .await
                .expect("branches")
                .into_iter()
                .map(|h| h.branch)
                .collect();
            assert_eq!(names, vec!["main", "side"]);
            assert!(store.advance_head("../x", None, "c").await.is_err());
        })
        .await;
    }
}

#[cfg(test)]
mod many_heads {
    use crate::test_backends::each_backend;

    #[tokio::test]
    async fn br1_head_is_found_among_many_generations() {
        each_backend("br1many", |store| async move {
            let mut gen = None;
            for i in 0..130u64 {
                let h = store
                    .advance_head("main", gen, &format!("c{i}"))
                    .await
                    .expect("advance");
                gen = Some(h.generation);
            }
            let head = store
                .branch_head("main")
                .await
                .expect("head")
                .expect("some");
            assert_eq!((head.generation, head.id.as_str()), (130, "c129"));
        })
        .await;
    }
}
