use std::io::Write;

use super::*;
use crate::split::task_seed;

fn jsonl(lines: &[serde_json::Value]) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f
}

fn math_rows(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| {
            serde_json::json!({
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "system", "content": "answer with a number"},
                           {"role": "user", "content": format!("what is {i} plus 1 ?")}],
                "reward_model": {"ground_truth": (i + 1).to_string()},
            })
        })
        .collect()
}

fn config(train: &tempfile::NamedTempFile, eval: &tempfile::NamedTempFile) -> DatasetConfig {
    DatasetConfig {
        train_file: train.path().into(),
        eval_file: eval.path().into(),
        ..DatasetConfig::default()
    }
}

#[test]
fn ds_single_turn_rows_score_by_verifier() {
    let (train, eval) = (jsonl(&math_rows(5)), jsonl(&math_rows(2)));
    let data = Arc::new(Dataset::load(&config(&train, &eval)).unwrap());
    assert_eq!(data.max_turns, 1);
    let mut env = DatasetEnv::new(data.clone(), None);
    assert!(env.step("1").done, "terminal before the first reset (EN-4)");
    let prompt = env.reset(task_seed(Split::Train, 0));
    assert!(prompt.starts_with("what is "));
    assert_eq!(env.preamble()[0].content, "answer with a number");
    assert_eq!(env.task_type(), "openai/gsm8k");
    // openai/gsm8k rows get verl's gsm8k scorer (VF-3): the oracle writes `#### N` (DS-3).
    let oracle = env.oracle_action();
    let truth = data.train_rows()[data.train_row(0)].ground_truths[0].clone();
    assert_eq!(oracle, format!("#### {truth}"));
    let out = env.step(&format!("{truth} apples\n{oracle}"));
    assert!(out.done && out.reward == 1.0 && env.success());
    env.reset(task_seed(Split::Train, 0));
    let out = env.step(&format!("The answer is {truth}"));
    assert!(out.done && out.reward == 0.0 && !out.invalid_action && !env.success());
    // Held-out tasks are the eval file's rows in order, wrapping.
    assert_eq!(env.reset(task_seed(Split::Eval, 3)), "what is 1 plus 1 ?");
    // Every word the env shows is in its vocabulary (DS-4, EN-6).
    let vocab = env.vocabulary();
    for w in env.reset(task_seed(Split::Train, 2)).split_whitespace() {
        assert!(vocab.iter().any(|v| v == w), "{w}");
    }
}

#[test]
fn ds7_sampled_responses_are_read_by_their_visible_text() {
    let row = serde_json::json!({
        "data_source": "toolqa",
        "prompt": "what is 6 * 7 ?",
        "reward_model": {"ground_truth": "42"},
        "extra_info": {"tools": ["calculator"]},
    });
    let (train, eval) = (jsonl(std::slice::from_ref(&row)), jsonl(&[row]));
    let data = Arc::new(Dataset::load(&config(&train, &eval)).unwrap());
    let mut env = DatasetEnv::new(data, None);
    env.reset(task_seed(Split::Train, 0));
    let out = env.step_response("<think>I should multiply</think>\n calc 6 * 7 \n");
    assert_eq!(out.observation, "result 42");
    let out = env.step_response("<think>answer 41? no</think>  answer 42\n");
    assert!(out.done && out.reward == 1.0 && env.success());
    env.reset(task_seed(Split::Train, 0));
    let out = env.try_step_response("answer 42 <think>").unwrap();
    assert!(
        out.done && out.reward == 0.0,
        "an unclosed block is visible text"
    );
}

#[test]
fn ds_every_epoch_visits_every_row_once_and_snapshots_restore() {
    let (train, eval) = (jsonl(&math_rows(7)), jsonl(&math_rows(1)));
    let data = Arc::new(Dataset::load(&config(&train, &eval)).unwrap());
    let mut env = DatasetEnv::new(data.clone(), None);
    let epoch = |env: &mut DatasetEnv, e: u64| -> Vec<String> {
        (7 * e..7 * (e + 1))
            .map(|i| env.reset(task_seed(Split::Train, i)))
            .collect()
    };
    let (mut a, b) = (epoch(&mut env, 0), epoch(&mut env, 1));
    assert_ne!(a, b, "a second epoch is a new pass");
    let mut sorted_b = b.clone();
    a.sort();
    sorted_b.sort();
    assert_eq!(a, sorted_b, "each epoch visits every row once");
    // EN-1 across instances, and EN-7.
    let mut other = DatasetEnv::new(data, None);
    assert_eq!(other.reset(task_seed(Split::Train, 9)), b[2]);
    let snap = other.snapshot().unwrap();
    let mut third = DatasetEnv::new(
        Arc::new(Dataset::load(&config(&train, &eval)).unwrap()),
        None,
    );
    third.restore(&snap).unwrap();
    assert_eq!(third.oracle_action(), other.oracle_action());
    assert_eq!(third.anchor_state(), other.anchor_state());
}

