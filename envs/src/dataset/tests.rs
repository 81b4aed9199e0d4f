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
        "dataset /nowhere/train.csv: unknown format; expected a .jsonl (JSON Lines), .json (JSON Lines or a JSON array of rows) or .parquet file"
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
        "{style: string, ground_truth: string}"
    );
    assert_eq!(
        file::shape(&raw.rows[0].value["prompt"]),
        "list<{role: string, content: string}>"
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

fn tool_rows() -> DatasetConfig {
    let file =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gsm8k_tool_rows.parquet");
    DatasetConfig {
        train_file: file.clone(),
        eval_file: file,
        shuffle: false,
        ..DatasetConfig::default()
    }
}

const CALL_72: &str = "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>";

#[test]
fn ds8_verl_tool_row_is_a_multi_turn_episode_with_verls_tool() {
    let data = Arc::new(Dataset::load(&tool_rows()).unwrap());
    assert_eq!(data.max_turns, 4, "verl tool rows are agentic (DS-2)");
    let row = &data.train_rows()[0];
    assert_eq!(row.functions.len(), 1);
    let mut env = DatasetEnv::new(data.clone(), None);
    let prompt = env.reset(task_seed(Split::Train, 0));
    assert!(prompt.starts_with("Natalia sold clips"), "{prompt}");
    assert!(env.preamble()[0]
        .content
        .contains("`calc_gsm8k_reward` tool"));
    let tools = env.tools();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["function"]["name"], "calc_gsm8k_reward");
    assert_eq!(tools[0]["function"]["parameters"]["required"][0], "answer");
    // A scripted model: reasoning and a call, then a wrong call, then the final answer.
    let out = env.step_response(&format!(
        "<think>48 + 24</think>\n48/2 = 24, 48 + 24 = 72.\n{CALL_72}"
    ));
    assert_eq!(out.observation, "Current parsed answer='72' reward=1.0");
    assert_eq!(out.observation_messages()[0].role, "tool");
    assert!(!out.done && out.reward == 0.0 && !out.invalid_action);
    let out = env.step_response("<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"71\"}}\n</tool_call>");
    assert_eq!(out.observation, "Current parsed answer='71' reward=0.0");
    let out = env.step_response("So the answer is 72.\n#### 72");
    assert!(out.done && out.reward == 1.0 && env.success());
    assert!(out.messages.is_empty(), "the final turn has no observation");
}

#[test]
fn ds8_malformed_and_unknown_calls_are_answered_as_verl_answers_them() {
    let data = Arc::new(Dataset::load(&tool_rows()).unwrap());
    let mut env = DatasetEnv::new(data, None);
    env.reset(task_seed(Split::Train, 0));
    // An unknown function: verl's KeyError text, as a tool message; the episode goes on.
    let out = env.step_response(
        "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"a\": 1}}\n</tool_call>",
    );
    assert_eq!(out.observation, "Error when executing tool: 'calculator'");
    assert!(out.invalid_action && !out.done && out.observation_messages()[0].role == "tool");
    // A call that does not parse is dropped by verl's Hermes parser: with no call left the
    // response is the final answer, scored by the row's verifier (no `#### N`: 0).
    let out = env.step_response("<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}\n</tool_call>");
    assert!(out.done && out.reward == 0.0 && !out.invalid_action && !env.success());
    // verl's `max_assistant_turns`: the last allowed turn is final whatever it holds.
    env.reset(task_seed(Split::Train, 0));
    for _ in 0..3 {
        assert!(!env.step_response(CALL_72).done);
    }
    let out = env.step_response(&format!("#### 72 {CALL_72}"));
    assert!(out.done && out.reward == 1.0, "{out:?}");
}

#[test]
fn ds8_oracle_calls_the_tool_then_answers_and_snapshots_keep_the_call() {
    let data = Arc::new(Dataset::load(&tool_rows()).unwrap());
    let mut env = DatasetEnv::new(data, None);
    env.reset(task_seed(Split::Train, 3));
    let call = env.oracle_action();
    assert_eq!(call, "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"950\"}}\n</tool_call>");
    assert_eq!(env.admissible_actions(), vec![call.clone()]);
    let first_anchor = env.anchor_state();
    let out = env.step(&call);
    assert_eq!(out.observation, "Current parsed answer='950' reward=1.0");
    assert_ne!(
        out.anchor_state, first_anchor,
        "a call changes the oracle (EN-8)"
    );
    let vocab = env.vocabulary();
    for w in call
        .split_whitespace()
        .chain(out.observation.split_whitespace())
    {
        assert!(vocab.iter().any(|v| v == w), "{w} (DS-4)");
    }
    let snap = env.snapshot().unwrap();
    let mut other = DatasetEnv::new(env.data.clone(), None);
    other.restore(&snap).unwrap();
    assert_eq!(other.oracle_action(), "#### 950");
    let out = other.step(&other.oracle_action());
    assert!(out.done && out.reward == 1.0 && other.success());
}

