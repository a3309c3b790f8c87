//! Registration records of this process's cma regions, in one table
//! (`table.rs`) that peers map: the records read-only, one
//! busy counter per record writable. An initiator checks the owner's record
//! (state, secret, range, rights) with a few loads before every transfer,
//! with no system call.
//!
//! # Deregistration against an access in flight
//!
//! The check and the transfer are two steps: without more, the owner could
//! deregister the region between them, free the memory and reuse it, and the
//! transfer would land in it. A generation re-checked after the transfer
//! would only tell, too late, that a write hit freed memory. Instead the
//! record's busy counter makes the owner wait for accesses in flight:
//!
//! - the initiator increments the counter, then loads the state, and
//!   decrements the counter only when its transfer has returned;
//! - the owner stores DEAD, then loads the counter, and hands the memory back
//!   only once it reads 0.
//!
//! All four are SeqCst, so one of the two sees the other (the store-buffer
//! case of Dekker's algorithm): either the initiator reads DEAD and makes no
//! transfer, or the owner reads a count that includes it and waits until its
//! transfer is over. The wait has a deadline, `UCT_CMA_PEER_TIMEOUT`, for a
//! peer killed or stopped inside a transfer (or one that wrote its counter):
//! past it the record is retired for good, and the caller is told the memory
//! is not safe to reuse ([`Slot::retire`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use uct_core::{Access, UctError};

use super::table::{TableMemory, BUSY_BYTES, RECORDS_BYTES};

/// Records in a table; a registration beyond this is refused.
pub const CAPACITY: u32 = 65_536;
const LIVE: u64 = 1;
const DEAD: u64 = 2;

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

/// Record `index` of a mapped table and its busy counter, if the table
/// holds it: checked against the capacity and against our mapping's extent
/// (constants of ours), never against anything read from the table.
fn slot_at(mem: &TableMemory, index: u32) -> Option<(&Record, &AtomicU64)> {
    let i = index as usize;
    if index >= CAPACITY
        || (i + 1) * std::mem::size_of::<Record>() > RECORDS_BYTES
        || (i + 1) * 8 > BUSY_BYTES
    {
        return None;
    }
    // SAFETY: record i and counter i lie inside the records and counters
    // areas of the mapping (checked above), which are page-aligned, so both
    // are aligned for their u64 atomics; both are atomics only, so other
    // processes writing them at the same time is no data race; the borrows
    // are tied to `mem`, which keeps the mapping.
    unsafe {
        Some((
            &*(mem.records_ptr() as *const Record).add(i),
            &*(mem.busy_ptr() as *const AtomicU64).add(i),
        ))
    }
}

struct Table {
    /// Never unmapped: the table lives as long as the process, so records
    /// may be borrowed for 'static (a deregistration waits without the lock).
    mem: &'static TableMemory,
    /// Keeps the memfd open, so peers can open it through /proc.
    _fd: std::os::fd::OwnedFd,
    path: String,
    free: Vec<u32>,
    next: u32,
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
    busy: &'static AtomicU64,
    retired: bool,
}

/// Publishes a registration and returns its slot.
pub fn publish(secret: u64, base: u64, len: u64, access: Access) -> Result<Slot, UctError> {
    let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        // Anonymous: gone with the process, however it ends.
        let (mem, fd, path) = TableMemory::create()?;
        *guard = Some(Table {
            mem: Box::leak(Box::new(mem)),
            _fd: fd,
            path,
            free: Vec::new(),
            next: 0,
        });
    }
    let own = guard
        .as_mut()
        .ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    let index = match own.free.pop() {
        Some(free) => free,
        None if own.next < CAPACITY => {
            own.next += 1;
            own.next - 1
        }
        None => {
            return Err(UctError::NoMemory(format!(
                "cma: {CAPACITY} regions are registered (or retired) already; deregister some first"
            )))
        }
    };
    let (record, busy) =
        slot_at(own.mem, index).ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    record.secret.store(secret, Ordering::Relaxed);
    record.base.store(base, Ordering::Relaxed);
    record.len.store(len, Ordering::Relaxed);
    record.access.store(access.bits() as u64, Ordering::Relaxed);
    record.state.store(LIVE, Ordering::Release);
    Ok(Slot {
        table: own.path.clone(),
        index,
        record,
        busy,
        retired: false,
    })
}

impl Slot {
    /// Marks the record dead, then waits up to `timeout` for the accesses
    /// that passed their check before (see the module documentation).
    /// `true`: none is left, the memory may be freed or reused. `false`: one
    /// still runs after `timeout` (a peer killed or stopped in a transfer);
    /// the record is retired for good and the memory must not be reused.
    pub fn retire(&mut self, timeout: Duration) -> bool {
        if self.retired {
            return true;
        }
        self.retired = true;
        self.record.state.store(DEAD, Ordering::SeqCst);
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        while self.busy.load(Ordering::SeqCst) != 0 {
            if start.elapsed() >= timeout {
                log::error!(
                    "cma: region {} ({}) still had a peer's transfer in flight {timeout:?} after it was deregistered (UCT_CMA_PEER_TIMEOUT); its record is retired and its memory must not be reused",
                    self.index,
                    self.table
                );
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(own) = guard.as_mut() {
            own.free.push(self.index);
        }
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.retire(super::component::peer_timeout());
    }
}

/// A peer's record table, mapped (see `table.rs`: only a sealed table of
/// the connected peer, of our size, is accepted).
#[derive(Debug)]
pub struct PeerTable {
    mem: TableMemory,
}

/// An access that passed its check: the record's busy counter stays
/// incremented, so the owner does not hand the memory back, until this is
/// dropped after the transfer.
#[must_use = "the access is protected only while this lives"]
pub struct InFlight<'t> {
    busy: &'t AtomicU64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PeerTable {
    /// Maps the record table of process `pid` at `path` (the rkey's pid and
    /// path, the rkey's pid being the connected peer's).
    pub fn open(path: &str, pid: u32, region_id: u64) -> Result<PeerTable, UctError> {
        Ok(PeerTable {
            mem: TableMemory::open(path, pid, region_id)?,
        })
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
        let (record, busy) =
            slot_at(&self.mem, index).ok_or(UctError::NoSuchRegion { region_id })?;
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

#[cfg(test)]
pub(crate) mod tests;
