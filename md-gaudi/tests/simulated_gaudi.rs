//! md-gaudi against the hl-thunk simulator (a TEST DOUBLE: there is no
//! Gaudi here): md-gaudi's own checks and named errors, and what it does
//! with the driver's answers. The simulator's rules alone, below these
//! checks, are tested in `simulator_rules.rs`. Devices are opened once per
//! process, as the real driver allows one open per device; the tests share
//! them and run one at a time so that the fd counts are exact.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use hlthunk_sim::loaded as sim;
use md_gaudi::device::{EXPORT_FLAGS, PAGE, REFUSALS_REPORTED};
use md_gaudi::{GaudiError, GaudiMd};
use uct_core::{Access, MdFlags, MemoryDomain, MemoryType, UctError};

const GIB: u64 = 1 << 30;

fn sim_path() -> PathBuf {
    hlthunk_sim::library_path().expect(
        "libhlthunk_sim.so (the hl-thunk test double) is built beside the tests; run `cargo build -p hlthunk-sim`",
    )
}

struct Fixture {
    mds: Vec<Arc<GaudiMd>>,
    serial: Mutex<()>,
}

fn fixture() -> (&'static [Arc<GaudiMd>], MutexGuard<'static, ()>) {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    let fixture = FIXTURE.get_or_init(|| Fixture {
        mds: md_gaudi::open_devices(&sim_path()).expect("open the simulated devices"),
        serial: Mutex::new(()),
    });
    (
        &fixture.mds,
        fixture.serial.lock().unwrap_or_else(|p| p.into_inner()),
    )
}

/// One of the simulator's own counters, in the copy md-gaudi loaded.
fn sim_counter(name: &str) -> u64 {
    match name {
        "hlthunk_sim_live_allocations" => sim::live_allocations(),
        "hlthunk_sim_live_mappings" => sim::live_mappings(),
        "hlthunk_sim_refused_unmaps" => sim::refused_unmaps(),
        "hlthunk_sim_open_exports" => sim::open_exports(),
        other => panic!("no simulator counter {other}"),
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

#[test]
fn two_simulated_devices_with_dram_size_and_dmabuf_export() {
    let (mds, _serial) = fixture();
    let names: Vec<&str> = mds.iter().map(|m| m.name()).collect();
    assert_eq!(names, ["gaudi0", "gaudi1"]);
    for md in mds {
        let attrs = md.attrs();
        assert_eq!(attrs.max_alloc, 16 * GIB, "DRAM size from hw_ip_info");
        assert!(attrs
            .flags
            .contains(MdFlags::ALLOC | MdFlags::EXPORT_DMABUF | MdFlags::DETECT));
        assert_eq!(attrs.alloc_mem_types, [MemoryType::Gaudi]);
        let bus = attrs.system_device.expect("bus id");
        assert!(bus.starts_with("sim"), "simulated bus id, got {bus}");
        let description = md.description().expect("description");
        assert!(
            description.contains("SIMULATED")
                && description.contains("GAUDI2")
                && description.contains("16 GiB"),
            "{description}"
        );
        assert!(md.is_simulated());
    }
    assert_ne!(mds[0].attrs().system_device, mds[1].attrs().system_device);
}

#[test]
fn alloc_query_detect_free() {
    let (mds, _serial) = fixture();
    let md = &mds[0];
    let len = (1 << 20) + 3;
    let mem = md
        .alloc(len, MemoryType::Gaudi, Access::all_rights())
        .expect("alloc");
    assert_eq!(mem.mem_type(), MemoryType::Gaudi);
    assert_eq!(mem.len(), len);
    assert_eq!(mem.addr() % PAGE, 0, "device VA is page-aligned");
    assert_eq!(md.live_allocations(), 1);
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 1);

    let info = md.query(mem.addr() + 8192, 100).expect("query");
    assert_eq!(info.mem_type, MemoryType::Gaudi);
    assert_eq!(info.base, mem.addr());
    assert_eq!(info.len, len);
    assert_eq!(info.system_device, md.attrs().system_device);
    let (fd, offset) = info.dmabuf.expect("a DMA-buf fd");
    assert_eq!(offset, 8192);
    // The CPU cannot map the DMA-buf of device memory.
    // SAFETY: with a null hint and no MAP_FIXED, mmap picks fresh addresses
    // and cannot disturb an existing mapping; the result is only compared,
    // never dereferenced.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_eq!(
        mapped,
        libc::MAP_FAILED,
        "the CPU must not be able to map it"
    );
    // The handle's own query answers the same, for a NIC's MD.
    let (fd2, off2) = mem
        .query_owner()
        .expect("device memory answers")
        .expect("query")
        .dmabuf
        .expect("fd");
    assert_eq!(off2, 0);
    assert_ne!(
        fd.as_raw_fd(),
        fd2.as_raw_fd(),
        "each query gives its own fd"
    );

    assert_eq!(
        md.detect_mem_type(mem.addr(), len).unwrap(),
        MemoryType::Gaudi
    );
    assert!(
        md.detect_mem_type(mem.addr(), len + 1).is_err(),
        "past the end"
    );
    let host = [0u8; 16];
    assert!(md.detect_mem_type(host.as_ptr() as u64, 16).is_err());
    assert!(matches!(
        md.query(mem.addr() + len as u64, 1),
        Err(UctError::InvalidParam(m)) if m.contains("not inside memory")
    ));

    // The CPU cannot read it through the handle either.
    let mut buf = [0u8; 4];
    assert!(matches!(
        mem.read(0, &mut buf),
        Err(UctError::MemoryTypeUnsupported {
            mem_type: MemoryType::Gaudi,
            ..
        })
    ));

    drop((fd, fd2, mem));
    assert_eq!(md.live_allocations(), 0);
    assert_eq!(md.device().in_use(), 0);
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 0);
    assert_eq!(sim_counter("hlthunk_sim_live_mappings"), 0);
}

