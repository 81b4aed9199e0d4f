//! verl's multi-turn tool rows (issue 31 item 6) through `keel train` on a real chat template:
//! the rows of `envs/tests/data/gsm8k_tool_rows.parquet` (written by verl's own
//! `gsm8k_multiturn_w_tool.py` logic, `make_gsm8k_tool_rows.py`) name verl's
//! `calc_gsm8k_reward` in `extra_info.tools_kwargs`. A tiny random Qwen2.5 folder (the real
//! Qwen2.5-Instruct template with its tools branch, made by
//! learner/tests/python/make_family_models.py) is warm-started on the oracle's demonstrations
//! (a Hermes `<tool_call>` of the tool, then `#### N`) and trained by RL; the stored episodes
//! show the tools block in the first prompt (DS-8, `Env::tools`), tool calls answered with
//! verl's tool text inside `<tool_response>` (a `tool` message), and a second turn.

use std::path::Path;

use keel_integration::{family_models, run_train};
use keel_learner::hf::HfTokenizer;

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../envs/tests/data/gsm8k_tool_rows.parquet")
}

#[test]
fn verl_tool_rows_train_as_multi_turn_episodes_with_the_tool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = family_models().join("qwen2.5");
    let config = dir.path().join("tools.toml");
    let data = fixture();
    std::fs::write(
        &config,
        format!(
            r#"
[run]
seed = 3
steps = 2
checkpoint_every = 2
device = "cpu"
threads = 1

[env]
name = "dataset"

[env.dataset]
train_file = {data:?}
eval_file = {data:?}
max_turns = 3

[model]
context_len = 2048

[sft]
steps = 80
batch_size = 8
lr = 0.01
demos = 32
noise = 0.0

[rollout]
tasks_per_batch = 2
group_size = 2
eval_tasks = 2
max_turn_tokens = 48
temperature = 0.05

[metrics]
enabled = false

[learner]
algo = "grpo"
"#
        ),
    )
    .expect("config");
    let root = dir.path().join("run");
    run_train(&config, &root, &["--model", &model.to_string_lossy()]);

    let tok = HfTokenizer::load(&model).expect("tokenizer");
    let batches = keel_integration::stored_batches(&root);
    let episodes: Vec<_> = batches.iter().flat_map(|b| b.trajectories.iter()).collect();
    assert!(!episodes.is_empty(), "RL stored no episode");
    for t in &episodes {
        let text = tok.decode(&t.tokens, false).expect("decode");
        // The template rendered the row's tool schema into the system prompt.
        assert!(
            text.contains("<tools>") && text.contains("\"calc_gsm8k_reward\""),
            "{text}"
        );
        assert!(text.contains("You should use the `calc_gsm8k_reward` tool"));
    }
    let multi: Vec<_> = episodes.iter().filter(|t| t.turns.len() >= 2).collect();
    assert!(
        !multi.is_empty(),
        "no episode had a second turn: {:?}",
        episodes
            .iter()
            .map(|t| tok.decode(&t.tokens, false).unwrap_or_default())
            .collect::<Vec<_>>()
    );
    for t in multi {
        let text = tok.decode(&t.tokens, false).expect("decode");
        // The call was answered by a tool message with verl's text (Qwen: <tool_response>).
        assert!(text.contains("<tool_call>"), "{text}");
        assert!(
            text.contains("<|im_start|>user\n<tool_response>\nCurrent parsed answer="),
            "{text}"
        );
    }
}
