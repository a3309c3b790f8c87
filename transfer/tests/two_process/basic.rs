//! The scripted scenarios: ping-pong, 64 concurrent writes from 4
//! threads, 10,000 notified writes never stale, a peer killed with
//! SIGKILL (the peer's side is [`crate::child`]'s `scripted`).

use std::time::Instant;

use libtest_mimic::Failed;

use crate::common::{fill_of, len_of, within};
use crate::peer::connect;
use crate::{received_as_expected, sent_as_expected, slack, GRACE, PEER_TIMEOUT};

/// Writes in flight when the peer is killed, and the length of each.
const KILL_WRITES: usize = 32;
pub const KILL_LEN: usize = 1 << 20;
/// Writes posted on rc once the killed peer is reaped.
const AFTER_KILL: usize = 4;

pub const CONCURRENT_THREADS: usize = 4;
pub const CONCURRENT_EACH: usize = 16;
pub const CONCURRENT_LEN: usize = 16 << 10;
pub const ORDERED: usize = 10_000;
pub const SLOT: usize = 64;
pub const PING_LEN: usize = 8192;

pub fn pingpong(tl: &str) -> Result<(), Failed> {
    let (t, mem, remote, mut peer) = connect(tl, "pingpong")?;
    mem.write_bytes(0, &vec![0xab; PING_LEN])?;
    let w = t.write_tagged(&mem.whole(), &remote, 41);
    within("the ping", &[], w)?;
    // The pong lands in our memory, after our ping was read.
    let n = within("the pong", &[], t.wait_for_write())?;
    assert_eq!((n.len, n.tag), (PING_LEN, 42));
    let mut got = vec![0u8; PING_LEN];
    mem.read_bytes(0, &mut got)?;
    assert!(got.iter().all(|&b| b == 0xcd), "{tl}: pong data");
    peer.expect("ok")?;
    sent_as_expected(tl, &t, 1)?;
    received_as_expected(tl, &t, 1)?;
    peer.say("quit")?;
    Ok(())
}

pub fn concurrent(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "concurrent")?;
    for i in 0..CONCURRENT_THREADS * CONCURRENT_EACH {
        src.write_bytes(i * CONCURRENT_LEN, &vec![fill_of(i); CONCURRENT_LEN])?;
    }
    let t = std::sync::Arc::new(t);
    let writers: Vec<_> = (0..CONCURRENT_THREADS)
        .map(|k| {
            let (t, src, remote) = (t.clone(), src.clone(), remote.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let futs: Vec<_> = (0..CONCURRENT_EACH)
                    .map(|j| {
                        let i = k * CONCURRENT_EACH + j;
                        let at = i * CONCURRENT_LEN;
                        let view = src.view(at, CONCURRENT_LEN).map_err(|e| e.to_string())?;
                        let to = remote
                            .slice(at, CONCURRENT_LEN)
                            .map_err(|e| e.to_string())?;
                        Ok(t.write_tagged(&view, &to, i as u32))
                    })
                    .collect::<Result<_, String>>()?;
                for f in futs {
                    within("a write", &[], f).map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for w in writers {
        w.join().map_err(|_| "a writer panicked")??;
    }
    peer.expect("ok")?;
    sent_as_expected(tl, &t, (CONCURRENT_THREADS * CONCURRENT_EACH) as u64)?;
    peer.say("quit")?;
    Ok(())
}

pub fn ordering(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "ordering")?;
    for i in 0..ORDERED {
        src.write_bytes(i * SLOT, &[fill_of(i); SLOT])?;
    }
    let mut futs = Vec::with_capacity(ORDERED);
    for i in 0..ORDERED {
        let len = len_of(i, SLOT);
        futs.push(t.write_tagged(
            &src.view(i * SLOT, len)?,
            &remote.slice(i * SLOT, len)?,
            i as u32,
        ));
    }
    for f in futs {
        within("a write", &[], f)?;
    }
    peer.expect("ok")?;
    sent_as_expected(tl, &t, ORDERED as u64)?;
    peer.say("quit")?;
    Ok(())
}

/// SIGKILL the peer with a wait and writes pending: they all end with an
/// error within the peer timeout (and a grace for the machine's load, and
/// on rc the [`crate::slack`] its peer timeout gives the bytes in flight).
pub fn kill(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "kill")?;
    let wait = t.wait_for_write();
    // Writes in flight when the peer dies.
    let pending: Vec<_> = (0..KILL_WRITES)
        .map(|_| t.write(&src.whole(), &remote, true))
        .collect();
    peer.child.kill()?;
    let killed = Instant::now();
    let _ = peer.child.wait();
    // On rc the writes above may all land while the killed process is torn
    // down; writes posted now, to a peer that is gone, are pending when it
    // is found dead: nothing will acknowledge them. (posix writes land in
    // the call, into memory we still map; tcp may buffer: not asserted.)
    let after: Vec<_> = if tl == "rc" {
        (0..AFTER_KILL)
            .map(|_| t.write(&src.whole(), &remote, true))
            .collect()
    } else {
        Vec::new()
    };
    let err = within("the wait", &[], wait).expect_err("a wait on a dead peer resolved Ok");
    let took = killed.elapsed();
    let limit = PEER_TIMEOUT + slack(tl, (KILL_WRITES + AFTER_KILL) * KILL_LEN) + GRACE;
    assert!(took < limit, "{tl}: the wait ended after {took:?}: {err}");
    // Each pending write ends, landed before the kill or failed.
    let failed = pending
        .into_iter()
        .map(|w| within("a pending write", &[], w))
        .filter(Result::is_err)
        .count();
    for (i, w) in after.into_iter().enumerate() {
        let r = within("a write posted after the kill", &[], w);
        assert!(r.is_err(), "{tl}: write {i} to the dead peer succeeded");
    }
    // Every later write fails too, at once.
    let e = within("a later write", &[], t.write(&src.whole(), &remote, true));
    assert!(e.is_err(), "{tl}: a write to a dead peer succeeded");
    assert!(
        killed.elapsed() < limit,
        "{tl}: took {:?}",
        killed.elapsed()
    );
    eprintln!(
        "{tl}: the wait ended {took:?} after SIGKILL ({failed} of {KILL_WRITES} writes pending at the kill failed): {err}"
    );
    Ok(())
}
