//! process_vm_readv / process_vm_writev with partial transfers finished and
//! errno turned into errors that say what to do.

use uct_core::UctError;

use crate::host;

/// Direction of a transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Local pieces to the remote range.
    Write,
    /// The remote range to local pieces.
    Read,
}

fn errno_error(pid: u32, e: std::io::Error) -> UctError {
    match e.raw_os_error() {
        Some(libc::ESRCH) => host::peer_gone("cma", pid),
        Some(libc::EPERM) => UctError::EndpointFailed(format!(
            "cma: not permitted to access the memory of process {pid} (ptrace rules: different user, or /proc/sys/kernel/yama/ptrace_scope > 0); use posix instead"
        )),
        Some(libc::EFAULT) => UctError::EndpointFailed(format!(
            "cma: the address range is not mapped in process {pid}; the peer freed the memory without deregistering it"
        )),
        _ => UctError::EndpointFailed(format!("cma transfer with process {pid} failed: {e}")),
    }
}

/// Moves the local pieces (pointer, length) to or from `remote_addr` in
/// process `pid`, finishing partial transfers.
pub fn transfer(
    pid: u32,
    local: &[(*mut u8, usize)],
    remote_addr: u64,
    dir: Dir,
) -> Result<(), UctError> {
    let total: usize = local.iter().map(|(_, l)| l).sum();
    let mut done = 0usize;
    while done < total {
        // Local iovecs from `done` on.
        let mut skip = done;
        let mut liov: Vec<libc::iovec> = Vec::with_capacity(local.len());
        for &(p, l) in local {
            if skip >= l {
                skip -= l;
                continue;
            }
            liov.push(libc::iovec {
                // SAFETY: skip < l keeps the pointer inside the piece.
                iov_base: unsafe { p.add(skip) } as *mut libc::c_void,
                iov_len: l - skip,
            });
            skip = 0;
        }
        let riov = libc::iovec {
            iov_base: (remote_addr + done as u64) as *mut libc::c_void,
            iov_len: total - done,
        };
        // SAFETY: local iovecs point into buffers the caller keeps alive;
        // the remote iovec names memory in the other process, which the
        // kernel checks.
        let n = unsafe {
            match dir {
                Dir::Write => libc::process_vm_writev(
                    pid as libc::pid_t,
                    liov.as_ptr(),
                    liov.len() as _,
                    &riov,
                    1,
                    0,
                ),
                Dir::Read => libc::process_vm_readv(
                    pid as libc::pid_t,
                    liov.as_ptr(),
                    liov.len() as _,
                    &riov,
                    1,
                    0,
                ),
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(errno_error(pid, e));
        }
        if n == 0 {
            return Err(UctError::EndpointFailed(format!(
                "cma transfer with process {pid} made no progress"
            )));
        }
        done += n as usize;
    }
    Ok(())
}
