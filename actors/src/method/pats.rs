//! PATS at run time: the scaffold bank generations render into training prompts, reviewed after
//! each trained batch, versioned in the store, restored on a resume and on a rewind.
//!
//! Invariants:
//! - MS-2 (PATS): the bank a generation uses is the one in force when it was asked for; a
//!   review runs after each trained batch that carries rollout groups, and every bank version it
//!   produces is stored create-only (`state/pats/scaffold-<version>.json`) before any generation
//!   uses it; checkpoints name the stored state in `method_state["pats"]`.
//! - MS-4 (state objects): trunk records and bank versions are stored create-only under keys
//!   that carry the writing life's tag (`life_tag`), so an object stored by a life that crashed
//!   before any checkpoint named it is left in place (an orphan) rather than overwritten; the
//!   checkpoint names the exact key a resumed run reads.
//!
//! Generators render the bank through [`renderer`] into training prompts only (GN-8,
//! `generator.rs`) and answer the groups a review reads ([`group_records`]).
//! The runtime sits behind a mutex so that the review runs on the blocking pool (a reviewer may
//! be an HTTP service) while the controller keeps the handle; nothing else touches it then
//! (the controller starts nothing while a review is out, MS-2).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use keel_envs::scaffold::{
    Bank, GroupRecord, HttpReviewer, Reviewer, RuleReviewer, ScaffoldController, ScaffoldError,
    ScaffoldState, StepReview,
};
use keel_learner::hf::ChatCodec;
use keel_store::{CheckpointManifest, RolloutBatch};
use serde::{Deserialize, Serialize};

use super::{
    Demos, MethodFuture, MethodIo, MethodRuntime, Restore, Review, RewindRead, Rewound, Sampling,
    StateKeys, StateWrite,
};
use crate::config::TrainConfig;
use crate::controller::ReadyBatch;
use crate::demo_tokens::SftSequence;
use crate::error::ActorError;
use crate::events::MethodDetail;
use crate::metrics::TrainMetrics;
use crate::rollout::ScaffoldRenderer;
use crate::setup::ModelSetup;

/// The key of the PATS scaffold state in `method_state`.
pub const PATS_STATE: &str = "pats";

/// PATS: where the scaffold state lives in the store (MS-2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatsPointer {
    /// Store key of the scaffold state.
    pub key: String,
    /// Its bank version.
    pub version: u64,
}

/// PATS at run time: the controller of the bank and the bank generators render.
pub struct PatsRuntime {
    /// Reviews and edits the bank.
    pub controller: ScaffoldController,
    /// The bank in force (handed to generations).
    pub bank: Arc<Bank>,
    /// Where the state in force is stored.
    pub pointer: Option<PatsPointer>,
}

impl PatsRuntime {
    /// Reviews one trained batch's groups; answers the review and, when the bank changed, the
    /// bytes and key to store the new state under (MS-2).
    pub fn review(
        &mut self,
        step: u64,
        groups: &[GroupRecord],
        key_of: impl Fn(u64) -> String,
    ) -> Result<(StepReview, Option<StateWrite>), ActorError> {
        let review = self
            .controller
            .observe_step(step, groups)
            .map_err(|e| ActorError::Internal(format!("PATS review at step {step}: {e}")))?;
        if !review.changed() {
            return Ok((review, None));
        }
        let state: &ScaffoldState = self.controller.state();
        let bytes = state
            .to_json_bytes()
            .map_err(|e| ActorError::Internal(format!("PATS state: {e}")))?;
        let version = self.controller.bank().version();
        let key = key_of(version);
        self.bank = Arc::new(self.controller.bank().clone());
        self.pointer = Some(PatsPointer {
            key: key.clone(),
            version,
        });
        Ok((review, Some((key, bytes))))
    }

    /// Puts the bank back to `state` (None: a fresh bank) stored at `pointer` (a rewind, MS-2).
    fn restore(&mut self, state: Option<(ScaffoldState, PatsPointer)>) -> Result<(), ActorError> {
        let (state, pointer) = match state {
            Some((state, pointer)) => (state, Some(pointer)),
            None => (ScaffoldState::new(), None),
        };
        self.controller
            .restore_state(state)
            .map_err(|e| ActorError::Resume(format!("PATS rewind: {e}")))?;
        self.bank = Arc::new(self.controller.bank().clone());
        self.pointer = pointer;
        Ok(())
    }
}

/// PATS's controller side (MS-2).
#[derive(Default)]
pub struct Pats {
    runtime: Option<Arc<Mutex<PatsRuntime>>>,
}

