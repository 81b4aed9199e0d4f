//! End-to-end tests of `Learner` (invariants LR-1 … LR-5) on a tiny model.

use tch::{Device, Kind, Tensor};

use crate::algo::value::CriticModel;
use crate::batch_tensors::{Row, TrainBatch};
use crate::error::LearnerError;
use crate::hf::HfModel;
use crate::learner::Learner;
use crate::learner_config::{Algo, LearnerConfig};
use crate::logprobs::token_logprobs;
use crate::model::test_models;

/// A tiny Llama-shaped model over 12 ids, initialised from `seed`.
pub(crate) fn tiny(value_head: bool, seed: u64) -> HfModel {
    test_models::tiny(12, value_head, seed)
}

pub(crate) fn cfg(algo: Algo) -> LearnerConfig {
    LearnerConfig {
        algo,
        lr: 3e-3,
        minibatches: 1,
        ..LearnerConfig::default()
    }
}

/// On-policy behaviour log-probs of `model` for each row.
fn behaviour(model: &HfModel, tokens: &[u32]) -> Vec<f32> {
    let toks: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    let toks = Tensor::from_slice(&toks).view([1, -1]);
    let (logits, _) = tch::no_grad(|| model.forward(&toks)).expect("forward");
    Vec::<f32>::try_from(&token_logprobs(&logits, &toks).get(0)).expect("logp")
}

/// Two groups: in group 7 trajectory 0 (response 3 4) has reward 1 and trajectory 1 (5 6)
/// reward 0; group 8 is constant. Prompt `1 2`, then the response, then an observation 9 and
/// one more model token.
pub(crate) fn rl_batch(model: &HfModel) -> TrainBatch {
    let specs: [(&[u32], f32, u64); 4] = [
        (&[1, 2, 3, 4, 9, 10], 1.0, 7),
        (&[1, 2, 5, 6, 9, 11], 0.0, 7),
        (&[1, 8, 3, 5], 0.5, 8),
        (&[1, 8, 6], 0.5, 8),
    ];
    let rows = specs
        .iter()
        .map(|(tokens, reward, group)| {
            let mask: Vec<u8> = (0..tokens.len())
                .map(|t| u8::from(t >= 2 && tokens[t] != 9))
                .collect();
            let lp = behaviour(model, tokens);
            let logp = lp
                .iter()
                .zip(&mask)
                .map(|(&l, &m)| if m == 1 { l } else { 0.0 })
                .collect();
            Row::new(tokens.to_vec(), mask, logp, *reward, *group)
        })
        .collect();
    TrainBatch::from_rows(rows, Device::Cpu).expect("batch")
}

fn sequence_logp(model: &HfModel, tokens: &[u32], from: usize) -> f64 {
    behaviour(model, tokens)[from..]
        .iter()
        .map(|&x| f64::from(x))
        .sum()
}

#[test]
fn ppo_requires_a_value_head() {
    let Err(e) = Learner::new(tiny(false, 0), cfg(Algo::Ppo), 0) else {
        panic!("PPO without a value head")
    };
    assert!(
        e.to_string().starts_with("model.value_head must be true"),
        "{e}"
    );
}

#[test]
fn lr1_grpo_raises_the_rewarded_trajectory() {
    tch::set_num_threads(1);
    let mut l = Learner::new(tiny(false, 3), cfg(Algo::Grpo), 3).expect("learner");
    let batch = rl_batch(l.model());
    let good: &[u32] = &[1, 2, 3, 4];
    let bad: &[u32] = &[1, 2, 5, 6];
    let (g0, b0) = (
        sequence_logp(l.model(), good, 2),
        sequence_logp(l.model(), bad, 2),
    );
    let first = l.train_step(&batch).expect("step");
    assert_eq!(
        first.clip_frac, 0.0,
        "on-policy behaviour log-probs give ratio 1 (LR-1)"
    );
    assert!(first.approx_kl.abs() < 1e-6, "kl {}", first.approx_kl);
    for _ in 0..4 {
        let m = l.train_step(&batch).expect("step");
        assert!(m.loss.is_finite() && m.grad_norm.is_finite());
    }
    let (g1, b1) = (
        sequence_logp(l.model(), good, 2),
        sequence_logp(l.model(), bad, 2),
    );
    assert!(g1 > g0 + 1e-3, "good trajectory log-prob {g0} → {g1}");
    assert!(b1 < b0 - 1e-3, "bad trajectory log-prob {b0} → {b1}");
    assert_eq!(l.step(), 5);
    assert_eq!(first.tokens, batch.n_tokens);
    assert!((first.mean_reward - 0.5).abs() < 1e-9);
}

#[test]
fn ppo_step_trains_policy_and_critic() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        epochs: 2,
        minibatches: 2,
        entropy_coef: Some(0.01),
        gamma: Some(1.0),
        lam: Some(0.95),
        ..cfg(Algo::Ppo)
    };
    let mut l = Learner::new(tiny(true, 4), c, 4).expect("learner");
    let batch = rl_batch(l.model());
    let first = l.train_step(&batch).expect("step");
    assert!(first.value_loss > 0.0 && first.entropy > 0.0);
    let mut last = first.clone();
    for _ in 0..10 {
        last = l.train_step(&batch).expect("step");
        assert!(last.loss.is_finite());
    }
    assert!(
        last.value_loss < first.value_loss,
        "value loss {} → {}",
        first.value_loss,
        last.value_loss
    );
    assert_eq!(
        l.step(),
        11 * 4,
        "epochs × minibatches optimizer steps per call (LR-3)"
    );
}

