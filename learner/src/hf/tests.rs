//! Unit tests of the HF model layer on tiny random models (no Python needed; the transformers
//! parity tests live in `integration/tests/hf_parity.rs`).

use serde_json::json;
use tch::{Device, Kind, Tensor};

use super::*;

fn tiny(model_type: &str, tie: bool) -> HfConfig {
    HfConfig::from_value(json!({
        "model_type": model_type, "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": tie, "initializer_range": 0.2,
        "max_position_embeddings": 128
    }))
    .expect("tiny config")
}

fn model(model_type: &str) -> HfModel {
    tch::set_num_threads(1);
    HfModel::random(
        tiny(model_type, false),
        LoadOptions::policy(Device::Cpu, Kind::Float),
        3,
    )
    .expect("model")
}

fn greedy(max_new: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: max_new,
        ..SamplingParams::default()
    }
}

fn req(prompt: &[u32], params: SamplingParams, seed: u64) -> GenRequest {
    GenRequest {
        prompt: prompt.to_vec(),
        params,
        seed,
    }
}

#[test]
fn hm4_left_and_right_padding_match_unpadded() {
    let m = model("qwen3");
    let toks = Tensor::from_slice(&[5i64, 9, 2, 7]).view([1, 4]);
    let want = m.forward(&toks).expect("fwd").0;
    let left = Tensor::from_slice(&[0i64, 0, 5, 9, 2, 7]).view([1, 6]);
    let lmask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1]).view([1, 6]);
    let got = m
        .logits(&m.hidden_masked(&left, &lmask).expect("left"))
        .expect("logits");
    assert!(got.narrow(1, 2, 4).allclose(&want, 1e-5, 1e-5, false));
    let right = Tensor::from_slice(&[5i64, 9, 2, 7, 0]).view([1, 5]);
    let rmask = Tensor::from_slice(&[1i64, 1, 1, 1, 0]).view([1, 5]);
    let got = m
        .logits(&m.hidden_masked(&right, &rmask).expect("right"))
        .expect("logits");
    assert!(got.narrow(1, 0, 4).allclose(&want, 1e-5, 1e-5, false));
}

#[test]
fn sa1_greedy_kv_cache_equals_full_recompute_and_logprobs_match() {
    for arch in ["llama", "qwen2", "qwen3"] {
        let m = model(arch);
        let mut s = Sampler::new(&m, 2, 32).expect("sampler");
        let prompts: [&[u32]; 2] = [&[1, 2, 3], &[4, 5, 6, 7, 8]];
        let out = s
            .generate(&m, prompts.iter().map(|p| req(p, greedy(8), 0)).collect())
            .expect("gen");
        for (p, c) in prompts.iter().zip(&out) {
            let mut ctx: Vec<i64> = p.iter().map(|&t| i64::from(t)).collect();
            for (&tok, &lp) in c.tokens.iter().zip(&c.logprobs) {
                let logits = m
                    .forward(&Tensor::from_slice(&ctx).view([1, -1]))
                    .expect("fwd")
                    .0;
                let last = logits.get(0).get(ctx.len() as i64 - 1);
                assert_eq!(
                    last.argmax(0, false).int64_value(&[]),
                    i64::from(tok),
                    "{arch}"
                );
                let want = last
                    .log_softmax(0, Kind::Float)
                    .double_value(&[i64::from(tok)]);
                assert!(
                    (want - f64::from(lp)).abs() < 1e-5,
                    "{arch}: {want} vs {lp}"
                );
                ctx.push(i64::from(tok));
            }
        }
    }
}

#[test]
fn sa4_continuous_batching_does_not_change_samples() {
    let m = model("qwen2");
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.9,
        top_k: 20,
        max_new_tokens: 6,
        ..SamplingParams::default()
    };
    let reqs: Vec<GenRequest> = (0..5u32)
        .map(|i| {
            req(
                &[1 + i, 2, 3 + i][..(1 + i as usize % 3)],
                params.clone(),
                100 + u64::from(i),
            )
        })
        .collect();
    let wide = Sampler::new(&m, 5, 16)
        .expect("s")
        .generate(&m, reqs.clone())
        .expect("wide");
    let narrow = Sampler::new(&m, 2, 16)
        .expect("s")
        .generate(&m, reqs.clone())
        .expect("narrow");
    for (a, b) in wide.iter().zip(&narrow) {
        assert_eq!(a.tokens, b.tokens);
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-5);
        }
    }
    let again = Sampler::new(&m, 5, 16)
        .expect("s")
        .generate(&m, reqs)
        .expect("again");
    assert_eq!(wide, again, "same seeds, same samples");
}

