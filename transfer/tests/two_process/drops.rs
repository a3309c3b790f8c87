//! A Transport dropped with operations pending, on either side of two
//! processes: every future ends, with an error where the operation did
//! not complete, and nothing hangs.

use std::time::Instant;

use libtest_mimic::Failed;
use uct_transfer::{TransferError, Transport};

use crate::child::SERVE_LEN;
use crate::common::within;
use crate::peer::Served;
use crate::{slack, GRACE, PEER_TIMEOUT};

/// Notified writes of [`SERVE_LEN`] bytes in flight when the peer drops
/// its Transport, and posted once it said it did.
const PENDING: usize = 32;
const AFTER: usize = 4;

/// The peer drops its Transport (its process and memory stay) while we
/// have a wait and notified writes pending: the wait ends with an error
/// within the peer timeout; each pending write ends (landed before the
/// drop, or failed); a write posted after the drop fails (on posix, one
/// posted within its 2 ms probe interval may land: see below), and every
/// write once the wait failed.
pub fn peer_drops_its_transport(tl: &str) -> Result<(), Failed> {
    let mut s = Served::connected(tl)?;
    let wait = s.t.wait_for_write();
    let pending: Vec<_> = (0..PENDING)
        .map(|_| s.t.write(&s.mem.whole(), &s.remote, true))
        .collect();
    s.peer.ask("drop-transport", "dropped")?;
    let dropped = Instant::now();
    let after: Vec<_> = (0..AFTER)
        .map(|_| s.t.write(&s.mem.whole(), &s.remote, true))
        .collect();
    let err = within("the wait", &[], wait).expect_err("a wait on a peer gone resolved Ok");
    let took = dropped.elapsed();
    let limit = PEER_TIMEOUT + slack(tl, (PENDING + AFTER) * SERVE_LEN) + GRACE;
    assert!(took < limit, "{tl}: the wait ended after {took:?}: {err}");
    let failed = pending
        .into_iter()
        .map(|w| within("a pending write", &[], w))
        .filter(Result::is_err)
        .count();
    let mut after_ok = 0;
    for (i, w) in after.into_iter().enumerate() {
        let r = within("a write posted after the drop", &[], w);
        // posix looks at the peer's identity page at most every 2 ms
        // (tl-sm's PROBE_INTERVAL), answering from what it last found in
        // between: a write posted within that window lands in memory the
        // peer still holds, and its notification goes to a ring nobody
        // reads. tcp and rc fail each one.
        if r.is_ok() {
            assert!(
                tl == "posix",
                "{tl}: notified write {i} to a peer that dropped its Transport succeeded"
            );
            after_ok += 1;
        }
    }
    let e = within(
        "a later write",
        &[],
        s.t.write(&s.mem.whole(), &s.remote, true),
    );
    assert!(e.is_err(), "{tl}: a later write succeeded");
    assert!(
        dropped.elapsed() < limit,
        "{tl}: took {:?}",
        dropped.elapsed()
    );
    eprintln!(
        "{tl}: the wait ended {took:?} after the peer dropped its Transport ({failed} of {PENDING} writes pending then failed, {after_ok} of {AFTER} posted after it succeeded): {err}"
    );
    s.peer.say("quit")?;
    Ok(())
}

/// Writes queued past a depth of 2 in flight, and a wait, when we drop
/// our Transport while the peer lives: they end Ok (landed) or Closed;
/// the peer's wait then ends with an error within its peer timeout.
pub fn ours_dropped(tl: &str) -> Result<(), Failed> {
    let mut b = Transport::builder().transport(tl).max_in_flight(2);
    if tl == "tcp" {
        b = b.device("lo");
    }
    let s = Served::spawn(tl, b.build()?)?.connect()?;
    let Served {
        t,
        mem,
        remote,
        mut peer,
        ..
    } = s;
    peer.say("drain")?;
    let writes: Vec<_> = (0..200)
        .map(|_| t.write(&mem.whole(), &remote, false))
        .collect();
    let wait = t.wait_for_write();
    drop(t);
    let dropped = Instant::now();
    assert_eq!(
        within("the wait", &[], wait),
        Err(TransferError::Closed),
        "{tl}"
    );
    let mut closed = 0;
    for w in writes {
        match within("a write", &[], w) {
            Ok(()) => {}
            Err(TransferError::Closed) => closed += 1,
            Err(e) => return Err(format!("{tl}: a write pending at the drop: {e}").into()),
        }
    }
    if tl != "posix" {
        // posix writes land in the call.
        assert!(
            closed > 0,
            "{tl}: 200 writes of 1 MiB all completed before the drop"
        );
    }
    let limit = PEER_TIMEOUT + GRACE;
    let ended = peer.expect_within("ended ", limit)?;
    let took = dropped.elapsed();
    assert!(
        took < limit,
        "{tl}: the peer's wait ended {took:?} after the drop: {ended}"
    );
    assert!(
        ended.starts_with("0 "),
        "{tl}: the peer was notified: {ended}"
    );
    eprintln!(
        "{tl}: {closed} of 200 writes ended Closed; the peer's wait ended {took:?} after the drop: {ended}"
    );
    peer.say("quit")?;
    Ok(())
}
