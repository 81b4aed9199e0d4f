//! `keel-bench-resume`: a resume must cost what is in flight, not what the run has produced.
//!
//! A run root holding N rollout batches (default 10,000; 16 trajectories of 512 tokens each,
//! as entropic as sampled text) and a checkpoint taken at batch N − 2 with two batches in flight.
//! Measured in one run, best of 3:
//! 1. the resume's batch scan (`stored_batches::scan`) through the checkpoint's resume index
//!    (DF-4): lists the branch from the first pending seq, reads the pending and newer batches;
//! 2. the baseline: the same scan without an index, reading and validating every stored batch
//!    (what every resume did before the index, and still does from a checkpoint without one);
//! 3. `keel ckpt gc`'s batch collection (GC-7) on that root, and the indexed scan after it.
//!
//! ```text
//! cargo run -p keel-integration --bin keel-bench-resume -- [--batches 10000] [--s3]
//! (--s3: on the SeaweedFS server of `. scripts/seaweedfs.sh` instead of local disk)
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use keel_actors::stored_batches::{scan, Scan};
use keel_store::{DataPosition, RolloutBatch, RunStore, Source, Trajectory, Turn};

const TRAJECTORIES: u64 = 16;
const TOKENS: u32 = 512;

/// A batch of `TRAJECTORIES` two-turn trajectories for task range `seq * TRAJECTORIES`.
fn batch(seq: u64) -> RolloutBatch {
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ (seq + 1);
    let trajectories = (0..TRAJECTORIES)
        .map(|i| {
            let tokens: Vec<u32> = (0..TOKENS)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 32_000) as u32
                })
                .collect();
            let turns = vec![
                turn(64, 256, seq.saturating_sub(1)),
                turn(300, 480, seq.saturating_sub(1)),
            ];
            let loss_mask = (0..TOKENS)
                .map(|t| u8::from(turns.iter().any(|u| (u.start..u.end).contains(&t))))
                .collect::<Vec<u8>>();
            let behaviour_logprobs = loss_mask
                .iter()
                .zip(&tokens)
                .map(|(&m, &tok)| {
                    if m == 1 {
                        -((tok % 997) as f32) / 97.0
                    } else {
                        0.0
                    }
                })
                .collect();
            Trajectory {
                trajectory_id: seq * TRAJECTORIES + i,
                episode_id: seq * TRAJECTORIES + i,
                group_id: i / 4,
                task_id: seq * TRAJECTORIES + i / 4,
                env_name: "calc".into(),
                agent_id: 0,
                tokens,
                loss_mask,
                behaviour_logprobs,
                turns,
                final_reward: (i % 2) as f32,
                source: Source::OnPolicy,
                scaffold_version: 0,
                trained_turn: None,
            }
        })
        .collect();
    RolloutBatch {
        run_id: "bench".into(),
        batch_seq: seq,
        generator_id: 0,
        policy_version: seq.saturating_sub(1),
        created_unix_ms: 0,
        trajectories,
    }
}

fn turn(start: u32, end: u32, policy_version: u64) -> Turn {
    Turn {
        start,
        end,
        policy_version,
        weights_digest: 0,
        reward: 0.0,
        invalid_action: false,
        agent_id: 0,
        anchor_key: 0,
        anchor_state: String::new(),
        version_changes: Vec::new(),
    }
}

/// The fastest of three scans, and what the last one saw.
async fn best_scan(store: &RunStore, data: &DataPosition) -> Result<(Duration, Scan)> {
    let mut best = Duration::MAX;
    let mut last = Scan::default();
    for _ in 0..3 {
        let t = Instant::now();
        last = scan(store, data).await?;
        best = best.min(t.elapsed());
    }
    Ok((best, last))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = match args.iter().position(|a| a == "--batches") {
        Some(i) => args.get(i + 1).context("--batches N")?.parse()?,
        None => 10_000,
    };
    let s3 = args.iter().any(|a| a == "--s3");
    let dir = tempfile::tempdir()?;
    let root = if s3 {
        keel_integration::s3_root("bench-resume")
    } else {
        dir.path().to_str().context("utf-8 tempdir")?.to_string()
    };
    let store = RunStore::open(&root)?;
    let t = Instant::now();
    for seq in 0..n {
        store.put_batch(&batch(seq)).await?;
    }
    println!(
        "{n} batches of {TRAJECTORIES}×{TOKENS} tokens on {} (written in {:.1} s)",
        if s3 { "SeaweedFS S3" } else { "local disk" },
        t.elapsed().as_secs_f64()
    );

    let head = DataPosition {
        next_task_index: n * TRAJECTORIES,
        next_batch_seq: n - 2,
        pending_tasks: vec![(n - 4) * TRAJECTORIES, (n - 3) * TRAJECTORIES],
        pending_batch_seqs: Some(vec![n - 4, n - 3]),
        ..DataPosition::default()
    };
    let no_index = DataPosition {
        pending_batch_seqs: None,
        ..head.clone()
    };
    let (indexed, seen) = best_scan(&store, &head).await?;
    println!(
        "resume scan with the index (DF-4): {:.4} s, listed {}, read {}",
        indexed.as_secs_f64(),
        seen.listed,
        seen.read
    );
    let (every, seen) = best_scan(&store, &no_index).await?;
    println!(
        "baseline, every batch read:       {:.4} s, listed {}, read {}",
        every.as_secs_f64(),
        seen.listed,
        seen.read
    );
    println!(
        "ratio indexed / baseline: {:.4}× ({:.0}× faster)",
        indexed.as_secs_f64() / every.as_secs_f64(),
        every.as_secs_f64() / indexed.as_secs_f64()
    );

    // GC-7 on the same root: a checkpoint with this data position is kept.
    let ckpt = keel_store::NewCheckpoint {
        parent: None,
        step: n - 2,
        policy_version: n - 2,
        config_hash: "bench".into(),
        reference: None,
        tags: vec![],
        data: head.clone(),
        metrics: Default::default(),
        files: vec![("model.safetensors".into(), bytes::Bytes::from_static(b"w"))],
    };
    store.commit_checkpoint(ckpt).await?;
    let t = Instant::now();
    let plan = store.plan_gc(3, Duration::ZERO).await?;
    store.apply_gc(&plan).await?;
    println!(
        "gc: collected {} batches in {:.1} s; {} left",
        plan.stale_batches.len(),
        t.elapsed().as_secs_f64(),
        store.list_batches().await?.len()
    );
    let (after_gc, seen) = best_scan(&store, &head).await?;
    println!(
        "resume scan after gc: {:.4} s, listed {}, read {}",
        after_gc.as_secs_f64(),
        seen.listed,
        seen.read
    );
    Ok(())
}
