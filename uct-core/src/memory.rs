//! Memory types, access rights and memory handles.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Result, UctError};

/// Where memory lives. A transport that cannot touch a type refuses it when
/// memory is registered or an operation is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryType {
    /// Ordinary CPU memory.
    Host,
    /// Intel Gaudi HBM; not CPU-accessible.
    Gaudi,
    /// CUDA device memory; not CPU-accessible.
    Cuda,
    /// A DMA-buf of unknown origin, known only by its fd.
    DmaBuf,
}

impl MemoryType {
    /// Every memory type, in listing order.
    pub const ALL: [MemoryType; 4] = [
        MemoryType::Host,
        MemoryType::Gaudi,
        MemoryType::Cuda,
        MemoryType::DmaBuf,
    ];

    /// Lower-case name used on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            MemoryType::Host => "host",
            MemoryType::Gaudi => "gaudi",
            MemoryType::Cuda => "cuda",
            MemoryType::DmaBuf => "dmabuf",
        }
    }

    /// Whether the CPU can load and store this memory directly.
    pub fn is_host_accessible(self) -> bool {
        matches!(self, MemoryType::Host)
    }

    /// Parses a name as printed by [`MemoryType::name`].
    pub fn parse(s: &str) -> Result<Self> {
        MemoryType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "unknown memory type '{s}'; use one of host, gaudi, cuda, dmabuf"
                ))
            })
    }
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

bitflags::bitflags! {
    /// Access rights on a region, for local use and for remote peers.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub struct Access: u8 {
        /// This process may read it.
        const LOCAL_READ = 1 << 0;
        /// This process may write it.
        const LOCAL_WRITE = 1 << 1;
        /// Peers may read it (get).
        const REMOTE_READ = 1 << 2;
        /// Peers may write it (put).
        const REMOTE_WRITE = 1 << 3;
        /// Peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 4;
    }
}

impl Access {
    /// Every right: what most callers want for a buffer shared with a peer.
    pub fn all_rights() -> Self {
        Access::all()
    }

    /// Read-only for peers, readable and writable locally.
    pub fn remote_read_only() -> Self {
        Access::LOCAL_READ | Access::LOCAL_WRITE | Access::REMOTE_READ
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no rights");
        }
        let names: Vec<&str> = self.iter_names().map(|(n, _)| n).collect::<Vec<_>>();
        f.write_str(&names.join("|").to_ascii_lowercase())
    }
}

/// MD-specific state of a region: keeps its memory alive and carries what the
/// MD's transports need (keys, secrets, fds). Dropping it deregisters or frees.
pub trait MemBacking: Send + Sync + 'static {
    /// For the owning component's transports to reach their own state.
    fn as_any(&self) -> &dyn Any;

    /// What the owning MD's `query` says about this region: device memory
    /// answers with a DMA-buf fd the caller owns, so that another MD (a NIC)
    /// can register it without knowing the owner's types. `None` where the
    /// owner has nothing to add (host memory).
    fn query(&self, region: &MemRegion) -> Option<Result<crate::md::MemInfo>> {
        let _ = region;
        None
    }
}

/// A region of memory known to a memory domain: allocated by it or registered
/// with it. Held through [`MemHandle`]; operations in flight hold a clone, so
/// the memory stays valid until every operation on it has completed.
pub struct MemRegion {
    addr: u64,
    len: usize,
    mem_type: MemoryType,
    access: Access,
    md_name: String,
    backing: Box<dyn MemBacking>,
}

/// Shared handle to a region.
pub type MemHandle = Arc<MemRegion>;

impl MemRegion {
    /// Builds a region. `addr` is the CPU address for host memory and the
    /// device virtual address for device memory.
    ///
    /// # Safety
    ///
    /// Where `mem_type` is host-accessible, `[addr, addr + len)` must be
    /// memory this process may read and write, and it must stay mapped until
    /// `backing` is dropped: [`read`](Self::read), [`write`](Self::write)
    /// and the transports access it through the address alone. Only memory
    /// domains build regions, from memory they allocated or registered.
    ///
    /// Calling it without `unsafe` does not compile, so safe code cannot
    /// make a region over an arbitrary address and write through it:
    ///
    /// ```compile_fail
    /// use uct_core::memory::MemBacking;
    /// use uct_core::{Access, MemRegion, MemoryType};
    /// struct Nothing;
    /// impl MemBacking for Nothing {
    ///     fn as_any(&self) -> &dyn std::any::Any { self }
    /// }
    /// let r = MemRegion::new(0xdead, 8, MemoryType::Host, Access::all(), "x", Box::new(Nothing));
    /// let _ = r.len();
    /// ```
    pub unsafe fn new(
        addr: u64,
        len: usize,
        mem_type: MemoryType,
        access: Access,
        md_name: impl Into<String>,
        backing: Box<dyn MemBacking>,
    ) -> MemHandle {
        Arc::new(MemRegion {
            addr,
            len,
            mem_type,
            access,
            md_name: md_name.into(),
            backing,
        })
    }

    /// Start address of the region.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Memory type of the region.
    pub fn mem_type(&self) -> MemoryType {
        self.mem_type
    }
    /// Rights it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Name of the MD that owns it.
    pub fn md_name(&self) -> &str {
        &self.md_name
    }
    /// The MD-specific backing (registration, allocation).
    pub fn backing(&self) -> &dyn MemBacking {
        self.backing.as_ref()
    }

