//! SIGTERM and SIGINT received by `keel launch` are passed on to the process it runs (the Ray
//! driver), which decides what they mean. Each signal is passed on once, as it arrives.

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::term_signals::Received;

/// Installs the handlers on a thread of their own; they forward to `pid` until it is gone.
pub fn forward_to(pid: u32) -> Result<()> {
    let pid = Pid::from_raw(i32::try_from(pid).context("the driver's pid is out of range")?);
    crate::term_signals::spawn("keel-launch-signals", move |mut signals| async move {
        loop {
            let sig = match signals.next().await {
                Received::Term => Signal::SIGTERM,
                Received::Int => Signal::SIGINT,
            };
            if kill(pid, sig).is_err() {
                return;
            }
        }
    })
}
