//! One opened Gaudi device: its fd, identity and DRAM size, and the
//! allocation, mapping and export calls with the driver's rules checked
//! first, so that a broken rule gets its own named error (the driver itself
//! answers EINVAL to all of them).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{GaudiError, Result};
use crate::hlthunk::{device_name, AllocHandle, DeviceFd, DeviceVa, HlThunk};

/// The page size the driver's DMA-buf export checks use.
pub const PAGE: u64 = 4096;

/// Flags a DMA-buf export must carry, exactly: hl-thunk's
/// `hlthunk_device_mapped_memory_export_dmabuf_fd` refuses any other with
/// EINVAL before calling the driver (which would accept them).
pub const EXPORT_FLAGS: u32 = (libc::O_RDWR | libc::O_CLOEXEC) as u32;

/// Refused retries of a deferred free, with no DMA-buf fd md-gaudi handed
/// out still open, after which it is reported with `log::error!`.
pub const REFUSALS_REPORTED: u32 = 4;

/// The wait after a refused retry before the next one on an alloc or
/// free: doubled after each refusal, up to [`RETRY_MAX`]. An explicit
/// [`Device::reclaim`] does not wait.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two retries on an alloc or free.
pub const RETRY_MAX: Duration = Duration::from_secs(64);

/// A DMA-buf fd md-gaudi handed out (to a memory query's caller, who owns
/// it): its number and the identity of the file it was, so that the same
/// number reused for another file is not taken for it.
struct HandedOut {
    fd: RawFd,
    file: (u64, u64),
}

/// (st_dev, st_ino) of an open fd: every DMA-buf is its own inode.
fn file_identity(fd: RawFd) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` to the pointer and does nothing
    // else; an fd that is not open gives EBADF.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// An allocation given up by its owner while a DMA-buf exported from it
/// was still held.
struct Deferred {
    va: DeviceVa,
    handle: AllocHandle,
    /// Unmaps the driver refused with no fd md-gaudi handed out open.
    refused: u32,
    /// No retry on an alloc or free before this.
    not_before: Option<Instant>,
}

/// What this device has allocated and mapped, by the driver's numbers
/// (the owned handles and addresses are with their owners).
#[derive(Default)]
struct Book {
    /// handle -> size asked for.
    allocs: HashMap<u64, u64>,
    /// device VA -> (handle, size).
    maps: BTreeMap<u64, (u64, u64)>,
    in_use: u64,
    /// device VA -> the DMA-buf fds handed out for that mapping.
    handed_out: HashMap<u64, Vec<HandedOut>>,
    /// Allocations given up by their owner whose mapping the driver would
    /// not remove yet, because a DMA-buf exported from it is still open:
    /// unmapped and freed by [`Device::reclaim`] once the DMA-buf is
    /// released.
    deferred: Vec<Deferred>,
}

/// An open device. Closing it (on drop) makes the driver free whatever is
/// still allocated through it.
///
/// Its free and unmap take what its own alloc and map returned, never an
/// integer, so safe code cannot free or unmap another's memory through
/// it. Each of these does not compile:
///
/// ```compile_fail,E0308
/// fn free_any(dev: &md_gaudi::Device) {
///     let _ = dev.free(0x1000);
/// }
/// ```
///
/// ```compile_fail,E0308
/// fn unmap_any(dev: &md_gaudi::Device) {
///     let _ = dev.unmap(0x1001_0000_0000);
/// }
/// ```
///
/// ```compile_fail,E0308
/// fn give_up_any(dev: &md_gaudi::Device) {
///     let _ = dev.unmap_and_free(0x1001_0000_0000, 0x1000);
/// }
/// ```
pub struct Device {
    fd: DeviceFd,
    /// `gaudi<N>`.
    pub name: String,
    /// The driver's device name (GAUDI2, ...), or sysfs `device_type`.
    pub model: String,
    pub bus_id: String,
    pub dram_size: u64,
    book: Mutex<Book>,
}

