//! `env.name = "dataset"` end to end through the `keel` binary: a verl-layout JSONL dataset
//! (system prompts, numeric answers, some rows with the calculator tool) trains the built-in
//! model; a run SIGKILLed mid-training resumes and ends bit-identical to an uninterrupted one
//! (the data frontier is the dataset position: no row trained twice or skipped); `keel data
//! check` shows a good file and names the file, row and field of a bad one; `env.dataset.reward.url`
//! drives a run through the reference reward service (a verl-signature reward function file),
//! batched and retried, and a service that is down, or whose reward function fits no verl
//! signature, stops the run before it starts. The reference service calls reward functions as
//! verl does (issue 31): by keyword, with the raw response, `--reward-kwargs`, either verl
//! signature, rewards passed through unclamped (a NaN fails the episode); SFT demonstrations
//! never reach it.

use std::path::Path;
use std::process::Command;

use keel_envs::dataset::{DatasetConfig, RewardConfig};
use keel_envs::{task_seed, Env, EnvConfig, EnvError, Split};
use keel_integration::{
    head_weights, keel_bin, kill_at_checkpoint, run_train, spawn_train, test_rt, train_output,
    write_sum_rows, PythonServer,
};
use keel_store::RunStore;

fn config(dir: &Path, steps: u64, reward: &str) -> std::path::PathBuf {
    let (train, eval) = (dir.join("train.jsonl"), dir.join("test.jsonl"));
    write_sum_rows(&train, 40, 0);
    write_sum_rows(&eval, 8, 100);
    let text = format!(
        r#"
[run]
name = "dataset"
seed = 5
steps = {steps}
checkpoint_every = 2
device = "cpu"
threads = 1

[env]
name = "dataset"

[env.dataset]
train_file = {train:?}
eval_file = {eval:?}
max_turns = 2

[env.dataset.reward]
{reward}

[model]
context_len = 64
n_layer = 1
d_model = 32
n_head = 2

[sft]
steps = 400
batch_size = 8
demos = 200

[rollout]
tasks_per_batch = 4
group_size = 4
max_turn_tokens = 4
eval_tasks = 8

[metrics]
enabled = false

[learner]
algo = "grpo"
"#
    );
    let path = dir.join("dataset.toml");
    std::fs::write(&path, text).expect("config");
    path
}

#[test]
fn dataset_run_trains_and_resumes_bit_identically_after_sigkill() {
    let rt = test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), 12, "");

    let clean = dir.path().join("clean");
    let clean_summary = dir.path().join("clean.json");
    run_train(&config, &clean, &[]);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&clean_summary).expect("summary")).expect("json");
    assert_eq!(summary["final_step"], 12);
    // The verifier rewards a trained policy: the SFT warm start solves held-out rows.
    let solved = summary["eval_before"].as_f64().expect("eval_before");
    assert!(solved > 0.2, "held-out success after SFT {solved}");

    let killed = dir.path().join("killed");
    let summary_path = dir.path().join("killed.json");
    kill_at_checkpoint(&mut spawn_train(&config, &killed, &[]), &killed, 4);
    run_train(&config, &killed, &[]);
    let resumed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary_path).expect("summary")).expect("json");
    assert!(resumed["resumed_from"].is_string(), "{resumed}");
    let (step_a, a) = head_weights(&rt, &clean);
    let (step_b, b) = head_weights(&rt, &killed);
    assert_eq!((step_a, step_b), (12, 12));
    assert!(
        a == b,
        "the resumed run's weights differ from the uninterrupted run's"
    );
}

