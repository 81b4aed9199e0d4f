//! keel-bench-lora-memory: the learner's peak resident memory, full fine-tuning against LoRA,
//! for the same model and batch, each measured in a fresh process of its own.
//!
//! ```text
//! keel-bench-lora-memory [--hidden 512] [--layers 8] [--vocab 16384] [--batch 4] [--seq 128]
//!   [--steps 3] [--rank 16] [--threads 1]
//! ```
//! Each child builds a random Llama-shaped model (f32, CPU), a `Learner` (keel's AdamW), and
//! runs `--steps` SFT steps on random tokens; it reports the process's peak RSS (`VmHWM`) after
//! the steps (before serialising anything), the trained parameter count and the size of the
//! optimizer state as checkpointed. The parent prints both and the
//! ratio LoRA / full (the baseline is the full fine-tune of the same run).

use std::collections::HashMap;
use std::process::Command;

use keel_learner::batch_tensors::TrainBatch;
use keel_learner::hf::{HfModel, LoadOptions, LoraConfig};
use keel_learner::{Learner, LearnerConfig};
use rand::{Rng, SeedableRng};
use tch::{Device, Kind};

mod bench_common;
use bench_common::{flags, llama_config, num, peak_mib, Res};

fn child(f: &HashMap<String, String>, mode: &str) -> Res<()> {
    tch::set_num_threads(num(f, "threads", 1)? as i32);
    let cfg = llama_config(f, 8)?;
    let vocab = cfg.vocab_size as u32;
    let mut model = HfModel::random(cfg, LoadOptions::policy(Device::Cpu, Kind::Float), 1)?;
    if mode == "lora" {
        let rank = num(f, "rank", 16)?;
        model = model.with_lora(&LoraConfig {
            rank,
            alpha: 2.0 * rank as f64,
            dropout: 0.0,
            target_modules: vec!["all-linear".into()],
            seed: 1,
        })?;
    }
    let trained: i64 = model
        .trained_parameters()
        .iter()
        .map(|(_, t)| t.numel() as i64)
        .sum();
    let mut learner = Learner::new(model, LearnerConfig::default(), 1)?;
    let (batch, seq) = (num(f, "batch", 4)?, num(f, "seq", 128)?);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    let rows: Vec<(Vec<u32>, Vec<u8>)> = (0..batch)
        .map(|_| {
            let toks = (0..seq).map(|_| rng.gen_range(0..vocab)).collect();
            let mut mask = vec![1u8; seq];
            mask[0] = 0;
            (toks, mask)
        })
        .collect();
    let batch = TrainBatch::from_sequences(&rows, Device::Cpu)?;
    for _ in 0..num(f, "steps", 3)? {
        learner.sft_step(&batch, 1e-4)?;
    }
    // Peak of training itself, read before the state is serialised (which copies it).
    let peak = peak_mib()?;
    let opt_bytes = learner
        .state_files()?
        .into_iter()
        .find(|(n, _)| n == "optimizer.safetensors")
        .map_or(0, |(_, b)| b.len());
    println!(
        "{}",
        serde_json::json!({"peak_mib": peak, "trained": trained, "opt_mib": opt_bytes as f64 / 1048576.0})
    );
    Ok(())
}

fn main() -> Res<()> {
    let f = flags();
    if let Some(mode) = f.get("child") {
        return child(&f, mode);
    }
    let exe = std::env::current_exe()?;
    let passed: Vec<String> = std::env::args().skip(1).collect();
    let mut got = HashMap::new();
    for mode in ["full", "lora"] {
        let out = Command::new(&exe)
            .args(&passed)
            .args(["--child", mode])
            .output()?;
        if !out.status.success() {
            return Err(format!("{mode}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        println!(
            "{mode:>4}: peak RSS {:>8.1} MiB, trained parameters {:>11}, optimizer state {:>8.1} MiB",
            v["peak_mib"].as_f64().unwrap_or(0.0),
            v["trained"],
            v["opt_mib"].as_f64().unwrap_or(0.0)
        );
        got.insert(mode, v["peak_mib"].as_f64().unwrap_or(0.0));
    }
    println!(
        "peak RSS LoRA / full: {:.2}x",
        got["lora"] / got["full"].max(1e-9)
    );
    Ok(())
}
