//! keel-bench-invariant: what batch invariance (SA-7) costs the sampler at a real model's
//! shapes, against the same workload sampled without it, in one run.
//!
//! ```text
//! keel-bench-invariant [--layers 30 --hidden 576 --mlp 1536 --heads 9 --kv-heads 3
//!   --vocab 49152] [--episodes 8 --turns 3 --prompt 160 --new 32 --observation 24]
//!   [--context 1024] [--threads 1] [--repeat 2]
//! ```
//! The model is a random Llama of the given shape (the defaults are SmolLM2-135M-Instruct's:
//! 30 layers, 135M parameters); its weights do not change the work. The workload is the
//! rollout engine's: `--episodes` multi-turn episodes share one sampler with one slot each and
//! a `--context` cache; an episode's prompt is `--prompt` tokens give or take a quarter, each
//! turn samples exactly `--new` tokens at temperature 1, and its context plus `--observation`
//! tokens is submitted again as the next turn as soon as the turn ends (continuous batching).
//! Prints the best wall time of `--repeat` runs with invariance off and on, and their ratio.

use std::collections::HashMap;
use std::time::Instant;

use keel_learner::hf::{GenRequest, HfConfig, HfModel, LoadOptions, Sampler, SamplingParams};
use tch::{Device, Kind};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn args() -> Res<HashMap<String, usize>> {
    let mut map = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let key = k
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {k}"))?;
        let value = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
        map.insert(
            key.to_string(),
            value.parse().map_err(|e| format!("--{key}: {e}"))?,
        );
    }
    Ok(map)
}

struct Workload {
    episodes: usize,
    turns: usize,
    prompt: usize,
    new: usize,
    observation: usize,
    context: usize,
}

/// A deterministic token in `1..vocab`.
fn token(i: usize, salt: usize, vocab: usize) -> u32 {
    (1 + (i * 7919 + salt * 104_729) % (vocab - 1)) as u32
}

/// Runs the workload once; answers (seconds, sampled tokens).
fn run(m: &HfModel, w: &Workload, invariant: bool) -> Res<(f64, usize)> {
    let vocab = m.config().vocab_size;
    let mut s = Sampler::new(m, w.episodes, w.context)?;
    s.set_batch_invariant(invariant);
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: w.new,
        ..SamplingParams::default()
    };
    let mut contexts: Vec<Vec<u32>> = (0..w.episodes)
        .map(|e| {
            let n = w.prompt * 3 / 4 + (e * 37) % (w.prompt / 2).max(1);
            (0..n).map(|i| token(i, e, vocab)).collect()
        })
        .collect();
    let mut turns = vec![0usize; w.episodes];
    let t0 = Instant::now();
    for (e, c) in contexts.iter().enumerate() {
        s.submit(
            m,
            e,
            GenRequest {
                prompt: c.clone(),
                params: params.clone(),
                seed: e as u64,
            },
        )?;
    }
    let mut sampled = 0;
    while !s.is_idle() {
        for (e, done) in s.step(m)? {
            sampled += done.tokens.len();
            turns[e] += 1;
            if turns[e] == w.turns {
                continue;
            }
            let c = &mut contexts[e];
            c.extend(&done.tokens);
            let start = c.len();
            c.extend((0..w.observation).map(|i| token(start + i, e + 1000, vocab)));
            let seed = (e * 1000 + turns[e]) as u64;
            s.submit(
                m,
                e,
                GenRequest {
                    prompt: c.clone(),
                    params: params.clone(),
                    seed,
                },
            )?;
        }
    }
    Ok((t0.elapsed().as_secs_f64(), sampled))
}

fn main() -> Res<()> {
    let a = args()?;
    let get = |k: &str, d: usize| a.get(k).copied().unwrap_or(d);
    tch::set_num_threads(get("threads", 1) as i32);
    let (layers, hidden, heads) = (get("layers", 30), get("hidden", 576), get("heads", 9));
    let cfg = HfConfig::from_value(serde_json::json!({
        "model_type": "llama", "vocab_size": get("vocab", 49_152), "hidden_size": hidden,
        "intermediate_size": get("mlp", 1536), "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": get("kv-heads", 3),
        "head_dim": hidden / heads, "rms_norm_eps": 1e-5, "rope_theta": 100_000.0,
        "tie_word_embeddings": true, "max_position_embeddings": 8192
    }))?;
    let m = HfModel::random(cfg, LoadOptions::policy(Device::Cpu, Kind::Float), 1)?;
    let w = Workload {
        episodes: get("episodes", 8),
        turns: get("turns", 3),
        prompt: get("prompt", 160),
        new: get("new", 32),
        observation: get("observation", 24),
        context: get("context", 1024),
    };
    println!(
        "model: random Llama, {layers} layers, {:.1}M params; {} episodes x {} turns, prompt ~{}, {} new + {} observation tokens per turn, context {}",
        m.config().n_params() as f64 / 1e6,
        w.episodes, w.turns, w.prompt, w.new, w.observation, w.context
    );
    let mut best = [f64::INFINITY; 2];
    for _ in 0..get("repeat", 2).max(1) {
        for (k, invariant) in [false, true].into_iter().enumerate() {
            let (secs, tokens) = run(&m, &w, invariant)?;
            println!(
                "  invariance {}: {secs:.2} s, {tokens} tokens sampled",
                ["off", "on"][k]
            );
            best[k] = best[k].min(secs);
        }
    }
    println!(
        "best: off {:.2} s, on {:.2} s; on / off = {:.2}x",
        best[0],
        best[1],
        best[1] / best[0]
    );
    Ok(())
}
