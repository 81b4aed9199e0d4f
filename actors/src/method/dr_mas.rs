//! Dr. MAS at run time: agents sample with their own models. `[[agent_models]]` maps agents to
//! models; the generators get the map ([`super::Sampling::of`]: `agent_model`) and the learner
//! actor one `Learner` per model (LA-4, LA-5), whose files travel in every checkpoint. The map is
//! a config feature any preset may use, so it lives in the default sampling; the agent-wise
//! normalisation is the learner's (`keel_learner::algo::drmas`). Nothing kept in
//! `method_state`, nothing to restore (MR-1).

use super::MethodRuntime;

/// Dr. MAS's runtime: agent models through the config.
#[derive(Debug, Clone, Copy, Default)]
pub struct DrMas;

impl MethodRuntime for DrMas {
    fn name(&self) -> &'static str {
        "dr_mas"
    }
}
