//! The receive ring of a posix iface: a shared-memory segment with a fixed
//! number of slots, many producers (peer endpoints) and one consumer (the
//! iface). Producers claim a position with one compare-and-swap on `head`,
//! mark its slot as theirs with a second one on the slot's sequence number
//! (from "free for this position" to "being written by process P"), fill
//! it, and publish it by storing "position + 1"; the consumer reads
//! slots in order and advances `tail`. No locks on either side.
//!
//! A slot left unpublished too long is skipped by the consumer only with a
//! compare-and-swap of its own: one that was claimed but never marked (its
//! producer then finds the mark refused and claims another position), or
//! one marked by a process that has exited. A live producer that is only
//! stopped (SIGSTOP, a debugger) is waited for, so it never loses its
//! message nor writes over a later lap's.
//!
//! Every process that maps the ring can write all of it, so nothing read
//! from it is trusted: slot positions are reduced modulo [`SLOTS`] before
//! use, the consumer keeps its own `tail` (the shared one only tells
//! producers how far it got), head and tail are checked against the ring's
//! geometry whenever a producer reads the tail, and a slot whose length or
//! id no producer could have written is dropped, never delivered.

use std::cell::Cell;
#[cfg(test)]
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ptr::addr_of_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use uct_core::UctError;

use crate::segment::Mapping;
use marks::{free_for, writer, writing};

/// Slots in a ring.
pub const SLOTS: u64 = 256;
/// Bytes of data one slot holds: the largest active message.
pub const SLOT_DATA: usize = 8192;
const MAGIC: u64 = u64::from_le_bytes(*b"UCTFIFO2");
/// Most slots one drain consumes: producers that publish as fast as the
/// consumer drains must not hold one progress call for ever.
const DRAIN_BUDGET: u64 = SLOTS;
/// Empty drains between two looks at whether the slot at the tail is
/// claimed but unpublished (a producer that died mid-message).
const STUCK_CHECK_EVERY: u32 = 64;
/// Failed compare-and-swaps on `head` before a push gives up for this call:
/// honest producers let one of them win every round, so only a process
/// that keeps rewriting `head` makes a push fail this often.
const MAX_CLAIM_TRIES: u32 = 1024;

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
    /// Position + 1 once the slot holds the message of that position (and
    /// then "free" for the position a lap later, see [`free_for`]), or
    /// [`writing`] while a producer fills it.
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
    /// The process that owns (and drains) the ring: this one for the
    /// consumer, the one the iface address named for a producer (never what
    /// the shared header says).
    pid: u32,
    /// This process, as its [`writing`] marks name it.
    me: u32,
    /// Producer side: the last tail seen; the shared one is read again only
    /// when the ring looks full.
    seen_tail: Cell<u64>,
    /// Consumer side: the next position to read. The shared copy is only
    /// published for producers: any of them can rewrite it.
    tail: Cell<u64>,
    /// Consumer side: how long a claimed slot may stay unpublished before
    /// it is taken for the message of a producer that died.
    stuck_after: Duration,
    /// Consumer side: empty drains, to look for a stuck slot every
    /// [`STUCK_CHECK_EVERY`].
    idle: Cell<u32>,
    /// Consumer side: the position at our tail found claimed but
    /// unpublished, since when, and the head then.
    stuck: Cell<Option<(u64, Instant, u64)>>,
    /// Consumer side: unpublished slots before this position were claimed
    /// [`stuck_after`](Self::stuck_after) ago or more; they are skipped.
    skip_until: Cell<u64>,
    /// Consumer side: the position whose live producer we last said we
    /// wait for (said once per position).
    waited: Cell<Option<u64>>,
    /// Tests: every claim's compare-and-swap fails, as when another process
    /// keeps rewriting `head`.
    #[cfg(test)]
    fail_claims: Cell<bool>,
    /// Tests: called at each [`Stage`] of a push with the position it
    /// claimed, as if the producer were stopped there (SIGSTOP, preemption).
    #[cfg(test)]
    pause: RefCell<Option<PauseHook>>,
}

/// Tests: what a push calls at each [`Stage`].
#[cfg(test)]
type PauseHook = Box<dyn FnMut(Stage, u64) + Send>;

