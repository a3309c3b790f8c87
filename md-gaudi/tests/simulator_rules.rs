//! The hl-thunk simulator's own rules (a TEST DOUBLE: there is no Gaudi
//! here), called through its C ABI with md-gaudi's thin wrappers
//! ([`HlThunk`]), which check nothing: md-gaudi's own pre-checks are tested
//! in `simulated_gaudi.rs`. Each refused call breaks exactly one of the
//! rules (the driver's, or hl-thunk's own where named so), and the same
//! call with that one rule kept is accepted, so that a refusal can only
//! come from the rule it names.
//!
//! This binary opens and closes the devices itself (the simulator lives
//! in this process only); the tests share them one at a time.

use std::ffi::c_int;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, OnceLock};

use md_gaudi::device::{EXPORT_FLAGS, PAGE};
use md_gaudi::HlThunk;

const GIB: u64 = 1 << 30;
const EINVAL: Option<i32> = Some(libc::EINVAL);

fn lib() -> (&'static HlThunk, MutexGuard<'static, ()>) {
    static LIB: OnceLock<(HlThunk, Mutex<()>)> = OnceLock::new();
    let (lib, serial) = LIB.get_or_init(|| {
        let path = hlthunk_sim::library_path().expect(
            "libhlthunk_sim.so (the hl-thunk test double) is built beside the tests; run `cargo build -p hlthunk-sim`",
        );
        (HlThunk::load(&path).expect("load the simulator"), Mutex::new(()))
    });
    assert!(lib.simulator().is_some_and(|s| s.contains("simulator")));
    (lib, serial.lock().unwrap_or_else(|p| p.into_inner()))
}

/// One of the simulator's counters (`hlthunk_sim_*`).
fn counter(name: &str) -> u64 {
    let path = hlthunk_sim::library_path().expect("simulator built");
    // SAFETY: the simulator this process already loaded (dlopen returns the
    // same handle; its initialisers do not run again).
    let lib = unsafe { libloading::Library::new(path) }.expect("load the simulator");
    // SAFETY: the simulator's counters take nothing and return a u64; the
    // symbol is used only while `lib` is alive, here.
    let counter =
        unsafe { lib.get::<unsafe extern "C" fn() -> u64>(format!("{name}\0").as_bytes()) }
            .expect("simulator counter");
    // SAFETY: a counter with the prototype above; the library is loaded.
    unsafe { counter() }
}

fn errno<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// A device opened for one test and closed after it.
struct Open<'a> {
    lib: &'a HlThunk,
    fd: c_int,
}

impl<'a> Open<'a> {
    fn new(lib: &'a HlThunk) -> Self {
        let fd = lib.open(None).expect("a free simulated device");
        Open { lib, fd }
    }

    /// A mapped allocation of `size` bytes: (handle, VA).
    fn mapped(&self, size: u64) -> (u64, u64) {
        let handle = self.lib.mem_alloc(self.fd, size, 0).expect("alloc");
        let va = self.lib.mem_map(self.fd, handle).expect("map");
        (handle, va)
    }

    fn export(&self, addr: u64, size: u64, offset: u64, flags: u32) -> std::io::Result<OwnedFd> {
        self.lib.export_dmabuf(self.fd, addr, size, offset, flags)
    }

    fn release(&self, handle: u64, va: u64) {
        self.lib.unmap(self.fd, va).expect("unmap");
        self.lib.mem_free(self.fd, handle).expect("free");
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        let _ = self.lib.close(self.fd);
    }
}

