//! The agent journal: every answered call of an agent episode is in the run's store before the
//! agent sees its answer, so a keel process that dies mid-episode loses no completed call, and
//! a restarted one takes up the episodes whose agents are still alive.
//!
//! Invariants:
//! - AJ-1 Before a call is answered, its episode's record is put in the store: the conversation
//!   with the answer, the `Idempotency-Key`s answered, and the runtime's record of the episode's
//!   tokens (prompts, sampled tokens, their log-probs and the policy version of every token,
//!   RB-5), as [`crate::SampledTurn::record`] carries it. A put that fails fails the episode
//!   and the call is answered 503: no answer leaves unrecorded.
//! - AJ-2 Records live under `agent-journal/<scope>/<sha256 of the episode key>`; the key itself
//!   is never stored. The scope is the gateway's configured `env.agent.bind`, the address its
//!   agents call. A gateway on port 0 (a new address at every start) writes under a scope of
//!   its own that no later process reads. An episode's record is deleted when the episode ends.
//! - AJ-3 A gateway that starts on a scope holding records (keel restarted on the same bind)
//!   takes them up with `launch = "pull"`: their keys are live again, and the next reset of a
//!   record's task seed continues its episode instead of offering a new one (episodes of one
//!   task are exchangeable within a group). Its agent's next call decides how: a retry of the
//!   last call answered (the same messages, or an `Idempotency-Key` answered) gets the recorded
//!   answer, never a second sample (AGT-2); a call that goes on starts a new segment whose
//!   prompt is its whole conversation (AGT-3); an agent that reports its end ends the episode
//!   on the recorded segments. Every recorded token is trained as sampled.
//! - AJ-4 Records nobody takes up within `env.agent.timeout_s` of the start, and every record
//!   found with `launch = "spawn"` (its agent was the dead process's child, which a new process
//!   can neither watch nor reap), are dropped: deleted, their keys dead (404), counted in the
//!   log. An episode is never trained on a part of its calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::gateway::{Gateway, Mailbox, Served};
use super::openai::{Answer, InMessage};
use crate::dataset::PromptMessage;
use crate::error::EnvError;

/// Where the journal's records are kept: the run's object store, as the runtime provides it.
/// Names are relative to the run root; every call blocks until the store answered.
pub trait RecordStore: Send + Sync {
    /// Puts `bytes` at `name`, replacing what was there.
    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), String>;
    /// Reads the object at `name`.
    fn get(&self, name: &str) -> Result<Vec<u8>, String>;
    /// The names of every object under the folder `dir`.
    fn list(&self, dir: &str) -> Result<Vec<String>, String>;
    /// Deletes the object at `name` (an absent one is no error).
    fn delete(&self, name: &str) -> Result<(), String>;
}

/// What an episode has said so far, as the conversation check needs it (AGT-1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum SaidRecord {
    /// A message the agent sent.
    Sent(InMessage),
    /// An answer keel gave.
    Answered(Answer),
}

/// One episode's record (AJ-1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// The task the episode runs.
    pub task_seed: u64,
    /// The conversation so far, its last answer included.
    pub said: Vec<SaidRecord>,
    /// The answers given to calls that sent an `Idempotency-Key` (AGT-2).
    pub by_key: HashMap<String, Served>,
    /// Calls answered.
    pub calls: usize,
    /// The reward the agent posted, if it has.
    pub reward: Option<f32>,
    /// The last answer's text (the verifier's input).
    pub last_text: String,
    /// The first call's preamble.
    pub preamble: Vec<PromptMessage>,
    /// The tools the last call offered.
    pub tools: Vec<serde_json::Value>,
    /// A text episode's transcript (AGT-8).
    #[serde(default)]
    pub text: Option<super::Transcript>,
    /// The runtime's record of the episode's tokens (opaque here).
    #[serde(skip)]
    pub tokens: Vec<u8>,
}

impl EpisodeRecord {
    /// The record as stored: a little-endian u32 length, the JSON fields, then the tokens.
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let head = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(4 + head.len() + self.tokens.len());
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        out.extend_from_slice(&self.tokens);
        Ok(out)
    }

    fn from_bytes(bytes: &[u8]) -> Result<EpisodeRecord, String> {
        let len = bytes
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or("shorter than its header")?;
        let head = bytes
            .get(4..4 + len)
            .ok_or("shorter than its header says")?;
        let mut record: EpisodeRecord = serde_json::from_slice(head).map_err(|e| e.to_string())?;
        record.tokens = bytes[4 + len..].to_vec();
        Ok(record)
    }
}

