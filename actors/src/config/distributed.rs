//! `[distributed]`: trainer and generators as separate processes (`keel trainer`,
//! `keel generator --rank R`), coordinated through the run root only.

use serde::{Deserialize, Serialize};

use super::key::{at_least, Key};
use super::ConfigError;

/// `[distributed]`: trainer and generators as separate processes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedSection {
    /// Seconds a work order may go unanswered before its range is issued again (a rank that
    /// died and did not come back).
    pub order_timeout_s: u64,
    /// How often processes look at the run root for orders, results and weights (ms).
    pub poll_ms: u64,
}

impl Default for DistributedSection {
    fn default() -> Self {
        Self {
            order_timeout_s: 600,
            poll_ms: 100,
        }
    }
}

const ORDER_TIMEOUT_S: Key = Key::new("distributed.order_timeout_s", at_least(1), "keel trainer: seconds a work order may go unanswered before it is withdrawn and its task range (or evaluation pass) is issued again to a rank that answers; the silent rank gets work again once it is heard from (a process start, or a live process finding its order withdrawn).");
const POLL_MS: Key = Key::new("distributed.poll_ms", at_least(1), "keel trainer / keel generator: how often (ms) a process looks at the run root for work orders, results and weights.");

/// The keys of `[distributed]`.
pub const KEYS: &[Key] = &[ORDER_TIMEOUT_S, POLL_MS];

impl DistributedSection {
    /// Checks every key of `[distributed]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ORDER_TIMEOUT_S.check_int(self.order_timeout_s)?;
        POLL_MS.check_int(self.poll_ms)
    }
}
