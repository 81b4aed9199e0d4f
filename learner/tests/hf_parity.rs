//! Parity of keel's Hugging Face model layer with the real transformers library, run in the
//! same test: transformers creates tiny random Llama, Qwen2 and Qwen3 models and reference
//! outputs (tests/python/make_tiny_models.py); keel loads them and must reproduce the
//! logits (f32, 1e-4), the left-padded logits, the greedy generations (token for token), the
//! loss and every parameter's gradient, the tokenizer and the chat template; then folders saved by keel are loaded back by transformers
//! (tests/python/check_saved.py) and must give the same logits (and critic values).
//! Needs python3 with torch, transformers and safetensors (scripts/setup.sh installs them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use keel_learner::hf::{
    logprob_mismatch, ChatMessage, GenRequest, HfModel, HfTokenizer, LoadOptions, SampledSequence,
    Sampler, SamplingParams,
};
use tch::{Device, Kind, Tensor};

const TOL: f64 = 1e-4;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name)
}

fn python(args: &[&str]) {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .args(args)
        .output()
        .expect("python3 must be on PATH (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "{py} {args:?} failed (needs torch, transformers, safetensors: run scripts/setup.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn load_refs(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .expect("reference file")
        .into_iter()
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

fn rows(t: &Tensor) -> Vec<Vec<u32>> {
    Vec::<Vec<i64>>::try_from(t)
        .expect("ids")
        .into_iter()
        .map(|r| r.into_iter().map(|x| x as u32).collect())
        .collect()
}

/// Checks one architecture against its references; returns the model.
fn check_arch(dir: &Path, arch: &str) -> HfModel {
    let m = HfModel::load(dir, LoadOptions::policy(Device::Cpu, Kind::Float))
        .expect("keel loads the folder");
    let r = load_refs(&dir.join("reference.safetensors"));
    let _guard = tch::no_grad_guard();
    let (logits, _) = m.forward(&r["input_ids"]).expect("forward");
    let d_logits = max_diff(&logits, &r["logits"]);
    let mask = &r["padded_mask"];
    let padded = m
        .logits(&m.hidden_masked(&r["padded_ids"], mask).expect("masked"))
        .expect("logits");
    let keep = mask.unsqueeze(-1).to_kind(Kind::Double);
    let d_padded = max_diff(
        &(padded.to_kind(Kind::Double) * &keep),
        &(r["padded_logits"].to_kind(Kind::Double) * &keep),
    );
    // Greedy generation with the KV cache, token for token.
    let prompts = rows(&r["prompt_ids"]);
    let want = rows(&r["greedy_ids"]);
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: want[0].len(),
        ..SamplingParams::default()
    };
    let reqs: Vec<GenRequest> = prompts
        .iter()
        .map(|p| GenRequest {
            prompt: p.clone(),
            params: params.clone(),
            seed: 0,
        })
        .collect();
    let got = Sampler::new(&m, 2, 64)
        .expect("sampler")
        .generate(&m, reqs)
        .expect("generate");
    let full: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&got)
        .map(|(p, c)| [p.clone(), c.tokens.clone()].concat())
        .collect();
    let seqs: Vec<SampledSequence<'_>> = full
        .iter()
        .zip(&got)
        .map(|(f, c)| SampledSequence {
            tokens: f,
            start: f.len() - c.tokens.len(),
            logprobs: &c.logprobs,
        })
        .collect();
    let mm = logprob_mismatch(&m, &seqs, 1.0).expect("mismatch");
    eprintln!("{arch}: logits max|Δ| {d_logits:.2e}, left-padded {d_padded:.2e}, greedy equal {}, logprob mismatch max {:.2e}",
        got.iter().map(|c| &c.tokens).eq(want.iter()), mm.max_abs);
    assert!(d_logits < TOL, "{arch}: logits differ by {d_logits}");
    assert!(d_padded < TOL, "{arch}: padded logits differ by {d_padded}");
    for (c, w) in got.iter().zip(&want) {
        assert_eq!(
            &c.tokens, w,
            "{arch}: greedy generation differs from transformers"
        );
    }
    assert!(
        mm.max_abs < TOL,
        "{arch}: sampler vs learner log-prob mismatch {mm:?}"
    );
    drop(_guard);
    check_gradients(&m, &r, arch);
    // Tokenizer and chat template.
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let j: serde_json::Value = serde_json::from_str(&text).expect("json");
    let tok = HfTokenizer::load(dir).expect("tokenizer");
    let ids =
        |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).expect("ids") };
    assert_eq!(
        tok.encode(j["text"].as_str().expect("text"), false)
            .expect("encode"),
        ids(&j["ids"])
    );
    let messages: Vec<ChatMessage> = j["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().unwrap_or(""),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        tok.apply_chat_template(&messages, true).expect("template"),
        j["chat_text"].as_str().expect("chat")
    );
    assert_eq!(codec_ids(&tok, &messages), ids(&j["chat_ids"]));
    assert_eq!(
        tok.decode(&ids(&j["ids"]), false).expect("decode"),
        j["text"].as_str().expect("text")
    );
    m
}

