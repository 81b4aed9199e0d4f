//! One agent program per episode: started with the episode's base URL, key and task, stopped
//! when the episode is dropped.
//!
//! Invariants:
//! - APR-1 The agent gets `OPENAI_BASE_URL` (the gateway's `/v1`), `OPENAI_API_KEY` (the
//!   episode's key), `KEEL_TASK` (the task as JSON) and the same JSON on its stdin, which is then
//!   closed; its stdout is discarded and the last 4 KiB of its stderr are kept for error
//!   messages.
//! - APR-2 Dropping the process kills it and reaps it: no agent outlives its episode. An agent
//!   whose episode ended on an HTTP answer it can read (409) gets a short grace to exit on its
//!   own first, so it can log or clean up.
//! - APR-3 When the agent's stderr closes (it exits), its episode is told at once
//!   ([`Event::Closed`]) rather than at its next 50 ms look at the process.
//! - APR-4 An agent that pulled its episode (GTW-5) is not keel's process: its episode ends when
//!   it reports the end; nothing is killed, its key dies with the episode.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use super::gateway::Event;
use crate::error::EnvError;
use std::sync::mpsc::SyncSender;

/// How much of an agent's stderr is kept (APR-1).
const STDERR_TAIL: usize = 4096;

/// A running agent program.
pub struct AgentProcess {
    child: Child,
    stderr: Arc<Mutex<Vec<u8>>>,
    exited: Option<ExitStatus>,
}

impl AgentProcess {
    /// Starts `command` for one episode (APR-1).
    pub fn spawn(
        command: &[String],
        base_url: &str,
        key: &str,
        task: &str,
        on_close: SyncSender<Event>,
    ) -> Result<AgentProcess, EnvError> {
        let (program, args) = command.split_first().ok_or_else(|| EnvError::Agent {
            reason: "env.agent.command is empty".into(),
        })?;
        let mut child = Command::new(program)
            .args(args)
            .env("OPENAI_BASE_URL", base_url)
            .env("OPENAI_API_KEY", key)
            .env("KEEL_TASK", task)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| EnvError::Agent {
                reason: format!("cannot start the agent {program:?} (env.agent.command): {e}"),
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            // An agent that does not read its stdin closes it early: not an error.
            let _ = std::io::Write::write_all(&mut stdin, task.as_bytes());
        }
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let tail = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.extend_from_slice(&buf[..n]);
                    let over = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..over);
                }
                // APR-3: the episode hears of the exit now, not at its next poll.
                let _ = on_close.try_send(Event::Closed);
            });
        }
        Ok(AgentProcess {
            child,
            stderr,
            exited: None,
        })
    }

    /// The exit status once the agent has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits up to `grace` for the agent to exit on its own (it was just told its episode is
    /// over); the kill on drop follows otherwise (APR-2).
    pub fn wait_for_exit(&mut self, grace: std::time::Duration) {
        let until = std::time::Instant::now() + grace;
        while self.exited().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The end of what the agent wrote to stderr, for error messages.
    pub fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&t).trim().to_string()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The agent of one episode: a process keel started, or one that pulled the episode (APR-4).
pub enum Agent {
    /// Started by keel (APR-1..3).
    Process(AgentProcess),
    /// Runs elsewhere; `None` until it reports the end (`Some(Err(why))` when it failed).
    Pulled(Option<Result<(), String>>),
}

impl Agent {
    /// How the agent ended, once it has: `Err` says why it counts as a failure.
    pub fn ended(&mut self) -> Option<Result<(), String>> {
        match self {
            Agent::Process(p) => p.exited().map(|status| match status.success() {
                true => Ok(()),
                false => Err(format!("exited with {status}")),
            }),
            Agent::Pulled(end) => end.clone(),
        }
    }

    /// A pulled agent's end report (a started agent ends by exiting: ignored).
    pub fn report_end(&mut self, error: Option<String>) {
        if let Agent::Pulled(end) = self {
            *end = Some(match error {
                None => Ok(()),
                Some(why) => Err(format!("reported a failure: {why}")),
            });
        }
    }

    /// Gives a started agent `grace` to exit on its own (APR-2).
    pub fn wait_for_exit(&mut self, grace: std::time::Duration) {
        if let Agent::Process(p) = self {
            p.wait_for_exit(grace);
        }
    }

    /// A started agent's last stderr, for error messages.
    pub fn stderr_tail(&self) -> String {
        match self {
            Agent::Process(p) => p.stderr_tail(),
            Agent::Pulled(_) => String::new(),
        }
    }
}
