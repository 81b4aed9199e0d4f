//! Store benchmark: every number is a ratio against a baseline measured in the same run, on the
//! same bytes and the same disk.
//!
//! `cargo bench -p keel-store --bench store_bench` (BENCHMARKS.md). `KEEL_BENCH_MB` sets the
//! checkpoint size (default 256 MiB); with `KEEL_TEST_S3_ENDPOINT` set (scripts/seaweedfs.sh) the
//! commit is also measured on S3 against a plain put of the same bytes.
//!
//! 1. Checkpoint commit (blobs + crc32 + manifest + head, fsync on) vs `std::fs::write` + fsync
//!    of the same bytes in the same directory.
//! 2. Resume (`resume_point`: head, manifest, read + crc32 every blob) vs `std::fs::read` of the
//!    same files.
//! 3. Rollout batch encode (validate + rkyv + zstd + frame) vs memcpy of the archive bytes,
//!    serde_json and bincode of the same data; decode (frame check + zstd + bytecheck + a pass
//!    over every token) vs the same baselines.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_store::frame::{decode_batch, encode_batch};
use keel_store::{DataPosition, NewCheckpoint, RolloutBatch, RunStore, Source, Trajectory, Turn};

/// Runs `f` `reps` times and returns the best wall time (least disturbed by the machine).
fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed());
    }
    best
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / (1 << 20) as f64
}

fn blobs(total: usize) -> Vec<(String, Bytes)> {
    // Weights-like data: pseudo-random f32 bit patterns (incompressible, like real weights).
    let n = 4;
    (0..n)
        .map(|i| {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
            let v: Vec<u8> = (0..total / n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            (format!("blob-{i}.bin"), Bytes::from(v))
        })
        .collect()
}

fn new_ckpt(step: u64, files: Vec<(String, Bytes)>) -> NewCheckpoint {
    NewCheckpoint {
        parent: None,
        step,
        policy_version: step,
        config_hash: "bench".into(),
        reference: None,
        tags: vec![],
        data: DataPosition::default(),
        metrics: BTreeMap::new(),
        files,
    }
}

fn raw_write(dir: &std::path::Path, files: &[(String, Bytes)], round: usize) {
    let sub = dir.join(format!("raw-{round}"));
    std::fs::create_dir_all(&sub).expect("mkdir");
    for (name, bytes) in files {
        let mut f = std::fs::File::create(sub.join(name)).expect("create");
        f.write_all(bytes).expect("write");
        f.sync_all().expect("fsync");
    }
    std::fs::File::open(&sub)
        .and_then(|d| d.sync_all())
        .expect("fsync dir");
}

fn checkpoint_bench(rt: &tokio::runtime::Runtime, total: usize) {
    let dir = tempfile::tempdir_in(std::env::var("KEEL_BENCH_DIR").unwrap_or_else(|_| ".".into()))
        .expect("tempdir");
    let files = blobs(total);
    let store = RunStore::open(dir.path().join("run").to_str().expect("utf8")).expect("open");
    let reps = 3;
    let mut round = 0;
    let raw = best(reps, || {
        round += 1;
        raw_write(dir.path(), &files, round)
    });
    let mut step = 0;
    let commit = best(reps, || {
        step += 1;
        rt.block_on(store.commit_checkpoint(new_ckpt(step, files.clone())))
            .expect("commit")
    });
    println!(
        "checkpoint commit, local disk, {} MiB: {:.0} MiB/s vs raw write+fsync {:.0} MiB/s  ratio {:.2}",
        total >> 20,
        mbps(total, commit),
        mbps(total, raw),
        raw.as_secs_f64() / commit.as_secs_f64()
    );
    let raw_dir = dir.path().join("raw-1");
    let raw_read = best(reps, || {
        files
            .iter()
            .map(|(n, _)| std::fs::read(raw_dir.join(n)).expect("read").len())
            .sum::<usize>()
    });
    let resume = best(reps, || {
        rt.block_on(store.resume_point())
            .expect("resume")
            .expect("some")
    });
    println!(
        "resume (read + verify), local disk, {} MiB: {:.3} s vs raw read {:.3} s  ratio {:.2} (page cache warm for both)",
        total >> 20,
        resume.as_secs_f64(),
        raw_read.as_secs_f64(),
        raw_read.as_secs_f64() / resume.as_secs_f64()
    );
    if std::env::var("KEEL_TEST_S3_ENDPOINT").is_ok() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let root = format!("s3://keel-test/bench-{nanos}");
        let s3 = RunStore::open(&root).expect("open s3");
        let mut round = 0;
        let raw = best(reps, || {
            round += 1;
            rt.block_on(async {
                for (name, bytes) in &files {
                    s3.put_object(&format!("raw/{round}/{name}"), bytes.clone())
                        .await
                        .expect("put");
                }
            })
        });
        let commit = best(reps, || {
            step += 1;
            rt.block_on(s3.commit_checkpoint(new_ckpt(step, files.clone())))
                .expect("commit")
        });
        println!(
            "checkpoint commit, S3 (SeaweedFS, loopback), {} MiB: {:.0} MiB/s vs plain puts {:.0} MiB/s  ratio {:.2}",
            total >> 20,
            mbps(total, commit),
            mbps(total, raw),
            raw.as_secs_f64() / commit.as_secs_f64()
        );
    }
}

