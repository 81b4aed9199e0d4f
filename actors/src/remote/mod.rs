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
//!   the result names, and only when the result reports the order's batch number and tasks
//!   ([`answering`]).
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

use keel_store::{RunStore, StoreError, WeightsId};
use serde::{Deserialize, Serialize};

use crate::generator::{Generate, Generated};

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

/// One work order (RM-1, RM-2): the [`Generate`] message for one rank, with the weights to
/// sample it with. Stored as one flat JSON object; the message's fields follow `reference`.
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
    /// The message the rank's generator actor executes.
    #[serde(flatten)]
    pub generate: Generate,
}

impl WorkOrder {
    /// The order for `msg`.
    pub fn new(
        life: u64,
        rank: u32,
        weights: WeightsId,
        reference: Option<WeightsId>,
        msg: Generate,
    ) -> Self {
        WorkOrder {
            format: ORDER_FORMAT.into(),
            life,
            rank,
            weights,
            reference,
            generate: msg,
        }
    }

    /// Parses and checks a stored order.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let o: WorkOrder = parse(key, bytes, "work order")?;
        let seq = o.generate.batch_seq;
        if o.format != ORDER_FORMAT || seq_of_key(key) != Some(seq) {
            return Err(StoreError::CorruptObject {
                key: key.into(),
                reason: format!("format {:?}, batch {seq}", o.format),
            });
        }
        Ok(o)
    }
}

/// What a generator answers to an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Outcome {
    /// The batch (train: stored at `key`) and what sampling it did. Results stored before
    /// [`Generated`] was the wire form lack its `batch_seq` and `tasks` ([`answering`]).
    Done(Box<Generated>),
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

/// The batch `g` of a result, checked against and completed from the order `order` it answers
/// (RM-4). A result stored before [`Generated`] was the wire form has no tasks (nor batch
/// number): it takes the order's. Otherwise both must be the order's.
pub fn answering(mut g: Generated, order: &Generate) -> Result<Generated, String> {
    if g.tasks.is_empty() {
        g.batch_seq = order.batch_seq;
        g.tasks.clone_from(&order.tasks);
    }
    if g.batch_seq != order.batch_seq || g.tasks != order.tasks {
        return Err(format!(
            "the result reports batch {} with {} tasks, not the order's batch {} with {} tasks",
            g.batch_seq,
            g.tasks.len(),
            order.batch_seq,
            order.tasks.len()
        ));
    }
    Ok(g)
}

/// Serde of [`Generated::key`]: a batch key is stored as its string (or null).
pub(crate) mod batch_key {
    use keel_store::BatchKey;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes the key's string, or null.
    pub fn serialize<S: Serializer>(key: &Option<BatchKey>, s: S) -> Result<S::Ok, S::Error> {
        key.as_ref().map(|k| k.0.as_str()).serialize(s)
    }

    /// Reads a string, or null, as a key.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BatchKey>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.map(BatchKey))
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
    use std::sync::Arc;

    use keel_envs::scaffold::Bank;
    use keel_store::BatchKey;

    use super::*;
    use crate::generator::{Purpose, Work};
    use crate::rollout::TaskRef;

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
        let order = WorkOrder::new(3, 1, w, None, msg.clone());
        let bytes = serde_json::to_vec(&order).expect("json");
        let key = "orders/0000000003/r0001/00000000000000000005.json";
        let back = WorkOrder::from_bytes(key, &bytes).expect("order");
        assert_eq!(back.generate.tasks, msg.tasks);
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