    /// Asks the MD that owns this region what it is (see
    /// [`MemBacking::query`]).
    pub fn query_owner(&self) -> Option<Result<crate::md::MemInfo>> {
        self.backing.query(self)
    }

    /// Checks that `[offset, offset+len)` lies inside the region.
    pub fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(UctError::LocalOutOfRange {
                offset,
                len,
                handle_len: self.len,
            }),
        }
    }

    fn require_host(&self) -> Result<()> {
        if self.mem_type.is_host_accessible() {
            Ok(())
        } else {
            Err(UctError::MemoryTypeUnsupported {
                mem_type: self.mem_type,
                owner: "the CPU".into(),
                hint: "stage the data through host memory with a transport that can reach it"
                    .into(),
            })
        }
    }

    /// Reads bytes of host memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.require_host()?;
        self.check_range(offset, out.len())?;
        // SAFETY: the region is host memory of `len` bytes kept alive by
        // `backing`; the range was checked above. Concurrent writers are the
        // caller's protocol (same contract as RDMA buffers).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr as usize + offset) as *const u8,
                out.as_mut_ptr(),
                out.len(),
            );
        }
        Ok(())
    }

    /// Writes bytes into host memory.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.require_host()?;
        self.check_range(offset, data.len())?;
        // SAFETY: as in `read`; the region is writable host memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr as usize + offset) as *mut u8,
                data.len(),
            );
        }
        Ok(())
    }

    /// Copies the whole host region into a vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Raw pointer to host memory at `offset`, range-checked.
    pub fn host_ptr(&self, offset: usize, len: usize) -> Result<*mut u8> {
        self.require_host()?;
        self.check_range(offset, len)?;
        Ok((self.addr as usize + offset) as *mut u8)
    }
}

impl fmt::Debug for MemRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("mem_type", &self.mem_type)
            .field("access", &self.access)
            .field("md", &self.md_name)
            .finish()
    }
}

/// One piece of a zero-copy scatter/gather list: a range of a memory handle.
#[derive(Debug, Clone, Copy)]
pub struct Iov<'a> {
    /// The registered memory.
    pub mem: &'a MemHandle,
    /// Offset into it.
    pub offset: usize,
    /// Bytes from the offset.
    pub len: usize,
}

impl<'a> Iov<'a> {
    /// `len` bytes of `mem` from `offset`; checked when the operation uses it.
    pub fn new(mem: &'a MemHandle, offset: usize, len: usize) -> Self {
        Iov { mem, offset, len }
    }

    /// The whole handle.
    pub fn whole(mem: &'a MemHandle) -> Self {
        Iov {
            mem,
            offset: 0,
            len: mem.len(),
        }
    }
}

/// Total length of an iov list, each entry checked against its handle.
pub fn iov_total(iov: &[Iov<'_>]) -> Result<usize> {
    let mut total = 0usize;
    for e in iov {
        e.mem.check_range(e.offset, e.len)?;
        total = total
            .checked_add(e.len)
            .ok_or_else(|| UctError::InvalidParam("iov total length overflows".into()))?;
    }
    Ok(total)
}

/// Checks a zero-copy iov list for a transport that moves host memory
/// only: at most `max_iov` entries, all host memory, each inside its
/// handle, at most `max_total` bytes in all. Returns the total.
pub fn check_host_iov(
    iov: &[Iov<'_>],
    transport: &str,
    max_iov: usize,
    max_total: usize,
) -> Result<usize> {
    if iov.len() > max_iov {
        return Err(UctError::InvalidParam(format!(
            "{} iov entries, {transport} takes at most {max_iov}",
            iov.len()
        )));
    }
    if let Some(e) = iov.iter().find(|e| e.mem.mem_type() != MemoryType::Host) {
        return Err(UctError::MemoryTypeUnsupported {
            mem_type: e.mem.mem_type(),
            owner: format!("transport {transport}"),
            hint: "it moves host memory only; an RDMA NIC with DMA-buf support (rc over mlx5, efa, irdma, bnxt_re) is needed for device memory".into(),
        });
    }
    let total = iov_total(iov)?;
    if total > max_total {
        return Err(UctError::InvalidParam(format!(
            "zcopy of {total} bytes exceeds {transport}'s {max_total}-byte limit; use smaller pieces"
        )));
    }
    Ok(total)
}

/// Refuses a message longer than a transport's limit for its class.
pub fn check_size(transport: &str, what: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(UctError::InvalidParam(format!(
            "{what} of {len} bytes exceeds {transport}'s {max}-byte limit; use the zcopy variant or smaller pieces"
        )));
    }
    Ok(())
}

/// Why transport `transport`, which moves `moves` memory, cannot use
/// `mem_type` memory: the one message perftest and the transfer API print.
pub fn cannot_move(transport: &str, moves: &[MemoryType], mem_type: MemoryType) -> String {
    format!(
        "{transport} cannot use {mem_type} memory: it moves {} memory only; {mem_type} memory needs an RDMA NIC with DMA-buf support, e.g. `perftest -t rc -m {mem_type}` on mlx5, efa, irdma or bnxt_re",
        moves.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
    )
}
