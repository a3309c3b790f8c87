//! A posix peer that dies, or stops draining its ring, with nothing
//! outstanding (finding 12.9): `Endpoint::check` must report it within
//! the peer timeout, naming it, and every later operation must fail.
//! The peer is a child process; the initiator of the timeout case is one
//! too, so that its UCT_POSIX_PEER_TIMEOUT is set before anything runs.

mod posix_support;

use std::io::Write;
use std::time::{Duration, Instant};

use posix_support::{
    connect_to, exported, hex, line_from, open_posix, role, run_child, spawn_child, unhex,
};
use uct_core::{Access, Endpoint, Iface, Iov, MemoryType, Registry, Status};

/// The owner: an iface and a region; prints `owner <device> <iface>
/// <rkey> <addr>` and serves (progresses, or not) until stdin closes.
#[test]
#[ignore = "run in a child process by the tests of this file"]
fn owner_child() {
    let Some(role) = role() else { return };
    let (md, mut iface) = open_posix();
    let (mem, rkey) = exported(md.as_ref(), 64 << 10);
    println!(
        "owner {} {} {} {:x}",
        hex(&iface.device_address()),
        hex(&iface.iface_address()),
        hex(&rkey),
        mem.addr()
    );
    std::io::stdout().flush().unwrap();
    // Serve until the parent closes stdin (or kills us).
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = std::io::stdin().read_line(&mut sink);
        let _ = tx.send(());
    });
    while rx.try_recv().is_err() {
        if role == "owner-draining" {
            iface.progress();
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

struct Peer {
    child: std::process::Child,
    device: Vec<u8>,
    iface: Vec<u8>,
    rkey: Vec<u8>,
    addr: u64,
}

impl Peer {
    /// An endpoint of `iface` to this peer.
    fn connect(&self, iface: &mut dyn Iface) -> Box<dyn Endpoint> {
        connect_to(iface, &self.device, &self.iface).expect("connect to the owner")
    }
}

fn start_owner(role: &str) -> Peer {
    let mut child = spawn_child("owner_child", role, &[]);
    let line = line_from(&mut child, "owner ", Duration::from_secs(30));
    let f: Vec<&str> = line.split_whitespace().collect();
    Peer {
        device: unhex(f[0]),
        iface: unhex(f[1]),
        rkey: unhex(f[2]),
        addr: u64::from_str_radix(f[3], 16).unwrap(),
        child,
    }
}

#[test]
fn a_killed_peer_fails_check_and_every_later_operation() {
    let mut peer = start_owner("owner-draining");
    let (md, mut iface) = open_posix();
    let mut ep = peer.connect(iface.as_mut());
    let rkey = Registry::global()
        .unpack_rkey(&peer.rkey, md.name())
        .unwrap();
    assert_eq!(
        ep.put_short(b"alive", peer.addr, &rkey).unwrap(),
        Status::Done
    );
    assert!(ep.check().is_ok(), "check of a live peer");
    let pid = peer.child.id();
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let killed = Instant::now();
    let err = loop {
        iface.progress();
        match ep.check() {
            Err(e) => break e,
            Ok(()) if killed.elapsed() > Duration::from_secs(3) => {
                panic!("check still Ok 3 s after the peer (pid {pid}) was killed")
            }
            Ok(()) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "check took {:?}",
        killed.elapsed()
    );
    assert!(err.to_string().contains(&pid.to_string()), "{err}");
    let local = md.alloc(4096, MemoryType::Host, Access::all()).unwrap();
    let iov = [Iov::new(&local, 0, 64)];
    let mut buf = [0u8; 8];
    let results = [
        ("put_short", ep.put_short(b"late", peer.addr, &rkey)),
        ("put_zcopy", ep.put_zcopy(&iov, peer.addr, &rkey, None)),
        ("get_short", ep.get_short(&mut buf, peer.addr, &rkey)),
        ("get_zcopy", ep.get_zcopy(&iov, peer.addr, &rkey, None)),
        ("am_short", ep.am_short(1, 0, b"late")),
        ("flush", ep.flush(None)),
    ];
    for (op, got) in results {
        assert!(got.is_err(), "{op} after the peer died: {got:?}");
    }
}

#[test]
fn a_peer_that_stops_draining_times_out() {
    let run = run_child(
        "stalled_initiator",
        "initiator",
        &[("UCT_POSIX_PEER_TIMEOUT", "300ms".into())],
        Duration::from_secs(60),
    );
    assert!(run.succeeded(), "{}\n{}", run.describe(), run.output);
}

/// Fills the ring of an owner that never drains it, then keeps trying:
/// the endpoint must fail with a timeout naming the owner within
/// UCT_POSIX_PEER_TIMEOUT (300 ms here) and a second.
#[test]
#[ignore = "run in a child process by a_peer_that_stops_draining_times_out"]
fn stalled_initiator() {
    if role().as_deref() != Some("initiator") {
        return;
    }
    let mut peer = start_owner("owner-stalled");
    let (_md, mut iface) = open_posix();
    let mut ep = peer.connect(iface.as_mut());
    let start = Instant::now();
    let mut full_since = None;
    let err = loop {
        iface.progress();
        let got = ep.am_short(1, 0, b"x").and_then(|s| ep.check().map(|()| s));
        match got {
            Err(e) => break e,
            Ok(Status::NoResource) => {
                full_since.get_or_insert_with(Instant::now);
            }
            Ok(_) => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no error 10 s into a ring that is never drained (full for {:?})",
            full_since.map(|t: Instant| t.elapsed())
        );
    };
    let full_for = full_since.expect("the ring filled").elapsed();
    let pid = peer.child.id();
    let _ = peer.child.stdin.take();
    let _ = peer.child.wait();
    println!("failed after {full_for:?} full: {err}");
    assert!(matches!(err, uct_core::UctError::Timeout(_)), "{err:?}");
    assert!(err.to_string().contains(&pid.to_string()), "{err}");
    assert!(full_for < Duration::from_millis(1300), "{full_for:?}");
}
