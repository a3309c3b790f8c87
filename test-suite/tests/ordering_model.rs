//! The ordering cases over the delaying wrapper (`test_suite::delay`) on
//! the `self` transport: they pass where flush and fence are honoured, and
//! fail where the wrapper breaks either on purpose. Every real transport
//! here is in order, so only over this wrapper can a no-op fence or an
//! early flush show.

use test_suite::delay::{delayed, Faults};
use test_suite::pair::{Mode, Pair};
use test_suite::{all_cases, TestResult};
use uct_core::{Access, Registry, Status};

fn self_pair(faults: Faults) -> Pair {
    let reg = Registry::global();
    let resource = reg
        .resources()
        .into_iter()
        .find(|resource| resource.tl.transport == "self")
        .expect("the self transport is built into uct-core");
    delayed(
        Pair::new(reg, &resource, Mode::InProcess).expect("a self pair"),
        faults,
    )
}

fn run(name: &str, faults: Faults) -> TestResult {
    let case = all_cases()
        .into_iter()
        .find(|case| case.name == name)
        .unwrap_or_else(|| panic!("no case named {name}"));
    (case.run)(&mut self_pair(faults))
}

/// The cases that put, flush and fence pass over the wrapper as it should
/// be: it reorders, but honours flush and fence.
#[test]
fn ordering_cases_pass_over_the_reordering_wrapper() {
    for name in [
        "flush_stream",
        "fence",
        "back_pressure",
        "put_short",
        "put_bcopy",
        "put_zcopy",
        "put_zcopy_iov",
        "atomic64",
    ] {
        if let Err(e) = run(name, Faults::default()) {
            panic!("{name} over the reordering wrapper: {e}");
        }
    }
}

/// Without a fence the wrapper does reorder: two puts to one address land
/// in the reverse of their order. Otherwise the fence case below would
/// prove nothing.
#[test]
fn the_wrapper_reorders_puts() {
    let mut pair = self_pair(Faults::default());
    let remote = pair.remote(8, Access::all_rights()).unwrap();
    let rkey = pair.rkey(&remote).unwrap();
    for data in [b"first..", b"second."] {
        // Buffered: done locally at once, applied later.
        assert_eq!(
            pair.ep.put_bcopy(data, remote.addr, &rkey).unwrap(),
            Status::Done
        );
    }
    pair.flush().unwrap();
    assert_eq!(pair.remote_read(&remote, 0, 7).unwrap(), b"first..");
}

#[test]
fn an_early_flush_fails_flush_stream() {
    let faults = Faults {
        early_flush: true,
        ..Faults::default()
    };
    let e = run("flush_stream", faults).expect_err("flush_stream passed with an early flush");
    assert!(e.contains("the flush completed before put"), "{e}");
}

#[test]
fn a_fence_that_orders_nothing_fails_fence() {
    let faults = Faults {
        ignore_fence: true,
        ..Faults::default()
    };
    let e = run("fence", faults).expect_err("fence passed with a no-op fence");
    assert!(e.contains("the put before the fence landed last"), "{e}");
}