#[test]
fn data_check_shows_a_good_file_and_names_bad_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.jsonl");
    write_sum_rows(&good, 5, 0);
    let out = Command::new(keel_bin())
        .args(["data", "check"])
        .arg(&good)
        .output()
        .expect("keel data check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "rows     5",
        "  prompt: list<{role: string, content: string}>",
        "  reward_model: {style: string, ground_truth: string}",
        "verifiers      numeric 5",
        "data sources   mini-gsm8k 5",
        "tools          calc 2 (rows with tools are multi-turn)",
        "context limit 64 (model.context_len): every prompt fits",
        "--- row 1 (mini-gsm8k, numeric verifier, ",
        "answer with one number",
        "what is 1 plus 2 ?",
        "--- ground truth: 3",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }

    let bad = dir.path().join("bad.jsonl");
    let rows = std::fs::read_to_string(&good).expect("read");
    let mut lines: Vec<String> = rows.lines().map(str::to_string).collect();
    lines[3] = r#"{"prompt": [{"role": "user", "content": "hi"}], "reward_model": {}}"#.into();
    std::fs::write(&bad, lines.join("\n")).expect("write");
    let out = Command::new(keel_bin())
        .args(["data", "check"])
        .arg(&bad)
        .output()
        .expect("keel data check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "error: dataset {}, row 4, field `reward_model.ground_truth`: missing",
            bad.display()
        )),
        "{err}"
    );
    assert!(err.contains("1 of 5 rows of"), "{err}");
}

/// `/stats` of the reference reward service.
fn stats(server: &PythonServer) -> serde_json::Value {
    let text = ureq::get(&format!("{}/stats", server.url))
        .call()
        .expect("stats")
        .body_mut()
        .read_to_string()
        .expect("body");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn reward_service_scores_a_run_like_the_builtin_verifier_batched_and_retried() {
    let rt = test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    // A user's reward function file with verl's signature: the last number must equal the
    // ground truth (what the built-in numeric verifier checks on these rows).
    let reward_fn = dir.path().join("my_reward.py");
    std::fs::write(
        &reward_fn,
        "import re\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    nums = re.findall(r'-?\\d+', solution_str)\n    return {'score': 1.0 if nums and int(nums[-1]) == int(ground_truth) else 0.0}\n",
    )
    .expect("reward fn");
    let server = PythonServer::start(
        "reward_server.py",
        &[
            "--reward-fn",
            reward_fn.to_str().expect("utf8"),
            "--flaky",
            "4",
        ],
    );
    let builtin = dir.path().join("builtin");
    std::fs::create_dir_all(&builtin).expect("dir");
    let by_verifier = config(&builtin, 6, "");
    run_train(&by_verifier, &builtin.join("run"), &[]);

    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).expect("dir");
    let extra = format!("url = {:?}\nbatch_wait_ms = 20\nretries = 4", server.url);
    let by_service = config(&served, 6, &extra);
    run_train(&by_service, &served.join("run"), &[]);
    let stats = stats(&server);
    eprintln!("reward service stats: {stats}");
    // Every final answer of every rollout and eval episode went through the service, in
    // batches (16 episodes of a step end together), and every 4th request's 503 was retried.
    assert!(stats["items"].as_u64().expect("items") >= 6 * 16, "{stats}");
    assert!(
        stats["largest_batch"].as_u64().expect("batch") > 1,
        "{stats}"
    );
    assert!(
        stats["requests"].as_u64().expect("requests") >= 4,
        "{stats}"
    );
    let (_, a) = head_weights(&rt, &builtin.join("run"));
    let (_, b) = head_weights(&rt, &served.join("run"));
    assert!(
        a == b,
        "the same rewards from the service and the verifier must train the same weights"
    );
}

#[test]
fn a_reward_service_that_is_down_or_refuses_its_function_stops_the_run_before_it_starts() {
    let misfit = PythonServer::start(
        "reward_server.py",
        &["--reward-fn", &test_data("reward_fn_misfit.py")],
    );
    let down = format!("http://127.0.0.1:{}", keel_integration::free_port());
    for (url, why) in [
        (down.as_str(), "GET /health failed: health:"),
        (
            misfit.url.as_str(),
            "GET /health failed: health: HTTP 503: {\"ok\": false, \"error\": \"reward function ",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = config(dir.path(), 2, &format!("url = {url:?}\nretries = 1"));
        let out = train_output(&cfg, &dir.path().join("run"), &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(&format!(
                "reward service at {url} (env.dataset.reward.url): {why}"
            )),
            "{err}"
        );
        let store = RunStore::open(dir.path().join("run").to_str().expect("utf8")).expect("open");
        let rt = test_rt();
        assert!(
            rt.block_on(store.latest_checkpoint())
                .expect("head")
                .is_none(),
            "nothing was trained"
        );
    }
    assert_eq!(
        stats(&misfit)["requests"],
        0,
        "no episode reached the service"
    );
}

/// A test file of `envs/tests/data`.
fn test_data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../envs/tests/data")
        .join(name)
        .to_str()
        .expect("utf8")
        .to_string()
}

