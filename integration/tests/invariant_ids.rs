//! Invariant IDs are unique across the workspace (issue 33). Readers navigate by them: a module's
//! `//!` doc defines its invariants as `XX-1`, `XX-2`, …, and code comments, tests and docs cite
//! them as "(XX-1)". This test reads every `.rs` file under `*/src`, `*/tests` and `*/benches`
//! of the workspace (never `target/`) and fails, naming `file:line` of both places, when
//! - an ID is defined twice;
//! - one prefix is defined in two modules: all definitions of a prefix lie in one module's tree
//!   (the nearest module holding all of them is not a crate root), unless the prefix is one of
//!   the [`SHARED_PREFIXES`], each named with its modules and why;
//! - a list item starts with an ID-like word keel does not read as an ID (`RW-O1`, `SV-A`);
//! - ARCHITECTURE.md's invariant-ID table lists a prefix or ID that no module defines, lists
//!   one twice, names a place where it is not defined, or leaves out a defined prefix.
//!
//! A definition is an ID at the start of a comment's list item, `//! - XX-1: …` (also
//! `XX-1 (topic): …`, `XX-1 Text …`, a range `XX-2..4 …`, and `///` or `//` comments), or a
//! module's one-invariant line `//! Invariant XX-1: …` / `//! Invariant: XX-1: …`. An ID is a
//! prefix of two to four capitals or digits starting with a capital, a hyphen, and a number with
//! an optional lower-case letter (`CT-5`, `K8-1`, `GD-7b`). A mention anywhere else is a reference.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Prefixes one topic defines in several modules: (prefix, the module paths, why).
const SHARED_PREFIXES: &[(&str, &[&str], &str)] = &[(
    "DF",
    &["actors::frontier", "actors::stored_batches"],
    "the data frontier: `stored_batches` is the frontier's resume scan (DF-4, DF-6)",
)];

/// Where the invariant-ID table sits in ARCHITECTURE.md: the first table after this heading.
const TABLE_HEADING: &str = "## Invariant IDs";

/// One definition of an ID.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Def {
    id: String,
    /// Path relative to the workspace root, `/`-separated.
    file: String,
    line: usize,
}

impl Def {
    fn prefix(&self) -> &str {
        self.id.split('-').next().unwrap_or("")
    }

