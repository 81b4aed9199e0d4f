//! Learning-rate schedules over policy updates, as verl configures them (`lr_warmup_steps`,
//! `warmup_style: constant | cosine`, `min_lr_ratio`) with transformers' schedule functions
//! (`get_constant_schedule_with_warmup`, `get_cosine_schedule_with_warmup`, half a cycle).
//!
//! Invariants:
//! - LS-1: the factor of update `u` (0-based, the policy version being trained) is `u / W`
//!   during the warm-up `u < W` (0 at the first update, as the references, whose scheduler
//!   steps after the optimizer); then 1 (constant), or
//!   `m + (1 − m) · ½ (1 + cos(π p))` with `p = min(1, (u − W) / max(1, T − W))` (cosine).
//! - LS-2: the factor depends only on `u`, so a resumed run continues the schedule exactly.

/// The shape of the learning rate after the warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// The base learning rate.
    #[default]
    Constant,
    /// Half a cosine from the base rate down to `min_ratio` × base at the last update.
    Cosine,
}

/// A schedule with its warm-up, floor and horizon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrPlan {
    /// The shape after the warm-up.
    pub schedule: LrSchedule,
    /// Warm-up updates `W`.
    pub warmup: u64,
    /// Cosine floor `m`, as a fraction of the base rate.
    pub min_ratio: f64,
    /// Total updates `T` of the run.
    pub total: u64,
}

impl LrPlan {
    /// The factor of update `u` (LS-1).
    pub fn factor(&self, u: u64) -> f64 {
        if u < self.warmup {
            return u as f64 / self.warmup.max(1) as f64;
        }
        match self.schedule {
            LrSchedule::Constant => 1.0,
            LrSchedule::Cosine => {
                let span = self.total.saturating_sub(self.warmup).max(1) as f64;
                let p = ((u - self.warmup) as f64 / span).min(1.0);
                let m = self.min_ratio;
                m + (1.0 - m) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls1_warmup_then_constant_or_cosine() {
        let plan = |schedule, min_ratio| LrPlan {
            schedule,
            warmup: 4,
            min_ratio,
            total: 14,
        };
        let c = plan(LrSchedule::Constant, 0.0);
        let f: Vec<f64> = (0..6).map(|u| c.factor(u)).collect();
        assert_eq!(f, vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.0]);
        let cos = plan(LrSchedule::Cosine, 0.1);
        assert_eq!(cos.factor(2), 0.5);
        assert!((cos.factor(4) - 1.0).abs() < 1e-12);
        // Half way through the decay: m + (1 - m) / 2.
        assert!((cos.factor(9) - 0.55).abs() < 1e-12);
        assert!((cos.factor(14) - 0.1).abs() < 1e-12);
        assert!((cos.factor(100) - 0.1).abs() < 1e-12, "stays at the floor");
        let decreasing = (4..15).map(|u| cos.factor(u)).collect::<Vec<_>>();
        assert!(decreasing.windows(2).all(|w| w[1] < w[0]));
    }
}
