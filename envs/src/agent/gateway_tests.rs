//! The gateway over real HTTP on loopback (GTW-1..4), with a thread standing in for the
//! episode's sampler.

use std::time::Duration;

use super::gateway::{CallLimits, Event, Gateway, Served};
use super::openai::{Answer, TokenLogprob};
use super::Sampling;

/// The tests' limits: 4 KiB bodies, temperature 1, no pool key.
fn limits() -> CallLimits {
    CallLimits {
        max_request_bytes: 4096,
        sampling: Sampling {
            temperature: 1.0,
            max_turn_tokens: 16,
            model: "policy".into(),
        },
        pool_key: None,
    }
}

fn gateway() -> Gateway {
    Gateway::start("127.0.0.1:0", limits()).expect("gateway")
}

fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn post(url: &str, key: Option<&str>, body: &str) -> (u16, String) {
    let mut req = client()
        .post(url)
        .header("Content-Type", "application/json");
    if let Some(key) = key {
        req = req.header("Authorization", &format!("Bearer {key}"));
    }
    let mut resp = req.send(body).expect("request");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

const CALL: &str = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;

#[test]
fn gtw_calls_without_a_live_episode_key_are_refused() {
    let gw = gateway();
    let url = format!("{}/chat/completions", gw.base_url());
    let _episode = gw.open();
    let (status, _) = post(&url, None, CALL);
    assert_eq!(status, 401, "no key");
    let (status, body) = post(&url, Some("keel-0000"), CALL);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no live episode"), "{body}");
    let (status, body) = post(&format!("{}/embeddings", gw.base_url()), Some("k"), "{}");
    assert_eq!(status, 404, "{body}");
    let models = client()
        .get(&format!("{}/models", gw.base_url()))
        .call()
        .expect("models")
        .body_mut()
        .read_to_string()
        .expect("body");
    assert!(models.contains("\"policy\""), "{models}");
}

#[test]
fn gtw_hostile_bodies_get_clear_errors_and_the_episode_goes_on() {
    let gw = gateway();
    let url = format!("{}/chat/completions", gw.base_url());
    let mailbox = gw.open();
    let key = mailbox.key.clone();
    let sampler = std::thread::spawn(move || {
        let mut served = 0;
        while served < 2 {
            match mailbox.events.recv_timeout(Duration::from_secs(20)) {
                Ok(Event::Call { reply, .. }) => {
                    let answer = Answer::from_text("4", false);
                    let _ = reply.send(Ok(Served {
                        call: served,
                        answer,
                    }));
                    served += 1;
                }
                Ok(Event::Reward(_) | Event::Closed | Event::Ended(_)) => {}
                Err(_) => break,
            }
        }
        served
    });
    let huge = format!(
        r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(8192)
    );
    let cases = [
        ("{not json", 400, "not JSON"),
        (huge.as_str(), 413, "max_request_bytes"),
        (r#"{"messages": []}"#, 400, "empty"),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "temperature": 0.3}"#,
            400,
            "rollout.temperature",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}"#,
            400,
            "at least 1",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "stop": ["a", "b", "c", "d", "e"]}"#,
            400,
            "at most 4",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "stop": [""]}"#,
            400,
            "non-empty",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 2}"#,
            400,
            "top_logprobs",
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#,
            400,
            "text parts",
        ),
    ];
    for (body, want, says) in cases {
        let (status, text) = post(&url, Some(&key), body);
        assert_eq!(status, want, "{text}");
        assert!(text.contains(says), "{says}: {text}");
    }
    let (status, text) = post(&url, Some(&key), CALL);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "4");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let stream = CALL.replace("\"model\"", "\"stream\": true, \"model\"");
    let (status, text) = post(&url, Some(&key), &stream);
    assert_eq!(status, 200);
    assert!(
        text.starts_with("data: {") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert_eq!(sampler.join().expect("sampler"), 2);
    // The episode is gone: its key is dead (GTW-2) and a reward for it is refused.
    let reward = format!("{}/keel/reward", gw.base_url());
    let (status, _) = post(&reward, Some(&key), r#"{"reward": 1}"#);
    assert_eq!(status, 404);
}

#[test]
fn gtw_a_call_whose_episode_ends_unanswered_gets_410() {
    let gw = gateway();
    let url = format!("{}/chat/completions", gw.base_url());
    let mailbox = gw.open();
    let key = mailbox.key.clone();
    let ender = std::thread::spawn(move || {
        // Take the call, then end the episode without answering it.
        let event = mailbox.events.recv_timeout(Duration::from_secs(20));
        drop(event);
        drop(mailbox);
    });
    let (status, text) = post(&url, Some(&key), CALL);
    assert_eq!(status, 410, "{text}");
    ender.join().expect("ender");
}

/// GTW-6: a call sent to a bound gateway before its key is live (a restarted keel that has
/// not taken up its journal yet) waits, and reaches its episode once the gateway serves.
#[test]
fn gtw6_a_call_sent_before_the_gateway_serves_waits_for_its_key() {
    use std::io::{Read, Write};
    let gw = Gateway::bind("127.0.0.1:0", limits()).expect("bind");
    let key = "keel-taken-up-from-the-journal";
    let addr = gw
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{CALL}",
        CALL.len()
    )
    .expect("send the call");
    // Not served yet: no answer comes (a serving gateway would answer 404 at once). A slow
    // machine can only make this pass, never fail.
    let mut first = [0u8; 1];
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    assert!(
        stream.read(&mut first).is_err(),
        "a gateway that does not serve yet answered"
    );
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mailbox = gw.reopen(&super::journal::key_digest(key));
    gw.serve().expect("serve");
    let sampler =
        std::thread::spawn(
            move || match mailbox.events.recv_timeout(Duration::from_secs(20)) {
                Ok(Event::Call { reply, .. }) => {
                    let _ = reply.send(Ok(Served {
                        call: 0,
                        answer: Answer::from_text("4", false),
                    }));
                    true
                }
                _ => false,
            },
        );
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(
        sampler.join().expect("sampler"),
        "the call reached its episode"
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

#[test]
fn gtw_max_tokens_stop_and_the_idempotency_key_reach_the_episode() {
    let gw = gateway();
    let url = format!("{}/chat/completions", gw.base_url());
    let mailbox = gw.open();
    let key = mailbox.key.clone();
    let sampler =
        std::thread::spawn(
            move || match mailbox.events.recv_timeout(Duration::from_secs(20)) {
                Ok(Event::Call { request, reply }) => {
                    let _ = reply.send(Ok(Served {
                        call: 0,
                        answer: Answer::from_text("4", false),
                    }));
                    (
                        request.max_answer_tokens(),
                        request.stop_sequences(),
                        request.idempotency_key.clone(),
                    )
                }
                _ => panic!("no call reached the episode"),
            },
        );
    let body = r#"{"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 3, "stop": "\n"}"#;
    let mut resp = client()
        .post(&url)
        .header("Authorization", &format!("Bearer {key}"))
        .header("Idempotency-Key", "call-1")
        .send(body)
        .expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let _ = resp.body_mut().read_to_string();
    let (max_tokens, stop, idempotency_key) = sampler.join().expect("sampler");
    assert_eq!(max_tokens, Some(3));
    assert_eq!(stop, Ok(vec!["\n".to_string()]));
    assert_eq!(idempotency_key.as_deref(), Some("call-1"));
}

#[test]
fn oai_answers_leave_the_stop_sequence_out() {
    use super::openai::cut_at_stop;
    let stops = vec!["Observation:".to_string(), "\n\n".to_string()];
    assert_eq!(
        cut_at_stop("Thought: add\n\nObservation: 7", &stops),
        ("Thought: add", true)
    );
    assert_eq!(cut_at_stop("7", &stops), ("7", false));
    assert_eq!(cut_at_stop("", &[]), ("", false));
}

#[test]
fn gtw5_pulled_episodes_are_handed_out_once_and_ended_by_report() {
    let gw = Gateway::start(
        "127.0.0.1:0",
        CallLimits {
            max_request_bytes: 4096,
            sampling: Sampling::default(),
            pool_key: Some("pool-secret-0123456789".into()),
        },
    )
    .expect("gateway");
    let next = format!("{}/keel/episodes/next", gw.base_url());
    let (status, _) = post(&next, Some("wrong"), r#"{"wait_s": 0}"#);
    assert_eq!(status, 401);
    let (status, _) = post(&next, Some("pool-secret-0123456789"), r#"{"wait_s": 0}"#);
    assert_eq!(status, 204, "nothing offered yet");
    let mailbox = gw.open();
    gw.offer(&mailbox, r#"{"index": 3}"#);
    let (status, body) = post(&next, Some("pool-secret-0123456789"), r#"{"wait_s": 0}"#);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["key"], mailbox.key.as_str());
    assert_eq!(v["task"]["index"], 3);
    let (status, _) = post(&next, Some("pool-secret-0123456789"), r#"{"wait_s": 0}"#);
    assert_eq!(status, 204, "an episode is handed out once");
    let end = format!("{}/keel/episodes/end", gw.base_url());
    let (status, _) = post(&end, Some(&mailbox.key), r#"{"reward": 1.0}"#);
    assert_eq!(status, 200);
    assert!(matches!(mailbox.events.try_recv(), Ok(Event::Reward(r)) if r == 1.0));
    assert!(matches!(mailbox.events.try_recv(), Ok(Event::Ended(None))));
    // An offer whose episode ended unpulled is skipped.
    let gone = gw.open();
    gw.offer(&gone, "{}");
    drop(gone);
    let (status, _) = post(&next, Some("pool-secret-0123456789"), r#"{"wait_s": 0}"#);
    assert_eq!(status, 204);
    // A spawning gateway serves no pulls.
    let spawning = gateway();
    let (status, body) = post(
        &format!("{}/keel/episodes/next", spawning.base_url()),
        Some("x"),
        "{}",
    );
    assert_eq!(status, 404, "{body}");
}

#[test]
fn gtw5_pull_needs_a_pool_key_and_no_command() {
    use super::AgentConfig;
    let pull = AgentConfig {
        launch: "pull".into(),
        pool_key_env: "KEEL_TEST_UNSET_POOL_KEY_VARIABLE".into(),
        ..AgentConfig::default()
    };
    assert!(pull.validate().is_ok());
    let err = pull.bind_gateway().err().expect("no pool key").to_string();
    assert!(err.contains("pool_key_env"), "{err}");
    let both = AgentConfig {
        command: vec!["python3".into()],
        ..pull.clone()
    };
    assert!(both.validate().is_err());
    let unknown = AgentConfig {
        launch: "ssh".into(),
        ..pull
    };
    assert!(unknown
        .validate()
        .unwrap_err()
        .to_string()
        .contains("launch"));
}

/// OAI-6: `/v1/completions` refuses what keel cannot serve (400 naming the field, the episode
/// goes on), hands a text call to its episode with the default `max_tokens` of 16 and the
/// prompt, and answers `text_completion` bodies (JSON and SSE) with the legacy log-probs.
#[test]
fn oai6_text_completions_are_served_and_bad_ones_refused() {
    let gw = gateway();
    let url = format!("{}/completions", gw.base_url());
    let mailbox = gw.open();
    let key = mailbox.key.clone();
    let sampler = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while seen.len() < 2 {
            match mailbox.events.recv_timeout(Duration::from_secs(20)) {
                Ok(Event::Call { request, reply }) => {
                    seen.push((request.prompt.clone(), request.max_tokens, request.logprobs));
                    let mut answer = Answer::from_text(" 4", false);
                    answer.logprobs = Some(vec![TokenLogprob {
                        token: " 4".into(),
                        logprob: -0.25,
                    }]);
                    (answer.prompt_tokens, answer.completion_tokens) = (5, 2);
                    let _ = reply.send(Ok(Served {
                        call: seen.len() - 1,
                        answer,
                    }));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        seen
    });
    let cases = [
        (r#"{"prompt": [1, 2, 3]}"#, "one string"),
        (r#"{"prompt": ["a", "b"]}"#, "one string"),
        (r#"{"prompt": "a", "echo": true}"#, "echo"),
        (r#"{"prompt": "a", "suffix": "z"}"#, "suffix"),
        (r#"{"prompt": "a", "best_of": 3}"#, "best_of"),
        (r#"{"prompt": "a", "logprobs": 2}"#, "logprobs = 0"),
        (
            r#"{"prompt": "a", "temperature": 0.2}"#,
            "rollout.temperature",
        ),
        (r#"{"messages": []}"#, "not a completions request"),
    ];
    for (body, says) in cases {
        let (status, text) = post(&url, Some(&key), body);
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(says), "{says}: {text}");
    }
    let (status, text) = post(&url, Some(&key), r#"{"prompt": "2+2=", "logprobs": 0}"#);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], " 4");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"],
        serde_json::json!([" 4"])
    );
    assert_eq!(
        v["choices"][0]["logprobs"]["token_logprobs"],
        serde_json::json!([-0.25])
    );
    assert_eq!(
        v["choices"][0]["logprobs"]["text_offset"],
        serde_json::json!([0])
    );
    assert_eq!(v["usage"]["total_tokens"], 7);
    let (status, text) = post(&url, Some(&key), r#"{"prompt": ["2+2="], "stream": true}"#);
    assert_eq!(status, 200);
    assert!(
        text.contains(r#""text":" 4""#) && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    let seen = sampler.join().expect("sampler");
    assert_eq!(
        seen,
        vec![
            (Some("2+2=".into()), Some(16), Some(true)),
            (Some("2+2=".into()), Some(16), Some(false)),
        ]
    );
}
