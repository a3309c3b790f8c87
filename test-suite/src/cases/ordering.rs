//! Flush, fence and back-pressure.

use uct_core::{Access, Caps, Completion, Iov, Status};

use super::{case, Case};
use crate::ensure;
use crate::pair::{pattern, Context, Pair, TestResult, WAIT};

pub fn cases() -> Vec<Case> {
    vec![
        case(
            "flush_stream",
            Caps::PUT_ZCOPY.union(Caps::FLUSH),
            flush_stream,
        ),
        case("fence", Caps::PUT_BCOPY.union(Caps::FENCE), fence),
        case("back_pressure", Caps::AM_BCOPY, back_pressure),
    ]
}

/// Posts a put_zcopy, progressing while the transport says NoResource.
pub(crate) fn put_retrying(
    pair: &mut Pair,
    iov: &[Iov<'_>],
    addr: u64,
    rkey: &uct_core::RemoteKey,
    comp: &Completion,
) -> TestResult {
    let t0 = std::time::Instant::now();
    while let Status::NoResource = pair
        .ep
        .put_zcopy(iov, addr, rkey, Some(comp))
        .ctx("put_zcopy")?
    {
        pair.progress();
        ensure!(t0.elapsed() < WAIT, "no send resources for {WAIT:?}");
    }
    Ok(())
}

/// Many puts without waiting, then one flush: everything has landed.
fn flush_stream(pair: &mut Pair) -> TestResult {
    let count = 64usize;
    let piece = 4096usize;
    let local = pair.alloc(count * piece, Access::all_rights())?;
    let remote = pair.remote(count * piece, Access::all_rights())?;
    let data = pattern(count * piece, 2000);
    local.write(0, &data).ctx("fill")?;
    let rkey = pair.rkey(&remote)?;
    let comp = Completion::new();
    for i in 0..count {
        let iov = [Iov::new(&local, i * piece, piece)];
        put_retrying(pair, &iov, remote.addr + (i * piece) as u64, &rkey, &comp)?;
    }
    pair.flush().ctx("flush")?;
    let fired = comp.clone();
    pair.wait_for("put completions", |_| Ok(fired.is_complete()))?;
    comp.result().ctx("put completion")?;
    ensure!(
        pair.remote_read(&remote, 0, count * piece)? == data,
        "data missing after flush"
    );
    Ok(())
}

/// A put after a fence is not overtaken by one before it.
fn fence(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for round in 0..50u64 {
        let first = pattern(512, 3000 + round);
        let second = pattern(512, 4000 + round);
        let comp = Completion::new();
        pair.post_wait("put a", &comp, |ep, _| {
            ep.put_bcopy(&first, remote.addr, &rkey)
        })
        .ctx("put")?;
        pair.post_wait("fence", &comp, |ep, _| ep.fence())
            .ctx("fence")?;
        pair.post_wait("put b", &comp, |ep, _| {
            ep.put_bcopy(&second, remote.addr, &rkey)
        })
        .ctx("put")?;
        pair.flush().ctx("flush")?;
        ensure!(
            pair.remote_read(&remote, 0, 512)? == second,
            "round {round}: the put before the fence landed last"
        );
    }
    Ok(())
}

/// Sending faster than the receiver drains ends in NoResource or is
/// absorbed; either way every message arrives exactly once and in order.
fn back_pressure(pair: &mut Pair) -> TestResult {
    pair.target.listen(2)?;
    let total = 20_000u64;
    let mut sent = 0u64;
    let mut refusals = 0u64;
    let t0 = std::time::Instant::now();
    while sent < total {
        match pair.ep.am_bcopy(2, &sent.to_le_bytes()).ctx("am_bcopy")? {
            Status::Done | Status::InProgress => sent += 1,
            Status::NoResource => {
                refusals += 1;
                // Only now let the receiver drain.
                pair.progress();
            }
        }
        ensure!(t0.elapsed() < WAIT, "sent {sent} of {total} in {WAIT:?}");
    }
    pair.wait_inbox(2, total as usize)?;
    for (i, d) in pair.target.take_inbox(2)?.iter().enumerate() {
        let seq = u64::from_le_bytes(
            d.get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or("short message")?,
        );
        ensure!(seq == i as u64, "message {seq} arrived in position {i}");
    }
    log::info!(
        "{}: back_pressure: {refusals} NoResource answers for {total} messages",
        pair.resource.tl.transport
    );
    Ok(())
}
