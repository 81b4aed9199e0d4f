//! Roles in separate processes: the trainer (`keel trainer`) and generator ranks
//! (`keel generator --rank R`) coordinate only through the run root.
//!
//! ```text
//! lives/<life>.json                          the trainer life (LV-1..4, `keel_store::lives`)
//! weights/<life>/e<epoch>-v<version>.json    published weights (WT-1..4, `keel_store::weights`)
//! orders/<life>/r<rank>/<seq>.json           a work order: one Generate for one rank
//! results/<life>/<seq>.json                  its answer, written after the batch
//! ranks/<life>/r<rank>-<process>.json        a generator process of that rank started
//! ranks/<life>/r<rank>-<process>-heard-<seq>.json
//!                                            that process is alive although order <seq> was
//!                                            withdrawn (RM-5)
//! ```
//! (all under `branches/<b>/` for a branch other than `main`).
//!
//! Invariants:
//! - RM-1: every object is create-only. An order is written only after the weights it names are
//!   stored (WT-1); a result only after the batch it names is stored (GN-2).
//! - RM-2: an order names the exact weights (life, epoch, version) and reference serial to load,
//!   so a re-executed order samples with the same weights; with batch invariance (sync mode) it
//!   is the same batch, bit for bit.
//! - RM-3: a generator serves only the newest trainer life; orders of older lives are never
//!   executed once a newer life exists. It re-executes its rank's unanswered orders after a
//!   restart; a second answer to one order loses the create-only race and is dropped.
//! - RM-4: batch keys carry the writing process's tag (ST-12), so a re-executed order, a zombie
//!   generator and a new trainer life never race for one key; the trainer trains exactly the key
//!   the result names.
//! - RM-5: an order unanswered for `distributed.order_timeout_s` is withdrawn: the trainer writes
//!   its result itself ([`Outcome::Withdrawn`]). The create-only result decides the race: when a
//!   generator's answer was stored first the trainer takes that answer, otherwise the range goes
//!   back to the controller (CT-3) and the generator's late answer is dropped. The rank gets no
//!   new order until it is heard from: a process of it starts, or a live process finds one of
//!   its orders withdrawn and writes a `heard` record. So a late, restarted or stalled rank gets
//!   work again, and a dead one never stalls the others.
//! - RM-6: the weights an order names stay in the run root until the order is answered or
//!   withdrawn (the trainer's board pins them, SB-3), however far training has moved on; an
//!   order whose weights are gone all the same, or that cannot be read, is answered
//!   [`Outcome::Void`] and its range is issued again: a generator never crash-loops on one.
//! - RM-7: orders of every purpose follow RM-5; an evaluation pass a rank did not answer is
//!   issued again to a rank that answers, under a fresh batch number (EV-7).
//! - RM-8: generators serve the branch the trainer trains: from their `--branch` (default
//!   `main`) they follow the collapse guard's rewinds (GD-6) to the branch that has the newest
//!   trainer life, as a restarted trainer does.

use std::sync::Arc;

use keel_envs::scaffold::{Bank, GroupRecord};
use keel_store::{BatchKey, RunStore, StoreError, WeightsId};
use serde::{Deserialize, Serialize};

use crate::generator::{Generate, Generated, Purpose, Work};
use crate::rollout::{RolloutStats, TaskRef};

pub mod handle;
pub mod store_board;
pub mod worker;

pub use handle::{GeneratorHandle, RemoteGenerator};
pub use store_board::StoreBoard;
pub use worker::{run_generator, GeneratorExit};

const ORDER_FORMAT: &str = "keel.order.v1";
const RESULT_FORMAT: &str = "keel.result.v1";

/// The keys of one trainer life's coordination objects on one branch.
#[derive(Debug, Clone)]
pub struct LifeKeys {
    store: RunStore,
    life: u64,
}

impl LifeKeys {
    /// The keys of `life` on `store`'s branch.
    pub fn new(store: &RunStore, life: u64) -> Self {
        LifeKeys {
            store: store.clone(),
            life,
        }
    }

    /// The trainer life.
    pub fn life(&self) -> u64 {
        self.life
    }

    /// The folder of `rank`'s orders.
    pub fn orders_dir(&self, rank: u32) -> String {
        self.store
            .branch_dir(&format!("orders/{:010}/r{rank:04}", self.life))
    }

    /// The order of batch `seq` to `rank`.
    pub fn order(&self, rank: u32, seq: u64) -> String {
        format!("{}/{seq:020}.json", self.orders_dir(rank))
    }

    /// The result of batch `seq`.
    pub fn result(&self, seq: u64) -> String {
        self.store
            .branch_dir(&format!("results/{:010}/{seq:020}.json", self.life))
    }