#[test]
fn lr2_non_finite_loss_skips_the_step() {
    tch::set_num_threads(1);
    let mut l = Learner::new(tiny(false, 5), cfg(Algo::Grpo), 5).expect("learner");
    let mut batch = rl_batch(l.model());
    batch.final_rewards[0] = f32::NAN;
    let before = l.weights_safetensors().expect("weights");
    let e = l.train_step(&batch).expect_err("NaN reward");
    assert!(matches!(e, crate::LearnerError::NonFinite { .. }), "{e}");
    assert_eq!(
        before,
        l.weights_safetensors().expect("weights"),
        "weights untouched (LR-2)"
    );
    assert_eq!(l.step(), 0);
}

#[test]
fn sft_decreases_loss() {
    tch::set_num_threads(1);
    let mut l = Learner::new(tiny(false, 6), cfg(Algo::Grpo), 6).expect("learner");
    let seqs = vec![
        (vec![1, 2, 3, 4, 5], vec![0, 0, 1, 1, 1]),
        (vec![1, 7, 8], vec![0, 1, 1]),
    ];
    let batch = TrainBatch::from_sequences(&seqs, Device::Cpu).expect("batch");
    let first = l.sft_step(&batch, 1e-2).expect("sft");
    let mut last = first.clone();
    for _ in 0..20 {
        last = l.sft_step(&batch, 1e-2).expect("sft");
    }
    assert!(
        last.loss < 0.5 * first.loss,
        "sft loss {} → {}",
        first.loss,
        last.loss
    );
    assert_eq!((l.step(), l.sft_steps()), (0, 21));
}

#[test]
fn lr4_restore_continues_bit_identically() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        epochs: 2,
        minibatches: 3,
        weight_decay: Some(0.01),
        ..cfg(Algo::Ppo)
    };
    let mut a = Learner::new(tiny(true, 11), c.clone(), 11).expect("a");
    let batch = rl_batch(a.model());
    let sft =
        TrainBatch::from_sequences(&[(vec![1, 2, 3], vec![0, 1, 1])], Device::Cpu).expect("sft");
    a.train_step(&batch).expect("a1");
    a.sft_step(&sft, 1e-3).expect("a sft");
    a.train_step(&batch).expect("a2");
    let files = a.state_files().expect("state");
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["model.safetensors", "optimizer.safetensors", "learner.json"]
    );

    let mut b = Learner::new(tiny(true, 999), c, 999).expect("b");
    b.restore(&files).expect("restore");
    assert_eq!((b.step(), b.sft_steps()), (a.step(), a.sft_steps()));
    for l in [&mut a, &mut b] {
        l.train_step(&batch).expect("3");
        l.sft_step(&sft, 1e-3).expect("sft");
        l.train_step(&batch).expect("4");
    }
    assert!(
        a.weights_safetensors().expect("a") == b.weights_safetensors().expect("b"),
        "weights differ"
    );
    for ((name, x), (_, y)) in a
        .state_files()
        .expect("a")
        .iter()
        .zip(&b.state_files().expect("b"))
    {
        assert!(x == y, "{name} differs after restore");
    }
}

#[test]
fn lr5_restore_rejects_other_models_and_changes_nothing() {
    tch::set_num_threads(1);
    let mut a = Learner::new(tiny(true, 1), cfg(Algo::Grpo), 1).expect("a");
    let other = test_models::tiny(13, true, 2);
    let mut b = Learner::new(other, cfg(Algo::Grpo), 2).expect("b");
    let before = b.weights_safetensors().expect("w");
    let e = b
        .restore(&a.state_files().expect("files"))
        .expect_err("model mismatch");
    assert!(e.to_string().contains("learner.json"), "{e}");
    let mut files = a.state_files().expect("files");
    files.retain(|(n, _)| n != "optimizer.safetensors");
    let mut c = Learner::new(tiny(true, 2), cfg(Algo::Grpo), 2).expect("c");
    let e = c.restore(&files).expect_err("missing file");
    assert!(e.to_string().contains("optimizer.safetensors"), "{e}");
    assert_eq!(before, b.weights_safetensors().expect("w"));
}

#[test]
fn ls2_no_gradient_reaches_logits_predicting_mask0_tokens() {
    tch::set_num_threads(1);
    let model = tiny(false, 2);
    let batch = rl_batch(&model);
    let (logits, _) = model.forward(&batch.tokens).expect("forward");
    let logits = logits.detach().set_requires_grad(true);
    let logp = token_logprobs(&logits, &batch.tokens);
    let adv = Tensor::ones_like(&logp);
    let clip = crate::algo::ppo::ClipBounds {
        low: 0.2,
        high: 0.2,
        dual: Some(3.0),
    };
    let loss =
        crate::algo::ppo::vanilla_ppo(&logp, &batch.behaviour_logp, &adv, &batch.loss_mask, clip)
            .loss;
    crate::algo::aggregation::masked_mean(&loss, &batch.loss_mask).backward();
    // logits[b, t-1] predicts token t: its gradient is zero exactly where mask[b, t] = 0.
    let g = logits.grad().abs().sum_dim_intlist(-1, false, Kind::Float);
    let mask = Vec::<Vec<f32>>::try_from(&batch.loss_mask).expect("mask");
    let g = Vec::<Vec<f32>>::try_from(&g).expect("grad");
    for (b, row) in mask.iter().enumerate() {
        for t in 1..row.len() {
            assert_eq!(g[b][t - 1] == 0.0, row[t] == 0.0, "row {b} position {t}");
        }
        assert_eq!(
            g[b][row.len() - 1],
            0.0,
            "the last position predicts nothing"
        );
    }
}