/// Tests: where a push is in its message.
#[cfg(test)]
#[derive(Clone, Copy, PartialEq, Debug)]
enum Stage {
    /// `head` moved past the position: it is claimed.
    Claimed,
    /// The slot is marked as being written by this process.
    Marked,
}

/// What the consumer did with an unpublished slot it was to skip.
enum GiveUp {
    /// Taken from its producer (never marked, or marked by a process that
    /// exited) or from a corrupt state: passed over.
    Skipped,
    /// Marked by a live process: waited for.
    Wait,
    /// Published meanwhile: delivered.
    Published,
}

/// What a push did.
pub enum Push {
    /// The message is in the ring.
    Done,
    /// Every slot is taken; try again after the consumer drained some.
    Full,
    /// No claim succeeded in 1024 tries: another process
    /// keeps moving `head`; try again later.
    Contended,
}

/// The error for a mapping that holds no ring: too small for one (`Some`
/// of its data bytes), or without the magic.
fn not_a_ring(data_len: Option<usize>) -> UctError {
    UctError::Unreachable(match data_len {
        Some(len) => format!(
            "the posix peer's ring segment holds {len} bytes of data, a ring needs {}; it is no ring of ours",
            ring_bytes()
        ),
        None => "the posix peer address does not name a receive ring (no ring magic)".into(),
    })
}

/// `to - from` when `to` is not behind `from`: positions wrap around u64,
/// and a distance over 2^63 means `to` is behind.
fn ahead(from: u64, to: u64) -> Option<u64> {
    let d = to.wrapping_sub(from);
    (d < 1 << 63).then_some(d)
}

/// The error for head and tail that no honest consumer leaves.
#[cold]
fn corrupt_positions(pid: u32, head: u64, tail: u64) -> UctError {
    UctError::Protocol(format!(
        "posix: the receive ring of process {pid} has head {head} and tail {tail}, which no \
         ring of {SLOTS} slots has; that process corrupted its ring, so the endpoint fails \
         (reconnect to a restarted peer)"
    ))
}

/// Claimed slots that stayed unpublished for `after`: logged once for the
/// lot, and skipped.
#[cold]
#[inline(never)]
fn skip_stuck(pid: u32, from: u64, until: u64, after: Duration) {
    log::error!(
        "posix: ring positions {from}..{until} of process {pid} were claimed by a sender and \
         not published for {after:?}; the sender died or stopped mid-message, so their \
         messages are dropped and the ring moves on"
    );
}

/// The consumer waits for the live producer of position `pos`.
#[cold]
#[inline(never)]
fn wait_for_writer(owner: u32, pos: u64, writer: u32, after: Duration) {
    log::warn!(
        "posix: ring position {pos} of process {owner} has been written by process {writer} \
         for over {after:?} and that process is alive (stopped, or in a debugger?): the ring \
         waits for it, and its other senders find it full meanwhile"
    );
}

/// A published slot that no producer of this library writes: logged, and
/// its message dropped.
#[cold]
#[inline(never)]
fn drop_corrupt(pos: u64, len: u64, id: u64) {
    log::error!(
        "posix: dropped the message at ring position {pos}: length {len} (a slot holds \
         {SLOT_DATA}) or id {id} (an AM id is one byte) is corrupt; a process that maps this \
         iface's ring is not a well-behaved peer"
    );
}

impl Ring {
    fn new(map: Mapping, pid: u32) -> Ring {
        Ring {
            map,
            pid,
            me: std::process::id(),
            seen_tail: Cell::new(0),
            tail: Cell::new(0),
            stuck_after: Duration::from_secs(1),
            idle: Cell::new(0),
            stuck: Cell::new(None),
            skip_until: Cell::new(0),
            waited: Cell::new(None),
            #[cfg(test)]
            fail_claims: Cell::new(false),
            #[cfg(test)]
            pause: RefCell::new(None),
        }
    }