    /// The folder of process starts of every rank.
    pub fn ranks_dir(&self) -> String {
        self.store.branch_dir(&format!("ranks/{:010}", self.life))
    }

    /// The start record of process `process` of `rank`.
    pub fn rank_start(&self, rank: u32, process: &str) -> String {
        format!("{}/r{rank:04}-{process}.json", self.ranks_dir())
    }

    /// The record that process `process` of `rank` found its order `seq` withdrawn (RM-5).
    pub fn rank_heard(&self, rank: u32, process: &str, seq: u64) -> String {
        format!(
            "{}/r{rank:04}-{process}-heard-{seq:020}.json",
            self.ranks_dir()
        )
    }
}

/// The batch sequence number an order or result key names (`…/<seq>.json`).
pub fn seq_of_key(key: &str) -> Option<u64> {
    let digits = key.rsplit('/').next()?.strip_suffix(".json")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// One work order (RM-1, RM-2).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkOrder {
    /// Format tag.
    pub format: String,
    /// The trainer life that issued it.
    pub life: u64,
    /// The rank it is addressed to.
    pub rank: u32,
    /// The weights to sample with.
    pub weights: WeightsId,
    /// ARMOR: the reference publication to sample anchors with.
    pub reference: Option<WeightsId>,
    /// Batch sequence number.
    pub batch_seq: u64,
    /// The tasks.
    pub tasks: Vec<TaskRef>,
    /// Train or eval.
    pub purpose: Purpose,
    /// What to sample.
    pub work: Work,
    /// PATS: the scaffold bank to render into training prompts.
    pub scaffold: Option<Bank>,
}

impl WorkOrder {
    /// The order for `msg`.
    pub fn new(
        life: u64,
        rank: u32,
        weights: WeightsId,
        reference: Option<WeightsId>,
        msg: &Generate,
    ) -> Self {
        WorkOrder {
            format: ORDER_FORMAT.into(),
            life,
            rank,
            weights,
            reference,
            batch_seq: msg.batch_seq,
            tasks: msg.tasks.clone(),
            purpose: msg.purpose,
            work: msg.work.clone(),
            scaffold: msg.scaffold.as_deref().cloned(),
        }
    }

    /// The message the local generator actor executes.
    pub fn generate(&self) -> Generate {
        Generate {
            batch_seq: self.batch_seq,
            tasks: self.tasks.clone(),
            purpose: self.purpose,
            work: self.work.clone(),
            scaffold: self.scaffold.clone().map(Arc::new),
        }
    }

    /// Parses and checks a stored order.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let o: WorkOrder = parse(key, bytes, "work order")?;
        if o.format != ORDER_FORMAT || seq_of_key(key) != Some(o.batch_seq) {
            return Err(StoreError::CorruptObject {
                key: key.into(),
                reason: format!("format {:?}, batch {}", o.format, o.batch_seq),
            });
        }
        Ok(o)
    }
}

/// What a generator answers to an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Outcome {
    /// The batch (train: stored at `key`) and what sampling it did.
    Done(Box<GeneratedWire>),
    /// The generator panicked mid-batch (GN-4): the range is owed again.
    Panicked(String),
    /// Every episode failed in its env (RO-4, CT-8).
    AllEpisodesFailed {
        /// Episodes that failed.
        failed: usize,
        /// The last failure, in words.
        last_failure: String,
    },
    /// An error retrying cannot fix (a model that does not load, a bad config): the run ends.
    Failed(String),
    /// The trainer gave the order up before any answer was stored (RM-5); written by the
    /// trainer, never by a generator.
    Withdrawn,
    /// The order cannot be served as written: its weights are gone from the run root (RM-6),
    /// or the order itself is unreadable. The range is owed again.
    Void(String),
}

/// The process name a trainer signs its withdrawals with.
pub const WITHDRAWN_BY: &str = "trainer";

/// A stored answer to an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderResult {
    /// Format tag.
    pub format: String,
    /// The answering rank.
    pub rank: u32,
    /// The answering process.
    pub process: String,
    /// Batch sequence number of the order.
    pub batch_seq: u64,
    /// Seconds the generator waited for the order's weights before sampling (0 when cached).
    pub weight_load_seconds: f64,
    /// Bytes it read for them.
    pub weight_load_bytes: u64,
    /// The weights had been loaded ahead, while the generator sampled (GW-5).
    #[serde(default)]
    pub weights_prefetched: bool,
    /// The outcome.
    pub outcome: Outcome,
}

