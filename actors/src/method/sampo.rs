//! SAMPO at run time: its re-rolls are dynamic sampling (GN-5: a uniform group is rolled out
//! again, same task, fresh sampling seed, up to `max_tries` passes once the policy passes the
//! cold start), which the generators get from the resolved preset's `dynamic_sampling`
//! ([`super::Sampling::of`]); GSPO, GiGPO, turn records and the DAPO filter are the learner's.
//! Nothing kept in `method_state`, nothing to restore (MR-1).

use super::MethodRuntime;

/// SAMPO's runtime: dynamic sampling through its preset.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampo;

impl MethodRuntime for Sampo {
    fn name(&self) -> &'static str {
        "sampo"
    }
}