/// Runs `sampler` until idle, submitting `late` (under an id no other request uses) after
/// `at` steps; answers its completion.
fn late_arrival(
    sampler: &mut Sampler,
    m: &HfModel,
    at: usize,
    late: GenRequest,
) -> Option<Completion> {
    const LATE: usize = usize::MAX;
    let (mut out, mut steps) = (None, 0);
    while !sampler.is_idle() {
        if steps == at {
            sampler.submit(m, LATE, late.clone()).expect("late submit");
        }
        for (id, c) in sampler.step(m).expect("step") {
            if id == LATE {
                out = Some(c);
            }
        }
        steps += 1;
    }
    out
}

#[test]
fn sa7_batch_invariant_samples_do_not_depend_on_batch_mates_or_arrival() {
    let m = model("llama");
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 6,
        ..SamplingParams::default()
    };
    let probe = req(&[5, 6, 7], params.clone(), 42);
    let mut alone = Sampler::new(&m, 4, 24).expect("s");
    alone.set_batch_invariant(true);
    let solo = alone.generate(&m, vec![probe.clone()]).expect("alone");
    // The same request among others, submitted two steps after they started.
    let mut shared = Sampler::new(&m, 4, 24).expect("s");
    shared.set_batch_invariant(true);
    for (id, p) in [[1u32, 2].as_slice(), &[9, 8, 7, 6, 5], &[3]]
        .iter()
        .enumerate()
    {
        shared
            .submit(&m, id, req(p, params.clone(), id as u64))
            .expect("submit");
    }
    let out = late_arrival(&mut shared, &m, 2, probe.clone());
    assert_eq!(
        out.as_ref(),
        solo.first(),
        "bit-identical tokens and log-probs"
    );
}

/// SA-7 across length buckets: a probe whose context grows through two buckets, sampled alone
/// and then among mates in other buckets, in a more crowded sampler, and resubmitted as a
/// second turn (its context plus an observation), is bit-identical every time; more than
/// `INVARIANT_ROWS` sequences in one bucket decode in several groups.
#[test]
fn sa7_invariance_holds_across_length_buckets_and_row_groups() {
    let m = model("qwen2");
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 12,
        ..SamplingParams::default()
    };
    let context = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32).map(|i| 1 + (i * 7 + salt) % 38).collect()
    };
    // 26 prompt tokens + 12 sampled: buckets 32 then 64.
    let probe = req(&context(26, 3), params.clone(), 42);
    let mut alone = Sampler::new(&m, 2, 128).expect("s");
    alone.set_batch_invariant(true);
    let solo = alone.generate(&m, vec![probe.clone()]).expect("alone");
    let mut crowd = Sampler::new(&m, 12, 128).expect("s");
    crowd.set_batch_invariant(true);
    for (id, n) in [3usize, 30, 29, 70, 5, 31, 28, 27, 30, 29, 26]
        .into_iter()
        .enumerate()
    {
        crowd
            .submit(
                &m,
                id,
                req(&context(n, id as u32), params.clone(), id as u64),
            )
            .expect("submit");
    }
    let out = late_arrival(&mut crowd, &m, 3, probe.clone());
    assert_eq!(out.as_ref(), solo.first(), "bit-identical among mates");
    // A second turn: the sampled tokens and an observation appended, submitted again.
    let mut second = probe.prompt.clone();
    second.extend(&solo[0].tokens);
    second.extend([11, 12, 13]);
    let turn = req(&second, params.clone(), 7);
    let solo2 = alone.generate(&m, vec![turn.clone()]).expect("alone 2");
    let mut mates: Vec<GenRequest> = (0..9)
        .map(|i| req(&context(40 + i, i as u32), params.clone(), i as u64))
        .collect();
    mates.insert(4, turn);
    let shared2 = crowd.generate(&m, mates).expect("shared 2");
    assert_eq!(shared2[4], solo2[0], "bit-identical on the second turn");
}

