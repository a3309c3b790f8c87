//! The Gaudi memory domain: one per device. Allocates HBM (alloc, map,
//! DMA-buf export), answers memory queries with a DMA-buf fd the caller
//! owns, and detects its own addresses. The CPU cannot touch this memory;
//! a NIC reaches it through the DMA-buf.

use std::any::Any;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use uct_core::md::RegCost;
use uct_core::memory::MemBacking;
use uct_core::{
    Access, MdAttrs, MdFlags, MemHandle, MemInfo, MemRegion, MemoryDomain, MemoryType, Result,
    RkeyEntry, UctError,
};

use crate::device::{Device, EXPORT_FLAGS, PAGE};
use crate::error::GaudiError;
use crate::hlthunk::{AllocHandle, DeviceVa};

/// A live allocation, as the MD's query and detection see it.
struct Live {
    /// Bytes asked for.
    len: u64,
    dmabuf: Arc<OwnedFd>,
}

type LiveTable = Arc<Mutex<BTreeMap<u64, Live>>>;

fn table(live: &LiveTable) -> MutexGuard<'_, BTreeMap<u64, Live>> {
    live.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The memory domain of one Gaudi device.
pub struct GaudiMd {
    component: &'static str,
    dev: Arc<Device>,
    /// What the test double says it is, when hl-thunk is the simulator.
    simulated: Option<String>,
    live: LiveTable,
}

/// The state of one allocation. Dropping it closes the DMA-buf, unmaps and
/// frees, in that order.
struct GaudiAlloc {
    dev: Arc<Device>,
    /// The mapping's device address, the allocation's key in `live`.
    addr: u64,
    /// The mapping and the allocation; `None` only while dropping.
    mapped: Option<(DeviceVa, AllocHandle)>,
    /// `None` only while dropping.
    dmabuf: Option<Arc<OwnedFd>>,
    live: LiveTable,
}

fn dup(dev: &Device, va: u64, fd: &OwnedFd) -> Result<OwnedFd> {
    dev.hand_out(va, fd).map_err(|e| UctError::Device {
        device: dev.name.clone(),
        message: format!("cannot dup the DMA-buf fd: {e}; raise the open-file limit (ulimit -n)"),
        source: Some(e.into()),
    })
}

/// The answer to a query: a copy of the DMA-buf fd the caller owns,
/// recorded by the device (a deferred free is not tried while it is open).
fn info(dev: &Device, base: u64, len: u64, fd: &OwnedFd, offset: u64) -> Result<MemInfo> {
    Ok(MemInfo {
        mem_type: MemoryType::Gaudi,
        base,
        len: len as usize,
        system_device: Some(dev.bus_id.clone()),
        dmabuf: Some((dup(dev, base, fd)?, offset)),
    })
}

impl MemBacking for GaudiAlloc {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn query(&self, region: &MemRegion) -> Option<Result<MemInfo>> {
        let fd = self.dmabuf.as_ref()?;
        Some(info(&self.dev, self.addr, region.len() as u64, fd, 0))
    }
}

impl Drop for GaudiAlloc {
    fn drop(&mut self) {
        table(&self.live).remove(&self.addr);
        // Our DMA-buf fd goes first. The driver refuses to unmap (and so to
        // free) while any DMA-buf of the mapping is open: a NIC
        // registration made through `register_handle` holds this region,
        // and is gone by now, but an fd handed out by `query` may outlive
        // it. Then the allocation is deferred, and freed by a later
        // reclaim once that fd is closed.
        drop(self.dmabuf.take());
        if let Some((va, handle)) = self.mapped.take() {
            if let Err(e) = self.dev.unmap_and_free(va, handle) {
                log::warn!("{}: freeing {:#x}: {e}", self.dev.name, self.addr);
            }
        }
        self.dev.reclaim_due();
    }
}

impl GaudiMd {
    pub fn new(component: &'static str, dev: Device, simulated: Option<String>) -> GaudiMd {
        GaudiMd {
            component,
            dev: Arc::new(dev),
            simulated,
            live: Arc::default(),
        }
    }