    /// An order as the code before issue 33 stored it (`serde_json::to_vec_pretty` of a struct
    /// with the fields of `Generate` declared after `reference`).
    const OLD_ORDER: &str = r#"{
  "format": "keel.order.v1",
  "life": 3,
  "rank": 1,
  "weights": {
    "Policy": {
      "epoch": 0,
      "version": 2
    }
  },
  "reference": {
    "Reference": {
      "serial": 1
    }
  },
  "batch_seq": 5,
  "tasks": [
    {
      "task_id": 40,
      "task_seed": 9
    },
    {
      "task_id": 41,
      "task_seed": 12
    }
  ],
  "purpose": "Train",
  "work": {
    "Branches": {
      "key": "state/rtpo/trunks-4.json",
      "depth": 1
    }
  },
  "scaffold": {
    "version": 0,
    "next_id": 0,
    "entries": []
  }
}"#;

    /// A result as the code before issue 33 stored it: `Done` without `batch_seq` or `tasks`.
    const OLD_RESULT: &str = r#"{
  "format": "keel.result.v1",
  "rank": 1,
  "process": "p",
  "batch_seq": 5,
  "weight_load_seconds": 0.5,
  "weight_load_bytes": 1024,
  "weights_prefetched": false,
  "outcome": {
    "Done": {
      "key": "batches/00000000000000000005-p.krb",
      "policy_version": 2,
      "stats": {
        "episodes": 8,
        "successes": 3,
        "failed_episodes": 0,
        "turns": 20,
        "invalid_turns": 1,
        "sampled_tokens": 400,
        "reward_sum": 3.0,
        "prompt_tokens": 100,
        "scaffold_tokens": 0,
        "decode_steps": 50,
        "busy_decode_steps": 40,
        "weight_updates": 0
      },
      "sample_seconds": 1.5,
      "put_seconds": 0.25,
      "tries": 1,
      "uniform_groups": 0,
      "trunk_depth": null,
      "groups": []
    }
  }
}"#;

    fn old_order_message() -> Generate {
        Generate {
            batch_seq: 5,
            tasks: vec![
                TaskRef {
                    task_id: 40,
                    task_seed: 9,
                },
                TaskRef {
                    task_id: 41,
                    task_seed: 12,
                },
            ],
            purpose: Purpose::Train,
            work: Work::Branches {
                key: "state/rtpo/trunks-4.json".into(),
                depth: 1,
            },
            scaffold: Some(Arc::new(Bank::new())),
        }
    }

    #[test]
    fn orders_stored_before_the_flattened_message_read_and_are_written_alike() {
        let key = "orders/0000000003/r0001/00000000000000000005.json";
        let old = WorkOrder::from_bytes(key, OLD_ORDER.as_bytes()).expect("old order");
        let msg = old_order_message();
        assert_eq!(old.generate.tasks, msg.tasks);
        assert_eq!(old.generate.work, msg.work);
        assert_eq!(old.generate.scaffold.as_deref(), Some(&Bank::new()));
        assert_eq!(old.reference, Some(WeightsId::Reference { serial: 1 }));
        let order = WorkOrder::new(
            3,
            1,
            WeightsId::Policy {
                epoch: 0,
                version: 2,
            },
            Some(WeightsId::Reference { serial: 1 }),
            msg,
        );
        let written = serde_json::to_string_pretty(&order).expect("json");
        assert_eq!(written, OLD_ORDER);
    }

    #[test]
    fn results_stored_before_generated_was_the_wire_form_take_the_orders_tasks() {
        let rkey = "results/0000000003/00000000000000000005.json";
        let old = OrderResult::from_bytes(rkey, OLD_RESULT.as_bytes()).expect("old result");
        let Outcome::Done(g) = old.outcome else {
            panic!("not done: {:?}", old.outcome);
        };
        assert_eq!(
            g.key,
            Some(BatchKey("batches/00000000000000000005-p.krb".into()))
        );
        assert_eq!((g.stats.episodes, g.tries, g.put_seconds), (8, 1, 0.25));
        let msg = old_order_message();
        let g = answering(*g, &msg).expect("answers its order");
        assert_eq!((g.batch_seq, &g.tasks), (5, &msg.tasks));
        // A result written now carries them, and they must be the order's.
        let now = OrderResult::new(1, "p", 5, Outcome::Done(Box::new(g.clone())));
        let back = OrderResult::from_bytes(rkey, &serde_json::to_vec(&now).expect("json"))
            .expect("result");
        let Outcome::Done(read) = back.outcome else {
            panic!("not done");
        };
        assert_eq!((read.batch_seq, &read.tasks), (5, &msg.tasks));
        assert_eq!(read.key, g.key);
        let mut fewer = g.clone();
        fewer.tasks.truncate(1);
        assert!(answering(fewer, &msg).is_err());
        let mut later = g;
        later.batch_seq = 6;
        assert!(answering(later, &msg).is_err());
    }
}
