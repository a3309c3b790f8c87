//! Memory: allocated or registered with a transport, views cut from it,
//! its remote key, and its free, which waits for nothing and refuses
//! while a request still uses it.

use std::ffi::{c_char, c_void};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Instant;

use uct_transfer::{Access, Memory, MemoryType, TransferError};

use crate::error::{call, CapiError};
use crate::ffi::{give_string, Out};
use crate::handle::{drop_last, Kind, Table};
use crate::request::{timeout_of, ReqCore};
use crate::status::Status;
use crate::transport::{
    memory_type, memory_type_value, UctRsMemoryType, UctRsTransport, TRANSPORTS,
};

/// Registered memory (opaque).
pub struct UctRsMemory {
    _opaque: [u8; 0],
}

/// A view (opaque): a range of a memory, what writes send from and reads
/// land in.
pub struct UctRsView {
    _opaque: [u8; 0],
}

/// Peers may read the memory.
pub const UCT_RS_REMOTE_READ: u32 = 1;
/// Peers may write the memory.
pub const UCT_RS_REMOTE_WRITE: u32 = 2;
/// Peers may run atomics on the memory.
pub const UCT_RS_REMOTE_ATOMIC: u32 = 4;
/// Every right: what a buffer shared with a peer usually gets.
pub const UCT_RS_REMOTE_ALL: u32 = 7;

/// What a memory or remote buffer is.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UctRsRegionInfo {
    /// Its first byte: a CPU address for host memory (of this process for
    /// a memory, of the peer's for a remote buffer), a device address for
    /// device memory.
    pub address: u64,
    /// Its length in bytes.
    pub length: usize,
    /// Its `UCT_RS_MEMORY_*` type.
    pub memory_type: UctRsMemoryType,
    /// The `UCT_RS_REMOTE_*` rights peers have.
    pub rights: u32,
}

/// Requests that use a memory, and whether it was freed.
pub(crate) struct Users {
    pending: Vec<Arc<ReqCore>>,
    freed: bool,
}

impl Users {
    /// Notes a request in flight that uses the memory.
    pub(crate) fn track(&mut self, req: Arc<ReqCore>) {
        self.pending.retain(|r| r.pending());
        self.pending.push(req);
    }
}

/// A memory, as its table holds it.
pub(crate) struct MemEntry {
    pub(crate) mem: Memory,
    users: Mutex<Users>,
}

impl MemEntry {
    /// The requests that use it, locked; an error once it was freed.
    pub(crate) fn users(&self) -> Result<MutexGuard<'_, Users>, CapiError> {
        let u = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if u.freed {
            return Err(CapiError::InvalidHandle(
                "the memory was freed (by uct_rs_mem_free); neither it nor its views can be used after".into(),
            ));
        }
        Ok(u)
    }
}

