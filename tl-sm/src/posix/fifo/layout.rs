//! Where things are in a ring, for tools that must speak its layout (the
//! adversary suite's hostile peers): byte offsets from the start of the
//! segment's data area.

use super::{RingHeader, Slot, HEADER_BYTES};

/// The ring's magic, at offset 0.
pub const MAGIC: u64 = super::MAGIC;
/// The owner's pid (u64).
pub const OWNER_PID: usize = std::mem::offset_of!(RingHeader, owner_pid);
/// The next position a producer claims (u64).
pub const HEAD: usize = std::mem::offset_of!(RingHeader, head);
/// The next position the consumer reads, as it publishes it (u64).
pub const TAIL: usize = std::mem::offset_of!(RingHeader, tail);
/// Bytes from one slot to the next.
pub const SLOT_STRIDE: usize = std::mem::size_of::<Slot>();
/// Offset of slot `index`'s sequence number (u64: position + 1 once
/// published, [`free_for`] before a producer marks it, [`writing`]
/// while it writes).
pub const fn slot_seq(index: usize) -> usize {
    HEADER_BYTES + index * SLOT_STRIDE + std::mem::offset_of!(Slot, seq)
}
/// The sequence number of a slot free for position `pos`.
pub fn free_for(pos: u64) -> u64 {
    super::free_for(pos)
}
/// The sequence number of the slot of position `pos` while process
/// `pid` writes it.
pub fn writing(pid: u32, pos: u64) -> u64 {
    super::writing(pid, pos)
}
/// Offset of slot `index`'s message length (u64).
pub const fn slot_len(index: usize) -> usize {
    HEADER_BYTES + index * SLOT_STRIDE + std::mem::offset_of!(Slot, len)
}
/// Offset of slot `index`'s AM id (u64).
pub const fn slot_id(index: usize) -> usize {
    HEADER_BYTES + index * SLOT_STRIDE + std::mem::offset_of!(Slot, id)
}
/// Offset of slot `index`'s data.
pub const fn slot_data(index: usize) -> usize {
    HEADER_BYTES + index * SLOT_STRIDE + std::mem::offset_of!(Slot, data)
}
