//! Push of a batch job's final metrics to a Prometheus Pushgateway (`metrics.pushgateway_url`).
//!
//! Invariant PGW-1: the push replaces the group `job="keel", run="<run.name>"` (HTTP PUT of the
//! text exposition to `<url>/metrics/job/keel/run/<run>`); a failed push is reported as an error
//! but never loses the run's results (they are in the run root already).

use anyhow::{bail, Result};
use keel_actors::config::MetricsSection;

/// The Pushgateway URL of run `run`'s group under base URL `base`.
pub fn group_url(base: &str, run: &str) -> String {
    format!("{}/metrics/job/keel/run/{run}", base.trim_end_matches('/'))
}

/// PUTs `text` (Prometheus text format) to the group of `run` at `metrics.pushgateway_url`,
/// within `metrics.pushgateway_timeout_s` (PGW-1).
pub fn push(cfg: &MetricsSection, run: &str, text: String) -> Result<()> {
    let url = group_url(&cfg.pushgateway_url, run);
    let shown = keel_envs::redact_url(&url);
    keel_actors::process::block_on(async {
        let response = reqwest::Client::new()
            .put(&url)
            .header("Content-Type", "text/plain; version=0.0.4")
            .body(text)
            .timeout(std::time::Duration::from_secs(cfg.pushgateway_timeout_s))
            .send()
            .await
            // reqwest's message names the URL, credentials included: drop it, ours is redacted.
            .map_err(|e| anyhow::anyhow!("cannot push metrics to {shown}: {}", e.without_url()))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!(
                "the Pushgateway at {shown} answered {status}: {}",
                body.trim()
            );
        }
        Ok(())
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pushgateway_url: String) -> MetricsSection {
        MetricsSection {
            pushgateway_url,
            ..MetricsSection::default()
        }
    }

    #[test]
    fn pg1_push_puts_the_text_format_to_the_run_group() {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("listener");
        let addr = server.server_addr().to_ip().expect("ip");
        let handle = std::thread::spawn(move || {
            let mut req = server.recv().expect("request");
            let mut body = String::new();
            req.as_reader().read_to_string(&mut body).expect("body");
            let seen = (req.method().to_string(), req.url().to_string(), body);
            req.respond(tiny_http::Response::empty(200))
                .expect("respond");
            seen
        });
        let text = "# TYPE keel_actor_grad_norm gauge\nkeel_actor_grad_norm{branch=\"main\"} 1.5\n"
            .to_string();
        push(&at(format!("http://{addr}/")), "r1", text).expect("push");
        let (method, url, body) = handle.join().expect("server thread");
        assert_eq!(method, "PUT");
        assert_eq!(url, "/metrics/job/keel/run/r1");
        assert!(body.contains("keel_actor_grad_norm"), "{body}");
    }

    #[test]
    fn pg1_an_error_status_is_an_error() {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("listener");
        let addr = server.server_addr().to_ip().expect("ip");
        let handle = std::thread::spawn(move || {
            let req = server.recv().expect("request");
            req.respond(tiny_http::Response::from_string("bad").with_status_code(400))
                .expect("respond");
        });
        let err = push(&at(format!("http://{addr}")), "r1", String::new()).expect_err("400");
        handle.join().expect("server thread");
        assert!(err.to_string().contains("400"), "{err}");
    }
}