/// A dataset env over the rows of `file` (train and eval), scored by the service at `url`.
fn served_env(file: &Path, url: &str) -> Result<Box<dyn Env>, EnvError> {
    let dataset = DatasetConfig {
        train_file: file.into(),
        eval_file: file.into(),
        shuffle: false,
        reward: RewardConfig {
            url: url.into(),
            retries: 1,
            ..RewardConfig::default()
        },
        ..DatasetConfig::default()
    };
    keel_envs::build_env(&EnvConfig {
        name: "dataset".into(),
        difficulty: 0,
        dataset: Some(dataset),
        ..EnvConfig::default()
    })
}

/// One row of `data_source` whose answer is 42, written to `dir/rows.jsonl`.
fn answer_42_row(dir: &Path, data_source: &str) -> std::path::PathBuf {
    let path = dir.join("rows.jsonl");
    let row = serde_json::json!({"data_source": data_source, "prompt": "what is 6 times 7 ?",
                                 "reward_model": {"ground_truth": "42"}});
    std::fs::write(&path, format!("{row}\n")).expect("rows");
    path
}

/// The reward of `response` as the one answer of a fresh episode.
fn reward_of(env: &mut Box<dyn Env>, response: &str) -> Result<f32, EnvError> {
    env.try_reset(task_seed(Split::Train, 0))?;
    let out = env.try_step_response(response)?;
    assert!(out.done, "{response:?} ends the episode");
    Ok(out.reward)
}

#[test]
fn reward_functions_are_called_by_keyword_with_the_raw_response_and_rewards_pass_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = answer_42_row(dir.path(), "probe");
    // compute_score(solution_str, ground_truth, data_source, extra_info=None, *, offset=0.0)
    // returns len(solution_str) + offset: only keyword calls fit its parameter order.
    let server = PythonServer::start(
        "reward_server.py",
        &[
            "--reward-fn",
            &test_data("reward_fn_keywords.py"),
            "--reward-kwargs",
            r#"{"offset": -100}"#,
        ],
    );
    let mut env = served_env(&rows, &server.url).expect("env");
    for response in [
        "answer 42\n",
        "  answer 42",
        "<think>6 * 7 = 42</think>\n\nanswer 42 ",
        "42",
    ] {
        // verl's solution_str: untrimmed, the leading `answer` word and reasoning included;
        // the reward_kwargs reach the function; -98 stays -98 (no clamp into [0, 1]).
        let want = response.chars().count() as f32 - 100.0;
        assert_eq!(
            reward_of(&mut env, response).expect("reward"),
            want,
            "{response:?}"
        );
        assert!(!env.success());
    }
    let err = reward_of(&mut env, " nan ")
        .expect_err("a NaN reward")
        .to_string();
    assert!(
        err.contains(&format!("reward service at {}", server.url))
            && err.contains("returned the non-finite reward nan"),
        "{err}"
    );
    assert_eq!(
        stats(&server)["items"],
        4,
        "the failed batch is not counted"
    );
}

