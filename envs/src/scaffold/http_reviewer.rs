//! [`HttpReviewer`]: a [`Reviewer`] served by another process, so that an LLM reviewer can be
//! plugged in without writing Rust (`[pats] reviewer_url`).
//!
//! Protocol: `POST {url}` with the [`ReviewRequest`] as JSON (step, mode, task type, EMA,
//! pressure, budget, evidence cards, the bank, the limits); the answer is
//! `{"edits": [Edit, ...]}` where an edit is `{"op":"add","kind":"skill"|"mistake",
//! "task_type":…|null,"text":…,"cites":[card ids]}`, `{"op":"update","id":…,"text":…,"cites":[…]}`
//! or `{"op":"delete","id":…}`.
//!
//! Invariants:
//! - HR-1: whatever the server answers is validated by `Bank::apply` (budget, vocabulary,
//!   duplicates, citations), so a reviewer cannot break the bank.
//! - HR-2: a request that fails (deadline, connection, HTTP error, bad JSON) is a
//!   `ScaffoldError::Reviewer`: the controller records it in that type's review and training goes
//!   on with the bank unchanged. Nothing is retried: the next step reviews again.

use std::time::Duration;

use serde::Deserialize;

use super::edit::Edit;
use super::error::ScaffoldError;
use super::reviewer::{ReviewRequest, Reviewer};

/// A reviewer behind an HTTP endpoint (module doc).
pub struct HttpReviewer {
    url: String,
    /// `url` as messages show it, credentials redacted (RD-1).
    shown: String,
    agent: ureq::Agent,
}

#[derive(Deserialize)]
struct Answer {
    edits: Vec<Edit>,
}

impl HttpReviewer {
    /// A reviewer posting to `url` with a deadline of `timeout_ms` per request.
    pub fn new(url: &str, timeout_ms: u64) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(timeout_ms)))
            .http_status_as_error(false)
            .build()
            .into();
        HttpReviewer {
            url: url.to_string(),
            shown: crate::redact_url(url),
            agent,
        }
    }

    fn fail(&self, reason: String) -> ScaffoldError {
        ScaffoldError::Reviewer {
            reviewer: format!("http {}", self.shown),
            reason,
        }
    }
}

impl Reviewer for HttpReviewer {
    fn name(&self) -> &str {
        &self.shown
    }

    fn review(&mut self, request: &ReviewRequest) -> Result<Vec<Edit>, ScaffoldError> {
        let mut resp = self
            .agent
            .post(&self.url)
            .send_json(request)
            .map_err(|e| self.fail(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if status >= 400 {
            let head: String = text.chars().take(200).collect();
            return Err(self.fail(format!("HTTP {status}: {head}")));
        }
        parse_review_answer(&text).map_err(|reason| self.fail(reason))
    }
}

/// The edits of a reviewer's answer `{"edits": [...]}` (HR-1: `Bank::apply` validates them).
pub fn parse_review_answer(text: &str) -> Result<Vec<Edit>, String> {
    let answer: Answer = serde_json::from_str(text)
        .map_err(|e| format!("bad JSON answer ({e}); expected {{\"edits\": [...]}}"))?;
    Ok(answer.edits)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    use super::*;
    use crate::scaffold::{Bank, ScaffoldConfig};

    /// Serves one HTTP request with `body`, handing back the request body it read.
    fn serve_once(status: &str, body: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/review", listener.local_addr().expect("addr"));
        let status = status.to_string();
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("header");
                if line.trim().is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().expect("length");
                }
            }
            let mut req = vec![0u8; len];
            reader.read_exact(&mut req).expect("body");
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(answer.as_bytes()).expect("write");
            String::from_utf8(req).expect("utf8")
        });
        (url, handle)
    }

    fn request() -> ReviewRequest {
        let mode = crate::scaffold::Mode::Expand;
        ReviewRequest {
            step: 3,
            mode,
            task_type: "pick".into(),
            ema: 0.1,
            pressure: 0.0,
            budget: mode.budget(),
            cards: vec![],
            bank: Bank::new(),
            config: ScaffoldConfig::default(),
        }
    }

    #[test]
    fn hr1_posts_the_request_and_reads_the_edits() {
        let (url, server) = serve_once(
            "200 OK",
            r#"{"edits":[{"op":"add","kind":"skill","task_type":"pick","text":"go kitchen","cites":[0]}]}"#,
        );
        let edits = HttpReviewer::new(&url, 5000)
            .review(&request())
            .expect("edits");
        assert_eq!(edits.len(), 1);
        let sent: serde_json::Value =
            serde_json::from_str(&server.join().expect("server")).expect("json");
        assert_eq!(sent["step"], 3);
        assert_eq!(sent["task_type"], "pick");
        assert_eq!(
            sent["mode"],
            serde_json::to_value(crate::scaffold::Mode::Expand).expect("mode")
        );
    }

    #[test]
    fn hr2_failures_are_reviewer_errors() {
        let (url, server) = serve_once("500 Internal Server Error", "boom");
        let e = HttpReviewer::new(&url, 5000)
            .review(&request())
            .expect_err("500");
        assert!(e.to_string().contains("HTTP 500: boom"), "{e}");
        server.join().expect("server");
        let (url, server) = serve_once("200 OK", "{\"edit\": []}");
        let e = HttpReviewer::new(&url, 5000)
            .review(&request())
            .expect_err("bad json");
        assert!(e.to_string().contains("bad JSON answer"), "{e}");
        server.join().expect("server");
        let e = HttpReviewer::new("http://127.0.0.1:9/none", 500)
            .review(&request())
            .expect_err("refused");
        assert!(matches!(e, ScaffoldError::Reviewer { .. }), "{e}");
    }
}
