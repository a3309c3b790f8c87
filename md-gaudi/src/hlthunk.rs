//! hl-thunk, loaded at run time: the function pointers md-gaudi calls, and
//! thin wrappers that turn their return conventions into errno values.
//! Nothing here checks the driver's rules; `device.rs` does.
//!
//! What hl-thunk names by integers is owned here: a device fd is a
//! [`DeviceFd`] (closed once, on drop), an allocation an [`AllocHandle`]
//! and a mapping a [`DeviceVa`], which only the calls that create them
//! make and the calls that end them take by value; each works only with
//! the open that made it.

use std::ffi::{c_char, c_int, CStr};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libloading::Library;

use crate::error::{GaudiError, Result};

/// `enum hlthunk_device_name` values (hlthunk.h).
pub mod device_name {
    use std::ffi::c_int;
    pub const GOYA: c_int = 0;
    pub const GAUDI: c_int = 2;
    pub const INVALID: c_int = 3;
    pub const DONT_CARE: c_int = 4;
    pub const GAUDI2: c_int = 5;

    /// A name for a value read back from the driver.
    pub fn label(v: c_int) -> String {
        match v {
            GOYA => "GOYA".into(),
            GAUDI => "GAUDI".into(),
            GAUDI2 => "GAUDI2".into(),
            INVALID => "INVALID".into(),
            // Newer devices (Gaudi 3) have values public headers lack.
            other => format!("device type {other}"),
        }
    }
}

/// The default library name, found through the dynamic loader's path.
pub const DEFAULT_LIB: &str = "libhl-thunk.so";

/// `struct hlthunk_hw_ip_info` is larger than the fields we read; the
/// library writes the whole struct, so give it generous room.
const HW_IP_INFO_BYTES: usize = 4096;
/// Offset of `dram_size`: after sram_base_address and dram_base_address.
const HW_IP_DRAM_SIZE_OFFSET: usize = 16;

// The hl-thunk prototypes (hlthunk.h) of the functions md-gaudi calls.
//
// The contract every call through [`HlThunk`] relies on: each pointer was
// resolved in [`HlThunk::load`], by its hl-thunk name, from the library the
// user named as hl-thunk (`UCT_GAUDI_HLTHUNK_LIB`, or `libhl-thunk.so`), and
// typed with the prototype below that hlthunk.h declares for that name; the
// library stays loaded as long as the `HlThunk`. Calling one is then sound
// when its pointer arguments point to memory of the size the prototype
// requires, for the duration of the call; value arguments (fds, handles,
// device addresses, sizes) need nothing: the driver checks them and fails
// with an errno. A library that exports these names with other prototypes
// breaks this contract; nothing at run time can tell.
type OpenFn = unsafe extern "C" fn(c_int, *const c_char) -> c_int;
type FdFn = unsafe extern "C" fn(c_int) -> c_int;
type CountFn = unsafe extern "C" fn(c_int) -> c_int;
type BusIdFn = unsafe extern "C" fn(c_int, *mut c_char, c_int) -> c_int;
type HwIpFn = unsafe extern "C" fn(c_int, *mut u8) -> c_int;
type AllocFn = unsafe extern "C" fn(c_int, u64, u64, bool, bool) -> u64;
type HandleFn = unsafe extern "C" fn(c_int, u64) -> c_int;
type MapFn = unsafe extern "C" fn(c_int, u64, u64) -> u64;
type ExportFn = unsafe extern "C" fn(c_int, u64, u64, u64, u32) -> c_int;
type DescribeFn = unsafe extern "C" fn() -> *const c_char;

