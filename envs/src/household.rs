//! `household`: an ALFWorld-like text world (the procedural counterpart of ALFWorld).
//!
//! A room of receptacles (countertop, table, shelf, desk with a desklamp, sinkbasin, microwave,
//! fridge, cabinets, drawers; cabinets, drawers, fridge and microwave start closed) holding
//! objects. Task types: pick-and-place (`put a X in R`), clean (`put a clean X in R`, clean at the
//! sinkbasin), heat (microwave), cool (fridge), examine (`examine the X with the desklamp`) and
//! pick-two (`put two X in R`). Commands: `go to R N`, `open R N`, `close R N`,
//! `take O N from R N`, `put O N in R N`, `clean|heat|cool O N with R N`, `use desklamp 1`,
//! `look`, `inventory`. Reward 1 when the task is done (the episode then ends), else 0.
//!
//! The difficulty (1..=4) sets the number of cabinets and drawers, the distractor objects, the
//! task types (1: pick and examine; 2: + clean, heat, cool; 3..: + pick-two) and the horizon.
//!
//! Invariants (beside EN-1..EN-9):
//! - HH-1 The agent holds at most one object; objects are only taken from and put into the
//!   receptacle the agent is at, and only while it is open (or not closable).
//! - HH-2 Held-out templates: (task type, object) pairs with `(type + object) % 5 == 0` occur only
//!   in eval tasks.
//! - HH-3 The oracle is a reactive planner over the current state, so it finishes from any state
//!   an agent can reach (after a restore, after a mistake of a noisy demonstration).

use std::collections::BTreeSet;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::lexicon::WordList;
use crate::search_qa::INVALID;
use crate::snapshot::EnvSnapshot;
use crate::split::Split;

const OBJECTS: [&str; 14] = [
    "apple", "egg", "potato", "tomato", "bread", "mug", "cup", "plate", "bowl", "book", "pen",
    "key", "cloth", "vase",
];
/// Objects that can be cleaned, heated and cooled (food and dishes).
const PROCESSABLE: usize = 9;
const TYPES: [&str; 6] = ["pick", "clean", "heat", "cool", "examine", "pick-two"];
const PLACES: [&str; 4] = ["countertop", "table", "shelf", "desk"];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receptacle {
    name: String,
    closable: bool,
    open: bool,
    contents: Vec<String>,
}

impl Receptacle {
    fn accessible(&self) -> bool {
        !self.closable || self.open
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Task {
    kind: usize,
    object: String,
    target: String,
    text: String,
}

/// The `household` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HouseholdEnv {
    difficulty: usize,
    recs: Vec<Receptacle>,
    at: Option<usize>,
    holding: Option<String>,
    tags: BTreeSet<(String, String)>,
    task: Task,
    turns: usize,
    done: bool,
    solved: bool,
}

/// The words of `household` (TK-1).
pub fn vocabulary() -> Vec<String> {
    let mut w = WordList::default();
    w.extend_text([
        "task put a in clean hot cool examine the with desklamp two go to open close take from",
        "heat use look inventory you arrive at see nothing it is closed pick up turn on are",
        "room holding error invalid action sinkbasin microwave fridge cabinet drawer 1 2 3",
    ]);
    w.extend(PLACES).extend(OBJECTS);
    w.into_vec()
}

impl HouseholdEnv {
    /// A new env at `difficulty` (clamped to 1..=4).
    pub fn new(difficulty: usize) -> Self {
        let mut env = HouseholdEnv {
            difficulty: difficulty.clamp(1, 4),
            recs: Vec::new(),
            at: None,
            holding: None,
            tags: BTreeSet::new(),
            task: Task {
                kind: 0,
                object: String::new(),
                target: String::new(),
                text: String::new(),
            },
            turns: 0,
            done: true,
            solved: false,
        };
        env.generate(0);
        env.done = true;
        env
    }