/// Bus ids of the accelerators sysfs knows, in device-number order.
pub fn sysfs_bus_ids(root: &Path) -> Vec<(String, Option<String>)> {
    let mut found: Vec<(u32, String, Option<String>)> = Vec::new();
    for (class, prefix) in [("class/accel", "accel"), ("class/habanalabs", "hl")] {
        let Ok(rd) = std::fs::read_dir(root.join(class)) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name
                .strip_prefix(prefix)
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let read = |attr: &str| {
                [e.path().join(attr), e.path().join("device").join(attr)]
                    .iter()
                    .find_map(|p| std::fs::read_to_string(p).ok())
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
            };
            if let Some(bus) = read("pci_addr") {
                found.push((n, bus, read("device_type")));
            }
        }
        if !found.is_empty() {
            break;
        }
    }
    found.sort_by_key(|(n, _, _)| *n);
    found.into_iter().map(|(_, b, t)| (b, t)).collect()
}

impl Device {
    /// Opens device `index`: at `bus_id`, or the first free one.
    pub fn open(
        lib: Arc<HlThunk>,
        index: usize,
        bus_id: Option<&str>,
        sysfs_type: Option<String>,
    ) -> Result<Device> {
        // On an error below, `fd` is dropped, which closes it.
        let fd = lib.open(bus_id).map_err(|err| GaudiError::OpenFailed {
            target: bus_id.map_or("DONT_CARE, no bus id".into(), |b| format!("bus id {b}")),
            err,
        })?;
        let name = format!("gaudi{index}");
        let driver = |call: &'static str, err: std::io::Error| GaudiError::Driver {
            device: name.clone(),
            call,
            err,
        };
        let bus = fd
            .pci_bus_id()
            .map_err(|e| driver("hlthunk_get_pci_bus_id_from_fd", e))?;
        let dram_size = fd
            .dram_size()
            .map_err(|e| driver("hlthunk_get_hw_ip_info", e))?;
        let model = sysfs_type.unwrap_or_else(|| device_name::label(fd.device_name()));
        Ok(Device {
            fd,
            name,
            model,
            bus_id: bus,
            dram_size,
            book: Mutex::new(Book::default()),
        })
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn driver(&self, call: &'static str, err: std::io::Error) -> GaudiError {
        GaudiError::Driver {
            device: self.name.clone(),
            call,
            err,
        }
    }

    /// The library this device was opened with.
    pub fn lib(&self) -> &HlThunk {
        self.fd.lib()
    }

    /// Bytes allocated through this device and not yet freed.
    pub fn in_use(&self) -> u64 {
        self.book().in_use
    }

