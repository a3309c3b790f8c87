//! The IB memory domain: one per device, with its protection domain;
//! registers host memory (`ibv_reg_mr`) and DMA-buf fds
//! (`ibv_reg_dmabuf_mr`), and packs the keys peers use.

use std::any::Any;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

use rdma_sys::*;
use serde::{Deserialize, Serialize};
use uct_core::host_alloc::HostAlloc;
use uct_core::md::{MdAttrs, MdFlags, RegCost};
use uct_core::memory::MemBacking;
use uct_core::rkey::{decode_payload, encode_payload};
use uct_core::{
    Access, MemHandle, MemRegion, MemoryDomain, MemoryType, RemoteKey, Result, RkeyEntry, UctError,
};

use crate::device::DeviceInfo;
use crate::error::{errno, VerbsError, ENOTSUPP};
use crate::verbs::{Context, Mr, Pd};

/// NICs whose drivers register DMA-bufs.
pub const DMABUF_NICS: &str = "mlx5, efa, irdma, bnxt_re";

/// What an IB rkey carries: the NIC's key and the region, so the sender can
/// refuse an access outside it before the NIC does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IbRkey {
    pub rkey: u32,
    pub base: u64,
    pub len: u64,
    pub access: Access,
}

impl IbRkey {
    /// The sender-side check of an access.
    pub fn precheck(&self, addr: u64, len: u64, needed: Access) -> Result<()> {
        let in_range = addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.base.saturating_add(self.len));
        if !in_range {
            return Err(UctError::OutOfRange {
                addr,
                len,
                base: self.base,
                region_len: self.len,
            });
        }
        if !self.access.contains(needed) {
            return Err(UctError::AccessDenied {
                needed,
                granted: self.access,
            });
        }
        Ok(())
    }
}

/// A registration: the MR, and the memory when the MD allocated it.
///
/// The fields are dropped in declaration order, and that order is the
/// point: the NIC's registration goes first, and only then the memory it
/// covered (our host allocation, or the exporter's handle of device memory,
/// whose allocation must outlive every MR made from its DMA-buf). Do not
/// reorder them.
pub struct IbBacking {
    mr: Mr,
    _alloc: Option<HostAlloc>,
    /// The DMA-buf memory registered keeps its exporter's handle alive.
    _owner: Option<MemHandle>,
}

impl IbBacking {
    /// A registration of memory `owner` holds (device memory), which the
    /// backing keeps alive until after the MR is gone.
    pub(crate) fn of_owner(mr: Mr, owner: MemHandle) -> IbBacking {
        IbBacking {
            mr,
            _alloc: None,
            _owner: Some(owner),
        }
    }

