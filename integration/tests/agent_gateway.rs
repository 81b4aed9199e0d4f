//! Issue 34: an agent written for the OpenAI API, run unchanged by `keel train` through the
//! agent gateway (`[env] name = "agent"`). The agent is examples/agents/calculator_agent.py, a
//! real Python program on the real `openai` client library; the model is a tiny random
//! Qwen2.5 with the real Qwen2.5-Instruct chat template (tools branch).
//!
//! Token exactness (AGT-1): every stored episode starts with exactly the ids transformers renders
//! for the agent's first call (its messages and tools, with the generation prompt), and its
//! sampled turns decode to exactly the answers the agent received, in order.

use std::path::Path;

use keel_integration::{family_models, python, run_train, stored_batches, train_output};

const ROWS: &[(&str, &str)] = &[
    ("What is 3 + 4?", "7"),
    ("What is 12 - 5?", "7"),
    ("What is 6 * 7?", "42"),
    ("What is 9 + 10?", "19"),
    ("What is 8 * 8?", "64"),
    ("What is 100 - 1?", "99"),
];

fn dataset(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("arith.jsonl");
    let lines: Vec<String> = ROWS
        .iter()
        .enumerate()
        .map(|(i, (q, a))| {
            serde_json::json!({
                "data_source": "arith",
                "prompt": [{"role": "system", "content": "You are a careful calculator."},
                           {"role": "user", "content": q}],
                "reward_model": {"ground_truth": a},
                "extra_info": {"index": i},
            })
            .to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).expect("dataset");
    path
}

fn agent_script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn config(dir: &Path, command: &[String], extra: &str) -> std::path::PathBuf {
    let data = dataset(dir);
    let command: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[run]
seed = 3
steps = 2
checkpoint_every = 2
device = "cpu"
threads = 1

[env]
name = "agent"

[env.dataset]
train_file = {data:?}
eval_file = {data:?}

[env.agent]
command = [{command}]
timeout_s = 120
{extra}

[model]
context_len = 1024

[sft]
steps = 0

[rollout]
tasks_per_batch = 2
group_size = 2
eval_tasks = 2
max_turn_tokens = 12
temperature = 1.0

[metrics]
enabled = false

[learner]
algo = "grpo"
"#,
            command = command.join(", ")
        ),
    )
    .expect("config");
    path
}

#[test]
fn an_openai_client_agent_trains_through_the_gateway_token_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let model = family_models().join("qwen2.5");
    let command = [
        "python3".to_string(),
        agent_script("../examples/agents/calculator_agent.py")
            .display()
            .to_string(),
        "--follow-up".into(),
        "--log".into(),
        logs.display().to_string(),
    ];
    let config = config(dir.path(), &command, "");
    let root = dir.path().join("run");
    run_train(&config, &root, &["--model", &model.to_string_lossy()]);

    let rendered = dir.path().join("rendered.json");
    python(&[
        agent_script("tests/python/agent_prompts.py").as_os_str(),
        model.as_os_str(),
        logs.as_os_str(),
        rendered.as_os_str(),
    ]);
    let logged: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&rendered).expect("rendered")).expect("json");
    let files = keel_learner::hf::tokenizer::folder_files(&model).expect("files");
    let codec = keel_actors::parts::codec_from_files(&files, &Default::default()).expect("codec");
    let episodes: Vec<_> = stored_batches(&root)
        .into_iter()
        .flat_map(|b| b.trajectories)
        .collect();
    assert!(!episodes.is_empty(), "no episode was stored");
    for t in &episodes {
        let first = t
            .loss_mask
            .iter()
            .position(|&m| m == 1)
            .expect("a sampled token");
        let mut answers = Vec::new();
        let mut i = first;
        while i < t.tokens.len() {
            let end = (i..t.tokens.len())
                .find(|&j| t.loss_mask[j] == 0)
                .unwrap_or(t.tokens.len());
            answers.push(codec.response_text(&t.tokens[i..end]).expect("decode"));
            i = (end..t.tokens.len())
                .find(|&j| t.loss_mask[j] == 1)
                .unwrap_or(t.tokens.len());
        }
        assert_eq!(t.turns.len(), 2, "the agent's follow-up is a second turn");
        let prompt: Vec<u64> = t.tokens[..first].iter().map(|&x| u64::from(x)).collect();
        let found = logged.iter().any(|l| {
            l["first"].as_array().is_some_and(|ids| {
                ids.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>() == prompt
            }) && l["answers"] == serde_json::json!(answers)
        });
        let same_prompt = logged.iter().filter(|l| {
            l["first"].as_array().is_some_and(|ids| {
                ids.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>() == prompt
            })
        });
        let same_answers = logged
            .iter()
            .filter(|l| l["answers"] == serde_json::json!(answers));
        assert!(
            found,
            "no agent saw this episode: first prompt {} tokens (logs with it: {}), answers {answers:?} (logs with them: {}); first logged prompt: {}",
            first,
            same_prompt.count(),
            same_answers.count(),
            logged[0]["first"]
        );
    }
}

#[test]
fn a_bad_agent_command_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = family_models().join("qwen2.5");
    let config = config(dir.path(), &[], "");
    let root = dir.path().join("run");
    let out = train_output(&config, &root, &["--model", &model.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("env.agent.command"), "{err}");
    assert!(!root.exists(), "nothing is written");
}
