//! The [`Reviewer`] interface and the deterministic default, [`RuleReviewer`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::bank::{Bank, Entry, EntryKind};
use super::config::ScaffoldConfig;
use super::edit::Edit;
use super::error::ScaffoldError;
use super::evidence::{EpisodeRecord, EvidenceCard};
use super::mode::{pressure, Budget, Mode};
use super::text::{word_count, word_jaccard};

/// Everything a reviewer sees for one task type in one step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReviewRequest {
    /// The RL step.
    pub step: u64,
    /// The edit mode (from `ema` and `pressure`).
    pub mode: Mode,
    /// The task type under review; adds may only target it (or be general).
    pub task_type: String,
    /// Its success-rate EMA after this step's update.
    pub ema: f64,
    /// The bank pressure before this review.
    pub pressure: f64,
    /// What the review may add (`mode.budget()`).
    pub budget: Budget,
    /// This step's cards of `task_type`; edits cite their ids.
    pub cards: Vec<EvidenceCard>,
    /// The bank before this review.
    pub bank: Bank,
    /// Limits the edits are checked against.
    pub config: ScaffoldConfig,
}

/// Proposes bank edits for one review. Plug an LLM reviewer in by implementing it; whatever it
/// proposes is validated by [`Bank::apply`], so a reviewer cannot break the bank's invariants.
pub trait Reviewer: Send {
    /// A name for logs and errors.
    fn name(&self) -> &str;
    /// The edits proposed for `request` (an error is recorded and the review skipped).
    fn review(&mut self, request: &ReviewRequest) -> Result<Vec<Edit>, ScaffoldError>;
}

/// The deterministic default reviewer (SC-8):
/// - `EXPAND`: adds a skill of the type, the most common procedure (verbs of the actions, in
///   order) of successful episodes (then the most common successful first action, then
///   action), and a mistake, the most common procedure of two or more verbs only failures
///   followed (then the most common invalid action, or the most common action only failures
///   took);
/// - `REVISE`: updates (or deletes) the oldest entry of the type the evidence contradicts — a
///   skill followed more by failures than by successes, a mistake taken more by successes than
///   by failures; with none contradicted, adds like `EXPAND` within the budget;
/// - `COMPRESS`: deletes the oldest entry of the type, mistakes first;
/// - `FORCED_PRUNE`: deletes entries of the type and general ones, least supported by this
///   step's evidence first (newest first among equals), until the pressure is below 1.
///
/// Every add/update cites up to `max_cites` supporting cards (so at least two when two exist).
#[derive(Clone, Debug)]
pub struct RuleReviewer {
    /// Most cards one edit cites.
    pub max_cites: usize,
}

impl Default for RuleReviewer {
    fn default() -> Self {
        RuleReviewer { max_cites: 3 }
    }
}

/// Episodes and cards supporting one candidate text.
#[derive(Default)]
struct Tally {
    first: usize,
    episodes: usize,
    cards: BTreeSet<u64>,
}

fn valid_actions(e: &EpisodeRecord) -> impl Iterator<Item = &str> {
    e.turns
        .iter()
        .filter(|t| !t.invalid && !t.action.is_empty())
        .map(|t| t.action.as_str())
}

fn ranked(tallies: BTreeMap<String, Tally>) -> Vec<(String, BTreeSet<u64>)> {
    let mut v: Vec<(String, Tally)> = tallies.into_iter().collect();
    // Stable on the BTreeMap's text order: ties go to the lexicographically smallest text.
    v.sort_by_key(|(_, t)| std::cmp::Reverse((t.first, t.episodes)));
    v.into_iter().map(|(t, tally)| (t, tally.cards)).collect()
}