/// A view, as its table holds it: it does not keep the memory alive.
pub(crate) struct ViewEntry {
    mem: Weak<MemEntry>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl ViewEntry {
    /// The memory it was cut from, unless that was freed.
    pub(crate) fn memory(&self) -> Result<Arc<MemEntry>, CapiError> {
        self.mem.upgrade().ok_or_else(|| {
            CapiError::InvalidHandle(
                "the memory of this view was freed (by uct_rs_mem_free); free views before their memory, and use none after".into(),
            )
        })
    }
}

pub(crate) static MEMORIES: LazyLock<Table<MemEntry>> = LazyLock::new(|| Table::new(Kind::Memory));
pub(crate) static VIEWS: LazyLock<Table<ViewEntry>> = LazyLock::new(|| Table::new(Kind::View));

/// The access of C rights `rights`.
fn access_of(rights: u32) -> Result<Access, CapiError> {
    if rights & !UCT_RS_REMOTE_ALL != 0 {
        return Err(CapiError::Argument(format!(
            "rights {rights:#x} has unknown bits; combine UCT_RS_REMOTE_READ, _WRITE and _ATOMIC, or pass UCT_RS_REMOTE_ALL"
        )));
    }
    let mut a = Access::LOCAL_READ | Access::LOCAL_WRITE;
    for (bit, right) in [
        (UCT_RS_REMOTE_READ, Access::REMOTE_READ),
        (UCT_RS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (UCT_RS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if rights & bit != 0 {
            a |= right;
        }
    }
    Ok(a)
}

/// The C rights of `access`.
pub(crate) fn rights_of(access: Access) -> u32 {
    [
        (UCT_RS_REMOTE_READ, Access::REMOTE_READ),
        (UCT_RS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (UCT_RS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ]
    .into_iter()
    .filter(|(_, right)| access.contains(*right))
    .fold(0, |acc, (bit, _)| acc | bit)
}

fn enter(mem: Memory, out: Out<*mut UctRsMemory>) -> Result<Status, CapiError> {
    let entry = MemEntry {
        mem,
        users: Mutex::new(Users {
            pending: Vec::new(),
            freed: false,
        }),
    };
    out.set(MEMORIES.insert(Arc::new(entry))?);
    Ok(Status::UCT_RS_OK)
}

/// Allocates `length` bytes of `memory_type` memory, registered with the
/// transport, that peers get `rights` (`UCT_RS_REMOTE_*`) on. Host memory
/// is readable and writable by this process at `uct_rs_mem_info`'s address.
/// Before connect it is registered with every candidate transport, after
/// connect with the one connected over: a type a transport cannot reach is
/// refused here (`UCT_RS_ERR_MEMORY_TYPE`), never at the first write.
///
/// Ownership: `*memory` is the caller's, to free with `uct_rs_mem_free`.
/// Thread-safe.
///
/// # Safety
/// `memory` is NULL (refused) or points to a writable `uct_rs_memory *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_alloc(
    transport: *mut UctRsTransport,
    memory_type: UctRsMemoryType,
    length: usize,
    rights: u32,
    memory: *mut *mut UctRsMemory,
) -> Status {
    call("uct_rs_mem_alloc", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(memory, "memory") }?;
        let mem_type = self::memory_type(memory_type, "memory_type")?;
        let access = access_of(rights)?;
        let t = TRANSPORTS.get(transport, "transport")?.get()?;
        enter(Memory::alloc_with(&t, mem_type, length, access)?, out)
    })
}

/// Registers memory the caller owns: `length` bytes at `address`, of
/// `memory_type` (host, or a device pointer: CUDA, Gaudi), which uct-rs
/// checks with the memory domains that detect device memory. Peers get
/// `rights` (`UCT_RS_REMOTE_*`); device memory is registered with every
/// right (pass `UCT_RS_REMOTE_ALL`). posix cannot register memory it did
/// not allocate: use `uct_rs_mem_alloc`, or a tcp, cma or rc transport.
///
/// Ownership: `*memory` is the caller's, to free with `uct_rs_mem_free`;
/// the bytes stay the caller's, and must stay allocated until
/// `uct_rs_mem_free` has returned `UCT_RS_OK` (it refuses with
/// `UCT_RS_ERR_BUSY` while a request uses them; `uct_rs_mem_free_wait`
/// waits for them instead). Peers with write rights may change them at
/// any time, and reads land in them: with `UCT_RS_REMOTE_WRITE` the bytes
/// must be writable, not read-only (a string literal, a read-only
/// mapping). A range that runs past the end of the address space, or
/// longer than `PTRDIFF_MAX`, is refused. Thread-safe.
///
/// # Safety
/// `address..address+length` is memory of that type that stays allocated
/// as said above, and writable if write rights are asked; `memory` is
/// NULL (refused) or points to a writable `uct_rs_memory *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_register(
    transport: *mut UctRsTransport,
    address: *mut c_void,
    length: usize,
    memory_type: UctRsMemoryType,
    rights: u32,
    memory: *mut *mut UctRsMemory,
) -> Status {
    call("uct_rs_mem_register", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(memory, "memory") }?;
        let asked = self::memory_type(memory_type, "memory_type")?;
        let access = access_of(rights)?;
        if address.is_null() || length == 0 {
            return Err(CapiError::Argument(format!(
                "address {address:p} and length {length}: register at least 1 byte at a real address"
            )));
        }
        // A range past the end of the address space (or longer than any
        // allocation can be) would let reads and writes reach any byte.
        if length > isize::MAX as usize || address.addr().checked_add(length).is_none() {
            return Err(CapiError::Argument(format!(
                "address {address:p} and length {length}: the range runs past the end of the address space; pass the length of the caller's allocation"
            )));
        }
        let t = TRANSPORTS.get(transport, "transport")?.get()?;
        let (found, md) = Memory::detect(address.addr() as u64, length)?;
        if found != asked {
            return Err(CapiError::Transfer(uct_transfer::TransferError::MemoryType(format!(
                "the {length} bytes at {address:p} are {found} memory ({}), not {asked}; pass UCT_RS_MEMORY_{}",
                md.map_or_else(|| "no memory domain claims them as device memory".to_string(), |m| format!("memory domain {m} says so")),
                found.name().to_ascii_uppercase()
            ))));
        }
        let mem = if asked == MemoryType::Host {
            // SAFETY: the caller keeps the bytes allocated until the free
            // succeeds, and the free refuses while a request uses them.
            unsafe { Memory::register_raw(&t, address.cast(), length, access) }?
        } else {
            if rights != UCT_RS_REMOTE_ALL {
                return Err(CapiError::Argument(format!(
                    "rights {rights:#x} for {asked} memory; device memory is registered with every right: pass UCT_RS_REMOTE_ALL"
                )));
            }
            // SAFETY: as above, for device memory.
            unsafe { Memory::register(&t, address.cast(), length) }?
        };
        enter(mem, out)
    })
}

