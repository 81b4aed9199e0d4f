//! The fuzz targets: every parser that reads bytes from the store or the network, called the way
//! keel calls it, followed by what keel then does with a value that parsed.
//!
//! Each target returns an outcome signature (`ok`, or its error with the digits blanked out): a
//! new signature keeps the input in the corpus, a cheap stand-in for coverage feedback.

use keel_actors::frontier::{plan_resume, FoundBatch, Frontier, TaskCursor};
use keel_envs::scaffold::{Bank, Mode, ReviewRequest, ScaffoldConfig};
use keel_store::{RolloutBatch, Source, Trajectory, Turn};

use super::mutate::split_header;

/// One fuzz target.
pub struct Target {
    /// Its name (and the folder of its seed corpus).
    pub name: &'static str,
    /// What it parses.
    pub what: &'static str,
    /// Parses one input; returns its outcome signature.
    pub run: fn(&[u8]) -> String,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "batch_frame",
        what: "a stored rollout-batch object (frame, zstd, rkyv validation), then the learner's tensors",
        run: batch_frame,
    },
    Target {
        name: "batch_archive",
        what: "the rkyv archive inside a well-formed frame, then the learner's tensors",
        run: batch_archive,
    },
    Target {
        name: "manifest",
        what: "a checkpoint MANIFEST.json (header line: the id read), then resume planning on its frontier",
        run: manifest,
    },
    Target {
        name: "head_and_tag",
        what: "branch head objects (H), head file names (G) and tag keys (T)",
        run: head_and_tag,
    },
    Target {
        name: "weights_delta",
        what: "a published weights delta, decoded against its base",
        run: weights_delta,
    },
    Target {
        name: "env_answer",
        what: "external env protocol answers (header line: info, reset, step, snapshot, restore)",
        run: env_answer,
    },
    Target {
        name: "reviewer_answer",
        what: "a PATS reviewer service's answer, then Bank::apply on its edits",
        run: reviewer_answer,
    },
];

/// The outcome signature of an error message: the start of its cause (after what names the
/// object), up to the first number or quoted value: those vary with the input, not with the
/// code path.
fn signature(message: &str) -> String {
    let cause = match message.rsplit_once(" is corrupt: ") {
        Some((_, cause)) => cause,
        None => message.split_once(": ").map_or(message, |(_, cause)| cause),
    };
    cause
        .chars()
        .take_while(|c| !c.is_ascii_digit() && !matches!(c, '"' | '`' | '\''))
        .take(48)
        .collect()
}

fn outcome<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => signature(&e.to_string()),
    }
}

/// A decoded batch goes where the learner takes it: padded tensors on the CPU.
fn train_batch(bytes: &[u8]) -> String {
    match keel_store::frame::decode_batch(bytes) {
        Ok(buf) => outcome(keel_learner::TrainBatch::from_archived(
            buf.archived(),
            tch::Device::Cpu,
        )),
        Err(e) => signature(&e.to_string()),
    }
}

fn batch_frame(bytes: &[u8]) -> String {
    train_batch(bytes)
}

fn batch_archive(bytes: &[u8]) -> String {
    match keel_store::frame::frame_archive(bytes, 1) {
        Ok(frame) => train_batch(&frame),
        Err(e) => signature(&e.to_string()),
    }
}

fn manifest(bytes: &[u8]) -> String {
    let (header, body) = split_header(bytes);
    let id = String::from_utf8_lossy(header).trim().to_string();
    let m = match keel_store::checkpoint::parse_manifest(&id, body) {
        Ok(m) => m,
        Err(e) => return signature(&e.to_string()),
    };
    // What a resume does with the manifest: its frontier, its resume index, a plan (DF-2..4).
    let data = &m.data;
    let saved = Frontier {
        next_task: data.next_task_index,
        pending: data.pending_tasks.clone(),
        next_batch_seq: data.next_batch_seq,
    };
    let first = data.first_reusable_batch();
    let found: Vec<FoundBatch> = (0..4u64)
        .filter_map(|i| first.checked_add(i))
        .filter(|&seq| data.may_reuse_batch(seq))
        .zip(
            data.pending_tasks
                .iter()
                .chain(&[data.next_task_index])
                .cycle(),
        )
        .map(|(seq, &first_task)| FoundBatch {
            key: format!("batches/{seq:010}.krb"),
            batch_seq: seq,
            first_task,
            oldest_version: m.policy_version,
            newest_version: m.policy_version,
        })
        .collect();
    let plan = plan_resume(&saved, m.policy_version, 2, 6, found);
    let mut cursor = TaskCursor::new(&plan.frontier, 6);
    for _ in 0..3 {
        cursor.take();
    }
    cursor.frontier([], plan.frontier.next_batch_seq);
    outcome(serde_json::to_vec(&m))
}

fn head_and_tag(bytes: &[u8]) -> String {
    let (kind, rest) = match bytes.split_first() {
        Some((k, rest)) => (*k, rest.strip_prefix(b"\n").unwrap_or(rest)),
        None => return "empty".into(),
    };
    match kind {
        b'H' => outcome(keel_store::branch::parse_head(
            "branches/main/HEAD.0000000001",
            rest,
        )),
        b'G' => {
            let name = String::from_utf8_lossy(rest);
            format!(
                "{:?}",
                keel_store::branch::parse_generation(&name).is_some()
            )
        }
        _ => {
            let rel = String::from_utf8_lossy(rest);
            format!("{:?}", keel_store::lineage::parse_tag_key(&rel).is_some())
        }
    }
}

