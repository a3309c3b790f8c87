//! Registration records of this process's cma regions, in one table
//! (`table.rs`) that peers map: the records read-only, and one area of busy
//! counters (one per record) writable for each peer process, which claims
//! it with its pid. An initiator checks the owner's record (state, secret,
//! range, rights) with a few loads before every transfer, with no system
//! call.
//!
//! # Deregistration against an access in flight
//!
//! The check and the transfer are two steps: without more, the owner could
//! deregister the region between them, free the memory and reuse it, and the
//! transfer would land in it. A generation re-checked after the transfer
//! would only tell, too late, that a write hit freed memory. Instead the
//! record's busy counter makes the owner wait for accesses in flight:
//!
//! - the initiator claims its area (its pid in the area's claim), then, per
//!   access, increments its counter of the record, then loads the state,
//!   and decrements the counter only when its transfer has returned;
//! - the owner stores DEAD, then loads the claims and the counters of the
//!   claimed areas, and hands the memory back only once it reads 0 in each.
//!
//! All are SeqCst, so one of the two sees the other (the store-buffer case
//! of Dekker's algorithm): either the initiator reads DEAD and makes no
//! transfer, or the owner reads a count that includes it and waits until its
//! transfer is over.
//!
//! A count is the claimant's: when the process whose pid claims an area is
//! gone (its pidfd, or no process of that pid), its transfers are over, so
//! its counts are discarded and its area cleared, at once, instead of being
//! waited for. A live peer is waited for up to `UCT_CMA_PEER_TIMEOUT` (one
//! killed or stopped inside a transfer, or a hostile one that wrote its
//! counters); past it the record is retired and the caller told the memory
//! is not safe to reuse ([`Slot::retire`]), and that peer's area is marked
//! stuck: a later deregistration that only it holds retires its record at
//! once rather than waiting again. So a deregistration blocks at most
//! `UCT_CMA_PEER_TIMEOUT`, and all of them together at most that once per
//! live peer process that holds counts (a dead one costs nothing). A
//! retired record (and the memory [`Slot::retire_with`] parked with it) is
//! looked at again at later registrations, and used (freed) again once no
//! live peer counts it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use uct_core::{Access, UctError};

use super::table::{TableMemory, AREA_BYTES, PEERS, RECLAIMING, RECORDS_BYTES};

/// Records in a table; a registration beyond this is refused.
pub const CAPACITY: u32 = 65_536;
const LIVE: u64 = 1;
const DEAD: u64 = 2;
/// Retired records looked at again per registration.
const REVISIT: usize = 8;

/// One registration, as its owner publishes it.
#[derive(Debug)]
#[repr(C)]
pub struct Record {
    state: AtomicU64,
    secret: AtomicU64,
    base: AtomicU64,
    len: AtomicU64,
    access: AtomicU64,
}

/// Record `index` of a mapped table, if the table holds it: checked against
/// the capacity and against our mapping's extent (constants of ours), never
/// against anything read from the table.
fn record_at(mem: &TableMemory, index: u32) -> Option<&Record> {
    let i = index as usize;
    if index >= CAPACITY || (i + 1) * std::mem::size_of::<Record>() > RECORDS_BYTES {
        return None;
    }
    // SAFETY: record i lies inside the records area of the mapping (checked
    // above), which is page-aligned, so it is aligned for its u64 atomics;
    // atomics only, so other processes writing it at the same time is no
    // data race; the borrow is tied to `mem`, which keeps the mapping.
    unsafe { Some(&*(mem.records_ptr() as *const Record).add(i)) }
}

/// The busy counter of record `index` in counter area `area` (< PEERS).
fn counter_at(mem: &TableMemory, area: usize, index: u32) -> Option<&AtomicU32> {
    if index >= CAPACITY || area >= PEERS || (index as usize + 1) * 4 > AREA_BYTES {
        return None;
    }
    // SAFETY: counter `index` lies inside area `area` of the mapping
    // (checked above), page-aligned, so aligned for a u32 atomic; atomics
    // only; the borrow is tied to `mem`, which keeps the mapping.
    unsafe { Some(&*(mem.area_ptr(area) as *const AtomicU32).add(index as usize)) }
}

