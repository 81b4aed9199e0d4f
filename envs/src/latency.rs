//! Simulated tool latency: a long-tailed delay per environment step, so that async-versus-sync
//! benchmarks see the straggler problem that real tools have.
//!
//! `lognormal`: `delay = median · exp(sigma · z)`, `z ~ N(0, 1)`; `pareto`:
//! `delay = scale · u^(−1/alpha)`, `u ~ U(0, 1]`. Both are capped at `cap_ms`.
//!
//! Invariants:
//! - LT-1 The delay of a step is a pure function of (model, episode id, turn): reruns see the same
//!   stragglers.
//! - LT-2 `none` never delays; every delay lies in `[0, cap_ms]`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::EnvError;

/// The delay distribution of one env step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LatencyModel {
    /// No delay.
    #[default]
    None,
    /// Lognormal around `median_ms` with shape `sigma`.
    Lognormal {
        /// Median delay in milliseconds.
        median_ms: f64,
        /// Shape (1.0 gives a 10× p99/p50 ratio).
        sigma: f64,
        /// Longest delay in milliseconds.
        cap_ms: f64,
    },
    /// Pareto with minimum `scale_ms` and tail index `alpha`.
    Pareto {
        /// Minimum delay in milliseconds.
        scale_ms: f64,
        /// Tail index (smaller is heavier; > 1 has a finite mean).
        alpha: f64,
        /// Longest delay in milliseconds.
        cap_ms: f64,
    },
}

impl LatencyModel {
    /// Checks that every parameter is finite and positive.
    pub fn validate(&self) -> Result<(), EnvError> {
        let bad = |field: &'static str, v: f64| EnvError::InvalidConfig {
            env: "latency",
            field,
            value: v.to_string(),
            expected: "a finite positive number",
        };
        let pos = |field, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(field, v))
            }
        };
        match *self {
            LatencyModel::None => Ok(()),
            LatencyModel::Lognormal {
                median_ms,
                sigma,
                cap_ms,
            } => {
                pos("median_ms", median_ms)?;
                pos("sigma", sigma)?;
                pos("cap_ms", cap_ms)
            }
            LatencyModel::Pareto {
                scale_ms,
                alpha,
                cap_ms,
            } => {
                pos("scale_ms", scale_ms)?;
                pos("alpha", alpha)?;
                pos("cap_ms", cap_ms)
            }
        }
    }

    /// Whether the model ever delays.
    pub fn is_none(&self) -> bool {
        matches!(self, LatencyModel::None)
    }

    /// The delay of turn `turn` of episode `episode` (LT-1, LT-2).
    pub fn delay(&self, episode: u64, turn: u64) -> std::time::Duration {
        let mut rng = ChaCha8Rng::seed_from_u64(episode ^ turn.rotate_left(32) ^ 0x6c61_7465);
        let ms = match *self {
            LatencyModel::None => 0.0,
            LatencyModel::Lognormal {
                median_ms,
                sigma,
                cap_ms,
            } => {
                // Box–Muller.
                let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
                let u2: f64 = rng.gen();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (median_ms * (sigma * z).exp()).min(cap_ms)
            }
            LatencyModel::Pareto {
                scale_ms,
                alpha,
                cap_ms,
            } => {
                let u: f64 = rng.gen_range(f64::EPSILON..=1.0);
                (scale_ms * u.powf(-1.0 / alpha)).min(cap_ms)
            }
        };
        std::time::Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lt1_lt2_deterministic_capped_and_long_tailed() {
        let m = LatencyModel::Lognormal {
            median_ms: 10.0,
            sigma: 1.0,
            cap_ms: 500.0,
        };
        m.validate().unwrap();
        let mut d: Vec<f64> = (0..2000)
            .map(|e| m.delay(e, 3).as_secs_f64() * 1e3)
            .collect();
        assert_eq!(m.delay(5, 3), m.delay(5, 3));
        d.sort_by(f64::total_cmp);
        let (p50, p99) = (d[1000], d[1980]);
        assert!((7.0..14.0).contains(&p50), "p50 {p50}");
        assert!(p99 / p50 > 5.0, "p99 {p99} p50 {p50}");
        assert!(d.iter().all(|&x| x <= 500.0));
        let p = LatencyModel::Pareto {
            scale_ms: 2.0,
            alpha: 1.5,
            cap_ms: 100.0,
        };
        assert!((0..500).all(|e| (0.002..=0.1).contains(&p.delay(e, 0).as_secs_f64())));
        assert_eq!(LatencyModel::None.delay(1, 1), std::time::Duration::ZERO);
        assert!(LatencyModel::Pareto {
            scale_ms: 1.0,
            alpha: -1.0,
            cap_ms: 1.0
        }
        .validate()
        .is_err());
    }
}
