//! The chat codec on the real chat templates of four model families (Qwen2.5-Instruct, Qwen3
//! with thinking on and off, Llama-3.1-Instruct, Llama-3.2-Instruct), each on a tiny random
//! model made by transformers with the family's special tokens and eos lists
//! (learner/tests/python/make_family_models.py, templates in learner/tests/data/templates).
//! Multi-turn episodes with user and tool observations are compared token for token with what
//! transformers renders (learner/tests/python/chat_reference.py): the whole conversation where
//! the template's history is stable, and verl's turn-by-turn method (each new turn rendered
//! alone, the template's preamble cut, CC-2) everywhere. Qwen3, whose template re-renders
//! earlier assistant turns, trains under `model.chat_template_check = "template"` and is
//! refused at start-up under `strict`. A Qwen3 folder runs `keel train --env calc` through
//! multi-turn episodes.

use std::path::Path;

use keel_actors::config::ModelSection;
use keel_actors::parts::codec_from_files;
use keel_integration::{family_models, python, run_train};
use keel_learner::hf::{ChatCodec, ChatMessage, TemplateCheck};
use serde_json::{json, Value};

fn model_section(kwargs: &Value, check: TemplateCheck) -> ModelSection {
    ModelSection {
        chat_template_kwargs: kwargs.as_object().cloned().unwrap_or_default(),
        chat_template_check: check,
        ..ModelSection::default()
    }
}

fn codec(family: &str, kwargs: &Value, check: TemplateCheck) -> Result<ChatCodec, String> {
    let dir = family_models().join(family);
    let files = keel_learner::hf::tokenizer::folder_files(&dir).map_err(|e| e.to_string())?;
    codec_from_files(&files, &model_section(kwargs, check)).map_err(|e| e.to_string())
}

/// The probe conversation: a user prompt, two assistant turns, a user and a tool observation.
const TURNS: [(&str, &str); 5] = [
    ("user", "What is 12 + 30?"),
    ("assistant", "calc 12 + 30"),
    ("user", "result 42"),
    ("assistant", "answer 42"),
    ("tool", "correct"),
];

