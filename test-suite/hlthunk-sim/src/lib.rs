//! **Test double.** A simulator of Intel Gaudi's user-space driver library,
//! hl-thunk, built as `libhlthunk_sim.so`. There is no Gaudi on the machines
//! this project is developed on; md-gaudi loads this library through
//! `UCT_GAUDI_HLTHUNK_LIB` so that its code runs against the real hl-thunk
//! prototypes and the real driver's rules. Nothing it does touches hardware,
//! and everything it reports says it is simulated (the bus ids begin with
//! `sim`, and `hlthunk_sim_describe` says what it is).
//!
//! What it simulates, per device: an exclusive open, DRAM of a fixed size
//! (allocations count against it; no memory backs them, as the CPU cannot
//! touch device memory anyway), mappings to device virtual addresses, and
//! DMA-buf export with the checks of hl-thunk and of the kernel driver:
//! flags exactly `O_RDWR | O_CLOEXEC` (hl-thunk's own check, in user
//! space, not the driver's); the address must be the start of a mapping
//! (not a handle); then the driver's `validate_export_params` as of Linux
//! 6.7: size non-zero and a multiple of the page, offset page-aligned, and
//! `offset + size` inside the mapping.
//!
//! DMA-buf exports are tracked as the habanalabs driver tracks them
//! (Linux `drivers/accel/habanalabs/common/memory.c`, read at torvalds/linux
//! 0791faeb and HabanaAI/drivers.accel.habanalabs.kernel 4058b6e1; none of
//! its code is used here):
//! - `export_dmabuf_from_addr` takes an export reference on the mapping
//!   (`memhash_node_export_get` raises the mapping's `export_cnt`), and
//!   `export_dmabuf` holds the context (`hl_ctx_get`) and the device file
//!   (`get_file`; older kernels hold the context only, to the same effect)
//!   until the DMA-buf is released;
//! - the release (`hl_release_dmabuf`, when the last reference to the
//!   DMA-buf goes: every fd and every importer such as an RDMA MR) drops
//!   both;
//! - `unmap_device_va` refuses a mapping whose `export_cnt` is not zero with
//!   -EINVAL, and logs a `dev_err` ("failed to unmap ..., memory is
//!   exported") each time: `hlthunk_sim_refused_unmaps` counts those
//!   refusals, the lines a real device would add to the kernel log;
//! - `free_device_memory` refuses a handle that is still mapped with
//!   -EINVAL, so an exported allocation cannot be freed either: nothing is
//!   freed or deferred under an open DMA-buf, the caller must retry after
//!   the release;
//! - closing the device fd does not release the device while a DMA-buf is
//!   open (the export holds the device file): its memory stays allocated,
//!   the device stays busy (`hlthunk_open` gets EBUSY) and everything is
//!   freed when the last DMA-buf is released.
//!
//! The exported fd is one end of a socket pair whose other end the
//! simulator keeps: when every copy of the exported fd is closed (dup'd
//! copies and copies in other processes included), the kept end sees a
//! hang-up, which the simulator takes as the DMA-buf's release; it looks
//! for releases at the start of every call. As with a real Gaudi DMA-buf,
//! the CPU cannot mmap it (ENODEV) or read data from it.
//!
//! Deliberate differences from the real stack, each for a test's sake:
//! handles are page-aligned multiples of [`PAGE`] (the driver's are small
//! idr ids, 1, 2, 3, ...), so that a handle passed where a VA belongs
//! passes every alignment check and reaches the one that names the mistake,
//! the lookup of a mapping at that address.
//!
//! Settings (environment, read once): `HLTHUNK_SIM_DEVICES` (default 2),
//! `HLTHUNK_SIM_DRAM_MB` per device (default 16384).

//!
//! Tests find the built library with [`library_path`]: a dev-dependency on
//! this crate makes cargo build `libhlthunk_sim.so` beside the test
//! binaries, and the rlib carries the function that finds it there, and
//! [`loaded`], which reads the loaded copy's counters and makes its raw
//! calls with any integer.

pub mod loaded;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, CStr};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// `libhlthunk_sim.so` as cargo builds it for tests: beside the running
/// test binary, in its `deps/` folder, or up to two folders above it.
/// `None` when it is not built (the test crate lacks the dev-dependency
/// on `hlthunk-sim`).
pub fn library_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_path_buf();
    for _ in 0..3 {
        for candidate in [
            dir.join("libhlthunk_sim.so"),
            dir.join("deps/libhlthunk_sim.so"),
        ] {
            if candidate.exists() {
                return Some(candidate);
            }
        }
        dir = dir.parent()?.to_path_buf();
    }
    None
}

