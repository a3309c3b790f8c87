//! The endpoint against its owner deregistering a region in the middle of
//! an access (issue 12, finding 5): the access passed its check, then the
//! owner deregistered the region and reused the memory before the transfer.

use std::cell::RefCell;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use uct_core::{Access, EpParams, Iface, MemoryDomain};

use crate::cma::{component, CmaIface, CmaMd};

thread_local! {
    /// The hook [`between_check_and_transfer`](super::between_check_and_transfer)
    /// runs once, on this thread.
    pub(super) static BETWEEN: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
}

const LEN: usize = 4096;
/// What the owner writes into its memory once deregistration returned.
const REUSED: u8 = 0x55;
/// What the put writes.
const PUT: u8 = 0xAA;

#[test]
fn a_put_never_lands_after_deregistration_returned() {
    let _serial = crate::cma::records::tests::serial();
    let md: Arc<dyn MemoryDomain> = Arc::new(CmaMd::new("sm"));
    let mut iface = CmaIface::open(md.clone());
    let mut ep = iface
        .create_ep(EpParams::ToIface {
            device_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
        })
        .expect("an endpoint to this process");
    let mut memory = vec![0u8; LEN];
    let addr = memory.as_mut_ptr() as usize;
    // SAFETY: `memory` outlives the handle: the owner thread drops the
    // handle and is joined before `memory` is dropped.
    let mem = unsafe { md.register(memory.as_mut_ptr(), LEN, Access::all()) }.expect("register");
    let rkey = component::unpack_rkey("sm", &md.pack_rkey(&mem).expect("pack")).expect("unpack");

    let (owner_tx, owner_rx) = mpsc::channel();
    BETWEEN.with(|hook| {
        *hook.borrow_mut() = Some(Box::new(move || {
            let owner = std::thread::spawn(move || {
                drop(mem);
                // The owner reuses its memory once deregistration returned.
                // SAFETY: `memory` is alive until this thread is joined, and
                // the test thread does not touch it meanwhile.
                unsafe { std::ptr::write_bytes(addr as *mut u8, REUSED, LEN) };
            });
            // Time for the owner to deregister and reuse the memory, unless
            // deregistration waits for this access.
            std::thread::sleep(Duration::from_millis(300));
            let _ = owner_tx.send(owner);
        }))
    });
    let put = ep.put_short(&[PUT; 64], addr as u64, &rkey);
    owner_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the hook ran")
        .join()
        .expect("the owner thread");
    let landed = memory.iter().filter(|&&b| b == PUT).count();
    assert_eq!(
        landed, 0,
        "the put ({put:?}) wrote {landed} bytes into memory its owner had deregistered and reused"
    );
    assert!(memory.iter().all(|&b| b == REUSED));
}