#[test]
fn no_fd_leaks_over_many_cycles() {
    let (mds, _serial) = fixture();
    // Warm up lazily created fds (logging, the counters' dlopen).
    let _ = sim_counter("hlthunk_sim_live_allocations");
    let before = open_fds();
    for i in 0..200usize {
        let md = &mds[i % 2];
        let mem = md
            .alloc(4096 * (1 + i % 7), MemoryType::Gaudi, Access::all_rights())
            .expect("alloc");
        let info = md.query(mem.addr(), 1).expect("query");
        drop(info);
        let owner = mem.query_owner().expect("answers").expect("query");
        drop(owner);
    }
    assert_eq!(open_fds(), before, "fds in /proc/self/fd before and after");
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 0);
}

#[test]
fn wrong_memory_type_and_no_rkey() {
    let (mds, _serial) = fixture();
    let md = &mds[1];
    assert!(matches!(
        md.alloc(4096, MemoryType::Host, Access::all_rights()),
        Err(UctError::MemoryTypeUnsupported {
            mem_type: MemoryType::Host,
            ..
        })
    ));
    let mem = md
        .alloc(4096, MemoryType::Gaudi, Access::all_rights())
        .unwrap();
    let e = md.pack_rkey(&mem).unwrap_err().to_string();
    assert!(e.contains("register the memory with a NIC"), "{e}");
}