/// `enum hlthunk_device_name` values.
pub const HLTHUNK_DEVICE_GOYA: c_int = 0;
pub const HLTHUNK_DEVICE_GAUDI: c_int = 2;
pub const HLTHUNK_DEVICE_INVALID: c_int = 3;
pub const HLTHUNK_DEVICE_DONT_CARE: c_int = 4;
pub const HLTHUNK_DEVICE_GAUDI2: c_int = 5;

/// The host page size the driver's export checks use.
pub const PAGE: u64 = 4096;
/// The simulated DRAM page: allocations are rounded up to it.
pub const DRAM_PAGE: u64 = 2 << 20;
/// Where device virtual addresses start; device N's range is offset by N<<40.
pub const VA_BASE: u64 = 0x1001_0000_0000;

const DESCRIPTION: &CStr =
    c"hl-thunk simulator (test double from uct-rs test-suite; no Gaudi hardware)";

struct Alloc {
    size: u64,
    maps: u32,
}

struct Mapping {
    handle: u64,
    size: u64,
    /// One entry per DMA-buf exported from this mapping and not yet
    /// released: the simulator's end of the exported socket pair.
    exports: Vec<OwnedFd>,
}

/// Whether the DMA-buf watched by `kept` was released: every copy of the
/// exported end is closed, so the kept end hangs up.
fn released(kept: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: kept.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout; poll writes only `revents`.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLNVAL) != 0
}

struct Device {
    bus_id: String,
    dram_size: u64,
    used: u64,
    /// The fd of the process's open of this device, when open.
    open_fd: Option<RawFd>,
    /// Closed by its user while DMA-bufs were open: still busy, its memory
    /// still allocated, until the last of them is released.
    closing: bool,
    next_handle: u64,
    next_va: u64,
    allocs: HashMap<u64, Alloc>,
    maps: BTreeMap<u64, Mapping>,
}

impl Device {
    /// Frees everything, as the driver does when the device is released.
    fn release(&mut self) {
        self.maps.clear();
        self.allocs.clear();
        self.used = 0;
        self.open_fd = None;
        self.closing = false;
    }

    /// Open or still held by a DMA-buf after its fd was closed.
    fn busy(&self) -> bool {
        self.open_fd.is_some() || self.closing
    }

    fn open_exports(&self) -> usize {
        self.maps.values().map(|m| m.exports.len()).sum()
    }

    /// Drops the export references of released DMA-bufs, and releases a
    /// device closed by its user once nothing holds it any more.
    fn reap_exports(&mut self) {
        for mapping in self.maps.values_mut() {
            mapping.exports.retain(|kept| !released(kept));
        }
        if self.closing && self.open_exports() == 0 {
            self.release();
        }
    }
}

struct Sim {
    devices: Vec<Device>,
    /// Unmaps refused because the mapping is exported: on the driver, one
    /// `dev_err` line in the kernel log each.
    refused_unmaps: u64,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn sim() -> MutexGuard<'static, Sim> {
    static SIM: OnceLock<Mutex<Sim>> = OnceLock::new();
    let sim = SIM.get_or_init(|| {
        let n = env_u64("HLTHUNK_SIM_DEVICES", 2).min(16);
        let dram = env_u64("HLTHUNK_SIM_DRAM_MB", 16384) << 20;
        Mutex::new(Sim {
            devices: (0..n)
                .map(|i| Device {
                    bus_id: format!("sim0:{:02x}:00.0", i + 1),
                    dram_size: dram,
                    used: 0,
                    open_fd: None,
                    closing: false,
                    next_handle: 1,
                    next_va: VA_BASE + (i << 40),
                    allocs: HashMap::new(),
                    maps: BTreeMap::new(),
                })
                .collect(),
            refused_unmaps: 0,
        })
    });
    let mut state = sim.lock().unwrap_or_else(|p| p.into_inner());
    // Every call sees the DMA-bufs released since the last one.
    for device in &mut state.devices {
        device.reap_exports();
    }
    state
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Fails a call that returns an int: -errno, with errno set too.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -e
}

