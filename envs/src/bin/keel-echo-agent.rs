//! `keel-echo-agent`: the lightest agent program, for measuring the agent gateway
//! (integration/src/bin/keel-bench-gateway.rs). It sends its task's prompt to
//! `$OPENAI_BASE_URL/chat/completions` `--calls N` times (each later call adds the answer it got
//! and a user turn "Again."), then exits; the run scores it with its verifier. A compiled
//! program without libtorch starts in about a millisecond, so what is timed is the gateway,
//! not an interpreter's start-up.
//!
//! `--pull BASE_URL --workers N` is a persistent pool instead (`env.agent.launch = "pull"`,
//! GTW-5): N threads each take an episode from `BASE_URL/keel/episodes/next` with the pool key
//! in `KEEL_AGENT_POOL_KEY`, run it in-process as above and report its end, until the gateway
//! has been unreachable for 2 s. No process starts per episode: what is timed is the gateway
//! alone.

use std::process::ExitCode;
use std::time::{Duration, Instant};

/// One episode: `calls` chat-completions calls extending the task's prompt.
fn episode(base: &str, key: &str, task: &serde_json::Value, calls: usize) -> Result<(), String> {
    let mut messages = task["prompt"].as_array().cloned().unwrap_or_default();
    for call in 0..calls {
        if call > 0 {
            messages.push(serde_json::json!({"role": "user", "content": "Again."}));
        }
        let body = serde_json::json!({"model": "policy", "messages": messages});
        let mut reply = ureq::post(&format!("{base}/chat/completions"))
            .header("Authorization", &format!("Bearer {key}"))
            .send_json(&body)
            .map_err(|e| format!("call {call}: {e}"))?;
        let answer: serde_json::Value = reply
            .body_mut()
            .read_json()
            .map_err(|e| format!("call {call}: {e}"))?;
        messages.push(answer["choices"][0]["message"].clone());
    }
    Ok(())
}

fn var(k: &str) -> Result<String, String> {
    std::env::var(k).map_err(|_| format!("{k} is not set"))
}

/// The spawned agent: one episode from the environment keel sets.
fn spawned(calls: usize) -> Result<(), String> {
    let task: serde_json::Value =
        serde_json::from_str(&var("KEEL_TASK")?).map_err(|e| format!("KEEL_TASK: {e}"))?;
    episode(
        &var("OPENAI_BASE_URL")?,
        &var("OPENAI_API_KEY")?,
        &task,
        calls,
    )
}

/// One pool worker: takes episodes until the gateway is gone (GTW-5).
fn worker(base: &str, pool_key: &str, calls: usize) {
    let mut unreachable = None;
    loop {
        let pulled = ureq::post(&format!("{base}/keel/episodes/next"))
            .header("Authorization", &format!("Bearer {pool_key}"))
            .send_json(serde_json::json!({"wait_s": 1}));
        let mut reply = match pulled {
            Ok(reply) => reply,
            Err(_) => {
                let since = *unreachable.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(2) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        unreachable = None;
        if reply.status() != 200 {
            continue;
        }
        let Ok(offer) = reply.body_mut().read_json::<serde_json::Value>() else {
            continue;
        };
        let key = offer["key"].as_str().unwrap_or_default().to_string();
        let end = match episode(base, &key, &offer["task"], calls) {
            Ok(()) => serde_json::json!({}),
            Err(e) => serde_json::json!({"error": e}),
        };
        let _ = ureq::post(&format!("{base}/keel/episodes/end"))
            .header("Authorization", &format!("Bearer {key}"))
            .send_json(end);
    }
}

/// The pool: `workers` threads on `base` (GTW-5).
fn pool(base: &str, workers: usize, calls: usize) -> Result<(), String> {
    let pool_key = var("KEEL_AGENT_POOL_KEY")?;
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| worker(base, &pool_key, calls));
        }
    });
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut calls = Ok(1);
    let (mut pull, mut workers) = (None, 1usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--calls" => {
                calls = value
                    .parse()
                    .map_err(|_| format!("--calls {value}: not a count"))
            }
            "--pull" => pull = Some(value),
            "--workers" => workers = value.parse().unwrap_or(0),
            other => {
                calls = Err(format!(
                    "unknown argument {other:?} (expected --calls N, --pull BASE_URL, --workers N)"
                ))
            }
        }
    }
    let result = calls.and_then(|calls| match &pull {
        Some(base) if workers > 0 => pool(base, workers, calls),
        Some(_) => Err("--workers takes a positive count".into()),
        None => spawned(calls),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel-echo-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
