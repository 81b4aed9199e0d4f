//! keel-bench-model: keel's Hugging Face model layer against PyTorch eager and transformers
//! `generate()`, same model, same shapes, same machine, in one run.
//!
//! ```text
//! keel-bench-model [--model DIR | --shape cpu-small|qwen2-0.5b] [--device cpu|cuda]
//!   [--dtype float32|bfloat16] [--threads N] [--batch B --seq T --steps N --warmup W]
//!   [--gen-batches 1,8 --prompt P --new N --repeat R] [--peak] [--skip-torch] [--skip-learner] [--skip-sampler]
//! ```
//! The PyTorch side is `learner/tests/python/bench_torch.py` (override with `KEEL_BENCH_PY`),
//! run with `python3` (override with `PYTHON`) and the same intra-op thread count. Learner step
//! (both sides): forward, f32 log-softmax of the next tokens, mean NLL, backward, AdamW; the
//! fastest of `--steps` timed steps. Sampler: greedy, exactly N new tokens per sequence, KV
//! cache on both sides, the best of `--repeat` runs. Best-of timing keeps the ratios stable on
//! a machine shared with other work.
//! Prints one line per measurement, the ratios keel / PyTorch, and model FLOPs utilisation
//! against the measured matmul peak when `--peak` is given.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use keel_learner::hf::{GenRequest, HfModel, LoadOptions, Sampler, SamplingParams};
use rand::{Rng, SeedableRng};
use tch::nn::OptimizerConfig;
use tch::{nn, Device, Kind, Tensor};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args(HashMap<String, String>);

impl Args {
    fn parse() -> Res<Self> {
        let mut map = HashMap::new();
        let mut it = std::env::args().skip(1);
        while let Some(k) = it.next() {
            let key = k
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {k}"))?
                .to_string();
            let flag = matches!(
                key.as_str(),
                "peak" | "skip-torch" | "skip-learner" | "skip-sampler"
            );
            let value = if flag {
                "1".to_string()
            } else {
                it.next().ok_or_else(|| format!("--{key} needs a value"))?
            };
            map.insert(key, value);
        }
        Ok(Args(map))
    }
    fn str(&self, k: &str, d: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| d.to_string())
    }
    fn num(&self, k: &str, d: usize) -> Res<usize> {
        Ok(self
            .0
            .get(k)
            .map(|v| v.parse())
            .transpose()
            .map_err(|e| format!("--{k}: {e}"))?
            .unwrap_or(d))
    }
    fn flag(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
}

fn python(script: &Path, args: &[String]) -> Res<serde_json::Value> {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py).arg(script).args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "{py} {} {args:?} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().ok_or("python printed nothing")?;
    Ok(serde_json::from_str(last)?)
}

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..vocab as i64)).collect()
}

