//! tcp endpoints connect to an iface or to a peer endpoint, and an iface
//! serves many endpoints at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tl_tcp as _;
use uct_core::{Caps, EpParams, Iface, Registry, Status, UctError};

fn open() -> Box<dyn Iface> {
    Registry::global()
        .open_iface("tcp", Some("lo"), &Default::default())
        .expect("tcp on lo")
}

fn counter(iface: &mut Box<dyn Iface>, id: u8) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    iface
        .set_am_handler(
            id,
            Box::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    n
}

fn progress_until(ifaces: &mut [&mut Box<dyn Iface>], mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        for i in ifaces.iter_mut() {
            i.progress();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
    }
}

#[test]
fn endpoint_to_endpoint_both_ways() {
    let mut a = open();
    let mut b = open();
    assert!(a
        .attrs()
        .caps
        .contains(Caps::CONNECT_TO_EP | Caps::CONNECT_TO_IFACE));
    let at_a = counter(&mut a, 1);
    let at_b = counter(&mut b, 1);
    let mut ea = a.create_ep(EpParams::Unconnected).unwrap();
    let mut eb = b.create_ep(EpParams::Unconnected).unwrap();
    // Not connected yet: a clear error, not a hang.
    let e = ea.am_bcopy(1, b"x").unwrap_err();
    assert!(
        matches!(e, UctError::InvalidParam(ref m) if m.contains("connect_to_ep")),
        "{e}"
    );
    let (addr_a, addr_b) = (ea.ep_address().unwrap(), eb.ep_address().unwrap());
    ea.connect_to_ep(&b.device_address(), &addr_b).unwrap();
    eb.connect_to_ep(&a.device_address(), &addr_a).unwrap();
    assert_eq!(ea.am_bcopy(1, b"to b").unwrap(), Status::Done);
    assert_eq!(eb.am_bcopy(1, b"to a").unwrap(), Status::Done);
    progress_until(&mut [&mut a, &mut b], || {
        at_a.load(Ordering::SeqCst) == 1 && at_b.load(Ordering::SeqCst) == 1
    });
    assert!(
        ea.connect_to_ep(&b.device_address(), &addr_b).is_err(),
        "connecting twice must fail"
    );
}

#[test]
fn many_endpoints_to_one_iface() {
    let mut server = open();
    let mut client = open();
    let got = counter(&mut server, 2);
    let mut eps: Vec<_> = (0..32)
        .map(|_| {
            client
                .create_ep(EpParams::ToIface {
                    device_addr: server.device_address(),
                    iface_addr: server.iface_address(),
                })
                .unwrap()
        })
        .collect();
    for round in 0..10u8 {
        for ep in eps.iter_mut() {
            assert_eq!(ep.am_bcopy(2, &[round; 100]).unwrap(), Status::Done);
        }
    }
    progress_until(&mut [&mut server, &mut client], || {
        got.load(Ordering::SeqCst) == 320
    });
}