fn preset_learner(p: crate::Preset, seed: u64) -> Learner {
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        ..LearnerConfig::for_preset(p)
    };
    let vh = c.resolve().policy_value_head();
    Learner::new(tiny(vh, seed), c, seed).expect("learner")
}

#[test]
fn every_preset_trains_the_tiny_batch_without_nan() {
    tch::set_num_threads(1);
    for p in crate::Preset::ALL {
        let mut l = preset_learner(p, 21);
        let batch = rl_batch(l.model());
        for _ in 0..3 {
            let m = l
                .train_step(&batch)
                .unwrap_or_else(|e| panic!("{}: {e}", p.name()));
            let v = serde_json::to_value(&m).expect("json");
            for (k, x) in v.as_object().expect("object") {
                assert!(
                    x.as_f64().is_none_or(f64::is_finite),
                    "{}: metric {k} = {x}",
                    p.name()
                );
            }
        }
        assert_eq!(l.policy_version(), 3, "{}", p.name());
    }
}

/// SAO with its critic on the policy's trunk (`learner.critic_model = "shared"`).
fn shared_sao(seed: u64, trainable: Option<&[&str]>) -> Result<Learner, LearnerError> {
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        critic_model: Some(CriticModel::Shared),
        critic_trainable: trainable.map(|t| t.iter().map(|s| s.to_string()).collect()),
        ..LearnerConfig::for_preset(crate::Preset::Sao)
    };
    Learner::new(tiny(true, seed), c, seed)
}

/// Every parameter of `m` by name, flattened.
fn snapshot(m: &HfModel) -> Vec<(String, Vec<f32>)> {
    m.named_parameters()
        .into_iter()
        .map(|(n, t)| (n, Vec::<f32>::try_from(&t.flatten(0, -1)).expect("w")))
        .collect()
}

#[test]
fn cs1_sao_warmup_trains_only_the_value_head() {
    tch::set_num_threads(1);
    let mut l = shared_sao(22, None).expect("learner");
    let batch = rl_batch(l.model());
    let named = |l: &Learner| -> Vec<(String, Vec<f32>)> {
        l.model()
            .named_parameters()
            .into_iter()
            .map(|(n, t)| (n, Vec::<f32>::try_from(&t.flatten(0, -1)).expect("w")))
            .collect()
    };
    let before = named(&l);
    let m = l.train_step(&batch).expect("warm-up step");
    assert_eq!(
        (m.actor_steps, m.critic_steps),
        (0.0, 2.0),
        "K = 2 value-only steps per minibatch, no actor step"
    );
    for ((n, a), (_, b)) in before.iter().zip(named(&l)) {
        assert_eq!(a == &b, !n.starts_with("score"), "{n}");
    }
    // Head-only value steps backpropagate into the head alone (OP-5): no trunk gradient.
    for (n, t) in l.model().named_parameters() {
        let g = t.grad();
        if !n.starts_with("score.") && g.defined() {
            assert_eq!(g.abs().sum(tch::Kind::Double).double_value(&[]), 0.0, "{n}");
        }
    }
}

#[test]
fn cs1_critic_trainable_groups_are_configurable_and_checked() {
    tch::set_num_threads(1);
    let Err(e) = shared_sao(5, Some(&["score", "nope"])) else {
        panic!("an unknown prefix was accepted")
    };
    assert!(e.to_string().contains("critic_trainable"), "{e}");
    // The critic trains the value head and the last block's MLP; attention stays frozen.
    let mut l = shared_sao(5, Some(&["score", "model.layers.1.mlp"])).expect("learner");
    let batch = rl_batch(l.model());
    let snapshot = |l: &Learner| -> Vec<(String, Vec<f32>)> {
        l.model()
            .named_parameters()
            .into_iter()
            .map(|(n, t)| (n, Vec::<f32>::try_from(&t.flatten(0, -1)).expect("w")))
            .collect()
    };
    let before = snapshot(&l);
    l.train_step(&batch).expect("warm-up step");
    for ((n, a), (_, b)) in before.iter().zip(snapshot(&l)) {
        let trained = n.starts_with("score") || n.starts_with("model.layers.1.mlp");
        assert_eq!(a != &b, trained, "{n}");
    }
}

