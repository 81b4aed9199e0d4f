//! The vLLM generator backend (`rollout.backend = "vllm"`): a generator samples through one
//! vLLM server instead of the built-in KV-cache sampler, token-in/token-out.
//!
//! A generator keeps its keel model (loaded and checked against the learner's probe exactly as
//! with the built-in sampler, PV-1) as the ground truth of what the engine must serve. Each
//! policy version is materialised from it as a Hugging Face folder, swapped into the server
//! (VC-2) and checked there before anything is sampled.
//!
//! Invariants:
//! - VE-1 (materialise): version `v` is written whole (config, safetensors, tokenizer files)
//!   into a folder of its own (`load-<n>/`) under the engine's work folder before the server is told to
//!   read it; a folder is never rewritten while a server may read it, and the folder of the
//!   version before is deleted once the next one is swapped in.
//! - VE-2 (engine provenance): after every load the engine's prompt log-probs of the learner's
//!   probe must equal the learner's within PB-3's bound for the engine's dtype, and a short
//!   continuation of a prompt whose blocks the engine cached under the previous version (the
//!   probe, three times: [`CACHE_BLOCK`]-token blocks) must have the log-probs the keel model gives
//!   it. The first check catches a skipped or partial reload, the second a prefix cache kept
//!   across the reload (prompt log-probs bypass vLLM's prefix cache; sampling does not). A
//!   failure is `ActorError::Provenance` on the `vllm` backend: the generator refuses to sample.
//! - VE-3: a server keel started is stopped with the engine (VS-3); one it was pointed at
//!   (`rollout.vllm.url`) is left running, and must read keel's folders (same host).
//! - VE-4: an engine's work folder is `keel-vllm-<run>-g<generator>-<keel pid>` and names its
//!   server's process group in [`SERVER_PID_FILE`]; starting an engine deletes the folders of
//!   keel processes that are gone, killing a server of theirs that outlived them (a SIGKILLed
//!   keel whose server missed its parent-death signal).

pub mod client;
mod sampler;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_learner::hf::model::dtype_name;
use keel_learner::hf::{HfModel, SamplingParams};
use keel_learner::probe::{device_name, probe_tokens, probe_tolerance, sequence_logprobs};

pub use client::{EngineOutput, VllmClient};
pub use sampler::EngineSampler;
pub use server::{ServerSpec, VllmServer};

use crate::error::ActorError;
use crate::provenance::compare;
use crate::weights::PublishedWeights;

/// The server's KV block size: small, so that the cache-check prompt fills whole cached blocks
/// (VE-2); vLLM's CPU attention needs a multiple of 32.
pub const CACHE_BLOCK: usize = 32;

/// How long a failed request waits for its server's exit before the failure is taken as the
/// server's own.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Tokens sampled by VE-2's prefix-cache check.
const CACHE_CHECK_TOKENS: usize = 4;

/// How a generator reaches its engine.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// `rollout.vllm.python`: the interpreter of an environment where vLLM is installed.
    pub python: PathBuf,
    /// `rollout.vllm.url`: a running server to use instead of starting one (empty: start one).
    pub url: String,
    /// `rollout.vllm.startup_timeout_s`.
    pub startup_timeout: Duration,
    /// Where the engine's folders and server log go (one per generator).
    pub workdir: PathBuf,
    /// `model.context_len`: the server's `--max-model-len`.
    pub max_model_len: usize,
    /// `faults.skip_weight_reload` (PV-2): the engine keeps its old weights.
    pub skip_reload: bool,
    /// `faults.skip_prefix_cache_reset` (VE-2): the engine keeps its prefix cache.
    pub skip_cache_reset: bool,
    /// The tokenizer files of the model (the server tokenises nothing keel sends, but vLLM
    /// needs a tokenizer for prompt log-probs and stop strings).
    pub tokenizer_files: Arc<Vec<(String, Vec<u8>)>>,
}