/// Clears area `area`, claimed by `holder` (a process that is gone, or
/// this one letting go of its own), and leaves it claimed by `then` (0:
/// free). `false` when another process changed the claim first, or the
/// clearing failed (the area then stays RECLAIMING: its counts are ignored
/// and it is never handed out again).
fn reclaim(mem: &TableMemory, area: usize, holder: u32, then: u32) -> bool {
    let claim = &mem.claims()[area];
    if claim
        .compare_exchange(holder, RECLAIMING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return false;
    }
    if let Err(e) = mem.clear_area(area) {
        log::error!("cma: counter area {area} of process {holder} is lost: {e}");
        return false;
    }
    claim.store(then, Ordering::SeqCst);
    true
}

/// The (area, pid) of each live peer process that counts an access to
/// record `index`; the areas of gone ones are cleared on the way.
fn counted_by(mem: &TableMemory, index: u32) -> Vec<(usize, u32)> {
    let mut held = Vec::new();
    for (area, claim) in mem.claims().iter().enumerate() {
        let holder = claim.load(Ordering::SeqCst);
        if holder == 0 || holder == RECLAIMING {
            continue;
        }
        let Some(count) = counter_at(mem, area, index) else {
            continue;
        };
        if count.load(Ordering::SeqCst) == 0 {
            continue;
        }
        if crate::host::process_gone(holder) {
            reclaim(mem, area, holder, 0);
            continue;
        }
        held.push((area, holder));
    }
    held
}

/// Memory a retired record keeps from being freed, until no peer counts it.
type Parked = Option<Box<dyn Send>>;

struct Table {
    /// Never unmapped: the table lives as long as the process, so records
    /// may be borrowed for 'static (a deregistration waits without the lock).
    mem: &'static TableMemory,
    path: String,
    free: Vec<u32>,
    next: u32,
    /// Records a live peer held past the timeout, and their memory.
    retired: Vec<(u32, Parked)>,
    /// (area, pid) of peers that held a count past the timeout: not waited
    /// for again.
    stuck: Vec<(usize, u32)>,
}

impl Table {
    /// Looks at a few retired records again: one no live peer counts any
    /// more is free again, and its parked memory freed.
    fn revisit(&mut self) {
        for _ in 0..REVISIT.min(self.retired.len()) {
            let (index, parked) = self.retired.remove(0);
            if counted_by(self.mem, index).is_empty() {
                self.free.push(index);
                drop(parked);
            } else {
                self.retired.push((index, parked));
            }
        }
    }
}

fn table() -> &'static Mutex<Option<Table>> {
    static T: OnceLock<Mutex<Option<Table>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(None))
}

/// A live registration: its table and slot; dropping it (or
/// [`retire`](Slot::retire)) marks it dead and waits for accesses in flight.
#[derive(Debug)]
pub struct Slot {
    /// The table's path, for peers (`/proc/<pid>/fd/<fd>`).
    pub table: String,
    /// The record's index in the table.
    pub index: u32,
    record: &'static Record,
    mem: &'static TableMemory,
    retired: bool,
}

