//! `[faults]`: deliberate faults injected into a real run — a **testing aid** for the collapse
//! guard (`guard`), never for production configs. Every key defaults to "off".
//!
//! Invariants:
//! - FI-1: each fault fires at most once per process: a poisoned step that the guard rewinds
//!   past is not poisoned again, so a run with a fault can recover and finish.
//! - FI-2: faults act through the real code paths: a NaN fault makes the learner compute a NaN
//!   loss from NaN behaviour log-probs (it is refused by LR-2 like any other); a learning-rate
//!   blow-up really trains at that rate.

pub use crate::config::FaultsSection;

/// The one-shot state of the configured faults (FI-1).
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    cfg: FaultsSection,
    nan_left: u32,
    lr_fired: bool,
}

/// What to do to the update about to run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Injection {
    /// Replace the batch's behaviour log-probs with NaN.
    pub nan_logprobs: bool,
    /// Set the learning rate to this before the update.
    pub set_lr: Option<f64>,
    /// Panic in the learner before the update.
    pub panic: bool,
}

impl FaultPlan {
    /// The plan of `cfg`.
    pub fn new(cfg: FaultsSection) -> Self {
        let nan_left = cfg.nan_loss_count;
        Self {
            cfg,
            nan_left,
            lr_fired: false,
        }
    }

    /// The model whose update a NaN fault poisons (0 = the main one).
    pub fn poisoned_model(&self) -> usize {
        self.cfg.nan_loss_model
    }

    /// Faults for the update that starts at policy version `version` (producing `version + 1`).
    pub fn before_update(&mut self, version: u64) -> Injection {
        let target = version + 1;
        let mut inj = Injection::default();
        if self.cfg.nan_loss_at_step == target && self.nan_left > 0 {
            self.nan_left -= 1;
            inj.nan_logprobs = true;
        }
        inj.panic = self.cfg.learner_panic_at_step == target;
        if self.cfg.lr_blowup_at_step == target && !self.lr_fired {
            self.lr_fired = true;
            inj.set_lr = Some(self.cfg.lr_blowup_to);
        }
        inj
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fi1_nan_fires_count_times_then_never_again() {
        let mut p = FaultPlan::new(FaultsSection {
            nan_loss_at_step: 3,
            nan_loss_count: 2,
            ..FaultsSection::default()
        });
        assert!(!p.before_update(1).nan_logprobs);
        assert!(p.before_update(2).nan_logprobs);
        assert!(p.before_update(2).nan_logprobs);
        assert!(
            !p.before_update(2).nan_logprobs,
            "only nan_loss_count attempts"
        );
        assert!(!p.before_update(3).nan_logprobs);
    }

    #[test]
    fn fi1_lr_blowup_fires_once() {
        let mut p = FaultPlan::new(FaultsSection {
            lr_blowup_at_step: 2,
            lr_blowup_to: 0.9,
            ..FaultsSection::default()
        });
        assert_eq!(p.before_update(0).set_lr, None);
        assert_eq!(p.before_update(1).set_lr, Some(0.9));
        assert_eq!(
            p.before_update(1).set_lr,
            None,
            "a rewind past the step does not re-fire it"
        );
    }

    #[test]
    fn default_is_off() {
        assert!(FaultsSection::default().is_off());
        let mut p = FaultPlan::new(FaultsSection::default());
        for v in 0..10 {
            assert_eq!(p.before_update(v), Injection::default());
        }
    }
}
