//! Collectives between learner ranks: PyTorch's own c10d — `TCPStore` for the rendezvous,
//! `ProcessGroupGloo` for CPU collectives and `ProcessGroupNCCL` for GPU ones — reached through
//! the C shim in `csrc/` (see `csrc/README.md` for why a shim: tch binds no c10d, and c10d is
//! C++).
//!
//! Invariants:
//! - CG-1 (no hang): every call either completes on every rank or fails on each rank within the
//!   group's timeout; a peer that died or hangs gives an error naming the operation and this
//!   rank, never a wait without end.
//! - CG-2 (one job per group): [`RankGroup::join`] publishes this rank's identity (the config
//!   hash and model, as the caller renders them) and refuses to start when any rank's differs
//!   from rank 0's, naming that rank and both identities.
//! - CG-3: tensors handed to a collective are contiguous and of the same shape and kind on every
//!   rank; the group is used by one thread at a time (`&mut self`).
//! - CG-4 (two backends): a group always has Gloo; joined with a CUDA device it also has NCCL
//!   on that device. A collective runs on its tensor's device's backend: CPU tensors (commands,
//!   flags, statistics, checkpoint shards) over Gloo, CUDA tensors (gradients, weights) over
//!   NCCL; a tensor on another device is refused.

use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Tensor};

/// The shim's opaque process group.
#[repr(C)]
struct RawGroup {
    _private: [u8; 0],
}

type TensorHandle = *mut torch_sys::C_tensor;

extern "C" {
    fn keel_c10d_free_message(message: *mut c_char);
    fn keel_c10d_has_nccl() -> c_int;
    fn keel_c10d_group_new(
        host: *const c_char,
        port: u16,
        rank: c_int,
        world: c_int,
        timeout_ms: i64,
        cuda_device: c_int,
        out: *mut *mut RawGroup,
        error: *mut *mut c_char,
    ) -> c_int;
    fn keel_c10d_free(group: *mut RawGroup);
    fn keel_c10d_all_reduce_sum(
        group: *mut RawGroup,
        tensor: TensorHandle,
        error: *mut *mut c_char,
    ) -> c_int;
    fn keel_c10d_broadcast(
        group: *mut RawGroup,
        tensor: TensorHandle,
        root: c_int,
        timeout_ms: i64,
        error: *mut *mut c_char,
    ) -> c_int;
    fn keel_c10d_all_gather(
        group: *mut RawGroup,
        input: TensorHandle,
        outputs: *mut TensorHandle,
        count: c_int,
        error: *mut *mut c_char,
    ) -> c_int;
    fn keel_c10d_barrier(group: *mut RawGroup, error: *mut *mut c_char) -> c_int;
    fn keel_c10d_store_set(
        group: *mut RawGroup,
        key: *const c_char,
        value: *const u8,
        len: usize,
        error: *mut *mut c_char,
    ) -> c_int;
    fn keel_c10d_store_get(
        group: *mut RawGroup,
        key: *const c_char,
        value: *mut *mut u8,
        len: *mut usize,
        error: *mut *mut c_char,
    ) -> c_int;
}

/// What a rank group can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// The rendezvous (TCPStore connection, Gloo connections) failed or timed out.
    #[error("rank {rank} of {world}: rendezvous at {address} failed: {reason}")]
    Rendezvous {
        /// This rank.
        rank: usize,
        /// The number of ranks.
        world: usize,
        /// `host:port` of rank 0's store.
        address: String,
        /// c10d's message.
        reason: String,
    },
    /// A rank was started for another job (CG-2).
    #[error("rank {rank} was started with another job than rank 0: rank 0 has {expected}, rank {rank} has {found}; start every rank with the same config and model")]
    IdentityMismatch {
        /// The differing rank.
        rank: usize,
        /// Rank 0's identity.
        expected: String,
        /// The differing rank's identity.
        found: String,
    },
    /// A collective failed: a peer died, hung past the timeout, or the tensors disagree.
    #[error("rank {rank} of {world}: {op} failed (a peer rank died, hung past the {timeout_s} s collective timeout, or disagrees on the tensor): {reason}")]
    Collective {
        /// The operation, e.g. `all_reduce`.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The number of ranks.
        world: usize,
        /// The group's timeout in seconds.
        timeout_s: u64,
        /// c10d's message.
        reason: String,
    },
    /// An argument cannot be used (a non-CPU tensor, a rank out of range, a NUL in the host).
    #[error("invalid collective argument: {0}")]
    Invalid(String),
}