/// transformers' renderings of the conversation (chat_reference.py).
fn reference(family: &str, kwargs: &Value) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let messages: Vec<Value> = TURNS
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let conv = dir.path().join("conv.json");
    let body = json!({"messages": messages, "kwargs": kwargs, "date": kwargs.get("date_string")});
    std::fs::write(&conv, body.to_string()).expect("write");
    let out = dir.path().join("out.json");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../learner/tests/python/chat_reference.py");
    python(&[
        script.as_os_str(),
        family_models().join(family).as_os_str(),
        conv.as_os_str(),
        out.as_os_str(),
    ]);
    serde_json::from_slice(&std::fs::read(out).expect("reference")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

/// The episode as keel's generators and SFT build it: prompt, demonstrated actions,
/// observations appended token-in/token-out (CC-1..3).
fn keel_episode(c: &ChatCodec) -> Vec<u32> {
    let mut tokens = c.prompt(&[], TURNS[0].1).expect("prompt");
    for pair in TURNS[1..].chunks(2) {
        tokens.extend(c.action(pair[0].1).expect("action"));
        if let Some((role, text)) = pair.get(1) {
            let obs = c
                .observation_messages(tokens.last().copied(), &[ChatMessage::new(role, text)])
                .expect("observation");
            tokens.extend(obs);
        }
    }
    tokens
}

/// CC-1..4 per family: the episode equals transformers' turn-by-turn rendering, and where the
/// template's history is stable the whole conversation's rendering too; the stop ids are the
/// union of the eos ids transformers' generate stops on (HT-4).
fn check_family(family: &str, kwargs: Value, history_stable: bool) {
    let c = codec(family, &kwargs, TemplateCheck::Template).expect("codec");
    let want = reference(family, &kwargs);
    let episode = keel_episode(&c);
    let decode = |t: &[u32]| c.tokenizer().decode(t, false).expect("decode");
    assert_eq!(
        decode(&episode),
        decode(&ids(&want["turns_ids"])),
        "{family} {kwargs}: turn by turn (text)"
    );
    assert_eq!(
        episode,
        ids(&want["turns_ids"]),
        "{family} {kwargs}: turn by turn"
    );
    if history_stable {
        assert_eq!(
            episode,
            ids(&want["full_ids"]),
            "{family}: the whole conversation"
        );
        codec(family, &kwargs, TemplateCheck::Strict).expect("strict accepts a stable history");
    } else {
        assert_ne!(
            episode,
            ids(&want["full_ids"]),
            "{family}: history is re-rendered"
        );
    }
    let mut stops = c.stop_ids().to_vec();
    assert_eq!(
        stops[0],
        c.end_of_turn(),
        "the end-of-turn token comes first"
    );
    stops.sort_unstable();
    assert_eq!(stops, ids(&want["eos_token_ids"]), "{family}: stop ids");
}

#[test]
fn qwen25_episodes_match_transformers() {
    check_family("qwen2.5", json!({}), true);
}

#[test]
fn llama31_episodes_match_transformers() {
    check_family("llama3.1", json!({}), true);
}

#[test]
fn llama32_episodes_match_transformers_with_a_pinned_date() {
    check_family("llama3.2", json!({"date_string": "26 Jul 2024"}), true);
}

#[test]
fn qwen3_thinking_off_and_on_append_turns_as_verl_does() {
    check_family("qwen3", json!({"enable_thinking": false}), false);
    check_family("qwen3", json!({}), false);
}

/// CC-5: Qwen3 drops the `<think>` block of earlier assistant turns once a user turn follows,
/// so `strict` refuses it at construction (naming the model and the key), `off` accepts it.
#[test]
fn qwen3_under_strict_is_refused_at_start_up() {
    let err = codec(
        "qwen3",
        &json!({"enable_thinking": false}),
        TemplateCheck::Strict,
    )
    .err()
    .expect("strict refuses Qwen3");
    assert!(
        err.contains("model.chat_template_check") && err.contains("</think>"),
        "{err}"
    );
    codec("qwen3", &json!({}), TemplateCheck::Off).expect("off accepts");
}

/// CC-3: a sampled Qwen3 turn's response keeps its reasoning text and stops at any stop id
/// (`<|endoftext|>` too, from generation_config.json); the env sees the text after it.
#[test]
fn responses_stop_at_every_eos_and_keep_reasoning() {
    let c = codec("qwen3", &json!({}), TemplateCheck::Template).expect("codec");
    let tok = c.tokenizer();
    let endoftext = tok.token_id("<|endoftext|>").expect("endoftext");
    assert!(c.stop_ids().contains(&endoftext));
    let mut sampled = tok
        .encode("<think>\nadd them\n</think>\n\nanswer 42", false)
        .expect("encode");
    sampled.push(endoftext);
    sampled.extend(tok.encode("trailing", false).expect("encode"));
    let response = c.response_text(&sampled).expect("text");
    assert_eq!(response, "<think>\nadd them\n</think>\n\nanswer 42");
    assert_eq!(keel_envs::action::visible(&response), "answer 42");
    // CC-2: after a turn that ended with another stop token, the end-of-turn token comes first.
    let obs = c
        .observation(Some(endoftext), "result 1")
        .expect("observation");
    assert_eq!(obs[0], c.end_of_turn());
}

/// HT-2: Llama 3.2's template dates its system header with `strftime_now` (today, as
/// transformers renders it) unless `date_string` pins it.
#[test]
fn llama32_renders_today_through_strftime_now() {
    let c = codec("llama3.2", &json!({}), TemplateCheck::Template).expect("codec");
    let text = c
        .tokenizer()
        .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
        .expect("render");
    let today = chrono::Local::now().format("%d %b %Y").to_string();
    assert!(text.contains(&format!("Today Date: {today}")), "{text}");
}

/// Issue 31, defect 1: a Qwen3 folder trains on `calc` through multi-turn episodes (the
/// first tool call used to stop the run), with thinking off through
/// `model.chat_template_kwargs`.
#[test]
fn qwen3_trains_through_multi_turn_calc_episodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("qwen3.toml");
    std::fs::write(
        &config,
        "[run]\nsteps = 2\ncheckpoint_every = 2\n\n[env]\nname = \"calc\"\ndifficulty = 2\n\n\
         [model]\ncontext_len = 256\n[model.chat_template_kwargs]\nenable_thinking = false\n\n\
         [sft]\nsteps = 4\n\n[rollout]\ntasks_per_batch = 2\ngroup_size = 2\neval_tasks = 2\n\
         max_turn_tokens = 12\n",
    )
    .expect("config");
    let root = dir.path().join("run");
    let model = family_models().join("qwen3");
    run_train(&config, &root, &["--model", &model.to_string_lossy()]);
    let turns: usize = keel_integration::stored_batches(&root)
        .iter()
        .flat_map(|b| b.trajectories.iter())
        .map(|t| t.turns.len())
        .max()
        .unwrap_or(0);
    assert!(turns >= 2, "some episode had a second turn ({turns})");
}
