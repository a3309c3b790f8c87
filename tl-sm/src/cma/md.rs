//! The cma memory domain: registers (and allocates) host memory, and
//! publishes each registration as a record in this process's record table
//! ([`records`](super::records)), which peers check before every transfer.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use uct_core::host_alloc::HostAlloc;
use uct_core::md::{MdAttrs, MdFlags, RegCost};
use uct_core::memory::MemBacking;
use uct_core::region_table::SoftRkey;
use uct_core::rkey::encode_payload;
use uct_core::{
    Access, MemHandle, MemRegion, MemoryDomain, MemoryType, Result, RkeyEntry, UctError,
};

use super::records::{self, PeerTable};
use crate::rkey::{backing_of, new_soft_key, SmRkey};

/// The memory domain's name.
pub const MD_NAME: &str = "cma";

/// What a cma rkey carries; it begins with a [`SoftRkey`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CmaRkey {
    /// Region id, secret, the owner's range and rights.
    pub soft: SoftRkey,
    /// The owner's process id.
    pub pid: u32,
    /// The owner's record table (a `/proc/<pid>/fd/<fd>` path).
    pub table: String,
    /// The record of this region in that table.
    pub index: u32,
    /// The table, once an endpoint has mapped it.
    #[serde(skip)]
    pub(crate) mapping: OnceLock<Arc<PeerTable>>,
}

impl SmRkey for CmaRkey {
    fn soft(&self) -> &SoftRkey {
        &self.soft
    }
}

/// A registration: its published record, its key, and the memory when the
/// MD allocated it.
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
        // Peers check the record before every access: mark it dead and wait
        // for the accesses in flight before the memory goes. Memory the MD
        // allocated that a peer may still write is parked with the retired
        // record, and freed once no live peer counts it.
        let alloc = self.alloc.take();
        let Some(slot) = self.slot.as_mut() else {
            drop(alloc);
            return;
        };
        let parked = alloc.map(|mem| Box::new(mem) as Box<dyn Send>);
        if !slot.retire_with(super::component::peer_timeout(), parked) {
            log::error!(
                "cma: {} bytes at {:#x} stay out of use while a peer may still write them",
                self.key.len,
                self.key.base
            );
        }
    }
}

/// The cma memory domain: registers (and allocates) host memory.
pub struct CmaMd {
    component: &'static str,
}

impl CmaMd {
    /// The cma MD of component `component`.
    pub fn new(component: &'static str) -> Self {
        CmaMd { component }
    }

    /// Publishes a record for `len` bytes at `addr` and wraps it in a
    /// memory handle; `alloc` is the memory when this MD allocated it.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` is host memory that stays valid as long as the
    /// handle: `alloc` itself, or memory the caller of `register` vouched for.
    unsafe fn handle(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        alloc: Option<HostAlloc>,
    ) -> Result<MemHandle> {
        let secret = crate::host::random_u64();
        let slot = records::publish(secret, addr, len as u64, access)?;
        let key = new_soft_key(secret, addr, len, access);
        // SAFETY: forwarded from this function's contract.
        Ok(unsafe {
            MemRegion::new(
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
            )
        })
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
        // SAFETY: the allocation moves into the handle, which keeps it.
        unsafe { self.handle(mem.as_ptr() as u64, len, access, Some(mem)) }
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        if addr.is_null() {
            return Err(UctError::InvalidParam(
                "cannot register a null address".into(),
            ));
        }
        // SAFETY: forwarded contract of `register`: the memory outlives the
        // handle.
        unsafe { self.handle(addr as u64, len, access, None) }
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let backing = backing_of::<CmaBacking>(mem, MD_NAME, "register")?;
        let slot = backing
            .slot
            .as_ref()
            .ok_or_else(|| UctError::InvalidParam("the region is being deregistered".into()))?;
        Ok(RkeyEntry {
            component: self.component.into(),
            md: MD_NAME.into(),
            payload: encode_payload(&CmaRkey {
                soft: backing.key,
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
