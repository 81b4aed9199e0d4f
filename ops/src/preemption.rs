//! SIGTERM / SIGINT (spot preemption): ask the job to stop with a checkpoint (CT-5, JB-6) and
//! give it `run.sigterm_grace_s` seconds; past that the process exits 1.
//!
//! Invariants:
//! - PE-1: the handlers are installed before training starts, so a signal at any point after
//!   startup is seen; the first one requests the stop, and exit 0 follows the committed checkpoint.
//! - PE-2: if the job has not returned when the grace period ends, the process exits 1 with a
//!   message, so a supervisor never mistakes an incomplete stop for a clean one. The exit is
//!   `_exit(2)`: no C++ static destructor of libtorch runs while the learner's thread may still be
//!   inside a torch op (`exit(3)` there crashed: a segfault, or `Invalid (backend, op) pair` with
//!   a torch trace).

use std::time::Duration;

use anyhow::Result;
use keel_actors::StopSignal;

/// The one process bootstrap of `keel train`, `keel trainer` and `keel generator`: a stop
/// signal that SIGTERM/SIGINT request, with handlers installed (PE-1) before this returns and
/// `grace_s` seconds to stop in (PE-2).
pub fn stop_signal(grace_s: u64) -> Result<StopSignal> {
    let stop = StopSignal::default();
    install(stop.clone(), Duration::from_secs(grace_s))?;
    Ok(stop)
}

/// Installs the handlers (PE-1) on a thread of their own.
fn install(stop: StopSignal, grace: Duration) -> Result<()> {
    crate::term_signals::spawn("keel-signals", move |mut signals| async move {
        let name = signals.next().await.name();
        eprintln!(
            "{name}: finishing the current step and committing a checkpoint (grace {} s)",
            grace.as_secs()
        );
        stop.request();
        tokio::time::sleep(grace).await;
        eprintln!(
            "error: no checkpoint was committed within the {} s grace period (run.sigterm_grace_s)",
            grace.as_secs()
        );
        // PE-2: stderr is unbuffered, so the line above is out; end without destructors.
        // SAFETY: _exit(2) takes no lock and runs no handler; it only ends the process.
        unsafe { nix::libc::_exit(1) }
    })
}
