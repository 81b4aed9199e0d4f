//! `[metrics]`: the Prometheus endpoint and the Pushgateway of batch jobs.

use serde::{Deserialize, Serialize};

use super::key::{ints, Key, Range};
use super::ConfigError;

/// `[metrics]`: the Prometheus endpoint.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Serve `/metrics` at all.
    pub enabled: bool,
    /// Address to bind (loopback unless you mean otherwise).
    pub bind: String,
    /// Port (9464 by default; 0 picks a free port).
    pub port: u16,
    /// Pushgateway base URL (`http://host:9091`) to push the final metrics to; empty = off.
    pub pushgateway_url: String,
    /// Seconds the final push may take before the job gives up on it and exits.
    pub pushgateway_timeout_s: u64,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1".into(),
            port: 9464,
            pushgateway_url: String::new(),
            pushgateway_timeout_s: 30,
        }
    }
}

const BIND: Key = Key::new(
    "metrics.bind",
    Range::Text("an IP address"),
    "Address of /metrics; loopback unless you mean to expose it.",
);
const PUSHGATEWAY_URL: Key = Key::new(
    "metrics.pushgateway_url",
    Range::Text("empty or http(s)://host:port"),
    "Push the final metrics to this Prometheus Pushgateway when the run ends (batch jobs).",
);

const PUSHGATEWAY_TIMEOUT_S: Key = Key::new(
    "metrics.pushgateway_timeout_s",
    ints(1, 3600),
    "Seconds the final push to the Pushgateway may take; past it the job reports the push as failed and exits with the run's own status (its results are in the run root already).",
);

/// The keys of `[metrics]`.
pub const KEYS: &[Key] = &[
    Key::new(
        "metrics.enabled",
        Range::Bool,
        "Serve Prometheus /metrics while training.",
    ),
    BIND,
    Key::new(
        "metrics.port",
        ints(0, 65_535),
        "Port of /metrics (0 picks a free port, printed at start).",
    ),
    PUSHGATEWAY_URL,
    PUSHGATEWAY_TIMEOUT_S,
];

impl MetricsSection {
    /// Checks every key of `[metrics]` (the port's type bounds it).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bind.parse::<std::net::IpAddr>().is_err() {
            return Err(BIND.error(format!("must be an IP address, got {:?}", self.bind)));
        }
        PUSHGATEWAY_TIMEOUT_S.check_int(self.pushgateway_timeout_s)?;
        let url = &self.pushgateway_url;
        if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(PUSHGATEWAY_URL.error(format!(
                "must be empty or start with http:// or https://, got {:?}",
                keel_envs::redact_url(url)
            )));
        }
        Ok(())
    }
}
