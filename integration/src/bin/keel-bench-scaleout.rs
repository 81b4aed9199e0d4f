//! `keel-bench-scaleout`: what running roles as processes costs and buys.
//!
//! 1. Weights: one policy version of a Qwen2-0.5B-shaped model (494 M parameters, bf16 values
//!    published as F32 safetensors, as keel's board carries them) is published to and loaded
//!    from a run root — in full, and as a delta against the previous version where 1% of the
//!    weights changed (the public reports: ~99% of bf16 weights are unchanged between RL steps).
//!    The baseline, measured in the same run on the same backend, is a plain put + get of the
//!    same bytes. Local disk always; SeaweedFS S3 when `KEEL_TEST_S3_ENDPOINT` is set
//!    (`. scripts/seaweedfs.sh`).
//! 2. Generators: a `keel trainer` and 1, 2 or 4 `keel generator` processes on a latency-bound
//!    env (every env step sleeps ~150 ms); RL steps per second between the first and the last
//!    checkpoint, as a ratio to one generator.
//!
//! ```text
//! cargo build --release -p keel-ops -p keel-integration --bin keel --bin keel-bench-scaleout
//! target/release/keel-bench-scaleout [--skip-weights] [--skip-generators] [--steps 12]
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use keel_store::{RunStore, WeightsId};
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};

/// Qwen2-0.5B: hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864, vocab 151936, tied.
fn qwen2_half_b_shapes() -> Vec<(String, Vec<usize>)> {
    let (h, ff, kv, vocab) = (896, 4864, 128, 151_936);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![vocab, h])];
    for l in 0..24 {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.q_proj.bias", vec![h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.k_proj.bias", vec![kv]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.bias", vec![kv]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![ff, h]),
            ("mlp.up_proj.weight", vec![ff, h]),
            ("mlp.down_proj.weight", vec![h, ff]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            out.push((format!("{p}.{name}"), shape));
        }
    }
    out.push(("model.norm.weight".into(), vec![h]));
    out
}

/// Safetensors of bf16-valued F32 weights; `changed` of the elements of `previous` move by one
/// bf16 step (`previous = None`: fresh random weights).
fn weights(previous: Option<&[Vec<f32>]>, changed: f64, seed: u64) -> (Vec<Vec<f32>>, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shapes = qwen2_half_b_shapes();
    let bf16 = |x: f32| f32::from_bits(x.to_bits() & 0xffff_0000);
    let values: Vec<Vec<f32>> = match previous {
        None => shapes
            .iter()
            .map(|(_, s)| {
                let n: usize = s.iter().product();
                (0..n)
                    .map(|_| bf16(rng.gen_range(-0.05f32..0.05)))
                    .collect()
            })
            .collect(),
        Some(prev) => prev
            .iter()
            .map(|t| {
                t.iter()
                    .map(|&x| {
                        if rng.gen_bool(changed) {
                            f32::from_bits(x.to_bits().wrapping_add(0x1_0000))
                        } else {
                            x
                        }
                    })
                    .collect()
            })
            .collect(),
    };
    let raw: Vec<Vec<u8>> = values
        .iter()
        .map(|t| t.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = shapes
        .iter()
        .zip(&raw)
        .map(|((name, shape), bytes)| {
            (
                name.as_str(),
                TensorView::new(Dtype::F32, shape.clone(), bytes).expect("tensor view"),
            )
        })
        .collect();
    let bytes = safetensors::tensor::serialize(views, None).expect("serialize");
    (values, bytes)
}

/// Seconds of `f`, run once.
async fn time<T, F: std::future::Future<Output = Result<T>>>(f: F) -> Result<(f64, T)> {
    let start = Instant::now();
    let out = f.await?;
    Ok((start.elapsed().as_secs_f64(), out))
}

async fn bench_weights_on(store: &RunStore, name: &str, v0: &Bytes, v1: &Bytes) -> Result<()> {
    let id = |version| WeightsId::Policy { epoch: 0, version };
    let (raw_put, _) = time(async {
        Ok(store
            .create_object("bench/raw.safetensors", v0.clone())
            .await?)
    })
    .await?;
    let (raw_get, _) = time(async { Ok(store.get_object("bench/raw.safetensors").await?) }).await?;
    let full = [v0.clone()];
    let (pub_full, p0) = time(async {
        Ok(store
            .publish_weights(1, id(0), 0, &full, None, None)
            .await?)
    })
    .await?;
    let (load_full, got) = time(async {
        let p = store.weights_pointer(1, id(0)).await?;
        Ok(store.load_weights(&p, None).await?)
    })
    .await?;
    if got[0] != *v0 {
        bail!("{name}: full weights did not round-trip");
    }
    let next = [v1.clone()];
    let (pub_delta, p1) = time(async {
        Ok(store
            .publish_weights(1, id(1), 0, &next, Some((id(0), &full)), None)
            .await?)
    })
    .await?;
    if p1.base.is_none() {
        bail!("{name}: the 1%-changed version was not stored as a delta");
    }
    let cache = (id(0), full.to_vec());
    let (load_delta, got) = time(async {
        let p = store.weights_pointer(1, id(1)).await?;
        Ok(store.load_weights(&p, Some(&cache)).await?)
    })
    .await?;
    if got[0] != *v1 {
        bail!("{name}: delta weights did not decode to the new version");
    }
    let mb = |b: u64| b as f64 / 1e6;
    let raw = raw_put + raw_get;
    println!(
        "| {name} | full | {:.0} MB | {pub_full:.2} s | {load_full:.2} s | {:.2}x |",
        mb(p0.bytes()),
        (pub_full + load_full) / raw
    );
    println!("| {name} | delta (1% changed) | {:.1} MB | {pub_delta:.2} s | {load_delta:.2} s | {:.2}x |", mb(p1.bytes()), (pub_delta + load_delta) / raw);
    println!("| {name} | baseline: plain put + get | {:.0} MB | {raw_put:.2} s | {raw_get:.2} s | 1.00x |", mb(v0.len() as u64));
    Ok(())
}

fn bench_weights() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    eprintln!("building Qwen2-0.5B-shaped weights (494 M parameters)...");
    let (values, v0) = weights(None, 0.0, 1);
    let (_, v1) = weights(Some(&values), 0.01, 2);
    drop(values);
    let (v0, v1) = (Bytes::from(v0), Bytes::from(v1));
    println!(
        "\n### Weight publish + load, Qwen2-0.5B shape ({:.2} GB as F32 safetensors)\n",
        v0.len() as f64 / 1e9
    );
    println!("| backend | set | stored | publish | load | (publish + load) / baseline |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let dir = tempfile::tempdir()?;
    let local = RunStore::open(dir.path().to_str().context("utf8 path")?)?;
    rt.block_on(bench_weights_on(&local, "local disk", &v0, &v1))?;
    drop(dir);
    match std::env::var("KEEL_TEST_S3_ENDPOINT") {
        Ok(_) => {
            let bucket =
                std::env::var("KEEL_TEST_S3_BUCKET").unwrap_or_else(|_| "keel-test".into());
            let root = format!("s3://{bucket}/bench-weights-{}", std::process::id());
            let s3 = RunStore::open(&root)?;
            rt.block_on(bench_weights_on(&s3, "SeaweedFS S3", &v0, &v1))?;
        }
        Err(_) => {
            eprintln!("KEEL_TEST_S3_ENDPOINT is not set: S3 skipped (. scripts/seaweedfs.sh)")
        }
    }
    Ok(())
}

fn keel_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("keel");
    if !bin.exists() {
        bail!(
            "{} is missing: build it with the same profile (--bin keel)",
            bin.display()
        );
    }
    Ok(bin)
}

