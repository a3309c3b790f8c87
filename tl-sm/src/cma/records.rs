//! Registration records of this process's cma regions, in one shared-memory
//! table that peers map read-only in effect (they only load from it). An
//! initiator checks the owner's record (state, secret, range, rights) with a
//! few loads before every transfer, with no system call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use uct_core::{Access, UctError};

use crate::posix::segment::Mapping;

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

fn record_at(map: &Mapping, index: u32) -> Option<&Record> {
    if index >= CAPACITY {
        return None;
    }
    // SAFETY: the table's data area holds CAPACITY records, page-aligned,
    // all atomics; index < CAPACITY.
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
    pub table: String,
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
    let t = guard
        .as_mut()
        .ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    let index = match t.free.pop() {
        Some(i) => i,
        None if t.next < CAPACITY => {
            t.next += 1;
            t.next - 1
        }
        None => {
            return Err(UctError::NoMemory(format!(
                "cma: {CAPACITY} regions are registered already; deregister some first"
            )))
        }
    };
    let r =
        record_at(&t.map, index).ok_or_else(|| UctError::NoMemory("cma record table".into()))?;
    r.secret.store(secret, Ordering::Relaxed);
    r.base.store(base, Ordering::Relaxed);
    r.len.store(len, Ordering::Relaxed);
    r.access.store(access.bits() as u64, Ordering::Relaxed);
    r.state.store(LIVE, Ordering::Release);
    Ok(Slot {
        table: t.name.clone(),
        index,
    })
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut guard = table().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = guard.as_mut() {
            if let Some(r) = record_at(&t.map, self.index) {
                // Peers check the record before every access.
                r.state.store(DEAD, Ordering::Release);
                t.free.push(self.index);
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
    let r = record_at(map, index).ok_or(UctError::NoSuchRegion { region_id })?;
    if r.state.load(Ordering::Acquire) != LIVE {
        return Err(UctError::NoSuchRegion { region_id });
    }
    if r.secret.load(Ordering::Relaxed) != secret {
        return Err(UctError::BadSecret);
    }
    let (base, rlen) = (
        r.base.load(Ordering::Relaxed),
        r.len.load(Ordering::Relaxed),
    );
    if !(addr >= base
        && addr
            .checked_add(len)
            .is_some_and(|e| e <= base.saturating_add(rlen)))
    {
        return Err(UctError::OutOfRange {
            addr,
            len,
            base,
            region_len: rlen,
        });
    }
    let granted = Access::from_bits_truncate(r.access.load(Ordering::Relaxed) as u8);
    if !granted.contains(needed) {
        return Err(UctError::AccessDenied { needed, granted });
    }
    Ok(())
}

/// The table of a peer, mapped.
pub fn open_table(name: &str, region_id: u64) -> Result<Mapping, UctError> {
    Mapping::open_path(name, region_id)
}
