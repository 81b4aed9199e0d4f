//! `[distributed]`: trainer and generators as separate processes (`keel trainer`,
//! `keel generator --rank R`), coordinated through the run root only.

use serde::{Deserialize, Serialize};

use super::key::{at_least, Key, Range};
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
    /// Learner ranks (`learner.ranks` > 1): rank 0's address, where the others meet it.
    pub learner_addr: String,
    /// Learner ranks: rank 0's rendezvous port (c10d's TCPStore).
    pub learner_port: u16,
    /// Learner ranks: seconds a collective (or the rendezvous) may take before the rank gives
    /// up with an error (a rank that died or hangs never hangs the others).
    pub collective_timeout_s: u64,
}

impl Default for DistributedSection {
    fn default() -> Self {
        Self {
            order_timeout_s: 600,
            poll_ms: 100,
            learner_addr: "127.0.0.1".into(),
            learner_port: 29500,
            collective_timeout_s: 300,
        }
    }
}

const ORDER_TIMEOUT_S: Key = Key::new("distributed.order_timeout_s", at_least(1), "keel trainer: seconds a work order may go unanswered before it is withdrawn and its task range (or evaluation pass) is issued again to a rank that answers; the silent rank gets work again once it is heard from (a process start, or a live process finding its order withdrawn).");
const POLL_MS: Key = Key::new("distributed.poll_ms", at_least(1), "keel trainer / keel generator: how often (ms) a process looks at the run root for work orders, results and weights.");

const LEARNER_ADDR: Key = Key::new("distributed.learner_addr", Range::Text("a host name or IP address"), "learner.ranks > 1: the address of learner rank 0 (the trainer), where ranks 1..N-1 meet it; MASTER_ADDR overrides it, as torchrun sets it.");
const LEARNER_PORT: Key = Key::new(
    "distributed.learner_port",
    at_least(1),
    "learner.ranks > 1: rank 0's rendezvous port (c10d TCPStore); MASTER_PORT overrides it.",
);
const COLLECTIVE_TIMEOUT_S: Key = Key::new("distributed.collective_timeout_s", at_least(1), "learner.ranks > 1: seconds a collective (or the rendezvous) may take; a rank that died or hangs makes the others fail with an error naming the operation within this time, instead of hanging them.");

/// The keys of `[distributed]`.
pub const KEYS: &[Key] = &[
    ORDER_TIMEOUT_S,
    POLL_MS,
    LEARNER_ADDR,
    LEARNER_PORT,
    COLLECTIVE_TIMEOUT_S,
];

impl DistributedSection {
    /// Checks every key of `[distributed]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ORDER_TIMEOUT_S.check_int(self.order_timeout_s)?;
        POLL_MS.check_int(self.poll_ms)?;
        LEARNER_PORT.check_int(u64::from(self.learner_port))?;
        COLLECTIVE_TIMEOUT_S.check_int(self.collective_timeout_s)?;
        if self.learner_addr.trim().is_empty() || self.learner_addr.contains('\0') {
            return Err(LEARNER_ADDR.error(format!(
                "must be a host name or address, got {:?}",
                self.learner_addr
            )));
        }
        Ok(())
    }
}