#[test]
fn a_reward_file_with_verls_per_source_signature_scores_with_its_reward_kwargs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = answer_42_row(dir.path(), "openai/gsm8k");
    let file = test_data("reward_fn_gsm8k_signature.py");
    // compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0)
    let strict = PythonServer::start("reward_server.py", &["--reward-fn", &file]);
    let health: serde_json::Value = serde_json::from_str(
        &ureq::get(&format!("{}/health", strict.url))
            .call()
            .expect("health")
            .body_mut()
            .read_to_string()
            .expect("body"),
    )
    .expect("json");
    assert_eq!(health["signature"], "per-source", "{health}");
    let mut env = served_env(&rows, &strict.url).expect("env");
    for (response, want) in [
        ("so #### 42", 1.0),
        ("#### 41", 0.0),
        ("The answer is 42", 0.0),
    ] {
        assert_eq!(
            reward_of(&mut env, response).expect("reward"),
            want,
            "{response}"
        );
    }
    let flexible = PythonServer::start(
        "reward_server.py",
        &[
            "--reward-fn",
            &file,
            "--reward-kwargs",
            r#"{"method": "flexible", "format_score": -0.5, "score": 2}"#,
        ],
    );
    let mut env = served_env(&rows, &flexible.url).expect("env");
    for (response, want) in [("The answer is 41", -0.5), ("The answer is 42", 2.0)] {
        assert_eq!(
            reward_of(&mut env, response).expect("reward"),
            want,
            "{response}"
        );
    }
    assert!(env.success(), "a reward of 2 is a success (DS-5)");
}

#[test]
fn sft_demonstrations_never_reach_the_reward_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = dir.path().join("rows.jsonl");
    write_sum_rows(&rows, 12, 0);
    let server = PythonServer::start("reward_server.py", &[]);
    let mut env = served_env(&rows, &server.url).expect("env");
    // What the SFT warm start runs (actors::job make_demos): noised oracle demonstrations.
    let tokenizer = keel_envs::Tokenizer::for_env(env.as_ref());
    let seeds: Vec<u64> = (0..24).map(|i| task_seed(Split::Train, i)).collect();
    let demos =
        keel_envs::demonstrations(&mut [env.as_mut()], &tokenizer, &seeds, 0.5, 7).expect("demos");
    assert!(
        demos.iter().any(|d| d.success),
        "oracle answers score 1 (DS-3)"
    );
    assert!(
        demos.iter().any(|d| !d.success),
        "planted mistakes score 0 (DS-6)"
    );
    let s = stats(&server);
    assert_eq!(
        (s["requests"].clone(), s["items"].clone()),
        (0.into(), 0.into()),
        "{s}"
    );
    // A sampled response is the service's to score.
    env.try_reset(task_seed(Split::Train, 1)).expect("reset");
    let answer = env.oracle_action();
    env.try_step_response(&answer).expect("step");
    assert_eq!(stats(&server)["items"], 1);
}

#[test]
fn s3_dataset_files_are_synced_into_the_cache_and_trained_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = config(dir.path(), 2, "");
    let url = keel_integration::s3_root("dataset");
    let store = RunStore::open(&url).expect("s3");
    let rt = keel_integration::test_rt();
    for name in ["train.jsonl", "test.jsonl"] {
        let bytes = std::fs::read(dir.path().join(name)).expect("read");
        rt.block_on(store.put_object(name, bytes.into()))
            .expect("upload");
    }
    let text = std::fs::read_to_string(&local).expect("config");
    let text = text
        .replace(
            &format!("{:?}", dir.path().join("train.jsonl")),
            &format!("\"{url}/train.jsonl\""),
        )
        .replace(
            &format!("{:?}", dir.path().join("test.jsonl")),
            &format!("\"{url}/test.jsonl\""),
        );
    assert!(text.contains("s3://"), "{text}");
    let remote = dir.path().join("remote.toml");
    std::fs::write(&remote, text).expect("config");
    let cache = dir.path().join("cache");
    let out = Command::new(keel_bin())
        .args(["train", "--no-progress", "--config"])
        .arg(&remote)
        .arg("--run-root")
        .arg(dir.path().join("run"))
        .env("KEEL_MODEL_CACHE", &cache)
        .output()
        .expect("keel train");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let synced: Vec<String> = std::fs::read_dir(&cache)
        .expect("cache")
        .flat_map(|d| std::fs::read_dir(d.expect("entry").path()).expect("folder"))
        .map(|f| f.expect("file").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(synced.iter().any(|f| f == "train.jsonl"), "{synced:?}");
    assert!(synced.iter().any(|f| f == "test.jsonl"), "{synced:?}");
}