/// Publishes a registration and returns its slot.
pub fn publish(secret: u64, base: u64, len: u64, access: Access) -> Result<Slot, UctError> {
    let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        // Anonymous: gone with the process, however it ends.
        let (mem, path) = TableMemory::create()?;
        *guard = Some(Table {
            mem: Box::leak(Box::new(mem)),
            path,
            free: Vec::new(),
            next: 0,
            retired: Vec::new(),
            stuck: Vec::new(),
        });
    }
    let own = guard
        .as_mut()
        .ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    own.revisit();
    let index = match own.free.pop() {
        Some(free) => free,
        None if own.next < CAPACITY => {
            own.next += 1;
            own.next - 1
        }
        None => {
            return Err(UctError::NoMemory(format!(
                "cma: {CAPACITY} regions are registered (or held by peers past UCT_CMA_PEER_TIMEOUT) already; deregister some first"
            )))
        }
    };
    let record =
        record_at(own.mem, index).ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    record.secret.store(secret, Ordering::Relaxed);
    record.base.store(base, Ordering::Relaxed);
    record.len.store(len, Ordering::Relaxed);
    record.access.store(access.bits() as u64, Ordering::Relaxed);
    record.state.store(LIVE, Ordering::Release);
    Ok(Slot {
        table: own.path.clone(),
        index,
        record,
        mem: own.mem,
        retired: false,
    })
}

impl Slot {
    /// Marks the record dead, then waits up to `timeout` for the accesses
    /// of live peers that passed their check before (see the module
    /// documentation). `true`: none is left, the memory may be freed or
    /// reused. `false`: one still runs after `timeout`, or is held by a
    /// peer already found stuck; the record is retired until no live peer
    /// counts it, and the memory must not be reused.
    pub fn retire(&mut self, timeout: Duration) -> bool {
        self.retire_with(timeout, None)
    }

    /// [`retire`](Self::retire), and `memory` (the region's, when this
    /// process allocated it) freed once it is safe: at once if no access is
    /// left, else when a later registration finds the record no longer
    /// counted by a live peer.
    pub fn retire_with(&mut self, timeout: Duration, memory: Parked) -> bool {
        if self.retired {
            return true;
        }
        self.retired = true;
        self.record.state.store(DEAD, Ordering::SeqCst);
        let stuck = {
            let guard = table().lock().unwrap_or_else(|e| e.into_inner());
            guard
                .as_ref()
                .map(|own| own.stuck.clone())
                .unwrap_or_default()
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            let held = counted_by(self.mem, self.index);
            let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
            let Some(own) = guard.as_mut() else {
                // No table: no slot was published; keep any memory.
                std::mem::forget(memory);
                return held.is_empty();
            };
            if held.is_empty() {
                own.free.push(self.index);
                return true;
            }
            let waited = start.elapsed();
            if held.iter().all(|h| stuck.contains(h)) || waited >= timeout {
                let pids: Vec<u32> = held.iter().map(|&(_, pid)| pid).collect();
                log::error!(
                    "cma: region {} ({}) still had a transfer of peer process(es) {pids:?} in flight {waited:?} after it was deregistered (UCT_CMA_PEER_TIMEOUT {timeout:?}; a peer already held past it is not waited for again); its record is retired and its memory kept until they let go",
                    self.index,
                    self.table
                );
                let mem = self.mem;
                own.stuck
                    .retain(|&(area, pid)| mem.claims()[area].load(Ordering::SeqCst) == pid);
                for h in held {
                    if !own.stuck.contains(&h) {
                        own.stuck.push(h);
                    }
                }
                own.retired.push((self.index, memory));
                return false;
            }
            drop(guard);
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.retire(super::component::peer_timeout());
    }
}

/// A peer's record table, mapped (see `table.rs`: only a sealed table of
/// the connected peer, of our size, is accepted), with the counter area
/// this process claimed in it. One per table and process: every rkey of
/// that table shares it.
#[derive(Debug)]
pub struct PeerTable {
    mem: TableMemory,
    owner: u32,
    area: usize,
}

/// The peer tables this process has mapped.
fn peer_tables() -> &'static Mutex<Vec<Weak<PeerTable>>> {
    static T: OnceLock<Mutex<Vec<Weak<PeerTable>>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(Vec::new()))
}