/// Where and how ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// Rank 0's address (it serves the store).
    pub host: String,
    /// Rank 0's store port.
    pub port: u16,
    /// This rank, `0..world`.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// The rendezvous and collective timeout (CG-1).
    pub timeout: Duration,
    /// The CUDA device this rank's NCCL runs on; None: Gloo alone (CG-4).
    pub cuda_device: Option<usize>,
}

/// The CUDA device index NCCL runs on for a rank on `device` (CG-4); None on the CPU (Gloo alone).
pub fn nccl_device(device: Device) -> Option<usize> {
    match device {
        Device::Cuda(d) => Some(d),
        _ => None,
    }
}

/// Whether this build's shim has NCCL (learner/build.rs found a CUDA libtorch and its headers).
pub fn nccl_compiled() -> bool {
    // SAFETY: a constant query without arguments.
    unsafe { keel_c10d_has_nccl() != 0 }
}

/// One rank's membership of a c10d process group (Gloo, and NCCL on a CUDA device, CG-4).
pub struct RankGroup {
    raw: NonNull<RawGroup>,
    rank: usize,
    world: usize,
    timeout: Duration,
    cuda_device: Option<usize>,
}

// SAFETY: the shim's group is a heap object with no thread affinity; `&mut self` on every call
// keeps it to one thread at a time (CG-3).
unsafe impl Send for RankGroup {}

/// Takes the shim's message and frees it.
fn take_message(message: *mut c_char) -> String {
    if message.is_null() {
        return "no message".into();
    }
    // SAFETY: a non-null message is a NUL-terminated string malloc'd by the shim.
    let text = unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: freed once, by the shim's own allocator.
    unsafe { keel_c10d_free_message(message) };
    text
}

