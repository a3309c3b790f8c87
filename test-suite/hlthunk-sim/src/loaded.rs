//! **Test double**, seen from a test: calls into the `libhlthunk_sim.so`
//! this process loaded (the one [`library_path`](crate::library_path)
//! finds, which md-gaudi's tests load too; `dlopen` of the same file gives
//! the same copy, with the same state). Two kinds of calls:
//! - the simulator's counters, its view of what is allocated, mapped and
//!   exported;
//! - the raw hl-thunk calls with any integer for the fd, handle or address,
//!   to test the simulator's own refusals, which md-gaudi's owned types no
//!   longer let safe code reach.
//!
//! The functions of this crate's rlib are not called directly: linked into
//! a test binary they are a second simulator, with its own state.

use std::ffi::{c_int, c_void, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::OnceLock;

/// The library's dlopen handle (as an address, to be `Sync`); never closed.
fn library() -> usize {
    static HANDLE: OnceLock<usize> = OnceLock::new();
    *HANDLE.get_or_init(|| {
        let path = crate::library_path().expect(
            "libhlthunk_sim.so (the hl-thunk test double) is built beside the tests; add a dev-dependency on hlthunk-sim",
        );
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).expect("a path without NUL");
        // SAFETY: a NUL-terminated path; loading the simulator runs no
        // initialiser with preconditions (it has none).
        let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen {}", path.display());
        handle as usize
    })
}

/// The address of the simulator's symbol `name` (NUL-terminated).
fn symbol(name: &str) -> *mut c_void {
    // SAFETY: a live dlopen handle (never closed) and a NUL-terminated
    // name.
    let sym = unsafe { libc::dlsym(library() as *mut c_void, name.as_ptr().cast()) };
    assert!(!sym.is_null(), "libhlthunk_sim.so has no {name}");
    sym
}

/// The loaded copy of this crate's function `$f`, typed `$ty`. The type is
/// checked against this crate's own definition at compile time.
macro_rules! loaded {
    ($f:ident: $ty:ty) => {{
        let _same_prototype: $ty = crate::$f;
        let sym = symbol(concat!(stringify!($f), "\0"));
        // SAFETY: `sym` is non-null and is the library's `$f`, built from
        // the definition just checked to have the type `$ty`; the library
        // is never unloaded.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(sym) }
    }};
}

type Counter = extern "C" fn() -> u64;

/// Live allocations over all simulated devices.
pub fn live_allocations() -> u64 {
    loaded!(hlthunk_sim_live_allocations: Counter)()
}

/// Live mappings over all simulated devices.
pub fn live_mappings() -> u64 {
    loaded!(hlthunk_sim_live_mappings: Counter)()
}

/// Unmaps refused because the mapping was exported (the driver's
/// `dev_err` lines).
pub fn refused_unmaps() -> u64 {
    loaded!(hlthunk_sim_refused_unmaps: Counter)()
}

/// DMA-bufs exported and not yet released.
pub fn open_exports() -> u64 {
    loaded!(hlthunk_sim_open_exports: Counter)()
}

/// `hlthunk_device_memory_alloc` with any fd: the handle, or 0.
pub fn mem_alloc(fd: c_int, size: u64, page_size: u64) -> u64 {
    let f = loaded!(hlthunk_device_memory_alloc: extern "C" fn(c_int, u64, u64, bool, bool) -> u64);
    f(fd, size, page_size, false, false)
}

/// `hlthunk_device_memory_free` with any fd and handle: 0 or -errno.
pub fn mem_free(fd: c_int, handle: u64) -> c_int {
    loaded!(hlthunk_device_memory_free: extern "C" fn(c_int, u64) -> c_int)(fd, handle)
}

/// `hlthunk_device_memory_map` with any fd and handle: the VA, or 0.
pub fn mem_map(fd: c_int, handle: u64) -> u64 {
    loaded!(hlthunk_device_memory_map: extern "C" fn(c_int, u64, u64) -> u64)(fd, handle, 0)
}

/// `hlthunk_memory_unmap` with any fd and address: 0 or -errno.
pub fn unmap(fd: c_int, addr: u64) -> c_int {
    loaded!(hlthunk_memory_unmap: extern "C" fn(c_int, u64) -> c_int)(fd, addr)
}

/// `hlthunk_device_mapped_memory_export_dmabuf_fd` with any fd and
/// address: the DMA-buf, or the errno.
pub fn export_dmabuf(
    fd: c_int,
    addr: u64,
    size: u64,
    offset: u64,
    flags: u32,
) -> Result<OwnedFd, c_int> {
    let f = loaded!(
        hlthunk_device_mapped_memory_export_dmabuf_fd: extern "C" fn(c_int, u64, u64, u64, u32) -> c_int
    );
    let rc = f(fd, addr, size, offset, flags);
    if rc < 0 {
        return Err(-rc);
    }
    // SAFETY: rc >= 0 is the exported fd, new and owned by the caller.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}