#[test]
fn cr1_sao_trains_a_separate_critic_with_its_own_optimizer() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        critic_warmup: Some(1),
        ..LearnerConfig::for_preset(crate::Preset::Sao)
    };
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        ..c
    };
    let mut l = Learner::new(tiny(false, 24), c, 24).expect("a policy without a value head");
    assert!(l.critic_model().is_none(), "made at the first update");
    let batch = rl_batch(l.model());
    let policy_before = snapshot(l.model());
    let m = l.train_step(&batch).expect("warm-up");
    assert_eq!((m.actor_steps, m.critic_steps), (0.0, 2.0));
    assert_eq!(
        snapshot(l.model()),
        policy_before,
        "the warm-up leaves the policy alone"
    );
    // Separate optimizer state: the critic's steps do not advance the policy's AdamW.
    assert_eq!(l.optimizer_steps(), (0, Some(2)));
    for (n, t) in l.model().named_parameters() {
        let g = t.grad();
        assert!(
            !g.defined() || g.abs().sum(tch::Kind::Double).double_value(&[]) == 0.0,
            "value steps reached the policy's {n}"
        );
    }
    // VM-1 then K = 2 steps on everything: the critic's trunk has left the policy's.
    let critic = snapshot(l.critic_model().expect("critic"));
    assert!(critic.iter().all(|(n, _)| n != "lm_head.weight"));
    let moved = critic
        .iter()
        .filter(|(n, _)| !n.starts_with("score"))
        .zip(&policy_before)
        .filter(|((_, a), (_, b))| a != b)
        .count();
    assert!(moved > 0, "the dense critic trains its trunk");
    let m = l.train_step(&batch).expect("actor step");
    assert_eq!((m.actor_steps, m.critic_steps), (1.0, 2.0));
    assert_ne!(snapshot(l.model()), policy_before);
    assert_eq!(l.optimizer_steps(), (1, Some(4)));
    // VM-3 + LR-4: the critic and its optimizer are checkpointed and resume bit-identically.
    let files = l.state_files().expect("files");
    for f in ["critic.safetensors", "critic_optimizer.safetensors"] {
        assert!(files.iter().any(|(n, _)| n == f), "{f}");
    }
    let mut r = Learner::new(tiny(false, 99), l.config().clone(), 99).expect("fresh");
    r.restore(&files).expect("restore");
    for x in [&mut l, &mut r] {
        x.train_step(&batch).expect("3");
    }
    assert_eq!(snapshot(l.model()), snapshot(r.model()));
    assert_eq!(
        snapshot(l.critic_model().expect("c")),
        snapshot(r.critic_model().expect("c"))
    );
}

#[test]
fn cr1_a_given_critic_is_checked_and_only_for_separate_critics() {
    tch::set_num_threads(1);
    let critic = |vocab: usize| {
        let m = test_models::tiny(vocab, true, 3);
        let o = m.options();
        let mut c = HfModel::zeros(
            m.config().clone(),
            crate::hf::LoadOptions::critic(o.device, o.kind),
        )
        .expect("critic");
        c.load_safetensors(
            &crate::tensor_io::encode(
                &m.named_parameters()
                    .into_iter()
                    .filter(|(n, _)| n != "lm_head.weight")
                    .collect::<Vec<_>>(),
                None,
            )
            .expect("bytes"),
        )
        .expect("load");
        c
    };
    let mut grpo = Learner::new(tiny(false, 1), cfg(Algo::Grpo), 1).expect("grpo");
    let e = grpo.set_critic_model(critic(12)).expect_err("no critic");
    assert!(e.to_string().contains("model.critic_path"), "{e}");
    let mut sao = Learner::new(tiny(false, 1), cfg(Algo::Sao), 1).expect("sao");
    let e = sao
        .set_critic_model(critic(8))
        .expect_err("vocab")
        .to_string();
    assert!(
        e.contains("vocab_size 8 is smaller than the policy's 12"),
        "{e}"
    );
    sao.set_critic_model(critic(12))
        .expect("a critic of the same vocabulary");
    let given = snapshot(sao.critic_model().expect("set"));
    sao.train_step(&rl_batch(sao.model())).expect("step");
    assert_ne!(snapshot(sao.critic_model().expect("kept")), given);
}

#[test]
fn op6_a_bf16_learner_trains_and_resumes_bit_identically() {
    tch::set_num_threads(1);
    let bf16 = |seed: u64| {
        let spec = crate::model::test_models::tiny_spec(12, false, seed);
        crate::model::ModelSpec {
            kind: Kind::BFloat16,
            ..spec
        }
        .build()
        .expect("bf16 model")
    };
    let mut a = Learner::new(bf16(8), cfg(Algo::Grpo), 8).expect("learner");
    let batch = rl_batch(a.model());
    let before = a.weights_safetensors().expect("w");
    let m = a.train_step(&batch).expect("bf16 step");
    assert!(m.loss.is_finite() && m.grad_norm > 0.0, "{m:?}");
    assert_ne!(a.weights_safetensors().expect("w"), before);
    let files = a.state_files().expect("files");
    let mut b = Learner::new(bf16(9), cfg(Algo::Grpo), 9).expect("fresh");
    b.restore(&files).expect("restore");
    for l in [&mut a, &mut b] {
        l.train_step(&batch).expect("2");
    }
    assert!(a.weights_safetensors().expect("a") == b.weights_safetensors().expect("b"));
    let mut f32 = Learner::new(tiny(false, 8), cfg(Algo::Grpo), 8).expect("f32");
    let e = f32.restore(&files).expect_err("bf16 into f32").to_string();
    assert!(e.contains("BFloat16"), "{e}");
}