/// Its address, length, memory type and the rights peers have.
///
/// Ownership: the caller owns `*info`. Thread-safe.
///
/// # Safety
/// `info` is NULL (refused) or points to a writable `uct_rs_region_info`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_info(
    memory: *mut UctRsMemory,
    info: *mut UctRsRegionInfo,
) -> Status {
    call("uct_rs_mem_info", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(info, "info") }?;
        let m = MEMORIES.get(memory, "memory")?;
        out.set(UctRsRegionInfo {
            address: m.mem.addr(),
            length: m.mem.len(),
            memory_type: memory_type_value(m.mem.mem_type()),
            rights: rights_of(m.mem.access()),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// The remote key of the memory: a printable string the peer passes to
/// `uct_rs_remote_parse` to write into it or read from it (as its rights
/// allow). It names every transport the memory was registered with.
///
/// Ownership: `*key` is the caller's, to free with `uct_rs_string_free`.
/// Thread-safe.
///
/// # Safety
/// `key` is NULL (refused) or points to a writable `char *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_remote_key(
    memory: *mut UctRsMemory,
    key: *mut *mut c_char,
) -> Status {
    call("uct_rs_mem_remote_key", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(key, "key") }?;
        let m = MEMORIES.get(memory, "memory")?;
        out.set(give_string(m.mem.remote_key())?);
        Ok(Status::UCT_RS_OK)
    })
}

/// Copies `length` bytes from `source` into the memory at `offset` (host
/// memory; device memory where its memory domain can copy).
///
/// Ownership: `source` is read during the call only. Thread-safe (a peer
/// or a request may change the bytes meanwhile).
///
/// # Safety
/// `source` is valid for reads of `length` bytes (NULL only with 0).
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_write(
    memory: *mut UctRsMemory,
    offset: usize,
    source: *const c_void,
    length: usize,
) -> Status {
    call("uct_rs_mem_write", || {
        let m = MEMORIES.get(memory, "memory")?;
        if length == 0 {
            return Ok(Status::UCT_RS_OK);
        }
        if source.is_null() {
            return Err(CapiError::Null {
                param: "source",
                wanted: "the bytes to copy",
            });
        }
        // SAFETY: not NULL, and `length` bytes readable as the caller
        // promised.
        let data = unsafe { std::slice::from_raw_parts(source.cast::<u8>(), length) };
        m.mem.write_bytes(offset, data)?;
        Ok(Status::UCT_RS_OK)
    })
}

/// Copies `length` bytes of the memory at `offset` into `destination`.
///
/// Ownership: `destination` stays the caller's. Thread-safe.
///
/// # Safety
/// `destination` is valid for writes of `length` bytes (NULL only with 0).
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_read(
    memory: *mut UctRsMemory,
    offset: usize,
    destination: *mut c_void,
    length: usize,
) -> Status {
    call("uct_rs_mem_read", || {
        let m = MEMORIES.get(memory, "memory")?;
        if length == 0 {
            return Ok(Status::UCT_RS_OK);
        }
        if destination.is_null() {
            return Err(CapiError::Null {
                param: "destination",
                wanted: "where the bytes go",
            });
        }
        // SAFETY: not NULL, and `length` bytes writable as the caller
        // promised.
        let out = unsafe { std::slice::from_raw_parts_mut(destination.cast::<u8>(), length) };
        m.mem.read_bytes(offset, out)?;
        Ok(Status::UCT_RS_OK)
    })
}

