//! Tests of the PATS library: spec constants, budgets, validation, pruning, rendering,
//! persistence, the rule reviewer and `Env::task_type`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::env::Env;
use crate::registry::{make_env, ENVS};
use crate::split::{task_seed, Split};
use crate::tokenizer::Tokenizer;

fn household_tok() -> Tokenizer {
    Tokenizer::for_env(make_env("household", 2).unwrap().as_ref())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn turn(action: &str, observation: &str, invalid: bool) -> TurnRecord {
    TurnRecord {
        action: action.into(),
        observation: observation.into(),
        invalid,
    }
}

fn episode(success: bool, actions: &[&str]) -> EpisodeRecord {
    EpisodeRecord {
        reward: if success { 1.0 } else { 0.0 },
        success,
        turns: actions
            .iter()
            .map(|a| turn(a, "you see nothing", false))
            .collect(),
    }
}

fn card(id: u64, task_type: &str, episodes: Vec<EpisodeRecord>) -> EvidenceCard {
    EvidenceCard::from_group(
        id,
        1,
        &GroupRecord {
            task_id: id,
            task_type: task_type.into(),
            episodes,
        },
    )
}

/// A request for `task_type` in `mode` over `bank`, with cards 0..n_cards (empty episodes).
fn request(mode: Mode, task_type: &str, bank: &Bank, n_cards: u64) -> ReviewRequest {
    ReviewRequest {
        step: 1,
        mode,
        task_type: task_type.into(),
        ema: 0.0,
        pressure: 0.0,
        budget: mode.budget(),
        cards: (0..n_cards)
            .map(|i| card(i, task_type, vec![episode(false, &["look"])]))
            .collect(),
        bank: bank.clone(),
        config: ScaffoldConfig::default(),
    }
}

fn add(kind: EntryKind, task_type: Option<&str>, text: &str) -> Edit {
    Edit::Add {
        kind,
        task_type: task_type.map(str::to_string),
        text: text.into(),
        cites: vec![0, 1],
    }
}

fn skill(text: &str) -> Edit {
    add(EntryKind::Skill, Some("clean"), text)
}

fn mistake(text: &str) -> Edit {
    add(EntryKind::Mistake, Some("clean"), text)
}

/// A bank holding `edits` for `clean`, added in one EXPAND-like review with an unlimited budget.
fn bank_with(edits: &[Edit]) -> Bank {
    let mut bank = Bank::new();
    let tok = household_tok();
    for e in edits {
        let mut req = request(Mode::Expand, "clean", &bank, 2);
        req.budget = Budget {
            skills: 9,
            general: 9,
            mistakes: 9,
            paired_adds: false,
        };
        let r = bank.apply(&req, std::slice::from_ref(e), &tok);
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    }
    bank
}

#[test]
fn spec_constants() {
    let cfg = ScaffoldConfig::default();
    assert_eq!(cfg.alpha, 0.1);
    assert_eq!(cfg.revise_threshold, 0.3);
    assert_eq!(cfg.compress_threshold, 0.7);
    assert_eq!(cfg.max_entries, 30);
    assert_eq!(cfg.max_tokens, 2000);
    assert_eq!(cfg.dedup_jaccard, 0.7);
    cfg.validate().unwrap();

    // EMA: starts at 0, α = 0.1.
    assert!(close(ema_update(0.0, 1.0, 0.1), 0.1));
    assert!(close(ema_update(0.1, 1.0, 0.1), 0.19));
    assert!(close(ema_update(0.5, 0.0, 0.1), 0.45));
    assert!(close(ema_update(0.2, 0.6, 0.1), 0.24));

    // Pressure = max(entries / 30, words / 2000).
    assert!(close(pressure(0, 0, &cfg), 0.0));
    assert!(close(pressure(15, 100, &cfg), 0.5));
    assert!(close(pressure(6, 1000, &cfg), 0.5));
    assert!(close(pressure(30, 0, &cfg), 1.0));
    assert!(close(pressure(1, 2000, &cfg), 1.0));

    // Modes at the boundaries.
    assert_eq!(Mode::choose(0.9, 1.0, &cfg), Mode::ForcedPrune);
    assert_eq!(Mode::choose(0.0, 1.0, &cfg), Mode::ForcedPrune);
    assert_eq!(Mode::choose(0.7, 0.999, &cfg), Mode::Compress);
    assert_eq!(Mode::choose(0.699_999, 0.0, &cfg), Mode::Revise);
    assert_eq!(Mode::choose(0.3, 0.0, &cfg), Mode::Revise);
    assert_eq!(Mode::choose(0.299_999, 0.0, &cfg), Mode::Expand);
    assert_eq!(Mode::choose(0.0, 0.0, &cfg), Mode::Expand);

    // Budgets: skills / general / mistakes.
    let b = |m: Mode| {
        let b = m.budget();
        (b.skills, b.general, b.mistakes, b.paired_adds)
    };
    assert_eq!(b(Mode::Expand), (2, 1, 1, false));
    assert_eq!(b(Mode::Revise), (1, 1, 1, false));
    assert_eq!(b(Mode::Compress), (1, 1, 0, true));
    assert_eq!(b(Mode::ForcedPrune), (0, 0, 0, false));
    assert_eq!(Mode::ForcedPrune.to_string(), "FORCED_PRUNE");
    assert_eq!(
        serde_json::to_string(&Mode::ForcedPrune).unwrap(),
        "\"FORCED_PRUNE\""
    );
}

#[test]
fn config_validation_names_the_field() {
    type Break = fn(&mut ScaffoldConfig);
    let cases: [(Break, &str); 8] = [
        (
            |c| c.reviewer_url = "https://reviewer.example".into(),
            "reviewer_url",
        ),
        (|c| c.reviewer_url = "reviewer:8080".into(), "reviewer_url"),
        (|c| c.alpha = 0.0, "alpha"),
        (|c| c.alpha = f64::NAN, "alpha"),
        (|c| c.compress_threshold = 0.2, "compress_threshold"),
        (|c| c.max_entries = 0, "max_entries"),
        (|c| c.dedup_jaccard = 1.5, "dedup_jaccard"),
        (|c| c.render_words = 0, "render_words"),
    ];
    for (break_it, field) in cases {
        let mut c = ScaffoldConfig::default();
        break_it(&mut c);
        let err = c.validate().unwrap_err();
        assert!(
            matches!(err, ScaffoldError::InvalidConfig { field: f, .. } if f == field),
            "{err}"
        );
        assert!(err.to_string().contains(&format!("fix the `{field}` key")));
    }
    let c: ScaffoldConfig = serde_json::from_str(r#"{"alpha": 0.2}"#).unwrap();
    assert_eq!(c.alpha, 0.2);
    assert_eq!(c.max_entries, 30);
    assert!(serde_json::from_str::<ScaffoldConfig>(r#"{"alpah": 0.2}"#).is_err());
}

#[test]
fn expand_budget_applies_two_of_three_skills() {
    let tok = household_tok();
    let mut bank = Bank::new();
    let req = request(Mode::Expand, "clean", &bank, 2);
    let edits = [
        skill("go to sinkbasin 1"),
        skill("open fridge 1"),
        skill("clean apple 1 with sinkbasin 1"),
        mistake("open microwave 1"),
        mistake("close drawer 1"),
    ];
    let r = bank.apply(&req, &edits, &tok);
    assert_eq!(r.applied.len(), 3);
    assert_eq!(r.rejected.len(), 2);
    assert_eq!(r.rejected[0].edit, edits[2]);
    assert_eq!(
        r.rejected[0].reason,
        RejectReason::OverBudget {
            mode_budget: "skills",
            limit: 2
        }
    );
    assert_eq!(
        r.rejected[1].reason,
        RejectReason::OverBudget {
            mode_budget: "mistakes",
            limit: 1
        }
    );
    assert_eq!(bank.len(), 3);

    // Of the skills at most one may be general.
    let mut bank = Bank::new();
    let edits = [
        add(EntryKind::Skill, None, "look"),
        add(EntryKind::Skill, None, "inventory"),
    ];
    let r = bank.apply(&req, &edits, &tok);
    assert_eq!(r.applied.len(), 1);
    assert_eq!(
        r.rejected[0].reason,
        RejectReason::OverBudget {
            mode_budget: "general",
            limit: 1
        }
    );

    // FORCED_PRUNE adds nothing; COMPRESS adds only paired with an update or delete.
    let mut bank = bank_with(&[skill("go to sinkbasin 1")]);
    let r = bank.apply(
        &request(Mode::ForcedPrune, "clean", &bank, 2),
        &[skill("look")],
        &tok,
    );
    assert!(r.applied.is_empty());
    let r = bank.apply(
        &request(Mode::Compress, "clean", &bank, 2),
        &[skill("look")],
        &tok,
    );
    assert_eq!(r.rejected[0].reason, RejectReason::Unpaired);
    let id = bank.entries()[0].id;
    let r = bank.apply(
        &request(Mode::Compress, "clean", &bank, 2),
        &[skill("look"), Edit::Delete { id }],
        &tok,
    );
    assert_eq!(r.applied.len(), 2, "{:?}", r.rejected);
    assert_eq!(r.applied[0].edit, Edit::Delete { id });
    assert_eq!(bank.entries()[0].text, "look");
    let r = bank.apply(
        &request(Mode::Compress, "clean", &bank, 2),
        &[mistake("inventory")],
        &tok,
    );
    assert_eq!(
        r.rejected[0].reason,
        RejectReason::OverBudget {
            mode_budget: "mistakes",
            limit: 0
        }
    );
}

#[test]
fn jaccard_dedup_rejects_near_duplicates_shown_together() {
    assert!(close(word_jaccard("a b c", "a b c"), 1.0));
    assert!(close(word_jaccard("a b", "c d"), 0.0));
    assert!(close(word_jaccard("", ""), 1.0));
    assert!(close(
        word_jaccard("take apple 1 from fridge 1", "take apple 2 from fridge 1"),
        5.0 / 6.0
    ));

    let tok = household_tok();
    let mut bank = bank_with(&[skill("take apple 1 from fridge 1")]);
    let req = request(Mode::Expand, "clean", &bank, 2);
    let r = bank.apply(
        &req,
        &[
            skill("take apple 2 from fridge 1"),
            mistake("take   apple 1 from fridge 1"),
            add(EntryKind::Skill, None, "take apple 1 from fridge 1 go"),
        ],
        &tok,
    );
    assert!(r.applied.is_empty());
    assert_eq!(r.rejected.len(), 3);
    for rej in &r.rejected {
        assert!(
            matches!(rej.reason, RejectReason::Duplicate { of: 0, similarity } if similarity >= 0.7),
            "{rej:?}"
        );
    }
    // Below the threshold, or for a type it never renders with: not a duplicate.
    let r = bank.apply(&req, &[skill("take apple 1 from cabinet 2")], &tok);
    assert_eq!(r.applied.len(), 1, "{:?}", r.rejected);
    let r = bank.apply(
        &request(Mode::Expand, "heat", &bank, 2),
        &[add(
            EntryKind::Skill,
            Some("heat"),
            "take apple 1 from fridge 1",
        )],
        &tok,
    );
    assert_eq!(r.applied.len(), 1, "{:?}", r.rejected);
    // An update may not turn an entry into a duplicate of another one.
    let r = bank.apply(
        &request(Mode::Revise, "clean", &bank, 2),
        &[Edit::Update {
            id: 1,
            text: "take apple 1 from fridge 1".into(),
            cites: vec![0],
        }],
        &tok,
    );
    assert!(matches!(
        r.rejected[0].reason,
        RejectReason::Duplicate { of: 0, .. }
    ));
}

#[test]
fn text_vocabulary_and_citation_checks() {
    let tok = household_tok();
    let mut bank = Bank::new();
    let req = request(Mode::Expand, "clean", &bank, 2);
    let cases = [
        (
            skill("go to the garage"),
            RejectReason::UnknownWord {
                word: "garage".into(),
            },
        ),
        (
            skill("go to <eot> fridge 1"),
            RejectReason::UnknownWord {
                word: "<eot>".into(),
            },
        ),
        (skill("   "), RejectReason::EmptyText),
        (skill("tip"), RejectReason::EmptyText),
        (
            skill(&"look ".repeat(17)),
            RejectReason::TooLong { words: 17, max: 16 },
        ),
        (
            Edit::Add {
                kind: EntryKind::Skill,
                task_type: Some("clean".into()),
                text: "look".into(),
                cites: vec![],
            },
            RejectReason::NoCites,
        ),
        (
            Edit::Add {
                kind: EntryKind::Skill,
                task_type: Some("clean".into()),
                text: "look".into(),
                cites: vec![0, 7],
            },
            RejectReason::UnknownCard { id: 7 },
        ),
        (
            add(EntryKind::Skill, Some("heat"), "look"),
            RejectReason::WrongTaskType {
                task_type: "heat".into(),
                reviewing: "clean".into(),
            },
        ),
        (
            Edit::Delete { id: 42 },
            RejectReason::UnknownEntry { id: 42 },
        ),
    ];
    for (edit, want) in cases {
        let r = bank.apply(&req, std::slice::from_ref(&edit), &tok);
        assert!(r.applied.is_empty(), "{edit:?}");
        assert_eq!(r.rejected[0].reason, want, "{edit:?}");
        assert_eq!(bank.version(), 0, "nothing applied, no new version");
    }
    // A leading marker of the entry's own kind is dropped; whitespace is normalised.
    let r = bank.apply(&req, &[mistake("  avoid  open\tfridge 1 ")], &tok);
    assert_eq!(r.applied.len(), 1);
    assert_eq!(bank.entries()[0].text, "open fridge 1");
    assert_eq!(bank.entries()[0].rendered(), "avoid open fridge 1");
    // Entries of another type cannot be touched from this review.
    let mut bank = bank_with(&[skill("look")]);
    let r = bank.apply(
        &request(Mode::Compress, "heat", &bank, 2),
        &[Edit::Delete { id: 0 }],
        &tok,
    );
    assert!(matches!(
        r.rejected[0].reason,
        RejectReason::WrongTaskType { .. }
    ));
    let r = bank.apply(
        &request(Mode::Revise, "clean", &bank, 2),
        &[Edit::Update {
            id: 0,
            text: "look".into(),
            cites: vec![1],
        }],
        &tok,
    );
    assert_eq!(r.rejected[0].reason, RejectReason::Unchanged);
    // Bank::check_vocabulary catches a bank of another env.
    assert!(bank.check_vocabulary(&tok).is_ok());
    let err = bank.check_vocabulary(&Tokenizer::calc()).unwrap_err();
    assert_eq!(
        err,
        ScaffoldError::UnknownWord {
            entry: 0,
            word: "look".into()
        }
    );
}

#[test]
fn versions_are_monotonic_and_entries_record_them() {
    let tok = household_tok();
    let mut bank = Bank::new();
    assert_eq!(bank.version(), 0);
    let r = bank.apply(
        &request(Mode::Expand, "clean", &bank, 2),
        &[skill("look"), mistake("open fridge 1")],
        &tok,
    );
    assert_eq!(r.version, 1);
    assert!(bank
        .entries()
        .iter()
        .all(|e| e.added_version == 1 && e.updated_version == 1));
    let r = bank.apply(
        &request(Mode::Revise, "clean", &bank, 2),
        &[Edit::Update {
            id: 0,
            text: "inventory".into(),
            cites: vec![1],
        }],
        &tok,
    );
    assert_eq!(r.version, 2);
    let e = bank.entry(0).unwrap();
    assert_eq!((e.added_version, e.updated_version), (1, 2));
    assert_eq!(e.cites, vec![1]);
    bank.apply(
        &request(Mode::Compress, "clean", &bank, 2),
        &[Edit::Delete { id: 0 }],
        &tok,
    );
    assert_eq!(bank.version(), 3);
    bank.apply(
        &request(Mode::Expand, "clean", &bank, 2),
        &[skill("go to desk 1")],
        &tok,
    );
    // Ids are never reused.
    assert_eq!(bank.entries().last().unwrap().id, 2);
    assert_eq!(bank.entries().last().unwrap().added_version, 4);
}

#[test]
fn fallback_prune_removes_newest_first() {
    let mut bank = bank_with(&[
        skill("look"),
        skill("inventory"),
        mistake("open fridge 1"),
        skill("go to desk 1"),
        mistake("close fridge 1"),
    ]);
    let cfg = ScaffoldConfig {
        max_entries: 3,
        ..ScaffoldConfig::default()
    };
    let v = bank.version();
    assert!(bank.pressure(&cfg) >= 1.0);
    assert_eq!(bank.prune_newest(&cfg), vec![4, 3, 2]);
    assert!(bank.pressure(&cfg) < 1.0);
    assert_eq!(bank.version(), v + 1);
    let ids: Vec<u64> = bank.entries().iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![0, 1]);
    assert!(bank.prune_newest(&cfg).is_empty());
    assert_eq!(bank.version(), v + 1, "nothing pruned, same version");

    // By words too: 2 + 2 + 4 words against max_tokens 4.
    let mut bank = bank_with(&[skill("look"), skill("inventory"), mistake("open fridge 1")]);
    let cfg = ScaffoldConfig {
        max_tokens: 4,
        ..ScaffoldConfig::default()
    };
    assert_eq!(bank.prune_newest(&cfg), vec![2, 1]);
}

/// A reviewer that proposes nothing.
struct Idle;

impl Reviewer for Idle {
    fn name(&self) -> &str {
        "idle"
    }
    fn review(&mut self, _: &ReviewRequest) -> Result<Vec<Edit>, ScaffoldError> {
        Ok(vec![])
    }
}

/// A reviewer that always fails.
struct Broken;

impl Reviewer for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn review(&mut self, _: &ReviewRequest) -> Result<Vec<Edit>, ScaffoldError> {
        Err(ScaffoldError::Reviewer {
            reviewer: "broken".into(),
            reason: "timed out".into(),
        })
    }
}

fn group(task_id: u64, task_type: &str, successes: usize, n: usize) -> GroupRecord {
    GroupRecord {
        task_id,
        task_type: task_type.into(),
        episodes: (0..n)
            .map(|i| episode(i < successes, &["go to sinkbasin 1", "look"]))
            .collect(),
    }
}

#[test]
fn controller_prunes_newest_after_an_idle_forced_prune_review() {
    let cfg = ScaffoldConfig {
        max_entries: 2,
        ..ScaffoldConfig::default()
    };
    let bank = bank_with(&[skill("look"), skill("inventory"), mistake("open fridge 1")]);
    let mut state = ScaffoldState::new();
    state.bank = bank;
    state.next_card_id = 2;
    let mut c =
        ScaffoldController::from_state(cfg, household_tok(), Box::new(Idle), state).unwrap();
    let r = c.observe_step(5, &[group(1, "clean", 0, 4)]).unwrap();
    assert_eq!(r.types[0].mode, Mode::ForcedPrune);
    assert_eq!(r.types[0].pruned, vec![2, 1]);
    assert_eq!(c.bank().len(), 1);
    assert!(r.pressure < 1.0);
    assert!(r.changed());
}

#[test]
fn render_respects_type_order_and_word_budget() {
    let empty = Bank::new();
    let r = empty.render("clean", 40);
    assert_eq!(
        r,
        RenderedScaffold {
            text: String::new(),
            version: 0,
            words: 0
        }
    );
    assert_eq!(r.prepend_to("task x"), "task x");

    let tok = household_tok();
    let mut bank = Bank::new();
    bank.apply(
        &request(Mode::Expand, "clean", &bank, 2),
        &[
            mistake("open fridge 1"),
            skill("go to sinkbasin 1"),
            add(EntryKind::Skill, None, "look"),
        ],
        &tok,
    );
    bank.apply(
        &request(Mode::Expand, "heat", &bank, 2),
        &[add(EntryKind::Skill, Some("heat"), "go to microwave 1")],
        &tok,
    );
    let r = bank.render("clean", 40);
    assert_eq!(r.text, "tip go to sinkbasin 1 tip look avoid open fridge 1");
    assert_eq!(r.words, 11);
    assert_eq!(r.version, bank.version());
    tok.encode(&r.text).unwrap();
    assert_eq!(
        bank.render("heat", 40).text,
        "tip look tip go to microwave 1"
    );
    assert_eq!(bank.render("examine", 40).text, "tip look");
    // Cut at entry granularity: 5 + 2 words fit in 9, the 4-word mistake does not.
    let r = bank.render("clean", 9);
    assert_eq!(r.text, "tip go to sinkbasin 1 tip look");
    assert_eq!(r.words, 7);
    assert_eq!(bank.render("clean", 4).text, "");
    assert_eq!(
        r.prepend_to("task put a clean egg in shelf 1"),
        "tip go to sinkbasin 1 tip look task put a clean egg in shelf 1"
    );
}

#[test]
fn state_json_round_trip_and_corruption_errors() {
    let mut c =
        ScaffoldController::with_rule_reviewer(ScaffoldConfig::default(), household_tok()).unwrap();
    c.observe_step(1, &household_groups()).unwrap();
    c.observe_step(2, &household_groups()).unwrap();
    let bytes = c.state().to_json_bytes().unwrap();
    let back = ScaffoldState::from_json_bytes(&bytes).unwrap();
    assert_same_state(&back, c.state());
    assert!(!back.bank().is_empty());
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(text.contains("\"format\": \"keel.scaffold.v1\""));

    let err = |b: &[u8]| ScaffoldState::from_json_bytes(b).unwrap_err().to_string();
    assert!(err(b"{not json").contains("not JSON"));
    assert!(err(b"[]").contains("no `format` string"));
    assert!(err(text
        .replace("keel.scaffold.v1", "keel.scaffold.v9")
        .as_bytes())
    .contains("format = \"keel.scaffold.v9\", expected \"keel.scaffold.v1\""));
    assert!(
        err(text.replace("\"next_card_id\"", "\"next_card\"").as_bytes()).contains("next_card")
    );
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["ema"]["clean"] = serde_json::json!(1.5);
    assert!(err(&serde_json::to_vec(&v).unwrap()).contains("ema[\"clean\"] = 1.5"));
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let first = v["bank"]["entries"][0].clone();
    v["bank"]["entries"].as_array_mut().unwrap().push(first);
    assert!(err(&serde_json::to_vec(&v).unwrap()).contains("appears twice"));
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["bank"]["version"] = serde_json::json!(0);
    assert!(err(&serde_json::to_vec(&v).unwrap()).contains("added_version"));
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["step"] = serde_json::json!(1);
    assert!(err(&serde_json::to_vec(&v).unwrap()).contains("history["));
    // Every truncation is an error, never a panic.
    for n in 0..bytes.len() {
        assert!(ScaffoldState::from_json_bytes(&bytes[..n]).is_err());
    }
    // A state of another env's bank does not resume.
    let wrong = ScaffoldController::from_state(
        ScaffoldConfig::default(),
        Tokenizer::calc(),
        Box::new(RuleReviewer::default()),
        back,
    );
    assert!(matches!(wrong, Err(ScaffoldError::UnknownWord { .. })));
}

/// Four `clean` groups: successes open with `go to countertop 1` (cards 0, 1, 2); failures
/// repeat the invalid `clean apple 1 with fridge 1`.
fn household_groups() -> Vec<GroupRecord> {
    let ok = |first: &str| EpisodeRecord {
        reward: 1.0,
        success: true,
        turns: vec![
            turn(first, "you arrive at countertop 1 you see apple 1", false),
            turn(
                "take apple 1 from countertop 1",
                "you pick up apple 1",
                false,
            ),
            turn(
                "go to sinkbasin 1",
                "you arrive at sinkbasin 1 you see nothing",
                false,
            ),
            turn(
                "clean apple 1 with sinkbasin 1",
                "you clean apple 1 with sinkbasin 1",
                false,
            ),
        ],
    };
    let bad = EpisodeRecord {
        reward: 0.0,
        success: false,
        turns: vec![
            turn(
                "go to fridge 1",
                "you arrive at fridge 1 it is closed",
                false,
            ),
            turn("clean apple 1 with fridge 1", "error invalid action", true),
            turn("clean apple 1 with fridge 1", "error invalid action", true),
        ],
    };
    let g = |task_id: u64, episodes: Vec<EpisodeRecord>| GroupRecord {
        task_id,
        task_type: "clean".into(),
        episodes,
    };
    vec![
        g(10, vec![ok("go to countertop 1"), bad.clone()]),
        g(11, vec![ok("go to countertop 1"), bad.clone(), bad.clone()]),
        g(12, vec![ok("go to table 1"), ok("go to countertop 1")]),
        g(13, vec![bad.clone(), bad]),
    ]
}

#[test]
fn rule_reviewer_expands_from_successes_and_mistakes() {
    let groups = household_groups();
    let cards: Vec<EvidenceCard> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| EvidenceCard::from_group(i as u64, 1, g))
        .collect();
    assert!(cards[0].contrastive && !cards[2].contrastive && !cards[3].contrastive);
    assert_eq!(cards[1].successes, 1);
    assert!(close(cards[1].mean_reward, 1.0 / 3.0));
    let mut req = request(Mode::Expand, "clean", &Bank::new(), 0);
    req.cards = cards;
    let mut rr = RuleReviewer::default();
    let edits = rr.review(&req).unwrap();
    assert_eq!(
        edits,
        vec![
            // The successful procedure (verbs in order), not one task's place.
            Edit::Add {
                kind: EntryKind::Skill,
                task_type: Some("clean".into()),
                text: "go take go clean".into(),
                cites: vec![0, 1, 2],
            },
            Edit::Add {
                kind: EntryKind::Mistake,
                task_type: Some("clean".into()),
                text: "clean apple 1 with fridge 1".into(),
                cites: vec![0, 1, 3],
            },
        ]
    );
    // Deterministic: the same request, the same edits.
    assert_eq!(RuleReviewer::default().review(&req).unwrap(), edits);
    let tok = household_tok();
    let mut bank = Bank::new();
    let r = bank.apply(&req, &edits, &tok);
    assert_eq!(r.applied.len(), 2, "{:?}", r.rejected);
    assert_eq!(
        bank.render("clean", 40).text,
        "tip go take go clean avoid clean apple 1 with fridge 1"
    );
    // A second EXPAND review does not repeat itself: with the procedure taken it picks the most
    // common successful first action (and has no other invalid action for a mistake).
    req.bank = bank.clone();
    let again = rr.review(&req).unwrap();
    assert_eq!(again.len(), 1);
    assert!(
        matches!(&again[0], Edit::Add { kind: EntryKind::Skill, text, cites, .. }
            if text == "go to countertop 1" && cites == &[0, 1, 2]),
        "{again:?}"
    );

    // COMPRESS deletes the type's oldest mistake, then its skills.
    req.mode = Mode::Compress;
    req.budget = Mode::Compress.budget();
    assert_eq!(rr.review(&req).unwrap(), vec![Edit::Delete { id: 1 }]);
    let r = bank.apply(&req, &rr.review(&req).unwrap(), &tok);
    assert_eq!(r.applied.len(), 1);
    req.bank = bank.clone();
    assert_eq!(rr.review(&req).unwrap(), vec![Edit::Delete { id: 0 }]);
    req.bank = Bank::new();
    assert!(rr.review(&req).unwrap().is_empty());
}

#[test]
fn rule_reviewer_revises_contradicted_entries_and_prunes() {
    let tok = household_tok();
    // `go to fridge 1` is what the failures do: a contradicted skill.
    let mut bank = bank_with(&[
        skill("go to fridge 1"),
        mistake("take apple 1 from countertop 1"),
    ]);
    let mut req = request(Mode::Revise, "clean", &bank, 0);
    req.cards = household_groups()
        .iter()
        .enumerate()
        .map(|(i, g)| EvidenceCard::from_group(i as u64, 1, g))
        .collect();
    let mut rr = RuleReviewer::default();
    let edits = rr.review(&req).unwrap();
    assert_eq!(
        edits,
        vec![Edit::Update {
            id: 0,
            text: "go take go clean".into(),
            cites: vec![0, 1, 2],
        }]
    );
    bank.apply(&req, &edits, &tok);
    // Next: the mistake successes take is contradicted, and deleted.
    req.bank = bank.clone();
    assert_eq!(rr.review(&req).unwrap(), vec![Edit::Delete { id: 1 }]);

    // FORCED_PRUNE deletes the least supported entries, newest first, until pressure < 1.
    let bank = bank_with(&[
        skill("go to countertop 1"),
        skill("look"),
        mistake("open drawer 1"),
        skill("inventory"),
    ]);
    let mut req2 = request(Mode::ForcedPrune, "clean", &bank, 0);
    req2.cards = req.cards.clone();
    req2.config.max_entries = 3;
    assert_eq!(
        rr.review(&req2).unwrap(),
        vec![Edit::Delete { id: 3 }, Edit::Delete { id: 2 }]
    );
}

#[test]
fn controller_updates_emas_once_per_step_and_walks_the_modes() {
    let mut c =
        ScaffoldController::with_rule_reviewer(ScaffoldConfig::default(), household_tok()).unwrap();
    // Two clean tasks (group means 1 and 0.5) and one heat task (0).
    let step = [
        group(1, "clean", 2, 2),
        group(2, "clean", 1, 2),
        group(3, "heat", 0, 2),
    ];
    let r = c.observe_step(0, &step).unwrap();
    assert_eq!(r.types.len(), 2);
    let clean = &r.types[0];
    assert_eq!((clean.task_type.as_str(), clean.groups), ("clean", 2));
    assert!(close(clean.obs, 0.75));
    assert!(close(clean.ema, 0.075));
    assert_eq!(clean.mode, Mode::Expand);
    assert!(close(c.state().ema("clean"), 0.075));
    assert!(close(c.state().ema("heat"), 0.0));
    assert!(close(c.state().ema("pick"), 0.0));
    // Steps must increase; a failed call changes nothing.
    let before = c.state().clone();
    assert_eq!(
        c.observe_step(0, &step).unwrap_err(),
        ScaffoldError::StepNotIncreasing { step: 0, last: 0 }
    );
    let mut bad = group(4, "clean", 1, 2);
    bad.episodes[0].reward = f32::NAN;
    assert!(matches!(
        c.observe_step(1, &[group(1, "clean", 2, 2), bad]),
        Err(ScaffoldError::InvalidGroup { task_id: 4, .. })
    ));
    assert!(matches!(
        c.observe_step(1, &[group(5, "clean", 0, 0)]),
        Err(ScaffoldError::InvalidGroup { task_id: 5, .. })
    ));
    assert_eq!(c.state(), &before);
    // All-success steps: ema = 1 − 0.9^n after n steps from 0 (heat unseen, unchanged).
    let mut c =
        ScaffoldController::with_rule_reviewer(ScaffoldConfig::default(), household_tok()).unwrap();
    let mut modes = Vec::new();
    for s in 1..=12 {
        let r = c.observe_step(s, &[group(s, "clean", 2, 2)]).unwrap();
        modes.push(r.types[0].mode);
        let want = 1.0 - 0.9f64.powi(s as i32);
        assert!((c.state().ema("clean") - want).abs() < 1e-9);
    }
    assert_eq!(modes[2], Mode::Expand); // 0.271
    assert_eq!(modes[3], Mode::Revise); // 0.3439
    assert_eq!(modes[10], Mode::Revise); // 0.686
    assert_eq!(modes[11], Mode::Compress); // 0.718
    assert_eq!(c.state().history().len(), 12);
    assert_eq!(c.state().step(), Some(12));
    let steps: Vec<u64> = c.state().history().iter().map(|d| d.step).collect();
    assert_eq!(steps, (1..=12).collect::<Vec<_>>());
}

#[test]
fn controller_records_reviewer_errors_and_bounds_history() {
    let cfg = ScaffoldConfig {
        history_len: 3,
        ..ScaffoldConfig::default()
    };
    let mut c = ScaffoldController::new(cfg, household_tok(), Box::new(Broken)).unwrap();
    for s in 0..5 {
        let r = c.observe_step(s, &[group(s, "clean", 1, 2)]).unwrap();
        assert!(r.types[0]
            .reviewer_error
            .as_deref()
            .is_some_and(|e| e.contains("timed out")));
        assert!(!r.changed());
    }
    let steps: Vec<u64> = c.state().history().iter().map(|d| d.step).collect();
    assert_eq!(steps, vec![2, 3, 4]);
    assert!(ScaffoldController::new(
        ScaffoldConfig {
            alpha: 2.0,
            ..ScaffoldConfig::default()
        },
        household_tok(),
        Box::new(Idle)
    )
    .is_err());
}

/// Rollouts of the real `household` env: a mix of oracle and random actions.
fn rollout(env: &mut dyn Env, seed: u64, noise: f64, rng: &mut ChaCha8Rng) -> EpisodeRecord {
    env.reset(seed);
    let mut turns = Vec::new();
    let (mut reward, mut done) = (0.0, false);
    while !done {
        let adm = env.admissible_actions();
        let action = if rng.gen_bool(noise) && !adm.is_empty() {
            adm[rng.gen_range(0..adm.len())].clone()
        } else if rng.gen_bool(noise / 4.0) {
            "take egg 1 from desk 1".to_string()
        } else {
            env.oracle_action()
        };
        let out = env.step(&action);
        turns.push(turn(&action, &out.observation, out.invalid_action));
        reward = out.reward;
        done = out.done;
    }
    EpisodeRecord {
        reward,
        success: env.success(),
        turns,
    }
}

#[test]
fn controller_on_real_household_rollouts_renders_encodable_scaffolds() {
    let mut env = make_env("household", 2).unwrap();
    let tok = Tokenizer::for_env(env.as_ref());
    let mut c =
        ScaffoldController::with_rule_reviewer(ScaffoldConfig::default(), tok.clone()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for step in 0..20u64 {
        let mut groups = Vec::new();
        for t in 0..8 {
            let seed = task_seed(Split::Train, step * 8 + t);
            env.reset(seed);
            let task_type = env.task_type();
            let noise = 0.2 + 0.7 * (1.0 - step as f64 / 20.0);
            let episodes = (0..4)
                .map(|_| rollout(env.as_mut(), seed, noise, &mut rng))
                .collect();
            groups.push(GroupRecord {
                task_id: seed,
                task_type,
                episodes,
            });
        }
        let r = c.observe_step(step, &groups).unwrap();
        for tr in &r.types {
            assert!(tr.reviewer_error.is_none());
            for a in &tr.applied {
                if let Edit::Add { cites, .. } = &a.edit {
                    assert!((1..=3).contains(&cites.len()), "{a:?}");
                }
            }
        }
        for t in crate::household::task_types() {
            let s = c.render(t);
            assert!(s.words <= 40);
            tok.encode(&s.prepend_to("look")).unwrap();
        }
    }
    assert!(!c.state().history().is_empty());
    assert!(c.bank().version() > 0);
    // SC-4: over the limit by at most one review's adds.
    assert!(c.bank().len() <= 30 + 3, "{}", c.bank().len());
    c.bank().check_vocabulary(&tok).unwrap();
    let bytes = c.state().to_json_bytes().unwrap();
    assert_same_state(&ScaffoldState::from_json_bytes(&bytes).unwrap(), c.state());
}

/// Equal states, floats up to the last bit serde_json's parser may round differently.
fn assert_same_state(a: &ScaffoldState, b: &ScaffoldState) {
    assert_eq!(a.bank(), b.bank());
    assert_eq!(a.step(), b.step());
    assert_eq!(a.next_card_id, b.next_card_id);
    let keys = |s: &ScaffoldState| s.emas().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(a), keys(b));
    for (t, v) in a.emas() {
        assert!((v - b.ema(t)).abs() < 1e-12, "{t}");
    }
    assert_eq!(a.history().len(), b.history().len());
    for (x, y) in a.history().iter().zip(b.history()) {
        assert_eq!(
            (x.step, &x.task_type, x.mode),
            (y.step, &y.task_type, y.mode)
        );
        assert!((x.ema - y.ema).abs() < 1e-12 && (x.pressure - y.pressure).abs() < 1e-12);
    }
}

#[test]
fn task_type_is_a_pure_function_of_the_task_for_every_env() {
    for info in ENVS.iter().filter(|e| e.max_difficulty > 0) {
        for d in 1..=info.max_difficulty {
            let mut a = make_env(info.name, d).unwrap();
            let mut b = make_env(info.name, d).unwrap();
            let mut types = std::collections::BTreeSet::new();
            for i in 0..30 {
                let seed = task_seed(
                    if i % 2 == 0 {
                        Split::Train
                    } else {
                        Split::Eval
                    },
                    i,
                );
                a.reset(seed);
                let t = a.task_type();
                assert!(!t.is_empty());
                types.insert(t.clone());
                // Unchanged by steps (known before the episode ends).
                for _ in 0..3 {
                    if a.admissible_actions().is_empty() {
                        break;
                    }
                    a.step(&a.oracle_action());
                    assert_eq!(a.task_type(), t, "{} d{d}", info.name);
                }
                // Another instance, and a reset after another task: the same type.
                b.reset(task_seed(Split::Train, i + 1000));
                b.reset(seed);
                assert_eq!(b.task_type(), t, "{} d{d} seed {seed}", info.name);
                a.reset(seed);
                assert_eq!(a.task_type(), t, "{} d{d} seed {seed}", info.name);
            }
            if info.name == "household" {
                assert!(types
                    .iter()
                    .all(|t| crate::household::task_types().contains(&t.as_str())));
                if d >= 2 {
                    assert!(types.len() >= 3, "household d{d}: {types:?}");
                }
            }
            if info.name == "shop" {
                assert!(types.len() >= 3, "shop d{d}: {types:?}");
            }
        }
    }
}

#[test]
fn edits_read_from_json() {
    let edits: Vec<Edit> = serde_json::from_str(
        r#"[{"op": "add", "kind": "skill", "task_type": "clean", "text": "look", "cites": [1, 2]},
            {"op": "add", "kind": "mistake", "text": "open fridge 1", "cites": [1]},
            {"op": "update", "id": 3, "text": "look", "cites": [2]},
            {"op": "delete", "id": 4}]"#,
    )
    .unwrap();
    assert_eq!(
        edits[0],
        Edit::Add {
            kind: EntryKind::Skill,
            task_type: Some("clean".into()),
            text: "look".into(),
            cites: vec![1, 2],
        }
    );
    assert!(matches!(
        &edits[1],
        Edit::Add {
            task_type: None,
            kind: EntryKind::Mistake,
            ..
        }
    ));
    assert_eq!(edits[3], Edit::Delete { id: 4 });
    assert!(serde_json::from_str::<Edit>(r#"{"op": "rename", "id": 1}"#).is_err());
}