impl Pats {
    fn locked(&self) -> Option<MutexGuard<'_, PatsRuntime>> {
        self.runtime.as_ref().and_then(|r| r.lock().ok())
    }
}

/// The key a bank version is stored under (MS-4).
fn bank_key(keys: &StateKeys, version: u64) -> String {
    keys.key("pats", &format!("scaffold-{version:06}"))
}

impl MethodRuntime for Pats {
    fn name(&self) -> &'static str {
        "pats"
    }

    fn sampling(&self, cfg: &TrainConfig) -> Sampling {
        Sampling {
            scaffold_words: cfg.pats.render_words,
            ..Sampling::of(cfg)
        }
    }

    fn reuses_stored_batches(&self) -> bool {
        // MS-2: a review needs a batch's rollout groups (with their task types), which the
        // stored batch does not carry.
        false
    }

    fn sft_demos<'a>(
        &'a mut self,
        io: &'a MethodIo,
        model: &'a ModelSetup,
        demos: Demos,
        method_state: &'a mut BTreeMap<String, String>,
    ) -> MethodFuture<'a, Vec<SftSequence>> {
        Box::pin(seed(io, model, demos, method_state))
    }

    fn start<'a>(
        &'a mut self,
        io: &'a MethodIo,
        model: &'a ModelSetup,
        method_state: &'a BTreeMap<String, String>,
        _version: u64,
    ) -> MethodFuture<'a, ()> {
        Box::pin(async move {
            let runtime = load(io, model, method_state).await?;
            self.runtime = Some(Arc::new(Mutex::new(runtime)));
            Ok(())
        })
    }

    fn scaffold(&self) -> Option<Arc<Bank>> {
        self.locked().map(|p| p.bank.clone())
    }

    fn review(
        &mut self,
        step: u64,
        batch: &ReadyBatch,
        io: &MethodIo,
    ) -> Option<MethodFuture<'static, Review>> {
        if batch.groups.is_empty() {
            return None;
        }
        let runtime = self.runtime.clone()?;
        let (groups, pool) = (batch.groups.clone(), io.io.clone());
        let keys = io.keys();
        Some(Box::pin(async move {
            let reviewed = pool
                .spawn_blocking(move || {
                    let mut pats = runtime
                        .lock()
                        .map_err(|e| ActorError::Internal(format!("PATS runtime: {e}")))?;
                    pats.review(step, &groups, |v| bank_key(&keys, v))
                })
                .await
                .map_err(|e| ActorError::Internal(format!("PATS review at step {step}: {e}")))?;
            Ok(match reviewed {
                Ok((review, write)) => Review::Done {
                    detail: Box::new(MethodDetail::of_record(&review)),
                    write,
                },
                Err(e) => Review::Skipped(e),
            })
        }))
    }

    fn export(&self, m: &TrainMetrics) {
        if let Some(pats) = self.locked() {
            m.scaffold_version.set(pats.bank.version() as f64);
            m.scaffold_entries.set(pats.bank.len() as f64);
        }
    }

    fn save_state(&self, method_state: &mut BTreeMap<String, String>) {
        if let Some(p) = self.locked().and_then(|p| p.pointer.clone()) {
            method_state.insert(
                PATS_STATE.to_string(),
                serde_json::to_string(&p).unwrap_or_default(),
            );
        }
    }

    fn rewind_reader(&self, io: &MethodIo) -> Option<RewindRead> {
        let runtime = self.runtime.clone()?;
        let io = io.clone();
        Some(Box::new(
            move |target: Arc<CheckpointManifest>| -> MethodFuture<'static, Restore> {
                Box::pin(async move {
                    // MS-2: the bank goes back with the weights it was trained under.
                    let state = read_target(&io, &target).await?;
                    let restore: Restore = Box::new(move |_: &Rewound<'_>| {
                        runtime
                            .lock()
                            .map_err(|e| ActorError::Internal(format!("PATS runtime: {e}")))?
                            .restore(state)
                    });
                    Ok(restore)
                })
            },
        ))
    }
}

/// The scaffold state a rewind target names, or None for a fresh bank (MS-2).
async fn read_target(
    io: &MethodIo,
    target: &CheckpointManifest,
) -> Result<Option<(ScaffoldState, PatsPointer)>, ActorError> {
    let Some(text) = target.data.method_state.get(PATS_STATE) else {
        return Ok(None);
    };
    let pointer: PatsPointer = serde_json::from_str(text).map_err(|e| {
        ActorError::Resume(format!("checkpoint {}: method_state.pats: {e}", target.id))
    })?;
    let (s, key) = (io.store.clone(), pointer.key.clone());
    let bytes = io.spawn_io(async move { s.get_object(&key).await }).await?;
    let state = ScaffoldState::from_json_bytes(&bytes)
        .map_err(|e| ActorError::Resume(format!("PATS state {}: {e}", pointer.key)))?;
    Ok(Some((state, pointer)))
}

