//! Method runtimes (issue 33): what each training method adds to the loop, behind one trait.
//!
//! The learner's presets (`keel_learner::algo::presets`) hold each method's losses and
//! estimators; a [`MethodRuntime`] holds the rest — what a method generates next, what a trained
//! batch consumes, what it keeps in a checkpoint's `method_state`, what it does at the RL start
//! and on a collapse-guard rewind, and what it asks of every generator. The controller, the job,
//! the generator setup and the rewind call its hooks and never ask which method runs; one
//! `Box<dyn MethodRuntime>` per trainer, chosen by [`select`] from `learner.algo`.
//!
//! A trait object rather than an enum: a new method is its own file here (plus its learner
//! module and preset) and one arm in [`select`]; no hook's caller changes. The per-method state
//! is not needed outside its file, and every hook is called at most a few times per batch.
//!
//! Invariants:
//! - MR-1 (defaults are plain): every hook's default is what a method without runtime state
//!   does (plain groups from the task cursor, no `method_state` entry, nothing to restore), so
//!   [`plain::Plain`] — GRPO, PPO, DAPO, GSPO and the other presets — overrides nothing but its
//!   name.
//! - MR-2 (held ranges): a range a method holds across batches (RTPO's tree, MS-1) is never in
//!   the task cursor: [`MethodRuntime::held_range`] is pending in every checkpoint, its batches
//!   are `held` (a lost one is sampled again by the method, not given back to the cursor), and
//!   only [`MethodRuntime::on_held_consumed`] says when it counts as trained.
//! - MR-3 (state keys): method state objects are stored create-only under keys carrying the
//!   writing life's tag ([`StateKeys::key`], MS-4); `method_state` entries name them.
//! - MR-4 (rewind): a rewind first [`MethodRuntime::abandon`]s what the method holds on the
//!   abandoned branch, then reads what the target checkpoint names
//!   ([`MethodRuntime::rewind_reader`]) and applies it only once the learner is restored.
//!
//! The per-method invariants (MS-1..4) are stated in the methods' files: `rtpo` (MS-1),
//! `pats` (MS-2, MS-4), `armor` (MS-3).

pub mod armor;
pub mod dr_mas;
pub mod pats;
pub mod plain;
pub mod rtpo;
pub mod sampo;
pub mod sao;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix::Addr;
use keel_envs::scaffold::Bank;
use keel_learner::algo::presets::DynamicSampling;
use keel_learner::Algo;
use keel_store::{CheckpointManifest, RunStore};

use crate::config::TrainConfig;
use crate::controller::ReadyBatch;
use crate::demo_tokens::SftSequence;
use crate::error::ActorError;
use crate::events::MethodDetail;
use crate::frontier::TaskCursor;
use crate::generator::{Generated, Work};
use crate::learner_actor::LearnerActor;
use crate::metrics::TrainMetrics;
use crate::setup::ModelSetup;
use crate::weights::Board;

pub use armor::REFERENCE_RESET_TAG;

/// A boxed future a hook answers.
pub type MethodFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ActorError>> + 'a>>;

