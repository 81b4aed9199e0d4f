//! `search-qa`: search-augmented question answering over a generated knowledge base (the
//! procedural counterpart of NQ / HotpotQA).
//!
//! Each task is a small world (see [`world`]) and a single- or multi-hop question. Actions:
//! - `search W…` ranks the world's one-fact documents with BM25 and shows the top two as
//!   `doc … doc …` (or `no results`);
//! - `answer W…` ends the episode with reward = token F1 against the gold answer (success = exact
//!   match);
//! - anything else is invalid (`error invalid action`).
//!
//! The difficulty (1..=3) is the most hops a question has; `max_turns = difficulty + 3`.
//!
//! Invariants (beside EN-1..EN-9):
//! - SQ-1 `progress` counts resolved hops: it grows by one exactly when a search shows the next
//!   hop's fact; the oracle searches each hop (KB-3) and then answers, in `hops + 1` turns.
//! - SQ-2 The anchor state is (question, progress, sorted entities seen, done).

pub mod world;

use serde::{Deserialize, Serialize};

use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::snapshot::EnvSnapshot;
use world::{f1, World};

pub(crate) const INVALID: &str = "error invalid action";

/// The search state shared by `search-qa` and `search-team`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Inquiry {
    pub(crate) world: World,
    pub(crate) progress: usize,
    pub(crate) seen: Vec<String>,
}

impl Inquiry {
    pub(crate) fn new(seed: u64, max_hops: usize) -> Inquiry {
        let world = World::generate(seed, max_hops);
        let seen = vec![world.chain[0].clone()];
        Inquiry {
            world,
            progress: 0,
            seen,
        }
    }

    /// Runs a search; returns the observation (SQ-1).
    pub(crate) fn search(&mut self, query: &[&str]) -> String {
        let hits: Vec<String> = self
            .world
            .search(query)
            .into_iter()
            .map(str::to_string)
            .collect();
        if hits.is_empty() {
            return "no results".into();
        }
        const RELATION_WORDS: [&str; 6] = ["born", "in", "works", "for", "located", "based"];
        for h in &hits {
            if self.progress < self.world.hops() && *h == self.world.hop_doc(self.progress) {
                self.progress += 1;
            }
            for w in h.split_whitespace() {
                if !RELATION_WORDS.contains(&w) && !self.seen.iter().any(|s| s == w) {
                    self.seen.push(w.to_string());
                }
            }
        }
        hits.iter()
            .map(|h| format!("doc {h}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The oracle's next action: the next hop's query, then the answer.
    pub(crate) fn oracle(&self) -> String {
        if self.progress < self.world.hops() {
            self.world.hop_query(self.progress)
        } else {
            format!("answer {}", self.world.answer())
        }
    }

    pub(crate) fn searches(&self) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.seen {
            out.push(format!("search {e}"));
            for kw in ["born", "works", "located", "based"] {
                out.push(format!("search {e} {kw}"));
            }
        }
        out
    }

    pub(crate) fn answers(&self) -> Vec<String> {
        self.seen.iter().map(|e| format!("answer {e}")).collect()
    }

    pub(crate) fn reward(&self, answer: &[&str]) -> f32 {
        f1(answer, &[self.world.answer()])
    }

    pub(crate) fn anchor(&self) -> String {
        let mut seen = self.seen.clone();
        seen.sort();
        format!(
            "{} progress {} seen {}",
            self.world.question,
            self.progress,
            seen.join(" ")
        )
    }
}

/// The `search-qa` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SearchQaEnv {
    difficulty: usize,
    inquiry: Inquiry,
    turns: usize,
    done: bool,
    solved: bool,
}

impl SearchQaEnv {
    /// A new env with questions of at most `difficulty` hops (clamped to 1..=3).
    pub fn new(difficulty: usize) -> Self {
        let difficulty = difficulty.clamp(1, 3);
        SearchQaEnv {
            difficulty,
            inquiry: Inquiry::new(0, difficulty),
            turns: 0,
            done: true,
            solved: false,
        }
    }
}

/// The words of `search-qa` (TK-1).
pub fn vocabulary() -> Vec<String> {
    let mut w = world::words();
    w.extend_text(["search answer error invalid action"]);
    w.into_vec()
}

impl Env for SearchQaEnv {
    fn name(&self) -> &str {
        "search-qa"
    }

    /// The question's number of hops: `hops-1`, `hops-2`, `hops-3`.
    fn task_type(&self) -> String {
        format!("hops-{}", self.inquiry.world.hops())
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.inquiry = Inquiry::new(task_seed, self.difficulty);
        self.turns = 0;
        self.done = false;
        self.solved = false;
        self.inquiry.world.question.clone()
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.into(), 0.0, true, true);
        }
        self.turns += 1;
        let words: Vec<&str> = action.split_whitespace().collect();
        let (obs, reward, invalid) = match words.split_first() {
            Some((&"search", q)) if !q.is_empty() => (self.inquiry.search(q), 0.0, false),
            Some((&"answer", a)) if !a.is_empty() => {
                let r = self.inquiry.reward(a);
                self.done = true;
                self.solved = r >= 1.0;
                (String::new(), r, false)
            }
            _ => (INVALID.into(), 0.0, true),
        };
        if self.turns >= self.max_turns() {
            self.done = true;
        }
        outcome_of(self, obs, reward, self.done, invalid)
    }

    fn oracle_action(&self) -> String {
        self.inquiry.oracle()
    }

    fn max_turns(&self) -> usize {
        self.difficulty + 3
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
        let mut out = self.inquiry.searches();
        out.extend(self.inquiry.answers());
        out
    }

    fn anchor_state(&self) -> String {
        format!("{} done {}", self.inquiry.anchor(), self.done)
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("search-qa", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("search-qa")?;
        Ok(())
    }
}