impl RankGroup {
    /// Meets the other ranks (rank 0 serves the store at `host:port`), builds the Gloo group (and
    /// NCCL on `at.cuda_device`, CG-4) and checks every rank's `identity` against rank 0's
    /// (CG-2).
    pub fn join(at: &Rendezvous, identity: &str) -> Result<Self, CollectiveError> {
        if at.world == 0 || at.rank >= at.world {
            return Err(CollectiveError::Invalid(format!(
                "rank {} is outside a world of {}",
                at.rank, at.world
            )));
        }
        let host = CString::new(at.host.as_str())
            .map_err(|_| CollectiveError::Invalid(format!("host {:?} holds a NUL", at.host)))?;
        let mut raw = std::ptr::null_mut();
        let mut error = std::ptr::null_mut();
        // SAFETY: valid pointers; the shim writes `raw` on success and `error` on failure.
        let rc = unsafe {
            keel_c10d_group_new(
                host.as_ptr(),
                at.port,
                at.rank as c_int,
                at.world as c_int,
                at.timeout.as_millis() as i64,
                at.cuda_device.map_or(-1, |d| d as c_int),
                &mut raw,
                &mut error,
            )
        };
        let raw = match (rc, NonNull::new(raw)) {
            (0, Some(raw)) => raw,
            _ => {
                return Err(CollectiveError::Rendezvous {
                    rank: at.rank,
                    world: at.world,
                    address: format!("{}:{}", at.host, at.port),
                    reason: take_message(error),
                })
            }
        };
        let mut group = RankGroup {
            raw,
            rank: at.rank,
            world: at.world,
            timeout: at.timeout,
            cuda_device: at.cuda_device,
        };
        group.check_identity(identity)?;
        Ok(group)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// CG-3, CG-4: `t` is contiguous and on a device this group has a backend for.
    fn check_tensor(&self, t: &Tensor, what: &str) -> Result<(), CollectiveError> {
        let served = match t.device() {
            Device::Cpu => true,
            Device::Cuda(d) => self.cuda_device == Some(d),
            _ => false,
        };
        if !served || !t.is_contiguous() {
            let nccl = match self.cuda_device {
                Some(d) => format!("CPU (Gloo) or cuda:{d} (NCCL)"),
                None => "CPU (Gloo; the group has no NCCL)".to_string(),
            };
            return Err(CollectiveError::Invalid(format!(
                "{what} must be a contiguous tensor on {nccl}, got {:?} contiguous={}",
                t.device(),
                t.is_contiguous()
            )));
        }
        Ok(())
    }

    fn failed(
        &self,
        op: &'static str,
        rc: c_int,
        error: *mut c_char,
    ) -> Result<(), CollectiveError> {
        if rc == 0 {
            return Ok(());
        }
        Err(CollectiveError::Collective {
            op,
            rank: self.rank,
            world: self.world,
            timeout_s: self.timeout.as_secs(),
            reason: take_message(error),
        })
    }

    /// CG-2: every rank publishes its identity; each compares every other rank's with rank 0's.
    fn check_identity(&mut self, identity: &str) -> Result<(), CollectiveError> {
        self.store_set(&format!("identity/{}", self.rank), identity.as_bytes())?;
        let expected = String::from_utf8_lossy(&self.store_get("identity/0")?).into_owned();
        for rank in 1..self.world {
            let found =
                String::from_utf8_lossy(&self.store_get(&format!("identity/{rank}"))?).into_owned();
            if found != expected {
                return Err(CollectiveError::IdentityMismatch {
                    rank,
                    expected,
                    found,
                });
            }
        }
        self.barrier()
    }

    fn store_set(&mut self, key: &str, value: &[u8]) -> Result<(), CollectiveError> {
        let key = CString::new(key).map_err(|_| CollectiveError::Invalid(key.into()))?;
        let mut error = std::ptr::null_mut();
        // SAFETY: the group is live; key and value outlive the call.
        let rc = unsafe {
            keel_c10d_store_set(
                self.raw.as_ptr(),
                key.as_ptr(),
                value.as_ptr(),
                value.len(),
                &mut error,
            )
        };
        self.failed("store set", rc, error)
    }

    fn store_get(&mut self, key: &str) -> Result<Vec<u8>, CollectiveError> {
        let key_c = CString::new(key).map_err(|_| CollectiveError::Invalid(key.into()))?;
        let mut value = std::ptr::null_mut();
        let mut len = 0usize;
        let mut error = std::ptr::null_mut();
        // SAFETY: the group is live; the shim writes a malloc'd buffer of `len` bytes on success.
        let rc = unsafe {
            keel_c10d_store_get(
                self.raw.as_ptr(),
                key_c.as_ptr(),
                &mut value,
                &mut len,
                &mut error,
            )
        };
        self.failed("store get", rc, error)?;
        if value.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: `value` holds `len` initialised bytes; it is freed once, by the shim.
        let bytes = unsafe { std::slice::from_raw_parts(value, len) }.to_vec();
        take_message(value.cast());
        Ok(bytes)
    }

    /// Sums `tensor` over the ranks, in place.
    pub fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<(), CollectiveError> {
        self.check_tensor(tensor, "all_reduce's tensor")?;
        let mut error = std::ptr::null_mut();
        // SAFETY: the group is live and the tensor handle valid for the call.
        let rc =
            unsafe { keel_c10d_all_reduce_sum(self.raw.as_ptr(), tensor.as_mut_ptr(), &mut error) };
        self.failed("all_reduce", rc, error)
    }

    /// Overwrites `tensor` on every rank with its value on `root`.
    pub fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<(), CollectiveError> {
        self.broadcast_within(tensor, root, self.timeout)
    }

    /// [`RankGroup::broadcast`] waiting up to `timeout` instead of the group's: for a rank
    /// that idles until the next command (a dead root still fails it at once: its sockets
    /// close).
    pub fn broadcast_within(
        &mut self,
        tensor: &mut Tensor,
        root: usize,
        timeout: Duration,
    ) -> Result<(), CollectiveError> {
        self.check_tensor(tensor, "broadcast's tensor")?;
        if root >= self.world {
            return Err(CollectiveError::Invalid(format!(
                "broadcast root {root} is outside a world of {}",
                self.world
            )));
        }
        let mut error = std::ptr::null_mut();
        // SAFETY: the group is live and the tensor handle valid for the call.
        let rc = unsafe {
            keel_c10d_broadcast(
                self.raw.as_ptr(),
                tensor.as_mut_ptr(),
                root as c_int,
                timeout.as_millis().max(1) as i64,
                &mut error,
            )
        };
        self.failed("broadcast", rc, error)
    }

    /// Every rank's `input`, in rank order (each shaped and typed as `input`).
    pub fn all_gather(&mut self, input: &Tensor) -> Result<Vec<Tensor>, CollectiveError> {
        self.check_tensor(input, "all_gather's tensor")?;
        let mut input = input.shallow_clone();
        let mut outputs: Vec<Tensor> = (0..self.world).map(|_| input.empty_like()).collect();
        let mut handles: Vec<TensorHandle> = outputs.iter_mut().map(|t| t.as_mut_ptr()).collect();
        let mut error = std::ptr::null_mut();
        // SAFETY: the group is live; `handles` points at `world` live tensors for the call.
        let rc = unsafe {
            keel_c10d_all_gather(
                self.raw.as_ptr(),
                input.as_mut_ptr(),
                handles.as_mut_ptr(),
                handles.len() as c_int,
                &mut error,
            )
        };
        self.failed("all_gather", rc, error)?;
        Ok(outputs)
    }

    /// Waits until every rank has reached this call.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        let mut error = std::ptr::null_mut();
        // SAFETY: the group is live.
        let rc = unsafe { keel_c10d_barrier(self.raw.as_ptr(), &mut error) };
        self.failed("barrier", rc, error)
    }
}

