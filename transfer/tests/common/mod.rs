//! Helpers the transfer tests share: a connected pair in one process, the
//! transports every test runs over, and a deadline for every wait.

// Each test binary uses some of these helpers, none uses all.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use uct_transfer::{Progress, Transport};

/// The transports every test runs over, in one process.
pub const TRANSPORTS: [&str; 3] = ["self", "posix", "tcp"];

/// The bound on every wait of a test: a hang is a failure, not a stuck run.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A Transport over `tl` (tcp on loopback).
pub fn transport(tl: &str, progress: Progress) -> Transport {
    let mut b = Transport::builder().transport(tl).progress(progress);
    if tl == "tcp" {
        b = b.device("lo");
    }
    b.build()
        .unwrap_or_else(|e| panic!("building a {tl} transport: {e}"))
}

/// Two Transports over `tl`, bound and connected to each other.
pub fn pair(tl: &str, progress: Progress) -> (Transport, Transport) {
    let a = transport(tl, progress);
    let b = transport(tl, progress);
    let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
    assert!(a.connected() && b.connected());
    assert_eq!(a.transport_name().as_deref(), Some(tl));
    (a, b)
}

/// Runs `fut` on this thread within [`LIMIT`], driving `drive`'s progress
/// when it is manual.
pub fn within<F: Future>(what: &str, drive: &[&Transport], fut: F) -> F::Output {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(fut);
    let start = Instant::now();
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        for t in drive {
            t.progress();
        }
        if drive.is_empty() {
            std::thread::yield_now();
        }
        assert!(
            start.elapsed() < LIMIT,
            "{what}: no result within {LIMIT:?}"
        );
    }
}

/// Two Transports over `tl` (tcp on loopback) with the builder settings
/// `tweak` adds, bound and connected to each other.
pub fn pair_with(
    tl: &str,
    tweak: impl Fn(uct_transfer::Builder) -> uct_transfer::Builder,
) -> (Transport, Transport) {
    let build = || {
        let mut b = tweak(Transport::builder().transport(tl));
        if tl == "tcp" {
            b = b.device("lo");
        }
        b.build().unwrap()
    };
    let (a, b) = (build(), build());
    let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
    (a, b)
}

/// A pair with a depth of `depth` operations in flight.
pub fn pair_with_depth(tl: &str, depth: usize) -> (Transport, Transport) {
    pair_with(tl, |b| b.max_in_flight(depth))
}

/// The byte write `i` of the ordering tests fills its slot with: never 0,
/// so a slot not yet written reads as stale.
pub fn fill_of(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

/// The length of write `i` of the ordering tests: 1 to `slot` bytes.
pub fn len_of(i: usize, slot: usize) -> usize {
    1 + (i * 37) % slot
}

/// The check strings carry (FNV-1a 64), for tests that forge a key or URL
/// with a valid check.
pub fn with_check(body: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{body}#{h:016x}")
}
