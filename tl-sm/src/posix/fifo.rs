//! The receive ring of a posix iface: a shared-memory segment with a fixed
//! number of slots, many producers (peer endpoints) and one consumer (the
//! iface). Producers claim a slot with one compare-and-swap on `head`,
//! fill it, and publish it by storing its sequence number; the consumer
//! reads slots in order and advances `tail`. No locks on either side.

use std::cell::Cell;
use std::ptr::addr_of_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use uct_core::UctError;

use crate::segment::Mapping;

/// Slots in a ring.
pub const SLOTS: u64 = 256;
/// Bytes of data one slot holds: the largest active message.
pub const SLOT_DATA: usize = 8192;
const MAGIC: u64 = u64::from_le_bytes(*b"UCTFIFO1");

/// `head` and `tail` live on cache lines of their own: producers write one,
/// the consumer the other, and neither drags the other's line around.
#[repr(C)]
struct RingHeader {
    magic: AtomicU64,
    owner_pid: AtomicU64,
    _pad0: [u64; 14],
    /// Next position a producer claims.
    head: AtomicU64,
    _pad1: [u64; 15],
    /// Next position the consumer reads.
    tail: AtomicU64,
    _pad2: [u64; 15],
}

#[repr(C)]
struct Slot {
    /// Position + 1 once the slot holds the message of that position.
    seq: AtomicU64,
    len: AtomicU64,
    id: AtomicU64,
    _pad: [u64; 5],
    data: [u8; SLOT_DATA],
}

const HEADER_BYTES: usize = 384;
// The slots start right after the header, 8-byte aligned like the header.
const _: () = assert!(std::mem::size_of::<RingHeader>() == HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<Slot>().is_multiple_of(std::mem::align_of::<Slot>()));
const _: () = assert!(HEADER_BYTES.is_multiple_of(std::mem::align_of::<Slot>()));

/// Bytes of data a ring needs.
pub fn ring_bytes() -> usize {
    HEADER_BYTES + SLOTS as usize * std::mem::size_of::<Slot>()
}

/// A ring in a mapped segment's data area, which holds at least
/// [`ring_bytes`] bytes (checked when the ring is made).
pub struct Ring {
    map: Mapping,
    /// Producer side: the last tail seen; the shared one is read again only
    /// when the ring looks full.
    seen_tail: Cell<u64>,
}

/// What a push did.
pub enum Push {
    /// The message is in the ring.
    Done,
    /// Every slot is taken; try again after the consumer drained some.
    Full,
}

/// The error for a mapping too small to hold a ring.
fn not_a_ring() -> UctError {
    UctError::Unreachable("the posix peer address does not name a receive ring".into())
}

