//! The hl-thunk simulator's own rules (a TEST DOUBLE: there is no Gaudi
//! here), called through its C ABI with md-gaudi's thin wrappers
//! ([`HlThunk`], [`DeviceFd`]), which check nothing of the driver's rules:
//! md-gaudi's own pre-checks are tested in `simulated_gaudi.rs`. Integers
//! that no owned handle or address can carry (a freed handle, an address
//! inside a mapping) go through the simulator's raw calls
//! (`hlthunk_sim::loaded`). Each refused call breaks exactly one of the
//! rules (the driver's, or hl-thunk's own where named so), and the same
//! call with that one rule kept is accepted, so that a refusal can only
//! come from the rule it names.
//!
//! This binary opens and closes the devices itself (the simulator lives
//! in this process only); the tests share them one at a time.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use hlthunk_sim::loaded as sim;
use md_gaudi::device::{EXPORT_FLAGS, PAGE};
use md_gaudi::{AllocHandle, DeviceFd, DeviceVa, HlThunk};

const GIB: u64 = 1 << 30;
const EINVAL: Option<i32> = Some(libc::EINVAL);

fn lib() -> (&'static Arc<HlThunk>, MutexGuard<'static, ()>) {
    static LIB: OnceLock<(Arc<HlThunk>, Mutex<()>)> = OnceLock::new();
    let (lib, serial) = LIB.get_or_init(|| {
        let path = hlthunk_sim::library_path().expect(
            "libhlthunk_sim.so (the hl-thunk test double) is built beside the tests; run `cargo build -p hlthunk-sim`",
        );
        (
            Arc::new(HlThunk::load(&path).expect("load the simulator")),
            Mutex::new(()),
        )
    });
    assert!(lib.simulator().is_some_and(|s| s.contains("simulator")));
    (lib, serial.lock().unwrap_or_else(|p| p.into_inner()))
}

fn errno<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// The errno of a raw int return (`-errno`), for the raw calls.
fn raw_errno(rc: i32) -> Option<i32> {
    (rc < 0).then_some(-rc)
}

/// A device opened for one test, closed when dropped.
struct Open {
    dev: DeviceFd,
}

impl Open {
    fn new(lib: &Arc<HlThunk>) -> Self {
        Open {
            dev: lib.open(None).expect("a free simulated device"),
        }
    }

    fn fd(&self) -> i32 {
        self.dev.as_raw_fd()
    }

    /// A mapped allocation of `size` bytes.
    fn mapped(&self, size: u64) -> (AllocHandle, DeviceVa) {
        let handle = self.dev.mem_alloc(size, 0).expect("alloc");
        let va = self.dev.mem_map(&handle).expect("map");
        (handle, va)
    }

    /// An export at any address, through the raw call.
    fn export(&self, addr: u64, size: u64, offset: u64, flags: u32) -> Result<OwnedFd, i32> {
        sim::export_dmabuf(self.fd(), addr, size, offset, flags)
    }

    fn release(&self, handle: AllocHandle, va: DeviceVa) {
        self.dev.unmap(va).map_err(|(_, e)| e).expect("unmap");
        self.dev.mem_free(handle).map_err(|(_, e)| e).expect("free");
    }
}

