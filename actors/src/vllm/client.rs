//! keel's side of a vLLM server's HTTP API: token-in/token-out completions, prompt scoring and
//! the weight swap.
//!
//! Invariants:
//! - VC-1 (token-in/token-out): a completion request goes to vLLM's native generate endpoint
//!   (`/inference/v1/generate`, served with `--enable-scale-out`) with the exact token ids of
//!   the context, and answers the sampled token ids with each one's log-prob (`logprobs: 0`,
//!   after temperature: the server runs with `--logprobs-mode processed_logprobs`) and the
//!   weight version that sampled each token (vLLM's `weight_versions` spans, labelled with the
//!   versions keel sets). Nothing is re-tokenised on either side.
//! - VC-2 (weight swap): [`VllmClient::swap_weights`] pauses the server aborting what runs
//!   (aborted requests answer `finish_reason = "abort"` with their partial tokens), reloads the
//!   weights from a folder, resets the prefix cache (it survives reloads: without the reset,
//!   prefixes cached under the old weights are reused silently), sets the weight version and
//!   resumes. Each call is checked: a refused step is an error naming it.
//! - VC-3: [`VllmClient::connect`] refuses a server of another vLLM release than
//!   [`SUPPORTED_VLLM`].
//! - VC-4: no request is retried here: a completion may not be sampled twice, and the server is
//!   on loopback; a transport error is the caller's (the generator restarts the server).

use std::path::Path;
use std::time::Duration;

use keel_learner::hf::SamplingParams;
use serde_json::{json, Value};

use crate::error::ActorError;

/// The vLLM release line keel drives (its dev-mode pause / reload / reset API and answers).
pub const SUPPORTED_VLLM: &str = "0.32.";

/// Longest wait for one answer (a completion of a long turn on a loaded CPU included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// What one completion request produced (VC-1).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOutput {
    /// The sampled token ids.
    pub tokens: Vec<u32>,
    /// Their log-probs.
    pub logprobs: Vec<f32>,
    /// vLLM's `finish_reason`: `stop`, `length` or `abort`.
    pub finish: String,
    /// vLLM's `stop_reason`: the stop token id or string, if one ended it.
    pub stop_reason: Value,
    /// The weight versions that sampled them, as `(first token, version)` spans in order
    /// (VC-1); a span whose label is not a version keel set is left out.
    pub versions: Vec<(usize, u64)>,
}

/// A connection to one vLLM server.
#[derive(Clone)]
pub struct VllmClient {
    url: String,
    /// The served model name requests must name.
    model: String,
    agent: ureq::Agent,
}