    /// The local key of the registration.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// The remote key of the registration.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

impl Drop for IbBacking {
    fn drop(&mut self) {
        // Deregister first; if the NIC keeps the MR, its memory is leaked
        // rather than freed under it (Mr::deregister).
        self.mr.deregister((self._alloc.take(), self._owner.take()));
    }
}

impl MemBacking for IbBacking {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An IB/RoCE device as a memory domain.
pub struct IbMd {
    component: &'static str,
    info: DeviceInfo,
    pd: Arc<Pd>,
    dmabuf: bool,
}

pub(crate) fn verbs_access(access: Access) -> i32 {
    // Remote write and atomics need local write, by the verbs rules.
    let mut flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if access.contains(Access::REMOTE_READ) {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_ATOMIC) {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    flags as i32
}

/// Asks the device whether it registers DMA-bufs: with fd -1, EBADF means
/// the driver would try (supported), EOPNOTSUPP that it cannot.
fn probe_dmabuf(pd: &Pd) -> bool {
    // SAFETY: `pd` is a live PD (the caller holds it); with fd -1 the
    // driver cannot reach any memory, so the call only fails.
    let mr_ptr = unsafe {
        ibv_reg_dmabuf_mr(
            pd.as_ptr(),
            0,
            4096,
            0,
            -1,
            verbs_access(Access::LOCAL_WRITE),
        )
    };
    if !mr_ptr.is_null() {
        // SAFETY: `mr_ptr` is an MR the call above just registered and nobody
        // else has seen: deregistered once, here.
        unsafe { ibv_dereg_mr(mr_ptr) };
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
}

impl IbMd {
    /// Opens device `name` as a memory domain.
    pub fn open(component: &'static str, name: &str) -> Result<IbMd> {
        let ctx = Context::open(name)?;
        let info = DeviceInfo::query(&ctx).map_err(|e| e.on(name))?;
        let pd = Pd::new(&ctx)?;
        let dmabuf = probe_dmabuf(&pd);
        log::debug!(
            "ib: {name}: DMA-buf registration {}",
            if dmabuf { "supported" } else { "not supported" }
        );
        Ok(IbMd {
            component,
            info,
            pd,
            dmabuf,
        })
    }

    /// What the device offers.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The protection domain every registration of this MD uses.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Whether the device's driver registers DMA-bufs.
    pub fn supports_dmabuf(&self) -> bool {
        self.dmabuf
    }

    /// The lkey of a handle registered with this MD.
    pub fn lkey_of(&self, mem: &MemHandle) -> Result<u32> {
        mem.backing()
            .as_any()
            .downcast_ref::<IbBacking>()
            .filter(|_| mem.md_name() == self.info.name)
            .map(IbBacking::lkey)
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "memory handle belongs to memory domain {}, not {}; register it with {}",
                    mem.md_name(),
                    self.info.name,
                    self.info.name
                ))
            })
    }

    /// Unpacks a key packed by an IB MD.
    pub fn unpack_rkey(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
        let key: IbRkey = decode_payload(&entry.payload)?;
        if key.base.checked_add(key.len).is_none() {
            return Err(UctError::BadRkey(
                "region wraps around the address space".into(),
            ));
        }
        Ok(RemoteKey::new(component, entry.md.clone(), Box::new(key)))
    }

    /// Wraps a registration in a memory handle.
    ///
    /// # Safety
    ///
    /// Where `mem_type` is host-accessible, `[addr, addr + len)` is host
    /// memory that stays valid as long as `backing` (which owns it, or its
    /// owner's handle, or the caller of `register` vouched for it).
    pub(crate) unsafe fn handle(
        &self,
        backing: IbBacking,
        addr: u64,
        len: usize,
        mem_type: MemoryType,
        access: Access,
    ) -> MemHandle {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            MemRegion::new(
                addr,
                len,
                mem_type,
                access,
                self.info.name.clone(),
                Box::new(backing),
            )
        }
    }
}

impl MemoryDomain for IbMd {
    fn name(&self) -> &str {
        &self.info.name
    }

    fn component(&self) -> &str {
        self.component
    }

    fn attrs(&self) -> MdAttrs {
        let mut flags = MdFlags::ALLOC | MdFlags::REG | MdFlags::NEED_RKEY;
        let mut reg = vec![MemoryType::Host];
        if self.dmabuf {
            flags |= MdFlags::REG_DMABUF;
            reg.extend([MemoryType::DmaBuf, MemoryType::Gaudi, MemoryType::Cuda]);
        } else {
            // Device memory a peer-memory module serves (nvidia_peermem).
            reg.extend(
                MemoryType::ALL
                    .into_iter()
                    .filter(|&t| crate::peermem::loaded_for(t).is_some()),
            );
        }
        MdAttrs {
            flags,
            alloc_mem_types: vec![MemoryType::Host],
            reg_mem_types: reg,
            export_mem_types: vec![],
            detect_mem_types: vec![],
            max_alloc: 1 << 40,
            rkey_packed_size: 32,
            reg_cost: RegCost {
                overhead_ns: 16_000.0,
                per_byte_ns: 0.06,
            },
            system_device: self.info.pci.clone(),
        }
    }

