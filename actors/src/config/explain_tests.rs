use super::*;
use crate::config::key::{Bound, Range};

#[test]
fn table_matches_the_schema() {
    let schema: Vec<String> = schema_keys().into_iter().map(|(k, _)| k).collect();
    assert!(
        schema.len() > 20,
        "the default config did not serialise: {schema:?}"
    );
    let declared: Vec<&str> = crate::config::keys().map(|d| d.name).collect();
    for key in &schema {
        assert!(
            declared.contains(&key.as_str()),
            "config key `{key}` has no Key in its section module (actors/src/config/): add one"
        );
    }
    for key in &declared {
        assert!(
            schema.iter().any(|k| k == key),
            "Key `{key}` is not a config key any more: remove it"
        );
    }
    let mut sorted = declared.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), declared.len(), "a key is declared twice");
}

#[test]
fn explain_reads_types_and_defaults_from_the_schema() {
    let rows = explain();
    let steps = rows
        .iter()
        .find(|r| r.key == "run.steps")
        .expect("run.steps");
    assert_eq!((steps.kind, steps.default.as_str()), ("integer", "200"));
    assert_eq!(steps.range, "1..=2^40");
    let bind = rows
        .iter()
        .find(|r| r.key == "metrics.bind")
        .expect("metrics.bind");
    assert_eq!(bind.default, "\"127.0.0.1\"");
    assert!(rows.iter().all(|r| r.kind != "?"), "every row resolves");
}

/// The TOML that puts `value` at `key`, with what the key needs to be read at all: the env it
/// belongs to, a reward service, the preset whose section it is, LoRA on, async mode.
fn probe(key: &str, value: &str) -> String {
    let context = if key.starts_with("env.external.") {
        "[env]\nname = \"external\"\n[env.external]\nurl = \"http://127.0.0.1:9\"\n"
    } else if key.starts_with("env.dataset.reward.") {
        "[env]\nname = \"dataset\"\n[env.dataset]\ntrain_file = \"t.jsonl\"\neval_file = \"e.jsonl\"\n[env.dataset.reward]\nurl = \"http://127.0.0.1:9\"\n"
    } else if key.starts_with("env.dataset.") {
        "[env]\nname = \"dataset\"\n[env.dataset]\ntrain_file = \"t.jsonl\"\neval_file = \"e.jsonl\"\n"
    } else if key == "armor.loss.replace_ratio" {
        "[learner]\nalgo = \"armor\"\n[armor.loss]\nreplace_old = \"mix\"\n"
    } else if key.starts_with("armor.") {
        "[learner]\nalgo = \"armor\"\n"
    } else if key.starts_with("model.lora.") {
        "[model.lora]\nrank = 4\n"
    } else if key == "run.staleness_bound" {
        "[run]\nmode = \"async\"\n"
    } else {
        ""
    };
    let mut table: toml::Table = toml::from_str(context).expect("probe context");
    let value: toml::Table = toml::from_str(&format!("v = {value}")).expect("probe value");
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().expect("a key has a name");
    let mut t = &mut table;
    for part in parts {
        t = t
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("a table on the way");
    }
    t.insert(leaf.to_string(), value["v"].clone());
    toml::to_string(&table).expect("probe toml")
}

fn outside(range: &Range) -> Vec<String> {
    let num = |x: f64| {
        if x.fract() == 0.0 {
            format!("{x:.1}")
        } else {
            format!("{x}")
        }
    };
    match *range {
        Range::Int { min, max } => {
            let mut v = Vec::new();
            if min > 0 {
                v.push((min - 1).to_string());
            }
            if let Some(max) = max.filter(|m| *m < i64::MAX as u64) {
                v.push((max + 1).to_string());
            }
            v
        }
        Range::Real { lo, hi } => {
            let mut v = Vec::new();
            match lo {
                Bound::Closed(a) => v.push(num(a - 0.5)),
                Bound::Open(a) => v.push(num(a)),
                Bound::None => {}
            }
            match hi {
                Bound::Closed(b) => v.push(num(b + 0.5)),
                Bound::Open(b) => v.push(num(b)),
                Bound::None => {}
            }
            v
        }
        Range::OffOrAbove(a) => vec![num(a), num(a / 2.0)],
        Range::Words(_) => vec!["\"no-such-word\"".into()],
        Range::Bool | Range::Text(_) => Vec::new(),
    }
}

fn inside(range: &Range) -> Vec<String> {
    let num = |x: f64| format!("{x:?}");
    match *range {
        Range::Int { min, max } => {
            let mut v = vec![min.to_string()];
            v.extend(max.map(|m| m.to_string()));
            v
        }
        Range::Real { lo, hi } => {
            let mut v = Vec::new();
            if let Bound::Closed(a) = lo {
                v.push(num(a));
            }
            if let Bound::Closed(b) = hi {
                v.push(num(b));
            }
            v
        }
        Range::Words(words) => words.iter().map(|w| format!("{w:?}")).collect(),
        _ => Vec::new(),
    }
}

/// CK-3 over every documented key.
#[test]
fn declared_ranges_are_what_validation_accepts() {
    let mut probed = 0;
    let mut wrong = Vec::new();
    for key in crate::config::keys() {
        let leaf = key.name.rsplit('.').next().unwrap_or(key.name);
        for value in outside(&key.range) {
            let text = probe(key.name, &value);
            match TrainConfig::from_toml(&text) {
                Ok(_) => wrong.push(format!(
                    "{} = {value} is outside its declared range {} but validation accepts it",
                    key.name, key.range
                )),
                Err(e) if !e.to_string().contains(key.name) && !e.to_string().contains(leaf) => {
                    wrong.push(format!(
                        "{} = {value}: the error does not name the key: {e}",
                        key.name
                    ))
                }
                Err(_) => {}
            }
            probed += 1;
        }
        if !key.also.is_empty() {
            continue;
        }
        for value in inside(&key.range) {
            let text = probe(key.name, &value);
            if let Err(e) = TrainConfig::from_toml(&text) {
                wrong.push(format!(
                    "{} = {value} is inside its declared range {} but refused: {e}",
                    key.name, key.range
                ));
            }
            probed += 1;
        }
    }
    assert!(
        probed > 80,
        "only {probed} probes: the probe builder lost keys"
    );
}