/// What a rewind applies once the learner is restored (MR-4).
pub type Restore = Box<dyn FnOnce(&Rewound<'_>) -> Result<(), ActorError>>;

/// Reads what a rewind restores from its target checkpoint (MR-4).
pub type RewindRead = Box<dyn FnOnce(Arc<CheckpointManifest>) -> MethodFuture<'static, Restore>>;

/// A method state object to store: `(key, bytes)`.
pub type StateWrite = (String, Vec<u8>);

/// SFT demonstrations as `make_demos` answers them: task seed, text, bare rendering.
pub type Demos = Vec<(u64, keel_envs::Demonstration, SftSequence)>;

/// What the hooks may reach: the run's config, store, I/O runtime, learner and board.
#[derive(Clone)]
pub struct MethodIo {
    /// The job config.
    pub cfg: Arc<TrainConfig>,
    /// The run root, on the branch trained now.
    pub store: RunStore,
    /// Runtime for store I/O.
    pub io: tokio::runtime::Handle,
    /// The learner.
    pub learner: Addr<LearnerActor>,
    /// Where weights (and the reference) are published.
    pub board: Arc<dyn Board>,
    /// This life's tag in method state keys (MS-4).
    pub life_tag: String,
}

/// Where method state objects go: the run root on the branch trained now and this life's tag.
#[derive(Clone)]
pub struct StateKeys {
    /// The run root, on the branch trained now.
    pub store: RunStore,
    /// This life's tag (MS-4).
    pub life_tag: String,
}

impl StateKeys {
    /// The store key of a method state object `<dir>/<stem>-<life>.json` (MR-3, MS-4).
    pub fn key(&self, dir: &str, stem: &str) -> String {
        self.store
            .state_key(&format!("{dir}/{stem}-{}.json", self.life_tag))
    }
}

impl MethodIo {
    /// Where this life's method state objects go (MR-3).
    pub fn keys(&self) -> StateKeys {
        StateKeys {
            store: self.store.clone(),
            life_tag: self.life_tag.clone(),
        }
    }

    /// Runs `f` on the I/O runtime.
    pub async fn spawn_io<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T, keel_store::StoreError>> + Send + 'static,
    ) -> Result<T, ActorError> {
        self.io
            .spawn(f)
            .await
            .map_err(|e| ActorError::Internal(format!("I/O task: {e}")))?
            .map_err(ActorError::from)
    }

    /// Asks the learner.
    pub async fn ask<M>(&self, msg: M) -> Result<M::Result, ActorError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        LearnerActor: actix::Handler<M>,
        <LearnerActor as actix::Actor>::Context: actix::dev::ToEnvelope<LearnerActor, M>,
    {
        self.learner
            .send(msg)
            .await
            .map_err(|e| ActorError::Mailbox(e.to_string()))
    }
}

/// What the rewind hands a method's [`Restore`].
pub struct Rewound<'a> {
    /// The board the restored weights were published to.
    pub board: &'a dyn Board,
    /// The restored policy version.
    pub version: u64,
}

/// What the next generation samples.
#[derive(Debug, Clone)]
pub struct Planned {
    /// First task id of its range.
    pub first_task: u64,
    /// What to sample.
    pub work: Work,
    /// The method holds the range (MR-2): a lost batch's range is not given back to the cursor.
    pub held: bool,
}

/// A held batch used by the learner (MR-2).
#[derive(Debug, Clone)]
pub struct HeldStep {
    /// The `Method` event's detail.
    pub detail: MethodDetail,
    /// The range, when it now counts as trained.
    pub trained: Option<u64>,
}

/// What a review after a trained batch produced (MS-2).
#[derive(Debug)]
pub enum Review {
    /// Reviewed: the `Method` event's detail and, when it changed, the state to store before the
    /// step ends.
    Done {
        /// The event detail (boxed: it dwarfs the error).
        detail: Box<MethodDetail>,
        /// The state object to store create-only.
        write: Option<StateWrite>,
    },
    /// The review failed; the step ends without it.
    Skipped(ActorError),
}

/// What a method asks of every generator (the generator setup, SU-1).
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    /// ARMOR: episodes per task from the reference policy.
    pub anchor_episodes: usize,
    /// Re-roll uninformative groups (DAPO, SAMPO; GN-5).
    pub dynamic_sampling: Option<DynamicSampling>,
    /// GiGPO with similarity groups: store each turn's anchor-state text.
    pub keep_anchor_states: bool,
    /// Agent → model (`[[agent_models]]`, Dr. MAS).
    pub agent_model: Vec<usize>,
    /// PATS: words of scaffold rendered before a prompt at most.
    pub scaffold_words: usize,
}

impl Sampling {
    /// What the resolved preset and the config ask for (MR-1).
    pub fn of(cfg: &TrainConfig) -> Self {
        let preset = cfg.learner.resolve();
        Sampling {
            anchor_episodes: 0,
            dynamic_sampling: preset.dynamic_sampling,
            keep_anchor_states: preset.gigpo_similarity().is_some(),
            agent_model: cfg.agent_model_map(),
            scaffold_words: 0,
        }
    }
}

