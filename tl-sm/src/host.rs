//! Facts about this host and its processes that both sm transports need.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use uct_core::{DeviceType, TlResource, UctError};

/// Identifies this boot of this machine; peers with another id are on
/// another host (or another boot) and cannot be reached through memory.
pub fn boot_id() -> &'static [u8] {
    static ID: OnceLock<Vec<u8>> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().as_bytes().to_vec())
            .unwrap_or_else(|_| b"unknown-boot".to_vec())
    })
}

/// Whether process `pid` still exists.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; nothing is sent, and no memory of this process is touched.
    let status = unsafe { libc::kill(pid as libc::pid_t, 0) };
    status == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// How often a [`PeerWatch`] asks the kernel; between probes it answers
/// from its last result, so that waiting loops may call it every turn.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);

/// Watches a peer process for exit through a pidfd, which, unlike a pid,
/// cannot be recycled for another process. Without pidfd support (Linux
/// before 5.3) it falls back to signal 0 on the pid.
#[derive(Debug)]
pub struct PeerWatch {
    pid: u32,
    pidfd: Option<OwnedFd>,
    last_probe: Instant,
    gone: bool,
}

impl PeerWatch {
    /// Starts watching process `pid`; a process already gone is reported by
    /// the first [`check`](Self::check).
    pub fn new(pid: u32) -> Self {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or
        // -1; no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = (fd >= 0).then(|| {
            // SAFETY: the syscall returned a fresh fd that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd as i32) }
        });
        let gone = pidfd.is_none() && !pid_alive(pid);
        PeerWatch {
            pid,
            pidfd,
            last_probe: Instant::now(),
            gone,
        }
    }

    /// The watched pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited; asks the kernel at most every 2 ms,
    /// and remembers an exit for good.
    pub fn is_gone(&mut self) -> bool {
        if self.gone || self.last_probe.elapsed() < PROBE_INTERVAL {
            return self.gone;
        }
        self.last_probe = Instant::now();
        self.gone = match &self.pidfd {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, timeout 0: poll only reads and
                // writes that struct.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                // A pidfd turns readable when its process exits.
                n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            }
            None => !pid_alive(self.pid),
        };
        self.gone
    }

    /// `Err` naming the peer once its process is gone.
    pub fn check(&mut self, transport: &str) -> Result<(), UctError> {
        if self.is_gone() {
            Err(peer_gone(transport, self.pid))
        } else {
            Ok(())
        }
    }
}

/// An endpoint error for a peer process that is gone.
pub fn peer_gone(transport: &str, pid: u32) -> UctError {
    UctError::EndpointFailed(format!("{transport} peer process {pid} is gone"))
}

/// A random 64-bit value for secrets and names.
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // No entropy source: fall back to time and address bits, still
        // per-run, never a constant.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return nanos ^ (&bytes as *const _ as u64).rotate_left(29);
    }
    u64::from_ne_bytes(bytes)
}

/// Splits a device address into boot id and pid, as built by
/// [`device_address`].
pub fn parse_device_address(addr: &[u8]) -> Option<(&[u8], u32)> {
    if addr.len() < 4 {
        return None;
    }
    let (boot, pid) = addr.split_at(addr.len() - 4);
    Some((boot, u32::from_le_bytes(pid.try_into().ok()?)))
}

/// This process's device address: boot id, then pid.
pub fn device_address() -> Vec<u8> {
    let mut addr = boot_id().to_vec();
    addr.extend_from_slice(&std::process::id().to_le_bytes());
    addr
}

/// The one device of an sm transport: this host's memory.
pub fn memory_resource(transport: &str) -> TlResource {
    TlResource {
        transport: transport.into(),
        device: "memory".into(),
        device_type: DeviceType::SharedMemory,
        system_device: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_watch_sees_a_child_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let mut watch = PeerWatch::new(child.id());
        std::thread::sleep(PROBE_INTERVAL * 2);
        assert!(!watch.is_gone(), "a running child is not gone");
        child.kill().expect("kill");
        child.wait().expect("reap");
        std::thread::sleep(PROBE_INTERVAL * 2);
        assert!(watch.is_gone(), "the watch must see the exit");
        let e = watch.check("posix").unwrap_err().to_string();
        assert!(e.contains(&child.id().to_string()), "{e}");
    }

    #[test]
    fn peer_watch_of_a_missing_pid_is_gone() {
        // Pids above pid_max never exist.
        let mut watch = PeerWatch::new(i32::MAX as u32);
        std::thread::sleep(PROBE_INTERVAL * 2);
        assert!(watch.is_gone());
    }
}