    fn generate(&mut self, seed: u64) {
        let d = self.difficulty;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0068_6f75_7365);
        let mut recs: Vec<Receptacle> = Vec::new();
        let mut add = |name: String, closable: bool| {
            recs.push(Receptacle {
                name,
                closable,
                open: false,
                contents: Vec::new(),
            })
        };
        for p in PLACES {
            add(format!("{p} 1"), false);
        }
        add("sinkbasin 1".into(), false);
        add("microwave 1".into(), true);
        add("fridge 1".into(), true);
        for i in 1..=d.min(3) {
            add(format!("cabinet {i}"), true);
        }
        for i in 1..=(d.saturating_sub(1)).min(2) {
            add(format!("drawer {i}"), true);
        }
        let n_types = match d {
            1 => 1,
            2 => 4,
            _ => 5,
        };
        let train = Split::of_seed(seed) == Split::Train;
        let (kind, obj) = loop {
            // pick-two is index 5; examine (4) is allowed from difficulty 1.
            let kinds: Vec<usize> = (0..n_types)
                .chain([4])
                .chain((n_types == 5).then_some(5))
                .collect();
            let kind = kinds[rng.gen_range(0..kinds.len())];
            let n_obj = if (1..=3).contains(&kind) {
                PROCESSABLE
            } else {
                OBJECTS.len()
            };
            let obj = rng.gen_range(0..n_obj);
            // HH-2 (written with `%`: `is_multiple_of` is newer than the workspace's MSRV).
            #[allow(clippy::manual_is_multiple_of)]
            let held_out = (kind + obj) % 5 == 0;
            if !train || !held_out {
                break (kind, obj);
            }
        };
        let object = OBJECTS[obj].to_string();
        // Targets: places other than the desk, cabinets and drawers.
        let targets: Vec<usize> = (0..recs.len())
            .filter(|&i| {
                let n = &recs[i].name;
                !n.starts_with("desk")
                    && !n.starts_with("sink")
                    && !n.starts_with("micro")
                    && !n.starts_with("fridge")
            })
            .collect();
        let target = targets[rng.gen_range(0..targets.len())];
        // Place the task objects (two for pick-two) and distractors away from the target.
        let sources: Vec<usize> = (0..recs.len())
            .filter(|&i| {
                i != target
                    && !recs[i].name.starts_with("sink")
                    && !recs[i].name.starts_with("micro")
            })
            .collect();
        let copies = if kind == 5 {
            2
        } else {
            1 + usize::from(rng.gen_bool(0.3))
        };
        for c in 1..=copies {
            let s = sources[rng.gen_range(0..sources.len())];
            recs[s].contents.push(format!("{object} {c}"));
        }
        let mut others: Vec<&str> = OBJECTS.iter().copied().filter(|o| *o != object).collect();
        others.shuffle(&mut rng);
        for o in others.into_iter().take(1 + d) {
            let s = rng.gen_range(0..recs.len());
            if !recs[s].name.starts_with("sink") && !recs[s].name.starts_with("micro") {
                recs[s].contents.push(format!("{o} 1"));
            }
        }
        let tname = recs[target].name.clone();
        let text = match kind {
            0 => format!("task put a {object} in {tname}"),
            1 => format!("task put a clean {object} in {tname}"),
            2 => format!("task put a hot {object} in {tname}"),
            3 => format!("task put a cool {object} in {tname}"),
            4 => format!("task examine the {object} with the desklamp"),
            _ => format!("task put two {object} in {tname}"),
        };
        self.recs = recs;
        self.at = None;
        self.holding = None;
        self.tags.clear();
        self.task = Task {
            kind,
            object,
            target: tname,
            text,
        };
    }

    fn rec(&self, name: &str) -> Option<usize> {
        self.recs.iter().position(|r| r.name == name)
    }

    fn here(&self) -> Option<&Receptacle> {
        self.at.map(|i| &self.recs[i])
    }

    fn describe(&self, i: usize) -> String {
        let r = &self.recs[i];
        if !r.accessible() {
            return "it is closed".into();
        }
        if r.contents.is_empty() {
            "you see nothing".into()
        } else {
            format!("you see {}", r.contents.join(" "))
        }
    }

