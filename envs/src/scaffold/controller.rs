//! [`ScaffoldController`]: one call per RL step ties cards, EMAs, modes, reviews and pruning.

use std::collections::BTreeMap;

use serde::Serialize;

use super::bank::{Bank, RenderedScaffold};
use super::config::ScaffoldConfig;
use super::edit::{AppliedEdit, RejectedEdit};
use super::error::ScaffoldError;
use super::evidence::{EvidenceCard, GroupRecord};
use super::mode::{ema_update, Mode};
use super::reviewer::{ReviewRequest, Reviewer, RuleReviewer};
use super::state::{ModeDecision, ScaffoldState};
use crate::tokenizer::Tokenizer;

/// What one task type's review did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TypeReview {
    /// The task type.
    pub task_type: String,
    /// Its groups in this step.
    pub groups: usize,
    /// This step's observation: mean over its groups of the group mean reward.
    pub obs: f64,
    /// The EMA after this step's update.
    pub ema: f64,
    /// The bank pressure before the review.
    pub pressure: f64,
    /// The mode chosen.
    pub mode: Mode,
    /// Edits applied.
    pub applied: Vec<AppliedEdit>,
    /// Edits rejected, with reasons.
    pub rejected: Vec<RejectedEdit>,
    /// Entries the fallback prune removed after a `FORCED_PRUNE` review, newest first.
    pub pruned: Vec<u64>,
    /// The reviewer's error, when it failed (the review then changed nothing but the prune).
    pub reviewer_error: Option<String>,
}

/// What [`ScaffoldController::observe_step`] did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepReview {
    /// The RL step.
    pub step: u64,
    /// One review per task type seen in the step, in type order.
    pub types: Vec<TypeReview>,
    /// The bank version before the step.
    pub version_before: u64,
    /// The bank version after the step (render it for the next step's rollouts).
    pub version: u64,
    /// The bank pressure after the step.
    pub pressure: f64,
    /// Entries after the step.
    pub entries: usize,
}

impl StepReview {
    /// Whether the bank changed in this step.
    pub fn changed(&self) -> bool {
        self.version != self.version_before
    }
}

/// The PATS controller of one training run (one env).
pub struct ScaffoldController {
    config: ScaffoldConfig,
    vocab: Tokenizer,
    reviewer: Box<dyn Reviewer>,
    state: ScaffoldState,
}

impl ScaffoldController {
    /// A fresh controller (empty bank) with `reviewer`; `vocab` is the env's tokenizer.
    pub fn new(
        config: ScaffoldConfig,
        vocab: Tokenizer,
        reviewer: Box<dyn Reviewer>,
    ) -> Result<ScaffoldController, ScaffoldError> {
        ScaffoldController::from_state(config, vocab, reviewer, ScaffoldState::new())
    }

    /// A fresh controller with the [`RuleReviewer`].
    pub fn with_rule_reviewer(
        config: ScaffoldConfig,
        vocab: Tokenizer,
    ) -> Result<ScaffoldController, ScaffoldError> {
        ScaffoldController::new(config, vocab, Box::new(RuleReviewer::default()))
    }

    /// A controller resuming `state` (from a checkpoint): checks the config, the state and that
    /// every entry encodes with `vocab`.
    pub fn from_state(
        config: ScaffoldConfig,
        vocab: Tokenizer,
        reviewer: Box<dyn Reviewer>,
        state: ScaffoldState,
    ) -> Result<ScaffoldController, ScaffoldError> {
        config.validate()?;
        state.validate()?;
        state.bank.check_vocabulary(&vocab)?;
        Ok(ScaffoldController {
            config,
            vocab,
            reviewer,
            state,
        })
    }

    /// Replaces the state (a collapse-guard rewind to a checkpoint): checked like `from_state`;
    /// on error nothing changes.
    pub fn restore_state(&mut self, state: ScaffoldState) -> Result<(), ScaffoldError> {
        state.validate()?;
        state.bank.check_vocabulary(&self.vocab)?;
        self.state = state;
        Ok(())
    }