/// An episode's procedure: the first word (the verb) of each valid action, in order — what a
/// tip can say about a task type without naming one task's objects and places.
fn procedure(e: &EpisodeRecord) -> String {
    valid_actions(e)
        .filter_map(|a| a.split_whitespace().next())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Procedures of `episodes` (filtered by `keep`), by episodes.
fn procedure_candidates(
    cards: &[EvidenceCard],
    keep: impl Fn(&EpisodeRecord) -> bool,
) -> Vec<(String, BTreeSet<u64>)> {
    let mut t: BTreeMap<String, Tally> = BTreeMap::new();
    for c in cards {
        for e in c.episodes.iter().filter(|e| keep(e)) {
            let p = procedure(e);
            if p.is_empty() {
                continue;
            }
            let tally = t.entry(p).or_default();
            tally.episodes += 1;
            tally.first += 1;
            tally.cards.insert(c.id);
        }
    }
    ranked(t)
}

/// Skill candidates: the procedures of successful episodes first (by episodes), then their
/// actions, by first-action count, then episodes.
fn skill_candidates(cards: &[EvidenceCard]) -> Vec<(String, BTreeSet<u64>)> {
    let mut out = procedure_candidates(cards, |e| e.success);
    out.extend(action_candidates(cards));
    out
}

/// Actions of successful episodes, by first-action count, then episodes.
fn action_candidates(cards: &[EvidenceCard]) -> Vec<(String, BTreeSet<u64>)> {
    let mut t: BTreeMap<String, Tally> = BTreeMap::new();
    for c in cards {
        for e in c.episodes.iter().filter(|e| e.success) {
            let distinct: BTreeSet<&str> = valid_actions(e).collect();
            for a in distinct {
                let tally = t.entry(a.to_string()).or_default();
                tally.episodes += 1;
                tally.cards.insert(c.id);
            }
            if let Some(first) = valid_actions(e).next() {
                t.entry(first.to_string()).or_default().first += 1;
            }
        }
    }
    ranked(t)
}

/// Mistake candidates: with successes to contrast, the procedures only failed episodes
/// followed; then invalid actions by episodes; without any, the valid actions only failed
/// episodes took.
fn mistake_candidates(cards: &[EvidenceCard]) -> Vec<(String, BTreeSet<u64>)> {
    let good: BTreeSet<String> = cards
        .iter()
        .flat_map(|c| c.episodes.iter().filter(|e| e.success))
        .map(procedure)
        .collect();
    let mut out = if good.is_empty() {
        Vec::new()
    } else {
        // A one-verb procedure says nothing about the order of steps: not a mistake to name.
        procedure_candidates(cards, |e| {
            let p = procedure(e);
            !e.success && p.contains(' ') && !good.contains(&p)
        })
    };
    out.extend(action_mistakes(cards));
    out
}

/// Invalid actions by episodes; without any, and with successes to contrast, the valid actions
/// only failed episodes took.
fn action_mistakes(cards: &[EvidenceCard]) -> Vec<(String, BTreeSet<u64>)> {
    let mut invalid: BTreeMap<String, Tally> = BTreeMap::new();
    for c in cards {
        for e in &c.episodes {
            let distinct: BTreeSet<&str> = e
                .turns
                .iter()
                .filter(|t| t.invalid && !t.action.is_empty())
                .map(|t| t.action.as_str())
                .collect();
            for a in distinct {
                let tally = invalid.entry(a.to_string()).or_default();
                tally.episodes += 1;
                tally.cards.insert(c.id);
            }
        }
    }
    if !invalid.is_empty() {
        return ranked(invalid);
    }
    let succeeded: BTreeSet<&str> = cards
        .iter()
        .flat_map(|c| c.episodes.iter().filter(|e| e.success))
        .flat_map(valid_actions)
        .collect();
    if succeeded.is_empty() {
        return Vec::new();
    }
    let mut failed: BTreeMap<String, Tally> = BTreeMap::new();
    for c in cards {
        for e in c.episodes.iter().filter(|e| !e.success) {
            let distinct: BTreeSet<&str> = valid_actions(e).collect();
            for a in distinct.into_iter().filter(|a| !succeeded.contains(a)) {
                let tally = failed.entry(a.to_string()).or_default();
                tally.episodes += 1;
                tally.cards.insert(c.id);
            }
        }
    }
    ranked(failed)
}

/// Whether `e` followed the procedure `text` or took an action matching it (equal up to the
/// dedup word-Jaccard).
fn took(e: &EpisodeRecord, text: &str, threshold: f64) -> bool {
    procedure(e) == text
        || e.turns
            .iter()
            .any(|t| t.action == text || word_jaccard(&t.action, text) >= threshold)
}

/// (successful, failed) episodes that took `text`, and the cards holding them.
fn support(cards: &[EvidenceCard], text: &str, threshold: f64) -> (usize, usize, BTreeSet<u64>) {
    let (mut ok, mut bad, mut ids) = (0, 0, BTreeSet::new());
    for c in cards {
        for e in c.episodes.iter().filter(|e| took(e, text, threshold)) {
            if e.success {
                ok += 1;
            } else {
                bad += 1;
            }
            ids.insert(c.id);
        }
    }
    (ok, bad, ids)
}

impl RuleReviewer {
    fn cites(&self, cards: &BTreeSet<u64>) -> Vec<u64> {
        cards.iter().copied().take(self.max_cites.max(1)).collect()
    }

    /// The best candidate that fits an entry and duplicates nothing shown with the type.
    fn pick(
        &self,
        candidates: Vec<(String, BTreeSet<u64>)>,
        req: &ReviewRequest,
        except: Option<u64>,
        taken: &[String],
    ) -> Option<(String, Vec<u64>)> {
        let cfg = &req.config;
        candidates.into_iter().find_map(|(text, cards)| {
            let fits = word_count(&text) <= cfg.max_entry_words
                && !taken
                    .iter()
                    .any(|t| word_jaccard(t, &text) >= cfg.dedup_jaccard)
                && req
                    .bank
                    .find_duplicate(&text, Some(&req.task_type), except, cfg.dedup_jaccard)
                    .is_none();
            fits.then(|| (text, self.cites(&cards)))
        })
    }

    fn adds(&self, req: &ReviewRequest) -> Vec<Edit> {
        let mut out = Vec::new();
        let mut taken = Vec::new();
        if req.budget.skills > 0 {
            if let Some((text, cites)) = self.pick(skill_candidates(&req.cards), req, None, &taken)
            {
                taken.push(text.clone());
                out.push(Edit::Add {
                    kind: EntryKind::Skill,
                    task_type: Some(req.task_type.clone()),
                    text,
                    cites,
                });
            }
        }
        if req.budget.mistakes > 0 {
            if let Some((text, cites)) =
                self.pick(mistake_candidates(&req.cards), req, None, &taken)
            {
                out.push(Edit::Add {
                    kind: EntryKind::Mistake,
                    task_type: Some(req.task_type.clone()),
                    text,
                    cites,
                });
            }
        }
        out
    }

    fn typed<'r>(&self, req: &'r ReviewRequest) -> impl Iterator<Item = &'r Entry> {
        req.bank
            .entries()
            .iter()
            .filter(move |e| e.task_type.as_deref() == Some(req.task_type.as_str()))
    }

    fn revise(&self, req: &ReviewRequest) -> Vec<Edit> {
        let th = req.config.dedup_jaccard;
        for e in self.typed(req) {
            let (ok, bad, ids) = support(&req.cards, &e.text, th);
            match e.kind {
                EntryKind::Skill if bad > ok => {
                    let old = [e.text.clone()];
                    let better = self.pick(skill_candidates(&req.cards), req, Some(e.id), &old);
                    return vec![match better {
                        Some((text, cites)) => {
                            let mut all: BTreeSet<u64> = ids;
                            all.extend(cites);
                            Edit::Update {
                                id: e.id,
                                text,
                                cites: self.cites(&all),
                            }
                        }
                        None => Edit::Delete { id: e.id },
                    }];
                }
                EntryKind::Mistake if ok > bad => return vec![Edit::Delete { id: e.id }],
                _ => {}
            }
        }
        self.adds(req)
    }

    fn compress(&self, req: &ReviewRequest) -> Vec<Edit> {
        let mut typed: Vec<&Entry> = self.typed(req).collect();
        // Mistakes first (the type is solved, so they are rarely made), oldest first.
        typed.sort_by_key(|e| (e.kind != EntryKind::Mistake, e.id));
        typed
            .first()
            .map(|e| vec![Edit::Delete { id: e.id }])
            .unwrap_or_default()
    }

    fn prune(&self, req: &ReviewRequest) -> Vec<Edit> {
        let th = req.config.dedup_jaccard;
        let mut scored: Vec<(usize, u64, usize)> = req
            .bank
            .entries()
            .iter()
            .filter(|e| e.shown_for(&req.task_type))
            .map(|e| {
                let (ok, bad, _) = support(&req.cards, &e.text, th);
                let value = match e.kind {
                    EntryKind::Skill => ok,
                    EntryKind::Mistake => ok + bad,
                };
                (value, e.id, e.words())
            })
            .collect();
        // Least value first, newest first among equals.
        scored.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let (mut n, mut words) = (req.bank.len(), req.bank.words());
        let mut out = Vec::new();
        for (_, id, w) in scored {
            if pressure(n, words, &req.config) < 1.0 {
                break;
            }
            n -= 1;
            words -= w;
            out.push(Edit::Delete { id });
        }
        out
    }
}

impl Reviewer for RuleReviewer {
    fn name(&self) -> &str {
        "rule"
    }

    fn review(&mut self, req: &ReviewRequest) -> Result<Vec<Edit>, ScaffoldError> {
        Ok(match req.mode {
            Mode::Expand => self.adds(req),
            Mode::Revise => self.revise(req),
            Mode::Compress => self.compress(req),
            Mode::ForcedPrune => self.prune(req),
        })
    }
}