    fn required_tag(&self) -> Option<&'static str> {
        match self.task.kind {
            1 => Some("clean"),
            2 => Some("hot"),
            3 => Some("cool"),
            _ => None,
        }
    }

    fn is_kind(&self, obj: &str) -> bool {
        obj.split_whitespace().next() == Some(self.task.object.as_str())
    }

    fn placed(&self) -> usize {
        let Some(t) = self.rec(&self.task.target) else {
            return 0;
        };
        self.recs[t]
            .contents
            .iter()
            .filter(|o| self.is_kind(o))
            .filter(|o| {
                self.required_tag()
                    .is_none_or(|tag| self.tags.contains(&(o.to_string(), tag.to_string())))
            })
            .count()
    }

    fn goal_met(&self) -> bool {
        match self.task.kind {
            4 => false, // examine succeeds in `use desklamp`
            5 => self.placed() >= 2,
            _ => self.placed() >= 1,
        }
    }

    /// Applies a parsed command; `None` means invalid in this state.
    fn apply(&mut self, w: &[&str]) -> Option<String> {
        let obj = |a: &str, b: &str| format!("{a} {b}");
        match w {
            ["go", "to", r, n] => {
                let i = self.rec(&obj(r, n))?;
                self.at = Some(i);
                Some(format!(
                    "you arrive at {} {}",
                    self.recs[i].name,
                    self.describe(i)
                ))
            }
            ["open", r, n] | ["close", r, n] => {
                let i = self
                    .at
                    .filter(|&i| self.recs[i].name == obj(r, n) && self.recs[i].closable)?;
                let opening = w[0] == "open";
                if self.recs[i].open == opening {
                    return None;
                }
                self.recs[i].open = opening;
                Some(if opening {
                    format!("you open {} {}", self.recs[i].name, self.describe(i))
                } else {
                    format!("you close {}", self.recs[i].name)
                })
            }
            ["take", o, k, "from", r, n] => {
                let i = self
                    .at
                    .filter(|&i| self.recs[i].name == obj(r, n) && self.recs[i].accessible())?;
                if self.holding.is_some() {
                    return None;
                }
                let name = obj(o, k);
                let pos = self.recs[i].contents.iter().position(|c| *c == name)?;
                self.recs[i].contents.remove(pos);
                self.holding = Some(name.clone());
                Some(format!("you pick up {name}"))
            }
            ["put", o, k, "in", r, n] => {
                let i = self
                    .at
                    .filter(|&i| self.recs[i].name == obj(r, n) && self.recs[i].accessible())?;
                let name = obj(o, k);
                if self.holding.as_deref() != Some(name.as_str()) {
                    return None;
                }
                self.holding = None;
                self.recs[i].contents.push(name.clone());
                Some(format!("you put {name} in {}", self.recs[i].name))
            }
            [verb @ ("clean" | "heat" | "cool"), o, k, "with", r, n] => {
                let (tool, tag) = match *verb {
                    "clean" => ("sinkbasin 1", "clean"),
                    "heat" => ("microwave 1", "hot"),
                    _ => ("fridge 1", "cool"),
                };
                let name = obj(o, k);
                if obj(r, n) != tool
                    || self.here()?.name != tool
                    || self.holding.as_deref() != Some(name.as_str())
                {
                    return None;
                }
                self.tags.insert((name.clone(), tag.to_string()));
                Some(format!("you {verb} {name} with {tool}"))
            }
            ["use", "desklamp", "1"] => {
                if self.here()?.name != "desk 1" {
                    return None;
                }
                if self.task.kind == 4 && self.holding.as_deref().is_some_and(|h| self.is_kind(h)) {
                    self.solved = true;
                }
                Some("you turn on the desklamp".into())
            }
            ["look"] => Some(match self.at {
                Some(i) => format!("you are at {} {}", self.recs[i].name, self.describe(i)),
                None => "you are in the room".into(),
            }),
            ["inventory"] => Some(match &self.holding {
                Some(h) => format!("you are holding {h}"),
                None => "you are holding nothing".into(),
            }),
            _ => None,
        }
    }
}

impl Env for HouseholdEnv {
    fn name(&self) -> &str {
        "household"
    }

