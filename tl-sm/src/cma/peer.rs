//! Whether a process is gone, through a pidfd, which, unlike a pid, cannot
//! name another process once its own exits. cma asks it twice: an endpoint
//! right before each process_vm_* call on its peer's pid (uncached, so that
//! the pid is never a recycled one's), and a deregistration of a process
//! that holds a busy count (see [`records`](super::records)).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use uct_core::UctError;

use crate::host;

/// How long [`PeerProcess::check`] answers from its last probe.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);

/// `pidfd_open(pid)`: `Ok(Err(why))` when no pidfd could be had (the
/// kernel has none before Linux 5.3, `pid` is not a process's leader, or
/// the open failed: EMFILE, ENOMEM); `Err` with ESRCH when no process has
/// that pid.
fn pidfd_open(pid: u32) -> std::io::Result<Result<OwnedFd, std::io::Error>> {
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

/// The warning for an endpoint to `pid` left without a pidfd by `why`;
/// none for ENOSYS (a kernel without pidfds: the documented fallback).
fn downgrade_warning(pid: u32, why: &std::io::Error) -> Option<String> {
    let errno = why.raw_os_error()?;
    if errno == libc::ENOSYS {
        return None;
    }
    Some(format!(
        "cma: pidfd_open of peer process {pid} failed (errno {errno}: {why}); the endpoint watches that pid with kill(pid, 0) for good, which cannot tell the peer from a later process given its pid after it dies; raise the open-file limit (ulimit -n) if it is EMFILE, and recreate the endpoint"
    ))
}

/// Whether the process of `pidfd` has exited (its pidfd is readable then;
/// a zombie has exited: its memory is gone, no transfer of its runs).
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
pub(crate) fn is_gone(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return true;
    }
    match pidfd_open(pid) {
        Err(_) => true,
        Ok(Ok(fd)) => exited(&fd),
        Ok(Err(_)) => !host::pid_alive(pid),
    }
}

/// An endpoint's peer process, held by a pidfd opened when the endpoint
/// was made. Without a pidfd (Linux before 5.3, or pidfd_open failed: that
/// is logged as a warning) it asks signal 0 on the pid, which cannot tell a
/// recycled pid.
#[derive(Debug)]
pub(crate) struct PeerProcess {
    pid: u32,
    pidfd: Option<OwnedFd>,
    gone: bool,
    last_probe: Instant,
}

impl PeerProcess {
    pub(crate) fn new(pid: u32) -> Self {
        let (pidfd, gone) = match pidfd_open(pid) {
            Ok(Ok(fd)) => (Some(fd), false),
            Ok(Err(why)) => {
                if let Some(warning) = downgrade_warning(pid, &why) {
                    log::warn!("{warning}");
                }
                (None, !host::pid_alive(pid))
            }
            Err(_) => (None, true),
        };
        PeerProcess {
            pid,
            pidfd,
            gone,
            last_probe: Instant::now(),
        }
    }

    /// Asks the kernel now, whenever the last probe was; an exit is
    /// remembered for good.
    fn probe(&mut self) -> bool {
        if !self.gone {
            self.last_probe = Instant::now();
            self.gone = match &self.pidfd {
                Some(fd) => exited(fd),
                None => !host::pid_alive(self.pid),
            };
        }
        self.gone
    }

    /// `Err` naming the peer once its process is gone, asking the kernel
    /// now: right before a process_vm_* call on its pid, which must not be
    /// another process's by then.
    pub(crate) fn check_now(&mut self) -> Result<(), UctError> {
        match self.probe() {
            true => Err(host::peer_gone("cma", self.pid)),
            false => Ok(()),
        }
    }

    /// As [`check_now`](Self::check_now), answered from the last probe when
    /// it is under 2 ms old, for loops that ask every turn.
    pub(crate) fn check(&mut self) -> Result<(), UctError> {
        if !self.gone && self.last_probe.elapsed() < PROBE_INTERVAL {
            return Ok(());
        }
        self.check_now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review 2 of issue 12: a pidfd_open failure other than ESRCH leaves
    /// the endpoint on kill(pid, 0) for good, which is worth a warning that
    /// names the pid and the errno; a kernel without pidfds is not.
    #[test]
    fn a_failed_pidfd_open_is_warned_of_with_the_pid_and_errno() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let warning = downgrade_warning(4242, &emfile).expect("a warning for EMFILE");
        assert!(warning.contains("4242"), "{warning}");
        assert!(
            warning.contains(&format!("errno {}", libc::EMFILE)),
            "{warning}"
        );
        assert!(warning.contains("ulimit -n"), "{warning}");
        let enosys = std::io::Error::from_raw_os_error(libc::ENOSYS);
        assert_eq!(downgrade_warning(4242, &enosys), None);
    }
}
