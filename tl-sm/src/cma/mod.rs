//! The cma transport: put and get straight into a peer process's registered
//! memory with `process_vm_writev` / `process_vm_readv`, no shared mapping
//! and no copy in between. Before each access the initiator reads the
//! owner's registration record (state, secret, range, rights) out of the
//! owner's memory, so a freed region, a forged key, an access outside the
//! range or without the right is refused. cma has no active messages and no
//! atomics of its own.

mod ep;
mod iface;
mod vm;

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use uct_core::md::{MdAttrs, MdFlags, RegCost};
use uct_core::memory::MemBacking;
use uct_core::region_table::SoftRkey;
use uct_core::rkey::{decode_payload, encode_payload};
use uct_core::{
    Access, MemHandle, MemRegion, MemoryDomain, MemoryType, RemoteKey, Result, RkeyEntry, UctError,
};

pub use iface::CmaIface;

pub const MD_NAME: &str = "cma";
const MAGIC: u64 = u64::from_le_bytes(*b"UCTCMAR1");
const LIVE: u64 = 1;
const DEAD: u64 = 2;

/// A registration as the owner keeps it, read by peers through
/// `process_vm_readv`. Records are never freed, only reused, so a peer
/// reading a stale record reads a record, not freed memory.
#[repr(C)]
pub(crate) struct Record {
    magic: AtomicU64,
    state: AtomicU64,
    secret: AtomicU64,
    base: AtomicU64,
    len: AtomicU64,
    access: AtomicU64,
}

/// The same fields as plain data, as read from a peer.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct RecordImage {
    pub magic: u64,
    pub state: u64,
    pub secret: u64,
    pub base: u64,
    pub len: u64,
    pub access: u64,
}

static FREE_RECORDS: Mutex<Vec<&'static Record>> = Mutex::new(Vec::new());

fn new_record(secret: u64, base: u64, len: u64, access: Access) -> &'static Record {
    let reused = FREE_RECORDS.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let r: &'static Record = reused.unwrap_or_else(|| {
        Box::leak(Box::new(Record {
            magic: AtomicU64::new(0),
            state: AtomicU64::new(DEAD),
            secret: AtomicU64::new(0),
            base: AtomicU64::new(0),
            len: AtomicU64::new(0),
            access: AtomicU64::new(0),
        }))
    });
    r.secret.store(secret, Ordering::Relaxed);
    r.base.store(base, Ordering::Relaxed);
    r.len.store(len, Ordering::Relaxed);
    r.access.store(access.bits() as u64, Ordering::Relaxed);
    r.magic.store(MAGIC, Ordering::Relaxed);
    r.state.store(LIVE, Ordering::Release);
    r
}

/// What a cma rkey carries; it begins with a [`SoftRkey`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CmaRkey {
    pub soft: SoftRkey,
    pub pid: u32,
    /// Address of the owner's registration record.
    pub record: u64,
}

struct CmaBacking {
    record: &'static Record,
    key: SoftRkey,
    alloc: Option<(NonNull<u8>, Layout)>,
}

// SAFETY: the allocation is owned exclusively and freed only in Drop.
unsafe impl Send for CmaBacking {}
// SAFETY: as for Send; no interior mutability besides atomics.
unsafe impl Sync for CmaBacking {}

impl MemBacking for CmaBacking {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CmaBacking {
    fn drop(&mut self) {
        // Peers check the record before every access: mark it first.
        self.record.state.store(DEAD, Ordering::Release);
        FREE_RECORDS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.record);
        if let Some((p, layout)) = self.alloc.take() {
            // SAFETY: allocated in CmaMd::alloc with this layout, freed once.
            unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
        }
    }
}

/// The cma memory domain: registers (and allocates) host memory.
pub struct CmaMd {
    component: &'static str,
}

impl CmaMd {
    pub fn new(component: &'static str) -> Self {
        CmaMd { component }
    }

    pub fn unpack_rkey(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
        let k: CmaRkey = decode_payload(&entry.payload)?;
        if k.soft.base.checked_add(k.soft.len).is_none() {
            return Err(UctError::BadRkey(
                "region wraps around the address space".into(),
            ));
        }
        Ok(RemoteKey::new(component, entry.md.clone(), Box::new(k)))
    }

    fn handle(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        alloc: Option<(NonNull<u8>, Layout)>,
    ) -> MemHandle {
        let secret = crate::host::random_u64();
        let record = new_record(secret, addr, len as u64, access);
        let key = SoftRkey {
            region_id: record as *const Record as u64,
            secret,
            base: addr,
            len: len as u64,
            access,
        };
        MemRegion::new(
            addr,
            len,
            MemoryType::Host,
            access,
            MD_NAME,
            Box::new(CmaBacking { record, key, alloc }),
        )
    }
}

impl MemoryDomain for CmaMd {
    fn name(&self) -> &str {
        MD_NAME
    }

    fn component(&self) -> &str {
        self.component
    }

    fn attrs(&self) -> MdAttrs {
        MdAttrs {
            flags: MdFlags::ALLOC | MdFlags::REG | MdFlags::NEED_RKEY,
            alloc_mem_types: vec![MemoryType::Host],
            reg_mem_types: vec![MemoryType::Host],
            export_mem_types: vec![],
            detect_mem_types: vec![],
            max_alloc: isize::MAX as u64,
            rkey_packed_size: 64,
            reg_cost: RegCost {
                overhead_ns: 50.0,
                per_byte_ns: 0.0,
            },
            system_device: None,
        }
    }

    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        if mem_type != MemoryType::Host {
            return Err(UctError::MemoryTypeUnsupported {
                mem_type,
                owner: "memory domain cma".into(),
                hint: "it handles host memory only; device memory needs an RDMA NIC with DMA-buf support".into(),
            });
        }
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| UctError::InvalidParam(format!("cannot allocate {len} bytes")))?;
        // SAFETY: non-zero size.
        let p = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| UctError::NoMemory(format!("allocating {len} bytes")))?;
        Ok(self.handle(p.as_ptr() as u64, len, access, Some((p, layout))))
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        if addr.is_null() {
            return Err(UctError::InvalidParam(
                "cannot register a null address".into(),
            ));
        }
        Ok(self.handle(addr as u64, len, access, None))
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let b = mem
            .backing()
            .as_any()
            .downcast_ref::<CmaBacking>()
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "memory handle belongs to memory domain {}, not cma; register it with cma",
                    mem.md_name()
                ))
            })?;
        Ok(RkeyEntry {
            component: self.component.into(),
            md: MD_NAME.into(),
            payload: encode_payload(&CmaRkey {
                soft: b.key,
                pid: std::process::id(),
                record: b.record as *const Record as u64,
            })?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Checks an access against a record read from the owner.
pub(crate) fn check_record(
    r: &RecordImage,
    key: &CmaRkey,
    addr: u64,
    len: u64,
    needed: Access,
) -> Result<()> {
    if r.magic != MAGIC || r.state != LIVE {
        return Err(UctError::NoSuchRegion {
            region_id: key.soft.region_id,
        });
    }
    if r.secret != key.soft.secret {
        return Err(UctError::BadSecret);
    }
    if !(addr >= r.base
        && addr
            .checked_add(len)
            .is_some_and(|e| e <= r.base.saturating_add(r.len)))
    {
        return Err(UctError::OutOfRange {
            addr,
            len,
            base: r.base,
            region_len: r.len,
        });
    }
    let granted = Access::from_bits_truncate(r.access as u8);
    if !granted.contains(needed) {
        return Err(UctError::AccessDenied { needed, granted });
    }
    Ok(())
}
