//! `keel-echo-agent`: the lightest agent program, for measuring the agent gateway
//! (integration/src/bin/keel-bench-gateway.rs). It sends its task's prompt to
//! `$OPENAI_BASE_URL/chat/completions` `--calls N` times (each later call adds the answer it got
//! and a user turn "Again."), then exits; the run scores it with its verifier. A compiled
//! program without libtorch starts in about a millisecond, so what is timed is the gateway,
//! not an interpreter's start-up.

use std::process::ExitCode;

fn run(calls: usize) -> Result<(), String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let task: serde_json::Value =
        serde_json::from_str(&var("KEEL_TASK")?).map_err(|e| format!("KEEL_TASK: {e}"))?;
    let (base, key) = (var("OPENAI_BASE_URL")?, var("OPENAI_API_KEY")?);
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

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let calls = match (args.next().as_deref(), args.next()) {
        (None, _) => Ok(1),
        (Some("--calls"), Some(n)) => n.parse().map_err(|_| format!("--calls {n}: not a count")),
        (Some(other), _) => Err(format!("unknown argument {other:?} (expected --calls N)")),
    };
    match calls.and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel-echo-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