#[test]
fn ac1_activation_checkpointing_gives_the_same_updates() {
    tch::set_num_threads(1);
    for algo in [Algo::Grpo, Algo::Ppo, Algo::Sao] {
        let run = |checkpoint: bool| {
            let c = LearnerConfig {
                activation_checkpointing: checkpoint,
                critic_warmup: (algo == Algo::Sao).then_some(1),
                ..cfg(algo)
            };
            let vh = c.resolve().policy_value_head();
            let mut l = Learner::new(tiny(vh, 31), c, 31).expect("learner");
            let batch = rl_batch(l.model());
            l.sft_step(&batch, 1e-3).expect("sft");
            for _ in 0..2 {
                l.train_step(&batch).expect("step");
            }
            let mut w = snapshot(l.model());
            w.extend(l.critic_model().map(snapshot).unwrap_or_default());
            w
        };
        for ((n, a), (_, b)) in run(false).iter().zip(run(true)) {
            let diff = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "{algo:?} {n}: {diff}");
        }
    }
}

#[test]
fn lr4_reference_policy_is_taken_once_and_checkpointed() {
    tch::set_num_threads(1);
    let mut a = preset_learner(crate::Preset::Armor, 23);
    let batch = rl_batch(a.model());
    let initial = a.weights_safetensors().expect("w");
    a.train_step(&batch).expect("1");
    a.train_step(&batch).expect("2");
    let reference = a
        .reference()
        .expect("reference")
        .to_safetensors()
        .expect("ref");
    assert_eq!(
        reference, initial,
        "the reference is the weights at the first update"
    );
    let files = a.state_files().expect("files");
    assert!(files.iter().any(|(n, _)| n == "reference.safetensors"));
    let mut b = preset_learner(crate::Preset::Armor, 99);
    b.restore(&files).expect("restore");
    for l in [&mut a, &mut b] {
        l.train_step(&batch).expect("3");
    }
    assert!(a.weights_safetensors().expect("a") == b.weights_safetensors().expect("b"));
}

/// `reference_kl` gives a preset without a reference (GRPO) a frozen one for `kl_ref` only: the
/// updates are bit-identical to the same learner without it.
#[test]
fn reference_kl_reports_the_drift_without_changing_the_update() {
    tch::set_num_threads(1);
    let mk = |reference_kl| {
        let model = tiny(false, 27);
        Learner::new(
            model,
            LearnerConfig {
                reference_kl,
                ..cfg(Algo::Grpo)
            },
            5,
        )
        .expect("learner")
    };
    let (mut plain, mut tracked) = (mk(false), mk(true));
    let batch = rl_batch(plain.model());
    for step in 0..3 {
        let a = plain.train_step(&batch).expect("plain");
        let b = tracked.train_step(&batch).expect("tracked");
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "step {step}");
        assert_eq!(a.kl_ref, 0.0, "no reference without the key");
        assert!(step == 0 || b.kl_ref > 0.0, "step {step}: {}", b.kl_ref);
    }
    assert!(plain.reference().is_none() && tracked.reference().is_some());
    assert!(plain.weights_safetensors().expect("a") == tracked.weights_safetensors().expect("b"));
}

/// ARMOR keeps a prompt only when its reference produced a correct response (the group's anchor
/// row): an informative group without one is dropped like a uniform group.
#[test]
fn armor_drops_informative_groups_without_an_anchor() {
    tch::set_num_threads(1);
    let mut l = preset_learner(crate::Preset::Armor, 26);
    let mut batch = rl_batch(l.model());
    batch.final_rewards[2] = 1.0; // group 8 becomes informative too
    batch.anchors[1] = true; // group 7's reward-0 row came from the reference
    let m = l.train_step(&batch).expect("armor");
    assert_eq!(
        (m.groups_total, m.groups_kept),
        (2.0, 1.0),
        "group 8 has no anchor"
    );
    assert!(m.anchor_tokens > 0.0);
    // The automatic mixture ratio is the policy rows' share of the trained rows: 1 of 2.
    assert_eq!(m.armor_mix_ratio, 0.5);
}

#[test]
fn ds1_dapo_filters_uniform_groups_and_sampo_regularises_to_the_reference() {
    tch::set_num_threads(1);
    let mut l = preset_learner(crate::Preset::Dapo, 24);
    let batch = rl_batch(l.model());
    let m = l.train_step(&batch).expect("dapo");
    assert_eq!(
        (m.groups_total, m.groups_kept),
        (2.0, 1.0),
        "group 8 has constant rewards"
    );
    assert!(m.tokens == batch.n_tokens);
    let mut s = preset_learner(crate::Preset::Sampo, 25);
    let m = s.train_step(&batch).expect("sampo");
    assert!(
        m.kl_ref.abs() < 1e-6 && m.kl_loss.abs() < 1e-6,
        "the first step starts at the reference"
    );
    let m = s.train_step(&batch).expect("sampo 2");
    assert!(
        m.kl_ref > 0.0,
        "the policy has moved away from the reference"
    );
}

