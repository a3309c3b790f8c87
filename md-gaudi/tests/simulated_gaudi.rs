//! md-gaudi against the hl-thunk simulator (a TEST DOUBLE: there is no
//! Gaudi here). Devices are opened once per process, as the real driver
//! allows one open per device; the tests share them and run one at a time
//! so that the fd counts are exact.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use md_gaudi::device::{EXPORT_FLAGS, PAGE};
use md_gaudi::{GaudiError, GaudiMd, HlThunk};
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

/// Calls one of the simulator's own counters, in the same loaded copy.
fn sim_counter(name: &str) -> u64 {
    // SAFETY: the simulator md-gaudi already loaded (dlopen returns the
    // same handle, so its initialisers do not run again).
    let lib = unsafe { libloading::Library::new(sim_path()) }.expect("load the simulator");
    // SAFETY: the simulator's counters (`hlthunk_sim_*`) take nothing and
    // return a u64; the symbol is used only while `lib` is alive, here.
    let counter =
        unsafe { lib.get::<unsafe extern "C" fn() -> u64>(format!("{name}\0").as_bytes()) }
            .expect("simulator counter");
    // SAFETY: a counter with the prototype above; the library is loaded.
    unsafe { counter() }
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
    let va = dev.map(handle).unwrap();
    let rw = libc::O_RDWR as u32;
    assert!(matches!(
        dev.export_dmabuf(va, size, 0, rw),
        Err(GaudiError::ExportFlags { flags, .. }) if flags == rw
    ));
    assert!(matches!(
        dev.export_dmabuf(va, size, 0, EXPORT_FLAGS | libc::O_NONBLOCK as u32),
        Err(GaudiError::ExportFlags { .. })
    ));
    assert!(matches!(
        dev.export_dmabuf(va + 64, PAGE, 0, EXPORT_FLAGS),
        Err(GaudiError::ExportMisaligned {
            what: "address",
            ..
        })
    ));
    assert!(matches!(
        dev.export_dmabuf(va, 100, 0, EXPORT_FLAGS),
        Err(GaudiError::ExportMisaligned { what: "size", .. })
    ));
    assert!(matches!(
        dev.export_dmabuf(va, PAGE, 100, EXPORT_FLAGS),
        Err(GaudiError::ExportMisaligned { what: "offset", .. })
    ));
    assert!(matches!(
        dev.export_dmabuf(va, size, PAGE, EXPORT_FLAGS),
        Err(GaudiError::ExportOutOfBounds { .. })
    ));
    assert!(matches!(
        dev.export_dmabuf(va, 0, 0, EXPORT_FLAGS),
        Err(GaudiError::ExportOutOfBounds { .. })
    ));
    // The handle is not a VA.
    assert!(matches!(
        dev.export_dmabuf(handle, PAGE, 0, EXPORT_FLAGS),
        Err(GaudiError::NotMapped { .. } | GaudiError::ExportMisaligned { .. })
    ));
    let other = va + (64 << 20);
    assert!(matches!(
        dev.export_dmabuf(other, PAGE, 0, EXPORT_FLAGS),
        Err(GaudiError::NotMapped { addr, .. }) if addr == other
    ));
    // A good export of the tail works.
    let fd = dev
        .export_dmabuf(va, PAGE, size - PAGE, EXPORT_FLAGS)
        .expect("tail export");
    drop(fd);
    assert!(matches!(
        dev.free(handle),
        Err(GaudiError::StillMapped { .. })
    ));
    assert!(matches!(
        dev.unmap(va + PAGE),
        Err(GaudiError::NotMapped { .. })
    ));
    dev.unmap(va).unwrap();
    dev.free(handle).unwrap();
    assert!(matches!(
        dev.free(handle),
        Err(GaudiError::NoSuchHandle { .. })
    ));
    assert!(matches!(
        dev.map(handle),
        Err(GaudiError::NoSuchHandle { .. })
    ));
    assert_eq!(dev.in_use(), 0);
}

/// The simulator enforces the rules itself, below md-gaudi's checks.
#[test]
fn the_simulator_enforces_the_driver_rules() {
    let (mds, _serial) = fixture();
    let lib: &HlThunk = mds[0].device().lib();
    assert!(lib.simulator().is_some_and(|s| s.contains("simulator")));
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(0);
    let err = |r: std::io::Result<u64>| r.err().and_then(|e| e.raw_os_error());
    let unit = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
    // Both devices are open in this process: a third open is refused.
    assert_eq!(lib.open(None).map_err(errno), Err(libc::EBUSY));
    assert_eq!(
        lib.open(Some("0000:17:00.0")).map_err(errno),
        Err(libc::ENODEV)
    );
    assert_eq!(lib.mem_alloc(-5, 4096, 0).map_err(errno), Err(libc::EBADF));

    let fd = mds[0].device().raw_fd();
    let einval = Some(libc::EINVAL);
    assert_eq!(err(lib.mem_alloc(fd, 0, 0)), einval);
    assert_eq!(err(lib.mem_alloc(fd, 4096, 3 << 20)), einval);
    assert_eq!(err(lib.mem_alloc(fd, 17 * GIB, 0)), Some(libc::ENOMEM));
    let size = 4 << 20;
    let handle = lib.mem_alloc(fd, size, 0).unwrap();
    let va = lib.mem_map(fd, handle).unwrap();
    let export = |a, s, o, f| unit(lib.export_dmabuf(fd, a, s, o, f).map(drop));
    assert_eq!(export(va, size, 0, libc::O_RDWR as u32), einval, "flags");
    assert_eq!(export(va, size, 0, libc::O_CLOEXEC as u32), einval, "flags");
    assert_eq!(
        export(va + 64, PAGE, 0, EXPORT_FLAGS),
        einval,
        "address alignment"
    );
    assert_eq!(export(va, 100, 0, EXPORT_FLAGS), einval, "size alignment");
    assert_eq!(export(va, 0, 0, EXPORT_FLAGS), einval, "empty");
    assert_eq!(
        export(va, PAGE, 100, EXPORT_FLAGS),
        einval,
        "offset alignment"
    );
    assert_eq!(export(va, size, PAGE, EXPORT_FLAGS), einval, "bounds");
    assert_eq!(
        export(handle, PAGE, 0, EXPORT_FLAGS),
        einval,
        "a handle is not a VA"
    );
    assert_eq!(export(va, size, 0, EXPORT_FLAGS), None);
    assert_eq!(unit(lib.mem_free(fd, handle)), einval, "still mapped");
    assert_eq!(unit(lib.unmap(fd, va + PAGE)), einval);
    lib.unmap(fd, va).unwrap();
    lib.mem_free(fd, handle).unwrap();
    assert_eq!(unit(lib.mem_free(fd, handle)), einval, "freed twice");
    assert_eq!(sim_counter("hlthunk_sim_live_allocations"), 0);
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