    /// The task type: `pick`, `clean`, `heat`, `cool`, `examine` or `pick-two`.
    fn task_type(&self) -> String {
        TYPES[self.task.kind].to_string()
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.generate(task_seed);
        self.turns = 0;
        self.done = false;
        self.solved = false;
        let names: Vec<&str> = self.recs.iter().map(|r| r.name.as_str()).collect();
        format!(
            "you are in the room you see {} {}",
            names.join(" "),
            self.task.text
        )
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.into(), 0.0, true, true);
        }
        self.turns += 1;
        let words: Vec<&str> = action.split_whitespace().collect();
        let (obs, invalid) = match self.apply(&words) {
            Some(obs) => (obs, false),
            None => (INVALID.to_string(), true),
        };
        if self.goal_met() {
            self.solved = true;
        }
        let reward = if self.solved { 1.0 } else { 0.0 };
        self.done = self.solved || self.turns >= self.max_turns();
        outcome_of(
            self,
            if self.solved { String::new() } else { obs },
            reward,
            self.done,
            invalid,
        )
    }

    fn oracle_action(&self) -> String {
        let go = |name: &str| format!("go to {name}");
        let at = |name: &str| self.here().is_some_and(|r| r.name == name);
        let reach = |i: usize, then: String| -> String {
            let r = &self.recs[i];
            if !at(&r.name) {
                go(&r.name)
            } else if !r.accessible() {
                format!("open {}", r.name)
            } else {
                then
            }
        };
        if let Some(h) = &self.holding {
            if !self.is_kind(h) {
                // Put a stray object down where we are, or on the countertop.
                return match self.at.filter(|&i| {
                    self.recs[i].accessible()
                        && !self.recs[i].name.starts_with("micro")
                        && !self.recs[i].name.starts_with("sink")
                }) {
                    Some(i) => format!("put {h} in {}", self.recs[i].name),
                    None => go("countertop 1"),
                };
            }
            if self.task.kind == 4 {
                return if at("desk 1") {
                    "use desklamp 1".into()
                } else {
                    go("desk 1")
                };
            }
            if let Some(tag) = self.required_tag() {
                if !self.tags.contains(&(h.clone(), tag.to_string())) {
                    let (verb, tool) = match tag {
                        "clean" => ("clean", "sinkbasin 1"),
                        "hot" => ("heat", "microwave 1"),
                        _ => ("cool", "fridge 1"),
                    };
                    return if at(tool) {
                        format!("{verb} {h} with {tool}")
                    } else {
                        go(tool)
                    };
                }
            }
            let t = self.rec(&self.task.target).unwrap_or(0);
            return reach(t, format!("put {h} in {}", self.task.target));
        }
        // Take the first object of the task's kind that is not already placed.
        for (i, r) in self.recs.iter().enumerate() {
            if r.name == self.task.target && self.task.kind != 4 {
                continue;
            }
            if let Some(o) = r.contents.iter().find(|o| self.is_kind(o)) {
                return reach(i, format!("take {o} from {}", r.name));
            }
        }
        "look".into()
    }

    fn max_turns(&self) -> usize {
        [10, 14, 20, 22][self.difficulty - 1]
    }

    fn success(&self) -> bool {
        self.solved
    }

    fn vocabulary(&self) -> Vec<String> {
        vocabulary()
    }

    fn admissible_actions(&self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        let mut out: Vec<String> = self
            .recs
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.at)
            .map(|(_, r)| format!("go to {}", r.name))
            .collect();
        if let Some(r) = self.here() {
            if r.closable {
                out.push(format!(
                    "{} {}",
                    if r.open { "close" } else { "open" },
                    r.name
                ));
            }
            if r.accessible() {
                match &self.holding {
                    None => out.extend(
                        r.contents
                            .iter()
                            .map(|o| format!("take {o} from {}", r.name)),
                    ),
                    Some(h) => out.push(format!("put {h} in {}", r.name)),
                }
            }
            if let Some(h) = &self.holding {
                for (verb, tool) in [
                    ("clean", "sinkbasin 1"),
                    ("heat", "microwave 1"),
                    ("cool", "fridge 1"),
                ] {
                    if r.name == tool {
                        out.push(format!("{verb} {h} with {tool}"));
                    }
                }
            }
            if r.name == "desk 1" {
                out.push("use desklamp 1".into());
            }
        }
        out.push("look".into());
        out.push("inventory".into());
        out
    }

    fn anchor_state(&self) -> String {
        let recs: Vec<String> = self
            .recs
            .iter()
            .map(|r| format!("{} {} [{}]", r.name, r.open, r.contents.join(" ")))
            .collect();
        format!(
            "{} at {:?} holding {:?} tags {:?} recs {} done {} solved {}",
            self.task.text,
            self.at,
            self.holding,
            self.tags,
            recs.join(" "),
            self.done,
            self.solved
        )
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("household", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("household")?;
        Ok(())
    }
}

/// Task-type names, for docs and `keel env list`.
pub fn task_types() -> &'static [&'static str] {
    &TYPES
}
