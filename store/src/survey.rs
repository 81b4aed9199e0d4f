//! What a run root holds, damage included: the view of `keel ckpt list` and `keel ckpt lineage`.
//!
//! Invariants:
//! - SY-1: a survey never fails because of one damaged object: a manifest that cannot be read
//!   or parsed is listed as unreadable with its reason, a branch head that cannot be read or
//!   names a checkpoint that is missing or unreadable is listed as damaged, and every readable
//!   checkpoint is still listed. Only the store itself failing (a listing error) fails it.
//! - SY-2: for a damaged head, the survey names the checkpoint to resume from: the newest
//!   readable checkpoint committed on that branch (by step, then commit time).

use crate::{BranchHead, CheckpointManifest, RunStore, StoreError};

/// A branch head as found.
#[derive(Debug, Clone)]
pub struct HeadState {
    /// The branch.
    pub branch: String,
    /// Its head, when the head object could be read.
    pub head: Option<BranchHead>,
    /// Why the head is damaged (`None`: it names a readable checkpoint).
    pub damage: Option<String>,
    /// SY-2: for a damaged head, the newest readable checkpoint of the branch.
    pub resume_from: Option<CheckpointManifest>,
}

/// Everything `keel ckpt list/lineage` shows (SY-1).
#[derive(Debug, Clone, Default)]
pub struct Survey {
    /// Readable checkpoints, by step then commit time.
    pub manifests: Vec<CheckpointManifest>,
    /// Checkpoints whose manifest exists but cannot be read: (id, reason).
    pub unreadable: Vec<(String, String)>,
    /// Every branch's head.
    pub heads: Vec<HeadState>,
}

impl Survey {
    /// The heads that name a readable checkpoint.
    pub fn intact_heads(&self) -> Vec<BranchHead> {
        self.heads
            .iter()
            .filter(|h| h.damage.is_none())
            .filter_map(|h| h.head.clone())
            .collect()
    }
}

impl RunStore {
    /// Surveys the run root's checkpoints and branch heads (SY-1, SY-2).
    pub async fn survey(&self) -> Result<Survey, StoreError> {
        let mut survey = Survey::default();
        for id in self.checkpoint_ids().await? {
            match self.read_manifest(&id).await {
                Ok(Some(m)) => survey.manifests.push(m),
                Ok(None) => {} // uncommitted (CP-1)
                Err(
                    e @ (StoreError::ObjectStore { .. }
                    | StoreError::LocalIo { .. }
                    | StoreError::Unreachable { .. }),
                ) => return Err(e),
                Err(e) => survey.unreadable.push((id, e.to_string())),
            }
        }
        survey.manifests.sort_by(|a, b| {
            (a.step, a.created_unix_ms, &a.id).cmp(&(b.step, b.created_unix_ms, &b.id))
        });
        for branch in self.branch_names_with_main().await? {
            let state = self.head_state(&branch, &survey).await?;
            if let Some(state) = state {
                survey.heads.push(state);
            }
        }
        Ok(survey)
    }

    /// The head of `branch` as found, or `None` when the branch has no head.
    async fn head_state(
        &self,
        branch: &str,
        survey: &Survey,
    ) -> Result<Option<HeadState>, StoreError> {
        let (head, damage) = match self.branch_head(branch).await {
            Ok(None) => return Ok(None),
            Ok(Some(h)) => {
                let damage = if survey.manifests.iter().any(|m| m.id == h.id) {
                    None
                } else if let Some((_, why)) = survey.unreadable.iter().find(|(id, _)| *id == h.id)
                {
                    Some(format!(
                        "it names checkpoint {}, which is unreadable: {why}",
                        h.id
                    ))
                } else {
                    Some(format!(
                        "it names checkpoint {}, which does not exist",
                        h.id
                    ))
                };
                (Some(h), damage)
            }
            Err(
                e @ (StoreError::ObjectStore { .. }
                | StoreError::LocalIo { .. }
                | StoreError::Unreachable { .. }),
            ) => return Err(e),
            Err(e) => (None, Some(format!("the head cannot be read: {e}"))),
        };
        let resume_from = damage.as_ref().and_then(|_| {
            survey
                .manifests
                .iter()
                .filter(|m| m.branch == branch)
                .max_by(|a, b| (a.step, a.created_unix_ms).cmp(&(b.step, b.created_unix_ms)))
                .cloned()
        });
        Ok(Some(HeadState {
            branch: branch.to_string(),
            head,
            damage,
            resume_from,
        }))
    }

    /// `main` and every other branch name, sorted, `main` first.
    async fn branch_names_with_main(&self) -> Result<Vec<String>, StoreError> {
        let mut names = vec![crate::DEFAULT_BRANCH.to_string()];
        names.extend(
            self.branch_names()
                .await?
                .into_iter()
                .filter(|b| b != crate::DEFAULT_BRANCH),
        );
        Ok(names)
    }
}