    /// The device, for callers that need hl-thunk's calls one by one.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    pub fn is_simulated(&self) -> bool {
        self.simulated.is_some()
    }

    /// Allocations of this MD not yet freed.
    pub fn live_allocations(&self) -> usize {
        table(&self.live).len()
    }

    /// Allocations whose handles are gone but which an open DMA-buf (an fd
    /// from `query`, a NIC registration) still holds; freed by
    /// [`reclaim`](Self::reclaim) after its release.
    pub fn deferred_frees(&self) -> usize {
        self.dev.deferred()
    }

    /// Frees the deferred allocations whose DMA-bufs have been released,
    /// asking the driver now about every one with no fd handed out open
    /// (every alloc and free does this too, but waits between refused
    /// retries); returns how many are still held.
    pub fn reclaim(&self) -> usize {
        self.dev.reclaim()
    }

    fn alloc_gaudi(
        &self,
        len: usize,
        access: Access,
    ) -> std::result::Result<MemHandle, GaudiError> {
        // What released DMA-bufs no longer hold goes back first.
        self.dev.reclaim_due();
        let size = (len as u64).next_multiple_of(PAGE);
        let handle = self.dev.alloc(size, 0)?;
        let va = match self.dev.map(&handle) {
            Ok(va) => va,
            Err(e) => {
                if let Err((_, free)) = self.dev.free(handle) {
                    log::warn!("{}: freeing after a failed map: {free}", self.dev.name);
                }
                return Err(e);
            }
        };
        let dmabuf = match self.dev.export_dmabuf(&va, size.max(PAGE), 0, EXPORT_FLAGS) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                let addr = va.addr();
                if let Err(free) = self.dev.unmap_and_free(va, handle) {
                    log::warn!(
                        "{}: freeing {addr:#x} after a failed export: {free}",
                        self.dev.name
                    );
                }
                return Err(e);
            }
        };
        let addr = va.addr();
        table(&self.live).insert(
            addr,
            Live {
                len: len as u64,
                dmabuf: dmabuf.clone(),
            },
        );
        let backing = GaudiAlloc {
            dev: self.dev.clone(),
            addr,
            mapped: Some((va, handle)),
            dmabuf: Some(dmabuf),
            live: self.live.clone(),
        };
        // SAFETY: Gaudi memory is not host-accessible; `addr` is a device
        // address the CPU never dereferences.
        Ok(unsafe {
            MemRegion::new(
                addr,
                len,
                MemoryType::Gaudi,
                access,
                self.dev.name.clone(),
                Box::new(backing),
            )
        })
    }

    /// The live allocation holding `[addr, addr+len)`: (base, its length).
    fn owner(&self, addr: u64, len: usize) -> Option<(u64, u64, Arc<OwnedFd>)> {
        let table = table(&self.live);
        let (&base, live) = table.range(..=addr).next_back()?;
        let end = addr.checked_add(len as u64)?;
        (end <= base + live.len).then(|| (base, live.len, live.dmabuf.clone()))
    }
}

impl MemoryDomain for GaudiMd {
    fn name(&self) -> &str {
        &self.dev.name
    }

    fn component(&self) -> &str {
        self.component
    }

    fn attrs(&self) -> MdAttrs {
        MdAttrs {
            flags: MdFlags::ALLOC | MdFlags::EXPORT_DMABUF | MdFlags::DETECT,
            alloc_mem_types: vec![MemoryType::Gaudi],
            reg_mem_types: vec![],
            export_mem_types: vec![MemoryType::Gaudi],
            detect_mem_types: vec![MemoryType::Gaudi],
            max_alloc: self.dev.dram_size,
            rkey_packed_size: 0,
            reg_cost: RegCost {
                overhead_ns: 0.0,
                per_byte_ns: 0.0,
            },
            system_device: Some(self.dev.bus_id.clone()),
        }
    }

    fn description(&self) -> Option<String> {
        let gib = self.dev.dram_size as f64 / (1u64 << 30) as f64;
        Some(match &self.simulated {
            Some(what) => format!(
                "{} at {}, {gib:.0} GiB DRAM; SIMULATED by {what}",
                self.dev.model, self.dev.bus_id
            ),
            None => format!(
                "{} at {}, {gib:.0} GiB DRAM",
                self.dev.model, self.dev.bus_id
            ),
        })
    }

    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        if mem_type != MemoryType::Gaudi {
            return Err(UctError::MemoryTypeUnsupported {
                mem_type,
                owner: format!("memory domain {}", self.dev.name),
                hint: "it allocates gaudi memory only; allocate host memory with a host MD".into(),
            });
        }
        Ok(self.alloc_gaudi(len, access)?)
    }

    fn query(&self, addr: u64, len: usize) -> Result<MemInfo> {
        let (base, alen, fd) = self.owner(addr, len).ok_or_else(|| GaudiError::NotOwned {
            device: self.dev.name.clone(),
            addr,
            len: len as u64,
        })?;
        info(&self.dev, base, alen, &fd, addr - base)
    }

    fn detect_mem_type(&self, addr: u64, len: usize) -> Result<MemoryType> {
        match self.owner(addr, len) {
            Some(_) => Ok(MemoryType::Gaudi),
            None => Err(GaudiError::NotOwned {
                device: self.dev.name.clone(),
                addr,
                len: len as u64,
            }
            .into()),
        }
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        Err(UctError::MemoryTypeUnsupported {
            mem_type: mem.mem_type(),
            owner: format!(
                "memory domain {} (it has no remote access of its own)",
                self.dev.name
            ),
            hint: "register the memory with a NIC's MD (register_handle) and pack that MD's rkey"
                .into(),
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
