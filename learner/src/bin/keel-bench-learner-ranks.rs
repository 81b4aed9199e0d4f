//! keel-bench-learner-ranks: the data-parallel learner's throughput and memory for 1, 2, 4 …
//! ranks (processes over PyTorch's Gloo group on loopback) on the same model and global batch.
//!
//! ```text
//! keel-bench-learner-ranks [--ranks 1,2,4] [--hidden 512] [--layers 4] [--vocab 16384]
//!   [--batch 16] [--seq 128] [--steps 3] [--threads 1] [--reduce f32|bf16] [--device cpu|cuda]
//!   [--join-alone 0|1]
//! ```
//! For each N, N child processes of this binary build the same random Llama-shaped model (f32,
//! `--threads` torch threads each; on CPU over Gloo, or with `--device cuda` rank R on GPU R over
//! NCCL, CG-4), join one group and run `--steps` GRPO updates on the
//! same global batch (random tokens, groups of 4 with rewards 0/1); each trains its
//! token-balanced share of the rows (DDP-1), gradients are all-reduced in buckets and the
//! sharded AdamW's owners broadcast the stepped weights (DDP-2, OP-7). The first update is a
//! warm-up and is not timed. Each child reports its timed seconds, the seconds spent in
//! collectives, its peak RSS (`VmHWM`) and the bytes of its optimizer shard. The parent prints,
//! per N, learner tokens/s (global loss tokens over the slowest rank's time), the scaling
//! efficiency against N = 1 measured in the same run, the collectives' share of step time and
//! memory per rank. `--reduce bf16` sums the gradients in bf16 (`learner.reduce_dtype`, DDP-6);
//! the gradient MiB each rank all-reduced per step is printed with the rest. Each N's weights are
//! compared with N = 1's after the same updates (‖w_N − w_1‖/‖w_1‖ over all parameters, rank
//! 0's written to a temporary file). `--join-alone 1` makes N = 1 join a one-rank group too (a smoke test of the
//! group on a machine with one GPU; its collectives then count in the baseline).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_learner::batch_tensors::TrainBatch;
use keel_learner::collective::{nccl_device, RankGroup, Rendezvous};
use keel_learner::data_parallel::ReduceDtype;
use keel_learner::hf::{HfModel, LoadOptions};
use keel_learner::{Algo, Learner, LearnerConfig};
use rand::{Rng, SeedableRng};
use tch::{Device, Kind};

mod bench_common;
use bench_common::{flags, llama_config, num, peak_mib, Res};

/// Rank `rank`'s device: the CPU, or with `--device cuda` GPU `rank`.
fn device(f: &HashMap<String, String>, rank: usize) -> Res<Device> {
    match f.get("device").map_or("cpu", String::as_str) {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(rank)),
        other => Err(format!("--device {other}: expected cpu or cuda").into()),
    }
}

/// The model every rank builds (same seed: the same weights on every rank).
fn model(f: &HashMap<String, String>, device: Device) -> Res<HfModel> {
    let cfg = llama_config(f, 4)?;
    Ok(HfModel::random(
        cfg,
        LoadOptions::policy(device, Kind::Float),
        1,
    )?)
}

