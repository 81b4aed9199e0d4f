//! A vLLM server process that keel starts for one generator and stops with it.
//!
//! Invariants:
//! - VS-1: the server runs vLLM's OpenAI-compatible entrypoint from the interpreter of an
//!   environment where vLLM is installed (`rollout.vllm.python`), on loopback, in its own
//!   process group, in dev mode (weight reloads, prefix-cache resets), with log-probs after
//!   temperature (`--logprobs-mode processed_logprobs`). keel renders and tokenises; the
//!   folder's tokenizer is still loaded, since vLLM 0.32 refuses `prompt_logprobs` and
//!   `return_token_ids` without one (HTTP 400) and stop strings need its detokeniser.
//! - VS-2: [`VllmServer::start`] returns only once `GET /health` answers 200; a server that
//!   exits first, or is not healthy within the timeout, is an error that names the key and
//!   carries the tail of its log, and the process group is stopped.
//! - VS-3: dropping a server stops its whole process group (SIGTERM, then SIGKILL after a
//!   grace) and reaps it; the server is also sent SIGTERM when the thread that started it dies
//!   (a parent-death signal), so a SIGKILLed keel leaves no engine behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::error::ActorError;

/// How to start a server.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// The interpreter of the environment where vLLM is installed.
    pub python: PathBuf,
    /// The Hugging Face folder it serves.
    pub model_dir: PathBuf,
    /// `--max-model-len`.
    pub max_model_len: usize,
    /// `--dtype` (`float32`, `bfloat16`).
    pub dtype: String,
    /// `--block-size`: tokens per KV block (the prefix cache's unit).
    pub block_size: usize,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    /// Longest wait for `/health`.
    pub health_timeout: Duration,
}

/// A running server (VS-1..3).
pub struct VllmServer {
    child: Child,
    url: String,
    log: PathBuf,
}

/// Grace between SIGTERM and SIGKILL when a server stops (VS-3).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A free loopback port.
fn free_port() -> Result<u16, ActorError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ActorError::Engine(format!("no free loopback port: {e}")))
}

/// The last `lines` lines of the file at `path` (empty when it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The first Python exception message in the log at `path` (`RuntimeError: …`), the root
/// cause where vLLM's own answer only says its engine died; an engine's death notice is not
/// one.
pub fn first_error(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let at = line.find("Error: ").or_else(|| line.find("Exception: "))?;
        let start = line[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .map_or(0, |k| k + 1);
        let message = &line[start..];
        let dead =
            message.contains("EngineDeadError") || message.starts_with("OSError: [Errno 24]");
        (!dead).then(|| message.trim().to_string())
    })
}

/// The command that runs a vLLM server of `spec` on loopback `port` with the flags keel's
/// client needs (VS-1): the ones `rollout.vllm.url` documents for a server keel does not start.
pub fn command(spec: &ServerSpec, port: u16) -> Command {
    let mut cmd = Command::new(&spec.python);
    cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&spec.model_dir)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--dtype", &spec.dtype])
        .args(["--max-model-len", &spec.max_model_len.to_string()])
        .args(["--block-size", &spec.block_size.to_string()])
        .args(["--enforce-eager", "--seed", "0"])
        .args([
            "--logprobs-mode",
            "processed_logprobs",
            "--enable-scale-out",
        ])
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("VLLM_SERVER_DEV_MODE", "1")
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1");
    cmd
}

impl VllmServer {
    /// Starts the server of `spec` on a free loopback port and waits until it is healthy
    /// (VS-2).
    pub fn start(spec: &ServerSpec) -> Result<VllmServer, ActorError> {
        let port = free_port()?;
        let log = std::fs::File::create(&spec.log).map_err(|e| {
            ActorError::Engine(format!(
                "cannot create the vLLM log {}: {e}",
                spec.log.display()
            ))
        })?;
        let err = log
            .try_clone()
            .map_err(|e| ActorError::Engine(format!("vLLM log: {e}")))?;
        let mut cmd = command(spec, port);
        cmd.stdin(Stdio::null()).stdout(log).stderr(err);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // VS-3: the engine is told to stop when the thread that started it dies.
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|e| {
            ActorError::Engine(format!(
                "rollout.vllm.python: cannot start {}: {e}",
                spec.python.display()
            ))
        })?;
        let mut server = VllmServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log: spec.log.clone(),
        };
        server.wait_healthy(spec.health_timeout)?;
        Ok(server)
    }

    /// VS-2: polls `/health` until it answers 200, the process exits or `timeout` passes.
    fn wait_healthy(&mut self, timeout: Duration) -> Result<(), ActorError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.failed(&format!("exited ({status}) before it was healthy")));
            }
            if agent
                .get(format!("{}/health", self.url))
                .call()
                .is_ok_and(|r| r.status() == 200)
            {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(self.failed(&format!(
                    "was not healthy within {:.0} s",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn failed(&self, what: &str) -> ActorError {
        let cause =
            first_error(&self.log).map_or(String::new(), |e| format!("; its first error: {e}"));
        ActorError::Engine(format!(
            "rollout.vllm: the vLLM server ({}) {what}{cause}; the end of its log {}:\n{}",
            self.url,
            self.log.display(),
            log_tail(&self.log, 20)
        ))
    }

    /// `error`, from a request to this server, with the root cause its log names (a server
    /// whose engine died answers only HTTP 500).
    pub fn explain(&self, error: ActorError) -> ActorError {
        match first_error(&self.log) {
            Some(cause) => ActorError::Engine(format!(
                "{error}\nrollout.vllm: the vLLM server's first error: {cause} (its log: {})",
                self.log.display()
            )),
            None => error,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the server process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// The process id of the server (its process group's id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        let group = Pid::from_raw(self.child.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Workers the server started share its group: none may outlive it.
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::first_error;

    #[test]
    fn the_first_error_of_a_log_is_its_root_cause_not_the_engine_death() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("vllm-server.log");
        let text = "\
(APIServer pid=1) WARNING [system_utils.py:255] failed with error: OSError: [Errno 24] Too many open files
(Worker pid=3) ERROR [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention configuration: head_dim=16
(APIServer pid=1) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
";
        std::fs::write(&log, text).expect("write");
        assert_eq!(
            first_error(&log).as_deref(),
            Some("RuntimeError: Unsupported CPU attention configuration: head_dim=16")
        );
        assert_eq!(first_error(&dir.path().join("none")), None);
    }
}