    /// The config.
    pub fn config(&self) -> &ScaffoldConfig {
        &self.config
    }

    /// The state to persist (`to_json_bytes`).
    pub fn state(&self) -> &ScaffoldState {
        &self.state
    }

    /// The bank.
    pub fn bank(&self) -> &Bank {
        &self.state.bank
    }

    /// The scaffold for a training prompt of `task_type`, within `config.render_words`. Never
    /// use it for evaluation rollouts: they get the bare prompt.
    pub fn render(&self, task_type: &str) -> RenderedScaffold {
        self.state.bank.render(task_type, self.config.render_words)
    }

    /// Observes one RL step's rollout groups (the latest policy's): builds evidence cards,
    /// updates each seen type's EMA once, then per type (in order) picks the mode, asks the
    /// reviewer, applies the valid edits and, after a `FORCED_PRUNE` review still at pressure
    /// ≥ 1, prunes the newest entries. Errors (bad groups, a step not after the last) leave the
    /// state unchanged; a reviewer's error is recorded in its [`TypeReview`] instead.
    pub fn observe_step(
        &mut self,
        step: u64,
        groups: &[GroupRecord],
    ) -> Result<StepReview, ScaffoldError> {
        if let Some(last) = self.state.step.filter(|&last| step <= last) {
            return Err(ScaffoldError::StepNotIncreasing { step, last });
        }
        for g in groups {
            g.validate()?;
        }
        let version_before = self.state.bank.version;
        let mut by_type: BTreeMap<&str, Vec<EvidenceCard>> = BTreeMap::new();
        for g in groups {
            let card = EvidenceCard::from_group(self.state.next_card_id, step, g);
            self.state.next_card_id += 1;
            by_type.entry(g.task_type.as_str()).or_default().push(card);
        }
        let mut types = Vec::new();
        for (task_type, cards) in by_type {
            let obs = cards.iter().map(|c| c.mean_reward).sum::<f64>() / cards.len() as f64;
            let ema = ema_update(self.state.ema(task_type), obs, self.config.alpha).clamp(0.0, 1.0);
            self.state.ema.insert(task_type.to_string(), ema);
            types.push((task_type.to_string(), obs, ema, cards));
        }
        let mut reviews = Vec::new();
        for (task_type, obs, ema, cards) in types {
            let pressure = self.state.bank.pressure(&self.config);
            let mode = Mode::choose(ema, pressure, &self.config);
            let request = ReviewRequest {
                step,
                mode,
                task_type: task_type.clone(),
                ema,
                pressure,
                budget: mode.budget(),
                cards,
                bank: self.state.bank.clone(),
                config: self.config.clone(),
            };
            let mut review = TypeReview {
                task_type: task_type.clone(),
                groups: request.cards.len(),
                obs,
                ema,
                pressure,
                mode,
                applied: Vec::new(),
                rejected: Vec::new(),
                pruned: Vec::new(),
                reviewer_error: None,
            };
            match self.reviewer.review(&request) {
                Ok(edits) => {
                    let report = self.state.bank.apply(&request, &edits, &self.vocab);
                    review.applied = report.applied;
                    review.rejected = report.rejected;
                }
                Err(e) => review.reviewer_error = Some(e.to_string()),
            }
            if mode == Mode::ForcedPrune {
                review.pruned = self.state.bank.prune_newest(&self.config);
            }
            self.state.history.push(ModeDecision {
                step,
                task_type,
                mode,
                ema,
                pressure,
            });
            reviews.push(review);
        }
        let excess = self
            .state
            .history
            .len()
            .saturating_sub(self.config.history_len);
        self.state.history.drain(..excess);
        self.state.step = Some(step);
        Ok(StepReview {
            step,
            types: reviews,
            version_before,
            version: self.state.bank.version,
            pressure: self.state.bank.pressure(&self.config),
            entries: self.state.bank.len(),
        })
    }
}
