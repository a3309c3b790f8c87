//! The receive ring of a posix iface: a shared-memory segment with a fixed
//! number of slots, many producers (peer endpoints) and one consumer (the
//! iface). Producers claim a slot with one compare-and-swap on `head`,
//! fill it, and publish it by storing its sequence number; the consumer
//! reads slots in order and advances `tail`. No locks on either side.

use std::sync::atomic::{AtomicU64, Ordering};

use uct_core::UctError;

use super::segment::Mapping;

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

/// Bytes of data a ring needs.
pub fn ring_bytes() -> usize {
    HEADER_BYTES + SLOTS as usize * std::mem::size_of::<Slot>()
}

/// A ring in a mapped segment's data area.
pub struct Ring {
    map: Mapping,
    /// Producer side: the last tail seen; the shared one is read again only
    /// when the ring looks full.
    seen_tail: std::cell::Cell<u64>,
}

/// What a push did.
pub enum Push {
    Done,
    Full,
}

impl Ring {
    /// Initialises a fresh ring in `map` (the owner's side).
    pub fn init(map: Mapping) -> Ring {
        let r = Ring {
            map,
            seen_tail: std::cell::Cell::new(0),
        };
        let h = r.header();
        h.owner_pid
            .store(std::process::id() as u64, Ordering::Relaxed);
        h.head.store(0, Ordering::Relaxed);
        h.tail.store(0, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        r
    }

    /// Wraps a peer's mapped ring, checking it is one.
    pub fn attach(map: Mapping) -> Result<Ring, UctError> {
        let r = Ring {
            map,
            seen_tail: std::cell::Cell::new(0),
        };
        if r.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(UctError::Unreachable(
                "the posix peer address does not name a receive ring".into(),
            ));
        }
        Ok(r)
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: the data area holds ring_bytes() bytes starting with the
        // header, page-aligned; all fields are atomics.
        unsafe { &*(self.map.data_ptr() as *const RingHeader) }
    }

    fn slot(&self, pos: u64) -> *mut Slot {
        let i = (pos % SLOTS) as usize;
        // SAFETY: i < SLOTS, so the slot lies inside ring_bytes().
        unsafe {
            self.map
                .data_ptr()
                .add(HEADER_BYTES + i * std::mem::size_of::<Slot>()) as *mut Slot
        }
    }

    pub fn owner_pid(&self) -> u32 {
        self.header().owner_pid.load(Ordering::Relaxed) as u32
    }

    /// Producer: copies `parts` (concatenated, at most SLOT_DATA bytes)
    /// into a slot as active message `id`.
    pub fn push(&self, id: u8, parts: &[&[u8]]) -> Push {
        let h = self.header();
        let pos = loop {
            let head = h.head.load(Ordering::Acquire);
            if head.wrapping_sub(self.seen_tail.get()) >= SLOTS {
                let tail = h.tail.load(Ordering::Acquire);
                self.seen_tail.set(tail);
                if head.wrapping_sub(tail) >= SLOTS {
                    return Push::Full;
                }
            }
            if h.head
                .compare_exchange_weak(head, head + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break head;
            }
        };
        let slot = self.slot(pos);
        let mut at = 0usize;
        for p in parts {
            // SAFETY: this producer owns the claimed slot until it publishes
            // it; callers keep the total within SLOT_DATA.
            unsafe {
                let dst = (*slot).data.as_mut_ptr().add(at);
                std::ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len());
            }
            at += p.len();
        }
        // SAFETY: as above; the fields are atomics in shared memory.
        unsafe {
            (*slot).len.store(at as u64, Ordering::Relaxed);
            (*slot).id.store(id as u64, Ordering::Relaxed);
            (*slot).seq.store(pos + 1, Ordering::Release);
        }
        Push::Done
    }

    /// Consumer: hands each published message to `f`, in order; returns how
    /// many. The slot is released after `f` returns, so `f` reads it in place.
    pub fn drain(&self, mut f: impl FnMut(u8, &[u8])) -> usize {
        let h = self.header();
        let mut n = 0;
        loop {
            let pos = h.tail.load(Ordering::Relaxed);
            let slot = self.slot(pos);
            // SAFETY: slots are inside the ring; seq is atomic.
            if unsafe { (*slot).seq.load(Ordering::Acquire) } != pos + 1 {
                return n;
            }
            // SAFETY: the producer published the slot (Acquire above) and
            // will not touch it until tail moves past it.
            let (id, data) = unsafe {
                let len = ((*slot).len.load(Ordering::Relaxed) as usize).min(SLOT_DATA);
                let id = (*slot).id.load(Ordering::Relaxed) as u8;
                (id, std::slice::from_raw_parts((*slot).data.as_ptr(), len))
            };
            f(id, data);
            h.tail.store(pos + 1, Ordering::Release);
            n += 1;
        }
    }
}
