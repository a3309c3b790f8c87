//! Gaudi memory (from md-gaudi over the hl-thunk simulator, a TEST DOUBLE)
//! offered to the host-only transports: posix, cma and tcp refuse it, in
//! registration and in zero-copy operations, with a message that says an
//! RDMA NIC with DMA-buf support is needed.

use std::sync::Arc;

use uct_builtins::md_gaudi::{self, GaudiMd};
use uct_core::{
    Access, Completion, EpParams, IfaceParams, Iov, MemoryDomain, MemoryType, Registry, RkeyBundle,
    UctError,
};

fn gaudi() -> Arc<GaudiMd> {
    let sim = hlthunk_sim::library_path().expect("libhlthunk_sim.so is built with the tests");
    md_gaudi::open_devices(&sim)
        .expect("simulated devices")
        .remove(0)
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
    let md = gaudi();
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
