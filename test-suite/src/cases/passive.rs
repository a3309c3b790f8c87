//! A transport that advertises [`Caps::PASSIVE_TARGET`] promises that
//! puts, gets and atomics reach target memory and complete without the
//! target's progress (perftest's server sleeps through one-sided tests on
//! that promise). With the target stopped (`Target::hold`: its iface is not
//! driven, here or in the child), one operation of every advertised put,
//! get and atomic class, and a flush, must complete with only the
//! initiator progressing, and their bytes must be where they belong before
//! the target goes on; then [`FLUSHES`] small puts, each flushed: more
//! flushes than a transport has receive buffers at its default (rc: 64),
//! in case a flush takes one. (On rc that needs unsignalled puts before
//! each flush, so that the flush posts something: its send queue
//! signals one post in 16, and every post at a UCT_RC_TX_QUEUE_LEN of
//! 16 or less, where the loop proves nothing of the flush.)

use uct_core::{Access, AtomicValue, Caps, Completion, CompletionData, FetchOp, Iov};

use super::{case, Case};
use crate::ensure;
use crate::pair::{pattern, Context, Pair, TestResult};
use crate::target::RemoteMem;

pub fn cases() -> Vec<Case> {
    vec![case("passive_target", Caps::PASSIVE_TARGET, passive_target)]
}

/// Bytes moved by each put and get: a size every class carries on the
/// transports here, cut to what the class advertises.
const LEN: usize = 512;
/// Where the atomic word lies in the target region (after the put slots).
const WORD_AT: usize = 8 * LEN;
/// Flushes posted while the target is stopped, each after a small put.
const FLUSHES: usize = 100;

fn passive_target(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(WORD_AT + 64, Access::all_rights())?;
    pair.target.hold(true)?;
    let held = while_held(pair, &remote);
    // Let the target go on whatever happened, so that the pair closes.
    pair.target.hold(false)?;
    held
}

