//! The Prometheus endpoint: `GET /metrics` on a background thread.
//!
//! Invariant MX-1: it binds the configured address (loopback by default) and serves only
//! `/metrics` (and `/healthz`); everything else is 404.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use keel_actors::TrainMetrics;

/// A running metrics server; stops when dropped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `metrics` on `bind:port`.
pub fn serve(bind: &str, port: u16, metrics: TrainMetrics) -> Result<MetricsServer> {
    let server = tiny_http::Server::http((bind, port))
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| {
            format!("cannot serve metrics on {bind}:{port} (set metrics.port or --metrics-port)")
        })?;
    let addr = server
        .server_addr()
        .to_ip()
        .context("metrics server has no IP address")?;
    let server = Arc::new(server);
    let s = server.clone();
    let thread = std::thread::Builder::new()
        .name("keel-metrics".into())
        .spawn(move || {
            for request in s.incoming_requests() {
                let response = match request.url() {
                    "/metrics" => {
                        let header = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"text/plain; version=0.0.4"[..],
                        );
                        crate::store_retries::export(&metrics);
                        let mut r = tiny_http::Response::from_string(metrics.render());
                        if let Ok(h) = header {
                            r = r.with_header(h);
                        }
                        r
                    }
                    "/healthz" => tiny_http::Response::from_string("ok\n"),
                    _ => tiny_http::Response::from_string("not found\n").with_status_code(404),
                };
                let _ = request.respond(response);
            }
        })?;
    Ok(MetricsServer {
        server,
        addr,
        thread: Some(thread),
    })
}
