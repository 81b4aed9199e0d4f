//! Processes a test starts (`keel` roles, servers): nothing outlives its test.
//!
//! Invariants:
//! - PG-1: a [`Guarded`] child runs in a process group of its own and is SIGKILLed with that
//!   group when the guard drops — when the test ends, passed or failed (a panic unwinds through
//!   the drop), so a child's own children go too.
//! - PG-2: the child gets SIGKILL when the thread that started it dies (`PR_SET_PDEATHSIG`), so a
//!   test process killed from outside (a nextest timeout, SIGKILL) leaves nothing running either.

use std::ops::{Deref, DerefMut};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A child process that is killed with its process group when dropped (PG-1, PG-2).
pub struct Guarded {
    child: Child,
}

impl Guarded {
    /// Starts `cmd` in a process group of its own, with a parent-death signal.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Guarded> {
        cmd.process_group(0);
        // SAFETY: the closure runs in the forked child before exec and calls only prctl(2),
        // which is async-signal-safe; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        Ok(Guarded {
            child: cmd.spawn()?,
        })
    }

    /// SIGKILLs the process group now (what dropping does) and reaps the child.
    pub fn kill_group(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Deref for Guarded {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for Guarded {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // The group outlives a leader that exited: its children are killed either way (and
        // SIGKILL ends stopped processes too).
        self.kill_group();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg1_dropping_the_guard_kills_the_child_and_its_children() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("sleep 600 & echo $! > {}; wait", pidfile.display());
        let guard = Guarded::spawn(Command::new("bash").args(["-c", &script])).expect("spawn");
        let leader = guard.id();
        while std::fs::read_to_string(&pidfile).map_or(true, |s| s.trim().is_empty()) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let grandchild: i32 = std::fs::read_to_string(&pidfile)
            .expect("pid")
            .trim()
            .parse()
            .expect("a pid");
        drop(guard);
        let alive = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"))
        };
        // SIGKILL is delivered at once; a reparented grandchild is reaped by init soon after.
        for _ in 0..500 {
            if !alive(grandchild) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!alive(leader as i32), "the child survived its guard");
        assert!(!alive(grandchild), "the child's child survived its guard");
    }

    #[test]
    fn pg2_a_child_whose_parent_dies_without_dropping_the_guard_is_killed() {
        // The guard is leaked, as when the test process is SIGKILLed: nothing drops it. The
        // parent-death signal follows the thread that started the child, so a thread that ends
        // stands for a test process that dies.
        let pid = std::thread::spawn(|| {
            let guard = Guarded::spawn(Command::new("sleep").arg("600")).expect("spawn");
            let pid = guard.id();
            std::mem::forget(guard);
            pid
        })
        .join()
        .expect("thread");
        let gone = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
        };
        for _ in 0..500 {
            if gone(pid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(gone(pid), "the child outlived the thread that started it");
        // Reap it (it is this process's child).
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None);
    }
}