/// SAMPO follows ARL-Arena's trainer: the groups its generator's last dynamic-sampling try left
/// uniform fill the batch and are trained on (DAPO drops them, above), and π_old is recomputed
/// at the start of the update rather than taken from the behaviour log-probs.
#[test]
fn sampo_fills_with_uniform_groups_and_recomputes_pi_old() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        dynamic_sampling_cold_start: Some(0),
        ..LearnerConfig::for_preset(crate::Preset::Sampo)
    };
    let p = c.resolve();
    assert_eq!(p.ratio_base, crate::algo::RatioBase::Recompute);
    assert!(p.dynamic_sampling.is_some_and(|d| d.fill_with_uniform));
    let mut l = Learner::new(tiny(false, 27), c, 27).expect("learner");
    let batch = rl_batch(l.model());
    let m = l.train_step(&batch).expect("sampo");
    assert_eq!(
        (m.groups_total, m.groups_kept),
        (2.0, 2.0),
        "the uniform group 8 fills the batch"
    );
    assert_eq!(m.tokens, batch.n_tokens);
}

#[test]
fn sorl_reports_turn_ratios_and_sao_reports_the_dis_mask() {
    tch::set_num_threads(1);
    let mut l = preset_learner(crate::Preset::SoGrpo, 26);
    let batch = rl_batch(l.model());
    let m = l.train_step(&batch).expect("so_grpo");
    assert!(
        (m.turn_ratio_mean - 1.0).abs() < 1e-5,
        "on-policy turn ratios start at 1: {}",
        m.turn_ratio_mean
    );
    let c = LearnerConfig {
        lr: 3e-3,
        critic_warmup: Some(0),
        ..LearnerConfig::for_preset(crate::Preset::Sao)
    };
    let mut s = Learner::new(tiny(true, 27), c, 27).expect("sao");
    let m = s.train_step(&batch).expect("sao");
    assert_eq!(m.actor_steps, 2.0);
    assert_eq!(
        m.dis_masked_frac, 0.0,
        "on-policy ratios are inside the band"
    );
}

/// `rl_batch` with trajectory 0's (advantage > 0) behaviour log-probs lowered by `shift` on its
/// model tokens: its turn ratios are then exactly `exp(shift)`, every other row on-policy.
fn off_policy_first_row(model: &HfModel, shift: f64) -> TrainBatch {
    let mut batch = rl_batch(model);
    let lowered = batch.loss_mask.zeros_like();
    lowered.get(0).copy_(&(batch.loss_mask.get(0) * shift));
    batch.behaviour_logp = &batch.behaviour_logp - lowered;
    batch
}

/// SO-1 on a whole update: CTN fires exactly on the sample whose clipping bias
/// `3 tokens · (e^3 − 1.2) · 0.707 ≈ 40` exceeds δ = 5 (1 of 4 samples), and not on a sample
/// that is clipped with a bias `3 · (e^0.5 − 1.2) · 0.707 ≈ 0.95` below δ.
#[test]
fn so1_ctn_fires_exactly_on_the_samples_whose_clipping_bias_exceeds_delta() {
    tch::set_num_threads(1);
    let mut l = preset_learner(crate::Preset::SoGrpo, 26);
    let batch = off_policy_first_row(l.model(), 3.0);
    let m = l.train_step(&batch).expect("so_grpo");
    assert!(
        (m.ctn_trigger_frac - 0.25).abs() < 1e-12,
        "CTN must fire on exactly 1 of 4 samples: {}",
        m.ctn_trigger_frac
    );
    assert!(
        (m.turn_ratio_max - 3f64.exp()).abs() < 1e-3,
        "{}",
        m.turn_ratio_max
    );

    let mut l = preset_learner(crate::Preset::SoGrpo, 26);
    let batch = off_policy_first_row(l.model(), 0.5);
    let m = l.train_step(&batch).expect("so_grpo");
    assert!(m.clip_frac > 0.0, "the shifted sample is clipped");
    assert_eq!(m.ctn_trigger_frac, 0.0, "but its bias is below delta");
}

/// SAO's double-sided IS band (0.7, 6) against the behaviour log-probs, on a whole update: a
/// row whose ratio is e^3 or e^-3 is masked token for token (exactly its share of the model
/// tokens), one at e^0.25, which PPO's 0.2 clip would clip, is kept.
#[test]
fn sa1_sao_masks_exactly_the_rows_outside_its_band_on_both_sides() {
    tch::set_num_threads(1);
    let share = |batch: &TrainBatch| {
        batch.loss_mask.get(0).sum(Kind::Double).double_value(&[])
            / batch.loss_mask.sum(Kind::Double).double_value(&[])
    };
    for (shift, masked) in [(3.0, true), (-3.0, true), (0.25, false)] {
        let c = LearnerConfig {
            lr: 3e-3,
            minibatches: 1,
            critic_warmup: Some(0),
            ..LearnerConfig::for_preset(crate::Preset::Sao)
        };
        let mut s = Learner::new(tiny(true, 27), c, 27).expect("sao");
        let batch = off_policy_first_row(s.model(), shift);
        let m = s.train_step(&batch).expect("sao");
        let want = if masked { share(&batch) } else { 0.0 };
        assert!(
            (m.dis_masked_frac - want).abs() < 1e-12,
            "ratio e^{shift}: masked {} want {want}",
            m.dis_masked_frac
        );
    }
}