/// A serde mirror of the batch for the JSON and bincode baselines.
#[derive(serde::Serialize, serde::Deserialize)]
struct SerdeBatch {
    run_id: String,
    batch_seq: u64,
    generator_id: u32,
    policy_version: u64,
    created_unix_ms: u64,
    trajectories: Vec<SerdeTrajectory>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SerdeTrajectory {
    trajectory_id: u64,
    group_id: u64,
    task_id: u64,
    env_name: String,
    agent_id: u32,
    tokens: Vec<u32>,
    loss_mask: Vec<u8>,
    behaviour_logprobs: Vec<f32>,
    turns: Vec<(u32, u32, u64, f32, bool)>,
    final_reward: f32,
    anchor: bool,
}

fn tokens_hash(i: u64, t: usize) -> u64 {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ t as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 17
}

fn sample_batch(n_traj: u64, len: u32) -> RolloutBatch {
    let trajectories = (0..n_traj)
        .map(|i| {
            // Token ids as entropic as sampled text (a xorshift stream over a 32k vocabulary).
            let mut x = 0x2545_f491_4f6c_dd1du64 ^ (i + 1);
            let tokens: Vec<u32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 32_000) as u32
                })
                .collect();
            let turns: Vec<Turn> = (0..len / 64)
                .map(|k| Turn {
                    start: k * 64 + 16,
                    end: k * 64 + 48,
                    policy_version: 9,
                    weights_digest: 0,
                    reward: 0.0,
                    invalid_action: false,
                    agent_id: 0,
                    anchor_key: k as u64,
                    anchor_state: String::new(),
                    version_changes: Vec::new(),
                })
                .collect();
            let mut loss_mask = vec![0u8; len as usize];
            for t in &turns {
                for m in &mut loss_mask[t.start as usize..t.end as usize] {
                    *m = 1;
                }
            }
            let behaviour_logprobs = loss_mask
                .iter()
                .enumerate()
                .map(|(t, &m)| {
                    if m == 1 {
                        -((tokens_hash(i, t) % 1000) as f32) / 97.0 - 1e-3
                    } else {
                        0.0
                    }
                })
                .collect();
            Trajectory {
                trajectory_id: i,
                episode_id: i,
                group_id: i / 8,
                task_id: 1000 + i / 8,
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
        batch_seq: 1,
        generator_id: 0,
        policy_version: 9,
        created_unix_ms: 0,
        trajectories,
    }
}

fn to_serde(b: &RolloutBatch) -> SerdeBatch {
    SerdeBatch {
        run_id: b.run_id.clone(),
        batch_seq: b.batch_seq,
        generator_id: b.generator_id,
        policy_version: b.policy_version,
        created_unix_ms: b.created_unix_ms,
        trajectories: b
            .trajectories
            .iter()
            .map(|t| SerdeTrajectory {
                trajectory_id: t.trajectory_id,
                group_id: t.group_id,
                task_id: t.task_id,
                env_name: t.env_name.clone(),
                agent_id: t.agent_id,
                tokens: t.tokens.clone(),
                loss_mask: t.loss_mask.clone(),
                behaviour_logprobs: t.behaviour_logprobs.clone(),
                turns: t
                    .turns
                    .iter()
                    .map(|u| (u.start, u.end, u.policy_version, u.reward, u.invalid_action))
                    .collect(),
                final_reward: t.final_reward,
                anchor: t.source == Source::Anchor,
            })
            .collect(),
    }
}