    fn description(&self) -> Option<String> {
        let peer: Vec<&str> = MemoryType::ALL
            .into_iter()
            .filter_map(crate::peermem::loaded_for)
            .collect();
        let nic = match &self.info.pci {
            Some(pci) => format!("RDMA NIC at {pci}"),
            None => "RDMA device without a PCI device (software)".to_string(),
        };
        Some(format!(
            "{nic}; {}",
            crate::peermem::describe(self.dmabuf, &peer)
        ))
    }

    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        if mem_type != MemoryType::Host {
            return Err(UctError::MemoryTypeUnsupported {
                mem_type,
                owner: format!("memory domain {}", self.info.name),
                hint:
                    "allocate device memory with the device's MD (gaudi0, ...) and register it here"
                        .into(),
            });
        }
        let mem = HostAlloc::new(len)?;
        // SAFETY: the allocation lives in the handle as long as the MR.
        let mr = unsafe { self.reg_host(mem.as_ptr(), len, access) }?;
        let addr = mem.as_ptr() as u64;
        let backing = IbBacking {
            mr,
            _alloc: Some(mem),
            _owner: None,
        };
        // SAFETY: the allocation lives in the backing.
        Ok(unsafe { self.handle(backing, addr, len, MemoryType::Host, access) })
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        // SAFETY: forwarded contract: the memory outlives the handle.
        let mr = unsafe { self.reg_host(addr, len, access) }?;
        let backing = IbBacking {
            mr,
            _alloc: None,
            _owner: None,
        };
        // SAFETY: forwarded contract of `register`.
        Ok(unsafe { self.handle(backing, addr as u64, len, MemoryType::Host, access) })
    }

    fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemHandle> {
        let mr = self.reg_dmabuf(fd, offset, len, iova, access)?;
        // No owner's handle here: the MR's own reference on the DMA-buf
        // keeps the exporter's memory, which an exporter does not free
        // under an open DMA-buf (habanalabs refuses the unmap; md-gaudi
        // defers its free until the release).
        let backing = IbBacking {
            mr,
            _alloc: None,
            _owner: None,
        };
        // SAFETY: DMA-buf memory is not host-accessible through the iova.
        Ok(unsafe { self.handle(backing, iova, len, MemoryType::DmaBuf, access) })
    }

    fn register_handle(&self, mem: &MemHandle, access: Access) -> Result<MemHandle> {
        if mem.mem_type().is_host_accessible() {
            let host = mem.host_ptr(0, mem.len())?;
            // SAFETY: the new handle keeps `mem` alive, so the memory stays.
            let mr = unsafe { self.reg_host(host, mem.len(), access) }?;
            let backing = IbBacking {
                mr,
                _alloc: None,
                _owner: Some(mem.clone()),
            };
            // SAFETY: the backing holds `mem`, which keeps the memory.
            return Ok(unsafe {
                self.handle(backing, mem.addr(), mem.len(), mem.mem_type(), access)
            });
        }
        // Device memory: through its owner's DMA-buf, or a peer-memory
        // module (device_mem.rs).
        self.register_device(mem, access)
    }

    fn refusal(&self, mem_type: MemoryType) -> Option<String> {
        (!mem_type.is_host_accessible()
            && !self.dmabuf
            && crate::peermem::loaded_for(mem_type).is_none())
        .then(|| self.dmabuf_refusal(mem_type).to_string())
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let backing = mem
            .backing()
            .as_any()
            .downcast_ref::<IbBacking>()
            .filter(|_| mem.md_name() == self.info.name)
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "memory handle belongs to memory domain {}, not {}",
                    mem.md_name(),
                    self.info.name
                ))
            })?;
        Ok(RkeyEntry {
            component: self.component.into(),
            md: self.info.name.clone(),
            payload: encode_payload(&IbRkey {
                rkey: backing.rkey(),
                base: mem.addr(),
                len: mem.len() as u64,
                access: mem.access(),
            })?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl IbMd {
    /// # Safety
    /// `addr..addr+len` must stay valid host memory while the MR lives.
    unsafe fn reg_host(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: the PD is live (self holds it) and the caller promises
        // that the memory stays valid while the MR lives.
        let mr_ptr = unsafe {
            ibv_reg_mr(
                self.pd.as_ptr(),
                addr as *mut libc::c_void,
                len.max(1),
                verbs_access(access),
            )
        };
        // Read before anything (the message's format!) can change it.
        let errno = errno();
        // SAFETY: `mr_ptr` is null or an MR just registered on self.pd that
        // nothing else owns.
        let mr = unsafe {
            Mr::from_raw(mr_ptr, &self.pd, errno, || {
                format!("ibv_reg_mr of {len} bytes on {}", self.info.name)
            })
        };
        Ok(mr?)
    }

    /// The one message for device memory on a NIC without DMA-buf import.
    pub(crate) fn dmabuf_refusal(&self, mem_type: MemoryType) -> UctError {
        UctError::MemoryTypeUnsupported {
            mem_type,
            owner: format!("NIC {}", self.info.name),
            hint: format!(
                "this NIC cannot import DMA-buf (its driver refuses ibv_reg_dmabuf_mr); use a NIC that can: {DMABUF_NICS}"
            ),
        }
    }

    fn reg_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr> {
        if !self.dmabuf {
            return Err(UctError::Unsupported {
                transport: self.info.name.clone(),
                operation: format!(
                    "registering DMA-buf memory: this NIC cannot import DMA-buf (its driver refuses ibv_reg_dmabuf_mr); use a NIC that can: {DMABUF_NICS}"
                ),
            });
        }
        self.try_reg_dmabuf(fd, offset, len, iova, access)
            .map_err(|e| {
                if e.errno == libc::EOPNOTSUPP || e.errno == ENOTSUPP {
                    // The NIC passed the probe but refuses this exporter: the
                    // same kind of error as a NIC without DMA-buf import, so
                    // that callers name the NICs that can.
                    UctError::Unsupported {
                        transport: self.info.name.clone(),
                        operation: format!(
                            "registering DMA-buf memory: {e}; use a NIC that can: {DMABUF_NICS}"
                        ),
                    }
                } else {
                    e.into()
                }
            })
    }

    /// `ibv_reg_dmabuf_mr`, its failure with the errno as the call left it.
    pub(crate) fn try_reg_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> std::result::Result<Mr, VerbsError> {
        // SAFETY: the PD is live (self holds it) and the fd is borrowed, so
        // open, for the call; the driver takes its own reference on the
        // DMA-buf, so the MR does not depend on our fd.
        let mr_ptr = unsafe {
            ibv_reg_dmabuf_mr(
                self.pd.as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                verbs_access(access),
            )
        };
        // Read first: the message below is formatted (an allocation, which
        // may change errno) only on failure, and after this.
        let errno = errno();
        let call = || {
            format!(
                "ibv_reg_dmabuf_mr(fd {}, offset {offset}, {len} bytes, iova {iova:#x})",
                fd.as_raw_fd()
            )
        };
        // SAFETY: `mr_ptr` is null or an MR just registered on self.pd
        // that nothing else owns.
        unsafe { Mr::from_raw(mr_ptr, &self.pd, errno, call) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::fakes::{busy, fake_mr, fake_pd};

    /// Finding 12.7 through IbBacking, what a memory handle drops: with a
    /// failing ibv_dereg_mr, the allocation the MR covers stays mapped
    /// (without IbBacking's Drop, the field would be freed after the MR).
    #[test]
    fn a_backing_whose_dereg_fails_keeps_its_memory_mapped() {
        let len = 4 << 20;
        let mem = HostAlloc::new(len).expect("alloc");
        let addr = mem.as_ptr();
        let pd = fake_pd();
        // SAFETY: a fake MR of a fake PD, deregistered by `busy` only.
        let mr = unsafe { Mr::wrap(fake_mr(), &pd, busy) };
        drop(IbBacking {
            mr,
            _alloc: Some(mem),
            _owner: None,
        });
        let mut pages = vec![0u8; len / 4096];
        // SAFETY: mincore only reports on the range; it writes `pages`,
        // which has one byte per page of it.
        let r = unsafe { libc::mincore(addr.cast(), len, pages.as_mut_ptr()) };
        assert_eq!(
            r,
            0,
            "the memory under an MR the NIC kept was unmapped: {}",
            std::io::Error::last_os_error()
        );
    }
}