#[test]
fn lr1_recompute_ratio_base_ignores_stale_behaviour_logprobs() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        ratio_base: Some(crate::algo::RatioBase::Recompute),
        ..LearnerConfig::default()
    };
    let mut l = Learner::new(tiny(false, 28), c, 28).expect("learner");
    let mut batch = rl_batch(l.model());
    batch.behaviour_logp =
        batch.behaviour_logp.f_sub_scalar(0.5).expect("stale") * &batch.loss_mask;
    let m = l.train_step(&batch).expect("step");
    assert!(
        m.approx_kl.abs() < 1e-6 && m.clip_frac == 0.0,
        "the recomputed π_old equals the current weights"
    );
}

/// A learner with `ratio_base = recompute` and the given rollout correction.
fn corrected_learner(
    is: Option<crate::algo::rollout_correction::IsLevel>,
    rs: Option<crate::algo::rollout_correction::RejectLevel>,
) -> Learner {
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        ratio_base: Some(crate::algo::RatioBase::Recompute),
        rollout_is: is,
        rollout_rs: rs,
        ..LearnerConfig::default()
    };
    c.validate().expect("valid");
    Learner::new(tiny(false, 31), c, 31).expect("learner")
}

/// RCO-* on a whole update: the mismatch is measured whenever π_old is recomputed; token TIS
/// truncates exactly the shifted row's tokens (ratio e^3 > 2) and doubles its weight in the
/// loss (its advantage is positive, so the loss falls); on-policy it changes nothing (RCO-2).
#[test]
fn rc_truncated_is_weights_the_loss_by_the_rollout_ratio() {
    use crate::algo::rollout_correction::{IsLevel, RejectLevel};
    tch::set_num_threads(1);
    let share = |batch: &TrainBatch| {
        batch.loss_mask.get(0).sum(Kind::Double).double_value(&[])
            / batch.loss_mask.sum(Kind::Double).double_value(&[])
    };
    let mut plain = corrected_learner(None, None);
    let batch = off_policy_first_row(plain.model(), 3.0);
    let p = plain.train_step(&batch).expect("plain");
    assert!((p.rollout_logp_mismatch - 3.0 * share(&batch)).abs() < 1e-5);
    assert_eq!(p.rollout_is_truncated_frac, 0.0);

    let mut tis = corrected_learner(Some(IsLevel::Token), None);
    let t = tis.train_step(&batch).expect("tis");
    assert!((t.rollout_is_truncated_frac - share(&batch)).abs() < 1e-12);
    assert!(
        t.pg_loss < p.pg_loss - 1e-4,
        "row 0 (advantage > 0) weighs 2: {} vs {}",
        t.pg_loss,
        p.pg_loss
    );

    let mut rs = corrected_learner(None, Some(RejectLevel::Sequence));
    let r = rs.train_step(&batch).expect("rs");
    assert!((r.rollout_rs_rejected_frac - 1.0 / batch.len() as f64).abs() < 1e-12);

    let mut a = corrected_learner(None, None);
    let mut b = corrected_learner(Some(IsLevel::Token), Some(RejectLevel::Geometric));
    let on_policy = rl_batch(a.model());
    let mb = b.train_step(&on_policy).expect("b");
    a.train_step(&on_policy).expect("a");
    assert!(mb.rollout_logp_mismatch < 1e-5 && mb.rollout_is_truncated_frac == 0.0);
    assert_eq!(mb.rollout_rs_rejected_frac, 0.0);
    for ((_, wa), (_, wb)) in a
        .model()
        .named_parameters()
        .iter()
        .zip(b.model().named_parameters().iter())
    {
        let diff = (wa - wb).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "on-policy the correction is a no-op: {diff}");
    }
}

#[test]
fn rc_the_rollout_correction_needs_a_recomputed_pi_old() {
    use crate::algo::rollout_correction::IsLevel;
    let c = LearnerConfig {
        rollout_is: Some(IsLevel::Token),
        ..LearnerConfig::default()
    };
    let e = c.validate().expect_err("behaviour base").to_string();
    assert!(
        e.contains("learner.rollout_is") && e.contains("recompute"),
        "{e}"
    );
    let c = LearnerConfig {
        rollout_rs_threshold: Some(0.5),
        ..LearnerConfig::default()
    };
    let e = c.validate().expect_err("no rs").to_string();
    assert!(e.contains("learner.rollout_rs_threshold"), "{e}");
}

#[test]
fn kl_in_reward_uses_the_adaptive_controller_and_survives_restore() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        lr: 3e-3,
        minibatches: 1,
        kl_reward_coef: Some(0.1),
        kl_reward_target: Some(1e-3),
        ..LearnerConfig::for_preset(crate::Preset::Ppo)
    };
    let mut a = Learner::new(tiny(true, 29), c.clone(), 29).expect("learner");
    let batch = rl_batch(a.model());
    let first = a.train_step(&batch).expect("1");
    assert_eq!(first.kl_reward_beta, 0.1);
    let second = a.train_step(&batch).expect("2");
    assert!(
        second.kl_reward_beta < 0.1,
        "KL below target lowers β: {}",
        second.kl_reward_beta
    );
    let mut b = Learner::new(tiny(true, 30), c, 30).expect("b");
    b.restore(&a.state_files().expect("files"))
        .expect("restore");
    let (ma, mb) = (
        a.train_step(&batch).expect("a3"),
        b.train_step(&batch).expect("b3"),
    );
    assert_eq!(ma.kl_reward_beta, mb.kl_reward_beta);
    assert!(a.weights_safetensors().expect("a") == b.weights_safetensors().expect("b"));
}