/// The learner side: the mean next-token NLL (through `token_logprobs`) and the gradient of
/// every parameter match transformers' autograd.
fn check_gradients(m: &HfModel, r: &HashMap<String, Tensor>, arch: &str) {
    let ids = &r["input_ids"];
    let t = ids.size()[1];
    let (logits, _) = m.forward(ids).expect("forward");
    let lp = keel_learner::token_logprobs(&logits, ids).narrow(1, 1, t - 1);
    let nll = -lp.mean(Kind::Float);
    let d_nll = (nll.double_value(&[]) - r["nll"].double_value(&[0])).abs();
    nll.backward();
    let mut worst = (0.0f64, String::new());
    let params = m.named_parameters();
    let mut norm = 0.0;
    for (name, p) in &params {
        let want = &r[&format!("grad.{name}")];
        norm += want.square().sum(Kind::Double).double_value(&[]);
        let scale = want.abs().max().double_value(&[]).max(1e-3);
        let d = max_diff(&p.grad(), want) / scale;
        if d >= worst.0 {
            worst = (d, name.clone());
        }
    }
    eprintln!(
        "{arch}: nll |Δ| {d_nll:.2e}, {} gradients (norm {:.3}), worst relative |Δ| {:.2e} ({})",
        params.len(),
        norm.sqrt(),
        worst.0,
        worst.1
    );
    assert!(norm > 0.0, "{arch}: reference gradients are all zero");
    assert!(d_nll < TOL, "{arch}: loss differs by {d_nll}");
    assert!(
        worst.0 < 1e-3,
        "{arch}: gradient of {} differs by {:.2e} (relative)",
        worst.1,
        worst.0
    );
}

#[test]
fn hf_parity_with_transformers() {
    tch::set_num_threads(2);
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    python(&[
        script("make_tiny_models.py").to_str().expect("path"),
        root.to_str().expect("path"),
    ]);
    let inputs = root.join("llama/reference.safetensors");
    let ids = load_refs(&inputs)["input_ids"].shallow_clone();
    let mut saved: Vec<(String, Tensor)> = Vec::new();
    for arch in ["llama", "qwen2", "qwen3"] {
        let m = check_arch(&root.join(arch), arch);
        let out = root.join(format!("keel-{arch}"));
        // qwen3 is saved sharded to exercise the index on the way back.
        let shard = if arch == "qwen3" {
            100_000
        } else {
            5_000_000_000
        };
        m.save_pretrained_sharded(&out, shard).expect("keel saves");
        let back = HfModel::load(&out, LoadOptions::policy(Device::Cpu, Kind::Float))
            .expect("keel reloads");
        let logits = tch::no_grad(|| back.forward(&ids).expect("forward").0);
        saved.push((format!("keel-{arch}"), logits));
    }
    // A critic initialised from the qwen2 policy, with a non-zero head, saved for transformers.
    let critic = HfModel::load(
        &root.join("qwen2"),
        LoadOptions::critic(Device::Cpu, Kind::Float),
    )
    .expect("critic");
    for (name, mut t) in critic.var_store().variables() {
        if name.starts_with("score.") {
            tch::no_grad(|| t.copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.1)));
        }
    }
    critic
        .save_pretrained(&root.join("keel-critic"))
        .expect("save critic");
    let values = tch::no_grad(|| {
        critic
            .values(&critic.hidden(&ids).expect("hidden"))
            .expect("values")
            .expect("head")
    });
    saved.push(("keel-critic".into(), values.unsqueeze(-1)));
    let out = root.join("transformers.safetensors");
    let mut args = vec![
        script("check_saved.py").to_str().expect("path").to_string(),
        inputs.display().to_string(),
        out.display().to_string(),
    ];
    args.extend(
        saved
            .iter()
            .map(|(n, _)| root.join(n).display().to_string()),
    );
    python(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let theirs = load_refs(&out);
    for (name, ours) in &saved {
        let d = max_diff(ours, &theirs[name]);
        eprintln!("{name}: transformers on the keel-saved folder, max|Δ| {d:.2e}");
        assert!(
            d < TOL,
            "{name}: transformers' output on the keel-saved folder differs by {d}"
        );
    }
}

/// The chat template's rendering encoded without adding special tokens again (CC-1).
fn codec_ids(
    tok: &keel_learner::hf::HfTokenizer,
    messages: &[keel_learner::hf::ChatMessage],
) -> Vec<u32> {
    let text = tok.apply_chat_template(messages, true).expect("template");
    tok.encode(&text, false).expect("chat ids")
}
