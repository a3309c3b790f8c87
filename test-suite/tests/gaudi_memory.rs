//! Gaudi memory (from md-gaudi over the hl-thunk simulator, a TEST DOUBLE)
//! offered to the host-only transports: posix, cma and tcp refuse it, in
//! registration and in zero-copy operations, with a message that says an
//! RDMA NIC with DMA-buf support is needed; and a DMA-buf fd from a memory
//! query, registered by hand, holds its Gaudi memory until it is released.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use hlthunk_sim::loaded as sim;
use uct_builtins::md_gaudi::{self, GaudiMd};
use uct_core::{
    Access, Completion, EpParams, IfaceParams, Iov, MemoryDomain, MemoryType, Registry, RkeyBundle,
    UctError,
};

/// The first simulated device, opened once per process (the driver
/// allows one open per device), and the lock that runs the tests one at a
/// time, so that the simulator's counters are this test's alone.
fn gaudi() -> (Arc<GaudiMd>, MutexGuard<'static, ()>) {
    static FIXTURE: OnceLock<(Vec<Arc<GaudiMd>>, Mutex<()>)> = OnceLock::new();
    let (mds, serial) = FIXTURE.get_or_init(|| {
        let sim = hlthunk_sim::library_path().expect("libhlthunk_sim.so is built with the tests");
        let mds = md_gaudi::open_devices(&sim).expect("simulated devices");
        (mds, Mutex::new(()))
    });
    (
        mds[0].clone(),
        serial.lock().unwrap_or_else(|p| p.into_inner()),
    )
}

fn needs_nic(e: &UctError) -> bool {
    matches!(
        e,
        UctError::MemoryTypeUnsupported {
            mem_type: MemoryType::Gaudi,
            ..
        }
    ) && e.to_string().contains("RDMA NIC with DMA-buf support")
}

#[test]
fn host_only_transports_refuse_gaudi_memory() {
    uct_builtins::link();
    let (md, _serial) = gaudi();
    let dev = md
        .alloc(64 << 10, MemoryType::Gaudi, Access::all_rights())
        .expect("simulated gaudi memory");
    let reg = Registry::global();
    for (tl, device) in [("posix", None), ("cma", None), ("tcp", Some("lo"))] {
        let mut iface = reg
            .open_iface(tl, device, &IfaceParams::default())
            .unwrap_or_else(|e| panic!("{tl}: {e}"));
        let tmd = iface.md().clone();
        let e = tmd
            .register_handle(&dev, Access::all_rights())
            .expect_err("registration must be refused");
        assert!(needs_nic(&e), "{tl} register_handle: {e}");

        let host = tmd
            .alloc(64 << 10, MemoryType::Host, Access::all_rights())
            .or_else(|_| {
                let buf = Box::leak(vec![0u8; 64 << 10].into_boxed_slice());
                // SAFETY: leaked, so it outlives the handle.
                unsafe { tmd.register(buf.as_mut_ptr(), buf.len(), Access::all_rights()) }
            })
            .expect("host buffer");
        let rkey = reg
            .unpack_rkey(
                &RkeyBundle::single(tmd.pack_rkey(&host).unwrap())
                    .pack()
                    .unwrap(),
                tmd.name(),
            )
            .unwrap();
        let mut ep = iface
            .create_ep(EpParams::ToIface {
                device_addr: iface.device_address(),
                iface_addr: iface.iface_address(),
            })
            .unwrap_or_else(|e| panic!("{tl}: {e}"));
        let c = Completion::new();
        let e = ep
            .put_zcopy(&[Iov::new(&dev, 0, 4096)], host.addr(), &rkey, Some(&c))
            .expect_err("put from gaudi memory must be refused");
        assert!(needs_nic(&e), "{tl} put_zcopy: {e}");
        let e = ep
            .get_zcopy(&[Iov::new(&dev, 0, 4096)], host.addr(), &rkey, Some(&c))
            .expect_err("get into gaudi memory must be refused");
        assert!(needs_nic(&e), "{tl} get_zcopy: {e}");
        drop(ep);
        iface.progress();
    }
}

/// The simulator's view: (allocations, mappings, open DMA-bufs).
fn sim_view() -> (u64, u64, u64) {
    (
        sim::live_allocations(),
        sim::live_mappings(),
        sim::open_exports(),
    )
}

/// A DMA-buf fd from `query`, registered by hand (`register_dmabuf(fd,
/// offset, len, iova)`, not `register_handle`, which keeps the owner's
/// handle): the registration holds the Gaudi memory after the user's
/// handle is dropped, and the memory is freed after the registration goes.
/// A NIC's MR holds a reference on the DMA-buf's file (the kernel's
/// `dma_buf_get`) that outlives the fd it was registered from; no MD here
/// imports DMA-buf (each refuses, checked below), so a copy of the fd
/// stands for that reference.
#[test]
fn a_dmabuf_registered_by_hand_holds_its_gaudi_memory() {
    uct_builtins::link();
    let (md, _serial) = gaudi();
    let before = sim_view();
    let mem = md
        .alloc(1 << 20, MemoryType::Gaudi, Access::all_rights())
        .expect("simulated gaudi memory");
    let (fd, offset) = md
        .query(mem.addr(), mem.len())
        .expect("query")
        .dmabuf
        .expect("a DMA-buf fd");
    let reg = Registry::global();
    for (tl, device) in [("posix", None), ("cma", None), ("tcp", Some("lo"))] {
        let iface = reg
            .open_iface(tl, device, &IfaceParams::default())
            .unwrap_or_else(|e| panic!("{tl}: {e}"));
        let e = iface
            .md()
            .register_dmabuf(
                fd.as_fd(),
                offset,
                mem.len(),
                mem.addr(),
                Access::all_rights(),
            )
            .expect_err("a host-only MD cannot import a DMA-buf");
        assert!(
            matches!(e, UctError::Unsupported { .. }) && e.to_string().contains("DMA-buf"),
            "{tl} register_dmabuf: {e}"
        );
    }
    let registration = fd.try_clone().expect("the MR's reference");
    // The user's fd and handle go; only the registration is left.
    drop(fd);
    let addr = mem.addr();
    drop(mem);
    let held = (before.0 + 1, before.1 + 1, before.2 + 1);
    assert_eq!(
        sim_view(),
        held,
        "the allocation at {addr:#x}, its mapping and its DMA-buf outlive the handle"
    );
    assert!(md.detect_mem_type(addr, 1).is_err(), "no longer the user's");
    assert_eq!(md.deferred_frees(), 1);
    assert_eq!(md.reclaim(), 1, "still held by the registration");
    assert_eq!(sim_view(), held, "not freed under the registration");
    drop(registration);
    assert_eq!(md.reclaim(), 0, "freed after the registration's release");
    assert_eq!(sim_view(), before);
}