#[test]
fn open_and_alloc_rules() {
    let (lib, _serial) = lib();
    let first = Open::new(lib);
    let second = Open::new(lib);
    assert_eq!(errno(lib.open(None)), Some(libc::EBUSY), "both open");
    assert_eq!(errno(lib.open(Some("0000:17:00.0"))), Some(libc::ENODEV));
    assert_eq!(errno(lib.mem_alloc(-5, 4096, 0)), Some(libc::EBADF));
    drop(second);
    let fd = first.fd;
    assert_eq!(errno(lib.mem_alloc(fd, 0, 0)), EINVAL, "zero bytes");
    assert_eq!(errno(lib.mem_alloc(fd, 4096, 3 << 20)), EINVAL, "page size");
    assert_eq!(errno(lib.mem_alloc(fd, 17 * GIB, 0)), Some(libc::ENOMEM));
    let handle = lib
        .mem_alloc(fd, 4096, 4 << 20)
        .expect("a power-of-two page");
    assert_eq!(
        errno(lib.mem_free(fd, handle + PAGE)),
        EINVAL,
        "no such handle"
    );
    lib.mem_free(fd, handle).unwrap();
    assert_eq!(errno(lib.mem_free(fd, handle)), EINVAL, "freed twice");
    assert_eq!(
        errno(lib.mem_map(fd, handle)),
        EINVAL,
        "map of a freed handle"
    );
}

#[test]
fn each_export_rule_alone() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let size = 4 << 20;
    let (handle, va) = dev.mapped(size);
    let refused = |a, s, o, f| errno(dev.export(a, s, o, f));
    let accepted = |a, s, o, f| {
        dev.export(a, s, o, f)
            .unwrap_or_else(|e| panic!("export({a:#x}, {s}, {o}, {f:#x}): {e}"))
    };

    // Flags: exactly O_RDWR | O_CLOEXEC. hl-thunk's own rule, checked in
    // user space before the ioctl (hlthunk_device_mapped_memory_export_dmabuf_fd);
    // the driver would accept O_RDWR alone.
    assert_eq!(refused(va, PAGE, 0, libc::O_RDWR as u32), EINVAL);
    assert_eq!(refused(va, PAGE, 0, libc::O_CLOEXEC as u32), EINVAL);
    assert_eq!(
        refused(va, PAGE, 0, EXPORT_FLAGS | libc::O_NONBLOCK as u32),
        EINVAL
    );
    drop(accepted(va, PAGE, 0, EXPORT_FLAGS));

    // The address: where a mapping starts, nothing else, even page-aligned
    // and inside the mapping (the offset is how to start further in).
    assert_eq!(refused(va + PAGE, PAGE, 0, EXPORT_FLAGS), EINVAL);
    drop(accepted(va, PAGE, PAGE, EXPORT_FLAGS));
    // A handle is not a VA. The simulator's handles are page-aligned, a
    // deliberate difference from the driver's idr ids (1, 2, ...), so that
    // the lookup of a mapping is the only rule a handle can break here.
    assert_eq!(
        handle % PAGE,
        0,
        "the simulator's handles are page-aligned (unlike the driver's)"
    );
    assert_ne!(handle, va);
    assert_eq!(refused(handle, PAGE, 0, EXPORT_FLAGS), EINVAL);

    // The offset: page-aligned (validate_export_params_common).
    assert_eq!(refused(va, PAGE, 100, EXPORT_FLAGS), EINVAL);
    assert_eq!(refused(va, PAGE, PAGE + 100, EXPORT_FLAGS), EINVAL);
    drop(accepted(va, PAGE, 2 * PAGE, EXPORT_FLAGS));

    // The size: non-zero and a multiple of the page (Linux 6.7 and later,
    // validate_export_params_common), even inside the mapping.
    assert_eq!(refused(va, 0, 0, EXPORT_FLAGS), EINVAL);
    assert_eq!(refused(va, PAGE - 1, 0, EXPORT_FLAGS), EINVAL);
    assert_eq!(refused(va, PAGE + 100, 0, EXPORT_FLAGS), EINVAL);
    assert_eq!(refused(va, 2 * PAGE - 1, PAGE, EXPORT_FLAGS), EINVAL);
    drop(accepted(va, PAGE, 0, EXPORT_FLAGS));
    drop(accepted(va, 2 * PAGE, 0, EXPORT_FLAGS));

    // Bounds: offset + size inside the allocation, without overflow.
    assert_eq!(refused(va, size, PAGE, EXPORT_FLAGS), EINVAL);
    assert_eq!(refused(va, PAGE, size, EXPORT_FLAGS), EINVAL);
    assert_eq!(refused(va, PAGE, u64::MAX - PAGE + 1, EXPORT_FLAGS), EINVAL);
    drop(accepted(va, size - PAGE, PAGE, EXPORT_FLAGS));
    drop(accepted(va, size, 0, EXPORT_FLAGS));

    // Unmap: only a VA map returned.
    assert_eq!(errno(lib.unmap(dev.fd, va + PAGE)), EINVAL);
    assert_eq!(errno(lib.mem_free(dev.fd, handle)), EINVAL, "still mapped");
    assert_eq!(
        counter("hlthunk_sim_open_exports"),
        0,
        "every export closed"
    );
    dev.release(handle, va);
    assert_eq!(counter("hlthunk_sim_live_allocations"), 0);
}