impl OrderResult {
    /// A result of `process` of `rank` for batch `batch_seq`.
    pub fn new(rank: u32, process: &str, batch_seq: u64, outcome: Outcome) -> Self {
        OrderResult {
            format: RESULT_FORMAT.into(),
            rank,
            process: process.into(),
            batch_seq,
            weight_load_seconds: 0.0,
            weight_load_bytes: 0,
            weights_prefetched: false,
            outcome,
        }
    }

    /// Parses and checks a stored result.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let r: OrderResult = parse(key, bytes, "order result")?;
        if r.format != RESULT_FORMAT || seq_of_key(key) != Some(r.batch_seq) {
            return Err(StoreError::CorruptObject {
                key: key.into(),
                reason: format!("format {:?}, batch {}", r.format, r.batch_seq),
            });
        }
        Ok(r)
    }
}

/// [`Generated`] as stored in a result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GeneratedWire {
    /// The stored batch's key (train only; not for RTPO trunks).
    pub key: Option<String>,
    /// Policy version it was sampled with.
    pub policy_version: u64,
    /// Its statistics.
    pub stats: RolloutStats,
    /// Seconds spent sampling.
    pub sample_seconds: f64,
    /// Seconds the batch write took.
    pub put_seconds: f64,
    /// Dynamic sampling: passes made.
    pub tries: usize,
    /// Dynamic sampling: groups still uniform.
    pub uniform_groups: usize,
    /// RTPO trunks: the most turns of a trunk.
    pub trunk_depth: Option<usize>,
    /// PATS: the rollout groups.
    pub groups: Vec<GroupRecord>,
}

impl GeneratedWire {
    /// The wire form of `g`.
    pub fn from_generated(g: Generated) -> Self {
        GeneratedWire {
            key: g.key.map(|k| k.0),
            policy_version: g.policy_version,
            stats: g.stats,
            sample_seconds: g.sample_seconds,
            put_seconds: g.put_seconds,
            tries: g.tries,
            uniform_groups: g.uniform_groups,
            trunk_depth: g.trunk_depth,
            groups: g.groups,
        }
    }

    /// Back to [`Generated`], for the order that asked for it.
    pub fn into_generated(self, order: &Generate) -> Generated {
        Generated {
            key: self.key.map(BatchKey),
            batch_seq: order.batch_seq,
            policy_version: self.policy_version,
            stats: self.stats,
            tasks: order.tasks.clone(),
            sample_seconds: self.sample_seconds,
            put_seconds: self.put_seconds,
            tries: self.tries,
            uniform_groups: self.uniform_groups,
            trunk_depth: self.trunk_depth,
            groups: self.groups,
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    key: &str,
    bytes: &[u8],
    what: &str,
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::CorruptObject {
        key: key.into(),
        reason: format!("not a {what}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_batch_and_branch() {
        let store = RunStore::open(&std::env::temp_dir().join("keel-rm-keys").to_string_lossy())
            .expect("store");
        let k = LifeKeys::new(&store, 3);
        assert_eq!(
            k.order(1, 7),
            "orders/0000000003/r0001/00000000000000000007.json"
        );
        assert_eq!(seq_of_key(&k.order(1, 7)), Some(7));
        assert_eq!(seq_of_key(&k.result(1 << 40)), Some(1 << 40));
        let side = LifeKeys::new(&store.on_branch("side").expect("branch"), 3);
        assert!(side
            .result(2)
            .starts_with("branches/side/results/0000000003/"));
    }

    #[test]
    fn orders_and_results_round_trip_and_refuse_garbage() {
        let msg = Generate::groups(
            5,
            vec![TaskRef {
                task_id: 40,
                task_seed: 9,
            }],
            Purpose::Train,
        );
        let w = WeightsId::Policy {
            epoch: 0,
            version: 2,
        };
        let order = WorkOrder::new(3, 1, w, None, &msg);
        let bytes = serde_json::to_vec(&order).expect("json");
        let key = "orders/0000000003/r0001/00000000000000000005.json";
        let back = WorkOrder::from_bytes(key, &bytes).expect("order");
        assert_eq!(back.generate().tasks, msg.tasks);
        assert_eq!(back.weights, w);
        // The key and the body must agree on the batch.
        assert!(WorkOrder::from_bytes("orders/x/r0001/00000000000000000006.json", &bytes).is_err());
        assert!(WorkOrder::from_bytes(key, b"{").is_err());
        let result = OrderResult::new(1, "p", 5, Outcome::Panicked("boom".into()));
        let bytes = serde_json::to_vec(&result).expect("json");
        let rkey = "results/0000000003/00000000000000000005.json";
        assert!(matches!(
            OrderResult::from_bytes(rkey, &bytes)
                .expect("result")
                .outcome,
            Outcome::Panicked(_)
        ));
    }
}