/// A capability's name, as transport-info prints it.
fn name(cap: Caps) -> String {
    cap.iter_names()
        .map(|(n, _)| n.to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join("|")
}

/// Every advertised class once, the target stopped throughout.
fn while_held(pair: &mut Pair, remote: &RemoteMem) -> TestResult {
    let rkey = pair.rkey(remote)?;
    let caps = pair.caps();
    let attrs = pair.attrs();
    let local = pair.alloc(LEN, Access::all_rights())?;

    // Puts, each into a slot of its own, then a flush.
    let mut slots = Vec::new();
    for (i, (cap, max)) in [
        (Caps::PUT_SHORT, attrs.put.max_short),
        (Caps::PUT_BCOPY, attrs.put.max_bcopy),
        (Caps::PUT_ZCOPY, attrs.put.max_zcopy),
    ]
    .into_iter()
    .enumerate()
    {
        if !caps.contains(cap) || max == 0 {
            continue;
        }
        let len = LEN.min(max);
        let data = pattern(len, 7000 + i as u64);
        let at = i * LEN;
        let addr = remote.addr + at as u64;
        let what = format!("{} of {len} bytes to the stopped target", name(cap));
        let comp = Completion::new();
        if cap == Caps::PUT_ZCOPY {
            local.write(0, &data).ctx("fill the local buffer")?;
            pair.post_wait(&what, &comp, |ep, c| {
                ep.put_zcopy(&[Iov::new(&local, 0, len)], addr, &rkey, Some(c))
            })
        } else if cap == Caps::PUT_SHORT {
            pair.post_wait(&what, &comp, |ep, _| ep.put_short(&data, addr, &rkey))
        } else {
            pair.post_wait(&what, &comp, |ep, _| ep.put_bcopy(&data, addr, &rkey))
        }
        .ctx(&what)?;
        slots.push((at, data, what));
    }
    pair.flush()
        .ctx("a flush after the puts, the target stopped")?;
    for (at, data, what) in &slots {
        let got = pair.remote_read(remote, *at, data.len())?;
        ensure!(
            got == *data,
            "{what} completed and was flushed, but the target does not hold its bytes"
        );
    }

    // Many flushes, each after a put of 8 bytes (the cheapest put class).
    let at = 5 * LEN;
    let addr = remote.addr + at as u64;
    for i in 0..FLUSHES {
        let word = (i as u64).to_le_bytes();
        let comp = Completion::new();
        let what = format!(
            "put {} of {FLUSHES}, each flushed, to the stopped target",
            i + 1
        );
        if caps.contains(Caps::PUT_SHORT) && attrs.put.max_short >= 8 {
            pair.post_wait(&what, &comp, |ep, _| ep.put_short(&word, addr, &rkey))
        } else if caps.contains(Caps::PUT_BCOPY) && attrs.put.max_bcopy >= 8 {
            pair.post_wait(&what, &comp, |ep, _| ep.put_bcopy(&word, addr, &rkey))
        } else {
            // A zero-copy put carries its completion: its flush has no
            // tail to signal. (Conformance asks put_bcopy of every
            // transport here, so this is a fallback only.)
            local.write(0, &word).ctx("fill the local buffer")?;
            pair.post_wait(&what, &comp, |ep, c| {
                ep.put_zcopy(&[Iov::new(&local, 0, 8)], addr, &rkey, Some(c))
            })
        }
        .ctx(&what)?;
        pair.flush()
            .ctx(&format!("flush {} of {FLUSHES}, the target stopped", i + 1))?;
    }
    let last = pair.remote_read(remote, at, 8)?;
    ensure!(
        last == ((FLUSHES - 1) as u64).to_le_bytes(),
        "after {FLUSHES} flushed puts the target holds {last:?}, not the last put's bytes"
    );

    // Gets of what the target holds (written there while it was stopped).
    let want = pattern(LEN, 7100);
    pair.remote_write(remote, 4 * LEN, &want)?;
    let addr = remote.addr + (4 * LEN) as u64;
    for (cap, max) in [
        (Caps::GET_SHORT, attrs.get.max_short),
        (Caps::GET_BCOPY, attrs.get.max_bcopy),
        (Caps::GET_ZCOPY, attrs.get.max_zcopy),
    ] {
        if !caps.contains(cap) || max == 0 {
            continue;
        }
        let len = LEN.min(max);
        let what = format!("{} of {len} bytes from the stopped target", name(cap));
        let comp = Completion::new();
        let got = if cap == Caps::GET_SHORT {
            let mut buf = vec![0u8; len];
            pair.post_wait(&what, &comp, |ep, _| ep.get_short(&mut buf, addr, &rkey))
                .ctx(&what)?;
            buf
        } else if cap == Caps::GET_BCOPY {
            pair.post_wait(&what, &comp, |ep, c| ep.get_bcopy(len, addr, &rkey, c))
                .ctx(&what)?;
            match comp.take_data() {
                Some(CompletionData::Bytes(b)) => b,
                other => return Err(format!("{what} delivered {other:?}, not bytes")),
            }
        } else {
            local
                .write(0, &vec![0u8; len])
                .ctx("clear the local buffer")?;
            pair.post_wait(&what, &comp, |ep, c| {
                ep.get_zcopy(&[Iov::new(&local, 0, len)], addr, &rkey, Some(c))
            })
            .ctx(&what)?;
            let mut buf = vec![0u8; len];
            local.read(0, &mut buf).ctx("read the local buffer")?;
            buf
        };
        ensure!(got == want[..len], "{what} returned other bytes");
    }

    // A fetch-and-add of the widest advertised width.
    let width = if caps.contains(Caps::ATOMIC64) {
        8
    } else if caps.contains(Caps::ATOMIC32) {
        4
    } else {
        return Ok(());
    };
    let start = 0x0102_0304_0506_0708u64 >> (64 - 8 * width);
    pair.remote_write(remote, WORD_AT, &start.to_le_bytes()[..width])?;
    let value = if width == 8 {
        AtomicValue::U64(5)
    } else {
        AtomicValue::U32(5)
    };
    let what = format!("a {width}-byte fetch-and-add on the stopped target");
    let comp = Completion::new();
    let word = remote.addr + WORD_AT as u64;
    pair.post_wait(&what, &comp, |ep, c| {
        ep.atomic_fetch(FetchOp::Add(value), word, &rkey, c)
    })
    .ctx(&what)?;
    ensure!(
        comp.value() == Some(start),
        "{what} fetched {:?}, not {start:#x}",
        comp.value()
    );
    let mut now = [0u8; 8];
    now[..width].copy_from_slice(&pair.remote_read(remote, WORD_AT, width)?);
    ensure!(
        u64::from_le_bytes(now) == start + 5,
        "{what} left {:#x} at the target, not {:#x}",
        u64::from_le_bytes(now),
        start + 5
    );
    Ok(())
}
