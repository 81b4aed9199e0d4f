//! `keel_store_retries_total`: the object store retries transient failures inside object_store
//! (ST-7), which reports each retry only as an INFO event under `object_store::client::retry`.
//! A tracing layer with its own filter counts those events whatever the log filter says, and the
//! count is copied into the metrics before every scrape and push.
//!
//! Invariant RY-1: the counter sees every retry event, also when logs are filtered to `warn`.

use std::sync::atomic::{AtomicU64, Ordering};

use keel_actors::TrainMetrics;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

static RETRIES: AtomicU64 = AtomicU64::new(0);
static EXPORTED: AtomicU64 = AtomicU64::new(0);

/// Counts the events it is given (RY-1).
pub struct RetryCounter;

impl<S: Subscriber> Layer<S> for RetryCounter {
    fn on_event(&self, _event: &Event<'_>, _ctx: Context<'_, S>) {
        RETRIES.fetch_add(1, Ordering::Relaxed);
    }
}

/// The retry events: INFO and above from object_store's retry loop.
pub fn retry_events() -> Targets {
    Targets::new().with_target("object_store::client::retry", tracing::Level::INFO)
}

/// Adds the retries seen since the last call to `keel_store_retries_total`.
pub fn export(metrics: &TrainMetrics) {
    let total = RETRIES.load(Ordering::Relaxed);
    let before = EXPORTED.swap(total, Ordering::Relaxed);
    if total > before {
        metrics.store_retries.inc_by(total - before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn sr1_retry_events_are_counted_whatever_the_log_filter() {
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_filter(tracing_subscriber::EnvFilter::new("warn")),
            )
            .with(RetryCounter.with_filter(retry_events()));
        let metrics = TrainMetrics::new("sr1").expect("metrics");
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "object_store::client::retry", "Encountered transport error, retry 1 of 10");
            tracing::info!(target: "keel_ops::other", "not a retry");
        });
        export(&metrics);
        assert_eq!(metrics.store_retries.get(), 1);
    }
}
