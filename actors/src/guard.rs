//! The collapse guard: judges every learner result and decides whether training goes on, skips a
//! step, or rewinds to the newest healthy checkpoint on a new branch.
//!
//! A value `x` of a watched series (gradient norm, KL to the behaviour policy) is a *spike* when
//! `x > ratio · median(last window healthy values)` and `x > floor`, once `warmup` healthy values
//! have been seen. The controller owns one guard and calls it from one thread.
//!
//! Invariants:
//! - GD-1: a non-finite loss or gradient never reaches the weights: the learner refuses the
//!   update (LR-2), the guard counts it as a skip, and the batch counts as consumed.
//! - GD-2: `max_consecutive_skips` skips in a row, or one spike, asks for a rewind; nothing else
//!   does.
//! - GD-3: only healthy values enter the median windows, so a collapse cannot raise its own
//!   baseline; a step with a zero gradient (no learning signal, e.g. all GRPO groups tied) is not
//!   a sample of the gradient's scale and enters neither window.
//! - GD-4: a checkpoint is tagged `healthy` only if no anomaly (skip or spike) was seen since the
//!   previous checkpoint; a rewind goes to the newest `healthy` checkpoint on the current lineage
//!   (`RunStore::newest_tagged_on_lineage`, LN-3), never to another branch.
//! - GD-5: at most `max_rewinds` rewinds per run (counted along the lineage, GD-7); the next
//!   request ends the run with an error naming the anomaly.
//! - GD-6: a rewind tags the abandoned branch's head `rewound-to-<new branch>`; `keel train`
//!   without `--branch` follows these tags from `main` (`follow_rewinds`), so a run that crashes
//!   after a rewind resumes the new branch, not the abandoned one.
//! - GD-7: every checkpoint keeps the guard's state ([`GuardState`]: rewinds, skips in a row,
//!   the healthy windows) in its `method_state["guard"]`; a resumed run restores it, and with it
//!   the learning rate its rewinds cut (`GuardSection::rewound_lr`), so a crash resets neither
//!   `max_rewinds` nor the rate.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The tag of checkpoints committed with no anomaly since the previous one (GD-4).
pub const HEALTHY_TAG: &str = "healthy";

pub use crate::config::GuardSection;

/// Why the guard asked for a rewind.
#[derive(Debug, Clone, PartialEq)]
pub enum Anomaly {
    /// `n` non-finite steps in a row (GD-2).
    ConsecutiveSkips {
        /// Skips in a row.
        n: u32,
        /// The last non-finite quantity (`loss`, `gradient norm`).
        what: String,
    },
    /// The gradient norm spiked over its recent median.
    GradNormSpike {
        /// The value.
        value: f64,
        /// The window median.
        median: f64,
    },
    /// The KL to the behaviour policy spiked over its recent median.
    KlSpike {
        /// The value.
        value: f64,
        /// The window median.
        median: f64,
    },
}

impl Anomaly {
    /// A short label for metrics and tags: `nonfinite`, `grad_norm_spike`, `kl_spike`.
    pub fn kind(&self) -> &'static str {
        match self {
            Anomaly::ConsecutiveSkips { .. } => "nonfinite",
            Anomaly::GradNormSpike { .. } => "grad_norm_spike",
            Anomaly::KlSpike { .. } => "kl_spike",
        }
    }
}

impl std::fmt::Display for Anomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Anomaly::ConsecutiveSkips { n, what } => {
                write!(f, "{n} consecutive steps with a non-finite {what}")
            }
            Anomaly::GradNormSpike { value, median } => {
                write!(
                    f,
                    "gradient norm {value:.4} spiked over its recent median {median:.4}"
                )
            }
            Anomaly::KlSpike { value, median } => {
                write!(f, "KL {value:.5} spiked over its recent median {median:.5}")
            }
        }
    }
}

/// What the controller should do with a learner result.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Go on.
    Healthy,
    /// The step was skipped (non-finite); go on with the next batch.
    Skipped {
        /// Skips in a row so far.
        consecutive: u32,
    },
    /// Rewind to the newest healthy checkpoint (GD-2).
    Rewind(Anomaly),
}

/// The key of the guard's state in a checkpoint's `method_state` (GD-7).
pub const GUARD_STATE: &str = "guard";

/// What a checkpoint keeps of the guard (GD-7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardState {
    /// Rewinds done along the lineage.
    pub rewinds: u32,
    /// Non-finite skips in a row.
    pub consecutive_skips: u32,
    /// The healthy gradient-norm window, oldest first.
    pub grad_norms: Vec<f64>,
    /// The healthy KL window, oldest first.
    pub kls: Vec<f64>,
}