fn generator_toml(n: usize, steps: u64) -> String {
    format!(
        r#"[run]
name = "scaleout"
seed = 7
steps = {steps}
mode = "async"
staleness_bound = {n}
checkpoint_every = 1
threads = 1

[env]
name = "calc"
latency = "lognormal"
latency_ms = 150.0
latency_shape = 0.1

[sft]
steps = 60

[rollout]
generators = {n}
eval_tasks = 8

[metrics]
enabled = false

[distributed]
poll_ms = 20
"#
    )
}

fn spawn(bin: &Path, args: &[&str], cfg: &Path, root: &Path) -> Result<Child> {
    Ok(Command::new(bin)
        .args(args)
        .arg("--config")
        .arg(cfg)
        .arg("--run-root")
        .arg(root)
        .env("KEEL_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// RL steps per second of a trainer with `n` generator processes.
fn generators_run(bin: &Path, n: usize, steps: u64) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("cfg.toml");
    std::fs::write(&cfg, generator_toml(n, steps))?;
    let root = dir.path().join("root");
    let mut trainer = spawn(bin, &["trainer", "--no-progress"], &cfg, &root)?;
    let mut gens = (0..n)
        .map(|r| spawn(bin, &["generator", "--rank", &r.to_string()], &cfg, &root))
        .collect::<Result<Vec<_>>>()?;
    let rt = tokio::runtime::Runtime::new()?;
    let store = RunStore::open(root.to_str().context("utf8")?)?;
    let (mut first, mut last) = (None, None);
    loop {
        if let Ok(Some(m)) = rt.block_on(store.latest_checkpoint()) {
            if m.step >= 1 && first.is_none() {
                first = Some((m.step, Instant::now()));
            }
            if m.step >= steps {
                last = Some((m.step, Instant::now()));
            }
        }
        if last.is_some() || trainer.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = trainer.wait()?;
    for g in &mut gens {
        let _ = g.wait();
    }
    match (first, last, status.success()) {
        (Some((s0, t0)), Some((s1, t1)), true) if s1 > s0 => {
            Ok((s1 - s0) as f64 / (t1 - t0).as_secs_f64())
        }
        _ => bail!("the run with {n} generators did not finish ({status})"),
    }
}

fn bench_generators(steps: u64) -> Result<()> {
    let bin = keel_bin()?;
    println!("\n### Generator processes on a latency-bound env (async, bound = generators)\n");
    println!("| generators | RL steps/s | vs 1 generator |");
    println!("| --- | --- | --- |");
    let mut base = None;
    for n in [1, 2, 4] {
        let rate = generators_run(&bin, n, steps)?;
        let b = *base.get_or_insert(rate);
        println!("| {n} | {rate:.2} | {:.2}x |", rate / b);
    }
    Ok(())
}

fn main() -> Result<()> {
    let (mut weights, mut generators, mut steps) = (true, true, 12u64);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--skip-weights" => weights = false,
            "--skip-generators" => generators = false,
            "--steps" => steps = it.next().context("--steps N")?.parse().context("--steps")?,
            other => {
                bail!("unknown argument {other:?} (--skip-weights, --skip-generators, --steps N)")
            }
        }
    }
    if weights {
        bench_weights()?;
    }
    if generators {
        bench_generators(steps)?;
    }
    Ok(())
}