#[test]
fn open_and_alloc_rules() {
    let (lib, _serial) = lib();
    let first = Open::new(lib);
    let second = Open::new(lib);
    assert_eq!(errno(lib.open(None)), Some(libc::EBUSY), "both open");
    assert_eq!(errno(lib.open(Some("0000:17:00.0"))), Some(libc::ENODEV));
    assert_eq!(sim::mem_alloc(-5, 4096, 0), 0, "no such fd");
    drop(second);
    let dev = &first.dev;
    assert_eq!(errno(dev.mem_alloc(0, 0)), EINVAL, "zero bytes");
    assert_eq!(errno(dev.mem_alloc(4096, 3 << 20)), EINVAL, "page size");
    assert_eq!(errno(dev.mem_alloc(17 * GIB, 0)), Some(libc::ENOMEM));
    let handle = dev.mem_alloc(4096, 4 << 20).expect("a power-of-two page");
    let raw = handle.raw();
    // Integers no owned handle can carry, through the raw calls.
    assert_eq!(
        raw_errno(sim::mem_free(first.fd(), raw + PAGE)),
        EINVAL,
        "no such handle"
    );
    dev.mem_free(handle).map_err(|(_, e)| e).unwrap();
    assert_eq!(
        raw_errno(sim::mem_free(first.fd(), raw)),
        EINVAL,
        "freed twice"
    );
    assert_eq!(sim::mem_map(first.fd(), raw), 0, "map of a freed handle");
}

#[test]
fn each_export_rule_alone() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let size = 4 << 20;
    let (handle, va) = dev.mapped(size);
    let addr = va.addr();
    let refused = |a, s, o, f| dev.export(a, s, o, f).err();
    let accepted = |a, s, o, f| {
        dev.export(a, s, o, f)
            .unwrap_or_else(|e| panic!("export({a:#x}, {s}, {o}, {f:#x}): errno {e}"))
    };
    let einval = Some(libc::EINVAL);

    // Flags: exactly O_RDWR | O_CLOEXEC. hl-thunk's own rule, checked in
    // user space before the ioctl (hlthunk_device_mapped_memory_export_dmabuf_fd);
    // the driver would accept O_RDWR alone.
    assert_eq!(refused(addr, PAGE, 0, libc::O_RDWR as u32), einval);
    assert_eq!(refused(addr, PAGE, 0, libc::O_CLOEXEC as u32), einval);
    assert_eq!(
        refused(addr, PAGE, 0, EXPORT_FLAGS | libc::O_NONBLOCK as u32),
        einval
    );
    drop(accepted(addr, PAGE, 0, EXPORT_FLAGS));
    // The owned path takes the same call.
    drop(
        dev.dev
            .export_dmabuf(&va, PAGE, 0, EXPORT_FLAGS)
            .expect("export"),
    );

    // The address: where a mapping starts, nothing else, even page-aligned
    // and inside the mapping (the offset is how to start further in).
    assert_eq!(refused(addr + PAGE, PAGE, 0, EXPORT_FLAGS), einval);
    drop(accepted(addr, PAGE, PAGE, EXPORT_FLAGS));
    // A handle is not a VA. The simulator's handles are page-aligned, a
    // deliberate difference from the driver's idr ids (1, 2, ...), so that
    // the lookup of a mapping is the only rule a handle can break here.
    let raw = handle.raw();
    assert_eq!(
        raw % PAGE,
        0,
        "the simulator's handles are page-aligned (unlike the driver's)"
    );
    assert_ne!(raw, addr);
    assert_eq!(refused(raw, PAGE, 0, EXPORT_FLAGS), einval);

    // The offset: page-aligned (validate_export_params_common).
    assert_eq!(refused(addr, PAGE, 100, EXPORT_FLAGS), einval);
    assert_eq!(refused(addr, PAGE, PAGE + 100, EXPORT_FLAGS), einval);
    drop(accepted(addr, PAGE, 2 * PAGE, EXPORT_FLAGS));

    // The size: non-zero and a multiple of the page (Linux 6.7 and later,
    // validate_export_params_common), even inside the mapping.
    assert_eq!(refused(addr, 0, 0, EXPORT_FLAGS), einval);
    assert_eq!(refused(addr, PAGE - 1, 0, EXPORT_FLAGS), einval);
    assert_eq!(refused(addr, PAGE + 100, 0, EXPORT_FLAGS), einval);
    assert_eq!(refused(addr, 2 * PAGE - 1, PAGE, EXPORT_FLAGS), einval);
    drop(accepted(addr, PAGE, 0, EXPORT_FLAGS));
    drop(accepted(addr, 2 * PAGE, 0, EXPORT_FLAGS));

    // Bounds: offset + size inside the allocation, without overflow.
    assert_eq!(refused(addr, size, PAGE, EXPORT_FLAGS), einval);
    assert_eq!(refused(addr, PAGE, size, EXPORT_FLAGS), einval);
    assert_eq!(
        refused(addr, PAGE, u64::MAX - PAGE + 1, EXPORT_FLAGS),
        einval
    );
    drop(accepted(addr, size - PAGE, PAGE, EXPORT_FLAGS));
    drop(accepted(addr, size, 0, EXPORT_FLAGS));

    // Unmap: only a VA map returned.
    assert_eq!(raw_errno(sim::unmap(dev.fd(), addr + PAGE)), EINVAL);
    // Free: not while mapped; the owned handle comes back with the error.
    let (handle, e) = dev.dev.mem_free(handle).expect_err("still mapped");
    assert_eq!(e.raw_os_error(), EINVAL);
    assert_eq!(sim::open_exports(), 0, "every export closed");
    dev.release(handle, va);
    assert_eq!(sim::live_allocations(), 0);
}

