//! Helpers the transfer tests share: a connected pair in one process, the
//! transports every test runs over, and a deadline for every wait.

#![allow(dead_code)] // each test binary uses some of these

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