#[test]
fn lm2_multi_turn_token_in_token_out_has_no_mismatch() {
    let m = model("llama");
    let params = SamplingParams {
        temperature: 0.7,
        top_p: 0.95,
        max_new_tokens: 5,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(&m, 3, 64).expect("sampler");
    let reqs: Vec<GenRequest> = (0..4u64)
        .map(|i| req(&[1, 2 + i as u32], params.clone(), i))
        .collect();
    // Per episode: the final tokens, and (start, log-probs) of each sampled turn.
    type Episode = (Vec<u32>, Vec<(usize, Vec<f32>)>);
    let mut finals: Vec<Episode> = Vec::new();
    let mut turns = std::collections::HashMap::<usize, (usize, usize)>::new(); // id -> (episode, turn)
    let mut prompts = std::collections::HashMap::<usize, Vec<u32>>::new();
    for i in 0..4 {
        turns.insert(i, (i, 0));
        prompts.insert(i, vec![1, 2 + i as u32]);
        finals.push((vec![1, 2 + i as u32], vec![]));
    }
    let mut next_id = 4;
    for (id, r) in reqs.into_iter().enumerate() {
        s.submit(&m, id, r).expect("submit");
    }
    // Each finished turn's follow-up (completion + observation) joins the next step.
    let mut done = Vec::new();
    while !s.is_idle() {
        for (id, c) in s.step(&m).expect("step") {
            let (ep, turn) = turns[&id];
            let mut seq = prompts[&id].clone();
            finals[ep].1.push((seq.len(), c.logprobs.clone()));
            seq.extend(&c.tokens);
            done.push(id);
            if turn == 2 {
                finals[ep].0 = seq;
                continue;
            }
            seq.extend([30, 31]); // the observation, appended as tokens
            turns.insert(next_id, (ep, turn + 1));
            prompts.insert(next_id, seq.clone());
            s.submit(&m, next_id, req(&seq, params.clone(), 1000 + id as u64))
                .expect("follow-up");
            next_id += 1;
        }
    }
    assert_eq!(done.len(), 12, "4 episodes × 3 turns");
    let seqs: Vec<SampledSequence<'_>> = finals
        .iter()
        .flat_map(|(toks, spans)| {
            spans.iter().map(move |(start, lps)| SampledSequence {
                tokens: toks,
                start: *start,
                logprobs: lps,
            })
        })
        .collect();
    let mm = logprob_mismatch(&m, &seqs, 0.7).expect("mismatch");
    assert_eq!(mm.tokens, 60);
    assert!(mm.max_abs < 1e-4, "{mm:?}");
}

#[test]
fn sa3_stop_tokens_and_strings() {
    let m = model("qwen2");
    let free = Sampler::new(&m, 1, 32)
        .expect("s")
        .generate(&m, vec![req(&[3, 4], greedy(10), 0)])
        .expect("free");
    let stop = free.first().map(|c| c.tokens[3]).expect("4th token");
    let first = free[0]
        .tokens
        .iter()
        .position(|&t| t == stop)
        .expect("present");
    let p = SamplingParams {
        stop_token_ids: vec![stop],
        ..greedy(10)
    };
    let out = Sampler::new(&m, 1, 32)
        .expect("s")
        .generate(&m, vec![req(&[3, 4], p, 0)])
        .expect("stopped");
    assert_eq!(out[0].tokens, free[0].tokens[..=first].to_vec());
    assert_eq!(out[0].finish, FinishReason::StopToken);
    let mut s = Sampler::new(&m, 1, 32).expect("s");
    s.set_detokenizer(Box::new(|ids: &[u32]| {
        Ok(ids.iter().map(|t| format!("<{t}>")).collect())
    }));
    let p = SamplingParams {
        stop_strings: vec![format!("<{stop}>")],
        ..greedy(10)
    };
    let out = s
        .generate(&m, vec![req(&[3, 4], p, 0)])
        .expect("stop string");
    assert_eq!(
        (out[0].tokens.len(), out[0].finish),
        (first + 1, FinishReason::StopString)
    );
    assert!(
        Sampler::new(&m, 1, 8)
            .expect("s")
            .generate(&m, vec![req(&[1, 2], greedy(7), 0)])
            .is_err(),
        "SA-5"
    );
}

#[test]
fn hs2_save_load_round_trip_and_critic_from_policy() {
    let m = model("qwen3");
    let dir = tempfile::tempdir().expect("tmp");
    m.save_pretrained_sharded(dir.path(), 20_000).expect("save");
    assert!(dir.path().join(weights::INDEX_FILE).exists());
    let back =
        HfModel::load(dir.path(), LoadOptions::policy(Device::Cpu, Kind::Float)).expect("load");
    for ((n1, a), (n2, b)) in m.named_parameters().iter().zip(back.named_parameters()) {
        assert_eq!(n1, &n2);
        assert!(a.equal(&b), "{n1}");
    }
    let critic =
        HfModel::load(dir.path(), LoadOptions::critic(Device::Cpu, Kind::Float)).expect("critic");
    let toks = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
    let h = critic.hidden(&toks).expect("hidden");
    let v = critic.values(&h).expect("values").expect("value head");
    assert_eq!(v.size(), vec![1, 3]);
    assert_eq!(
        v.abs().sum(Kind::Float).double_value(&[]),
        0.0,
        "HM-3: zero-initialised head"
    );
    assert!(critic.logits(&h).is_err());
    let cfg = critic.saved_config();
    assert_eq!(cfg["architectures"], json!(["Qwen3ForTokenClassification"]));
    assert_eq!(back.forward(&toks).expect("fwd").0.size(), vec![1, 3, 40]);
}

#[test]
fn hm2_strict_load_names_the_tensor() {
    let m = model("llama");
    let dir = tempfile::tempdir().expect("tmp");
    m.save_pretrained(dir.path()).expect("save");
    let mut cfg = m.saved_config();
    cfg["model_type"] = json!("qwen2"); // qwen2 needs q/k/v biases the folder lacks
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).expect("write");
    let e = HfModel::load(dir.path(), LoadOptions::policy(Device::Cpu, Kind::Float))
        .err()
        .expect("must fail");
    assert!(
        e.to_string()
            .starts_with("weights `model.layers.0.self_attn.q_proj.bias`: missing"),
        "{e}"
    );
}

