//! Serializable environment snapshots: the state at a turn boundary, stored next to the
//! trajectory prefix so that RTPO can branch siblings from it.
//!
//! Invariants:
//! - SN-1 A snapshot names the env it came from; restoring it into another env is an
//!   `EnvError::Snapshot`, never a silent mix.
//! - SN-2 `from_bytes(to_bytes(s)) == s` (JSON, so external envs can produce them too).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::EnvError;

/// The state of one environment at a turn boundary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvSnapshot {
    /// Name of the env that took it.
    pub env: String,
    /// The env's own state, as JSON.
    pub state: serde_json::Value,
}

impl EnvSnapshot {
    /// Snapshot of a serializable state.
    pub fn of<T: Serialize>(env: &str, state: &T) -> Result<Self, EnvError> {
        let state = serde_json::to_value(state).map_err(|e| EnvError::Snapshot {
            env: env.to_string(),
            reason: e.to_string(),
        })?;
        Ok(EnvSnapshot {
            env: env.to_string(),
            state,
        })
    }

    /// The state, checking that the snapshot belongs to `env` (SN-1).
    pub fn decode<T: DeserializeOwned>(&self, env: &str) -> Result<T, EnvError> {
        if self.env != env {
            return Err(EnvError::Snapshot {
                env: env.to_string(),
                reason: format!("the snapshot was taken from `{}`", self.env),
            });
        }
        serde_json::from_value(self.state.clone()).map_err(|e| EnvError::Snapshot {
            env: env.to_string(),
            reason: e.to_string(),
        })
    }

    /// JSON bytes (SN-2).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses JSON bytes (SN-2).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvError> {
        serde_json::from_slice(bytes).map_err(|e| EnvError::Snapshot {
            env: "?".into(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sn1_wrong_env_is_refused_and_sn2_round_trip() {
        let s = EnvSnapshot::of("calc", &vec![1u32, 2]).unwrap();
        assert_eq!(EnvSnapshot::from_bytes(&s.to_bytes()).unwrap(), s);
        assert_eq!(s.decode::<Vec<u32>>("calc").unwrap(), vec![1, 2]);
        let err = s.decode::<Vec<u32>>("shop").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot restore a shop snapshot: the snapshot was taken from `calc`"
        );
        assert!(EnvSnapshot::from_bytes(b"{").is_err());
    }
}