/// keel learner step tokens/s (see the module doc).
fn keel_learner(m: &HfModel, batch: usize, seq: usize, steps: usize, warmup: usize) -> Res<f64> {
    let mut opt = nn::AdamW::default().build(m.var_store(), 1e-5)?;
    let ids = Tensor::f_from_slice(&random_ids(batch * seq, m.config().vocab_size, 0))?
        .f_view([batch as i64, seq as i64])?
        .f_to_device(m.device())?;
    let t = seq as i64;
    let next = ids.f_narrow(1, 1, t - 1)?.f_unsqueeze(-1)?;
    let mut step = || -> Res<()> {
        let (logits, _) = m.forward(&ids)?;
        let lp = logits
            .f_narrow(1, 0, t - 1)?
            .f_log_softmax(-1, Kind::Float)?
            .f_gather(-1, &next, false)?;
        let loss = lp.f_mean(Kind::Float)?.f_neg()?;
        opt.zero_grad();
        loss.f_backward()?;
        opt.step();
        Ok(())
    };
    for _ in 0..warmup {
        step()?;
    }
    sync(m.device());
    let mut best = f64::INFINITY;
    for _ in 0..steps {
        let t0 = Instant::now();
        step()?;
        sync(m.device());
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok((batch * seq) as f64 / best)
}

/// keel sampler tokens/s: greedy, exactly `new` tokens per sequence, best of `repeat` runs.
fn keel_sampler(m: &HfModel, batch: usize, prompt: usize, new: usize, repeat: usize) -> Res<f64> {
    let ids = random_ids(batch * prompt, m.config().vocab_size, 1);
    let reqs = |n: usize| -> Vec<GenRequest> {
        ids.chunks(prompt)
            .map(|p| GenRequest {
                prompt: p.iter().map(|&t| t as u32).collect(),
                params: SamplingParams {
                    temperature: 0.0,
                    max_new_tokens: n,
                    ..SamplingParams::default()
                },
                seed: 0,
            })
            .collect()
    };
    let mut s = Sampler::new(m, batch, prompt + new)?;
    s.generate(m, reqs(4))?; // warm-up
    sync(m.device());
    let mut best = 0.0f64;
    for _ in 0..repeat.max(1) {
        let t0 = Instant::now();
        let out = s.generate(m, reqs(new))?;
        sync(m.device());
        let n: usize = out.iter().map(|c| c.tokens.len()).sum();
        best = best.max(n as f64 / t0.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn main() -> Res<()> {
    let a = Args::parse()?;
    let threads = a.num("threads", 2)?;
    tch::set_num_threads(threads as i32);
    let dtype = a.str("dtype", "float32");
    let (device, kind) = LoadOptions::placement(&a.str("device", "cpu"), &dtype)?;
    let script = std::env::var("KEEL_BENCH_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/bench_torch.py")
        });
    let dev_s = a.str("device", "cpu");
    let common = |extra: &[String]| -> Vec<String> {
        let mut v = vec![
            "--device".into(),
            dev_s.clone(),
            "--dtype".into(),
            dtype.clone(),
            "--threads".into(),
            threads.to_string(),
        ];
        v.extend_from_slice(extra);
        v
    };
    let (dir, made) = match a.0.get("model") {
        Some(d) => (PathBuf::from(d), false),
        None => {
            let d = std::env::temp_dir().join(format!("keel-bench-{}", std::process::id()));
            let shape = a.str("shape", "cpu-small");
            let t0 = Instant::now();
            python(
                &script,
                &[
                    vec![
                        "make".into(),
                        d.display().to_string(),
                        "--shape".into(),
                        shape.clone(),
                    ],
                    common(&[]),
                ]
                .concat(),
            )?;
            println!(
                "made random {shape} model ({dtype}) in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            (d, true)
        }
    };
    let m = HfModel::load(&dir, LoadOptions::policy(device, kind))?;
    let cfg = m.config().clone();
    println!(
        "model {}: {:.1}M params, device {dev_s}, {dtype}, {threads} threads",
        dir.display(),
        cfg.n_params() as f64 / 1e6
    );
    let dir_s = dir.display().to_string();
    let peak = if a.flag("peak") {
        python(&script, &[vec!["peak".to_string()], common(&[])].concat())?["tflops"].as_f64()
    } else {
        None
    };
    let mut summary = serde_json::Map::new();
    if !a.flag("skip-learner") {
        let (b, t, steps, warm) = (
            a.num("batch", 4)?,
            a.num("seq", 256)?,
            a.num("steps", 3)?,
            a.num("warmup", 1)?,
        );
        let theirs = if a.flag("skip-torch") {
            None
        } else {
            let args = [
                vec!["learner".to_string(), dir_s.clone()],
                common(&[]),
                [
                    "--batch",
                    &b.to_string(),
                    "--seq",
                    &t.to_string(),
                    "--steps",
                    &steps.to_string(),
                    "--warmup",
                    &warm.to_string(),
                ]
                .map(String::from)
                .to_vec(),
            ]
            .concat();
            python(&script, &args)?["tokens_per_s"].as_f64()
        };
        let ours = keel_learner(&m, b, t, steps, warm)?;
        let lm = if cfg.tie_word_embeddings {
            0
        } else {
            cfg.vocab_size * cfg.hidden_size
        };
        let flops = 6.0 * (cfg.n_params() - lm) as f64
            + 6.0 * (cfg.num_hidden_layers * t * cfg.num_attention_heads * cfg.head_dim) as f64;
        report(
            &mut summary,
            &format!("learner step {b}x{t}"),
            ours,
            theirs,
            "PyTorch eager",
        );
        if let Some(p) = peak {
            let mfu = |x: f64| 100.0 * x * flops / (p * 1e12);
            println!(
                "  MFU vs measured peak {p:.2} TFLOP/s: keel {:.1}%{}",
                mfu(ours),
                theirs.map_or(String::new(), |x| format!(", PyTorch {:.1}%", mfu(x)))
            );
            summary.insert("learner_mfu_keel".into(), mfu(ours).into());
        }
    }
    if !a.flag("skip-sampler") {
        let (prompt, new, repeat) = (a.num("prompt", 32)?, a.num("new", 64)?, a.num("repeat", 3)?);
        for b in a.str("gen-batches", "1,8").split(',') {
            let b: usize = b.trim().parse()?;
            let theirs = if a.flag("skip-torch") {
                None
            } else {
                let args = [
                    vec!["generate".to_string(), dir_s.clone()],
                    common(&[]),
                    [
                        "--batch",
                        &b.to_string(),
                        "--prompt",
                        &prompt.to_string(),
                        "--new",
                        &new.to_string(),
                        "--repeat",
                        &repeat.to_string(),
                    ]
                    .map(String::from)
                    .to_vec(),
                ]
                .concat();
                python(&script, &args)?["tokens_per_s"].as_f64()
            };
            let ours = keel_sampler(&m, b, prompt, new, repeat)?;
            report(
                &mut summary,
                &format!("sampler batch {b} (prompt {prompt}, {new} new)"),
                ours,
                theirs,
                "transformers generate",
            );
        }
    }
    println!("{}", serde_json::Value::Object(summary));
    if made {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn report(
    summary: &mut serde_json::Map<String, serde_json::Value>,
    what: &str,
    ours: f64,
    theirs: Option<f64>,
    base: &str,
) {
    match theirs {
        Some(t) => println!(
            "{what}: keel {ours:.0} tokens/s, {base} {t:.0} tokens/s, ratio {:.2}x",
            ours / t
        ),
        None => println!("{what}: keel {ours:.0} tokens/s"),
    }
    summary.insert(
        what.to_string(),
        serde_json::json!({"keel": ours, "torch": theirs, "ratio": theirs.map(|t| ours / t)}),
    );
}