#[test]
fn ds_tool_rows_are_multi_turn_episodes() {
    let row = serde_json::json!({
        "data_source": "toolqa",
        "prompt": "who is bado and what is 6 * 7 ?",
        "reward_model": {"ground_truth": "42"},
        "extra_info": {"tools": ["calculator", "search"],
                       "documents": ["bado born in gelu", "kuzo works for gelu"]},
    });
    let (train, eval) = (jsonl(std::slice::from_ref(&row)), jsonl(&[row]));
    let cfg = DatasetConfig {
        max_turns: 3,
        ..config(&train, &eval)
    };
    let data = Arc::new(Dataset::load(&cfg).unwrap());
    let mut env = DatasetEnv::new(data, None);
    assert_eq!(env.max_turns(), 3);
    env.reset(task_seed(Split::Train, 0));
    let out = env.step("search bado");
    assert_eq!(out.observation, "bado born in gelu");
    assert!(!out.done && !out.invalid_action);
    let out = env.step("calc 6 * 7");
    assert_eq!(out.observation, "result 42");
    let out = env.step("answer 42");
    assert!(out.done && out.reward == 1.0);
    env.reset(task_seed(Split::Train, 0));
    let out = env.step("calc six * 7");
    assert!(out.invalid_action && out.observation == "error invalid action");
    env.step("search nothing matches");
    let out = env.step("search bado");
    assert!(
        out.done && out.reward == 0.0,
        "the turn limit ends the episode (EN-3)"
    );
    let vocab = env.vocabulary();
    for w in ["result", "42", "no", "results", "gelu", "-99"] {
        assert!(vocab.iter().any(|v| v == w), "{w}");
    }
}

#[test]
fn ds_config_and_file_errors_are_clear() {
    let (train, eval) = (jsonl(&math_rows(2)), jsonl(&math_rows(2)));
    let cfg = DatasetConfig {
        verifier: "fuzzy".into(),
        ..config(&train, &eval)
    };
    assert_eq!(
        Dataset::load(&cfg).unwrap_err().to_string(),
        "invalid dataset config: verifier = fuzzy, expected auto, exact, numeric, choice, gsm8k or math; fix the `verifier` key"
    );
    let cfg = DatasetConfig {
        train_file: "/nowhere/train.csv".into(),
        ..config(&train, &eval)
    };
    assert_eq!(
        Dataset::load(&cfg).unwrap_err().to_string(),
        "dataset /nowhere/train.csv: unknown format; expected a .jsonl (JSON Lines) or .parquet file"
    );
    let mut bad = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(bad, "{}\n\n{{not json", math_rows(1)[0]).unwrap();
    let cfg = DatasetConfig {
        train_file: bad.path().into(),
        ..config(&train, &eval)
    };
    let err = Dataset::load(&cfg).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "dataset {}, row 3: not a JSON object",
            bad.path().display()
        )),
        "{err}"
    );
    let empty = tempfile::Builder::new()
        .suffix(".parquet")
        .tempfile()
        .unwrap();
    let cfg = DatasetConfig {
        eval_file: empty.path().into(),
        ..config(&train, &eval)
    };
    let err = Dataset::load(&cfg).unwrap_err().to_string();
    assert!(err.contains(": not a Parquet file"), "{err}");
}

#[test]
fn df_parquet_rows_written_by_pyarrow_read_like_jsonl() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let raw = file::read(&dir.join("gsm8k_train.parquet")).unwrap();
    assert_eq!(raw.format, file::Format::Parquet);
    assert_eq!(raw.rows.len(), 6);
    assert_eq!(
        file::shape(&raw.rows[0].value["reward_model"]),
        "{ground_truth: string, style: string}"
    );
    assert_eq!(
        file::shape(&raw.rows[0].value["prompt"]),
        "list<{content: string, role: string}>"
    );
    assert_eq!(raw.rows[0].value["prompt"][0]["role"], "user");
    assert_eq!(raw.rows[0].value["extra_info"]["index"], 0);
    let cfg = DatasetConfig {
        train_file: dir.join("gsm8k_train.parquet"),
        eval_file: dir.join("gsm8k_test.parquet"),
        ..DatasetConfig::default()
    };
    let data = Dataset::load(&cfg).unwrap();
    assert_eq!((data.train_rows().len(), data.eval_rows().len()), (6, 3));
    let row = &data.train_rows()[1];
    assert_eq!(row.verifier, Verifier::Gsm8k);
    assert_eq!(row.score("3 + 4 = 7 #### 7"), 1.0);
    assert_eq!(
        row.score("3 + 4 = 7"),
        0.0,
        "verl's strict gsm8k needs `#### N`"
    );
    assert!(row
        .prompt()
        .starts_with("Tom has 3 apples and buys 4 more."));
}