#[test]
fn an_open_dmabuf_holds_its_mapping_and_allocation() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let (handle, va) = dev.mapped(4 << 20);
    let export = dev.export(va, PAGE, 0, EXPORT_FLAGS).expect("export");
    assert_eq!(counter("hlthunk_sim_open_exports"), 1);
    // unmap_device_va: EINVAL while exported, with a dev_err line each
    // time (counted); free_device_memory: EINVAL while mapped.
    let refused_before = counter("hlthunk_sim_refused_unmaps");
    assert_eq!(errno(lib.unmap(dev.fd, va)), EINVAL, "unmap while exported");
    assert_eq!(counter("hlthunk_sim_refused_unmaps"), refused_before + 1);
    assert_eq!(
        errno(lib.mem_free(dev.fd, handle)),
        EINVAL,
        "free while exported"
    );
    // A copy of the fd (as a NIC registration holds the DMA-buf) holds it
    // as well: closing the original releases nothing.
    let copy = export.try_clone().expect("dup");
    drop(export);
    assert_eq!(errno(lib.unmap(dev.fd, va)), EINVAL, "a copy is still open");
    assert_eq!(counter("hlthunk_sim_live_allocations"), 1);
    drop(copy);
    // Released: the same calls now succeed.
    assert_eq!(counter("hlthunk_sim_open_exports"), 0);
    dev.release(handle, va);
    assert_eq!(counter("hlthunk_sim_live_allocations"), 0);
    assert_eq!(counter("hlthunk_sim_live_mappings"), 0);
}

#[test]
fn the_cpu_cannot_map_or_read_a_dmabuf() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let (handle, va) = dev.mapped(PAGE);
    let export = dev.export(va, PAGE, 0, EXPORT_FLAGS).expect("export");
    // SAFETY: with a null hint and no MAP_FIXED, mmap picks fresh addresses
    // and cannot disturb an existing mapping; the result is only compared.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            export.as_raw_fd(),
            0,
        )
    };
    assert_eq!(mapped, libc::MAP_FAILED);
    let mut buf = [0u8; 16];
    // SAFETY: `buf` has 16 writable bytes.
    let read = unsafe { libc::read(export.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(read <= 0, "read {read} bytes of device memory");
    drop(export);
    dev.release(handle, va);
}

#[test]
fn closing_the_device_under_an_open_dmabuf_keeps_it_until_the_release() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let bus = lib.pci_bus_id(dev.fd).expect("bus id");
    let (_handle, va) = dev.mapped(4 << 20);
    let export = dev.export(va, PAGE, 0, EXPORT_FLAGS).expect("export");
    drop(dev);
    // The export holds the device: still busy, its memory still there.
    assert_eq!(errno(lib.open(Some(&bus))), Some(libc::EBUSY));
    assert_eq!(counter("hlthunk_sim_live_allocations"), 1);
    assert_eq!(counter("hlthunk_sim_live_mappings"), 1);
    drop(export);
    // Released: everything is freed and the device can be opened again.
    assert_eq!(counter("hlthunk_sim_live_allocations"), 0);
    assert_eq!(counter("hlthunk_sim_live_mappings"), 0);
    let again = lib.open(Some(&bus)).expect("open after the release");
    lib.close(again).unwrap();
}
