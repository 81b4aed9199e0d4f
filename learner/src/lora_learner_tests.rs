//! `Learner` with LoRA adapters (LR-7, LO-4, LO-5, MD-6) on a tiny model.

use tch::{Device, Kind, Tensor};

use crate::batch_tensors::TrainBatch;
use crate::hf::{HfModel, LoraConfig};
use crate::learner::Learner;
use crate::learner_config::{Algo, LearnerConfig};
use crate::learner_tests::{cfg, rl_batch, tiny};

fn lora(dropout: f64) -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout,
        target_modules: vec!["all-linear".into()],
        seed: 3,
    }
}

fn adapted(seed: u64, dropout: f64) -> HfModel {
    tiny(false, seed).with_lora(&lora(dropout)).expect("lora")
}

/// Every parameter's values, by name.
fn snapshot(m: &HfModel) -> Vec<(String, Tensor)> {
    m.named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect()
}

/// The tensor names of a safetensors buffer.
fn names(bytes: &[u8]) -> Vec<String> {
    let st = safetensors::SafeTensors::deserialize(bytes).expect("safetensors");
    st.names().into_iter().map(str::to_string).collect()
}

fn kl_cfg() -> LearnerConfig {
    LearnerConfig {
        reference_kl: true,
        epochs: 2,
        minibatches: 2,
        ..cfg(Algo::Grpo)
    }
}

#[test]
fn lr7_only_adapters_train_and_the_optimizer_holds_only_theirs() {
    tch::set_num_threads(1);
    let mut l = Learner::new(adapted(21, 0.0), kl_cfg(), 21).expect("learner");
    let before = snapshot(l.model());
    let batch = rl_batch(l.model());
    for _ in 0..3 {
        l.train_step(&batch).expect("step");
    }
    let mut moved = 0;
    for ((n, a), (_, b)) in before.iter().zip(snapshot(l.model())) {
        if crate::hf::lora::is_adapter(n) {
            moved += usize::from(!a.equal(&b));
        } else {
            assert!(a.equal(&b), "LO-4: base weight {n} changed");
        }
    }
    assert!(moved > 0, "the adapters trained");
    let files = l.state_files().expect("files");
    let file = |name: &str| &files.iter().find(|(n, _)| n == name).expect(name).1;
    let opt_names = names(file("optimizer.safetensors"));
    assert!(!opt_names.is_empty());
    assert!(
        opt_names
            .iter()
            .all(|n| n.contains(".lora_A.") || n.contains(".lora_B.")),
        "optimizer state only for adapters: {opt_names:?}"
    );
    let stored = names(file("model.safetensors"));
    assert_eq!(
        stored.len(),
        28,
        "the checkpoint holds the 2 x 14 adapters only"
    );
    let json: serde_json::Value = serde_json::from_slice(file("learner.json")).expect("json");
    assert!(json["lora_base"]["hash"]
        .as_str()
        .expect("hash")
        .starts_with("sha256:"));
    assert_eq!(json["lora_base"]["seed"], 21);
}

#[test]
fn lr7_reference_is_the_base_with_adapters_off() {
    tch::set_num_threads(1);
    let mut l = Learner::new(adapted(22, 0.0), kl_cfg(), 22).expect("learner");
    let batch = rl_batch(l.model());
    l.train_step(&batch).expect("1");
    l.train_step(&batch).expect("2");
    let toks = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    let reference = l.reference().expect("reference");
    let (r, _) = tch::no_grad(|| reference.forward(&toks)).expect("ref");
    let (b, _) = tch::no_grad(|| tiny(false, 22).forward(&toks)).expect("base");
    assert!(r.equal(&b), "the reference computes exactly the base");
    let (p, _) = tch::no_grad(|| l.model().forward(&toks)).expect("policy");
    assert!(!p.equal(&b), "while the policy moved");
    assert_eq!(
        reference.linear(0, 0).w.data_ptr(),
        l.model().linear(0, 0).w.data_ptr(),
        "no second copy of the base"
    );
}

#[test]
fn lr4_lora_with_dropout_resumes_bit_identically() {
    tch::set_num_threads(1);
    let c = kl_cfg();
    let mut a = Learner::new(adapted(23, 0.1), c.clone(), 23).expect("a");
    let batch = rl_batch(a.model());
    let sft =
        TrainBatch::from_sequences(&[(vec![1, 2, 3], vec![0, 1, 1])], Device::Cpu).expect("sft");
    a.sft_step(&sft, 1e-3).expect("sft");
    a.train_step(&batch).expect("a1");
    let files = a.state_files().expect("state");
    let mut b = Learner::new(adapted(23, 0.1), c.clone(), 23).expect("b");
    b.restore(&files).expect("restore");
    for l in [&mut a, &mut b] {
        l.train_step(&batch).expect("2");
        l.train_step(&batch).expect("3");
    }
    for ((n, x), (_, y)) in snapshot(a.model()).iter().zip(snapshot(b.model())) {
        assert!(x.equal(&y), "{n} differs after the resume");
    }
    // A learner on another base refuses the adapters.
    let mut other = Learner::new(adapted(24, 0.1), c.clone(), 23).expect("other");
    let e = other.restore(&files).expect_err("other base").to_string();
    assert!(e.contains("trained on base sha256:"), "{e}");
    // A full fine-tune refuses them too.
    let mut full = Learner::new(tiny(false, 23), c, 23).expect("full");
    assert!(full.restore(&files).is_err());
}

#[test]
fn lr7_lora_refuses_a_separate_critic_and_dropout_with_checkpointing() {
    let sao = Learner::new(adapted(25, 0.0), cfg(Algo::Sao), 1);
    let e = sao.err().expect("separate critic").to_string();
    assert!(e.contains("model.lora"), "{e}");
    let ckpt = LearnerConfig {
        activation_checkpointing: true,
        ..cfg(Algo::Grpo)
    };
    let e = Learner::new(adapted(25, 0.2), ckpt, 1)
        .err()
        .expect("ckpt")
        .to_string();
    assert!(e.contains("model.lora.dropout"), "{e}");
}

#[test]
fn md6_a_blank_lora_model_loads_published_adapters() {
    tch::set_num_threads(1);
    let spec = crate::model::ModelSpec {
        lora: Some(lora(0.0)),
        ..crate::model::test_models::tiny_spec(12, false, 26)
    };
    let mut l = Learner::new(spec.build().expect("build"), kl_cfg(), 26).expect("l");
    let batch = rl_batch(l.model());
    l.train_step(&batch).expect("step");
    let mut g = spec.blank().expect("blank");
    g.load_safetensors(&l.weights_safetensors().expect("w"))
        .expect("load");
    let toks = Tensor::from_slice(&[1i64, 2, 3, 4, 5]).view([1, 5]);
    let (x, _) = tch::no_grad(|| l.model().forward(&toks)).expect("x");
    let (y, _) = tch::no_grad(|| g.forward(&toks)).expect("y");
    assert!(
        x.equal(&y),
        "a generator's model computes the learner's logits"
    );
    assert_eq!(x.kind(), Kind::Float);
}