impl Drop for RankGroup {
    fn drop(&mut self) {
        // SAFETY: created by keel_c10d_group_new, freed once.
        unsafe { keel_c10d_free(self.raw.as_ptr()) };
    }
}

/// Loopback rendezvous for tests of several ranks in one process.
#[cfg(test)]
pub(crate) mod test_support {
    use super::Rendezvous;

    /// A port free at the time of the call (the rendezvous binds it a moment later).
    ///
    /// Tests run several ranks as threads of one process, each with a group of its own. c10d's
    /// flight recorder is one per process and is not safe under concurrent enqueues from
    /// several groups (a crash in its map insert, seen here about once in six runs), so it is
    /// off in tests; a keel process has one group, used by one thread at a time (CG-3). The
    /// test's own thread calls this before any group exists, so no other thread reads the
    /// variable meanwhile.
    pub(crate) fn free_port() -> u16 {
        static NO_FLIGHT_RECORDER: std::sync::Once = std::sync::Once::new();
        NO_FLIGHT_RECORDER.call_once(|| std::env::set_var("TORCH_FR_BUFFER_SIZE", "0"));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        listener.local_addr().expect("local address").port()
    }

    /// Rank `rank` of `world` meeting on 127.0.0.1:`port`.
    pub(crate) fn rendezvous(port: u16, rank: usize, world: usize, timeout_s: u64) -> Rendezvous {
        Rendezvous {
            host: "127.0.0.1".into(),
            port,
            rank,
            world,
            timeout: std::time::Duration::from_secs(timeout_s),
            cuda_device: None,
        }
    }
}

#[cfg(test)]
#[path = "collective_tests.rs"]
mod tests;
