//! Trainer lives: the fencing tokens that make one trainer the only writer of a branch.
//!
//! ```text
//! <root>/lives/0000000003.json        life 3 of branch `main`: who claimed it, when, its config
//! <root>/lives/0000000003.end.json    how life 3 ended (finished the run, stopped, failed)
//! <root>/branches/<b>/lives/…         the same for any other branch `b`
//! ```
//!
//! A trainer that starts claims the next life with a create-only put; of several trainers that
//! race for the same number exactly one gets it and the others take the next one. The newest
//! life owns the branch: an older life that sees a newer one stops without writing.
//!
//! Invariants:
//! - LV-1: life numbers only increase; a life record is never rewritten (create-only).
//! - LV-2: a trainer checks that its life is still the newest before every checkpoint commit
//!   ([`RunStore::check_life`]); an older life gets [`StoreError::Superseded`] naming the winner.
//! - LV-3: after claiming, the new life fences the branch head ([`RunStore::fence_head`]): it
//!   writes the next head generation naming the same checkpoint, and from then on commits expect
//!   exactly that generation (`ExpectHead::Generation`). A zombie that read an older generation
//!   can no longer advance the head: its commit gets `Conflict`, whatever it believed.
//! - LV-4: a life's end record is written once, after its last checkpoint; generators stop when
//!   the newest life says the run is finished.

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::root::RunStore;

const LIFE_FORMAT: &str = "keel.life.v1";
const END_FORMAT: &str = "keel.life-end.v1";
/// Claims retried on a lost race before giving up (each loss means another trainer won a number).
const CLAIM_ATTEMPTS: usize = 64;

/// Who holds a life, as stored in `lives/<n>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifeRecord {
    /// Format tag.
    pub format: String,
    /// The life number (set by [`RunStore::claim_life`]).
    pub life: u64,
    /// The process that claimed it: `trainer` (separate roles) or `train` (one process).
    pub role: String,
    /// Host name of the claimant.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// When it claimed the life (Unix ms).
    pub started_unix_ms: u64,
    /// The config hash the life trains under (generators check theirs against it).
    pub config_hash: String,
    /// The effective config as TOML, credentials redacted (generators without `--config`).
    pub config_toml: String,
}

impl LifeRecord {
    /// A record for this process (the life number is set when it is claimed).
    pub fn for_this_process(role: &str, config_hash: &str, config_toml: &str) -> LifeRecord {
        LifeRecord {
            format: LIFE_FORMAT.into(),
            life: 0,
            role: role.into(),
            host: hostname(),
            pid: std::process::id(),
            started_unix_ms: unix_ms(),
            config_hash: config_hash.into(),
            config_toml: config_toml.into(),
        }
    }

    /// "life 3 (trainer, pid 77 on host-a)", for messages.
    pub fn describe(&self) -> String {
        format!(
            "life {} ({}, pid {} on {})",
            self.life, self.role, self.pid, self.host
        )
    }
}

/// How a life ended, as stored in `lives/<n>.end.json` (LV-4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifeEnd {
    /// Format tag.
    pub format: String,
    /// The life.
    pub life: u64,
    /// The run reached its last step: nothing is left to generate.
    pub finished: bool,
    /// Why it ended, in words.
    pub reason: String,
    /// When (Unix ms).
    pub ended_unix_ms: u64,
}

impl LifeEnd {
    /// An end record of `life`.
    pub fn new(life: u64, finished: bool, reason: &str) -> LifeEnd {
        LifeEnd {
            format: END_FORMAT.into(),
            life,
            finished,
            reason: reason.into(),
            ended_unix_ms: unix_ms(),
        }
    }
}

fn unix_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
}