fn device_of(state: &mut Sim, fd: c_int) -> Option<&mut Device> {
    state
        .devices
        .iter_mut()
        .find(|device| device.open_fd == Some(fd))
}

fn memfd(name: &str) -> Option<OwnedFd> {
    let cname = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid C string; the returned fd is new and ours.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn name_matches(name: c_int) -> bool {
    name == HLTHUNK_DEVICE_DONT_CARE || name == HLTHUNK_DEVICE_GAUDI2
}

/// Opens a simulated device: the first free one, or the one at `busid`.
/// Returns an fd (a memfd standing in for /dev/accel/accelN) or -1 with
/// errno ENODEV (no such device) or EBUSY (already open).
///
/// # Safety
/// `busid` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn hlthunk_open(device_name: c_int, busid: *const c_char) -> c_int {
    if !name_matches(device_name) {
        set_errno(libc::ENODEV);
        return -1;
    }
    let want = if busid.is_null() {
        None
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        Some(
            unsafe { CStr::from_ptr(busid) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    let mut state = sim();
    let idx = match &want {
        Some(wanted) => match state
            .devices
            .iter()
            .position(|device| &device.bus_id == wanted)
        {
            Some(i) if state.devices[i].busy() => {
                set_errno(libc::EBUSY);
                return -1;
            }
            Some(i) => i,
            None => {
                set_errno(libc::ENODEV);
                return -1;
            }
        },
        None => match state.devices.iter().position(|device| !device.busy()) {
            Some(i) => i,
            None => {
                set_errno(if state.devices.is_empty() {
                    libc::ENODEV
                } else {
                    libc::EBUSY
                });
                return -1;
            }
        },
    };
    let Some(fd) = memfd(&format!("hlthunk-sim-accel{idx}")) else {
        set_errno(libc::EMFILE);
        return -1;
    };
    let raw = fd.into_raw_fd();
    state.devices[idx].open_fd = Some(raw);
    raw
}

/// Closes a device fd and frees what was allocated through it; while a
/// DMA-buf of it is open the device stays held (busy, its memory allocated)
/// until the last one is released, as the driver's exports hold the device
/// file.
#[no_mangle]
pub extern "C" fn hlthunk_close(fd: c_int) -> c_int {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        set_errno(libc::EBADF);
        return -1;
    };
    if device.open_exports() > 0 {
        device.open_fd = None;
        device.closing = true;
    } else {
        device.release();
    }
    // SAFETY: the fd was created by hlthunk_open and is closed only here.
    unsafe { libc::close(fd) }
}

#[no_mangle]
pub extern "C" fn hlthunk_get_device_count(device_name: c_int) -> c_int {
    if !name_matches(device_name) {
        return 0;
    }
    sim().devices.len() as c_int
}

#[no_mangle]
pub extern "C" fn hlthunk_get_device_name_from_fd(fd: c_int) -> c_int {
    match device_of(&mut sim(), fd) {
        Some(_) => HLTHUNK_DEVICE_GAUDI2,
        None => HLTHUNK_DEVICE_INVALID,
    }
}

/// Writes the device's bus id (beginning with `sim`) into `buf`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hlthunk_get_pci_bus_id_from_fd(
    fd: c_int,
    buf: *mut c_char,
    len: c_int,
) -> c_int {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        return fail(libc::EBADF);
    };
    let bus_id = device.bus_id.as_bytes();
    if buf.is_null() || len <= bus_id.len() as c_int {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller gave `len` bytes and the id plus NUL fits.
    unsafe {
        std::ptr::copy_nonoverlapping(bus_id.as_ptr(), buf.cast::<u8>(), bus_id.len());
        *buf.add(bus_id.len()) = 0;
    }
    0
}

/// Fills the start of `struct hlthunk_hw_ip_info`: sram_base_address,
/// dram_base_address, dram_size (u64 each). Nothing past them is written.
///
/// # Safety
/// `hw_ip` points to a writable `struct hlthunk_hw_ip_info`.
#[no_mangle]
pub unsafe extern "C" fn hlthunk_get_hw_ip_info(fd: c_int, hw_ip: *mut u64) -> c_int {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        return fail(libc::EBADF);
    };
    if hw_ip.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes a writable `struct hlthunk_hw_ip_info`
    // (this function's contract), which begins with three u64 fields
    // (sram_base_address, dram_base_address, dram_size).
    unsafe {
        *hw_ip = 0;
        *hw_ip.add(1) = VA_BASE;
        *hw_ip.add(2) = device.dram_size;
    }
    0
}