/// The SHA-256 of an episode key, hex: the name its record is kept under (AJ-2).
pub fn key_digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A recorded episode waiting for its task's next reset (AJ-3).
pub struct Adoptable {
    /// What was recorded.
    pub record: EpisodeRecord,
    /// Its key, live again.
    pub mailbox: Mailbox,
}

/// The journal of one gateway (AJ-1..4).
pub struct Journal {
    store: Arc<dyn RecordStore>,
    dir: String,
    /// Recorded episodes not yet taken up, by task seed.
    waiting: Mutex<HashMap<u64, Vec<Adoptable>>>,
    /// When waiting records are dropped (AJ-4).
    deadline: Instant,
}

impl Journal {
    /// The journal of `gateway`, bound to `bind`: records of an earlier process on the same
    /// address are taken up (`adopt`, pull agents) or dropped (AJ-3, AJ-4).
    pub fn open(
        store: Arc<dyn RecordStore>,
        bind: &str,
        gateway: &Gateway,
        adopt: bool,
        timeout: Duration,
    ) -> Result<Journal, EnvError> {
        let fixed = bind.rsplit_once(':').is_some_and(|(_, port)| port != "0");
        let scope = match fixed {
            true => bind.replace([':', '[', ']'], "_"),
            false => format!("ephemeral-{}", &key_digest(gateway.base_url())[..16]),
        };
        let journal = Journal {
            store,
            dir: format!("agent-journal/{scope}"),
            waiting: Mutex::default(),
            deadline: Instant::now() + timeout,
        };
        if fixed {
            journal.take_up(gateway, adopt)?;
        }
        Ok(journal)
    }

    fn failed(&self, what: &str, e: String) -> EnvError {
        EnvError::Agent {
            reason: format!("the agent journal ({}) {what}: {e}", self.dir),
        }
    }