/// Claims a counter area of `mem` (the table of process `owner`) for this
/// process: a free one, else one whose holder is gone.
fn claim(mem: &TableMemory, owner: u32) -> Result<usize, UctError> {
    let me = std::process::id();
    let claims = mem.claims();
    for (area, claim) in claims.iter().enumerate() {
        if claim
            .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Ok(area);
        }
    }
    for (area, claim) in claims.iter().enumerate() {
        let holder = claim.load(Ordering::SeqCst);
        if holder != 0
            && holder != RECLAIMING
            && crate::host::process_gone(holder)
            && reclaim(mem, area, holder, me)
        {
            return Ok(area);
        }
    }
    Err(UctError::NoMemory(format!(
        "cma: the record table of process {owner} has counter areas for {PEERS} peer processes, all held by live processes; close endpoints and rkeys to process {owner} in some of them first"
    )))
}

/// An access that passed its check: the record's busy counter stays
/// incremented, so the owner does not hand the memory back, until this is
/// dropped after the transfer.
#[must_use = "the access is protected only while this lives"]
pub struct InFlight<'t> {
    busy: &'t AtomicU32,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PeerTable {
    /// Maps the record table of process `pid` at `path` (the rkey's pid and
    /// path, the rkey's pid being the connected peer's), or returns this
    /// process's mapping of it.
    pub fn open(path: &str, pid: u32, region_id: u64) -> Result<Arc<PeerTable>, UctError> {
        let mem = TableMemory::open(path, pid, region_id)?;
        let mut tables = peer_tables().lock().unwrap_or_else(|e| e.into_inner());
        tables.retain(|t| t.strong_count() > 0);
        let mapped = tables
            .iter()
            .filter_map(Weak::upgrade)
            .find(|t| t.owner == pid && t.mem.id() == mem.id());
        if let Some(table) = mapped {
            return Ok(table);
        }
        let area = claim(&mem, pid)?;
        let table = Arc::new(PeerTable {
            mem,
            owner: pid,
            area,
        });
        table.mem.make_area_writable(area)?;
        tables.push(Arc::downgrade(&table));
        Ok(table)
    }

    /// Checks an access against record `index` and marks it in flight
    /// until the returned guard is dropped.
    pub fn access(
        &self,
        index: u32,
        region_id: u64,
        secret: u64,
        addr: u64,
        len: u64,
        needed: Access,
    ) -> Result<InFlight<'_>, UctError> {
        let (Some(record), Some(busy)) = (
            record_at(&self.mem, index),
            counter_at(&self.mem, self.area, index),
        ) else {
            return Err(UctError::NoSuchRegion { region_id });
        };
        // Counted before the state is read: see the module documentation.
        busy.fetch_add(1, Ordering::SeqCst);
        let in_flight = InFlight { busy };
        if record.state.load(Ordering::SeqCst) != LIVE {
            return Err(UctError::NoSuchRegion { region_id });
        }
        if record.secret.load(Ordering::Relaxed) != secret {
            return Err(UctError::BadSecret);
        }
        let (base, region_len) = (
            record.base.load(Ordering::Relaxed),
            record.len.load(Ordering::Relaxed),
        );
        if !(addr >= base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= base.saturating_add(region_len)))
        {
            return Err(UctError::OutOfRange {
                addr,
                len,
                base,
                region_len,
            });
        }
        let granted = Access::from_bits_truncate(record.access.load(Ordering::Relaxed) as u8);
        if !granted.contains(needed) {
            return Err(UctError::AccessDenied { needed, granted });
        }
        Ok(in_flight)
    }

    /// [`access`](Self::access) without a transfer: only the check.
    pub fn check(
        &self,
        index: u32,
        region_id: u64,
        secret: u64,
        addr: u64,
        len: u64,
        needed: Access,
    ) -> Result<(), UctError> {
        self.access(index, region_id, secret, addr, len, needed)
            .map(drop)
    }
}

impl Drop for PeerTable {
    /// Lets go of our counter area (cleared: no access of ours is left,
    /// every one borrows this table).
    fn drop(&mut self) {
        reclaim(&self.mem, self.area, std::process::id(), 0);
    }
}

#[cfg(test)]
pub(crate) mod tests;