#[test]
fn bf16_parameters_run() {
    tch::set_num_threads(1);
    let m = HfModel::random(
        tiny("qwen2", true),
        LoadOptions::policy(Device::Cpu, Kind::BFloat16),
        1,
    )
    .expect("bf16");
    let out = Sampler::new(&m, 2, 16).expect("s").generate(
        &m,
        vec![req(&[1, 2], greedy(4), 0), req(&[3], greedy(4), 0)],
    );
    assert_eq!(out.expect("gen")[1].tokens.len(), 4);
}

#[test]
fn sa6_one_sampler_many_weight_versions() {
    let (a, b) = (model("qwen2"), {
        tch::set_num_threads(1);
        HfModel::random(
            tiny("qwen2", false),
            LoadOptions::policy(Device::Cpu, Kind::Float),
            4,
        )
        .expect("b")
    });
    let mut s = Sampler::new(&a, 2, 16).expect("sampler");
    let run = |s: &mut Sampler, m: &HfModel| {
        s.generate(m, vec![req(&[1, 2, 3], greedy(6), 0)])
            .expect("gen")
    };
    let (ga, gb) = (run(&mut s, &a), run(&mut s, &b));
    assert_ne!(
        ga[0].logprobs, gb[0].logprobs,
        "the weights given to each call are the ones used"
    );
    assert_eq!(run(&mut s, &a), ga, "nothing carries over between calls");
    let other = HfModel::random(
        tiny("llama", true),
        LoadOptions::policy(Device::Cpu, Kind::BFloat16),
        0,
    )
    .expect("c");
    assert!(
        s.generate(&other, vec![req(&[1], greedy(2), 0)]).is_err(),
        "a different kind is refused"
    );
}

/// SA-8: a version marked between steps is recorded at each sequence's token count: inside a
/// decoding one, at 0 for one still queued.
#[test]
fn sa8_marked_versions_split_completions_where_the_weights_changed() {
    let m = model("qwen2");
    let mut s = Sampler::new(&m, 1, 16).expect("sampler");
    s.submit(&m, 0, req(&[1, 2, 3], greedy(6), 0))
        .expect("submit");
    s.submit(&m, 1, req(&[4, 5], greedy(6), 0)).expect("submit");
    let mut done = Vec::new();
    for _ in 0..2 {
        done.extend(s.step(&m).expect("step"));
    }
    assert!(done.is_empty(), "one slot: nothing finished in two steps");
    s.mark_version(9);
    while !s.is_idle() {
        done.extend(s.step(&m).expect("step"));
    }
    done.sort_by_key(|(id, _)| *id);
    let (first, queued) = (&done[0].1, &done[1].1);
    assert_eq!(first.tokens.len(), 6);
    assert!(
        matches!(first.versions[..], [(k, 9)] if k > 0 && k < 6),
        "decoding: {:?}",
        first.versions
    );
    assert_eq!(
        queued.versions,
        [(0, 9)],
        "queued: its first token is the new version's"
    );
}

#[test]
fn placement_from_config_strings() {
    assert_eq!(
        LoadOptions::placement("cpu", "bf16").expect("cpu"),
        (Device::Cpu, Kind::BFloat16)
    );
    assert_eq!(
        LoadOptions::placement("cpu", "float32").expect("cpu"),
        (Device::Cpu, Kind::Float)
    );
    assert!(LoadOptions::placement("tpu", "f32").is_err());
    assert!(LoadOptions::placement("cpu", "int8").is_err());
    if !tch::Cuda::is_available() {
        let e = LoadOptions::placement("cuda", "bf16")
            .expect_err("no GPU here")
            .to_string();
        assert!(e.contains("no such CUDA device"), "{e}");
    }
}