    /// Reads the records an earlier process left (AJ-3, AJ-4).
    fn take_up(&self, gateway: &Gateway, adopt: bool) -> Result<(), EnvError> {
        let names = self
            .store
            .list(&self.dir)
            .map_err(|e| self.failed("cannot be listed", e))?;
        let mut waiting = self.lock();
        let mut dropped = 0;
        for name in &names {
            let record = self
                .store
                .get(name)
                .map_err(|e| self.failed("cannot be read", e))
                .and_then(|b| {
                    EpisodeRecord::from_bytes(&b)
                        .map_err(|e| self.failed(&format!("holds a bad record {name}"), e))
                });
            let digest = name.rsplit('/').next().unwrap_or_default();
            match (adopt, record) {
                (true, Ok(record)) => {
                    waiting
                        .entry(record.task_seed)
                        .or_default()
                        .push(Adoptable {
                            mailbox: gateway.reopen(digest),
                            record,
                        })
                }
                (_, record) => {
                    if let Err(e) = record {
                        tracing::warn!("{e}");
                    }
                    self.store
                        .delete(name)
                        .map_err(|e| self.failed("cannot drop a record", e))?;
                    dropped += 1;
                }
            }
        }
        let taken: usize = waiting.values().map(Vec::len).sum();
        if taken + dropped > 0 {
            tracing::warn!(
                "the agent gateway found {} episode(s) recorded by an earlier process: {taken} wait for their agents, {dropped} dropped (AJ-3, AJ-4)",
                taken + dropped
            );
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Adoptable>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A recorded episode of `task_seed` to continue, if one waits (AJ-3); records past their
    /// deadline are dropped first (AJ-4).
    pub fn adopt(&self, task_seed: u64) -> Option<Adoptable> {
        let mut waiting = self.lock();
        if Instant::now() >= self.deadline && !waiting.is_empty() {
            let late: Vec<Adoptable> = waiting.drain().flat_map(|(_, v)| v).collect();
            drop(waiting);
            tracing::warn!(
                "{} recorded agent episode(s) were not taken up within env.agent.timeout_s: dropped (AJ-4)",
                late.len()
            );
            for a in late {
                let _ = self.store.delete(&self.name(&a.mailbox.digest));
            }
            return None;
        }
        let list = waiting.get_mut(&task_seed)?;
        let adopted = list.pop();
        if list.is_empty() {
            waiting.remove(&task_seed);
        }
        adopted
    }

    fn name(&self, digest: &str) -> String {
        format!("{}/{digest}", self.dir)
    }

    /// Puts the record of the episode whose key has `digest` (AJ-1).
    pub fn put(&self, digest: &str, record: &EpisodeRecord) -> Result<(), EnvError> {
        let bytes = record
            .to_bytes()
            .map_err(|e| self.failed("cannot encode a record", e))?;
        self.store
            .put(&self.name(digest), bytes)
            .map_err(|e| self.failed("cannot be written", e))
    }

    /// Deletes the record of an ended episode (AJ-2).
    pub fn forget(&self, digest: &str) {
        if let Err(e) = self.store.delete(&self.name(digest)) {
            tracing::warn!("{}", self.failed("cannot delete a record", e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gateway::CallLimits;
    use crate::agent::Sampling;
    use std::collections::BTreeMap;

    /// The store as a map, for the journal's own rules.
    #[derive(Default)]
    struct Memory(Mutex<BTreeMap<String, Vec<u8>>>);

    impl RecordStore for Memory {
        fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), String> {
            self.0.lock().unwrap().insert(name.into(), bytes);
            Ok(())
        }
        fn get(&self, name: &str) -> Result<Vec<u8>, String> {
            self.0
                .lock()
                .unwrap()
                .get(name)
                .cloned()
                .ok_or("absent".into())
        }
        fn list(&self, dir: &str) -> Result<Vec<String>, String> {
            let map = self.0.lock().unwrap();
            Ok(map.keys().filter(|k| k.starts_with(dir)).cloned().collect())
        }
        fn delete(&self, name: &str) -> Result<(), String> {
            self.0.lock().unwrap().remove(name);
            Ok(())
        }
    }

    fn gateway() -> Gateway {
        let limits = CallLimits {
            max_request_bytes: 4096,
            sampling: Sampling::default(),
            pool_key: None,
        };
        Gateway::start("127.0.0.1:0", limits).expect("gateway")
    }

    fn record(task_seed: u64) -> EpisodeRecord {
        EpisodeRecord {
            task_seed,
            said: vec![SaidRecord::Answered(Answer::from_text("7", false))],
            by_key: HashMap::from([(
                "k-1".into(),
                Served {
                    call: 0,
                    answer: Answer::from_text("7", false),
                },
            )]),
            calls: 1,
            reward: None,
            last_text: "7".into(),
            preamble: Vec::new(),
            tools: Vec::new(),
            text: None,
            tokens: vec![1, 2, 3, 250],
        }
    }

    const BIND: &str = "127.0.0.1:8600";
    const LONG: Duration = Duration::from_secs(600);

    /// AJ-1..3: a record put by one process is taken up by the next on the same bind, tokens
    /// and answers intact, under its key's digest (live again); a task takes each record once.
    #[test]
    fn aj3_a_record_is_taken_up_by_the_next_process_on_the_bind() {
        let store = Arc::new(Memory::default());
        let (first, key) = (gateway(), "keel-secret");
        let journal = Journal::open(store.clone(), BIND, &first, true, LONG).expect("open");
        journal.put(&key_digest(key), &record(5)).expect("put");
        assert!(!store.0.lock().unwrap().keys().any(|k| k.contains(key)));
        let next = gateway();
        let journal = Journal::open(store.clone(), BIND, &next, true, LONG).expect("reopen");
        assert!(
            journal.adopt(4).is_none(),
            "another task's reset takes nothing"
        );
        let taken = journal.adopt(5).expect("taken up");
        assert_eq!(taken.mailbox.digest, key_digest(key));
        assert_eq!(taken.record.tokens, vec![1, 2, 3, 250]);
        assert_eq!(
            taken.record.by_key["k-1"].answer.content.as_deref(),
            Some("7")
        );
        assert!(journal.adopt(5).is_none(), "each record is taken once");
        journal.forget(&taken.mailbox.digest);
        assert!(
            store.0.lock().unwrap().is_empty(),
            "AJ-2: an ended episode's record goes"
        );
    }

    /// AJ-4: spawned agents' records, records past the deadline and records that do not
    /// decode are dropped; a gateway on port 0 reads no earlier process's records.
    #[test]
    fn aj4_records_nobody_can_take_up_are_dropped() {
        let store = Arc::new(Memory::default());
        let gw = gateway();
        let journal = Journal::open(store.clone(), BIND, &gw, true, LONG).expect("open");
        journal.put("a", &record(1)).expect("put");
        journal.put("b", &record(2)).expect("put");
        store
            .put("agent-journal/127.0.0.1_8600/c", b"\x05\x00".to_vec())
            .expect("put");
        let ephemeral = Journal::open(store.clone(), "127.0.0.1:0", &gw, true, LONG);
        assert!(ephemeral.expect("open").adopt(1).is_none());
        assert_eq!(
            store.0.lock().unwrap().len(),
            3,
            "port 0 leaves others' records alone"
        );
        let spawn = Journal::open(store.clone(), BIND, &gw, false, LONG).expect("open");
        assert!(spawn.adopt(1).is_none());
        assert!(
            store.0.lock().unwrap().is_empty(),
            "spawned agents' records are dropped"
        );
        journal.put("a", &record(1)).expect("put");
        let late = Journal::open(store.clone(), BIND, &gw, true, Duration::ZERO).expect("open");
        assert!(late.adopt(1).is_none(), "past the deadline");
        assert!(
            store.0.lock().unwrap().is_empty(),
            "late records are dropped"
        );
    }

    /// A store that refuses every write.
    struct Full;

    impl RecordStore for Full {
        fn put(&self, _: &str, _: Vec<u8>) -> Result<(), String> {
            Err("disk full".into())
        }
        fn get(&self, _: &str) -> Result<Vec<u8>, String> {
            Err("absent".into())
        }
        fn list(&self, _: &str) -> Result<Vec<String>, String> {
            Ok(Vec::new())
        }
        fn delete(&self, _: &str) -> Result<(), String> {
            Ok(())
        }
    }

    /// AJ-1: a call whose record cannot be written is answered 503, never with the unrecorded
    /// answer, and its episode fails with the store's reason.
    #[test]
    fn aj1_an_answer_that_cannot_be_recorded_is_a_503_and_fails_the_episode() {
        use crate::agent::{AgentConfig, AgentEnv};
        use crate::dataset::{Dataset, DatasetConfig};
        use crate::env::{Env, SampledTurn};
        let rows = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/gsm8k_tool_rows.parquet");
        let data = Dataset::load(&DatasetConfig {
            train_file: rows.clone(),
            eval_file: rows,
            ..DatasetConfig::default()
        })
        .expect("rows");
        let pool = "pool-secret-0123456789";
        let limits = CallLimits {
            max_request_bytes: 1 << 20,
            sampling: Sampling::default(),
            pool_key: Some(pool.into()),
        };
        let gw = Gateway::start("127.0.0.1:0", limits).expect("gateway");
        let base = gw.base_url().to_string();
        let journal = Journal::open(Arc::new(Full), BIND, &gw, true, LONG).expect("journal");
        let cfg = AgentConfig {
            launch: "pull".into(),
            ..AgentConfig::default()
        };
        let mut env = AgentEnv::new(
            Arc::new(cfg),
            Arc::new(gw),
            Some(Arc::new(journal)),
            Arc::new(data),
            None,
        );
        let agent = std::thread::spawn(move || {
            let http: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into();
            let mut offer = http
                .post(&format!("{base}/keel/episodes/next"))
                .header("Authorization", &format!("Bearer {pool}"))
                .send_json(serde_json::json!({"wait_s": 30}))
                .expect("pull");
            let offer: serde_json::Value = offer.body_mut().read_json().expect("offer");
            let key = offer["key"].as_str().expect("key").to_string();
            let mut reply = http
                .post(&format!("{base}/chat/completions"))
                .header("Authorization", &format!("Bearer {key}"))
                .send_json(serde_json::json!({"messages": [{"role": "user", "content": "hi"}]}))
                .expect("call");
            let status = reply.status().as_u16();
            (
                status,
                reply.body_mut().read_to_string().unwrap_or_default(),
            )
        });
        let seed = crate::split::task_seed(crate::split::Split::Train, 0);
        assert_eq!(env.try_reset(seed).expect("the first call"), "hi");
        let turn = SampledTurn {
            text: "4".into(),
            record: vec![1, 2, 3],
            ..SampledTurn::default()
        };
        let err = env.try_step_turn(&turn).expect_err("an unrecorded answer");
        assert!(err.to_string().contains("disk full"), "{err}");
        let (status, body) = agent.join().expect("agent");
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("disk full"), "{body}");
    }
}
