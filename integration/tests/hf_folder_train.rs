//! `keel train --model DIR` on a real Hugging Face folder: a tiny random Qwen2 model made by
//! transformers (byte-level BPE tokenizer, ChatML template, tied embeddings) runs the SFT warm
//! start and RL steps on `calc`, checkpoints, resumes bit-identically after a SIGKILL, and its
//! export loads back in transformers with keel's logits. Episodes are rendered by the chat
//! codec exactly as transformers renders the same conversation (CC-1..3). Bad folders are
//! refused with an error naming the file or key, and nothing is written. SAO trains a separate
//! critic started from a folder (`--critic DIR`), checkpointed with its optimizer.
//! With `[model.lora]` only adapters train on the frozen folder; the run resumes
//! bit-identically after a SIGKILL and both exports (merged; unmerged for peft) give keel's
//! logits. Needs python3 with torch, transformers and peft (scripts/setup.sh installs them).

use std::path::{Path, PathBuf};
use std::process::Command;

use keel_integration::{
    checkpoint_file, checkpoints, keel_bin, kill_at_checkpoint, python, run_train, spawn_train,
    train_output,
};

/// The newest checkpoint of a local run root, if any.
fn newest(root: &Path) -> Option<keel_store::CheckpointManifest> {
    if !root.exists() {
        return None;
    }
    checkpoints(root).into_iter().max_by_key(|m| m.step)
}

/// The tiny random Qwen2 folder (made by transformers, learner/tests/python).
fn tiny_qwen2(dir: &Path) -> PathBuf {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../learner/tests/python/make_tiny_models.py");
    let out = dir.join("models");
    python(&[script.as_os_str(), out.as_os_str()]);
    out.join("qwen2")
}

const CONFIG: &str = r#"
[run]
name = "hf"
seed = 5
steps = 6
mode = "sync"
checkpoint_every = 2
device = "cpu"
threads = 1

[env]
name = "calc"
difficulty = 1

[model]
context_len = 256

[sft]
steps = 8
batch_size = 8
demos = 32

[rollout]
tasks_per_batch = 4
group_size = 4
max_turn_tokens = 12
eval_tasks = 8

[metrics]
enabled = false

[guard]
enabled = false

[learner]
algo = "grpo"
"#;

/// `path` as a command-line argument (test folders are UTF-8).
fn arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Trains into `root`, SIGKILLs the run after its step-2 checkpoint, resumes it to the end and
/// returns the final checkpoint.
fn kill_after_step_2_and_resume(
    config: &Path,
    model: &Path,
    root: &Path,
) -> keel_store::CheckpointManifest {
    let with_model = ["--model", arg(model)];
    kill_at_checkpoint(&mut spawn_train(config, root, &with_model), root, 2);
    run_train(config, root, &with_model);
    newest(root).expect("head")
}

/// `keel ckpt export ID OUT --run-root ROOT EXTRA...`, its output.
fn export_output(
    root: &Path,
    id: &str,
    out: &Path,
    extra: &[&std::ffi::OsStr],
) -> std::process::Output {
    Command::new(keel_bin())
        .args(["ckpt", "export", id])
        .arg(out)
        .arg("--run-root")
        .arg(root)
        .args(extra)
        .output()
        .expect("export")
}

/// Exports and requires success.
fn export(root: &Path, id: &str, out: &Path, extra: &[&std::ffi::OsStr]) {
    let st = export_output(root, id, out, extra);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
}

#[test]
fn a_hugging_face_folder_trains_resumes_and_exports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_qwen2(dir.path());
    let config = dir.path().join("hf.toml");
    std::fs::write(&config, CONFIG).expect("config");

    // Uninterrupted run.
    let clean = dir.path().join("clean");
    run_train(&config, &clean, &["--model", arg(&model)]);
    let head = newest(&clean).expect("a checkpoint");
    assert_eq!(head.step, 6);
    let learner: serde_json::Value =
        serde_json::from_slice(&checkpoint_file(&clean, &head, "learner.json")).expect("json");
    assert_eq!(learner["model"]["config"]["model_type"], "qwen2");

    // Killed after its step-2 checkpoint, then resumed: bit-identical weights.
    let killed = dir.path().join("killed");
    let resumed = kill_after_step_2_and_resume(&config, &model, &killed);
    assert_eq!(resumed.step, 6);
    assert!(
        checkpoint_file(&killed, &resumed, "model.safetensors")
            == checkpoint_file(&clean, &head, "model.safetensors"),
        "the resumed run's weights differ from the uninterrupted run's"
    );

    // The export loads in transformers with keel's logits (tied embeddings, BPE tokenizer).
    let out = dir.path().join("export");
    export(&clean, &head.id, &out, &[]);
    let inputs = dir.path().join("inputs.safetensors");
    let ids = tch::Tensor::from_slice(&[3i64, 17, 42, 99, 5, 250, 8, 1]).view([1, 8]);
    tch::Tensor::write_safetensors(&[("input_ids", &ids)], &inputs).expect("inputs");
    let logits_out = dir.path().join("logits.safetensors");
    let check =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../learner/tests/python/check_saved.py");
    python(&[
        check.as_os_str(),
        inputs.as_os_str(),
        logits_out.as_os_str(),
        out.as_os_str(),
    ]);
    let theirs = tch::Tensor::read_safetensors(&logits_out).expect("logits");
    let policy = keel_learner::policy_from_checkpoint(
        &checkpoint_file(&clean, &head, "learner.json"),
        &checkpoint_file(&clean, &head, "model.safetensors"),
        None,
    )
    .expect("policy");
    let (ours, _) = tch::no_grad(|| policy.forward(&ids)).expect("forward");
    let diff = (ours - &theirs[0].1).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "logits differ by {diff}");
}

