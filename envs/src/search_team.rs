//! `search-team`: three-agent search QA for Dr. MAS (a router, a searcher and an answerer).
//!
//! The task is a `search-qa` question (`question … router turn`). Agent 0, the router, sends the
//! turn on with `route search` (`searcher turn`) or `route answer` (`answerer turn`); agent 1, the
//! searcher, runs `search W…` (top-two BM25 snippets, then `router turn`); agent 2, the answerer,
//! ends the episode with `answer W…` (reward = token F1, success = exact match). Invalid actions
//! keep the turn with the same agent.
//!
//! The difficulty (1..=3) is the most hops; `max_turns = 3·difficulty + 4`.
//!
//! Invariants (beside EN-1..EN-9 and SQ-1):
//! - TM-1 The agent order is router → (searcher → router)* → answerer; `agent_id` names who acts.
//! - TM-2 The oracle routes to search while hops remain, searches each hop (KB-3), then answers:
//!   `3·hops + 2` turns.

use serde::{Deserialize, Serialize};

use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::search_qa::{world, Inquiry, INVALID};
use crate::snapshot::EnvSnapshot;

/// Agent id of the router.
pub const ROUTER: u32 = 0;
/// Agent id of the searcher.
pub const SEARCHER: u32 = 1;
/// Agent id of the answerer.
pub const ANSWERER: u32 = 2;

/// The `search-team` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SearchTeamEnv {
    difficulty: usize,
    inquiry: Inquiry,
    agent: u32,
    turns: usize,
    done: bool,
    solved: bool,
}

/// The words of `search-team` (TK-1).
pub fn vocabulary() -> Vec<String> {
    let mut w = world::words();
    w.extend_text(["search answer error invalid action route router searcher answerer turn"]);
    w.into_vec()
}

impl SearchTeamEnv {
    /// A new env with questions of at most `difficulty` hops (clamped to 1..=3).
    pub fn new(difficulty: usize) -> Self {
        let difficulty = difficulty.clamp(1, 3);
        SearchTeamEnv {
            difficulty,
            inquiry: Inquiry::new(0, difficulty),
            agent: ROUTER,
            turns: 0,
            done: true,
            solved: false,
        }
    }

    fn apply(&mut self, words: &[&str]) -> Option<(String, f32)> {
        match (self.agent, words) {
            (ROUTER, ["route", "search"]) => {
                self.agent = SEARCHER;
                Some(("searcher turn".into(), 0.0))
            }
            (ROUTER, ["route", "answer"]) => {
                self.agent = ANSWERER;
                Some(("answerer turn".into(), 0.0))
            }
            (SEARCHER, ["search", q @ ..]) if !q.is_empty() => {
                let obs = self.inquiry.search(q);
                self.agent = ROUTER;
                Some((format!("{obs} router turn"), 0.0))
            }
            (ANSWERER, ["answer", a @ ..]) if !a.is_empty() => {
                let r = self.inquiry.reward(a);
                self.done = true;
                self.solved = r >= 1.0;
                Some((String::new(), r))
            }
            _ => None,
        }
    }
}

impl Env for SearchTeamEnv {
    fn name(&self) -> &str {
        "search-team"
    }

    /// The question's number of hops: `hops-1`, `hops-2`, `hops-3`.
    fn task_type(&self) -> String {
        format!("hops-{}", self.inquiry.world.hops())
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.inquiry = Inquiry::new(task_seed, self.difficulty);
        self.agent = ROUTER;
        self.turns = 0;
        self.done = false;
        self.solved = false;
        format!("{} router turn", self.inquiry.world.question)
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.into(), 0.0, true, true);
        }
        self.turns += 1;
        let words: Vec<&str> = action.split_whitespace().collect();
        let (obs, reward, invalid) = match self.apply(&words) {
            Some((obs, r)) => (obs, r, false),
            None => (INVALID.to_string(), 0.0, true),
        };
        if self.turns >= self.max_turns() {
            self.done = true;
        }
        outcome_of(self, obs, reward, self.done, invalid)
    }

    fn oracle_action(&self) -> String {
        let hops_left = self.inquiry.progress < self.inquiry.world.hops();
        match self.agent {
            ROUTER if hops_left => "route search".into(),
            ROUTER => "route answer".into(),
            SEARCHER if hops_left => self.inquiry.oracle(),
            SEARCHER => format!("search {}", self.inquiry.world.answer()),
            // The answerer can only name what the team has seen (EN-9).
            _ => {
                let gold = self.inquiry.world.answer();
                let seen = &self.inquiry.seen;
                let pick = if seen.iter().any(|s| s == gold) {
                    gold
                } else {
                    seen.last().map_or(gold, String::as_str)
                };
                format!("answer {pick}")
            }
        }
    }

    fn max_turns(&self) -> usize {
        3 * self.difficulty + 4
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
        match self.agent {
            ROUTER => vec!["route search".into(), "route answer".into()],
            SEARCHER => self.inquiry.searches(),
            _ => self.inquiry.answers(),
        }
    }

    fn agent_id(&self) -> u32 {
        self.agent
    }

    fn anchor_state(&self) -> String {
        format!(
            "{} agent {} done {}",
            self.inquiry.anchor(),
            self.agent,
            self.done
        )
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("search-team", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("search-team")?;
        Ok(())
    }
}
