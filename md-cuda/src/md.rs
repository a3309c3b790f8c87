//! The CUDA memory domain: one per GPU. Allocates device memory
//! (cuMemAlloc) and pinned host memory (cuMemHostRegister), registers
//! device pointers and host memory the application already has, exports
//! device memory as DMA-buf for a NIC (through `query`), tells the memory
//! type of any pointer, and packs the keys the cuda_copy transport checks.

use std::any::Any;
use std::sync::Arc;

use uct_core::host_alloc::HostAlloc;
use uct_core::md::RegCost;
use uct_core::rkey::encode_payload;
use uct_core::{
    Access, MdAttrs, MdFlags, MemHandle, MemInfo, MemRegion, MemoryDomain, MemoryType, Result,
    RkeyEntry, UctError,
};

use crate::backing::{self, live, CudaBacking, Live, Memory, Shared};
use crate::device::Device;
use crate::error::CudaError;
use crate::pointer::{self, Owner, PointerInfo, PointerKind};
use crate::result;

/// The memory domain of one GPU.
pub struct CudaMd {
    component: &'static str,
    dev: Arc<Device>,
    shared: Arc<Shared>,
    live: Live,
}

impl std::fmt::Debug for CudaMd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMd").field("device", &self.dev).finish()
    }
}

impl CudaMd {
    /// The MD of `dev`, one of the GPUs in `shared`.
    pub fn new(component: &'static str, dev: Arc<Device>, shared: Arc<Shared>) -> CudaMd {
        CudaMd {
            component,
            dev,
            shared,
            live: Live::default(),
        }
    }

    /// The GPU.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// What the MDs of this driver share (the region table, every GPU).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What the driver says `addr` is. No context is entered: with
    /// unified addressing cuPointerGetAttributes answers for any address
    /// without one, so detecting memory (even a host pointer's, for every
    /// GPU's MD) never creates a primary context.
    pub fn pointer_info(&self, addr: u64) -> Result<PointerInfo> {
        let drv = self.dev.driver();
        let (rc, slots) = drv.pointer_attributes(addr, pointer::ATTRS);
        pointer::decode(rc, &slots).map_err(|code| {
            let call = || format!("cuPointerGetAttributes({addr:#x}) for {}", self.dev.name);
            match drv.check(code, call) {
                Err(e) => e.into(),
                Ok(()) => UctError::InvalidParam(format!(
                    "cuPointerGetAttributes({addr:#x}) for {}: a success read as a failure",
                    self.dev.name
                )),
            }
        })
    }

    /// Whose memory `[addr, +len)` is, for this GPU: see [`pointer::owner`].
    fn owner(&self, info: &PointerInfo, addr: u64, len: usize) -> Result<Owner> {
        let opened: Vec<i32> = self.shared.devices.iter().map(|d| d.ordinal).collect();
        Ok(pointer::owner(
            info,
            addr,
            len as u64,
            &self.dev.name,
            self.dev.ordinal,
            &opened,
        )?)
    }

    /// Device memory of this GPU at `[addr, addr + len)`, inside one
    /// allocation the driver names.
    fn check_own_device(&self, info: &PointerInfo, addr: u64, len: usize) -> Result<()> {
        match self.owner(info, addr, len)? {
            Owner::This => Ok(()),
            Owner::Host => Err(CudaError::NotOwned {
                device: self.dev.name.clone(),
                addr,
                len: len as u64,
            }
            .into()),
        }
    }

    /// A handle over `memory` at `[addr, +len)`, entered in the table.
    ///
    /// # Safety
    /// For host memory, `[addr, addr + len)` is mapped host memory that
    /// stays so as long as the handle (which owns it, or whose caller or
    /// owner handle vouches for it).
    unsafe fn handle(
        &self,
        memory: Memory,
        addr: u64,
        len: usize,
        access: Access,
        owner: Option<MemHandle>,
    ) -> MemHandle {
        let device = matches!(memory, Memory::DeviceAlloc(_) | Memory::DeviceRegistered);
        let live = device.then(|| {
            live(&self.live).insert(addr, len as u64);
            (self.live.clone(), addr)
        });
        let backing = CudaBacking {
            reg: Some(self.shared.table.insert(addr, len as u64, access)),
            memory: Some(memory),
            dev: self.dev.clone(),
            shared: self.shared.clone(),
            live,
            _owner: owner,
        };
        let mem_type = if device {
            MemoryType::Cuda
        } else {
            MemoryType::Host
        };
        // SAFETY: forwarded from this function's contract; device memory
        // is never dereferenced by the CPU.
        unsafe {
            MemRegion::new(
                addr,
                len,
                mem_type,
                access,
                self.dev.name.clone(),
                Box::new(backing),
            )
        }
    }