/// MD-5 / LR-1: sequences sampled by the KV-cache sampler at temperature T, trained with the
/// learner set to the same T, start at ratio 1 (no clipping, zero approximate KL).
#[test]
fn md5_ppo_ratio_is_one_on_policy_at_any_temperature() {
    use crate::hf::{GenRequest, Sampler, SamplingParams};
    tch::set_num_threads(1);
    for t in [0.7, 1.0] {
        let mut l = Learner::new(tiny(false, 41), cfg(Algo::Grpo), 41).expect("learner");
        l.set_temperature(t).expect("temperature");
        let mut sampler = Sampler::new(l.model(), 4, 32).expect("sampler");
        let params = SamplingParams {
            temperature: t,
            max_new_tokens: 6,
            ..SamplingParams::default()
        };
        let reqs: Vec<GenRequest> = (0..4u64)
            .map(|i| GenRequest {
                prompt: vec![1, 3 + i as u32],
                params: params.clone(),
                seed: 100 + i,
            })
            .collect();
        let outs = sampler.generate(l.model(), reqs.clone()).expect("sample");
        let rows = reqs
            .iter()
            .zip(&outs)
            .enumerate()
            .map(|(i, (r, c))| {
                let mut tokens = r.prompt.clone();
                tokens.extend(&c.tokens);
                let mut mask = vec![0u8; r.prompt.len()];
                mask.extend(std::iter::repeat_n(1u8, c.tokens.len()));
                let mut logp = vec![0f32; r.prompt.len()];
                logp.extend(&c.logprobs);
                Row::new(tokens, mask, logp, (i % 2) as f32, 7)
            })
            .collect();
        let batch = TrainBatch::from_rows(rows, Device::Cpu).expect("batch");
        let m = l.train_step(&batch).expect("step");
        assert_eq!(m.clip_frac, 0.0, "T = {t}: ratio 1 on-policy");
        assert!(
            m.approx_kl.abs() < 1e-5,
            "T = {t}: approx kl {}",
            m.approx_kl
        );
        if t != 1.0 {
            // Control: a learner that ignores the temperature sees an off-policy ratio.
            let mut plain = Learner::new(tiny(false, 41), cfg(Algo::Grpo), 41).expect("learner");
            let m = plain.train_step(&batch).expect("step");
            assert!(
                m.approx_kl.abs() > 1e-4,
                "T = {t}: approx kl {}",
                m.approx_kl
            );
        }
    }
}

/// LS-1 in the learner: with a 2-update warm-up the first update runs at lr 0 (weights
/// unchanged, as the references' schedulers do), the second at lr/2, then lr.
#[test]
fn ls1_warmup_starts_at_zero_and_reaches_the_base_rate() {
    tch::set_num_threads(1);
    let c = LearnerConfig {
        lr_warmup_steps: Some(2),
        ..cfg(Algo::Grpo)
    };
    let mut l = Learner::new(tiny(false, 43), c, 43).expect("learner");
    l.set_lr_horizon(10);
    let batch = rl_batch(l.model());
    let before = l.weights_safetensors().expect("w");
    assert_eq!(l.current_lr(), 0.0);
    l.train_step(&batch).expect("update 0");
    assert!(
        l.weights_safetensors().expect("w") == before,
        "lr 0 moves nothing"
    );
    assert!((l.current_lr() - 1.5e-3).abs() < 1e-15);
    l.train_step(&batch).expect("update 1");
    assert!(l.weights_safetensors().expect("w") != before);
    assert!((l.current_lr() - 3e-3).abs() < 1e-15);
}

/// MB-1: an update accumulated over one-row micro-batches moves the weights as the same update
/// in one pass (global denominators), for token-mean, seq-mean and turn-record aggregations
/// and a joint critic.
#[test]
fn mb1_micro_batches_give_the_one_pass_update() {
    tch::set_num_threads(1);
    for preset in [
        crate::Preset::Grpo,
        crate::Preset::Gspo,
        crate::Preset::Sampo,
        crate::Preset::DrGrpo,
        crate::Preset::Ppo,
    ] {
        let learner = |micro: usize| {
            let c = LearnerConfig {
                lr: 3e-3,
                minibatches: 1,
                max_tokens_per_microbatch: micro,
                ..LearnerConfig::for_preset(preset)
            };
            let vh = c.resolve().needs_critic();
            Learner::new(tiny(vh, 51), c, 51).expect("learner")
        };
        let (mut one, mut micro) = (learner(0), learner(1));
        let batch = rl_batch(one.model());
        let a = one.train_step(&batch).expect("one pass");
        let b = micro.train_step(&batch).expect("micro-batches");
        let weights = |l: &Learner| -> Vec<f32> {
            l.model()
                .named_parameters()
                .into_iter()
                .flat_map(|(_, t)| Vec::<f32>::try_from(&t.flatten(0, -1)).expect("w"))
                .collect()
        };
        let diff = weights(&one)
            .iter()
            .zip(weights(&micro))
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "{preset:?}: weights differ by {diff}");
        assert!(
            (a.loss - b.loss).abs() < 1e-5,
            "{preset:?}: loss {} vs {}",
            a.loss,
            b.loss
        );
        assert!(
            (a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm.max(1.0),
            "{preset:?}"
        );
    }
}
