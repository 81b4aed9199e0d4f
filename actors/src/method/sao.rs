//! SAO at run time: single rollouts streamed in async mode. Its critic schedule (warm-up updates
//! before the actor trains, the value model's own optimizer, CR-1/VM-1..3), its length-adaptive
//! GAE and its DIS mask are the learner's (`keel_learner::algo::sao`, the preset's `critic`);
//! the critic and its update counter travel in every checkpoint's learner files, not in
//! `method_state`. Nothing else at run time: plain groups, nothing to restore (MR-1).

use super::MethodRuntime;

/// SAO's runtime: its learner preset only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sao;

impl MethodRuntime for Sao {
    fn name(&self) -> &'static str {
        "sao"
    }
}