/// PS-1/2: seed bank + scaffold-conditioned SFT; the SFT checkpoint names the seed bank, so
/// every life of the run starts RL from it.
async fn seed(
    io: &MethodIo,
    model: &ModelSetup,
    demos: Demos,
    method_state: &mut BTreeMap<String, String>,
) -> Result<Vec<SftSequence>, ActorError> {
    let mut pats = load(io, model, &BTreeMap::new()).await?;
    let demos =
        crate::pats_seed::seed_scaffold(&io.cfg, &model.codec, demos, &mut pats.controller)?;
    let version = pats.controller.bank().version();
    let key = bank_key(&io.keys(), version);
    let bytes = pats
        .controller
        .state()
        .to_json_bytes()
        .map_err(|e| ActorError::Internal(format!("PATS seed state: {e}")))?;
    let (s, k) = (io.store.clone(), key.clone());
    io.spawn_io(async move { s.create_object(&k, bytes.into()).await })
        .await?;
    let pointer = PatsPointer { key, version };
    method_state.insert(
        PATS_STATE.to_string(),
        serde_json::to_string(&pointer).unwrap_or_default(),
    );
    Ok(demos)
}

/// PATS (MS-2): a fresh scaffold, or the one named by the checkpoint resumed from.
async fn load(
    io: &MethodIo,
    model: &ModelSetup,
    method_state: &BTreeMap<String, String>,
) -> Result<PatsRuntime, ActorError> {
    let cfg = &io.cfg;
    let bad = |e: ScaffoldError| ActorError::Resume(format!("PATS scaffold: {e}"));
    let reviewer = || -> Box<dyn Reviewer> {
        match cfg.pats.reviewer_url.as_str() {
            "" => Box::new(RuleReviewer::default()),
            url => Box::new(HttpReviewer::new(url, cfg.pats.reviewer_timeout_ms)),
        }
    };
    let tokenizer = (*model.tokenizer).clone();
    let (controller, pointer) = match method_state.get(PATS_STATE) {
        Some(text) => {
            let pointer: PatsPointer = serde_json::from_str(text).map_err(|e| {
                ActorError::Resume(format!("method_state.pats is not a scaffold pointer: {e}"))
            })?;
            let (s, key) = (io.store.clone(), pointer.key.clone());
            let bytes = io.spawn_io(async move { s.get_object(&key).await }).await?;
            let state = ScaffoldState::from_json_bytes(&bytes).map_err(bad)?;
            let c = ScaffoldController::from_state(cfg.pats.clone(), tokenizer, reviewer(), state)
                .map_err(bad)?;
            (c, Some(pointer))
        }
        None => (
            ScaffoldController::new(cfg.pats.clone(), tokenizer, reviewer()).map_err(bad)?,
            None,
        ),
    };
    Ok(PatsRuntime {
        bank: Arc::new(controller.bank().clone()),
        controller,
        pointer,
    })
}

/// GN-8: the renderer of `bank` for training prompts, at most `words` words per prompt.
pub fn renderer(bank: Arc<Bank>, words: usize) -> Arc<ScaffoldRenderer> {
    Arc::new(move |task_type: &str| {
        let r = bank.render(task_type, words);
        (r.text, r.version)
    })
}

/// PATS evidence: each group's episodes as decoded actions and observations.
pub fn group_records(
    batch: &RolloutBatch,
    task_types: &[String],
    codec: &ChatCodec,
) -> Result<Vec<GroupRecord>, ActorError> {
    let mut groups: Vec<GroupRecord> = Vec::new();
    for (t, ty) in batch.trajectories.iter().zip(task_types) {
        let spans: Vec<(usize, usize, bool)> = t
            .turns
            .iter()
            .map(|u| (u.start as usize, u.end as usize, u.invalid_action))
            .collect();
        let episode = crate::pats_seed::episode_record(&t.tokens, &spans, t.final_reward, codec)?;
        match groups.iter_mut().find(|g| g.task_id == t.task_id) {
            Some(g) => g.episodes.push(episode),
            None => groups.push(GroupRecord {
                task_id: t.task_id,
                task_type: ty.clone(),
                episodes: vec![episode],
            }),
        }
    }
    Ok(groups)
}