/// One generator's engine (VE-1..3).
pub struct VllmEngine {
    settings: EngineSettings,
    client: VllmClient,
    /// The server keel started (None: `rollout.vllm.url`). Dropped before the folders.
    server: Option<VllmServer>,
    /// The folder of the version loaded.
    loaded: PathBuf,
    /// The folder the server was started with (kept while it runs).
    base: Option<PathBuf>,
    /// Versions materialised so far: each gets a folder of its own (VE-1).
    loads: u64,
}

fn io_error(what: &Path, e: std::io::Error) -> ActorError {
    ActorError::Engine(format!("rollout.vllm: {}: {e}", what.display()))
}

impl VllmEngine {
    /// Materialises `weights` (loaded into `model`), starts or connects to the server, loads
    /// them there and verifies them (VE-1, VE-2).
    pub fn start(
        settings: EngineSettings,
        model: &HfModel,
        weights: &PublishedWeights,
    ) -> Result<VllmEngine, ActorError> {
        reap_stale_workdirs(&settings.workdir);
        std::fs::create_dir_all(&settings.workdir).map_err(|e| io_error(&settings.workdir, e))?;
        let folder = materialise(&settings, model, 0)?;
        let (server, client) = if settings.url.is_empty() {
            let spec = ServerSpec {
                python: settings.python.clone(),
                model_dir: folder.clone(),
                max_model_len: settings.max_model_len,
                dtype: dtype_name(model.options().kind).to_string(),
                block_size: CACHE_BLOCK,
                log: settings.workdir.join("vllm-server.log"),
                health_timeout: settings.startup_timeout,
            };
            let server = VllmServer::start(&spec)?;
            let pid_file = settings.workdir.join(SERVER_PID_FILE);
            std::fs::write(&pid_file, server.pid().to_string())
                .map_err(|e| io_error(&pid_file, e))?;
            let client = VllmClient::connect(server.url())?;
            client.set_weight_version(weights.version)?;
            (Some(server), client)
        } else {
            let client = VllmClient::connect(&settings.url)?;
            client.swap_weights(&folder, weights.version, false, false)?;
            (None, client)
        };
        let base = server.as_ref().map(|_| folder.clone());
        let engine = VllmEngine {
            settings,
            client,
            server,
            loaded: folder,
            base,
            loads: 1,
        };
        engine
            .verify(model, weights)
            .map_err(|e| engine.explain(e))?;
        Ok(engine)
    }

    /// `error` with the root cause from the log of the server keel started, if it names one.
    pub fn explain(&self, error: ActorError) -> ActorError {
        match &self.server {
            Some(server) => server.explain(error),
            None => error,
        }
    }

    /// A client of the server, for the rollout's sampler.
    pub fn client(&self) -> VllmClient {
        self.client.clone()
    }