/// Allocates device memory: returns a handle, or 0 with errno EINVAL (size 0,
/// page size not a power of two), ENOMEM (more than the DRAM left) or EBADF.
#[no_mangle]
pub extern "C" fn hlthunk_device_memory_alloc(
    fd: c_int,
    size: u64,
    page_size: u64,
    _contiguous: bool,
    _shared: bool,
) -> u64 {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        set_errno(libc::EBADF);
        return 0;
    };
    let page = if page_size == 0 { DRAM_PAGE } else { page_size };
    if size == 0 || !page.is_power_of_two() {
        set_errno(libc::EINVAL);
        return 0;
    }
    let Some(rounded) = size.checked_next_multiple_of(page) else {
        set_errno(libc::EINVAL);
        return 0;
    };
    if device.used.saturating_add(rounded) > device.dram_size {
        set_errno(libc::ENOMEM);
        return 0;
    }
    // A DELIBERATE DIFFERENCE from the driver, whose handles are idr ids
    // (1, 2, 3, ...; `alloc_device_memory`): these are page-aligned (id *
    // PAGE), still far below any VA, so that a handle passed where a VA is
    // expected passes every alignment check and is refused by the lookup of
    // a mapping at that address, the check that names the mistake. On the
    // driver an unaligned handle would be refused too, by the lookup as
    // well (`memhash_node_export_get` runs before `validate_export_params`).
    let handle = device.next_handle * PAGE;
    device.next_handle += 1;
    device.used += rounded;
    device.allocs.insert(
        handle,
        Alloc {
            size: rounded,
            maps: 0,
        },
    );
    handle
}

/// Frees an allocation: EINVAL for an unknown handle or one still mapped
/// (`free_device_memory`: "handle is mapped, cannot free"); an exported
/// allocation is always still mapped, see `hlthunk_memory_unmap`.
#[no_mangle]
pub extern "C" fn hlthunk_device_memory_free(fd: c_int, handle: u64) -> c_int {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        return fail(libc::EBADF);
    };
    match device.allocs.get(&handle) {
        None => fail(libc::EINVAL),
        Some(alloc) if alloc.maps > 0 => fail(libc::EINVAL),
        Some(alloc) => {
            device.used -= alloc.size;
            device.allocs.remove(&handle);
            0
        }
    }
}

/// Maps an allocation to a device VA (the hint is ignored): returns the VA,
/// or 0 with errno EINVAL for an unknown handle.
#[no_mangle]
pub extern "C" fn hlthunk_device_memory_map(fd: c_int, handle: u64, _hint_addr: u64) -> u64 {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        set_errno(libc::EBADF);
        return 0;
    };
    let Some(alloc) = device.allocs.get_mut(&handle) else {
        set_errno(libc::EINVAL);
        return 0;
    };
    alloc.maps += 1;
    let size = alloc.size;
    let va = device.next_va;
    // A guard gap between mappings, so that overruns do not land in a
    // neighbour.
    device.next_va += size + DRAM_PAGE;
    device.maps.insert(
        va,
        Mapping {
            handle,
            size,
            exports: Vec::new(),
        },
    );
    va
}

/// Unmaps a VA returned by `hlthunk_device_memory_map`; EINVAL for any
/// other address, and EINVAL while a DMA-buf exported from the mapping is
/// open (`unmap_device_va`: dev_err "failed to unmap %#llx, memory is
/// exported", counted by `hlthunk_sim_refused_unmaps`).
#[no_mangle]
pub extern "C" fn hlthunk_memory_unmap(fd: c_int, device_virt_addr: u64) -> c_int {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        return fail(libc::EBADF);
    };
    match device.maps.get(&device_virt_addr) {
        None => return fail(libc::EINVAL),
        Some(mapping) if !mapping.exports.is_empty() => {
            state.refused_unmaps += 1;
            return fail(libc::EINVAL);
        }
        Some(_) => {}
    }
    let Some(mapping) = device.maps.remove(&device_virt_addr) else {
        return fail(libc::EINVAL);
    };
    if let Some(alloc) = device.allocs.get_mut(&mapping.handle) {
        alloc.maps -= 1;
    }
    0
}

