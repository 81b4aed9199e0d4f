//! `[tracking]`: TensorBoard and MLflow, besides Prometheus and the metrics log (the trackers
//! themselves are `crate::tracking`).

use serde::{Deserialize, Serialize};

use super::key::{at_least, Key, Range};
use super::ConfigError;

/// `[tracking]`: where besides Prometheus and the metrics log the run is recorded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrackingSection {
    /// Write TensorBoard event files under `<run root>/tensorboard/<branch>/`.
    pub tensorboard: bool,
    /// Base URL of an MLflow tracking server (`http://host:port`); empty = off.
    pub mlflow_url: String,
    /// MLflow experiment the runs go to (created when missing); empty = `keel`.
    pub mlflow_experiment: String,
    /// Steps between deliveries when no checkpoint comes sooner (TensorBoard segment files,
    /// MLflow requests; MLflow also sends after 2 s).
    pub flush_every_steps: u64,
}

impl Default for TrackingSection {
    fn default() -> Self {
        TrackingSection {
            tensorboard: false,
            mlflow_url: String::new(),
            mlflow_experiment: String::new(),
            flush_every_steps: 50,
        }
    }
}

const MLFLOW_URL: Key = Key::new("tracking.mlflow_url", Range::Text("an http:// URL, or empty"), "Log to this MLflow tracking server: one MLflow run per keel run and branch (params = the flattened config; per-step metrics; checkpoint ids, preset and env as tags). A server that is down never slows training: points wait in a bounded queue and what cannot be delivered is counted in keel_tracking_events_dropped_total.");
const FLUSH_EVERY_STEPS: Key = Key::new("tracking.flush_every_steps", at_least(1), "Steps between deliveries to the trackers when no checkpoint comes sooner (a TensorBoard segment file, an MLflow request; MLflow also sends after 2 s). Points at or before a step already delivered are never sent twice after a resume.");

/// The keys of `[tracking]`.
pub const KEYS: &[Key] = &[
    Key::new("tracking.tensorboard", Range::Bool, "Write TensorBoard event files under <run root>/tensorboard/<branch>/ (local or S3): every step metric, eval success, checkpoint ids and the config as text; `tensorboard --logdir <run root>/tensorboard` shows one run per branch."),
    MLFLOW_URL,
    Key::new("tracking.mlflow_experiment", Range::Text("a name, or empty"), "MLflow experiment of the runs (created when missing); empty = keel."),
    FLUSH_EVERY_STEPS,
];

impl TrackingSection {
    /// Checks every key of `[tracking]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        FLUSH_EVERY_STEPS.check_int(self.flush_every_steps)?;
        let url = &self.mlflow_url;
        if !url.is_empty() && !url.starts_with("http://") {
            return Err(MLFLOW_URL.error(format!(
                "must be an http:// URL (keel's MLflow client has no TLS; put an https server behind a local proxy), got {:?}",
                keel_envs::redact_url(url)
            )));
        }
        Ok(())
    }
}