/// A view of `length` bytes from `offset` of the memory (out of range:
/// `UCT_RS_ERR_OUT_OF_RANGE`).
///
/// Ownership: `*view` is the caller's, to free with `uct_rs_view_free`. A
/// view does not keep its memory: once the memory is freed, the view gives
/// `UCT_RS_ERR_INVALID_HANDLE`. Thread-safe.
///
/// # Safety
/// `view` is NULL (refused) or points to a writable `uct_rs_view *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_mem_view(
    memory: *mut UctRsMemory,
    offset: usize,
    length: usize,
    view: *mut *mut UctRsView,
) -> Status {
    call("uct_rs_mem_view", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(view, "view") }?;
        let m = MEMORIES.get(memory, "memory")?;
        m.mem.view(offset, length)?;
        let entry = ViewEntry {
            mem: Arc::downgrade(&m),
            offset,
            len: length,
        };
        out.set(VIEWS.insert(Arc::new(entry))?);
        Ok(Status::UCT_RS_OK)
    })
}

/// Frees the view.
///
/// Ownership: the handle is invalid afterwards. Thread-safe.
#[no_mangle]
pub extern "C" fn uct_rs_view_free(view: *mut UctRsView) -> Status {
    call("uct_rs_view_free", || {
        VIEWS.remove(view, "view")?;
        Ok(Status::UCT_RS_OK)
    })
}

/// Frees the memory: deregisters it from every transport (a peer's later
/// access is refused) and, if uct-rs allocated it, frees the bytes. While a
/// request that uses it is in flight it refuses with `UCT_RS_ERR_BUSY` and
/// changes nothing, so that no NIC or peer touches freed memory: wait for
/// the request (or destroy its transport), then free again, or call
/// `uct_rs_mem_free_wait`. Its views become invalid.
///
/// Ownership: the handle is invalid afterwards; registered bytes are the
/// caller's to free once this returned `UCT_RS_OK`. Thread-safe: it waits
/// for calls using this memory in other threads to return.
#[no_mangle]
pub extern "C" fn uct_rs_mem_free(memory: *mut UctRsMemory) -> Status {
    call("uct_rs_mem_free", || free_now(memory))
}

/// Frees the memory once the requests that use it are done: waits for
/// them (driving progress, as `uct_rs_request_wait` does) for up to
/// `timeout_ms` (negative: for ever), then frees it as `uct_rs_mem_free`
/// does. A request's failure does not stop the free: only its end
/// matters. Requests posted meanwhile are waited for too. Gives
/// `UCT_RS_ERR_TIMED_OUT` and changes nothing if they are still in flight
/// by then.
///
/// Ownership: as `uct_rs_mem_free`; registered bytes are the caller's to
/// free once this returned `UCT_RS_OK`. Thread-safe.
#[no_mangle]
pub extern "C" fn uct_rs_mem_free_wait(memory: *mut UctRsMemory, timeout_ms: i64) -> Status {
    call("uct_rs_mem_free_wait", || {
        let limit = timeout_of(timeout_ms);
        let start = Instant::now();
        loop {
            let pending = {
                let m = MEMORIES.get(memory, "memory")?;
                let mut users = m.users()?;
                users.pending.retain(|r| r.pending());
                users.pending.clone()
            };
            if pending.is_empty() {
                match free_now(memory) {
                    // A request posted in another thread since: wait again.
                    Err(CapiError::Busy(_)) => continue,
                    done => return done,
                }
            }
            for r in pending {
                let left = limit.map(|l| l.saturating_sub(start.elapsed()));
                // Its own error is its waiter's business; a timeout is ours.
                if let Err(TransferError::TimedOut { .. }) = r.wait(left) {
                    return Err(TransferError::TimedOut {
                        after: limit.unwrap_or_default(),
                    }
                    .into());
                }
            }
        }
    })
}

/// Frees the memory, or refuses with `Busy` while a request uses it.
fn free_now(memory: *mut UctRsMemory) -> Result<Status, CapiError> {
    let m = MEMORIES.get(memory, "memory")?;
    {
        let mut users = m.users()?;
        users.pending.retain(|r| r.pending());
        if !users.pending.is_empty() {
            return Err(CapiError::Busy(format!(
                "{} request(s) using this memory are in flight; wait for them with uct_rs_request_wait (or destroy their transport), or free it with uct_rs_mem_free_wait",
                users.pending.len()
            )));
        }
        users.freed = true;
    }
    // A free in another thread may have taken it out first: its error.
    let m2 = MEMORIES.remove(memory, "memory")?;
    drop(m2);
    drop_last(m);
    Ok(Status::UCT_RS_OK)
}