    /// Initialises a fresh ring in `map` (the owner's side).
    pub(crate) fn init(map: Mapping) -> Result<Ring, UctError> {
        if map.data_len() < ring_bytes() {
            return Err(UctError::InvalidParam(format!(
                "posix: a receive ring needs {} bytes, the segment has {}",
                ring_bytes(),
                map.data_len()
            )));
        }
        let ring = Ring::new(map, std::process::id());
        let header = ring.header();
        header
            .owner_pid
            .store(std::process::id() as u64, Ordering::Relaxed);
        header.head.store(0, Ordering::Relaxed);
        header.tail.store(0, Ordering::Relaxed);
        for pos in 0..SLOTS {
            ring.seq(pos).store(free_for(pos), Ordering::Relaxed);
        }
        header.magic.store(MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// Wraps the mapped ring of process `pid`, checking that our mapping
    /// holds a whole ring and that it is one. (The segment's seals, checked
    /// when it was mapped, keep it that large.)
    pub(crate) fn attach(map: Mapping, pid: u32) -> Result<Ring, UctError> {
        if map.data_len() < ring_bytes() {
            return Err(not_a_ring(Some(map.data_len())));
        }
        let ring = Ring::new(map, pid);
        if ring.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(not_a_ring(None));
        }
        // Start from the consumer's tail, not 0: a ring whose positions have
        // wrapped past 0 must not look empty to a new producer.
        ring.seen_tail.set(ring.shared_tail());
        Ok(ring)
    }

    /// The segment the ring lives in.
    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// Consumer side: how long a claimed slot may stay unpublished before
    /// the consumer skips it as the message of a producer that died
    /// (default 1 s).
    pub(crate) fn set_stuck_after(&mut self, after: Duration) {
        self.stuck_after = after;
    }

    /// Tests: runs the pause hook, if any, at `stage` of position `pos`.
    #[cfg(test)]
    fn paused(&self, stage: Stage, pos: u64) {
        if let Some(hook) = self.pause.borrow_mut().as_mut() {
            hook(stage, pos);
        }
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

    /// The sequence number of the slot of position `pos`.
    fn seq(&self, pos: u64) -> &AtomicU64 {
        // SAFETY: `slot` is inside the mapping and aligned; seq is an atomic,
        // so a shared reference to it is sound while others write it.
        unsafe { &(*self.slot(pos)).seq }
    }

    /// The process that owns (and drains) the ring: this one, or the one
    /// the iface address named.
    pub fn owner_pid(&self) -> u32 {
        self.pid
    }

    /// The next position producers claim, as shared memory says.
    pub(crate) fn shared_head(&self) -> u64 {
        self.header().head.load(Ordering::Acquire)
    }

    /// The consumer's tail as published in shared memory: moves while the
    /// owner drains.
    pub(crate) fn shared_tail(&self) -> u64 {
        self.header().tail.load(Ordering::Acquire)
    }

    /// Producer: copies `parts` (concatenated) into a slot as active
    /// message `id`. More than [`SLOT_DATA`] bytes in all is an error, and so
    /// are head and tail that no honest consumer leaves
    /// ([`UctError::Protocol`]).
    pub(crate) fn push(&self, id: u8, parts: &[&[u8]]) -> Result<Push, UctError> {
        let total: usize = parts.iter().map(|part| part.len()).sum();
        if total > SLOT_DATA {
            return Err(UctError::InvalidParam(format!(
                "posix: an active message of {total} bytes does not fit a ring slot ({SLOT_DATA} bytes)"
            )));
        }
        let header = self.header();
        let mut tries = 0;
        let pos = loop {
            tries += 1;
            if tries > MAX_CLAIM_TRIES {
                return Ok(Push::Contended);
            }
            let mut head = header.head.load(Ordering::Acquire);
            if head.wrapping_sub(self.seen_tail.get()) >= SLOTS {
                // The ring looks full: read the tail, then head and tail
                // again. An honest ring has tail <= head <= tail + SLOTS at
                // every instant, and both only grow, so these three reads
                // must find tail <= head and head <= tail_after + SLOTS.
                let tail = header.tail.load(Ordering::Acquire);
                head = header.head.load(Ordering::Acquire);
                let tail_after = header.tail.load(Ordering::Acquire);
                self.seen_tail.set(tail_after);
                if ahead(tail, head).is_none() {
                    return Err(corrupt_positions(self.owner_pid(), head, tail));
                }
                match ahead(tail_after, head) {
                    Some(used) if used > SLOTS => {
                        return Err(corrupt_positions(self.owner_pid(), head, tail_after))
                    }
                    Some(SLOTS) => return Ok(Push::Full),
                    // Room, or the consumer drained past the head we read
                    // (other producers pushed meanwhile): claim below.
                    _ => {}
                }
            }
            #[cfg(test)]
            if self.fail_claims.get() {
                continue;
            }
            if header
                .head
                .compare_exchange_weak(
                    head,
                    head.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            #[cfg(test)]
            self.paused(Stage::Claimed, head);
            // The slot is ours once marked: the consumer skips a claimed,
            // unmarked slot (we were stopped past its bound) with a CAS of
            // its own, and then this one fails and we claim anew.
            if self
                .seq(head)
                .compare_exchange(
                    free_for(head),
                    writing(self.me, head),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                break head;
            }
        };
        #[cfg(test)]
        self.paused(Stage::Marked, pos);
        let slot = self.slot(pos);
        // SAFETY: `slot` points at a slot inside the mapping (see `slot`);
        // addr_of_mut makes no reference to it.
        let data = unsafe { addr_of_mut!((*slot).data) } as *mut u8;
        let mut at = 0usize;
        for part in parts {
            // SAFETY: this producer claimed position `pos` and marked its
            // slot with the CASes above, so an honest peer leaves the slot
            // to it until it publishes `seq` (a hostile one can only garble
            // bytes in the slot); at + part.len() <= total <= SLOT_DATA keeps the copy
            // inside the slot's data; `part` is a caller's slice, not in the
            // ring.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), data.add(at), part.len()) };
            at += part.len();
        }
        // SAFETY: `slot` is inside the mapping and aligned; its fields are
        // atomics, so shared references to them are sound even while the
        // consumer reads them.
        let (len, msg_id) = unsafe { (&(*slot).len, &(*slot).id) };
        len.store(at as u64, Ordering::Relaxed);
        msg_id.store(id as u64, Ordering::Relaxed);
        // Positions come from shared memory: wrap, never overflow.
        // A store, not a CAS from our mark: an honest consumer never takes
        // a slot a live process marked, and a CAS here cost a fifth of the
        // small-message rate (only a hostile process could have taken it,
        // and such a one can garble any slot anyway).
        self.seq(pos).store(pos.wrapping_add(1), Ordering::Release);
        Ok(Push::Done)
    }

    /// Consumer: hands each published message to `f`, in order, as a copy
    /// no producer can change under it; returns how many it handed over.
    /// Consumes at most [`SLOTS`] slots per call.
    ///
    /// The empty ring is the common case of a progress loop: it costs two
    /// loads here, inlined into the caller; only a published message takes
    /// the call into the delivery loop.
    ///
    /// A slot claimed but left unpublished for
    /// [`set_stuck_after`](Self::set_stuck_after) is skipped, so that the
    /// messages after it still arrive, when its producer never marked it
    /// (that producer then claims another position) or marked it and has
    /// exited; a live producer's is waited for.
    #[inline]
    pub(crate) fn drain(&self, f: impl FnMut(u8, &[u8])) -> usize {
        if self.has_message() {
            return self.deliver(f);
        }
        let idle = self.idle.get().wrapping_add(1);
        self.idle.set(idle);
        if idle.is_multiple_of(STUCK_CHECK_EVERY) {
            self.unstick(f)
        } else {
            0
        }
    }

    /// Looks at the unpublished slot at our tail: claimed (head is past
    /// it), and for how long. Once that is [`stuck_after`](Self::stuck_after),
    /// every position claimed when it was first seen and still unpublished
    /// is skipped.
    #[cold]
    #[inline(never)]
    fn unstick(&self, f: impl FnMut(u8, &[u8])) -> usize {
        let pos = self.tail.get();
        let head = self.shared_head();
        // Head past our tail by at most a ring: claimed slots. Anything else
        // is an empty ring, or positions no honest ring has (producers find
        // those); either way nothing to skip.
        if !ahead(pos, head).is_some_and(|claimed| (1..=SLOTS).contains(&claimed)) {
            self.stuck.set(None);
            return 0;
        }
        if self.has_message() {
            return self.deliver(f);
        }
        match self.stuck.get() {
            Some((at, since, until)) if at == pos => {
                if since.elapsed() < self.stuck_after {
                    return 0;
                }
                self.stuck.set(None);
                if self.skip_until.get() != until {
                    self.skip_until.set(until);
                    skip_stuck(self.pid, pos, until, self.stuck_after);
                }
                self.deliver(f)
            }
            _ => {
                self.stuck.set(Some((pos, Instant::now(), head)));
                0
            }
        }
    }

    /// Takes the slot of position `pos`, whose sequence number was `seq`
    /// (not published), from its producer, unless a live process marked
    /// it: the slot becomes free for the next lap, and a producer that
    /// claimed `pos` and had not marked it yet finds its mark refused.
    #[cold]
    #[inline(never)]
    fn give_up(&self, pos: u64, mut seq: u64) -> GiveUp {
        let published = pos.wrapping_add(1);
        // A few rounds: an honest slot changes state at most twice (marked,
        // published); a process that keeps rewriting it is waited out.
        for _ in 0..4 {
            if seq == published {
                return GiveUp::Published;
            }
            if let Some(pid) = writer(seq, pos) {
                if !crate::host::process_gone(pid) {
                    if self.waited.get() != Some(pos) {
                        self.waited.set(Some(pos));
                        wait_for_writer(self.pid, pos, pid, self.stuck_after);
                    }
                    return GiveUp::Wait;
                }
            }
            // Never marked, marked by a process that exited, or corrupt.
            match self.seq(pos).compare_exchange(
                seq,
                published,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return GiveUp::Skipped,
                Err(now) => seq = now,
            }
        }
        GiveUp::Wait
    }

    /// Whether position `pos` is before [`skip_until`](Self::skip_until).
    fn skipping(&self, pos: u64) -> bool {
        ahead(pos, self.skip_until.get()).is_some_and(|d| d > 0)
    }

    /// Whether the slot at our tail is published.
    #[inline]
    fn has_message(&self) -> bool {
        let pos = self.tail.get();
        let slot = self.slot(pos);
        // SAFETY: `slot` is inside the mapping and aligned; seq is an atomic.
        unsafe { &(*slot).seq }.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    #[inline(never)]
    fn deliver(&self, mut f: impl FnMut(u8, &[u8])) -> usize {
        let header = self.header();
        // The handler's copy of one message: only the first `len` bytes are
        // written and read.
        let mut copy = MaybeUninit::<[u8; SLOT_DATA]>::uninit();
        let mut delivered = 0;
        for _ in 0..DRAIN_BUDGET {
            let pos = self.tail.get();
            let slot = self.slot(pos);
            // SAFETY: `slot` is inside the mapping and aligned; seq is an
            // atomic.
            let seq = unsafe { &(*slot).seq }.load(Ordering::Acquire);
            if seq != pos.wrapping_add(1) {
                if !self.skipping(pos) {
                    break;
                }
                // Claimed long ago and never published (logged by unstick).
                match self.give_up(pos, seq) {
                    GiveUp::Skipped => {
                        let next = pos.wrapping_add(1);
                        self.tail.set(next);
                        header.tail.store(next, Ordering::Release);
                        continue;
                    }
                    GiveUp::Wait => break,
                    GiveUp::Published => {}
                }
            }
            // SAFETY: as above; len and id are atomics.
            let (len, id) = unsafe {
                (
                    (*slot).len.load(Ordering::Relaxed),
                    (*slot).id.load(Ordering::Relaxed),
                )
            };
            let sound = len <= SLOT_DATA as u64 && id <= u8::MAX as u64;
            if sound {
                // SAFETY: the slot is inside our mapping (see `slot`) and
                // len <= SLOT_DATA (checked above), so the source lies in the
                // slot's data; `copy` has room for SLOT_DATA bytes and is not
                // in the ring. The producer published the slot (the Acquire
                // load of seq pairs with its Release store); a hostile one
                // writing it meanwhile garbles only this copy's bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        addr_of_mut!((*slot).data) as *const u8,
                        copy.as_mut_ptr() as *mut u8,
                        len as usize,
                    )
                };
            }
            // The copy is ours: release the slot before the handler runs.
            let next = pos.wrapping_add(1);
            self.tail.set(next);
            header.tail.store(next, Ordering::Release);
            if !sound {
                drop_corrupt(pos, len, id);
                continue;
            }
            // SAFETY: the first `len` bytes of `copy` were written above.
            let data =
                unsafe { std::slice::from_raw_parts(copy.as_ptr() as *const u8, len as usize) };
            f(id as u8, data);
            delivered += 1;
        }
        delivered
    }
}

pub mod layout;
mod marks;

#[cfg(test)]
mod tests;