impl VllmClient {
    /// A client of the server at `url` (`http://host:port`); asks it the name it serves.
    pub fn connect(url: &str) -> Result<VllmClient, ActorError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        let mut client = VllmClient {
            url: url.trim_end_matches('/').to_string(),
            model: String::new(),
            agent,
        };
        let version = client.call("GET", "/version", None)?;
        let version = version["version"].as_str().unwrap_or("unknown");
        if !version.starts_with(SUPPORTED_VLLM) {
            return Err(ActorError::Engine(format!(
                "rollout.vllm: the server at {url} runs vLLM {version}; keel drives vLLM {SUPPORTED_VLLM}x (scripts/vllm_env.sh installs it)"
            )));
        }
        let models = client.call("GET", "/v1/models", None)?;
        client.model = models["data"][0]["id"]
            .as_str()
            .ok_or_else(|| ActorError::Engine(format!("{url}/v1/models names no model")))?
            .to_string();
        Ok(client)
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One request; an HTTP error status is an error carrying the server's answer.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ActorError> {
        let url = format!("{}{path}", self.url);
        let sent = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            (_, Some(b)) => self.agent.post(&url).send_json(b),
            (_, None) => self.agent.post(&url).send_empty(),
        };
        let mut resp =
            sent.map_err(|e| ActorError::Engine(format!("vLLM server {}: {path}: {e}", self.url)))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ActorError::Engine(format!("vLLM {path}: reading the answer: {e}")))?;
        if status >= 400 {
            return Err(ActorError::Engine(format!(
                "vLLM {path}: HTTP {status}: {}",
                text.chars().take(2000).collect::<String>()
            )));
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text)
            .map_err(|e| ActorError::Engine(format!("vLLM {path}: bad JSON answer ({e})")))
    }

    /// Continues `prompt` under `params` with the per-request `seed` (VC-1).
    pub fn complete(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        seed: u64,
    ) -> Result<EngineOutput, ActorError> {
        let body = json!({
            "token_ids": prompt,
            "sampling_params": {
                "max_tokens": params.max_new_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": if params.top_k == 0 { -1 } else { params.top_k as i64 },
                // vLLM's seeds are signed 64-bit.
                "seed": seed >> 1,
                "stop_token_ids": params.stop_token_ids,
                "stop": params.stop_strings,
                "include_stop_str_in_output": true,
                "logprobs": 0,
                "skip_special_tokens": false,
            },
        });
        let answer = self
            .call("POST", "/inference/v1/generate", Some(&body))
            .map_err(|e| match e {
                ActorError::Engine(m) if m.contains("HTTP 404") => ActorError::Engine(format!(
                    "{m}: the server at {} does not serve vLLM's generate endpoint; start it with --enable-scale-out (rollout.vllm.url)",
                    self.url
                )),
                other => other,
            })?;
        let choice = &answer["choices"][0];
        let tokens: Vec<u32> = serde_json::from_value(choice["token_ids"].clone())
            .map_err(|e| ActorError::Engine(format!("vLLM answered no token ids ({e})")))?;
        let logprobs: Vec<f32> = choice["logprobs"]["content"]
            .as_array()
            .map(|content| {
                content
                    .iter()
                    .filter_map(|t| t["logprob"].as_f64().map(|x| x as f32))
                    .collect()
            })
            .unwrap_or_default();
        if logprobs.len() != tokens.len() {
            return Err(ActorError::Engine(format!(
                "vLLM answered {} tokens with {} log-probs",
                tokens.len(),
                logprobs.len()
            )));
        }
        let versions = choice["weight_versions"]
            .as_array()
            .map(|spans| {
                spans
                    .iter()
                    .filter_map(|span| {
                        let version = span["version"].as_str()?.parse().ok()?;
                        Some((span["start"].as_u64()? as usize, version))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(EngineOutput {
            tokens,
            logprobs,
            finish: choice["finish_reason"].as_str().unwrap_or("").to_string(),
            stop_reason: choice["stop_reason"].clone(),
            versions,
        })
    }

    /// `log p(tokens_t | tokens_<t)` for t = 1.. at temperature 1, from the prompt's own
    /// forward (vLLM computes prompt log-probs without its prefix cache).
    pub fn prompt_logprobs(&self, tokens: &[u32]) -> Result<Vec<f32>, ActorError> {
        let body = json!({
            "model": self.model,
            "prompt": tokens,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        });
        let answer = self.call("POST", "/v1/completions", Some(&body))?;
        let per_token = answer["choices"][0]["prompt_logprobs"]
            .as_array()
            .ok_or_else(|| ActorError::Engine("vLLM answered no prompt log-probs".into()))?;
        tokens
            .iter()
            .zip(per_token)
            .skip(1)
            .map(|(t, entry)| {
                entry[t.to_string()]["logprob"]
                    .as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| {
                        ActorError::Engine(format!("vLLM answered no prompt log-prob of token {t}"))
                    })
            })
            .collect()
    }

    /// Labels the tokens sampled from now on with `version` (VC-1).
    pub fn set_weight_version(&self, version: u64) -> Result<(), ActorError> {
        let body = json!({"new_version": version.to_string()});
        self.call("POST", "/update_weight_version", Some(&body))?;
        Ok(())
    }

    /// VC-2: pause (abort) → reload from `folder` → reset the prefix cache (unless
    /// `skip_cache_reset`, a fault injection) → set `version` → resume.
    pub fn swap_weights(
        &self,
        folder: &Path,
        version: u64,
        skip_reload: bool,
        skip_cache_reset: bool,
    ) -> Result<(), ActorError> {
        self.call("POST", "/pause?mode=abort&clear_cache=false", None)?;
        let swap = || -> Result<(), ActorError> {
            if !skip_reload {
                let body = json!({
                    "method": "reload_weights",
                    "kwargs": {"weights_path": folder.to_string_lossy()},
                });
                self.call("POST", "/collective_rpc", Some(&body))?;
            }
            if !skip_cache_reset {
                let reset = self.call("POST", "/reset_prefix_cache", None)?;
                if reset.get("success").and_then(Value::as_bool) == Some(false) {
                    return Err(ActorError::Engine(
                        "vLLM refused to reset its prefix cache (blocks still held)".into(),
                    ));
                }
            }
            self.set_weight_version(version)
        };
        let swapped = swap();
        // Resume even after a failed step: the caller's error must not leave a paused server.
        let resumed = self.call("POST", "/resume", None);
        swapped.and(resumed.map(|_| ()))
    }
}