/// The loaded library and the functions md-gaudi uses.
///
/// Safe code cannot close, free or unmap what it did not open, allocate or
/// map: no call takes a bare integer for a device fd, an allocation handle
/// or a device address. Each of these does not compile:
///
/// ```compile_fail,E0599
/// fn close_any(lib: &md_gaudi::HlThunk) {
///     let _ = lib.close(3);
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn free_any(lib: &md_gaudi::HlThunk, fd: std::ffi::c_int) {
///     let _ = lib.mem_free(fd, 0x1000);
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn unmap_any(lib: &md_gaudi::HlThunk, fd: std::ffi::c_int) {
///     let _ = lib.unmap(fd, 0x1001_0000_0000);
/// }
/// ```
///
/// nor through an open device, which takes only what it made:
///
/// ```compile_fail,E0308
/// fn free_any(dev: &md_gaudi::hlthunk::DeviceFd) {
///     let _ = dev.mem_free(0x1000);
/// }
/// ```
///
/// ```compile_fail,E0308
/// fn unmap_any(dev: &md_gaudi::hlthunk::DeviceFd) {
///     let _ = dev.unmap(0x1001_0000_0000);
/// }
/// ```
///
/// and no handle or address is made from an integer:
///
/// ```compile_fail,E0451
/// let _ = md_gaudi::AllocHandle { raw: 0x1000, open: 1 };
/// ```
///
/// ```compile_fail,E0451
/// let _ = md_gaudi::DeviceVa { addr: 0x1001_0000_0000, open: 1 };
/// ```
///
/// What does compile, the whole life of a mapped allocation:
///
/// ```no_run
/// use std::sync::Arc;
/// use md_gaudi::HlThunk;
/// let lib = Arc::new(HlThunk::load("libhl-thunk.so".as_ref()).expect("hl-thunk"));
/// let dev = lib.open(None).expect("a free device");
/// let handle = dev.mem_alloc(4 << 20, 0).expect("alloc");
/// let va = dev.mem_map(&handle).expect("map");
/// dev.unmap(va).map_err(|(_, e)| e).expect("unmap");
/// dev.mem_free(handle).map_err(|(_, e)| e).expect("free");
/// dev.close().expect("close");
/// ```
pub struct HlThunk {
    path: PathBuf,
    open: OpenFn,
    close: FdFn,
    device_count: CountFn,
    device_name_from_fd: FdFn,
    pci_bus_id_from_fd: BusIdFn,
    hw_ip_info: HwIpFn,
    mem_alloc: AllocFn,
    mem_free: HandleFn,
    mem_map: MapFn,
    unmap: HandleFn,
    export_dmabuf: ExportFn,
    /// Present only in the test double (libhlthunk_sim.so).
    simulator: Option<String>,
    /// Keeps the function pointers valid; never unloaded.
    _lib: Library,
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// hl-thunk's int returns: `-1` with errno set, or `-errno`.
fn int_error(rc: c_int) -> io::Error {
    if rc == -1 {
        errno()
    } else {
        io::Error::from_raw_os_error(-rc)
    }
}

impl HlThunk {
    /// Loads the library at `path` (a bare name goes through the loader's
    /// search path) and resolves every function.
    pub fn load(path: &Path) -> Result<HlThunk> {
        let shown = path.display().to_string();
        // SAFETY: loading runs the library's initialisers; the library is
        // the one the user named as hl-thunk, whose initialisers (and the
        // simulator's) have no preconditions.
        let lib = unsafe { Library::new(path) }.map_err(|e| GaudiError::LibraryNotLoaded {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the library claims to be hl-thunk, whose symbol
                // $name has the prototype $ty (hlthunk.h); the copied
                // pointer is kept beside the library in `HlThunk`, so it
                // never outlives it.
                let symbol = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
                *symbol.map_err(|_| GaudiError::MissingSymbol {
                    path: shown.clone(),
                    symbol: $name,
                })?
            }};
        }
        let simulator = {
            // SAFETY: only the simulator exports `hlthunk_sim_describe`, with
            // the prototype DescribeFn (test-suite/hlthunk-sim); the symbol
            // is used only while `lib` is alive, here.
            let describe = unsafe { lib.get::<DescribeFn>(b"hlthunk_sim_describe\0") };
            match describe {
                Ok(describe) => {
                    // SAFETY: DescribeFn takes no arguments; the library is
                    // loaded.
                    let text = unsafe { describe() };
                    Some(if text.is_null() {
                        "hl-thunk simulator".to_string()
                    } else {
                        // SAFETY: the simulator returns a pointer to a
                        // static NUL-terminated string, which lives as long
                        // as the library, longer than this copy.
                        unsafe { CStr::from_ptr(text) }
                            .to_string_lossy()
                            .into_owned()
                    })
                }
                Err(_) => None,
            }
        };
        Ok(HlThunk {
            path: path.to_path_buf(),
            open: sym!("hlthunk_open", OpenFn),
            close: sym!("hlthunk_close", FdFn),
            device_count: sym!("hlthunk_get_device_count", CountFn),
            device_name_from_fd: sym!("hlthunk_get_device_name_from_fd", FdFn),
            pci_bus_id_from_fd: sym!("hlthunk_get_pci_bus_id_from_fd", BusIdFn),
            hw_ip_info: sym!("hlthunk_get_hw_ip_info", HwIpFn),
            mem_alloc: sym!("hlthunk_device_memory_alloc", AllocFn),
            mem_free: sym!("hlthunk_device_memory_free", HandleFn),
            mem_map: sym!("hlthunk_device_memory_map", MapFn),
            unmap: sym!("hlthunk_memory_unmap", HandleFn),
            export_dmabuf: sym!("hlthunk_device_mapped_memory_export_dmabuf_fd", ExportFn),
            simulator,
            _lib: lib,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the test double says it is; `None` for the real library.
    pub fn simulator(&self) -> Option<&str> {
        self.simulator.as_deref()
    }

    pub fn device_count(&self) -> c_int {
        // SAFETY: `hlthunk_get_device_count` has the prototype CountFn (see
        // the contract on the prototypes); its one argument is a value.
        unsafe { (self.device_count)(device_name::DONT_CARE) }
    }

    /// Opens a device: the first free one, or the one at `bus_id`.
    pub fn open(self: &Arc<Self>, bus_id: Option<&str>) -> io::Result<DeviceFd> {
        let bus_id = bus_id
            .map(std::ffi::CString::new)
            .transpose()
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `hlthunk_open` has the prototype OpenFn (see the contract
        // on the prototypes); the bus id is null (any device) or a
        // NUL-terminated string that outlives the call.
        let fd = unsafe {
            (self.open)(
                device_name::DONT_CARE,
                bus_id.as_ref().map_or(std::ptr::null(), |id| id.as_ptr()),
            )
        };
        if fd < 0 {
            return Err(int_error(fd));
        }
        Ok(DeviceFd {
            lib: self.clone(),
            fd,
            open: NEXT_OPEN.fetch_add(1, Ordering::Relaxed),
        })
    }
}

/// Numbers the device opens of this process, so that a handle or an
/// address is used only with the open that made it: the driver's handles
/// and addresses are per device, and fd numbers are reused after a close.
static NEXT_OPEN: AtomicU64 = AtomicU64::new(1);

/// An open hl-thunk device. Only [`HlThunk::open`] makes one; it is closed
/// once, with `hlthunk_close`, on drop or by [`close`](Self::close). The
/// handles and addresses it gives out work with it alone.
pub struct DeviceFd {
    lib: Arc<HlThunk>,
    /// -1 once [`close`](Self::close) has closed it.
    fd: c_int,
    open: u64,
}

/// A device memory allocation. Only [`DeviceFd::mem_alloc`] makes one and
/// only [`DeviceFd::mem_free`] ends it, taking it; it is neither `Clone`
/// nor made from an integer, so it is freed once, by its owner. Dropped
/// without a free, the memory stays allocated until the device is closed
/// (the driver frees it then).
#[derive(Debug)]
pub struct AllocHandle {
    raw: u64,
    open: u64,
}

/// A mapping of an allocation at a device virtual address. Only
/// [`DeviceFd::mem_map`] makes one and only [`DeviceFd::unmap`] ends it,
/// taking it.
#[derive(Debug)]
pub struct DeviceVa {
    addr: u64,
    open: u64,
}

impl AllocHandle {
    /// The driver's handle, for messages and bookkeeping.
    pub fn raw(&self) -> u64 {
        self.raw
    }

    pub(crate) fn open_id(&self) -> u64 {
        self.open
    }
}

impl DeviceVa {
    /// The device address: what work requests, rkeys and queries use.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub(crate) fn open_id(&self) -> u64 {
        self.open
    }
}

impl fmt::Debug for DeviceFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceFd")
            .field("fd", &self.fd)
            .field("open", &self.open)
            .finish()
    }
}

impl AsRawFd for DeviceFd {
    /// The fd number, for messages and for tests of the library's own
    /// checks; closing or passing it on is the owner's business.
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

fn another_open(what: &str, value: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{what} {value:#x} belongs to another device open; use it with the device that made it"
        ),
    )
}

impl DeviceFd {
    /// The library this device was opened with.
    pub fn lib(&self) -> &HlThunk {
        &self.lib
    }

    pub(crate) fn open_id(&self) -> u64 {
        self.open
    }

    /// Closes the device now, reporting hl-thunk's error (drop closes too,
    /// and logs it).
    pub fn close(mut self) -> io::Result<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        self.lib.close_fd(fd)
    }

    pub fn device_name(&self) -> c_int {
        // SAFETY: `hlthunk_get_device_name_from_fd` has the prototype FdFn
        // (see the contract on the prototypes); its one argument is a
        // value.
        unsafe { (self.lib.device_name_from_fd)(self.fd) }
    }

    pub fn pci_bus_id(&self) -> io::Result<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: `hlthunk_get_pci_bus_id_from_fd` has the prototype
        // BusIdFn (see the contract on the prototypes): it writes at most
        // the length it is given into the buffer, and `buf` has exactly
        // that many writable bytes.
        let rc =
            unsafe { (self.lib.pci_bus_id_from_fd)(self.fd, buf.as_mut_ptr(), buf.len() as c_int) };
        if rc < 0 {
            return Err(int_error(rc));
        }
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (its last byte was set to 0
        // above) and lives until the copy is made.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `dram_size` from the hardware info.
    pub fn dram_size(&self) -> io::Result<u64> {
        let mut buf = vec![0u8; HW_IP_INFO_BYTES];
        // SAFETY: `hlthunk_get_hw_ip_info` has the prototype HwIpFn (see the
        // contract on the prototypes): it writes one `struct
        // hlthunk_hw_ip_info` through the pointer, and `buf` has
        // HW_IP_INFO_BYTES writable bytes, more than that struct.
        let rc = unsafe { (self.lib.hw_ip_info)(self.fd, buf.as_mut_ptr()) };
        if rc < 0 {
            return Err(int_error(rc));
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[HW_IP_DRAM_SIZE_OFFSET..HW_IP_DRAM_SIZE_OFFSET + 8]);
        Ok(u64::from_ne_bytes(b))
    }

    /// `hlthunk_device_memory_alloc`; errno on failure.
    pub fn mem_alloc(&self, size: u64, page_size: u64) -> io::Result<AllocHandle> {
        // SAFETY: `hlthunk_device_memory_alloc` has the prototype AllocFn
        // (see the contract on the prototypes); every argument is a value.
        let raw = unsafe { (self.lib.mem_alloc)(self.fd, size, page_size, false, false) };
        if raw == 0 {
            return Err(errno());
        }
        Ok(AllocHandle {
            raw,
            open: self.open,
        })
    }

    /// `hlthunk_device_memory_free`. On failure (the driver refuses a
    /// mapped allocation) the handle comes back with the error.
    pub fn mem_free(&self, handle: AllocHandle) -> Result<(), (AllocHandle, io::Error)> {
        if handle.open != self.open {
            let err = another_open("allocation handle", handle.raw);
            return Err((handle, err));
        }
        // SAFETY: `hlthunk_device_memory_free` has the prototype HandleFn
        // (see the contract on the prototypes); every argument is a value,
        // and the handle names device memory, never host memory.
        let rc = unsafe { (self.lib.mem_free)(self.fd, handle.raw) };
        if rc < 0 {
            return Err((handle, int_error(rc)));
        }
        Ok(())
    }

    /// `hlthunk_device_memory_map`: the device VA of the whole allocation.
    pub fn mem_map(&self, handle: &AllocHandle) -> io::Result<DeviceVa> {
        if handle.open != self.open {
            return Err(another_open("allocation handle", handle.raw));
        }
        // SAFETY: `hlthunk_device_memory_map` has the prototype MapFn (see
        // the contract on the prototypes); every argument is a value (a
        // hint address of 0 lets the driver choose).
        let addr = unsafe { (self.lib.mem_map)(self.fd, handle.raw, 0) };
        if addr == 0 {
            return Err(errno());
        }
        Ok(DeviceVa {
            addr,
            open: self.open,
        })
    }

    /// `hlthunk_memory_unmap`. On failure (the driver refuses while a
    /// DMA-buf of the mapping is open) the address comes back with the
    /// error.
    pub fn unmap(&self, va: DeviceVa) -> Result<(), (DeviceVa, io::Error)> {
        if va.open != self.open {
            let err = another_open("device address", va.addr);
            return Err((va, err));
        }
        // SAFETY: `hlthunk_memory_unmap` has the prototype HandleFn (see the
        // contract on the prototypes); every argument is a value, and the
        // address is a device VA, not a host mapping.
        let rc = unsafe { (self.lib.unmap)(self.fd, va.addr) };
        if rc < 0 {
            return Err((va, int_error(rc)));
        }
        Ok(())
    }

    /// Exports `[va + offset, +size)` as a DMA-buf; the caller owns the fd.
    pub fn export_dmabuf(
        &self,
        va: &DeviceVa,
        size: u64,
        offset: u64,
        flags: u32,
    ) -> io::Result<OwnedFd> {
        if va.open != self.open {
            return Err(another_open("device address", va.addr));
        }
        // SAFETY: `hlthunk_device_mapped_memory_export_dmabuf_fd` has the
        // prototype ExportFn (see the contract on the prototypes); every
        // argument is a value.
        let rc = unsafe { (self.lib.export_dmabuf)(self.fd, va.addr, size, offset, flags) };
        if rc < 0 {
            return Err(int_error(rc));
        }
        // SAFETY: rc >= 0 is the new DMA-buf fd the export opened for its
        // caller; hl-thunk keeps no copy, so nothing else owns or closes
        // it.
        Ok(unsafe { OwnedFd::from_raw_fd(rc) })
    }
}

impl HlThunk {
    /// `hlthunk_close`, for [`DeviceFd`] alone, which owns the fd and
    /// calls this once.
    fn close_fd(&self, fd: c_int) -> io::Result<()> {
        // SAFETY: `hlthunk_close` has the prototype FdFn (see the contract
        // on the prototypes); its one argument is a value: the fd of a
        // `DeviceFd`, open since `open` and closed only here.
        let rc = unsafe { (self.close)(fd) };
        if rc < 0 {
            Err(int_error(rc))
        } else {
            Ok(())
        }
    }
}

impl Drop for DeviceFd {
    fn drop(&mut self) {
        if self.fd < 0 {
            return;
        }
        if let Err(e) = self.lib.close_fd(self.fd) {
            log::warn!("hlthunk_close(fd {}) failed: {e}", self.fd);
        }
    }
}