#[test]
fn each_driver_rule_violation_has_its_named_error() {
    let (mds, _serial) = fixture();
    let dev = mds[0].device();
    assert!(matches!(dev.alloc(0, 0), Err(GaudiError::ZeroSize { .. })));
    assert!(matches!(
        dev.alloc(4096, 3 << 20),
        Err(GaudiError::BadPageSize { .. })
    ));
    let e = dev.alloc(17 * GIB, 0).unwrap_err();
    assert!(
        matches!(e, GaudiError::DramExhausted { requested, dram_size, .. }
        if requested == 17 * GIB && dram_size == 16 * GIB)
    );
    assert!(matches!(UctError::from(e), UctError::NoMemory(_)));

    let size = 4 << 20;
    let handle = dev.alloc(size, 0).unwrap();
    let va = dev.map(&handle).unwrap();
    let rw = libc::O_RDWR as u32;
    assert!(matches!(
        dev.export_dmabuf(&va, size, 0, rw),
        Err(GaudiError::ExportFlags { flags, .. }) if flags == rw
    ));
    assert!(matches!(
        dev.export_dmabuf(&va, size, 0, EXPORT_FLAGS | libc::O_NONBLOCK as u32),
        Err(GaudiError::ExportFlags { .. })
    ));
    // The size: a multiple of the page (the driver's rule since Linux 6.7),
    // refused here before the driver is asked.
    assert!(matches!(
        dev.export_dmabuf(&va, 100, 0, EXPORT_FLAGS),
        Err(GaudiError::ExportMisaligned {
            what: "size",
            value: 100,
            ..
        })
    ));
    assert!(matches!(
        dev.export_dmabuf(&va, PAGE + 100, 0, EXPORT_FLAGS),
        Err(GaudiError::ExportMisaligned { what: "size", value, .. }) if value == PAGE + 100
    ));
    drop(
        dev.export_dmabuf(&va, 2 * PAGE, 0, EXPORT_FLAGS)
            .expect("a whole number of pages"),
    );
    assert!(matches!(
        dev.export_dmabuf(&va, PAGE, 100, EXPORT_FLAGS),
        Err(GaudiError::ExportMisaligned { what: "offset", .. })
    ));
    assert!(matches!(
        dev.export_dmabuf(&va, size, PAGE, EXPORT_FLAGS),
        Err(GaudiError::ExportOutOfBounds { .. })
    ));
    assert!(matches!(
        dev.export_dmabuf(&va, 0, 0, EXPORT_FLAGS),
        Err(GaudiError::ExportEmpty { .. })
    ));
    // A good export of the tail works, and holds the mapping: the driver
    // refuses the unmap, named for why, and the address comes back.
    let fd = dev
        .export_dmabuf(&va, PAGE, size - PAGE, EXPORT_FLAGS)
        .expect("tail export");
    let addr = va.addr();
    let (va, e) = dev.unmap(va).expect_err("exported");
    assert!(matches!(e, GaudiError::StillExported { addr: a, .. } if a == addr));
    let (handle, e) = dev.free(handle).expect_err("mapped");
    assert!(matches!(e, GaudiError::StillMapped { .. }));
    drop(fd);
    let (handle, e) = dev.free(handle).expect_err("still mapped");
    assert!(matches!(e, GaudiError::StillMapped { .. }));
    dev.unmap(va).map_err(|(_, e)| e).unwrap();
    dev.free(handle).map_err(|(_, e)| e).unwrap();
    assert_eq!(dev.in_use(), 0);
}

