//! process_vm_readv / process_vm_writev with partial transfers finished and
//! errno turned into errors that say what to do.

use uct_core::UctError;

use crate::host;

/// Direction of a transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
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
/// process `pid`, finishing partial transfers. `before_each` runs right
/// before every process_vm_* call, the first and each one after a partial
/// result (which a peer dying mid-call produces); its error ends the
/// transfer there.
///
/// # Safety
/// Every piece must be valid for the whole call: readable for `len` bytes
/// when writing to the peer, writable (and borrowed by nothing else) when
/// reading from it.
pub unsafe fn transfer(
    pid: u32,
    local: &[(*mut u8, usize)],
    remote_addr: u64,
    direction: Direction,
    mut before_each: impl FnMut() -> Result<(), UctError>,
) -> Result<(), UctError> {
    let total: usize = local.iter().map(|(_, len)| len).sum();
    let mut done = 0usize;
    while done < total {
        // Local iovecs from `done` on.
        let mut skip = done;
        let mut local_iov: Vec<libc::iovec> = Vec::with_capacity(local.len());
        for &(ptr, len) in local {
            if skip >= len {
                skip -= len;
                continue;
            }
            local_iov.push(libc::iovec {
                // SAFETY: the piece is `len` valid bytes at `ptr` (the
                // caller's contract) and skip < len, so the result stays
                // inside it.
                iov_base: unsafe { ptr.add(skip) } as *mut libc::c_void,
                iov_len: len - skip,
            });
            skip = 0;
        }
        let remote_iov = libc::iovec {
            iov_base: (remote_addr + done as u64) as *mut libc::c_void,
            iov_len: total - done,
        };
        before_each()?;
        count_transfer();
        // SAFETY: the local iovecs lie inside the caller's pieces, valid
        // for this direction for the whole call (the caller's contract);
        // `local_iov` and `remote_iov` outlive the call; the remote iovec
        // names memory in the other process, which the kernel checks.
        let moved = unsafe {
            match direction {
                Direction::Write => libc::process_vm_writev(
                    pid as libc::pid_t,
                    local_iov.as_ptr(),
                    local_iov.len() as _,
                    &remote_iov,
                    1,
                    0,
                ),
                Direction::Read => libc::process_vm_readv(
                    pid as libc::pid_t,
                    local_iov.as_ptr(),
                    local_iov.len() as _,
                    &remote_iov,
                    1,
                    0,
                ),
            }
        };
        if moved < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(errno_error(pid, e));
        }
        if moved == 0 {
            return Err(UctError::EndpointFailed(format!(
                "cma transfer with process {pid} made no progress"
            )));
        }
        done += moved as usize;
        if done < total {
            after_partial_transfer();
        }
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// process_vm_* calls this thread made, for tests.
    pub(crate) static TRANSFERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Test seam: counts the process_vm_* calls of this thread.
#[cfg(test)]
fn count_transfer() {
    TRANSFERS.with(|n| n.set(n.get() + 1));
}

#[cfg(not(test))]
#[inline(always)]
fn count_transfer() {}

#[cfg(test)]
thread_local! {
    /// The hook [`after_partial_transfer`] runs once, on this thread.
    pub(crate) static AFTER_PARTIAL: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Test seam: runs the hook a test set after a process_vm_* call moved
/// part of the transfer, where a peer dying mid-transfer is seen.
#[cfg(test)]
fn after_partial_transfer() {
    if let Some(hook) = AFTER_PARTIAL.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

#[cfg(not(test))]
#[inline(always)]
fn after_partial_transfer() {}
