//! What a slot's sequence number says besides "position + 1 published":
//! free for a position, or being written by a process.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::SLOTS;

// Marks tell themselves from positions by their remainder modulo SLOTS,
// which needs SLOTS to divide 2^64 and to fit the mark's low byte.
const _: () = assert!(SLOTS.is_power_of_two() && SLOTS <= 256);

/// The sequence number of a slot free for position `pos`: the position a
/// lap before it, published (and consumed or skipped).
pub(super) fn free_for(pos: u64) -> u64 {
    pos.wrapping_sub(SLOTS).wrapping_add(1)
}

/// The sequence number of the slot of position `pos` while process `pid`
/// writes it: its remainder modulo [`SLOTS`] is one more than that of every
/// position + 1 this slot holds, so it is never taken for one.
pub(super) fn writing(pid: u32, pos: u64) -> u64 {
    (u64::from(pid) << 8) | (pos.wrapping_add(2) % SLOTS)
}

/// The process whose [`writing`] mark for position `pos` `seq` is, if it is
/// one.
pub(super) fn writer(seq: u64, pos: u64) -> Option<u32> {
    let pid = seq >> 8;
    (seq % SLOTS == pos.wrapping_add(2) % SLOTS && pid != 0 && pid <= u64::from(u32::MAX))
        .then_some(pid as u32)
}

/// Whether process `pid` has exited (a zombie included): its pidfd is
/// readable, or there is no such process.
pub(super) fn exited(pid: u32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return !crate::host::pid_alive(pid);
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, timeout 0: poll only reads and writes it.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}