/// The base of the `weights_delta` target's deltas: 4 KiB of a fixed pattern.
pub fn delta_base() -> Vec<u8> {
    (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn weights_delta(bytes: &[u8]) -> String {
    outcome(keel_store::weights::decode_delta(bytes, &delta_base()))
}

fn env_answer(bytes: &[u8]) -> String {
    let (header, body) = split_header(bytes);
    let path = String::from_utf8_lossy(header).trim().to_string();
    match std::str::from_utf8(body) {
        // The client reads the answer as text (a non-UTF-8 body fails there).
        Ok(text) => match keel_envs::external::decode_answer(&path, text) {
            Ok(()) => "ok".into(),
            // The path is the input's header: what follows it is the code path's message.
            Err(e) => signature(
                e.strip_prefix(&format!("{path}: "))
                    .unwrap_or("no such answer"),
            ),
        },
        Err(_) => "not UTF-8".into(),
    }
}

/// The review request of the `reviewer_answer` target: an EXPAND review of `pick` tasks.
fn review_request(bank: &Bank) -> ReviewRequest {
    let mode = Mode::Expand;
    ReviewRequest {
        step: 3,
        mode,
        task_type: "pick".into(),
        ema: 0.1,
        pressure: 0.0,
        budget: mode.budget(),
        cards: vec![],
        bank: bank.clone(),
        config: ScaffoldConfig::default(),
    }
}

fn reviewer_answer(bytes: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return "not UTF-8".into();
    };
    let edits = match keel_envs::scaffold::parse_review_answer(text) {
        Ok(edits) => edits,
        Err(e) => return signature(&e),
    };
    thread_local! {
        static VOCAB: keel_envs::Tokenizer = keel_envs::make_env("household", 2)
            .map(|env| keel_envs::Tokenizer::for_env(env.as_ref()))
            .unwrap_or_else(|_| keel_envs::Tokenizer::calc());
    }
    VOCAB.with(|vocab| {
        let mut bank = Bank::new();
        // Twice: the second review sees what the first added (updates and deletes by id).
        let first = bank.apply(&review_request(&bank), &edits, vocab);
        let second = bank.apply(&review_request(&bank), &edits, vocab);
        format!(
            "applied {} {} rejected {} {}",
            first.applied.len().min(3),
            second.applied.len().min(3),
            first.rejected.len().min(3),
            second.rejected.len().min(3)
        )
    })
}

/// Small batches for the seed corpus: two trajectories with prompts, observations and turns, one
/// of a single turn, an anchor trajectory, an RTPO branch with its trained turn.
pub fn seed_batches() -> Vec<RolloutBatch> {
    let traj = |id: u64, turns: &[(u32, u32)], len: u32, source: Source| {
        let tokens: Vec<u32> = (0..len).map(|t| 100 + (t * 7 + id as u32) % 50).collect();
        let loss_mask: Vec<u8> = (0..len)
            .map(|t| u8::from(turns.iter().any(|&(s, e)| (s..e).contains(&t))))
            .collect();
        let behaviour_logprobs = loss_mask
            .iter()
            .enumerate()
            .map(|(t, &m)| if m == 1 { -0.25 - t as f32 / 64.0 } else { 0.0 })
            .collect();
        Trajectory {
            trajectory_id: id,
            episode_id: id,
            group_id: id / 2,
            task_id: 12 + id / 2,
            env_name: "calc".into(),
            agent_id: 0,
            tokens,
            loss_mask,
            behaviour_logprobs,
            turns: turns
                .iter()
                .enumerate()
                .map(|(k, &(start, end))| Turn {
                    start,
                    end,
                    policy_version: 3,
                    weights_digest: 0,
                    reward: 0.0,
                    invalid_action: k == 1,
                    agent_id: (k % 2) as u32,
                    anchor_key: 77 + k as u64,
                    anchor_state: String::new(),
                    version_changes: Vec::new(),
                })
                .collect(),
            final_reward: (id % 2) as f32,
            source,
            scaffold_version: 0,
            trained_turn: None,
        }
    };
    let batch = |seq: u64, trajectories: Vec<Trajectory>| RolloutBatch {
        run_id: "fuzz".into(),
        batch_seq: seq,
        generator_id: 1,
        policy_version: 3,
        created_unix_ms: 1_764_000_000_000,
        trajectories,
    };
    let mut branch = traj(5, &[(4, 8), (11, 14)], 16, Source::OnPolicy);
    branch.trained_turn = Some(1);
    vec![
        batch(
            7,
            vec![
                traj(0, &[(4, 8), (11, 14)], 16, Source::OnPolicy),
                traj(1, &[(3, 9)], 12, Source::OnPolicy),
            ],
        ),
        batch(8, vec![traj(2, &[(2, 3)], 4, Source::Anchor)]),
        batch(9, vec![branch]),
    ]
}
