//! Registered memory and the views cut from it.
//!
//! Memory is registered once, with every memory domain the Transport may
//! use (before connect, each transport bind() offers; after, the one
//! chosen), so that a memory type a transport cannot reach is refused
//! here and never at the first write.

use std::sync::Arc;

use uct_core::host_alloc::HostAlloc;
use uct_core::{
    Access, MdFlags, MemHandle, MemoryDomain, MemoryType, Registry, RkeyBundle, UctError,
};

use crate::error::{Result, TransferError};
use crate::shared::RegTarget;
use crate::transport::Transport;
pub use crate::view::View;

/// One registration of the memory, with one memory domain.
struct Registration {
    md: Arc<dyn MemoryDomain>,
    handle: MemHandle,
}

struct Inner {
    // Fields drop in order: the registrations first, then what they
    // register (the allocation that owns the bytes).
    regs: Vec<Registration>,
    base: u64,
    len: usize,
    mem_type: MemoryType,
    access: Access,
    key: String,
    /// The allocation the registrations cover, where it is not one of them.
    _owner: Option<MemHandle>,
    _host: Option<HostAlloc>,
}

/// Memory registered for a Transport: allocated by it, or the
/// application's. `Send + Sync` and cheap to clone; the registrations
/// live until the last clone, view and operation using it is gone.
#[derive(Clone)]
pub struct Memory {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("base", &format_args!("{:#x}", self.inner.base))
            .field("len", &self.inner.len)
            .field("mem_type", &self.inner.mem_type)
            .field(
                "mds",
                &self
                    .inner
                    .regs
                    .iter()
                    .map(|r| r.md.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why `target` cannot register `mem_type` memory, where it cannot: the
/// words perftest uses, or the MD's own (a NIC without DMA-buf import
/// says which NICs have it).
fn refusal(target: &RegTarget, mem_type: MemoryType) -> Option<String> {
    if let Some(why) = target.md.refusal(mem_type) {
        return Some(why);
    }
    if target.mem_types.contains(&mem_type) {
        return None;
    }
    Some(uct_core::memory::cannot_move(
        &target.transport,
        &target.mem_types,
        mem_type,
    ))
}

/// Whether two memory domains are the same object (the rails of one
/// transport may share one: tcp's is uct-core's host MD).
fn same_md(a: &Arc<dyn MemoryDomain>, b: &Arc<dyn MemoryDomain>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// The targets with one of each memory domain: memory is registered once
/// per memory domain, whatever the rails that share it.
fn unique(targets: &[RegTarget]) -> Vec<RegTarget> {
    let mut out: Vec<RegTarget> = Vec::with_capacity(targets.len());
    for t in targets {
        if !out.iter().any(|o| same_md(&o.md, &t.md)) {
            out.push(t.clone());
        }
    }
    out
}

fn check_reachable(targets: &[RegTarget], mem_type: MemoryType) -> Result<()> {
    for t in targets {
        if let Some(why) = refusal(t, mem_type) {
            return Err(TransferError::MemoryType(why));
        }
    }
    Ok(())
}

impl Memory {
    /// Allocates `len` bytes of `mem_type` memory that peers may read and
    /// write (and run atomics on).
    pub fn alloc(transport: &Transport, mem_type: MemoryType, len: usize) -> Result<Memory> {
        Memory::alloc_with(transport, mem_type, len, Access::all())
    }

    /// Allocates memory with the rights peers get: `Access::remote_read_only()`
    /// makes a buffer peers can read and not write.
    pub fn alloc_with(
        transport: &Transport,
        mem_type: MemoryType,
        len: usize,
        access: Access,
    ) -> Result<Memory> {
        if len == 0 {
            return Err(TransferError::Config(
                "a registration of 0 bytes; ask for at least 1".into(),
            ));
        }
        let all = transport.reg_targets()?;
        check_reachable(&all, mem_type)?;
        let targets = unique(&all);
        let access = access | Access::LOCAL_READ | Access::LOCAL_WRITE;
        if !mem_type.is_host_accessible() {
            // Device memory: the device's MD allocates, the transports'
            // MDs register it (a NIC imports its DMA-buf).
            let owner = transport.device_md(mem_type)?;
            let dev = owner.alloc(len, mem_type, access)?;
            return Memory::from_handle(&all, dev, access);
        }
        // Host memory: the first MD that allocates (posix needs its own
        // shared memory), registered by address with the others.
        // An MD that cannot register (posix: peers map only memory it
        // allocated) must own the bytes; the others register them.
        let owner = targets
            .iter()
            .position(|t| allocates_host(&t.md) && !registers(&t.md))
            .or_else(|| targets.iter().position(|t| allocates_host(&t.md)));
        if let Some(first) = owner {
            let owner = targets[first].md.alloc(len, MemoryType::Host, access)?;
            let base = owner.addr();
            let mut regs = vec![Registration {
                md: targets[first].md.clone(),
                handle: owner,
            }];
            for (i, t) in targets.iter().enumerate() {
                if i != first {
                    // SAFETY: the bytes belong to `regs[0]`'s allocation,
                    // which Inner drops after every other registration; an
                    // operation that holds this registration's handle
                    // holds the whole Memory too (its completion keeps it)
                    // until the transport lets go.
                    let h = unsafe { t.md.register(base as *mut u8, len, access) }?;
                    regs.push(Registration {
                        md: t.md.clone(),
                        handle: h,
                    });
                }
            }
            // The allocation must outlive the registrations of its bytes:
            // move it last.
            regs.rotate_left(1);
            return Memory::build(&all, regs, base, len, MemoryType::Host, access, None, None);
        }
        let host = HostAlloc::new(len)?;
        // SAFETY: `host` is kept in Inner and dropped after the
        // registrations.
        let regs = unsafe { register_all(&targets, host.as_ptr(), len, access) }?;
        let base = host.as_ptr() as u64;
        Memory::build(
            &all,
            regs,
            base,
            len,
            MemoryType::Host,
            access,
            None,
            Some(host),
        )
    }

    /// Registers host memory the application owns.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be host memory that stays allocated, and is not
    /// freed or unmapped, until this Memory and every clone and view of it
    /// are dropped and every operation using it has resolved (a future
    /// resolves only once no transport touches its memory any more, even
    /// when the connection failed or the Transport was dropped). Peers
    /// granted write access may change it at any time.
    pub unsafe fn register_raw(
        transport: &Transport,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Memory> {
        if len == 0 {
            return Err(TransferError::Config(
                "a registration of 0 bytes; register at least 1".into(),
            ));
        }
        // No allocation is longer than isize::MAX or wraps the address
        // space; such a range would expose every byte to peers.
        if len > isize::MAX as usize || (ptr as usize).checked_add(len).is_none() {
            return Err(TransferError::Config(format!(
                "a registration of {len} bytes at {ptr:p} runs past the end of the address space; pass the length of the allocation"
            )));
        }
        let all = transport.reg_targets()?;
        check_reachable(&all, MemoryType::Host)?;
        let targets = unique(&all);
        let access = access | Access::LOCAL_READ | Access::LOCAL_WRITE;
        if let Some(t) = targets
            .iter()
            .find(|t| !t.md.attrs().flags.contains(MdFlags::REG))
        {
            return Err(TransferError::MemoryType(format!(
                "{} cannot register memory the application allocated (its peers map only memory it allocated itself), and this Transport may connect over it ({} on one host); use Memory::alloc, or build the Transport with .transport(\"cma\") (one host) or .transport(\"tcp\") or \"rc\" for memory you own",
                t.transport,
                if t.transport == "posix" { "auto picks posix" } else { "it is a candidate" }
            )));
        }
        // SAFETY: the caller keeps the bytes alive as documented above.
        let regs = unsafe { register_all(&targets, ptr, len, access) }?;
        Memory::build(
            &all,
            regs,
            ptr as u64,
            len,
            MemoryType::Host,
            access,
            None,
            None,
        )
    }

    /// What memory `[ptr, ptr + len)` is, and the memory domain that told:
    /// each memory domain that detects device memory (md-cuda's
    /// `cuPointerGetAttributes`, md-gaudi's own allocations) is asked; an
    /// address none of them claims is host memory, with no memory domain.
    /// A device pointer of another GPU than the one asked is that GPU's.
    ///
    /// An MD that cannot tell (a driver failure, device memory it knows
    /// but refuses: past its allocation, managed memory) fails the
    /// detection with a [`TransferError::MemoryType`] naming it and the
    /// cause: calling such memory host memory would let the CPU touch it.
    pub fn detect(ptr: u64, len: usize) -> Result<(MemoryType, Option<String>)> {
        Ok(match detecting_md(ptr, len)? {
            Some((mem_type, md)) => (mem_type, Some(md.name().to_string())),
            None => (MemoryType::Host, None),
        })
    }

    /// Registers memory the application owns, whatever it is: its type is
    /// detected ([`Memory::detect`]) and the memory domain that owns it
    /// (md-cuda for a CUDA pointer, say from PyTorch's `data_ptr()`)
    /// registers it, then every transport's, as
    /// [`register_handle`](Self::register_handle) does; host memory is
    /// registered as [`register_raw`](Self::register_raw) does. Peers get
    /// every right.
    ///
    /// # Safety
    /// As [`register_raw`](Self::register_raw): the memory (host or
    /// device) stays allocated until this Memory and every clone and view
    /// of it are dropped and every operation using it has resolved.
    pub unsafe fn register(transport: &Transport, ptr: *mut u8, len: usize) -> Result<Memory> {
        if len == 0 {
            return Err(TransferError::Config(
                "a registration of 0 bytes; register at least 1".into(),
            ));
        }
        let Some((mem_type, owner)) = detecting_md(ptr as u64, len)? else {
            // SAFETY: the caller's contract is register_raw's.
            return unsafe { Memory::register_raw(transport, ptr, len, Access::all()) };
        };
        let targets = transport.reg_targets()?;
        check_reachable(&targets, mem_type)?;
        let access = Access::all();
        // SAFETY: the owning MD registers the device pointer, which the
        // caller keeps allocated as long as this Memory (see above).
        let handle = unsafe { owner.register(ptr, len, access) }?;
        log::debug!(
            "transfer: {len} bytes at {ptr:p} are {mem_type} memory of {}",
            owner.name()
        );
        Memory::from_handle(&targets, handle, access)
    }

    /// Registers memory another memory domain allocated (Gaudi HBM from
    /// md-gaudi, say); the Memory keeps `mem` alive.
    pub fn register_handle(
        transport: &Transport,
        mem: &MemHandle,
        access: Access,
    ) -> Result<Memory> {
        let targets = transport.reg_targets()?;
        check_reachable(&targets, mem.mem_type())?;
        let access = access | Access::LOCAL_READ | Access::LOCAL_WRITE;
        Memory::from_handle(&targets, mem.clone(), access)
    }

    fn from_handle(all: &[RegTarget], mem: MemHandle, access: Access) -> Result<Memory> {
        let targets = unique(all);
        let mut regs = Vec::with_capacity(targets.len());
        for t in &targets {
            let handle = if t.md.name() == mem.md_name() {
                mem.clone()
            } else {
                t.md.register_handle(&mem, access).map_err(|e| {
                    TransferError::MemoryType(format!(
                        "{} cannot register this {} memory: {e}",
                        t.transport,
                        mem.mem_type()
                    ))
                })?
            };
            regs.push(Registration {
                md: t.md.clone(),
                handle,
            });
        }
        let (base, len, mem_type) = (mem.addr(), mem.len(), mem.mem_type());
        Memory::build(all, regs, base, len, mem_type, access, Some(mem), None)
    }

    /// The Memory of `regs` (one per memory domain of `targets`), with its
    /// remote key: one bundle per rail, of the registrations of that
    /// rail's targets. A registration whose rkey cannot be packed fails
    /// the whole registration, naming the MD: a key missing an entry would
    /// fail only at the peer's first write.
    // The parts of a Memory, each needed: a struct for them would be
    // built in one place only.
    #[allow(clippy::too_many_arguments)]
    fn build(
        targets: &[RegTarget],
        regs: Vec<Registration>,
        base: u64,
        len: usize,
        mem_type: MemoryType,
        access: Access,
        owner: Option<MemHandle>,
        host: Option<HostAlloc>,
    ) -> Result<Memory> {
        if regs.is_empty() {
            return Err(TransferError::Closed);
        }
        let rails = targets.iter().map(|t| t.rail + 1).max().unwrap_or(1);
        let mut packed = Vec::with_capacity(rails);
        for rail in 0..rails {
            let mut bundle = RkeyBundle::new();
            for t in targets.iter().filter(|t| t.rail == rail) {
                let Some(r) = regs.iter().find(|r| same_md(&r.md, &t.md)) else {
                    continue;
                };
                r.md.pack_rkey(&r.handle)
                    .and_then(|e| bundle.push(e))
                    .map_err(|e| {
                        TransferError::MemoryType(format!(
                            "memory domain {} cannot pack a remote key for this memory: {e}",
                            r.md.name()
                        ))
                    })?;
            }
            packed.push(bundle.pack()?);
        }
        let key = crate::key::format(base, len, access, mem_type, &packed);
        Ok(Memory {
            inner: Arc::new(Inner {
                regs,
                base,
                len,
                mem_type,
                access,
                key,
                _owner: owner,
                _host: host,
            }),
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether it is empty (never: registrations have at least a byte).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The address it starts at (a CPU address for host memory, a device
    /// address for device memory).
    pub fn addr(&self) -> u64 {
        self.inner.base
    }

    /// Its memory type.
    pub fn mem_type(&self) -> MemoryType {
        self.inner.mem_type
    }

    /// The rights it was registered with.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// Whether `[addr, addr+len)` lies inside it.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        addr >= self.inner.base
            && (addr - self.inner.base)
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.inner.len as u64)
    }

    /// A view of `len` bytes from `offset`; out of range is refused.
    pub fn view(&self, offset: usize, len: usize) -> Result<View> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.len => Ok(View {
                mem: self.clone(),
                offset,
                len,
            }),
            _ => Err(TransferError::OutOfRange {
                what: "view",
                offset,
                len,
                of: "memory",
                size: self.inner.len,
            }),
        }
    }

    /// A view of all of it.
    pub fn whole(&self) -> View {
        View {
            mem: self.clone(),
            offset: 0,
            len: self.inner.len,
        }
    }

    /// The printable, versioned key a peer passes to
    /// [`RemoteBuffer::parse`](crate::RemoteBuffer::parse): the packed rkey
    /// of every registration, the base address, the length and the rights.
    pub fn remote_key(&self) -> String {
        self.inner.key.clone()
    }

    /// Copies `data` into host memory at `offset`.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.view(offset, data.len())?;
        Ok(self.any_handle().write(self.region_offset(offset), data)?)
    }

    /// Copies host memory at `offset` into `out`.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.view(offset, out.len())?;
        Ok(self.any_handle().read(self.region_offset(offset), out)?)
    }

    fn any_handle(&self) -> &MemHandle {
        &self.inner.regs[0].handle
    }

    /// `offset` of this memory as an offset into the registration's region
    /// (a registration may start before the memory, as with a handle).
    fn region_offset(&self, offset: usize) -> usize {
        (self.inner.base - self.any_handle().addr()) as usize + offset
    }

    /// The registration with memory domain `md`, and the offset of this
    /// memory's first byte in it (compared by identity: this is on every
    /// write's path).
    pub(crate) fn handle_for(&self, md: &Arc<dyn MemoryDomain>) -> Result<(&MemHandle, usize)> {
        let same = |r: &&Registration| same_md(&r.md, md);
        let reg =
            self.inner
                .regs
                .iter()
                .find(same)
                .ok_or_else(|| TransferError::ForeignMemory {
                    registered: self
                        .inner
                        .regs
                        .iter()
                        .map(|r| r.md.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                    ours: md.name().to_string(),
                })?;
        Ok((&reg.handle, (self.inner.base - reg.handle.addr()) as usize))
    }
}

/// The memory domain that claims `[addr, addr + len)` as device memory,
/// with its type; `None` for host memory (every MD that detects said "not
/// mine", or there is none, as without a GPU). Any other answer is an
/// error ([`detection`]).
fn detecting_md(addr: u64, len: usize) -> Result<Option<(MemoryType, Arc<dyn MemoryDomain>)>> {
    uct_builtins::link();
    let detecting = Registry::global()
        .memory_domains()
        .into_iter()
        .map(|(_, md)| md)
        .filter(|md| {
            let a = md.attrs();
            a.flags.contains(MdFlags::DETECT)
                && a.detect_mem_types.iter().any(|t| !t.is_host_accessible())
        });
    for md in detecting {
        match detection(md.name(), addr, len, md.detect_mem_type(addr, len))? {
            Detection::Claimed(t) => return Ok(Some((t, md))),
            Detection::NotMine => {}
        }
    }
    Ok(None)
}

/// What one MD's answer to `detect_mem_type` means.
#[derive(Debug, PartialEq)]
enum Detection {
    /// Device memory of this MD.
    Claimed(MemoryType),
    /// Not this MD's: host memory as far as it knows.
    NotMine,
}

/// Reads one MD's answer. "Not mine" is a host-accessible type, or
/// `InvalidParam`: the address is not one the MD knows (md-gaudi's
/// lookup of its own allocations, md-cuda's pointer of another of its
/// GPUs). Anything else (a driver failure, memory the MD knows but
/// refuses, such as managed memory or a range past its allocation) is an
/// error: taking it for host memory would register device memory as host
/// memory, which the CPU then touches (SIGSEGV on the first access).
fn detection(
    md: &str,
    addr: u64,
    len: usize,
    answer: uct_core::Result<MemoryType>,
) -> Result<Detection> {
    match answer {
        Ok(t) if t.is_host_accessible() => Ok(Detection::NotMine),
        Ok(t) => Ok(Detection::Claimed(t)),
        Err(UctError::InvalidParam(why)) => {
            log::trace!("transfer: {md} does not claim {addr:#x}: {why}");
            Ok(Detection::NotMine)
        }
        Err(e) => Err(TransferError::MemoryType(format!(
            "cannot tell what memory [{addr:#x}, +{len}) is: memory domain {md} answered: {e} (so it is not registered as host memory either)"
        ))),
    }
}

fn registers(md: &Arc<dyn MemoryDomain>) -> bool {
    md.attrs().flags.contains(MdFlags::REG)
}

fn allocates_host(md: &Arc<dyn MemoryDomain>) -> bool {
    let a = md.attrs();
    a.flags.contains(MdFlags::ALLOC) && a.alloc_mem_types.contains(&MemoryType::Host)
}

/// Registers `ptr..ptr+len` with every target.
///
/// # Safety
/// The bytes must outlive the returned registrations.
unsafe fn register_all(
    targets: &[RegTarget],
    ptr: *mut u8,
    len: usize,
    access: Access,
) -> Result<Vec<Registration>> {
    targets
        .iter()
        .map(|t| {
            // SAFETY: the caller keeps the bytes alive.
            let handle = unsafe { t.md.register(ptr, len, access) }?;
            Ok(Registration {
                md: t.md.clone(),
                handle,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_pointer_is_host_memory_where_no_md_claims_it() {
        let buf = vec![7u8; 4096];
        let (t, md) = Memory::detect(buf.as_ptr() as u64, buf.len()).unwrap();
        assert_eq!(t, MemoryType::Host);
        assert_eq!(md, None);
    }

    #[test]
    fn only_a_clean_not_mine_answer_counts_as_host_memory() {
        let ask = |answer| detection("cuda0", 0x7f00_0000_0000, 4096, answer);
        assert_eq!(ask(Ok(MemoryType::Host)).unwrap(), Detection::NotMine);
        assert_eq!(
            ask(Ok(MemoryType::Cuda)).unwrap(),
            Detection::Claimed(MemoryType::Cuda)
        );
        // md-gaudi's "not one of my allocations", md-cuda's "another GPU's".
        let foreign = Err(UctError::InvalidParam(
            "not memory this MD allocated".into(),
        ));
        assert_eq!(ask(foreign).unwrap(), Detection::NotMine);
        // A driver failure, managed memory, a range past its allocation:
        // device memory may lie there, so it is an error, naming the MD.
        let refusals = [
            UctError::Device {
                device: "cuda".into(),
                message: "cuPointerGetAttributes failed with CUDA_ERROR_LAUNCH_FAILED".into(),
                source: None,
            },
            UctError::MemoryTypeUnsupported {
                mem_type: MemoryType::Cuda,
                owner: "md-cuda".into(),
                hint: "managed (unified) memory".into(),
            },
            UctError::NoDevice("cuda1 could not be opened".into()),
        ];
        for refusal in refusals {
            let why = refusal.to_string();
            match ask(Err(refusal)) {
                Err(TransferError::MemoryType(text)) => {
                    assert!(text.contains("cuda0"), "{text}");
                    assert!(text.contains(&why), "{text}");
                    assert!(text.contains("0x7f0000000000"), "{text}");
                }
                other => panic!("expected a memory-type error, got {other:?}"),
            }
        }
    }

    #[test]
    fn register_falls_back_to_host_memory_and_moves_it() {
        let a = Transport::builder().transport("self").build().unwrap();
        let b = Transport::builder().transport("self").build().unwrap();
        let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
        a.connect(&ub).unwrap();
        b.connect(&ua).unwrap();
        let mut src = vec![0x5au8; 8192];
        // SAFETY: `src` outlives the Memory and the write, awaited below.
        let mem = unsafe { Memory::register(&a, src.as_mut_ptr(), src.len()) }.unwrap();
        assert_eq!(mem.mem_type(), MemoryType::Host);
        assert_eq!(mem.addr(), src.as_ptr() as u64);
        let dst = Memory::alloc(&b, MemoryType::Host, 8192).unwrap();
        let remote = crate::RemoteBuffer::parse(&dst.remote_key()).unwrap();
        a.wait(a.write(&mem.whole(), &remote, false)).unwrap();
        let mut back = vec![0u8; 8192];
        dst.read_bytes(0, &mut back).unwrap();
        assert_eq!(back, src);
        // SAFETY: a null pointer of 0 bytes is refused before any use.
        let zero = unsafe { Memory::register(&a, std::ptr::null_mut(), 0) };
        assert!(matches!(zero, Err(TransferError::Config(_))));
    }
}