    /// Whether the server keel started has exited, or exits within [`EXIT_GRACE`] (a request
    /// can fail while its server is still dying); false for a server keel did not start.
    pub fn server_exited(&mut self) -> bool {
        let Some(server) = self.server.as_mut() else {
            return false;
        };
        let deadline = std::time::Instant::now() + EXIT_GRACE;
        while std::time::Instant::now() < deadline {
            if server.exited() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        server.exited()
    }

    /// Swaps `weights` (loaded into `model`) into the server (VC-2) and verifies them (VE-2);
    /// the folder of the version before is deleted (VE-1).
    pub fn load(&mut self, model: &HfModel, weights: &PublishedWeights) -> Result<(), ActorError> {
        let started = std::time::Instant::now();
        let folder = materialise(&self.settings, model, self.loads)?;
        self.loads += 1;
        let s = &self.settings;
        self.client
            .swap_weights(&folder, weights.version, s.skip_reload, s.skip_cache_reset)
            .map_err(|e| self.explain(e))?;
        let before = std::mem::replace(&mut self.loaded, folder);
        if Some(&before) != self.base.as_ref() && before != self.loaded {
            let _ = std::fs::remove_dir_all(&before);
        }
        self.verify(model, weights).map_err(|e| self.explain(e))?;
        tracing::info!(
            version = weights.version,
            swap_seconds = started.elapsed().as_secs_f64(),
            "vLLM weights swapped and verified"
        );
        Ok(())
    }

    /// VE-2: the learner's probe through the engine's prompt path, and a continuation of a
    /// cached prompt against the keel model.
    fn verify(&self, model: &HfModel, weights: &PublishedWeights) -> Result<(), ActorError> {
        let ids = probe_tokens(model.config().vocab_size);
        let tokens: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        let engine = ("vllm", dtype_name(model.options().kind));
        if let Some(probe) = weights.probe.as_ref() {
            if let Some(want) = probe.logp.first() {
                let got = self.client.prompt_logprobs(&tokens)?;
                let tolerance = probe_tolerance((&probe.device, &probe.dtype), engine);
                compare(weights, "vllm", 0, &got, want, tolerance)?;
            }
        }
        // The probe three times (within the context) fills whole blocks the engine caches
        // under this version and reuses under the next: a kept cache shows in the
        // continuation's log-probs.
        let room = self
            .settings
            .max_model_len
            .saturating_sub(CACHE_CHECK_TOKENS);
        let prompt: Vec<u32> = tokens
            .iter()
            .cycle()
            .take(room.min(3 * tokens.len()))
            .copied()
            .collect();
        let params = SamplingParams {
            temperature: 1.0,
            max_new_tokens: CACHE_CHECK_TOKENS,
            ..SamplingParams::default()
        };
        let out = self.client.complete(&prompt, &params, 0)?;
        let full: Vec<i64> = prompt
            .iter()
            .chain(&out.tokens)
            .map(|&t| t as i64)
            .collect();
        let keel = sequence_logprobs(model, &full, params.temperature)?;
        let want = &keel[prompt.len() - 1..];
        let tolerance = probe_tolerance((&device_name(model.device()), engine.1), engine);
        compare(
            weights,
            "vllm (prefix cache)",
            0,
            &out.logprobs,
            want,
            tolerance,
        )
    }
}

impl Drop for VllmEngine {
    fn drop(&mut self) {
        // VE-3: the server first (it may read the folders), then the folders; its log stays.
        self.server = None;
        for folder in std::iter::once(&self.loaded).chain(&self.base) {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

/// The file in an engine's work folder naming its server's process (group) id (VE-4).
pub const SERVER_PID_FILE: &str = "server.pid";

/// The keel process id an engine work folder belongs to (its name ends in `-<pid>`).
fn owner_pid(folder: &Path) -> Option<i32> {
    folder
        .file_name()?
        .to_str()?
        .rsplit('-')
        .next()?
        .parse()
        .ok()
}

/// VE-4: engine work folders of keel processes that no longer run (next to `workdir`, named
/// like it) are deleted, after their server's process group is killed if it outlived them.
fn reap_stale_workdirs(workdir: &Path) {
    let Some(parent) = workdir.parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("keel-vllm-"));
        let Some(owner) = owner_pid(&path).filter(|_| named) else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let server = std::fs::read_to_string(path.join(SERVER_PID_FILE))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            // A recycled pid is not killed: the process must still be a vLLM server.
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("vllm"))
            });
        if let Some(group) = server {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// VE-1: writes `model` with the tokenizer files into the fresh folder of load `load`.
fn materialise(
    settings: &EngineSettings,
    model: &HfModel,
    load: u64,
) -> Result<PathBuf, ActorError> {
    let folder = settings.workdir.join(format!("load-{load}"));
    if folder.exists() {
        std::fs::remove_dir_all(&folder).map_err(|e| io_error(&folder, e))?;
    }
    // HS-4: vLLM on CPU applies only part of a reload of a tied model.
    model.save_untied(&folder)?;
    for (name, bytes) in settings.tokenizer_files.iter() {
        let path = folder.join(name);
        std::fs::write(&path, bytes).map_err(|e| io_error(&path, e))?;
    }
    Ok(folder)
}
