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

/// How often a [`PeerWatch`] asks the kernel in [`PeerWatch::check`];
/// between probes it answers from its last result, so that waiting loops
/// may call it every turn.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);

/// `pidfd_open(pid)`: `Ok(Err(why))` when no pidfd could be had (the
/// kernel has none before Linux 5.3, `pid` is not a process's leader, or
/// the open failed: EMFILE, ENOMEM); `Err` with ESRCH when no process has
/// that pid.
fn pidfd_open(pid: u32) -> std::io::Result<std::io::Result<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd >= 0 {
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        return Ok(Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ESRCH) => Err(e),
        _ => Ok(Err(e)),
    }
}

/// Whether the process of `pidfd` has exited (its pidfd is readable then;
/// a zombie has exited: its memory is gone).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, timeout 0: poll only reads and writes that
    // struct.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Whether process `pid` is gone for sure: no process has the pid, or the
/// one that has it has exited. `false` may be a recycled pid's process.
pub(crate) fn process_gone(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return true;
    }
    match pidfd_open(pid) {
        Err(_) => true,
        Ok(Ok(fd)) => exited(&fd),
        Ok(Err(_)) => !pid_alive(pid),
    }
}

/// The warning for an endpoint to `pid` left without a pidfd by `why`;
/// none for ENOSYS (a kernel without pidfds: the documented fallback).
fn downgrade_warning(transport: &str, pid: u32, why: &std::io::Error) -> Option<String> {
    let errno = why.raw_os_error()?;
    if errno == libc::ENOSYS {
        return None;
    }
    Some(format!(
        "{transport}: pidfd_open of peer process {pid} failed (errno {errno}: {why}); the endpoint watches that pid with kill(pid, 0) for good, which cannot tell the peer from a later process given its pid after it dies; raise the open-file limit (ulimit -n) if it is EMFILE, and recreate the endpoint"
    ))
}

/// An endpoint's peer process, held by a pidfd opened when the endpoint
/// was made, which, unlike a pid, cannot name another process once its own
/// exits. Without a pidfd (Linux before 5.3, or pidfd_open failed: that is
/// logged as a warning) it asks signal 0 on the pid, which cannot tell a
/// recycled pid.
#[derive(Debug)]
pub struct PeerWatch {
    transport: &'static str,
    pid: u32,
    pidfd: Option<OwnedFd>,
    last_probe: Instant,
    gone: bool,
}

impl PeerWatch {
    /// Starts watching process `pid`, the peer of a `transport` endpoint; a
    /// process already gone is reported by the first check.
    pub fn new(transport: &'static str, pid: u32) -> Self {
        let (pidfd, gone) = match pidfd_open(pid) {
            Ok(Ok(fd)) => (Some(fd), false),
            Ok(Err(why)) => {
                if let Some(warning) = downgrade_warning(transport, pid, &why) {
                    log::warn!("{warning}");
                }
                (None, !pid_alive(pid))
            }
            Err(_) => (None, true),
        };
        PeerWatch {
            transport,
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

    /// Asks the kernel now, whenever the last probe was; an exit is
    /// remembered for good.
    fn probe(&mut self) -> bool {
        if !self.gone {
            self.last_probe = Instant::now();
        }
        self.ask_kernel()
    }

    /// Whether the process has exited, asked now, without reading the
    /// clock: [`check_now`](Self::check_now) runs before every
    /// process_vm_* call, where a clock read cost 2.5% of an 8 B cma put.
    #[inline]
    fn ask_kernel(&mut self) -> bool {
        if !self.gone {
            self.gone = match &self.pidfd {
                Some(fd) => exited(fd),
                None => !pid_alive(self.pid),
            };
        }
        self.gone
    }

    /// Whether the process has exited; asks the kernel at most every 2 ms,
    /// and remembers an exit for good.
    pub fn is_gone(&mut self) -> bool {
        if self.gone || self.last_probe.elapsed() < PROBE_INTERVAL {
            return self.gone;
        }
        self.probe()
    }

    /// `Err` naming the peer once its process is gone, answered from the
    /// last probe when it is under 2 ms old, for loops that ask every turn.
    pub fn check(&mut self) -> Result<(), UctError> {
        match self.is_gone() {
            true => Err(peer_gone(self.transport, self.pid)),
            false => Ok(()),
        }
    }

    /// As [`check`](Self::check), asking the kernel now: right before a
    /// call on the peer's pid (process_vm_*), which must not be another
    /// process's by then.
    pub fn check_now(&mut self) -> Result<(), UctError> {
        match self.ask_kernel() {
            true => Err(peer_gone(self.transport, self.pid)),
            false => Ok(()),
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
        let mut watch = PeerWatch::new("posix", child.id());
        std::thread::sleep(PROBE_INTERVAL * 2);
        assert!(!watch.is_gone(), "a running child is not gone");
        child.kill().expect("kill");
        child.wait().expect("reap");
        std::thread::sleep(PROBE_INTERVAL * 2);
        assert!(watch.is_gone(), "the watch must see the exit");
        let e = watch.check().unwrap_err().to_string();
        assert!(e.contains(&child.id().to_string()), "{e}");
    }

    #[test]
    fn peer_watch_of_a_missing_pid_is_gone() {
        // Pids above pid_max never exist.
        let mut watch = PeerWatch::new("posix", i32::MAX as u32);
        std::thread::sleep(PROBE_INTERVAL * 2);
        assert!(watch.is_gone());
    }

    /// Review 2 of issue 12: a pidfd_open failure other than ESRCH leaves
    /// the endpoint on kill(pid, 0) for good, which is worth a warning that
    /// names the pid and the errno; a kernel without pidfds is not.
    #[test]
    fn a_failed_pidfd_open_is_warned_of_with_the_pid_and_errno() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let warning = downgrade_warning("cma", 4242, &emfile).expect("a warning for EMFILE");
        assert!(warning.contains("4242"), "{warning}");
        assert!(
            warning.contains(&format!("errno {}", libc::EMFILE)),
            "{warning}"
        );
        assert!(warning.contains("ulimit -n"), "{warning}");
        let enosys = std::io::Error::from_raw_os_error(libc::ENOSYS);
        assert_eq!(downgrade_warning("cma", 4242, &enosys), None);
    }
}