/// The guard's state: two median windows and a few counters.
#[derive(Debug, Clone)]
pub struct CollapseGuard {
    cfg: GuardSection,
    grad_norms: VecDeque<f64>,
    kls: VecDeque<f64>,
    consecutive_skips: u32,
    anomaly_since_checkpoint: bool,
    rewinds: u32,
}

/// The median of a window (upper median for even lengths); `None` when empty.
pub fn median(values: &VecDeque<f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

impl CollapseGuard {
    /// A guard with empty windows.
    pub fn new(cfg: GuardSection) -> Self {
        Self {
            cfg,
            grad_norms: VecDeque::new(),
            kls: VecDeque::new(),
            consecutive_skips: 0,
            anomaly_since_checkpoint: false,
            rewinds: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &GuardSection {
        &self.cfg
    }

    /// What a checkpoint keeps (GD-7).
    pub fn state(&self) -> GuardState {
        GuardState {
            rewinds: self.rewinds,
            consecutive_skips: self.consecutive_skips,
            grad_norms: self.grad_norms.iter().copied().collect(),
            kls: self.kls.iter().copied().collect(),
        }
    }

    /// Continues from a checkpoint's `state` (GD-7); windows longer than this config's keep
    /// their newest values.
    pub fn restore(&mut self, state: GuardState) {
        let cap = self.cfg.window.max(1);
        let newest = |v: Vec<f64>| -> VecDeque<f64> {
            let skip = v.len().saturating_sub(cap);
            v.into_iter().skip(skip).collect()
        };
        self.rewinds = state.rewinds;
        self.consecutive_skips = state.consecutive_skips;
        self.grad_norms = newest(state.grad_norms);
        self.kls = newest(state.kls);
        self.anomaly_since_checkpoint = false;
    }

    /// Rewinds done so far.
    pub fn rewinds(&self) -> u32 {
        self.rewinds
    }

    /// Non-finite skips in a row so far.
    pub fn consecutive_skips(&self) -> u32 {
        self.consecutive_skips
    }

    /// True when another rewind is allowed (GD-5).
    pub fn may_rewind(&self) -> bool {
        self.rewinds < self.cfg.max_rewinds
    }

    fn spike(&self, window: &VecDeque<f64>, value: f64, ratio: f64, floor: f64) -> Option<f64> {
        if ratio <= 0.0 || window.len() < self.cfg.warmup.max(1) || value <= floor {
            return None;
        }
        let m = median(window)?;
        (value > ratio * m).then_some(m)
    }

    fn push(window: &mut VecDeque<f64>, value: f64, cap: usize) {
        window.push_back(value);
        while window.len() > cap.max(1) {
            window.pop_front();
        }
    }

    /// Judges a finished update with gradient norm `grad_norm` and KL `kl` (GD-2, GD-3).
    pub fn on_step(&mut self, grad_norm: f64, kl: f64) -> Verdict {
        if !self.cfg.enabled {
            return Verdict::Healthy;
        }
        self.consecutive_skips = 0;
        if !grad_norm.is_finite() || !kl.is_finite() {
            self.anomaly_since_checkpoint = true;
            let what = if grad_norm.is_finite() {
                "KL"
            } else {
                "gradient norm"
            };
            return Verdict::Rewind(Anomaly::ConsecutiveSkips {
                n: 1,
                what: what.into(),
            });
        }
        // A zero gradient (e.g. every GRPO group had equal rewards) is no sample of its scale.
        let has_grad = grad_norm > f64::EPSILON;
        let grad_spike = if has_grad {
            self.spike(
                &self.grad_norms,
                grad_norm,
                self.cfg.grad_norm_spike_ratio,
                self.cfg.grad_norm_floor,
            )
        } else {
            None
        };
        if let Some(median) = grad_spike {
            self.anomaly_since_checkpoint = true;
            return Verdict::Rewind(Anomaly::GradNormSpike {
                value: grad_norm,
                median,
            });
        }
        if let Some(median) = self.spike(&self.kls, kl, self.cfg.kl_spike_ratio, self.cfg.kl_floor)
        {
            self.anomaly_since_checkpoint = true;
            return Verdict::Rewind(Anomaly::KlSpike { value: kl, median });
        }
        let cap = self.cfg.window;
        if has_grad {
            Self::push(&mut self.grad_norms, grad_norm, cap);
        }
        Self::push(&mut self.kls, kl, cap);
        Verdict::Healthy
    }

    /// Judges an update the learner refused as non-finite (`what`: `loss`, `gradient norm`)
    /// (GD-1, GD-2).
    pub fn on_nonfinite(&mut self, what: &str) -> Verdict {
        self.anomaly_since_checkpoint = true;
        self.consecutive_skips += 1;
        let n = self.consecutive_skips;
        if n >= self.cfg.max_consecutive_skips.max(1) {
            return Verdict::Rewind(Anomaly::ConsecutiveSkips {
                n,
                what: what.into(),
            });
        }
        Verdict::Skipped { consecutive: n }
    }

    /// Called when a checkpoint is about to be committed: true if it may be tagged `healthy`
    /// (GD-4); starts a new checkpoint interval.
    pub fn checkpoint_is_healthy(&mut self) -> bool {
        let healthy = !self.anomaly_since_checkpoint;
        self.anomaly_since_checkpoint = false;
        healthy
    }

    /// Records a finished rewind: counts it (GD-5) and starts clean from a healthy checkpoint.
    /// The median windows are kept: they hold only healthy values (GD-3).
    pub fn on_rewound(&mut self) {
        self.rewinds += 1;
        self.consecutive_skips = 0;
        self.anomaly_since_checkpoint = false;
    }
}

/// The tag prefix that points from an abandoned branch head to the branch a rewind started (GD-6).
pub const REWOUND_TO_PREFIX: &str = "rewound-to-";

/// The branch to train on when none is named: starting at `branch`, follow `rewound-to-<b>` tags
/// on each head to a branch that has a head of its own (GD-6).
pub async fn follow_rewinds(
    store: &keel_store::RunStore,
    branch: &str,
) -> Result<String, keel_store::StoreError> {
    let chain = rewind_chain(store, branch).await?;
    Ok(chain.last().cloned().unwrap_or_else(|| branch.to_string()))
}

/// `branch` and the branches its rewinds led to, in order (GD-6): each next one is named by a
/// `rewound-to-<b>` tag on the previous one's head and has a head of its own.
pub async fn rewind_chain(
    store: &keel_store::RunStore,
    branch: &str,
) -> Result<Vec<String>, keel_store::StoreError> {
    let mut chain = vec![branch.to_string()];
    for _ in 0..64 {
        let current = chain.last().cloned().unwrap_or_default();
        let Some(head) = store.branch_head(&current).await? else {
            break;
        };
        let tags = store
            .ancestry(&head.id)
            .await?
            .into_iter()
            .next()
            .map(|m| m.tags)
            .unwrap_or_default();
        let mut next = None;
        for t in tags
            .iter()
            .filter_map(|t| t.strip_prefix(REWOUND_TO_PREFIX))
        {
            if store.branch_head(t).await?.is_some() {
                next = Some(t.to_string());
            }
        }
        match next {
            Some(n) if !chain.contains(&n) => chain.push(n),
            _ => break,
        }
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> CollapseGuard {
        CollapseGuard::new(GuardSection {
            warmup: 3,
            window: 5,
            ..GuardSection::default()
        })
    }

    #[test]
    fn median_of_windows() {
        assert_eq!(median(&VecDeque::new()), None);
        assert_eq!(median(&VecDeque::from(vec![3.0, 1.0, 2.0])), Some(2.0));
        assert_eq!(median(&VecDeque::from(vec![4.0, 1.0, 2.0, 3.0])), Some(3.0));
    }

    #[test]
    fn gd2_consecutive_skips_ask_for_a_rewind() {
        let mut g = guard();
        assert_eq!(g.on_nonfinite("loss"), Verdict::Skipped { consecutive: 1 });
        assert_eq!(g.on_nonfinite("loss"), Verdict::Skipped { consecutive: 2 });
        assert_eq!(
            g.on_nonfinite("loss"),
            Verdict::Rewind(Anomaly::ConsecutiveSkips {
                n: 3,
                what: "loss".into()
            })
        );
    }

    #[test]
    fn gd2_a_healthy_step_resets_the_skip_count() {
        let mut g = guard();
        g.on_nonfinite("loss");
        g.on_nonfinite("loss");
        assert_eq!(g.on_step(0.5, 0.01), Verdict::Healthy);
        assert_eq!(g.on_nonfinite("loss"), Verdict::Skipped { consecutive: 1 });
    }

    #[test]
    fn gd2_spikes_need_warmup_and_the_floor() {
        let mut g = guard();
        // Before warmup nothing is a spike.
        assert_eq!(g.on_step(2.0, 0.001), Verdict::Healthy);
        assert_eq!(g.on_step(100.0, 0.001), Verdict::Healthy);
        assert_eq!(g.on_step(2.0, 0.001), Verdict::Healthy);
        // Median now 2.0: 25 is over 10x, 19 is under.
        match g.on_step(25.0, 0.001) {
            Verdict::Rewind(Anomaly::GradNormSpike { value, median }) => {
                assert_eq!((value, median), (25.0, 2.0))
            }
            v => panic!("expected a grad-norm spike, got {v:?}"),
        }
        assert_eq!(g.on_step(19.0, 0.001), Verdict::Healthy);
        // KL under its floor never spikes, however small the median.
        assert_eq!(g.on_step(2.0, 0.04), Verdict::Healthy);
        assert!(matches!(
            g.on_step(2.0, 0.5),
            Verdict::Rewind(Anomaly::KlSpike { .. })
        ));
    }

    #[test]
    fn gd3_zero_gradient_steps_do_not_drag_the_median_down() {
        let mut g = guard();
        for _ in 0..3 {
            g.on_step(0.5, 0.0);
        }
        for _ in 0..10 {
            assert_eq!(g.on_step(0.0, 0.0), Verdict::Healthy);
        }
        assert_eq!(
            g.on_step(1.5, 0.0),
            Verdict::Healthy,
            "median is still 0.5, not 0"
        );
        assert!(
            matches!(
                g.on_step(0.0, 5.0),
                Verdict::Rewind(Anomaly::KlSpike { .. })
            ),
            "KL is judged without a gradient"
        );
    }

    #[test]
    fn gd3_spikes_do_not_enter_the_window() {
        let mut g = guard();
        for _ in 0..3 {
            g.on_step(1.0, 0.0);
        }
        for _ in 0..10 {
            assert!(
                matches!(g.on_step(50.0, 0.0), Verdict::Rewind(_)),
                "the baseline must not rise"
            );
        }
    }

    #[test]
    fn gd4_healthy_tag_needs_a_clean_interval() {
        let mut g = guard();
        g.on_step(1.0, 0.0);
        assert!(g.checkpoint_is_healthy());
        g.on_nonfinite("loss");
        g.on_step(1.0, 0.0);
        assert!(!g.checkpoint_is_healthy());
        assert!(g.checkpoint_is_healthy());
    }

    #[test]
    fn gd7_the_state_round_trips_and_long_windows_keep_their_newest_values() {
        let cfg = GuardSection {
            window: 3,
            warmup: 1,
            ..GuardSection::default()
        };
        let mut g = CollapseGuard::new(cfg.clone());
        for x in [1.0, 2.0, 3.0, 4.0] {
            assert!(matches!(g.on_step(x, x / 10.0), Verdict::Healthy));
        }
        g.on_rewound();
        let _ = g.on_nonfinite("loss");
        let state = g.state();
        let json = serde_json::to_string(&state).expect("json");
        let back: GuardState = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, state);
        let mut r = CollapseGuard::new(cfg.clone());
        r.restore(back);
        assert_eq!(r.state(), state);
        assert_eq!((r.rewinds(), r.consecutive_skips()), (1, 1));
        assert_eq!(r.state().grad_norms, [2.0, 3.0, 4.0]);
        let mut narrow = CollapseGuard::new(GuardSection {
            window: 2,
            ..cfg.clone()
        });
        narrow.restore(state);
        assert_eq!(narrow.state().grad_norms, [3.0, 4.0]);
        assert_eq!(cfg.rewound_lr(1e-3, 2), 1e-3 * 0.25);
    }

    #[test]
    fn gd5_rewinds_are_bounded() {
        let mut g = CollapseGuard::new(GuardSection {
            max_rewinds: 2,
            ..GuardSection::default()
        });
        assert!(g.may_rewind());
        g.on_rewound();
        g.on_rewound();
        assert!(!g.may_rewind());
        assert_eq!(g.rewinds(), 2);
    }

    #[test]
    fn disabled_guard_sees_nothing() {
        let mut g = CollapseGuard::new(GuardSection {
            enabled: false,
            ..GuardSection::default()
        });
        for _ in 0..10 {
            g.on_step(1.0, 0.0);
        }
        assert_eq!(g.on_step(1e9, 1e9), Verdict::Healthy);
    }
}