#[test]
fn sao_trains_a_separate_critic_started_from_a_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_qwen2(dir.path());
    let config = dir.path().join("sao.toml");
    let text = CONFIG
        .replace("algo = \"grpo\"", "algo = \"sao\"\ncritic_warmup = 1")
        .replace("steps = 6", "steps = 2");
    std::fs::write(&config, text).expect("config");
    let root = dir.path().join("sao");
    let critic = ["--model", arg(&model), "--critic", arg(&model)];
    run_train(&config, &root, &critic);
    let head = newest(&root).expect("a checkpoint");
    let learner: serde_json::Value =
        serde_json::from_slice(&checkpoint_file(&root, &head, "learner.json")).expect("json");
    assert_eq!(learner["critic"]["value_head"], true);
    assert_eq!(
        learner["model"]["value_head"], false,
        "the policy has no value head"
    );
    let critic_file = dir.path().join("critic.safetensors");
    std::fs::write(
        &critic_file,
        checkpoint_file(&root, &head, "critic.safetensors"),
    )
    .expect("write");
    let names: Vec<String> = tch::Tensor::read_safetensors(&critic_file)
        .expect("critic")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.iter().any(|n| n == "score.weight"));
    assert!(names.iter().all(|n| n != "lm_head.weight"));
    checkpoint_file(&root, &head, "critic_optimizer.safetensors");

    // A critic folder for a preset without a separate critic is refused before anything runs.
    let grpo = dir.path().join("grpo");
    let out = Command::new(keel_bin())
        .args(["train", "--no-progress", "--algo", "grpo", "--config"])
        .arg(dir.path().join("sao.toml"))
        .args(critic)
        .arg("--run-root")
        .arg(&grpo)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("model.critic_path"),
        "{err}"
    );
    assert!(!grpo.exists(), "nothing is written");
}

#[test]
fn episodes_render_as_transformers_renders_the_conversation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_qwen2(dir.path());
    let files = keel_learner::hf::tokenizer::folder_files(&model).expect("files");
    let codec = keel_actors::parts::codec_from_files(&files, &Default::default()).expect("codec");
    let (prompt, action, obs) = ("task 3 + 4 * 5", "calc 3 + 4", "result 7");
    let out = dir.path().join("chat.json");
    python(&[
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/python/chat_ids.py")
            .as_os_str(),
        model.as_os_str(),
        prompt.as_ref(),
        action.as_ref(),
        obs.as_ref(),
        out.as_os_str(),
    ]);
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("json")).expect("json");
    let first = codec.prompt(&[], prompt).expect("prompt");
    let want_first: Vec<u32> = serde_json::from_value(want["prompt"].clone()).expect("ids");
    assert_eq!(first, want_first, "CC-1: the first prompt");
    let mut episode = first;
    episode.extend(codec.action(action).expect("action"));
    episode.extend(
        codec
            .observation(episode.last().copied(), obs)
            .expect("observation"),
    );
    let want_episode: Vec<u32> = serde_json::from_value(want["episode"].clone()).expect("ids");
    assert_eq!(
        episode, want_episode,
        "CC-2/3: turn by turn = the whole conversation"
    );
    let sampled = codec.action(action).expect("action");
    assert_eq!(codec.response_text(&sampled).expect("text"), action);
}