/// Exports `[addr + offset, +size)` of a mapping as a DMA-buf; every
/// violation returns -EINVAL, in this order:
/// - the flags, exactly `O_RDWR | O_CLOEXEC`: hl-thunk's own check, in
///   user space before any ioctl (`hlthunk_device_mapped_memory_export_dmabuf_fd`
///   in HabanaAI/hl-thunk-open `src/libhlthunk.c`). The driver does not
///   check them: `export_dmabuf` only passes them on, to
///   `dma_buf_export` and to the fd allocation (`dma_buf_fd`, or
///   `get_unused_fd_flags` in newer kernels);
/// - the driver's `export_dmabuf_from_addr`: the mapping at `addr` first
///   (`memhash_node_export_get`), then `validate_export_params`. Since
///   Linux 6.7 ("accel/habanalabs: export dma-buf only if size/offset
///   multiples of PAGE_SIZE") `validate_export_params_common` refuses an
///   address that is not page-aligned, a size that is zero or not a
///   multiple of the page (`!size || !PAGE_ALIGNED(size)`) and an offset
///   that is not page-aligned; then `offset + size` must lie inside the
///   allocation (`phys_pg_pack->total_size`).
///
/// The export holds the mapping (no unmap, hence no free) and the device
/// until the DMA-buf is released.
#[no_mangle]
pub extern "C" fn hlthunk_device_mapped_memory_export_dmabuf_fd(
    fd: c_int,
    addr: u64,
    size: u64,
    offset: u64,
    flags: u32,
) -> c_int {
    let mut state = sim();
    let Some(device) = device_of(&mut state, fd) else {
        return fail(libc::EBADF);
    };
    // hl-thunk (user space), not the driver.
    if flags != (libc::O_RDWR | libc::O_CLOEXEC) as u32 {
        return fail(libc::EINVAL);
    }
    // memhash_node_export_get: `addr` must be where a mapping starts.
    let Some(mapping) = device.maps.get_mut(&addr) else {
        return fail(libc::EINVAL);
    };
    // validate_export_params_common (Linux 6.7 and later).
    let aligned = |value: u64| value.is_multiple_of(PAGE);
    if !aligned(addr) || size == 0 || !aligned(size) || !aligned(offset) {
        return fail(libc::EINVAL);
    }
    // validate_export_params: inside the allocation.
    let inside = offset
        .checked_add(size)
        .is_some_and(|end| end <= mapping.size);
    if !inside {
        return fail(libc::EINVAL);
    }
    let mut pair = [0 as c_int; 2];
    // SAFETY: `pair` has room for the two fds socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return fail(libc::EMFILE);
    }
    // SAFETY: both fds were just created by socketpair and are owned by
    // nobody else; `pair[1]` is handed to the caller, who owns it.
    let kept = unsafe { OwnedFd::from_raw_fd(pair[0]) };
    // The exported end reads end-of-file: the CPU gets no data from it.
    // SAFETY: `kept` is a valid socket.
    unsafe { libc::shutdown(kept.as_raw_fd(), libc::SHUT_WR) };
    mapping.exports.push(kept);
    pair[1]
}

/// Simulator only: says what this library is. md-gaudi looks for this
/// symbol to mark its devices as simulated.
#[no_mangle]
pub extern "C" fn hlthunk_sim_describe() -> *const c_char {
    DESCRIPTION.as_ptr()
}

/// Simulator only: live allocations over all devices (for leak checks).
#[no_mangle]
pub extern "C" fn hlthunk_sim_live_allocations() -> u64 {
    sim().devices.iter().map(|d| d.allocs.len() as u64).sum()
}

/// Simulator only: live mappings over all devices (for leak checks).
#[no_mangle]
pub extern "C" fn hlthunk_sim_live_mappings() -> u64 {
    sim().devices.iter().map(|d| d.maps.len() as u64).sum()
}

/// Simulator only: unmaps refused because the mapping was exported, over
/// all devices since the library was loaded; each is a `dev_err` line in
/// the kernel log on a real device.
#[no_mangle]
pub extern "C" fn hlthunk_sim_refused_unmaps() -> u64 {
    sim().refused_unmaps
}

/// Simulator only: DMA-bufs exported and not yet released, over all
/// devices (for tests of what an open export holds).
#[no_mangle]
pub extern "C" fn hlthunk_sim_open_exports() -> u64 {
    sim().devices.iter().map(|d| d.open_exports() as u64).sum()
}