    /// `hlthunk_device_memory_alloc`; `page_size` 0 is the driver's default.
    pub fn alloc(&self, size: u64, page_size: u64) -> Result<AllocHandle> {
        if size == 0 {
            return Err(GaudiError::ZeroSize {
                device: self.name.clone(),
            });
        }
        if page_size != 0 && !page_size.is_power_of_two() {
            return Err(GaudiError::BadPageSize {
                device: self.name.clone(),
                page_size,
            });
        }
        let in_use = self.book().in_use;
        if in_use.saturating_add(size) > self.dram_size {
            return Err(self.exhausted(size, in_use));
        }
        let handle = self.fd.mem_alloc(size, page_size).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOMEM) {
                self.exhausted(size, in_use)
            } else {
                self.driver("hlthunk_device_memory_alloc", e)
            }
        })?;
        let mut book = self.book();
        book.allocs.insert(handle.raw(), size);
        book.in_use += size;
        Ok(handle)
    }

    fn exhausted(&self, requested: u64, in_use: u64) -> GaudiError {
        GaudiError::DramExhausted {
            device: self.name.clone(),
            requested,
            dram_size: self.dram_size,
            in_use,
        }
    }

    /// Whether `handle` is a live allocation of this device.
    fn has(&self, book: &Book, handle: &AllocHandle) -> bool {
        handle.open_id() == self.fd.open_id() && book.allocs.contains_key(&handle.raw())
    }

    /// `hlthunk_device_memory_free`; the handle must not be mapped. On an
    /// error the handle comes back with it.
    pub fn free(&self, handle: AllocHandle) -> std::result::Result<(), (AllocHandle, GaudiError)> {
        let refused = {
            let book = self.book();
            if !self.has(&book, &handle) {
                Some(GaudiError::NoSuchHandle {
                    device: self.name.clone(),
                    handle: handle.raw(),
                })
            } else if book
                .maps
                .values()
                .any(|(mapped, _)| *mapped == handle.raw())
            {
                Some(GaudiError::StillMapped {
                    device: self.name.clone(),
                    handle: handle.raw(),
                })
            } else {
                None
            }
        };
        if let Some(e) = refused {
            return Err((handle, e));
        }
        let raw = handle.raw();
        self.fd
            .mem_free(handle)
            .map_err(|(h, e)| (h, self.driver("hlthunk_device_memory_free", e)))?;
        let mut book = self.book();
        if let Some(size) = book.allocs.remove(&raw) {
            book.in_use -= size;
        }
        Ok(())
    }

    /// `hlthunk_device_memory_map`: the device VA of the whole allocation.
    pub fn map(&self, handle: &AllocHandle) -> Result<DeviceVa> {
        let size = {
            let book = self.book();
            match book.allocs.get(&handle.raw()) {
                Some(&size) if self.has(&book, handle) => size,
                _ => {
                    return Err(GaudiError::NoSuchHandle {
                        device: self.name.clone(),
                        handle: handle.raw(),
                    })
                }
            }
        };
        let va = self
            .fd
            .mem_map(handle)
            .map_err(|e| self.driver("hlthunk_device_memory_map", e))?;
        self.book().maps.insert(va.addr(), (handle.raw(), size));
        Ok(va)
    }

    /// Whether `va` is a live mapping of this device: its length.
    fn mapping_len(&self, va: &DeviceVa) -> Option<u64> {
        if va.open_id() != self.fd.open_id() {
            return None;
        }
        self.book().maps.get(&va.addr()).map(|&(_, len)| len)
    }

    /// `hlthunk_memory_unmap` of a VA [`map`](Self::map) returned. The
    /// driver refuses while a DMA-buf exported from the mapping is open
    /// (`StillExported`), and logs an error in the kernel log each time.
    /// EINVAL is read as that refusal because the VA is mapped (the book
    /// says so), but that rests on the book being right: a deferred free
    /// refused too often is reported (see [`reclaim`](Self::reclaim)). On
    /// an error the address comes back with it.
    pub fn unmap(&self, va: DeviceVa) -> std::result::Result<(), (DeviceVa, GaudiError)> {
        if self.mapping_len(&va).is_none() {
            let e = GaudiError::NotMapped {
                device: self.name.clone(),
                addr: va.addr(),
            };
            return Err((va, e));
        }
        let addr = va.addr();
        self.fd.unmap(va).map_err(|(va, e)| {
            // The VA is mapped (the book says so), so the driver's only
            // EINVAL left is an open export (unmap_device_va).
            let e = if e.raw_os_error() == Some(libc::EINVAL) {
                GaudiError::StillExported {
                    device: self.name.clone(),
                    addr,
                }
            } else {
                self.driver("hlthunk_memory_unmap", e)
            };
            (va, e)
        })?;
        let mut book = self.book();
        book.maps.remove(&addr);
        book.handed_out.remove(&addr);
        Ok(())
    }

    /// A copy of `dmabuf` (a DMA-buf exported from the mapping at `va`)
    /// for a caller who will own it. Recorded, so that while the copy is
    /// open a deferred free of the mapping is not tried: the driver would
    /// only refuse it, and log an error each time.
    pub(crate) fn hand_out(&self, va: u64, dmabuf: &OwnedFd) -> std::io::Result<OwnedFd> {
        let copy = dmabuf.try_clone()?;
        let fd = copy.as_raw_fd();
        if let Some(file) = file_identity(fd) {
            let mut book = self.book();
            let handed = book.handed_out.entry(va).or_default();
            handed.retain(|h| h.fd != fd && file_identity(h.fd) == Some(h.file));
            handed.push(HandedOut { fd, file });
        }
        Ok(copy)
    }

    /// How many of the DMA-buf fds handed out for the mapping at `va` are
    /// still open (the same number, still the same file).
    fn handed_out_open(&self, va: u64) -> usize {
        let mut book = self.book();
        let Some(handed) = book.handed_out.get_mut(&va) else {
            return 0;
        };
        handed.retain(|h| file_identity(h.fd) == Some(h.file));
        handed.len()
    }

    /// Unmaps and frees an allocation its owner has given up. While a
    /// DMA-buf of it is open (an fd handed out by a query, a NIC
    /// registration) the driver keeps the mapping, and so the memory: the
    /// allocation is deferred and freed by a later [`reclaim`](Self::reclaim)
    /// after the DMA-buf's release, never before. While an fd md-gaudi
    /// handed out is open the driver is not even asked. Returns whether it
    /// was freed now; on another error the allocation is left to the
    /// driver, which frees it when the device is closed.
    pub fn unmap_and_free(&self, va: DeviceVa, handle: AllocHandle) -> Result<bool> {
        let addr = va.addr();
        let size = self.book().allocs.get(&handle.raw()).copied().unwrap_or(0);
        let open = self.handed_out_open(addr);
        if open > 0 {
            log::info!(
                "{}: allocation at {addr:#x} (handle {:#x}, {size} bytes) given up while {open} DMA-buf fd(s) of it handed out by a memory query are open; it is freed after they are closed",
                self.name, handle.raw()
            );
            self.defer(va, handle, 0);
            return Ok(false);
        }
        match self.unmap(va) {
            Ok(()) => {}
            Err((va, GaudiError::StillExported { .. })) => {
                log::info!(
                    "{}: allocation at {addr:#x} (handle {:#x}, {size} bytes) given up while the driver still holds a DMA-buf of it (unmap refused with EINVAL, \"memory is exported\"), though no fd md-gaudi handed out is open: a NIC registration or a copy of such an fd holds it; it is freed after its release",
                    self.name, handle.raw()
                );
                self.defer(va, handle, 1);
                return Ok(false);
            }
            Err((_, e)) => return Err(e),
        }
        self.free(handle).map_err(|(_, e)| e)?;
        Ok(true)
    }

    fn defer(&self, va: DeviceVa, handle: AllocHandle, refused: u32) {
        let mut book = self.book();
        if book.deferred.iter().any(|d| d.va.addr() == va.addr()) {
            return;
        }
        book.deferred.push(Deferred {
            va,
            handle,
            refused,
            not_before: (refused > 0).then(|| Instant::now() + backoff(refused)),
        });
    }

    /// Frees the deferred allocations whose DMA-bufs have been released;
    /// returns how many are still held by one. The driver is asked only
    /// about allocations with no fd md-gaudi handed out still open. An
    /// allocation the driver keeps refusing with none open (held by a NIC
    /// registration, a copy of such an fd, or this book wrong about the
    /// mapping) is reported with `log::error!` after [`REFUSALS_REPORTED`]
    /// refusals, and still retried.
    pub fn reclaim(&self) -> usize {
        self.reclaim_with(true)
    }

    /// [`reclaim`](Self::reclaim) as an alloc or free does it: an
    /// allocation the driver refused is retried only after a wait
    /// ([`RETRY_FIRST`], doubling up to [`RETRY_MAX`]), so that the
    /// driver's error lines do not fill the kernel log.
    pub fn reclaim_due(&self) -> usize {
        self.reclaim_with(false)
    }

    fn reclaim_with(&self, now_regardless: bool) -> usize {
        let deferred = std::mem::take(&mut self.book().deferred);
        let mut held = Vec::new();
        for mut d in deferred {
            let now = Instant::now();
            let waiting = !now_regardless && d.not_before.is_some_and(|t| now < t);
            let (addr, raw) = (d.va.addr(), d.handle.raw());
            if waiting || self.handed_out_open(addr) > 0 {
                held.push(d);
                continue;
            }
            match self.unmap(d.va) {
                Ok(()) => {
                    if let Err((_, e)) = self.free(d.handle) {
                        log::error!(
                            "{}: allocation at {addr:#x} (handle {raw:#x}) unmapped after its DMA-buf's release but not freed: {e}; the driver frees it when the device is closed",
                            self.name
                        );
                    }
                }
                Err((va, GaudiError::StillExported { .. })) => {
                    d.va = va;
                    d.refused += 1;
                    d.not_before = Some(now + backoff(d.refused));
                    if d.refused == REFUSALS_REPORTED {
                        log::error!(
                            "{}: allocation at {addr:#x} (handle {raw:#x}): the driver refused to unmap it {} times (EINVAL) with no DMA-buf fd md-gaudi handed out open; a NIC registration or a copy of a DMA-buf fd still holds it, or the driver's EINVAL means something else; retried at most every {}s, and freed by the driver when the device is closed",
                            self.name, d.refused, RETRY_MAX.as_secs()
                        );
                    }
                    held.push(d);
                }
                Err((_, e)) => {
                    log::error!(
                        "{}: allocation at {addr:#x} (handle {raw:#x}) cannot be unmapped: {e}; given up, the driver frees it when the device is closed",
                        self.name
                    );
                }
            }
        }
        let mut book = self.book();
        book.deferred.extend(held);
        book.deferred.len()
    }

    /// Allocations given up by their owners and still held by an open
    /// DMA-buf (see [`unmap_and_free`](Self::unmap_and_free)).
    pub fn deferred(&self) -> usize {
        self.book().deferred.len()
    }

    /// Deferred allocations the driver refused to unmap at least
    /// [`REFUSALS_REPORTED`] times with no fd md-gaudi handed out open
    /// (reported with `log::error!`).
    pub fn deferred_reported(&self) -> usize {
        self.book()
            .deferred
            .iter()
            .filter(|d| d.refused >= REFUSALS_REPORTED)
            .count()
    }

    /// Exports `[va + offset, +size)` of a mapping as a DMA-buf the caller
    /// owns, after checking the driver's rules.
    pub fn export_dmabuf(
        &self,
        va: &DeviceVa,
        size: u64,
        offset: u64,
        flags: u32,
    ) -> Result<OwnedFd> {
        let dev = || self.name.clone();
        if flags != EXPORT_FLAGS {
            return Err(GaudiError::ExportFlags {
                device: dev(),
                flags,
                expected: EXPORT_FLAGS,
            });
        }
        if size == 0 {
            return Err(GaudiError::ExportEmpty { device: dev() });
        }
        // The driver's validate_export_params_common (Linux 6.7 and later):
        // address, size and offset all multiples of the page.
        for (what, value) in [("address", va.addr()), ("size", size), ("offset", offset)] {
            if !value.is_multiple_of(PAGE) {
                return Err(GaudiError::ExportMisaligned {
                    device: dev(),
                    what,
                    value,
                    page: PAGE,
                });
            }
        }
        let Some(mapping_len) = self.mapping_len(va) else {
            return Err(GaudiError::NotMapped {
                device: dev(),
                addr: va.addr(),
            });
        };
        // The mapping covers the allocation rounded up to whole pages.
        let mapping_len = mapping_len.next_multiple_of(PAGE);
        if offset.checked_add(size).is_none_or(|end| end > mapping_len) {
            return Err(GaudiError::ExportOutOfBounds {
                device: dev(),
                offset,
                size,
                mapping_len,
            });
        }
        self.fd
            .export_dmabuf(va, size, offset, flags)
            .map_err(|e| self.driver("hlthunk_device_mapped_memory_export_dmabuf_fd", e))
    }
}

/// The wait after `refused` refusals.
fn backoff(refused: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1 << refused.saturating_sub(1).min(16))
        .min(RETRY_MAX)
}

impl Drop for Device {
    fn drop(&mut self) {
        // What is still exported is freed by the driver when its DMA-bufs
        // are released: an export holds the device until then.
        let held = self.reclaim();
        if held > 0 {
            // The DMA-bufs hold the device file, so the close below does
            // not free under them.
            log::info!(
                "{}: closing with {held} allocations still held by open DMA-bufs; the driver frees them when those are released",
                self.name
            );
        }
        // The fd closes after this, as the field is dropped.
    }
}
