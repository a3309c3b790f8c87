//! The cma transport: put and get straight into a peer process's registered
//! memory with `process_vm_writev` / `process_vm_readv`, no shared mapping
//! and no copy in between. Before each access the initiator reads the
//! owner's registration record (state, secret, range, rights) out of the
//! owner's memory, so a freed region, a forged key, an access outside the
//! range or without the right is refused. cma has no active messages and no
//! atomics of its own.

mod ep;
mod iface;
pub mod records;
mod vm;

use std::any::Any;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use uct_core::host_alloc::HostAlloc;

use crate::posix::segment::Mapping;
use uct_core::md::{MdAttrs, MdFlags, RegCost};
use uct_core::memory::MemBacking;
use uct_core::region_table::SoftRkey;
use uct_core::rkey::{decode_payload, encode_payload};
use uct_core::{
    Access, MemHandle, MemRegion, MemoryDomain, MemoryType, RemoteKey, Result, RkeyEntry, UctError,
};

pub use iface::CmaIface;

pub const MD_NAME: &str = "cma";

/// What a cma rkey carries; it begins with a [`SoftRkey`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CmaRkey {
    pub soft: SoftRkey,
    pub pid: u32,
    /// The owner's record table and the record of this region.
    pub table: String,
    pub index: u32,
    /// The table, once an endpoint has mapped it.
    #[serde(skip)]
    pub(crate) mapping: OnceLock<Arc<Mapping>>,
}

struct CmaBacking {
    slot: Option<records::Slot>,
    key: SoftRkey,
    alloc: Option<HostAlloc>,
}

impl MemBacking for CmaBacking {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CmaBacking {
    fn drop(&mut self) {
        // Peers check the record before every access: mark it dead first.
        drop(self.slot.take());
        drop(self.alloc.take());
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
        alloc: Option<HostAlloc>,
    ) -> Result<MemHandle> {
        let secret = crate::host::random_u64();
        let slot = records::publish(secret, addr, len as u64, access)?;
        let key = SoftRkey {
            region_id: crate::host::random_u64() >> 16,
            secret,
            base: addr,
            len: len as u64,
            access,
        };
        Ok(MemRegion::new(
            addr,
            len,
            MemoryType::Host,
            access,
            MD_NAME,
            Box::new(CmaBacking {
                slot: Some(slot),
                key,
                alloc,
            }),
        ))
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
        let mem = HostAlloc::new(len)?;
        self.handle(mem.as_ptr() as u64, len, access, Some(mem))
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        if addr.is_null() {
            return Err(UctError::InvalidParam(
                "cannot register a null address".into(),
            ));
        }
        self.handle(addr as u64, len, access, None)
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
        let slot = b
            .slot
            .as_ref()
            .ok_or_else(|| UctError::InvalidParam("the region is being deregistered".into()))?;
        Ok(RkeyEntry {
            component: self.component.into(),
            md: MD_NAME.into(),
            payload: encode_payload(&CmaRkey {
                soft: b.key,
                pid: std::process::id(),
                table: slot.table.clone(),
                index: slot.index,
                mapping: OnceLock::new(),
            })?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
