//! `keel ckpt export` round trip (EXP-1..3): a real `keel train` run's checkpoint exported as a
//! Hugging Face folder is loaded by transformers (`AutoModelForCausalLM`, `AutoTokenizer`, the
//! chat template) as a user would, and its logits equal keel's own forward of the checkpoint.
//! Needs python3 with torch and transformers (scripts/setup.sh installs them).

use std::path::Path;
use std::process::Command;

use keel_integration::{checkpoint_file, head_lineage, keel_bin, python, run_train, tiny_config};
use tch::Tensor;

fn keel(args: &[&str]) -> std::process::Output {
    Command::new(keel_bin())
        .args(args)
        .output()
        .expect("run keel")
}

fn python_check(folder: &Path, text: &str, out: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_export.py");
    python(&[
        script.as_os_str(),
        folder.as_os_str(),
        text.as_ref(),
        out.as_os_str(),
    ]);
    serde_json::from_slice(&std::fs::read(out).expect("result")).expect("json")
}

#[test]
fn exported_checkpoint_loads_in_transformers_with_keels_logits() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("run");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config(4, 2, "sync", 0)).expect("config");
    run_train(&config, &root, &[]);
    let head = head_lineage(&root)
        .into_iter()
        .next()
        .expect("a checkpoint");
    let out = dir.path().join("export");
    let root_s = root.to_str().expect("utf8");
    let out_s = out.to_str().expect("utf8");

    let ok = keel(&["ckpt", "export", &head.id, out_s, "--run-root", root_s]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.join(f).exists(), "the export has no {f}");
    }
    // EXP-3: an existing folder is refused and left as it is.
    let again = keel(&["ckpt", "export", &head.id, out_s, "--run-root", root_s]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let missing = keel(&[
        "ckpt",
        "export",
        "nope",
        &format!("{out_s}-2"),
        "--run-root",
        root_s,
    ]);
    assert!(!missing.status.success());
    assert!(
        !dir.path().join("export-2").exists(),
        "nothing is written on error"
    );

    // transformers: tokenizer ids equal keel's encoding, logits equal keel's forward.
    let cfg = keel_actors::TrainConfig::from_toml(&tiny_config(4, 2, "sync", 0)).expect("cfg");
    let tokenizer = keel_envs::tokenizer_for(&cfg.env_config()).expect("tokenizer");
    let text = "task 3 + 4 * 5";
    let ids = tokenizer.encode(text).expect("encode");
    let got = python_check(&out, text, &dir.path().join("py.json"));
    assert_eq!(got["architecture"], "LlamaForCausalLM");
    let py_ids: Vec<u32> = serde_json::from_value(got["ids"].clone()).expect("ids");
    assert_eq!(py_ids, ids, "AutoTokenizer encodes as keel does");
    let sp = tokenizer.special();
    let mut chat = vec![sp.bos];
    chat.extend(&ids);
    chat.push(sp.agent);
    chat.extend(&ids);
    chat.push(sp.eot);
    let py_chat: Vec<u32> = serde_json::from_value(got["chat_ids"].clone()).expect("chat");
    assert_eq!(py_chat, chat, "the chat template renders keel's layout");

    let policy = keel_learner::policy_from_checkpoint(
        &checkpoint_file(&root, &head, "learner.json"),
        &checkpoint_file(&root, &head, "model.safetensors"),
        None,
    )
    .expect("policy");
    let toks: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    let (logits, _) =
        tch::no_grad(|| policy.forward(&Tensor::from_slice(&toks).view([1, -1]))).expect("forward");
    let ours = Vec::<Vec<f32>>::try_from(&logits.get(0)).expect("logits");
    let theirs: Vec<Vec<f32>> = serde_json::from_value(got["logits"].clone()).expect("logits");
    let max = ours
        .iter()
        .flatten()
        .zip(theirs.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max < 1e-4, "logits differ by {max}");
}