/// One training method's runtime (MR-1..4). Every hook has the plain default.
pub trait MethodRuntime: Send {
    /// Its name in events (`rtpo`, `pats`, `armor`, …).
    fn name(&self) -> &'static str;

    /// What every generator samples with.
    fn sampling(&self, cfg: &TrainConfig) -> Sampling {
        Sampling::of(cfg)
    }

    /// Whether a resume may train on the stored batches it finds (MS-1, MS-2: no).
    fn reuses_stored_batches(&self) -> bool {
        true
    }

    /// The SFT sequences of the warm start; may name state in the root checkpoint's
    /// `method_state` (PATS's seed bank, PS-1/2).
    fn sft_demos<'a>(
        &'a mut self,
        _io: &'a MethodIo,
        _model: &'a ModelSetup,
        demos: Demos,
        _method_state: &'a mut BTreeMap<String, String>,
    ) -> MethodFuture<'a, Vec<SftSequence>> {
        Box::pin(async move { Ok(demos.into_iter().map(|(_, _, bare)| bare).collect()) })
    }

    /// Before the RL loop: loads what `method_state` names and publishes what generators need.
    fn start<'a>(
        &'a mut self,
        _io: &'a MethodIo,
        _model: &'a ModelSetup,
        _method_state: &'a BTreeMap<String, String>,
        _version: u64,
    ) -> MethodFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    /// The range the method holds (MR-2).
    fn held_range(&self) -> Option<u64> {
        None
    }

    /// Drops what the method holds (a rewind, or a range the cursor does not owe).
    fn abandon(&mut self) {}

    /// What the generation of batch `seq` samples.
    fn next_work(&mut self, _seq: u64, cursor: &mut TaskCursor, _keys: &StateKeys) -> Planned {
        Planned {
            first_task: cursor.take(),
            work: Work::Groups,
            held: false,
        }
    }

    /// The scaffold bank training generations render (PATS, GN-8).
    fn scaffold(&self) -> Option<Arc<Bank>> {
        None
    }

    /// A training generation that stored no batch (RTPO's trunks).
    fn on_unstored(&mut self, planned: &Planned, g: &Generated) -> Result<(), ActorError> {
        let _ = (planned, g);
        Err(ActorError::Internal("train batch was not stored".into()))
    }

    /// A held batch was used by the learner, trained or skipped (MR-2).
    fn on_held_consumed(&mut self, _batch_seq: u64) -> Option<HeldStep> {
        None
    }

    /// A review to run after `batch` trained, before the step ends (PATS, MS-2).
    fn review(
        &mut self,
        _step: u64,
        _batch: &ReadyBatch,
        _io: &MethodIo,
    ) -> Option<MethodFuture<'static, Review>> {
        None
    }

    /// Exports the method's gauges (after a review).
    fn export(&self, _metrics: &TrainMetrics) {}

    /// Whether the step reaching `version` ends with a reference reset (ARMOR, MS-3).
    fn resets_reference_at(&self, _version: u64) -> bool {
        false
    }

    /// The method's checkpoint entries in `method_state`.
    fn save_state(&self, _method_state: &mut BTreeMap<String, String>) {}

    /// What a rewind reads from its target checkpoint (MR-4).
    fn rewind_reader(&self, _io: &MethodIo) -> Option<RewindRead> {
        None
    }
}

/// The runtime of `cfg.learner.algo`: the one place a method is chosen.
pub fn select(cfg: &TrainConfig) -> Box<dyn MethodRuntime> {
    match cfg.learner.algo {
        Algo::Rtpo => Box::new(rtpo::Rtpo::default()),
        Algo::Pats => Box::new(pats::Pats::default()),
        Algo::Armor => Box::new(armor::Armor {
            reset_every: cfg.armor.reference_reset_every,
        }),
        Algo::Sao => Box::new(sao::Sao),
        Algo::Sampo => Box::new(sampo::Sampo),
        Algo::DrMas => Box::new(dr_mas::DrMas),
        _ => Box::new(plain::Plain),
    }
}

#[cfg(test)]
mod tests;
