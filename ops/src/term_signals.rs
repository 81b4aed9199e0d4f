//! SIGTERM and SIGINT as one stream, served on a thread of its own: the one way the `keel`
//! binary listens for them (preemption of a job, `keel launch` passing them on).
//!
//! Invariant: the handlers are installed before `spawn` returns, so a signal that arrives
//! after it is never missed.

use std::future::Future;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Which of the two arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// SIGTERM.
    Term,
    /// SIGINT.
    Int,
}

impl Received {
    /// `SIGTERM` or `SIGINT`.
    pub fn name(self) -> &'static str {
        match self {
            Received::Term => "SIGTERM",
            Received::Int => "SIGINT",
        }
    }
}

/// The installed handlers.
pub struct TermSignals {
    term: Signal,
    int: Signal,
}

impl TermSignals {
    /// The next SIGTERM or SIGINT.
    pub async fn next(&mut self) -> Received {
        tokio::select! {
            _ = self.term.recv() => Received::Term,
            _ = self.int.recv() => Received::Int,
        }
    }
}

/// Installs the handlers, then runs `serve` with them on thread `thread`.
pub fn spawn<F, Fut>(thread: &str, serve: F) -> Result<()>
where
    F: FnOnce(TermSignals) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let rt = keel_actors::process::current_thread_runtime()?;
    let signals = {
        let _guard = rt.enter();
        TermSignals {
            term: signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?,
        }
    };
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || rt.block_on(serve(signals)))?;
    Ok(())
}