impl Ring {
    /// Initialises a fresh ring in `map` (the owner's side).
    pub fn init(map: Mapping) -> Result<Ring, UctError> {
        if map.data_len() < ring_bytes() {
            return Err(UctError::InvalidParam(format!(
                "posix: a receive ring needs {} bytes, the segment has {}",
                ring_bytes(),
                map.data_len()
            )));
        }
        let ring = Ring {
            map,
            seen_tail: Cell::new(0),
        };
        let header = ring.header();
        header
            .owner_pid
            .store(std::process::id() as u64, Ordering::Relaxed);
        header.head.store(0, Ordering::Relaxed);
        header.tail.store(0, Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// Wraps a peer's mapped ring, checking it is one.
    pub fn attach(map: Mapping) -> Result<Ring, UctError> {
        if map.data_len() < ring_bytes() {
            return Err(not_a_ring());
        }
        let ring = Ring {
            map,
            seen_tail: Cell::new(0),
        };
        if ring.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(not_a_ring());
        }
        Ok(ring)
    }

    /// The segment the ring lives in.
    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: the data area holds at least ring_bytes() bytes (checked
        // by init and attach), starting with the header; it is page-aligned,
        // which satisfies RingHeader's alignment; the fields other processes
        // write are atomics; the mapping lives as long as self.
        unsafe { &*(self.map.data_ptr() as *const RingHeader) }
    }

    /// The slot of position `pos`, as a raw pointer: producers and the
    /// consumer hand slots to each other through `seq`, so no Rust
    /// reference to a whole slot is ever made.
    fn slot(&self, pos: u64) -> *mut Slot {
        let index = (pos % SLOTS) as usize;
        // SAFETY: index < SLOTS, so HEADER_BYTES + (index + 1) * size_of
        // Slot <= ring_bytes() <= the data area's length: the slot lies
        // inside the mapping (and is aligned, asserted above).
        unsafe {
            self.map
                .data_ptr()
                .add(HEADER_BYTES + index * std::mem::size_of::<Slot>()) as *mut Slot
        }
    }

    /// The process that owns (and drains) the ring.
    pub fn owner_pid(&self) -> u32 {
        self.header().owner_pid.load(Ordering::Relaxed) as u32
    }

    /// Producer: copies `parts` (concatenated) into a slot as active
    /// message `id`. More than [`SLOT_DATA`] bytes in all is an error.
    pub fn push(&self, id: u8, parts: &[&[u8]]) -> Result<Push, UctError> {
        let total: usize = parts.iter().map(|part| part.len()).sum();
        if total > SLOT_DATA {
            return Err(UctError::InvalidParam(format!(
                "posix: an active message of {total} bytes does not fit a ring slot ({SLOT_DATA} bytes)"
            )));
        }
        let header = self.header();
        let pos = loop {
            let head = header.head.load(Ordering::Acquire);
            if head.wrapping_sub(self.seen_tail.get()) >= SLOTS {
                let tail = header.tail.load(Ordering::Acquire);
                self.seen_tail.set(tail);
                if head.wrapping_sub(tail) >= SLOTS {
                    return Ok(Push::Full);
                }
            }
            if header
                .head
                .compare_exchange_weak(
                    head,
                    head.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                break head;
            }
        };
        let slot = self.slot(pos);
        // SAFETY: `slot` points at a slot inside the mapping (see `slot`);
        // addr_of_mut makes no reference to it.
        let data = unsafe { addr_of_mut!((*slot).data) } as *mut u8;
        let mut at = 0usize;
        for part in parts {
            // SAFETY: this producer claimed position `pos` with the CAS
            // above, so it alone writes the slot until it publishes `seq`;
            // at + part.len() <= total <= SLOT_DATA keeps the copy inside
            // the slot's data; `part` is a caller's slice, not in the ring.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), data.add(at), part.len()) };
            at += part.len();
        }
        // SAFETY: `slot` is inside the mapping and aligned; its fields are
        // atomics, so shared references to them are sound even while the
        // consumer reads them.
        let (len, msg_id, seq) = unsafe { (&(*slot).len, &(*slot).id, &(*slot).seq) };
        len.store(at as u64, Ordering::Relaxed);
        msg_id.store(id as u64, Ordering::Relaxed);
        // Positions come from shared memory: wrap, never overflow.
        seq.store(pos.wrapping_add(1), Ordering::Release);
        Ok(Push::Done)
    }

    /// Consumer: hands each published message to `f`, in order; returns how
    /// many. The slot is released after `f` returns, so `f` reads it in place.
    ///
    /// The empty ring is the common case of a progress loop: it costs two
    /// loads here, inlined into the caller; only a published message takes
    /// the call into the delivery loop.
    #[inline]
    pub fn drain(&self, f: impl FnMut(u8, &[u8])) -> usize {
        if self.has_message() {
            self.deliver(f)
        } else {
            0
        }
    }

    /// Whether the slot at the tail is published.
    #[inline]
    fn has_message(&self) -> bool {
        let pos = self.header().tail.load(Ordering::Relaxed);
        let slot = self.slot(pos);
        // SAFETY: `slot` is inside the mapping and aligned; seq is an atomic.
        unsafe { &(*slot).seq }.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    #[inline(never)]
    fn deliver(&self, mut f: impl FnMut(u8, &[u8])) -> usize {
        let header = self.header();
        let mut drained = 0;
        loop {
            let pos = header.tail.load(Ordering::Relaxed);
            let slot = self.slot(pos);
            // SAFETY: `slot` is inside the mapping and aligned; seq is an
            // atomic.
            if unsafe { &(*slot).seq }.load(Ordering::Acquire) != pos.wrapping_add(1) {
                return drained;
            }
            // SAFETY: the slice lies inside our own mapping of the ring: the
            // slot is (see `slot`), and len, which a peer wrote, is clamped
            // to SLOT_DATA. The producer published the slot (the Acquire
            // load of seq pairs with its Release store) and an honest one
            // does not claim it again until tail moves past it, after `f`
            // returns. A hostile process that maps the ring and rewrites the
            // slot meanwhile can change the bytes `f` sees, never make it
            // read outside the mapping; a copy-out that also removes that
            // race is part of the hostile-peer work (docs/design.md).
            let (id, data) = unsafe {
                let len = ((*slot).len.load(Ordering::Relaxed) as usize).min(SLOT_DATA);
                let id = (*slot).id.load(Ordering::Relaxed) as u8;
                let data = addr_of_mut!((*slot).data) as *const u8;
                (id, std::slice::from_raw_parts(data, len))
            };
            f(id, data);
            header.tail.store(pos.wrapping_add(1), Ordering::Release);
            drained += 1;
        }
    }
}

#[cfg(test)]
mod tests;
