//! The memory domain: allocates and registers memory, and packs the keys
//! peers use to reach it.

use std::any::Any;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::error::{Result, UctError};
use crate::memory::{Access, MemHandle, MemoryType};
use crate::rkey::RkeyEntry;

bitflags::bitflags! {
    /// What a memory domain can do.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MdFlags: u32 {
        /// Allocates memory itself.
        const ALLOC = 1 << 0;
        /// Registers memory the caller owns.
        const REG = 1 << 1;
        /// Registers DMA-buf fds.
        const REG_DMABUF = 1 << 2;
        /// Exports its memory as DMA-buf fds.
        const EXPORT_DMABUF = 1 << 3;
        /// Tells the memory type of an address.
        const DETECT = 1 << 4;
        /// Peers need an rkey to reach registered memory.
        const NEED_RKEY = 1 << 5;
    }
}

/// Cost of registering `len` bytes: `overhead_ns + len * per_byte_ns`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegCost {
    /// Fixed cost per registration, in nanoseconds.
    pub overhead_ns: f64,
    /// Cost per byte registered, in nanoseconds.
    pub per_byte_ns: f64,
}

/// What a memory domain is and can do.
#[derive(Debug, Clone)]
pub struct MdAttrs {
    /// What the MD can do.
    pub flags: MdFlags,
    /// Memory types it can allocate.
    pub alloc_mem_types: Vec<MemoryType>,
    /// Memory types it can register.
    pub reg_mem_types: Vec<MemoryType>,
    /// Memory types it can export as a DMA-buf.
    pub export_mem_types: Vec<MemoryType>,
    /// Memory types it can detect from a pointer.
    pub detect_mem_types: Vec<MemoryType>,
    /// Largest allocation or registration, in bytes.
    pub max_alloc: u64,
    /// Size of a packed rkey payload in bytes (upper bound).
    pub rkey_packed_size: usize,
    /// Estimated cost of a registration.
    pub reg_cost: RegCost,
    /// PCI address or other system device this MD's memory sits on.
    pub system_device: Option<String>,
}

/// What [`MemoryDomain::query`] learns about an address.
#[derive(Debug)]
pub struct MemInfo {
    /// The memory type found.
    pub mem_type: MemoryType,
    /// Start and length of the allocation that owns the address.
    pub base: u64,
    /// Length of the owning allocation.
    pub len: usize,
    /// The system device (a PCI bus id) the memory sits on.
    pub system_device: Option<String>,
    /// A DMA-buf fd for the allocation, owned by the caller, and the offset
    /// of the queried address inside it.
    pub dmabuf: Option<(OwnedFd, u64)>,
}

/// A memory domain (one per device, or one for host memory).
pub trait MemoryDomain: Send + Sync {
    /// Name of this MD, such as `self` or `mlx5_0`.
    fn name(&self) -> &str;

    /// Name of the component that opened it.
    fn component(&self) -> &str;

    /// What the MD is and can do.
    fn attrs(&self) -> MdAttrs;

    /// One line about the device behind this MD (model, memory size, and
    /// whether it is simulated), where there is more to say than the name.
    fn description(&self) -> Option<String> {
        None
    }

    /// Why this MD cannot register `mem_type` memory, where it knows (a NIC
    /// whose driver cannot import DMA-buf says so and names NICs that can).
    /// `None` when it can, or has nothing specific to say.
    fn refusal(&self, mem_type: MemoryType) -> Option<String> {
        let _ = mem_type;
        None
    }

    /// Allocates `len` bytes of `mem_type` memory, registered for `access`.
    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        let _ = (len, access);
        Err(UctError::MemoryTypeUnsupported {
            mem_type,
            owner: format!("memory domain {}", self.name()),
            hint: "this MD cannot allocate memory; allocate it elsewhere and register it".into(),
        })
    }

    /// Registers host memory the caller owns.
    ///
    /// # Safety
    /// `addr..addr+len` must be valid host memory that stays allocated, and
    /// is not freed or unmapped, until the returned handle and every clone of
    /// it are dropped. Remote peers granted write access may change it at any
    /// time.
    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        let _ = (addr, len, access);
        Err(UctError::unsupported(
            self.name(),
            "registering host memory",
        ))
    }

    /// Registers a DMA-buf: `offset` into the buffer, `len` bytes, addressed
    /// by peers and work requests as `iova`.
    fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemHandle> {
        let _ = (fd, offset, len, iova, access);
        Err(UctError::unsupported(
            self.name(),
            "registering DMA-buf memory (needs an RDMA NIC with DMA-buf support: mlx5, efa, irdma, bnxt_re)",
        ))
    }

    /// Registers memory that another MD allocated (for example device memory
    /// handed to a NIC). The new handle keeps `mem` alive.
    fn register_handle(&self, mem: &MemHandle, access: Access) -> Result<MemHandle> {
        let _ = access;
        let hint = if mem.mem_type().is_host_accessible() {
            format!("register it with the MD that owns it ({})", mem.md_name())
        } else {
            format!(
                "{} memory is not CPU-accessible and needs an RDMA NIC with DMA-buf support (mlx5, efa, irdma, bnxt_re) and the rc transport",
                mem.mem_type()
            )
        };
        Err(UctError::MemoryTypeUnsupported {
            mem_type: mem.mem_type(),
            owner: format!("memory domain {}", self.name()),
            hint,
        })
    }

    /// Tells what owns `addr`: its type, allocation and DMA-buf.
    fn query(&self, addr: u64, len: usize) -> Result<MemInfo> {
        let _ = (addr, len);
        Err(UctError::unsupported(self.name(), "memory query"))
    }

    /// The memory type of `addr..addr+len`, where this MD can tell.
    fn detect_mem_type(&self, addr: u64, len: usize) -> Result<MemoryType> {
        let _ = (addr, len);
        Err(UctError::unsupported(self.name(), "memory type detection"))
    }

    /// Packs what a peer needs to reach `mem` remotely.
    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry>;

    /// For the owning component's code to reach its concrete type.
    fn as_any(&self) -> &dyn Any;
}