    fn place(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// `XX` of `XX-n` when `s` starts with a well-formed ID: the prefix, the number (with its
/// optional letter), and the rest of `s`.
fn split_id(s: &str) -> Option<(&str, &str, &str)> {
    let hyphen = s.find('-')?;
    let prefix = &s[..hyphen];
    let first = prefix.chars().next()?;
    if !(2..=4).contains(&prefix.len())
        || !first.is_ascii_uppercase()
        || !prefix
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    {
        return None;
    }
    let after = &s[hyphen + 1..];
    let digits = after.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let mut end = digits;
    if after[end..].starts_with(|c: char| c.is_ascii_lowercase())
        && !after[end + 1..].starts_with(|c: char| c.is_ascii_alphanumeric())
    {
        end += 1;
    }
    let rest = &after[end..];
    // An ID is a word of its own: `XX-1` followed by a letter or digit is something else.
    if rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return None;
    }
    Some((prefix, &after[..end], rest))
}

/// The comment text of a source line: what follows `//!`, `///` or `//`, or None.
fn comment_text(line: &str) -> Option<&str> {
    let t = line.trim_start();
    t.strip_prefix("//!")
        .or_else(|| t.strip_prefix("///"))
        .or_else(|| t.strip_prefix("//"))
}

/// What a line defines: the IDs (a range gives each), or the ID-like word that is malformed.
#[derive(Debug, PartialEq, Eq)]
enum LineDefs {
    None,
    Ids(Vec<String>),
    Malformed(String),
}

fn line_defs(line: &str) -> LineDefs {
    let Some(text) = comment_text(line) else {
        return LineDefs::None;
    };
    let text = text.trim_start();
    let head = if let Some(item) = text.strip_prefix("- ").or_else(|| text.strip_prefix("* ")) {
        item.trim_start()
    } else if let Some(one) = text.strip_prefix("Invariant") {
        // `Invariant XX-1: …` or `Invariant: XX-1: …` (a module with one invariant).
        let one = one.strip_prefix(':').unwrap_or(one);
        if !one.starts_with(' ') {
            return LineDefs::None;
        }
        one.trim_start()
    } else {
        return LineDefs::None;
    };
    let head = head.trim_start_matches(['*', '`']);
    match split_id(head) {
        Some((prefix, number, rest)) => {
            // A range `XX-2..4` defines each of 2, 3 and 4.
            let high = rest
                .strip_prefix("..")
                .map(|r| {
                    r.chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                })
                .and_then(|d| d.parse::<u32>().ok());
            match (number.parse::<u32>(), high) {
                (Ok(low), Some(high)) if high > low => {
                    LineDefs::Ids((low..=high).map(|n| format!("{prefix}-{n}")).collect())
                }
                _ => LineDefs::Ids(vec![format!("{prefix}-{number}")]),
            }
        }
        None => malformed(head),
    }
}

/// `RW-O1`, `DF-F3`, `SV-A`: a capitalised prefix, a hyphen, a capital, then digits or nothing,
/// then the end of the word.
fn malformed(head: &str) -> LineDefs {
    let word: String = head
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let Some((prefix, tail)) = word.split_once('-') else {
        return LineDefs::None;
    };
    let prefix_ok = (2..=4).contains(&prefix.len())
        && prefix.starts_with(|c: char| c.is_ascii_uppercase())
        && prefix
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    let mut tail_chars = tail.chars();
    let tail_ok = tail_chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && tail_chars.all(|c| c.is_ascii_digit());
    let next = head[word.len()..].chars().next();
    if prefix_ok && tail_ok && matches!(next, None | Some(' ' | ':' | '(' | ',')) {
        LineDefs::Malformed(word)
    } else {
        LineDefs::None
    }
}

/// Every definition in one file's text; malformed ID-like words go to `bad`.
fn scan_text(file: &str, text: &str, defs: &mut Vec<Def>, bad: &mut Vec<String>) {
    for (i, line) in text.lines().enumerate() {
        match line_defs(line) {
            LineDefs::None => {}
            LineDefs::Ids(ids) => defs.extend(ids.into_iter().map(|id| Def {
                id,
                file: file.to_string(),
                line: i + 1,
            })),
            LineDefs::Malformed(word) => bad.push(format!(
                "{file}:{}: `{word}` is not an invariant ID (write XX-1, a prefix of 2-4 \
                 capitals, a hyphen and a number)",
                i + 1
            )),
        }
    }
}

/// The module path of a source file: `actors/src/remote/mod.rs` → `actors::remote`,
/// `store/src/lib.rs` → `store`, `learner/tests/verl_parity.rs` → `learner::tests::verl_parity`.
fn module_of(file: &str) -> String {
    let mut parts: Vec<&str> = file.trim_end_matches(".rs").split('/').collect();
    if parts.get(1) == Some(&"src") {
        parts.remove(1);
    }
    if matches!(parts.last(), Some(&("mod" | "lib" | "main"))) && parts.len() > 1 {
        parts.pop();
    }
    parts.join("::")
}

/// The root of a module's crate: `actors`, or `learner::tests` for an integration test, a
/// bench or a binary (each its own crate).
fn crate_root(module: &str) -> String {
    let parts: Vec<&str> = module.split("::").collect();
    match parts.get(1) {
        Some(&("tests" | "benches" | "bin")) => parts[..2].join("::"),
        _ => parts[0].to_string(),
    }
}

/// The nearest module holding both `a` and `b`.
fn common_module(a: &str, b: &str) -> String {
    let same: Vec<&str> = a
        .split("::")
        .zip(b.split("::"))
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x)
        .collect();
    same.join("::")
}

