//! What a CUDA memory handle holds: its entry in the region table (what
//! the cuda_copy transport checks remote accesses against), the memory
//! itself (device memory to free, host memory to unpin), and, for device
//! memory, the DMA-buf export a NIC asks for through `query`.
//!
//! Dropping a handle takes its table entry out first (new copies can no
//! longer reach it), then waits for copies already queued on any GPU
//! (a copy into this memory from another handle's endpoint may still
//! run), then frees or unpins it.

use std::any::Any;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use uct_core::host_alloc::HostAlloc;
use uct_core::memory::MemBacking;
use uct_core::region_table::{RegionTable, Registration, SoftRkey};
use uct_core::{MemHandle, MemInfo, MemRegion, MemoryType, Result, UctError};

use crate::device::Device;
use crate::error::CudaError;
use crate::export::{export_range, flag_attempts, host_page_size, ExportRange};

/// Device ranges an MD knows (allocated or registered): base -> length.
pub(crate) type Live = Arc<Mutex<BTreeMap<u64, u64>>>;

pub(crate) fn live(map: &Live) -> MutexGuard<'_, BTreeMap<u64, u64>> {
    map.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the memory domains of one driver share.
pub struct Shared {
    /// Every GPU: freeing waits for the copies queued on any of them.
    pub devices: Vec<Arc<Device>>,
    /// Every registration of every MD; remote accesses are checked here.
    pub table: Arc<RegionTable>,
    /// `UCT_CUDA_DMABUF_PCIE`: ask for the PCIe mapping type first.
    pub dmabuf_pcie: bool,
}

/// The memory a handle stands for.
pub(crate) enum Memory {
    /// Allocated with cuMemAlloc: freed with cuMemFree.
    DeviceAlloc(u64),
    /// Device memory someone else owns (the application, another handle).
    DeviceRegistered,
    /// Allocated here and pinned (unless it was pinned already).
    HostAlloc { alloc: HostAlloc, pinned: bool },
    /// Host memory someone else owns, pinned here unless it was already.
    HostRegistered { addr: usize, pinned: bool },
}

/// The backing of every handle md-cuda makes.
pub struct CudaBacking {
    pub(crate) reg: Option<Registration>,
    pub(crate) memory: Option<Memory>,
    pub(crate) dev: Arc<Device>,
    pub(crate) shared: Arc<Shared>,
    /// The MD's live map and this handle's base in it, for device memory.
    pub(crate) live: Option<(Live, u64)>,
    /// The handle whose memory this one registers, kept alive by it.
    pub(crate) _owner: Option<MemHandle>,
}

impl CudaBacking {
    /// The key a peer (in this process) uses to reach the memory.
    pub fn key(&self) -> Option<&SoftRkey> {
        self.reg.as_ref().map(Registration::key)
    }

    /// The GPU whose MD made this handle.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }
}

/// What a DMA-buf of `range` is: `base` and `len` are what the fd covers
/// (the exported range), and the offset is the queried address's in it, so
/// that `base + offset` is that address (MemInfo's contract).
fn exported(range: &ExportRange, fd: OwnedFd, bus_id: &str) -> MemInfo {
    MemInfo {
        mem_type: MemoryType::Cuda,
        base: range.base,
        len: range.size as usize,
        system_device: Some(bus_id.to_string()),
        dmabuf: Some((fd, range.offset)),
    }
}

/// A DMA-buf of the page-aligned range around `[addr, addr + len)` of
/// `dev`'s memory, with the buffer's offset in it; the caller owns the fd.
pub(crate) fn export(dev: &Device, shared: &Shared, addr: u64, len: u64) -> Result<MemInfo> {
    if !dev.dmabuf {
        return Err(CudaError::ExportUnsupported {
            device: dev.name.clone(),
        }
        .into());
    }
    let range = export_range(addr, len, host_page_size()).ok_or(CudaError::BadRange {
        device: dev.name.clone(),
        addr,
        len,
    })?;
    let _in = dev.enter()?;
    let attempts = flag_attempts(shared.dmabuf_pcie);
    let mut last = None;
    for (i, &flags) in attempts.iter().enumerate() {
        match dev
            .driver()
            .dmabuf_export(range.base, range.size as usize, flags)
        {
            Ok(fd) => {
                if i > 0 {
                    log::info!(
                        "{}: DMA-buf exported without the PCIe mapping flag",
                        dev.name
                    );
                }
                return Ok(exported(&range, fd, &dev.bus_id));
            }
            Err(e) => {
                if i + 1 < attempts.len() {
                    log::info!("{}: {e}; trying again without the flag", dev.name);
                }
                last = Some(e);
            }
        }
    }
    Err(last
        .map(UctError::from)
        .unwrap_or_else(|| UctError::InvalidParam("no DMA-buf export was attempted".into())))
}

impl MemBacking for CudaBacking {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn query(&self, region: &MemRegion) -> Option<Result<MemInfo>> {
        match self.memory.as_ref()? {
            Memory::DeviceAlloc(_) | Memory::DeviceRegistered => Some(export(
                &self.dev,
                &self.shared,
                region.addr(),
                region.len() as u64,
            )),
            Memory::HostAlloc { .. } | Memory::HostRegistered { .. } => None,
        }
    }
}

impl Drop for CudaBacking {
    fn drop(&mut self) {
        if let Some((map, base)) = self.live.take() {
            live(&map).remove(&base);
        }
        // No new copy can reach the memory once its entry is gone; taking
        // it out waits for posts holding the table's lock.
        drop(self.reg.take());
        for d in &self.shared.devices {
            d.quiesce();
        }
        let drv = self.dev.driver();
        let freed = match self.memory.take() {
            Some(Memory::DeviceAlloc(ptr)) => self.dev.enter().and_then(|_in| {
                // SAFETY: `ptr` came from cuMemAlloc in this backing, is
                // freed once, here, and nothing uses it any more: its table
                // entry is gone, queued copies have finished (quiesce), and
                // NIC registrations hold this handle, so they are gone.
                unsafe { drv.mem_free(ptr) }
            }),
            Some(Memory::HostAlloc { alloc, pinned }) => {
                let r = if pinned {
                    self.dev.enter().and_then(|_in| {
                        // SAFETY: pinned by this backing; no copy uses it
                        // any more (as above).
                        unsafe { drv.host_unregister(alloc.as_ptr()) }
                    })
                } else {
                    Ok(())
                };
                drop(alloc);
                r
            }
            Some(Memory::HostRegistered { addr, pinned: true }) => {
                self.dev.enter().and_then(|_in| {
                    // SAFETY: pinned by this backing; no copy uses it any
                    // more (as above).
                    unsafe { drv.host_unregister(addr as *mut u8) }
                })
            }
            Some(Memory::HostRegistered { pinned: false, .. })
            | Some(Memory::DeviceRegistered)
            | None => Ok(()),
        };
        if let Err(e) = freed {
            log::error!("{}: releasing memory: {e}", self.dev.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_answers_with_what_the_fd_covers() {
        let (addr, len) = (0x7f00_0020_1234u64, 10_000u64);
        let range = export_range(addr, len, 4096).expect("a range");
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").expect("/dev/null"));
        let info = exported(&range, fd, "0000:3b:00.0");
        let (_, offset) = info.dmabuf.as_ref().expect("a DMA-buf");
        assert_eq!(
            info.base + offset,
            addr,
            "base + offset is the queried address"
        );
        assert_eq!(info.base % 4096, 0);
        assert!(
            info.base + info.len as u64 >= addr + len,
            "the fd covers the bytes asked"
        );
        assert_eq!((info.base, info.len as u64), (range.base, range.size));
    }
}