/// The global batch: random prompts and responses, groups of 4 with rewards 0/1.
fn batch(f: &HashMap<String, String>, device: Device) -> Res<TrainBatch> {
    let (rows, seq, vocab) = (
        num(f, "batch", 16)?,
        num(f, "seq", 128)?,
        num(f, "vocab", 16384)?,
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    let seqs: Vec<(Vec<u32>, Vec<u8>)> = (0..rows)
        .map(|_| {
            // Responses of different lengths, so that the token balance has work to do.
            let len = rng.gen_range(seq / 2..=seq);
            let toks = (0..len).map(|_| rng.gen_range(0..vocab as u32)).collect();
            let mask = (0..len).map(|t| u8::from(t >= len / 4)).collect();
            (toks, mask)
        })
        .collect();
    let mut batch = TrainBatch::from_sequences(&seqs, device)?;
    batch.group_ids = (0..rows as u64).map(|i| i / 4).collect();
    batch.task_ids = batch.group_ids.clone();
    batch.final_rewards = (0..rows).map(|i| (i % 2) as f32).collect();
    Ok(batch)
}

fn child(f: &HashMap<String, String>) -> Res<()> {
    tch::set_num_threads(num(f, "threads", 1)? as i32);
    let (rank, world, port) = (num(f, "rank", 0)?, num(f, "world", 1)?, num(f, "port", 0)?);
    let reduce_dtype = match f.get("reduce").map_or("f32", String::as_str) {
        "f32" => ReduceDtype::F32,
        "bf16" => ReduceDtype::Bf16,
        other => return Err(format!("--reduce {other}: expected f32 or bf16").into()),
    };
    let cfg = LearnerConfig {
        minibatches: 1,
        epochs: 1,
        reduce_dtype,
        ..LearnerConfig::for_preset(keel_learner::Preset::Grpo)
    };
    debug_assert_eq!(cfg.algo, Algo::Grpo);
    let device = device(f, rank)?;
    let mut learner = Learner::new(model(f, device)?, cfg, 1)?;
    let batch = batch(f, device)?;
    if world > 1 || num(f, "join-alone", 0)? == 1 {
        let at = Rendezvous {
            host: "127.0.0.1".into(),
            port: port as u16,
            rank,
            world,
            timeout: Duration::from_secs(300),
            cuda_device: nccl_device(device),
        };
        let group = RankGroup::join(&at, "keel-bench-learner-ranks")?;
        learner.join_ranks(Arc::new(Mutex::new(group)))?;
    }
    learner.train_step(&batch)?; // warm-up
    let collective_before = learner.collective_seconds();
    let reduced_before = learner.reduced_bytes();
    let start = Instant::now();
    let steps = num(f, "steps", 3)?;
    for _ in 0..steps {
        learner.train_step(&batch)?;
    }
    if let Device::Cuda(d) = device {
        tch::Cuda::synchronize(d as i64);
    }
    let seconds = start.elapsed().as_secs_f64();
    let peak = peak_mib()?;
    if let (0, Some(path)) = (rank, f.get("weights-out")) {
        let flat: Vec<tch::Tensor> = learner
            .model()
            .named_parameters()
            .into_iter()
            .map(|(_, t)| t.detach().to_device(Device::Cpu).flatten(0, -1))
            .collect();
        let weights = Vec::<f32>::try_from(&tch::Tensor::cat(&flat, 0))?;
        let bytes: Vec<u8> = weights.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(path, bytes)?;
    }
    println!(
        "{}",
        serde_json::json!({
            "seconds": seconds,
            "collective_seconds": learner.collective_seconds() - collective_before,
            "tokens": batch.n_tokens * steps,
            "peak_mib": peak,
            "optimizer_mib": learner.optimizer_state_bytes() as f64 / 1048576.0,
            "reduced_mib_per_step": (learner.reduced_bytes() - reduced_before) as f64
                / 1048576.0
                / steps as f64,
        })
    );
    Ok(())
}

/// ‖a − b‖ / ‖b‖ (infinite when the lengths differ).
fn relative_distance(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

/// One measurement of `world` ranks: every child's report.
/// Rank 0 writes its final weights to `weights_file`.
fn measure(
    world: usize,
    passed: &[String],
    weights_file: &std::path::Path,
) -> Res<Vec<serde_json::Value>> {
    let exe = std::env::current_exe()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port()
        .to_string();
    let children = (0..world)
        .map(|rank| {
            Command::new(&exe)
                .args(passed)
                .args(["--child", "1", "--rank", &rank.to_string()])
                .args(["--world", &world.to_string(), "--port", &port])
                .arg("--weights-out")
                .arg(weights_file)
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut reports = Vec::new();
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            return Err(format!("{world} ranks: rank {rank} failed ({})", out.status).into());
        }
        reports.push(serde_json::from_slice(&out.stdout)?);
    }
    Ok(reports)
}

fn main() -> Res<()> {
    let f = flags();
    if f.contains_key("child") {
        return child(&f);
    }
    let passed: Vec<String> = std::env::args().skip(1).collect();
    let ranks: Vec<usize> = f
        .get("ranks")
        .map_or("1,2,4", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let passed: Vec<String> = passed
        .chunks(2)
        .filter(|c| c[0] != "--ranks")
        .flatten()
        .cloned()
        .collect();
    println!("ranks | learner tokens/s | scaling efficiency | collectives / step time | peak RSS per rank | optimizer state per rank | gradients reduced per step | weights vs 1 rank");
    let mut base = None;
    let mut base_weights: Option<Vec<f32>> = None;
    let weights_dir = std::env::temp_dir();
    for world in ranks {
        let weights_file = weights_dir.join(format!(
            "keel-bench-ranks-{}-{world}.f32",
            std::process::id()
        ));
        let reports = measure(world, &passed, &weights_file)?;
        let field = |k: &'static str| {
            reports
                .iter()
                .map(|r| r[k].as_f64().unwrap_or(0.0))
                .fold(0.0, f64::max)
        };
        let slowest = field("seconds");
        let tokens = reports[0]["tokens"].as_f64().unwrap_or(0.0);
        let tps = tokens / slowest.max(1e-9);
        let base_tps = *base.get_or_insert(tps / world as f64);
        let share = field("collective_seconds") / slowest.max(1e-9);
        let weights: Vec<f32> = std::fs::read(&weights_file)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        std::fs::remove_file(&weights_file)?;
        let one = base_weights.get_or_insert_with(|| weights.clone());
        let off = relative_distance(&weights, one);
        println!(
            "{world} | {tps:.0} | {:.2} | {:.1}% | {:.0} MiB | {:.1} MiB | {:.1} MiB | {off:.1e}",
            tps / (base_tps * world as f64),
            100.0 * share,
            field("peak_mib"),
            field("optimizer_mib"),
            field("reduced_mib_per_step"),
        );
    }
    Ok(())
}