#[test]
fn bad_model_folders_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_qwen2(dir.path());
    let config = dir.path().join("hf.toml");
    std::fs::write(&config, CONFIG).expect("config");
    let copy = |name: &str, edit: &dyn Fn(&Path)| -> PathBuf {
        let to = dir.path().join(name);
        std::fs::create_dir_all(&to).expect("dir");
        for f in std::fs::read_dir(&model).expect("ls") {
            let f = f.expect("entry").path();
            std::fs::copy(&f, to.join(f.file_name().expect("name"))).expect("copy");
        }
        edit(&to);
        to
    };
    let no_config = copy("no-config", &|d| {
        std::fs::remove_file(d.join("config.json")).expect("rm")
    });
    let gpt2 = copy("gpt2", &|d| {
        let p = d.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
        v["model_type"] = "gpt2".into();
        std::fs::write(&p, v.to_string()).expect("write");
    });
    let no_template = copy("no-template", &|d| {
        std::fs::remove_file(d.join("chat_template.jinja")).ok();
        let p = d.join("tokenizer_config.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
        if let Some(m) = v.as_object_mut() {
            m.remove("chat_template");
        }
        std::fs::write(&p, v.to_string()).expect("write");
    });
    for (folder, says) in [
        (&no_config, "config.json"),
        (&gpt2, "model_type"),
        (&no_template, "chat template"),
    ] {
        let root = dir
            .path()
            .join(format!("run-{}", folder.display().to_string().len()));
        let out = train_output(&config, &root, &["--model", arg(folder)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} was accepted", folder.display());
        assert!(err.contains(says), "{}: {err}", folder.display());
        assert!(
            newest(&root).is_none(),
            "{}: a checkpoint was written",
            folder.display()
        );
    }
}

/// `--model s3://…`: the folder is synced into the local cache once (MC-1..3), reused by the
/// next run, and downloaded again when a cached file is damaged.
#[test]
fn an_s3_model_folder_is_synced_into_the_cache_and_verified() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_qwen2(dir.path());
    let url = keel_integration::s3_root("hf-model");
    let store = keel_store::RunStore::open(&url).expect("s3");
    let rt = keel_integration::test_rt();
    for f in std::fs::read_dir(&model).expect("ls") {
        let f = f.expect("entry").path();
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let bytes = std::fs::read(&f).expect("read");
        rt.block_on(store.put_object(&name, bytes.into()))
            .expect("upload");
    }
    let config = dir.path().join("hf.toml");
    std::fs::write(&config, CONFIG.replace("steps = 6", "steps = 2")).expect("config");
    let cache = dir.path().join("cache");
    let run = |name: &str| -> String {
        let root = dir.path().join(name);
        let out = Command::new(keel_bin())
            .args(["train", "--log-json", "--no-progress", "--config"])
            .arg(&config)
            .args(["--model", &url, "--run-root"])
            .arg(&root)
            .env("KEEL_MODEL_CACHE", &cache)
            .env("KEEL_LOG", "warn,keel=info")
            .output()
            .expect("keel train");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "keel train --model {url} failed:\n{err}"
        );
        assert_eq!(newest(&root).expect("checkpoint").step, 2);
        err
    };
    let synced = |log: &str| -> (u64, u64) {
        let event: serde_json::Value = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["fields"]["message"] == "folder synced" && v["fields"]["kind"] == "model")
            .expect("a sync event");
        let f = &event["fields"];
        (
            f["downloaded"].as_u64().expect("downloaded"),
            f["cached"].as_u64().expect("cached"),
        )
    };
    let files = std::fs::read_dir(&model).expect("ls").count() as u64;
    assert_eq!(synced(&run("first")), (files, 0));
    assert_eq!(synced(&run("second")), (0, files));
    let cached_dir = std::fs::read_dir(&cache)
        .expect("cache")
        .next()
        .expect("one folder")
        .expect("entry")
        .path();
    std::fs::write(cached_dir.join("model.safetensors"), b"damaged").expect("damage");
    assert_eq!(synced(&run("third")), (1, files - 1));
}

/// Keel's logits for `ids` from a checkpoint's model (adapters on the recorded base).
fn keel_logits(
    root: &Path,
    head: &keel_store::CheckpointManifest,
    ids: &tch::Tensor,
) -> tch::Tensor {
    let model = keel_learner::model_from_checkpoint(
        &checkpoint_file(root, head, "learner.json"),
        &checkpoint_file(root, head, "model.safetensors"),
        None,
    )
    .expect("model");
    tch::no_grad(|| model.forward(ids)).expect("forward").0
}