#[test]
fn an_open_dmabuf_holds_its_mapping_and_allocation() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let (handle, va) = dev.mapped(4 << 20);
    let export = dev
        .dev
        .export_dmabuf(&va, PAGE, 0, EXPORT_FLAGS)
        .expect("export");
    assert_eq!(sim::open_exports(), 1);
    // unmap_device_va: EINVAL while exported, with a dev_err line each
    // time (counted); free_device_memory: EINVAL while mapped.
    let refused_before = sim::refused_unmaps();
    let (va, e) = dev.dev.unmap(va).expect_err("unmap while exported");
    assert_eq!(e.raw_os_error(), EINVAL);
    assert_eq!(sim::refused_unmaps(), refused_before + 1);
    let (handle, e) = dev.dev.mem_free(handle).expect_err("free while exported");
    assert_eq!(e.raw_os_error(), EINVAL);
    // A copy of the fd (as a NIC registration holds the DMA-buf) holds it
    // as well: closing the original releases nothing.
    let copy = export.try_clone().expect("dup");
    drop(export);
    let (va, e) = dev.dev.unmap(va).expect_err("a copy is still open");
    assert_eq!(e.raw_os_error(), EINVAL);
    assert_eq!(sim::live_allocations(), 1);
    drop(copy);
    // Released: the same calls now succeed.
    assert_eq!(sim::open_exports(), 0);
    dev.release(handle, va);
    assert_eq!(sim::live_allocations(), 0);
    assert_eq!(sim::live_mappings(), 0);
}

#[test]
fn the_cpu_cannot_map_or_read_a_dmabuf() {
    let (lib, _serial) = lib();
    let dev = Open::new(lib);
    let (handle, va) = dev.mapped(PAGE);
    let export = dev
        .dev
        .export_dmabuf(&va, PAGE, 0, EXPORT_FLAGS)
        .expect("export");
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
    let bus = dev.dev.pci_bus_id().expect("bus id");
    // Kept to the end: given up with the device, whose release frees them.
    let (_handle, va) = dev.mapped(4 << 20);
    let export = dev
        .dev
        .export_dmabuf(&va, PAGE, 0, EXPORT_FLAGS)
        .expect("export");
    dev.dev.close().expect("close");
    // The export holds the device: still busy, its memory still there.
    assert_eq!(errno(lib.open(Some(&bus))), Some(libc::EBUSY));
    assert_eq!(sim::live_allocations(), 1);
    assert_eq!(sim::live_mappings(), 1);
    drop(export);
    // Released: everything is freed and the device can be opened again.
    assert_eq!(sim::live_allocations(), 0);
    assert_eq!(sim::live_mappings(), 0);
    let again = lib.open(Some(&bus)).expect("open after the release");
    again.close().unwrap();
}
