//! What a slot's sequence number says besides "position + 1 published":
//! free for a position, or being written by a process.

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