#[test]
fn lora_adapters_train_on_a_frozen_folder_resume_and_export_for_transformers_and_peft() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_qwen2(dir.path());
    let config = dir.path().join("lora.toml");
    let text = CONFIG.replace("steps = 6", "steps = 4").replace("steps = 8", "steps = 4")
        + "\n[model.lora]\nrank = 4\nalpha = 16.0\ndropout = 0.05\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]\n";
    std::fs::write(&config, text).expect("config");

    let clean = dir.path().join("clean");
    run_train(&config, &clean, &["--model", arg(&model)]);
    let head = newest(&clean).expect("a checkpoint");
    assert_eq!(head.step, 4);
    let learner: serde_json::Value =
        serde_json::from_slice(&checkpoint_file(&clean, &head, "learner.json")).expect("json");
    assert_eq!(learner["model"]["lora"]["rank"], 4);
    // Only adapters are stored: 2 layers x 3 modules x (A, B).
    let weights = checkpoint_file(&clean, &head, "model.safetensors");
    let st = safetensors::SafeTensors::deserialize(&weights).expect("st");
    let names = st.names();
    assert_eq!(names.len(), 12, "{names:?}");
    assert!(names
        .iter()
        .all(|n| n.contains(".lora_A.") || n.contains(".lora_B.")));
    let opt = checkpoint_file(&clean, &head, "optimizer.safetensors");
    let ost = safetensors::SafeTensors::deserialize(&opt).expect("opt");
    assert!(
        ost.names().iter().all(|n| n.contains(".lora_")),
        "optimizer state of adapters only"
    );

    // Killed after its step-2 checkpoint, then resumed: bit-identical adapters.
    let killed = dir.path().join("killed");
    let resumed = kill_after_step_2_and_resume(&config, &model, &killed);
    assert_eq!(resumed.step, 4);
    assert!(
        checkpoint_file(&killed, &resumed, "model.safetensors") == weights,
        "the resumed run's adapters differ from the uninterrupted run's"
    );

    // Both exports give keel's logits: merged in transformers, unmerged in peft; with the
    // adapters disabled peft computes the untouched base.
    let ids = tch::Tensor::from_slice(&[3i64, 17, 42, 99, 5, 250, 8, 1]).view([1, 8]);
    let inputs = dir.path().join("inputs.safetensors");
    tch::Tensor::write_safetensors(&[("input_ids", &ids)], &inputs).expect("inputs");
    let ours = keel_logits(&clean, &head, &ids);
    let merged = dir.path().join("merged");
    export(&clean, &head.id, &merged, &[]);
    let peft = dir.path().join("peft");
    export(&clean, &head.id, &peft, &["--peft".as_ref()]);
    assert!(peft.join("adapter_config.json").exists() && !peft.join("model.safetensors").exists());
    // Another base is refused with the two hashes; nothing is written.
    let wrong = dir.path().join("wrong");
    let other = model.with_file_name("qwen3");
    let st = export_output(
        &clean,
        &head.id,
        &wrong,
        &["--peft".as_ref(), "--base".as_ref(), other.as_os_str()],
    );
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(
        !st.status.success() && err.contains("adapters were trained on sha256:"),
        "{err}"
    );
    assert!(!wrong.exists(), "a refused export writes nothing");
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../learner/tests/python");
    let merged_out = dir.path().join("merged.safetensors");
    python(&[
        py.join("check_saved.py").as_os_str(),
        inputs.as_os_str(),
        merged_out.as_os_str(),
        merged.as_os_str(),
    ]);
    let peft_out = dir.path().join("peft.safetensors");
    python(&[
        py.join("check_peft.py").as_os_str(),
        inputs.as_os_str(),
        peft_out.as_os_str(),
        model.as_os_str(),
        peft.as_os_str(),
    ]);
    let read = |p: &Path, name: &str| {
        tch::Tensor::read_safetensors(p)
            .expect("logits")
            .into_iter()
            .find(|(n, _)| n == name)
            .expect(name)
            .1
    };
    let base_ours = {
        let base = keel_learner::hf::HfModel::load(
            &model,
            keel_learner::hf::LoadOptions::policy(tch::Device::Cpu, tch::Kind::Float),
        )
        .expect("base");
        tch::no_grad(|| base.forward(&ids)).expect("fwd").0
    };
    assert!(
        (&ours - &base_ours).abs().max().double_value(&[]) > 1e-6,
        "the adapters trained"
    );
    for (what, theirs) in [
        ("merged", read(&merged_out, "merged")),
        ("peft", read(&peft_out, "lora")),
        ("peft base", read(&peft_out, "base")),
    ] {
        let want = if what == "peft base" {
            &base_ours
        } else {
            &ours
        };
        let diff = (want - &theirs).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "{what} logits differ from keel's by {diff}");
    }
}