/// Every violation of uniqueness among `defs`, each naming both places.
fn collisions(defs: &[Def], shared: &[(&str, &[&str], &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_id: BTreeMap<&str, Vec<&Def>> = BTreeMap::new();
    for d in defs {
        by_id.entry(d.id.as_str()).or_default().push(d);
    }
    for (id, ds) in &by_id {
        for later in &ds[1..] {
            out.push(format!(
                "{id} is defined twice: {} and {}",
                ds[0].place(),
                later.place()
            ));
        }
    }
    let mut by_prefix: BTreeMap<&str, Vec<&Def>> = BTreeMap::new();
    for d in defs {
        by_prefix.entry(d.prefix()).or_default().push(d);
    }
    for (prefix, ds) in &by_prefix {
        let modules: Vec<String> = ds.iter().map(|d| module_of(&d.file)).collect();
        if let Some((_, allowed, _)) = shared.iter().find(|(p, _, _)| p == prefix) {
            for (d, m) in ds.iter().zip(&modules) {
                if !allowed.contains(&m.as_str()) {
                    out.push(format!(
                        "{} is defined in module {m} ({}), outside the modules {prefix} is \
                         shared by ({})",
                        d.id,
                        d.place(),
                        allowed.join(", ")
                    ));
                }
            }
            continue;
        }
        // Two definitions whose nearest common module is their crate's root (or no module at
        // all: two crates) are in two modules.
        let apart = |a: &str, b: &str| {
            a != b && common_module(a, b).split("::").count() <= crate_root(a).split("::").count()
        };
        let first = ds[0];
        if let Some((other, other_module)) =
            ds.iter().zip(&modules).find(|(_, m)| apart(&modules[0], m))
        {
            out.push(format!(
                "prefix {prefix} is defined in two modules: {} in {} ({}) and {} in {} ({}); \
                 a prefix belongs to one module: rename one side",
                first.id,
                modules[0],
                first.place(),
                other.id,
                other_module,
                other.place()
            ));
        }
    }
    out
}

/// A row of the invariant-ID table: its first cell (a prefix or ID), its second (where), and
/// its line in ARCHITECTURE.md.
#[derive(Debug)]
struct Row {
    key: String,
    place: String,
    line: usize,
}

/// The rows of the first table after [`TABLE_HEADING`]; None without the heading.
fn table_rows(markdown: &str) -> Option<Vec<Row>> {
    let mut lines = markdown.lines().enumerate();
    lines.find(|(_, l)| l.trim() == TABLE_HEADING)?;
    let mut rows = Vec::new();
    let mut in_table = false;
    for (i, l) in lines {
        let l = l.trim();
        if !l.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        in_table = true;
        let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
        let key = cells[0].trim_matches('`');
        if key.is_empty() || key.starts_with("---") || key.eq_ignore_ascii_case("prefix") {
            continue;
        }
        rows.push(Row {
            key: key.to_string(),
            place: cells.get(1).unwrap_or(&"").trim_matches('`').to_string(),
            line: i + 1,
        });
    }
    Some(rows)
}

/// Whether `file` is at `place`: the file itself, or under it when `place` is a folder
/// (`ops/src/arena/`) or a module file whose folder holds submodules (`actors/src/controller.rs`).
fn file_at(file: &str, place: &str) -> bool {
    let folder = place.strip_suffix(".rs").map(|f| format!("{f}/"));
    file == place
        || (place.ends_with('/') && file.starts_with(place))
        || folder.is_some_and(|f| file.starts_with(&f))
}

/// What is wrong with ARCHITECTURE.md's table: listed twice, defined nowhere, defined
/// elsewhere than its row says, a defined prefix left out.
fn table_problems(markdown: &str, defs: &[Def]) -> Vec<String> {
    let Some(rows) = table_rows(markdown) else {
        return vec![format!("ARCHITECTURE.md has no `{TABLE_HEADING}` table")];
    };
    let mut out = Vec::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &rows {
        if let Some(first) = seen.insert(&row.key, row.line) {
            out.push(format!(
                "ARCHITECTURE.md lists {} twice: lines {first} and {}",
                row.key, row.line
            ));
        }
        let is_id = row.key.contains('-');
        let matching: Vec<&Def> = defs
            .iter()
            .filter(|d| {
                if is_id {
                    d.id == row.key
                } else {
                    d.prefix() == row.key
                }
            })
            .collect();
        if matching.is_empty() {
            out.push(format!(
                "ARCHITECTURE.md:{} lists {}, which no module defines",
                row.line, row.key
            ));
        } else if !matching.iter().any(|d| file_at(&d.file, &row.place)) {
            out.push(format!(
                "ARCHITECTURE.md:{} places {} at `{}`, but it is defined at {}",
                row.line,
                row.key,
                row.place,
                matching[0].place()
            ));
        }
    }
    let mut prefixes: BTreeMap<&str, &Def> = BTreeMap::new();
    for d in defs {
        prefixes.entry(d.prefix()).or_insert(d);
    }
    for (prefix, d) in prefixes {
        let listed = rows
            .iter()
            .any(|r| r.key == prefix || r.key.split('-').next() == Some(prefix));
        if !listed {
            out.push(format!(
                "ARCHITECTURE.md's invariant-ID table leaves out {prefix} (defined at {})",
                d.place()
            ));
        }
    }
    out
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the integration crate sits in the workspace")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "target" || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Every definition in the workspace, and the malformed ID-like words.
fn scan_workspace() -> (Vec<Def>, Vec<String>) {
    let root = workspace_root();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("workspace root")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "target"))
        .collect();
    crates.sort();
    let mut files = Vec::new();
    for c in &crates {
        for sub in ["src", "tests", "benches"] {
            rust_files(&c.join(sub), &mut files);
        }
    }
    let (mut defs, mut bad) = (Vec::new(), Vec::new());
    for path in files {
        let rel = path
            .strip_prefix(&root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        scan_text(&rel, &text, &mut defs, &mut bad);
    }
    (defs, bad)
}

fn report(title: &str, problems: &[String]) -> String {
    let mut s = format!("{title} ({}):\n", problems.len());
    for p in problems {
        let _ = writeln!(s, "  {p}");
    }
    s
}

#[test]
fn invariant_ids_are_unique_across_the_workspace() {
    let (defs, bad) = scan_workspace();
    // Not vacuous: the workspace defines several hundred invariants.
    assert!(
        defs.len() > 300,
        "found only {} definitions: is the scanner reading the modules' docs?",
        defs.len()
    );
    let prefixes: std::collections::BTreeSet<&str> = defs.iter().map(Def::prefix).collect();
    eprintln!(
        "{} invariant definitions under {} prefixes",
        defs.len(),
        prefixes.len()
    );
    let mut problems = collisions(&defs, SHARED_PREFIXES);
    problems.extend(bad);
    assert!(
        problems.is_empty(),
        "{}",
        report("invariant IDs that collide", &problems)
    );
}

#[test]
fn architecture_table_lists_each_prefix_once_where_it_is_defined() {
    let (defs, _) = scan_workspace();
    let path = workspace_root().join("ARCHITECTURE.md");
    let markdown = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let rows = table_rows(&markdown).unwrap_or_default();
    assert!(rows.len() > 50, "the table has only {} rows", rows.len());
    let problems = table_problems(&markdown, &defs);
    assert!(
        problems.is_empty(),
        "{}",
        report("ARCHITECTURE.md's invariant-ID table", &problems)
    );
}

#[test]
fn shared_prefixes_are_still_shared() {
    // An entry of SHARED_PREFIXES whose modules no longer all define the prefix is stale.
    let (defs, _) = scan_workspace();
    for (prefix, modules, _) in SHARED_PREFIXES {
        for m in *modules {
            assert!(
                defs.iter()
                    .any(|d| d.prefix() == *prefix && module_of(&d.file) == *m),
                "SHARED_PREFIXES: {m} no longer defines {prefix}; remove it from the list"
            );
        }
    }
}

#[cfg(test)]
mod scanner {
    use super::*;

    fn scan(files: &[(&str, &str)]) -> (Vec<Def>, Vec<String>) {
        let (mut defs, mut bad) = (Vec::new(), Vec::new());
        for (f, t) in files {
            scan_text(f, t, &mut defs, &mut bad);
        }
        (defs, bad)
    }

    fn ids(line: &str) -> Vec<String> {
        match line_defs(line) {
            LineDefs::Ids(ids) => ids,
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn reads_every_definition_form_the_code_uses() {
        assert_eq!(ids("//! - CT-5: stop"), ["CT-5"]);
        assert_eq!(ids("//! - AS-1 (staleness admission): a batch"), ["AS-1"]);
        assert_eq!(ids("//! - DM-1 Every turn but the last"), ["DM-1"]);
        assert_eq!(ids("//! - DR-6 verl's tool rows"), ["DR-6"]);
        assert_eq!(ids("  /// - GD-7b: nested"), ["GD-7b"]);
        assert_eq!(ids("//! - K8-1: a generator's rank"), ["K8-1"]);
        assert_eq!(
            ids("//! - LH-2..4 (`plan`): the config"),
            ["LH-2", "LH-3", "LH-4"]
        );
        assert_eq!(ids("//! Invariant RD-1: [`redact_url`]"), ["RD-1"]);
        assert_eq!(ids("//! Invariant: SU-1: every role"), ["SU-1"]);
        assert_eq!(ids("//! * `EX-4`: one client"), ["EX-4"]);
    }

    #[test]
    fn references_are_not_definitions() {
        for line in [
            "//! Invariants (beside EN-1..EN-9):",
            "//! Invariants (LH-1):",
            "/// RO-9: how uninformative groups are rolled out again.",
            "        // JL-2: the earlier lives' lines",
            "//! - `python_str`: a Python string literal (LH-1)",
            "//!   VB-2's learner bound, continued",
            "let s = \"- CT-5: not a comment\";",
            "//! Invariants MS-1..4 are stated where the code is now:",
        ] {
            assert_eq!(line_defs(line), LineDefs::None, "{line}");
        }
    }

    #[test]
    fn names_malformed_ids() {
        for (line, word) in [
            ("//! - RW-O1 Every epoch", "RW-O1"),
            ("//! - DF-F3 A UTF-8 byte order mark", "DF-F3"),
            ("//! - SV-A Every turn is tagged", "SV-A"),
        ] {
            assert_eq!(line_defs(line), LineDefs::Malformed(word.into()), "{line}");
        }
        let (_, bad) = scan(&[("envs/src/row_order.rs", "//! x\n//! - RW-O2 `row(i)`\n")]);
        assert_eq!(bad.len(), 1);
        assert!(
            bad[0].starts_with("envs/src/row_order.rs:2: `RW-O2`"),
            "{bad:?}"
        );
    }

    #[test]
    fn catches_a_planted_duplicate_naming_both_places() {
        let (defs, bad) = scan(&[
            (
                "learner/src/learner.rs",
                "//! - LR-6 (one version): a\n//! - LR-7: b\n\n//! - LR-6 (masks): d\n",
            ),
            ("learner/src/hf/lora.rs", "//! - LO-1: c\n"),
        ]);
        assert!(bad.is_empty());
        assert_eq!(defs.len(), 4);
        let problems = collisions(&defs, &[]);
        assert_eq!(
            problems,
            ["LR-6 is defined twice: learner/src/learner.rs:1 and learner/src/learner.rs:4"]
        );
    }

    #[test]
    fn catches_a_prefix_in_two_modules() {
        let (defs, _) = scan(&[
            (
                "envs/src/split.rs",
                "//! - SP-1 injective\n//! - SP-2 recoverable\n",
            ),
            (
                "learner/src/hf/sampling.rs",
                "//! x\n//! - SP-3 (greedy): argmax\n",
            ),
        ]);
        let problems = collisions(&defs, &[]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("SP-1 in envs::split (envs/src/split.rs:1)")
                && problems[0]
                    .contains("SP-3 in learner::hf::sampling (learner/src/hf/sampling.rs:2)"),
            "{}",
            problems[0]
        );
        // The same numbers in two modules: both the duplicate and the prefix are named.
        let (defs, _) = scan(&[
            ("store/src/batch.rs", "//! - BT-1: a\n"),
            ("learner/src/batch_tensors.rs", "//! - BT-1: b\n"),
        ]);
        assert_eq!(collisions(&defs, &[]).len(), 2);
    }

    #[test]
    fn one_module_tree_may_share_a_prefix() {
        let (defs, _) = scan(&[
            ("ops/src/launch/mod.rs", "//! - LH-1: a\n//! - LH-5: e\n"),
            ("ops/src/launch/plan.rs", "//! - LH-2: b\n"),
            ("actors/src/method/rtpo.rs", "//! - MS-1 (RTPO): a\n"),
            ("actors/src/method/pats.rs", "//! - MS-2 (PATS): b\n"),
            ("actors/src/controller.rs", "//! - CT-1: a\n"),
            ("actors/src/controller/rewind.rs", "//! - CT-4: b\n"),
        ]);
        assert_eq!(collisions(&defs, &[]), Vec::<String>::new());
        // Two top-level modules of one crate are two modules, unless the prefix is shared.
        let (defs, _) = scan(&[
            ("actors/src/frontier.rs", "//! - DF-1: a\n"),
            ("actors/src/stored_batches.rs", "//! - DF-4: b\n"),
        ]);
        assert_eq!(collisions(&defs, &[]).len(), 1);
        assert!(collisions(&defs, SHARED_PREFIXES).is_empty());
        let (defs, _) = scan(&[
            ("actors/src/frontier.rs", "//! - DF-1: a\n"),
            ("envs/src/dataset/file.rs", "//! - DF-7: b\n"),
        ]);
        let problems = collisions(&defs, SHARED_PREFIXES);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("envs/src/dataset/file.rs:1"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn module_paths() {
        assert_eq!(module_of("actors/src/remote/mod.rs"), "actors::remote");
        assert_eq!(module_of("store/src/lib.rs"), "store");
        assert_eq!(module_of("ops/src/main.rs"), "ops");
        assert_eq!(
            module_of("actors/src/controller/rewind.rs"),
            "actors::controller::rewind"
        );
        assert_eq!(
            module_of("learner/tests/verl_parity.rs"),
            "learner::tests::verl_parity"
        );
        assert_eq!(crate_root("learner::tests::verl_parity"), "learner::tests");
        assert_eq!(crate_root("actors::remote::handle"), "actors");
        // Two integration tests are two crates.
        let (defs, _) = scan(&[
            ("integration/tests/a.rs", "//! - QQ-1: a\n"),
            ("integration/tests/b.rs", "//! - QQ-2: b\n"),
        ]);
        assert_eq!(collisions(&defs, &[]).len(), 1);
    }

    #[test]
    fn checks_the_architecture_table() {
        let (defs, _) = scan(&[
            ("actors/src/controller.rs", "//! - CT-1: a\n//! - AS-1: s\n"),
            ("actors/src/controller/rewind.rs", "//! - CT-4: b\n"),
            ("store/src/root.rs", "//! - ST-1: c\n"),
            ("ops/src/arena/grid.rs", "//! - AGR-1: d\n"),
        ]);
        let good = "# x\n\n## Invariant IDs\n\n| prefix | module | topic |\n| --- | --- | --- |\n\
                    | CT | `actors/src/controller.rs` | the loop |\n| AS-1 | actors/src/controller.rs | admission |\n\
                    | ST | store/src/root.rs | keys |\n| AGR | ops/src/arena/ | grid |\n\nafter\n";
        assert_eq!(table_problems(good, &defs), Vec::<String>::new());
        let bad = "## Invariant IDs\n\n| prefix | module |\n| --- | --- |\n\
                   | CT | actors/src/controller.rs |\n| CT | actors/src/job.rs |\n\
                   | ZZ | nowhere.rs |\n| ST | store/src/batch.rs |\n";
        let problems = table_problems(bad, &defs);
        let joined = problems.join("\n");
        assert!(joined.contains("lists CT twice: lines 5 and 6"), "{joined}");
        assert!(
            joined.contains("ARCHITECTURE.md:7 lists ZZ, which no module defines"),
            "{joined}"
        );
        assert!(
            joined.contains(
                "places ST at `store/src/batch.rs`, but it is defined at store/src/root.rs:1"
            ),
            "{joined}"
        );
        assert!(
            joined.contains("leaves out AGR (defined at ops/src/arena/grid.rs:1)"),
            "{joined}"
        );
        assert!(joined.contains("leaves out AS"), "{joined}");
        assert!(table_problems("# no table\n", &defs)[0].contains("no `## Invariant IDs` table"));
    }
}