#[test]
fn dr6_verl_rows_keel_cannot_run_are_refused_by_name() {
    let base = || {
        serde_json::json!({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "how many?"}],
            "reward_model": {"ground_truth": "72"},
            "extra_info": {"need_tools_kwargs": true,
                           "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}},
        })
    };
    let parse = |v: &serde_json::Value| Row::parse(v, &RowSchema::default(), "rows.parquet", 2);
    // verl's gsm8k_multiturn_w_interaction.py rows name an interaction.
    let mut v = base();
    v["extra_info"]["interaction_kwargs"] =
        serde_json::json!({"name": "gsm8k", "query": "q", "ground_truth": "72"});
    assert_eq!(
        parse(&v).unwrap_err().to_string(),
        "dataset rows.parquet, row 2, field `extra_info.interaction_kwargs.name`: names the verl interaction \"gsm8k\", which keel does not have (verl's multi_turn.interaction_config_path); remove interaction_kwargs.name to train the row without one; keel runs verl's calc_gsm8k_reward (Gsm8kTool) as a function tool, and calculator and search as word tools in extra_info.tools"
    );
    // Without a name (verl's tool rows), verl's tool loop ignores them, and so does keel.
    v["extra_info"]["interaction_kwargs"] = serde_json::json!({"query": "q", "ground_truth": "72"});
    assert_eq!(parse(&v).unwrap().functions.len(), 1);
    let mut v = base();
    v["extra_info"]["tools_kwargs"]["search"] = serde_json::json!({"create_kwargs": {}});
    assert_eq!(
        parse(&v).unwrap_err().to_string(),
        "dataset rows.parquet, row 2, field `extra_info.tools_kwargs.search`: unknown verl tool \"search\"; keel runs verl's calc_gsm8k_reward (Gsm8kTool) as a function tool, and calculator and search as word tools in extra_info.tools"
    );
    let mut v = base();
    v["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"] = serde_json::json!({"create_kwargs": {}});
    assert!(parse(&v).unwrap_err().to_string().starts_with(
        "dataset rows.parquet, row 2, field `extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`: must be a non-empty string"
    ));
    let mut v = base();
    v["extra_info"]["tools_kwargs"] = serde_json::json!({"calc_gsm8k_reward": null});
    assert!(parse(&v).unwrap_err().to_string().contains(
        "field `extra_info.need_tools_kwargs`: is true but extra_info.tools_kwargs names no tool"
    ));
    // A tool message of an earlier turn in the prompt is accepted (DR-1).
    let mut v = base();
    v["prompt"] = serde_json::json!([
        {"role": "user", "content": "how many?"},
        {"role": "assistant", "content": CALL_72},
        {"role": "tool", "content": "Current parsed answer='72' reward=1.0"},
        {"role": "user", "content": "now answer"}]);
    assert_eq!(parse(&v).unwrap().preamble()[2].role, "tool");
}

#[test]
fn df_f3_bom_and_json_arrays_are_read() {
    let rows = math_rows(3);
    let mut bom = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    write!(bom, "\u{feff}").unwrap();
    for r in &rows {
        writeln!(bom, "{r}").unwrap();
    }
    let raw = file::read(bom.path()).unwrap();
    assert_eq!(raw.rows.len(), 3);
    assert_eq!(raw.rows[0].value, rows[0]);
    let mut array = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    write!(
        array,
        "\u{feff}{}",
        serde_json::to_string_pretty(&rows).unwrap()
    )
    .unwrap();
    let raw = file::read(array.path()).unwrap();
    assert_eq!(raw.format, file::Format::JsonArray);
    assert_eq!((raw.rows.len(), raw.rows[2].number), (3, 3));
    assert_eq!(raw.rows[1].value, rows[1]);
    let cfg = DatasetConfig {
        train_file: array.path().into(),
        eval_file: bom.path().into(),
        ..DatasetConfig::default()
    };
    assert_eq!(Dataset::load(&cfg).unwrap().train_rows().len(), 3);
    // JSON Lines in a .json file still read; a pretty-printed object says what keel reads.
    let mut lines = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    writeln!(lines, "{}\n{}", rows[0], rows[1]).unwrap();
    assert_eq!(
        file::read(lines.path()).unwrap().format,
        file::Format::JsonLines
    );
    let mut object = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    write!(
        object,
        "{}",
        serde_json::to_string_pretty(&rows[0]).unwrap()
    )
    .unwrap();
    let err = file::read(object.path()).unwrap_err().to_string();
    assert!(
        err.contains("row 1: not a JSON object on one line (JSON Lines)"),
        "{err}"
    );
    assert!(err.ends_with("keel reads a .json file as a JSON array of row objects or as JSON Lines (one JSON object per line)"), "{err}");
    let mut broken = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    write!(broken, "[{}, ", rows[0]).unwrap();
    let err = file::read(broken.path()).unwrap_err().to_string();
    assert!(
        err.contains("starts with `[` but is not one JSON array"),
        "{err}"
    );
}
