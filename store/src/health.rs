//! The retry budget as a deadline (ST-7): how long keel waits for an S3 store that does not
//! answer.
//!
//! object_store stops *starting* retries once a request's budget is spent, but the backoff sleep
//! it is in (up to 5 s) and the request it is making (up to its 30 s request timeout against a
//! stalled server) still run; and every later operation — the metrics log's last lines, the
//! life-end record — then spent a whole budget of its own. A killed store took 182 s to fail a
//! run whose budget said 60 s.
//!
//! Invariants:
//! - HL-1: an S3 operation (a get, a put with its own retries, a delete, one listing page, one
//!   multipart step) that has not finished `budget + GRACE` after it started fails with
//!   [`StoreError::Unreachable`].
//! - HL-2: once an operation failed because the store did not answer (HL-1, or object_store's
//!   retries exhausted on a transport error or 5xx), the store is down until any operation
//!   succeeds; while it is down each operation gets [`DOWN_ATTEMPT`]: enough for a store that
//!   came back to answer, so a run whose store died fails within about one budget, not one budget
//!   per write still pending.
//! - HL-3: local roots have no deadline (a local disk has no retries to bound).

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::root::RunStore;

/// HL-1: how long an operation may overrun the retry budget.
pub const GRACE: Duration = Duration::from_secs(1);
/// HL-2: how long an operation may take while the store is down.
pub const DOWN_ATTEMPT: Duration = Duration::from_secs(1);

/// Whether the store is down, shared by every handle on one run root (HL-2).
#[derive(Debug, Default)]
pub(crate) struct Health {
    down_since: Mutex<Option<Instant>>,
}

impl Health {
    fn limit(&self, budget: Duration) -> Duration {
        match self.down_since.lock().map(|d| *d) {
            Ok(Some(_)) => DOWN_ATTEMPT,
            _ => budget + GRACE,
        }
    }

    fn set(&self, down: bool) {
        if let Ok(mut since) = self.down_since.lock() {
            match (down, since.is_some()) {
                (true, false) => *since = Some(Instant::now()),
                (false, true) => *since = None,
                _ => {}
            }
        }
    }
}

impl StoreError {
    /// HL-2: whether this error says the store did not answer (as opposed to answering "no").
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            StoreError::Unreachable { .. }
                | StoreError::ObjectStore {
                    source: object_store::Error::Generic { .. },
                    ..
                }
        )
    }
}

impl RunStore {
    /// Runs one store operation on `key` under the deadline of HL-1/HL-2 (S3 only, HL-3).
    pub(crate) async fn within_budget<T>(
        &self,
        key: &str,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(health) = self.health() else {
            return op.await;
        };
        let budget = self.budget();
        let limit = health.limit(budget);
        match tokio::time::timeout(limit, op).await {
            Ok(Ok(value)) => {
                health.set(false);
                Ok(value)
            }
            Ok(Err(e)) => {
                if e.is_unreachable() {
                    health.set(true);
                }
                Err(e)
            }
            Err(_) => {
                health.set(true);
                tracing::warn!(
                    key,
                    waited_s = limit.as_secs_f64(),
                    "the object store did not answer in time"
                );
                Err(StoreError::Unreachable {
                    key: key.to_string(),
                    budget_s: budget.as_secs(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hl2_down_until_a_success() {
        let health = Health::default();
        let budget = Duration::from_secs(10);
        assert_eq!(health.limit(budget), budget + GRACE);
        health.set(true);
        assert_eq!(health.limit(budget), DOWN_ATTEMPT);
        health.set(true);
        assert_eq!(health.limit(budget), DOWN_ATTEMPT);
        health.set(false);
        assert_eq!(health.limit(budget), budget + GRACE);
    }

    /// HL-1 and HL-2 against a port nobody answers on: the first operation ends within budget
    /// plus grace, later ones within DOWN_ATTEMPT, and neither error suggests credentials.
    #[tokio::test]
    async fn hl1_hl2_a_dead_endpoint_fails_within_the_budget() {
        // A port that refuses connections: bind, then drop the listener.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        // Explicit settings: nothing from the environment, no cloud metadata probe.
        let settings = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{port}"))
            .with_access_key_id("nobody")
            .with_secret_access_key("nothing")
            .with_region("us-east-1");
        let budget = Duration::from_secs(3);
        let store = RunStore::open_with("s3://dead/run", settings, budget).expect("open");
        for op in ["get", "list"] {
            let started = Instant::now();
            let err = match op {
                "get" => store.get_object("a").await.map(|_| ()),
                _ => store.list_objects("batches").await.map(|_| ()),
            }
            .expect_err("nobody answers");
            let took = started.elapsed();
            assert!(err.is_unreachable(), "{err}");
            assert!(!err.to_string().contains("credentials"), "{err}");
            let limit = if op == "get" {
                budget + GRACE
            } else {
                DOWN_ATTEMPT
            };
            assert!(took < limit + Duration::from_millis(500), "{op}: {took:?}");
        }
        let started = Instant::now();
        let err = store
            .create_object("b", "x".into())
            .await
            .expect_err("still down");
        assert!(err.is_unreachable(), "{err}");
        assert!(started.elapsed() < DOWN_ATTEMPT + Duration::from_millis(500));
    }
}
