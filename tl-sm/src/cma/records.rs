//! Registration records of this process's cma regions, in one shared-memory
//! table that peers map (read-write, as every segment is mapped) and only
//! load from. An
//! initiator checks the owner's record (state, secret, range, rights) with a
//! few loads before every transfer, with no system call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use uct_core::{Access, UctError};

use crate::segment::Mapping;

/// Records in a table; a registration beyond this is refused.
pub const CAPACITY: u32 = 65_536;
const LIVE: u64 = 1;
const DEAD: u64 = 2;

/// One registration, as its owner publishes it.
#[repr(C)]
pub struct Record {
    state: AtomicU64,
    secret: AtomicU64,
    base: AtomicU64,
    len: AtomicU64,
    access: AtomicU64,
}

/// Record `index` of a mapped table, if the table holds it.
fn record_at(map: &Mapping, index: u32) -> Option<&Record> {
    let end = (index as usize + 1) * std::mem::size_of::<Record>();
    if index >= CAPACITY || end > map.data_len() {
        return None;
    }
    // SAFETY: the record ends within the data area (checked above), which
    // is page-aligned, so every record is aligned for its u64 atomics;
    // Record is all atomics, so the owner writing it at the same time is no
    // data race; the borrow is tied to `map`, which keeps it mapped.
    Some(unsafe { &*(map.data_ptr() as *const Record).add(index as usize) })
}

/// The bytes a table needs.
fn table_bytes() -> usize {
    CAPACITY as usize * std::mem::size_of::<Record>()
}

struct Table {
    map: Mapping,
    /// Keeps the memfd open, so peers can open it through /proc.
    _fd: std::os::fd::OwnedFd,
    name: String,
    free: Vec<u32>,
    next: u32,
}

fn table() -> &'static Mutex<Option<Table>> {
    static T: OnceLock<Mutex<Option<Table>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(None))
}

/// A live registration: its table and slot; dropping it marks it dead.
#[derive(Debug)]
pub struct Slot {
    /// The table's path, for peers (`/proc/<pid>/fd/<fd>`).
    pub table: String,
    /// The record's index in the table.
    pub index: u32,
}

/// Publishes a registration and returns its slot.
pub fn publish(secret: u64, base: u64, len: u64, access: Access) -> Result<Slot, UctError> {
    let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        // Anonymous: gone with the process, however it ends.
        let (map, fd, name) = Mapping::create_anonymous("uct-cma-records", table_bytes())?;
        *guard = Some(Table {
            map,
            _fd: fd,
            name,
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
                "cma: {CAPACITY} regions are registered already; deregister some first"
            )))
        }
    };
    let record =
        record_at(&own.map, index).ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    record.secret.store(secret, Ordering::Relaxed);
    record.base.store(base, Ordering::Relaxed);
    record.len.store(len, Ordering::Relaxed);
    record.access.store(access.bits() as u64, Ordering::Relaxed);
    record.state.store(LIVE, Ordering::Release);
    Ok(Slot {
        table: own.name.clone(),
        index,
    })
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(own) = guard.as_mut() {
            if let Some(record) = record_at(&own.map, self.index) {
                // Peers check the record before every access.
                record.state.store(DEAD, Ordering::Release);
                own.free.push(self.index);
            }
        }
    }
}

/// Checks an access against record `index` of a peer's mapped table.
pub fn check(
    map: &Mapping,
    index: u32,
    region_id: u64,
    secret: u64,
    addr: u64,
    len: u64,
    needed: Access,
) -> Result<(), UctError> {
    let record = record_at(map, index).ok_or(UctError::NoSuchRegion { region_id })?;
    if record.state.load(Ordering::Acquire) != LIVE {
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
    Ok(())
}

/// The table of a peer, mapped. A table smaller than [`CAPACITY`] records
/// is refused here; [`check`] also refuses a record past its end.
pub fn open_table(name: &str, region_id: u64) -> Result<Mapping, UctError> {
    let map = Mapping::open_path(name, region_id)?;
    if map.data_len() < table_bytes() {
        return Err(UctError::BadRkey(format!(
            "{name} is too small to be a cma record table"
        )));
    }
    Ok(map)
}

#[cfg(test)]
mod tests;
