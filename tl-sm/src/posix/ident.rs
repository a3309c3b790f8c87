//! The identity page of a posix iface: a small segment beside the receive
//! ring, sealed so that peers may only read it, that says who owns the ring
//! (pid, secret), whether the iface is still open, and which object the
//! ring is. Every sender maps the ring read-write, so any of them could
//! rewrite what the ring's own header says; a sender judges the receiver
//! from this page alone, which only the receiver writes.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use uct_core::{Access, Result, UctError};

use super::RingAddress;
use crate::segment::{file_id, Mapping, Peers};

/// Byte offsets in the page's data area (u64s): the ring's device and inode
/// numbers ([`file_id`]).
pub mod layout {
    /// The ring segment's device number.
    pub const RING_DEV: usize = 0;
    /// The ring segment's inode number.
    pub const RING_INO: usize = 8;
    /// Bytes of data the page holds.
    pub const LEN: usize = 16;
}

/// The u64 at byte `offset` of `map`'s data area.
fn word(map: &Mapping, offset: usize) -> &AtomicU64 {
    assert!(offset + 8 <= layout::LEN && offset.is_multiple_of(8));
    // SAFETY: every identity page is checked to hold layout::LEN bytes of
    // data (create makes them, `open` checks), and offset + 8 <= LEN; the
    // data area is page-aligned, so the word is 8-aligned; the mapping
    // lives as long as the borrow of `map`; the owner writes it while peers
    // read, hence an atomic. A read-only mapping is only loaded from.
    unsafe { AtomicU64::from_ptr(map.data_ptr().add(offset) as *mut u64) }
}

/// Creates the identity page of the ring behind `ring` (the owner's side):
/// its mapping, to mark it closed, and the descriptor peers open.
pub(crate) fn create(secret: u64, ring: BorrowedFd<'_>) -> Result<(Mapping, OwnedFd)> {
    let (dev, ino) = file_id(ring).map_err(|e| UctError::io("posix: stat the ring segment", e))?;
    let (map, fd) = Mapping::create(
        "uct-posix-iface",
        layout::LEN,
        (secret, 0),
        Access::empty(),
        Peers::ReadOnly,
    )?;
    word(&map, layout::RING_DEV).store(dev, Ordering::Relaxed);
    word(&map, layout::RING_INO).store(ino, Ordering::Release);
    Ok((map, fd))
}

/// A peer's read-only mapping of the identity page of process `pid`'s
/// iface at `addr`, checked: its secret, its owner, open. Returns it and
/// the ring object it names.
pub(crate) fn open(pid: u32, addr: RingAddress) -> Result<(Mapping, (u64, u64))> {
    let unreachable =
        |why: String| UctError::Unreachable(format!("process {pid}'s posix iface: {why}"));
    let map = Mapping::open(pid, addr.id_fd, 0, Peers::ReadOnly).map_err(|e| match e {
        // Gone, or the descriptor now names another segment (ours or a
        // file made to look like one): either way no open iface.
        UctError::NoSuchRegion { .. } => unreachable(
            "its identity descriptor names no open iface (closed, or reused for another segment)"
                .into(),
        ),
        UctError::BadRkey(why) => unreachable(why),
        other => other,
    })?;
    if map.data_len() < layout::LEN {
        return Err(unreachable(format!(
            "its identity page holds {} bytes, not {}",
            map.data_len(),
            layout::LEN
        )));
    }
    if !map.view(0, addr.secret).is_valid() || map.is_dead() {
        return Err(UctError::Unreachable(format!(
            "the posix iface address names no open iface of process {pid} (a closed iface whose descriptor was reused?)"
        )));
    }
    if map.owner_pid() != pid as u64 {
        return Err(unreachable(format!(
            "its identity page belongs to process {}",
            map.owner_pid()
        )));
    }
    let ring = (
        word(&map, layout::RING_DEV).load(Ordering::Acquire),
        word(&map, layout::RING_INO).load(Ordering::Acquire),
    );
    Ok((map, ring))
}
