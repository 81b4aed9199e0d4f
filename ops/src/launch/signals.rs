//! SIGTERM and SIGINT received by `keel launch` are passed on to the process it runs (the Ray
//! driver), which decides what they mean. Each signal is passed on once, as it arrives.

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

/// Installs the handlers on a thread of their own; they forward to `pid` until it is gone.
pub fn forward_to(pid: u32) -> Result<()> {
    let pid = Pid::from_raw(i32::try_from(pid).context("the driver's pid is out of range")?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut int) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?,
        )
    };
    std::thread::Builder::new()
        .name("keel-launch-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    let sig = tokio::select! {
                        _ = term.recv() => Signal::SIGTERM,
                        _ = int.recv() => Signal::SIGINT,
                    };
                    if kill(pid, sig).is_err() {
                        return;
                    }
                }
            })
        })?;
    Ok(())
}
