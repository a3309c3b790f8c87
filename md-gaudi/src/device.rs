//! One opened Gaudi device: its fd, identity and DRAM size, and the
//! allocation, mapping and export calls with the driver's rules checked
//! first, so that a broken rule gets its own named error (the driver itself
//! answers EINVAL to all of them).

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{GaudiError, Result};
use crate::hlthunk::{device_name, HlThunk};

/// The page size the driver's DMA-buf export checks use.
pub const PAGE: u64 = 4096;

/// Flags a DMA-buf export must carry, exactly.
pub const EXPORT_FLAGS: u32 = (libc::O_RDWR | libc::O_CLOEXEC) as u32;

#[derive(Default)]
struct Book {
    /// handle -> size asked for.
    allocs: HashMap<u64, u64>,
    /// device VA -> (handle, size).
    maps: BTreeMap<u64, (u64, u64)>,
    in_use: u64,
    /// Allocations given up by their owner whose mapping the driver would
    /// not remove yet, because a DMA-buf exported from it is still open:
    /// (VA, handle), unmapped and freed by [`Device::reclaim`] once the
    /// DMA-buf is released.
    deferred: Vec<(u64, u64)>,
}

/// An open device. Closing it (on drop) makes the driver free whatever is
/// still allocated through it.
pub struct Device {
    lib: Arc<HlThunk>,
    fd: c_int,
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
        let fd = lib.open(bus_id).map_err(|err| GaudiError::OpenFailed {
            target: bus_id.map_or("DONT_CARE, no bus id".into(), |b| format!("bus id {b}")),
            err,
        })?;
        let name = format!("gaudi{index}");
        let close_on_err = |e: GaudiError| {
            let _ = lib.close(fd);
            e
        };
        let driver = |call: &'static str, err: std::io::Error| GaudiError::Driver {
            device: name.clone(),
            call,
            err,
        };
        let bus = lib
            .pci_bus_id(fd)
            .map_err(|e| close_on_err(driver("hlthunk_get_pci_bus_id_from_fd", e)))?;
        let dram_size = lib
            .dram_size(fd)
            .map_err(|e| close_on_err(driver("hlthunk_get_hw_ip_info", e)))?;
        let model = sysfs_type.unwrap_or_else(|| device_name::label(lib.device_name(fd)));
        Ok(Device {
            lib,
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
        &self.lib
    }

    /// The device fd, for calling hl-thunk directly (tests of the
    /// library's own checks). Closed by this `Device` only.
    pub fn raw_fd(&self) -> c_int {
        self.fd
    }

    /// Bytes allocated through this device and not yet freed.
    pub fn in_use(&self) -> u64 {
        self.book().in_use
    }

    /// `hlthunk_device_memory_alloc`; `page_size` 0 is the driver's default.
    pub fn alloc(&self, size: u64, page_size: u64) -> Result<u64> {
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
        let handle = self.lib.mem_alloc(self.fd, size, page_size).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOMEM) {
                self.exhausted(size, in_use)
            } else {
                self.driver("hlthunk_device_memory_alloc", e)
            }
        })?;
        let mut book = self.book();
        book.allocs.insert(handle, size);
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

    /// `hlthunk_device_memory_free`; the handle must not be mapped.
    pub fn free(&self, handle: u64) -> Result<()> {
        {
            let book = self.book();
            if !book.allocs.contains_key(&handle) {
                return Err(GaudiError::NoSuchHandle {
                    device: self.name.clone(),
                    handle,
                });
            }
            if book.maps.values().any(|(mapped, _)| *mapped == handle) {
                return Err(GaudiError::StillMapped {
                    device: self.name.clone(),
                    handle,
                });
            }
        }
        self.lib
            .mem_free(self.fd, handle)
            .map_err(|e| self.driver("hlthunk_device_memory_free", e))?;
        let mut book = self.book();
        if let Some(size) = book.allocs.remove(&handle) {
            book.in_use -= size;
        }
        Ok(())
    }

    /// `hlthunk_device_memory_map`: the device VA of the whole allocation.
    pub fn map(&self, handle: u64) -> Result<u64> {
        let Some(&size) = self.book().allocs.get(&handle) else {
            return Err(GaudiError::NoSuchHandle {
                device: self.name.clone(),
                handle,
            });
        };
        let va = self
            .lib
            .mem_map(self.fd, handle)
            .map_err(|e| self.driver("hlthunk_device_memory_map", e))?;
        self.book().maps.insert(va, (handle, size));
        Ok(va)
    }

    /// `hlthunk_memory_unmap` of a VA [`map`](Self::map) returned. The
    /// driver refuses while a DMA-buf exported from the mapping is open
    /// (`StillExported`): nothing here can know whether one is, since any
    /// copy of its fd, or a NIC registration, holds it.
    pub fn unmap(&self, va: u64) -> Result<()> {
        if !self.book().maps.contains_key(&va) {
            return Err(GaudiError::NotMapped {
                device: self.name.clone(),
                addr: va,
            });
        }
        self.lib.unmap(self.fd, va).map_err(|e| {
            // The VA is mapped (the book says so), so the driver's only
            // EINVAL left is an open export (unmap_device_va).
            if e.raw_os_error() == Some(libc::EINVAL) {
                GaudiError::StillExported {
                    device: self.name.clone(),
                    addr: va,
                }
            } else {
                self.driver("hlthunk_memory_unmap", e)
            }
        })?;
        self.book().maps.remove(&va);
        Ok(())
    }

    /// Unmaps and frees an allocation its owner has given up. While a
    /// DMA-buf of it is open (an fd the owner handed out, a NIC
    /// registration) the driver keeps the mapping, and so the memory: the
    /// allocation is deferred and freed by a later [`reclaim`](Self::reclaim)
    /// after the DMA-buf's release, never before. Returns whether it was
    /// freed now.
    pub fn unmap_and_free(&self, va: u64, handle: u64) -> Result<bool> {
        match self.unmap(va) {
            Ok(()) => {}
            Err(GaudiError::StillExported { .. }) => {
                let mut book = self.book();
                if !book.deferred.contains(&(va, handle)) {
                    book.deferred.push((va, handle));
                }
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        self.free(handle)?;
        Ok(true)
    }

    /// Frees the deferred allocations whose DMA-bufs have been released;
    /// returns how many are still held by one.
    pub fn reclaim(&self) -> usize {
        let deferred = std::mem::take(&mut self.book().deferred);
        for (va, handle) in deferred {
            let outcome = self.unmap_and_free(va, handle);
            if let Err(e) = outcome {
                log::warn!("{}: freeing {va:#x} (handle {handle:#x}): {e}", self.name);
            }
        }
        self.book().deferred.len()
    }

    /// Allocations given up by their owners and still held by an open
    /// DMA-buf (see [`unmap_and_free`](Self::unmap_and_free)).
    pub fn deferred(&self) -> usize {
        self.book().deferred.len()
    }

    /// Exports `[va + offset, +size)` of a mapping as a DMA-buf the caller
    /// owns, after checking the driver's rules.
    pub fn export_dmabuf(&self, va: u64, size: u64, offset: u64, flags: u32) -> Result<OwnedFd> {
        let dev = || self.name.clone();
        if flags != EXPORT_FLAGS {
            return Err(GaudiError::ExportFlags {
                device: dev(),
                flags,
                expected: EXPORT_FLAGS,
            });
        }
        for (what, value) in [("address", va), ("offset", offset)] {
            if !value.is_multiple_of(PAGE) {
                return Err(GaudiError::ExportMisaligned {
                    device: dev(),
                    what,
                    value,
                    page: PAGE,
                });
            }
        }
        if size < PAGE {
            return Err(GaudiError::ExportTooSmall {
                device: dev(),
                size,
                page: PAGE,
            });
        }
        let Some(&(_, mapping_len)) = self.book().maps.get(&va) else {
            return Err(GaudiError::NotMapped {
                device: dev(),
                addr: va,
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
        self.lib
            .export_dmabuf(self.fd, va, size, offset, flags)
            .map_err(|e| self.driver("hlthunk_device_mapped_memory_export_dmabuf_fd", e))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // What is still exported is freed by the driver when its DMA-bufs
        // are released: an export holds the device until then.
        let held = self.reclaim();
        if held > 0 {
            log::info!(
                "{}: closing with {held} allocations still held by open DMA-bufs; the driver frees them when those are released",
                self.name
            );
        }
        if let Err(e) = self.lib.close(self.fd) {
            log::warn!("{}: hlthunk_close failed: {e}", self.name);
        }
    }
}
