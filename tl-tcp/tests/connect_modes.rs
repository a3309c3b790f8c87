//! tcp endpoints connect to an iface or to a peer endpoint, and an iface
//! serves many endpoints at once.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{counter, open, to_iface};
use uct_core::{Caps, EpParams, Iface, Status, UctError};

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
    let at_a = counter(a.as_mut(), 1);
    let at_b = counter(b.as_mut(), 1);
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
    let got = counter(server.as_mut(), 2);
    let mut eps: Vec<_> = (0..32)
        .map(|_| client.create_ep(to_iface(server.as_ref())).unwrap())
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