/// The life number a `lives/` object name encodes (`<digits>.json`), ends excluded.
fn parse_life(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl RunStore {
    /// The relative folder of this branch's lives.
    fn lives_dir(&self) -> String {
        self.branch_dir("lives")
    }

    fn life_key(&self, life: u64) -> String {
        format!("{}/{life:010}.json", self.lives_dir())
    }

    fn life_end_key(&self, life: u64) -> String {
        format!("{}/{life:010}.end.json", self.lives_dir())
    }

    /// Every claimed life of this branch, ascending.
    pub async fn lives(&self) -> Result<Vec<u64>, StoreError> {
        let mut lives: Vec<u64> = self
            .list_objects(&self.lives_dir())
            .await?
            .iter()
            .filter_map(|k| parse_life(k.rsplit('/').next()?))
            .collect();
        lives.sort_unstable();
        Ok(lives)
    }

    /// Claims the next life of this branch (LV-1): the first free number above every claimed one.
    pub async fn claim_life(&self, mut record: LifeRecord) -> Result<LifeRecord, StoreError> {
        for _ in 0..CLAIM_ATTEMPTS {
            record.life = self.lives().await?.last().map_or(1, |n| n + 1);
            let body = serde_json::to_vec_pretty(&record)?;
            match self
                .create_object(&self.life_key(record.life), body.into())
                .await
            {
                Ok(()) => return Ok(record),
                Err(StoreError::AlreadyExists { .. }) => continue, // another trainer won it
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict {
            key: self.full_key(&self.lives_dir()),
        })
    }

    /// The record of `life`.
    pub async fn life(&self, life: u64) -> Result<LifeRecord, StoreError> {
        let key = self.life_key(life);
        let bytes = self.get_object(&key).await?;
        let record: LifeRecord =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::CorruptObject {
                key: key.clone(),
                reason: format!("not a life record: {e}"),
            })?;
        if record.format != LIFE_FORMAT || record.life != life {
            return Err(StoreError::CorruptObject {
                key,
                reason: format!("format {:?}, life {}", record.format, record.life),
            });
        }
        Ok(record)
    }

    /// The newest life of this branch, if any trainer ever started on it.
    pub async fn newest_life(&self) -> Result<Option<LifeRecord>, StoreError> {
        match self.lives().await?.last() {
            Some(&n) => Ok(Some(self.life(n).await?)),
            None => Ok(None),
        }
    }

    /// LV-2: `Ok` while `life` is the newest life of this branch, else `Superseded` naming it.
    pub async fn check_life(&self, life: u64) -> Result<(), StoreError> {
        match self.lives().await?.last() {
            Some(&newest) if newest > life => {
                let winner = self.life(newest).await?;
                Err(StoreError::Superseded {
                    branch: self.branch().to_string(),
                    life,
                    winner: winner.describe(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Records how `end.life` ended (LV-4); a second record for one life is refused.
    pub async fn end_life(&self, end: &LifeEnd) -> Result<(), StoreError> {
        let body = serde_json::to_vec_pretty(end)?;
        self.create_object(&self.life_end_key(end.life), body.into())
            .await
    }

    /// How `life` ended, or `None` while it has not (or died without saying).
    pub async fn life_end(&self, life: u64) -> Result<Option<LifeEnd>, StoreError> {
        let key = self.life_end_key(life);
        match self.get_object(&key).await {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| StoreError::CorruptObject {
                        key,
                        reason: format!("not a life end record: {e}"),
                    })
            }
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LV-3: writes the next generation of this branch's head naming the checkpoint the head
    /// names now, so that no writer that read an older generation can commit. Returns the
    /// generation commits must expect from now on (`None`: the branch has no head yet).
    pub async fn fence_head(&self) -> Result<Option<u64>, StoreError> {
        let branch = self.branch().to_string();
        for _ in 0..CLAIM_ATTEMPTS {
            let Some(head) = self.branch_head(&branch).await? else {
                return Ok(None);
            };
            match self
                .advance_head(&branch, Some(head.generation), &head.id)
                .await
            {
                Ok(fenced) => return Ok(Some(fenced.generation)),
                Err(StoreError::Conflict { .. }) => continue, // an older writer committed first
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict {
            key: self.full_key(&format!("branches/{branch}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_backends::each_backend;

    fn record() -> LifeRecord {
        LifeRecord::for_this_process("trainer", "hash", "")
    }

    #[test]
    fn life_names_parse_only_records() {
        assert_eq!(parse_life("0000000003.json"), Some(3));
        assert_eq!(parse_life("0000000003.end.json"), None);
        assert_eq!(parse_life("x.json"), None);
    }

    #[tokio::test]
    async fn lv1_lv2_racing_claims_get_distinct_lives_and_only_the_newest_may_write() {
        each_backend("lv1", |store| async move {
            let racers = (0..6).map(|_| {
                let s = store.clone();
                async move { s.claim_life(record()).await }
            });
            let mut lives: Vec<u64> = futures::future::join_all(racers)
                .await
                .into_iter()
                .map(|r| r.expect("claim").life)
                .collect();
            lives.sort_unstable();
            assert_eq!(lives, vec![1, 2, 3, 4, 5, 6]);
            assert!(store.check_life(6).await.is_ok());
            match store.check_life(2).await {
                Err(StoreError::Superseded { life, winner, .. }) => {
                    assert_eq!(life, 2);
                    assert!(winner.starts_with("life 6 (trainer"), "{winner}");
                }
                other => panic!("expected Superseded, got {other:?}"),
            }
            // Another branch has lives of its own.
            let side = store.on_branch("side").expect("branch");
            assert_eq!(side.claim_life(record()).await.expect("side").life, 1);
            assert_eq!(
                store.newest_life().await.expect("newest").map(|r| r.life),
                Some(6)
            );
        })
        .await;
    }

    #[tokio::test]
    async fn lv3_a_fenced_head_refuses_writers_of_the_older_generation() {
        each_backend("lv3", |store| async move {
            assert_eq!(store.fence_head().await.expect("no head"), None);
            store.advance_head("main", None, "a").await.expect("first");
            assert_eq!(store.fence_head().await.expect("fence"), Some(2));
            let head = store
                .branch_head("main")
                .await
                .expect("head")
                .expect("some");
            assert_eq!((head.generation, head.id.as_str()), (2, "a"));
            // A zombie that read generation 1 before the fence cannot move the head.
            assert!(matches!(
                store.advance_head("main", Some(1), "zombie").await,
                Err(StoreError::Conflict { .. })
            ));
        })
        .await;
    }

    #[tokio::test]
    async fn lv4_an_end_is_recorded_once() {
        each_backend("lv4", |store| async move {
            let life = store.claim_life(record()).await.expect("claim").life;
            assert_eq!(store.life_end(life).await.expect("none"), None);
            store
                .end_life(&LifeEnd::new(life, true, "finished"))
                .await
                .expect("end");
            let end = store.life_end(life).await.expect("end").expect("some");
            assert!(end.finished);
            assert!(store
                .end_life(&LifeEnd::new(life, false, "again"))
                .await
                .is_err());
        })
        .await;
    }
}