fn batch_bench() {
    let batch = sample_batch(256, 1024);
    let archive = rkyv::to_bytes::<rkyv::rancor::Error>(&batch).expect("archive");
    let n = archive.len();
    let sb = to_serde(&batch);
    let reps = 7;
    let memcpy = best(reps, || archive.to_vec());
    let enc = best(reps, || encode_batch(&batch, 3).expect("encode"));
    let json_enc = best(reps, || serde_json::to_vec(&sb).expect("json"));
    let bin_enc = best(reps, || bincode::serialize(&sb).expect("bincode"));
    let binz_enc = best(reps, || {
        zstd::bulk::compress(&bincode::serialize(&sb).expect("bincode"), 3).expect("zstd")
    });
    let framed = encode_batch(&batch, 3).expect("encode");
    let json = serde_json::to_vec(&sb).expect("json");
    let bin = bincode::serialize(&sb).expect("bincode");
    let binz = zstd::bulk::compress(&bin, 3).expect("zstd");
    println!(
        "rollout batch: {} trajectories x {} tokens, archive {:.1} MiB, stored {:.1} MiB (zstd 3), json {:.1} MiB, bincode {:.1} MiB",
        batch.trajectories.len(),
        batch.trajectories[0].tokens.len(),
        n as f64 / (1 << 20) as f64,
        framed.len() as f64 / (1 << 20) as f64,
        json.len() as f64 / (1 << 20) as f64,
        bin.len() as f64 / (1 << 20) as f64
    );
    println!(
        "encode (validate+rkyv+zstd+frame) {:.0} MiB/s | memcpy {:.0} MiB/s (ratio {:.3}) | serde_json {:.0} MiB/s (keel {:.1}x) | bincode {:.0} MiB/s (keel {:.2}x)",
        mbps(n, enc),
        mbps(n, memcpy),
        memcpy.as_secs_f64() / enc.as_secs_f64(),
        mbps(n, json_enc),
        json_enc.as_secs_f64() / enc.as_secs_f64(),
        mbps(n, bin_enc),
        bin_enc.as_secs_f64() / enc.as_secs_f64()
    );
    println!(
        "encode vs bincode+zstd 3 (same compression, no validation) {:.0} MiB/s (keel {:.2}x)",
        mbps(n, binz_enc),
        binz_enc.as_secs_f64() / enc.as_secs_f64()
    );
    let sum_archived = |buf: &keel_store::BatchBuf| -> u64 {
        buf.archived()
            .trajectories
            .iter()
            .flat_map(|t| t.tokens.iter())
            .map(|x| u64::from(x.to_native()))
            .sum()
    };
    let dec = best(reps, || {
        let buf = decode_batch(&framed).expect("decode");
        sum_archived(&buf)
    });
    let memcpy_read = best(reps, || {
        let v = archive.to_vec();
        v.iter().map(|&b| u64::from(b)).sum::<u64>()
    });
    let json_dec = best(reps, || {
        let b: SerdeBatch = serde_json::from_slice(&json).expect("json");
        b.trajectories
            .iter()
            .flat_map(|t| t.tokens.iter())
            .map(|&x| u64::from(x))
            .sum::<u64>()
    });
    let bin_dec = best(reps, || {
        let b: SerdeBatch = bincode::deserialize(&bin).expect("bincode");
        b.trajectories
            .iter()
            .flat_map(|t| t.tokens.iter())
            .map(|&x| u64::from(x))
            .sum::<u64>()
    });
    let binz_dec = best(reps, || {
        let raw = zstd::bulk::decompress(&binz, 1 << 30).expect("zstd");
        let b: SerdeBatch = bincode::deserialize(&raw).expect("bincode");
        b.trajectories
            .iter()
            .flat_map(|t| t.tokens.iter())
            .map(|&x| u64::from(x))
            .sum::<u64>()
    });
    println!(
        "decode vs zstd+bincode (same compression, no checksum) {:.0} MiB/s (keel {:.2}x)",
        mbps(n, binz_dec),
        binz_dec.as_secs_f64() / dec.as_secs_f64()
    );
    println!(
        "decode (frame+crc+zstd+bytecheck+pass over tokens) {:.0} MiB/s | memcpy+pass {:.0} MiB/s (ratio {:.3}) | serde_json {:.0} MiB/s (keel {:.1}x) | bincode {:.0} MiB/s (keel {:.2}x)",
        mbps(n, dec),
        mbps(n, memcpy_read),
        memcpy_read.as_secs_f64() / dec.as_secs_f64(),
        mbps(n, json_dec),
        json_dec.as_secs_f64() / dec.as_secs_f64(),
        mbps(n, bin_dec),
        bin_dec.as_secs_f64() / dec.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let mb: usize = std::env::var("KEEL_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("keel store benchmark (ratios against baselines measured in this run)");
    checkpoint_bench(&rt, mb << 20);
    batch_bench();
}