/// Handles and addresses work only with the device that made them: each
/// device numbers its handles from the same start, so a handle of gaudi1
/// can carry the number of a live allocation of gaudi0, and is refused by
/// name, that allocation untouched.
#[test]
fn a_handle_or_address_of_another_device_is_refused() {
    let (mds, _serial) = fixture();
    let (zero, one) = (mds[0].device(), mds[1].device());
    // Each device counts its own handles: allocate on the one behind until
    // both hold the same number.
    let mut ours = zero.alloc(PAGE, 0).unwrap();
    let mut theirs = one.alloc(PAGE, 0).unwrap();
    for _ in 0..10_000 {
        if ours.raw() < theirs.raw() {
            let next = zero.alloc(PAGE, 0).unwrap();
            zero.free(std::mem::replace(&mut ours, next))
                .map_err(|(_, e)| e)
                .unwrap();
        } else if theirs.raw() < ours.raw() {
            let next = one.alloc(PAGE, 0).unwrap();
            one.free(std::mem::replace(&mut theirs, next))
                .map_err(|(_, e)| e)
                .unwrap();
        } else {
            break;
        }
    }
    assert_eq!(ours.raw(), theirs.raw(), "the same number on both devices");
    let e = zero.map(&theirs).expect_err("another device's handle");
    assert!(matches!(e, GaudiError::NoSuchHandle { .. }), "{e}");
    let (theirs, e) = zero.free(theirs).expect_err("another device's handle");
    assert!(matches!(e, GaudiError::NoSuchHandle { .. }), "{e}");
    assert_eq!(zero.in_use(), PAGE, "gaudi0's allocation untouched");
    let va = one.map(&theirs).unwrap();
    assert!(matches!(
        zero.export_dmabuf(&va, PAGE, 0, EXPORT_FLAGS),
        Err(GaudiError::NotMapped { .. })
    ));
    let (va, e) = zero.unmap(va).expect_err("another device's address");
    assert!(matches!(e, GaudiError::NotMapped { .. }), "{e}");
    assert!(one.unmap_and_free(va, theirs).expect("freed"));
    zero.free(ours).map_err(|(_, e)| e).unwrap();
    assert_eq!((zero.in_use(), one.in_use()), (0, 0));
    assert_eq!(sim::live_allocations(), 0);
}

#[test]
fn a_missing_or_wrong_library_is_named() {
    let e = md_gaudi::open_devices(std::path::Path::new("/nonexistent/libhl-thunk.so"))
        .err()
        .expect("no such library");
    assert!(matches!(e, GaudiError::LibraryNotLoaded { .. }));
    assert!(e.to_string().contains("UCT_GAUDI_HLTHUNK_LIB"), "{e}");
    let e = md_gaudi::open_devices(std::path::Path::new("libc.so.6"))
        .err()
        .expect("libc is not hl-thunk");
    assert!(
        matches!(
            e,
            GaudiError::MissingSymbol {
                symbol: "hlthunk_open",
                ..
            }
        ),
        "{e}"
    );
}

/// An fd from `query` that outlives the memory handle holds the DMA-buf,
/// and so (in the driver) the mapping and the allocation: md-gaudi defers
/// the free until the fd is closed, never frees under it, and frees it
/// after.
#[test]
fn a_query_fd_that_outlives_the_handle_defers_the_free() {
    let (mds, _serial) = fixture();
    let md = &mds[0];
    let mem = md
        .alloc(1 << 20, MemoryType::Gaudi, Access::all_rights())
        .expect("alloc");
    let (fd, _) = md.query(mem.addr(), 1).expect("query").dmabuf.expect("fd");
    let in_use = md.device().in_use();
    let refused = sim_counter("hlthunk_sim_refused_unmaps");
    drop(mem);
    assert_eq!(md.live_allocations(), 0, "the handle is gone");
    assert_eq!(md.deferred_frees(), 1, "held by the query's fd");
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 1);
    assert_eq!(sim_counter("hlthunk_sim_live_mappings"), 1);
    assert_eq!(sim_counter("hlthunk_sim_open_exports"), 1);
    assert_eq!(md.device().in_use(), in_use, "still counted against DRAM");
    assert_eq!(md.reclaim(), 1, "nothing to free while the fd is open");
    // Allocs and frees meanwhile do not ask the driver: it would only
    // refuse, with an error line in the kernel log each time.
    for _ in 0..5 {
        drop(
            md.alloc(4096, MemoryType::Gaudi, Access::all_rights())
                .expect("alloc"),
        );
    }
    assert_eq!(md.deferred_frees(), 1);
    assert_eq!(
        sim_counter("hlthunk_sim_refused_unmaps"),
        refused,
        "no unmap tried while the query's fd is open"
    );
    drop(fd);
    // The next alloc (or an explicit reclaim) frees it.
    let next = md
        .alloc(4096, MemoryType::Gaudi, Access::all_rights())
        .expect("alloc");
    assert_eq!(md.deferred_frees(), 0);
    assert_eq!(
        sim_counter("hlthunk_sim_live_allocations"),
        1,
        "only the new one"
    );
    drop(next);
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 0);
    assert_eq!(md.device().in_use(), 0);
}