    /// Pins `[ptr, ptr + len)`; `Ok(false)` where it was pinned already.
    ///
    /// # Safety
    /// The range is mapped host memory for as long as it stays pinned.
    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<bool> {
        let _in = self.dev.enter()?;
        // SAFETY: forwarded contract.
        match unsafe { self.dev.driver().host_register(ptr, len) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(result::HOST_MEMORY_ALREADY_REGISTERED) => {
                log::debug!(
                    "{}: {ptr:p} was pinned already; used as it is",
                    self.dev.name
                );
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Registers the device memory of this GPU at `[addr, +len)`, owned by
    /// someone else (kept alive by `owner` where there is one).
    fn register_device(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        owner: Option<MemHandle>,
    ) -> Result<MemHandle> {
        let info = self.pointer_info(addr)?;
        self.check_own_device(&info, addr, len)?;
        // SAFETY: device memory; the CPU never dereferences it.
        Ok(unsafe { self.handle(Memory::DeviceRegistered, addr, len, access, owner) })
    }

    fn zero(&self, len: usize) -> Result<()> {
        if len == 0 {
            return Err(CudaError::ZeroSize {
                device: self.dev.name.clone(),
            }
            .into());
        }
        Ok(())
    }
}

impl MemoryDomain for CudaMd {
    fn name(&self) -> &str {
        &self.dev.name
    }

    fn component(&self) -> &str {
        self.component
    }

    fn attrs(&self) -> MdAttrs {
        let mut flags = MdFlags::ALLOC | MdFlags::REG | MdFlags::DETECT | MdFlags::NEED_RKEY;
        if self.dev.dmabuf {
            flags |= MdFlags::EXPORT_DMABUF;
        }
        MdAttrs {
            flags,
            alloc_mem_types: vec![MemoryType::Cuda, MemoryType::Host],
            reg_mem_types: vec![MemoryType::Host, MemoryType::Cuda],
            export_mem_types: if self.dev.dmabuf {
                vec![MemoryType::Cuda]
            } else {
                vec![]
            },
            detect_mem_types: vec![MemoryType::Cuda],
            max_alloc: self.dev.total_mem,
            rkey_packed_size: 48,
            reg_cost: RegCost {
                overhead_ns: 10_000.0,
                per_byte_ns: 0.01,
            },
            system_device: Some(self.dev.bus_id.clone()),
        }
    }

    fn description(&self) -> Option<String> {
        let gib = self.dev.total_mem as f64 / (1u64 << 30) as f64;
        Some(format!(
            "{} at {}, {gib:.1} GiB; DMA-buf export: {}",
            self.dev.model,
            self.dev.bus_id,
            if self.dev.dmabuf {
                "supported"
            } else {
                "not supported (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0, or a driver before CUDA 11.7)"
            }
        ))
    }

    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        self.zero(len)?;
        match mem_type {
            MemoryType::Cuda => {
                let ptr = {
                    let _in = self.dev.enter()?;
                    self.dev.driver().mem_alloc(len)?
                };
                // SAFETY: device memory; the CPU never dereferences it.
                Ok(unsafe { self.handle(Memory::DeviceAlloc(ptr), ptr, len, access, None) })
            }
            MemoryType::Host => {
                let alloc = HostAlloc::new(len)?;
                // SAFETY: the allocation is mapped; it moves into the
                // backing, which unpins it before freeing it.
                let pinned = unsafe { self.pin(alloc.as_ptr(), len) }?;
                let addr = alloc.as_ptr() as u64;
                // SAFETY: the allocation is kept by the backing.
                Ok(unsafe {
                    self.handle(Memory::HostAlloc { alloc, pinned }, addr, len, access, None)
                })
            }
            other => Err(UctError::MemoryTypeUnsupported {
                mem_type: other,
                owner: format!("memory domain {}", self.dev.name),
                hint: "it allocates cuda and (pinned) host memory".into(),
            }),
        }
    }

    /// Registers memory the caller owns: host memory (pinned with
    /// cuMemHostRegister unless it is already) or, unlike host-only MDs, a
    /// device pointer of this GPU (from cudaMalloc, PyTorch, ...), told
    /// apart with cuPointerGetAttributes.
    ///
    /// # Safety
    /// As [`MemoryDomain::register`]; for device memory: the allocation
    /// stays allocated until the handle and its clones are dropped.
    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        self.zero(len)?;
        if addr.is_null() {
            return Err(UctError::InvalidParam(
                "cannot register a null address".into(),
            ));
        }
        let at = addr as u64;
        let info = self.pointer_info(at)?;
        let pinned = match info.kind {
            PointerKind::Device | PointerKind::Managed => {
                return self.register_device(at, len, access, None)
            }
            PointerKind::PinnedHost => false,
            // SAFETY: forwarded contract: mapped host memory.
            PointerKind::NotCuda => unsafe { self.pin(addr, len) }?,
        };
        let memory = Memory::HostRegistered {
            addr: addr as usize,
            pinned,
        };
        // SAFETY: forwarded contract of `register`.
        Ok(unsafe { self.handle(memory, at, len, access, None) })
    }

    fn register_handle(&self, mem: &MemHandle, access: Access) -> Result<MemHandle> {
        let ours = mem.md_name() == self.dev.name
            && mem
                .backing()
                .as_any()
                .downcast_ref::<CudaBacking>()
                .is_some();
        if ours {
            return Ok(mem.clone());
        }
        match mem.mem_type() {
            MemoryType::Cuda => {
                self.register_device(mem.addr(), mem.len(), access, Some(mem.clone()))
            }
            MemoryType::Host => {
                let ptr = mem.host_ptr(0, mem.len())?;
                // SAFETY: `mem` keeps the memory mapped and moves into the
                // new handle as its owner.
                let pinned = unsafe { self.pin(ptr, mem.len()) }?;
                let memory = Memory::HostRegistered {
                    addr: ptr as usize,
                    pinned,
                };
                // SAFETY: the owner handle keeps the memory mapped.
                Ok(
                    unsafe {
                        self.handle(memory, mem.addr(), mem.len(), access, Some(mem.clone()))
                    },
                )
            }
            other => Err(UctError::MemoryTypeUnsupported {
                mem_type: other,
                owner: format!("memory domain {}", self.dev.name),
                hint: "it registers host and cuda memory".into(),
            }),
        }
    }

    fn query(&self, addr: u64, len: usize) -> Result<MemInfo> {
        let owned = {
            let map = live(&self.live);
            map.range(..=addr).next_back().is_some_and(|(&b, &l)| {
                addr.checked_add(len as u64)
                    .is_some_and(|end| end <= b.saturating_add(l))
            })
        };
        owned.then_some(()).ok_or_else(|| CudaError::NotOwned {
            device: self.dev.name.clone(),
            addr,
            len: len as u64,
        })?;
        // base and len are the exported range (page-aligned around the
        // bytes asked, inside their allocation): what the fd covers, with
        // the offset of `addr` in it.
        backing::export(&self.dev, &self.shared, addr, len as u64)
    }

    /// Host memory is `Ok(Host)`; this GPU's device memory is `Ok(Cuda)`;
    /// another opened GPU's is `InvalidParam` (its own MD claims it: the
    /// answer is dispatched by the driver's device ordinal); anything else
    /// (a driver failure, managed memory, memory past its allocation or of
    /// a GPU md-cuda did not open) is an error of another kind, which the
    /// caller must not take for host memory.
    fn detect_mem_type(&self, addr: u64, len: usize) -> Result<MemoryType> {
        let info = self.pointer_info(addr)?;
        Ok(match self.owner(&info, addr, len)? {
            Owner::Host => MemoryType::Host,
            Owner::This => MemoryType::Cuda,
        })
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let key = mem
            .backing()
            .as_any()
            .downcast_ref::<CudaBacking>()
            .and_then(CudaBacking::key)
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "memory handle belongs to memory domain {}, not {}; register it with {} first",
                    mem.md_name(),
                    self.dev.name,
                    self.dev.name
                ))
            })?;
        Ok(RkeyEntry {
            component: self.component.into(),
            md: self.dev.name.clone(),
            payload: encode_payload(key)?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
