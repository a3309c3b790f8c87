//! A cma endpoint whose peer process died with nothing outstanding must say
//! so through `Endpoint::check` within a few milliseconds (issue 12,
//! finding 9), naming the peer.

use std::process::Command;
use std::time::{Duration, Instant};

use uct_core::{EpParams, IfaceParams, Registry, UctError};

/// How long the check may take to see the exit: the watch probes every few
/// milliseconds; this leaves room for a loaded machine.
const WITHIN: Duration = Duration::from_secs(1);

#[test]
fn check_names_a_peer_that_died_with_nothing_outstanding() {
    let mut iface = Registry::global()
        .open_iface("cma", None, &IfaceParams::default())
        .expect("a cma iface");
    let mut peer = Command::new("sleep").arg("30").spawn().expect("sleep");
    let mut device_addr = tl_sm::host::boot_id().to_vec();
    device_addr.extend_from_slice(&peer.id().to_le_bytes());
    let mut ep = iface
        .create_ep(EpParams::ToIface {
            device_addr,
            iface_addr: Vec::new(),
        })
        .expect("an endpoint to the peer");
    assert!(ep.check().is_ok(), "the peer is alive");
    peer.kill().expect("kill the peer");
    // Not reaped: a dead peer that is still a zombie is dead all the same.
    let killed = Instant::now();
    let result = loop {
        iface.progress();
        match ep.check() {
            Ok(()) if killed.elapsed() < WITHIN => std::thread::yield_now(),
            other => break other,
        }
    };
    let _ = peer.wait();
    match result {
        Err(UctError::EndpointFailed(why)) if why.contains(&peer.id().to_string()) => {}
        other => panic!(
            "check {:?} after the peer process {} was killed: {other:?}, not an endpoint failure naming it",
            killed.elapsed(),
            peer.id()
        ),
    }
}