/// A DMA-buf held by something md-gaudi did not hand out (as a NIC's MR
/// holds one after the fd it was registered with is closed; here an export
/// made directly): the driver refuses the unmap. md-gaudi does not ask it
/// again on every alloc and free, only after a wait or on an explicit
/// reclaim, reports the allocation after `REFUSALS_REPORTED` refusals, and
/// frees it after the release.
#[test]
fn a_dmabuf_held_elsewhere_is_retried_sparingly_and_reported() {
    let (mds, _serial) = fixture();
    let md = &mds[0];
    let mem = md
        .alloc(1 << 20, MemoryType::Gaudi, Access::all_rights())
        .expect("alloc");
    // A copy of a query's fd, the query's own fd closed: what a NIC's MR
    // holds after registering the fd by hand (register_dmabuf).
    let (fd, _) = md.query(mem.addr(), 1).expect("query").dmabuf.expect("fd");
    let held = fd.try_clone().expect("dup");
    drop(fd);
    let refused = sim_counter("hlthunk_sim_refused_unmaps");
    drop(mem);
    assert_eq!(md.deferred_frees(), 1);
    assert_eq!(
        sim_counter("hlthunk_sim_refused_unmaps"),
        refused + 1,
        "asked once"
    );
    // Allocs and frees within the wait do not ask again.
    for _ in 0..5 {
        drop(
            md.alloc(4096, MemoryType::Gaudi, Access::all_rights())
                .expect("alloc"),
        );
    }
    assert_eq!(sim_counter("hlthunk_sim_refused_unmaps"), refused + 1);
    assert_eq!(md.device().deferred_reported(), 0);
    // Explicit reclaims ask each time, up to the report.
    for n in 2..=REFUSALS_REPORTED {
        assert_eq!(md.reclaim(), 1);
        assert_eq!(
            sim_counter("hlthunk_sim_refused_unmaps"),
            refused + n as u64
        );
    }
    assert_eq!(md.device().deferred_reported(), 1, "reported as an error");
    drop(held);
    assert_eq!(md.reclaim(), 0, "freed after the release");
    assert_eq!(md.device().deferred_reported(), 0);
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 0);
    assert_eq!(md.device().in_use(), 0);
}

/// What a NIC registration of Gaudi memory holds (md-ib's `IbBacking`): a
/// reference on the DMA-buf (the kernel's MR holds one; here a copy of the
/// query's fd) and a clone of the memory handle.
struct Registration {
    _dmabuf: std::os::fd::OwnedFd,
    _owner: uct_core::MemHandle,
}

/// A registration keeps its allocation alive, whatever is dropped first.
#[test]
fn a_registration_keeps_its_allocation_alive() {
    let (mds, _serial) = fixture();
    let md = &mds[1];
    for registration_first in [true, false] {
        let mem = md
            .alloc(1 << 20, MemoryType::Gaudi, Access::all_rights())
            .expect("alloc");
        let (fd, _) = mem
            .query_owner()
            .expect("device memory answers")
            .expect("query")
            .dmabuf
            .expect("fd");
        let registration = Registration {
            _dmabuf: fd,
            _owner: mem.clone(),
        };
        if registration_first {
            drop(registration);
            assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 1);
            drop(mem);
        } else {
            drop(mem);
            // The user's handle is gone; the registration's clone holds it.
            assert_eq!(md.live_allocations(), 1);
            assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 1);
            // One DMA-buf: md-gaudi's fd and the registration's copy.
            assert_eq!(sim_counter("hlthunk_sim_open_exports"), 1);
            drop(registration);
        }
        assert_eq!(md.deferred_frees(), 0, "freed with its last reference");
        assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 0);
        assert_eq!(sim_counter("hlthunk_sim_open_exports"), 0);
    }
}
