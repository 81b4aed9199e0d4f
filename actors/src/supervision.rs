//! Supervision: panics in actor handlers become restarts, counted against a budget.
//!
//! Invariants:
//! - SV-1: a panic inside a supervised handler never unwinds into the actix runtime: it is caught,
//!   logged with the actor kind, counted, and the actor is stopped so its supervisor (actix
//!   `Supervisor` for async actors, the `SyncArbiter` factory for sync ones) starts a fresh one.
//! - SV-2: each actor kind has one `RestartBudget`; once more restarts than `max_restarts` have
//!   happened, `exhausted()` is true and the controller ends the run with an error instead of
//!   restarting forever.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A shared restart counter for one actor kind.
#[derive(Debug, Clone)]
pub struct RestartBudget {
    kind: &'static str,
    max_restarts: u32,
    used: Arc<AtomicU32>,
}

impl RestartBudget {
    /// A budget of `max_restarts` restarts for actors of `kind`.
    pub fn new(kind: &'static str, max_restarts: u32) -> Self {
        Self {
            kind,
            max_restarts,
            used: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Records one restart (SV-1) and returns how many have happened.
    pub fn record_restart(&self) -> u32 {
        let n = self.used.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::warn!(
            actor = self.kind,
            restarts = n,
            budget = self.max_restarts,
            "actor restarted after a panic"
        );
        n
    }

    /// Restarts so far.
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::SeqCst)
    }

    /// True once the budget is spent (SV-2).
    pub fn exhausted(&self) -> bool {
        self.used() > self.max_restarts
    }

    /// Restarts allowed.
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts
    }

    /// The actor kind this budget belongs to.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

/// Runs `f`, turning a panic into `Err(message)` (SV-1).
pub fn run_caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "panic with a non-string payload".to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_and_exhausts() {
        let b = RestartBudget::new("test", 1);
        assert!(!b.exhausted());
        b.record_restart();
        assert!(!b.exhausted());
        b.record_restart();
        assert!(b.exhausted());
    }

    #[test]
    fn panics_become_errors() {
        let r: Result<(), String> = run_caught(|| panic!("boom"));
        assert_eq!(r.unwrap_err(), "boom");
        assert_eq!(run_caught(|| 3).unwrap(), 3);
    }
}
