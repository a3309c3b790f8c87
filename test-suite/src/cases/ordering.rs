//! Flush, fence and back-pressure.

use uct_core::{Access, Caps, Completion, Iov, Status};

use super::{case, delivery_needs_target, Case};
use crate::ensure;
use crate::pair::{pattern, Context, Pair, TestResult, WAIT};

pub fn cases() -> Vec<Case> {
    vec![
        case(
            "flush_stream",
            Caps::PUT_ZCOPY.union(Caps::FLUSH),
            flush_stream,
        ),
        case(
            "flush_waits_for_target",
            Caps::PUT_BCOPY.union(Caps::FLUSH),
            flush_waits_for_target,
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

/// Posts with `op` without waiting for any completion, progressing while
/// the transport says NoResource.
fn post_retrying(
    pair: &mut Pair,
    what: &str,
    mut op: impl FnMut(&mut dyn uct_core::Endpoint) -> Result<Status, uct_core::UctError>,
) -> TestResult {
    let t0 = std::time::Instant::now();
    while let Status::NoResource = op(pair.ep.as_mut()).ctx(what)? {
        pair.progress();
        ensure!(
            t0.elapsed() < WAIT,
            "{what}: no send resources for {WAIT:?}"
        );
    }
    Ok(())
}

/// Many puts without waiting, then one flush: once the flush has
/// completed, and before any put's own completion is looked at, everything
/// has landed, and every put has completed.
fn flush_stream(pair: &mut Pair) -> TestResult {
    let count = 64usize;
    let piece = 4096usize;
    let local = pair.alloc(count * piece, Access::all_rights())?;
    let remote = pair.remote(count * piece, Access::all_rights())?;
    let data = pattern(count * piece, 2000);
    local.write(0, &data).ctx("fill")?;
    let rkey = pair.rkey(&remote)?;
    let comps: Vec<Completion> = (0..count).map(|_| Completion::new()).collect();
    for (i, comp) in comps.iter().enumerate() {
        let iov = [Iov::new(&local, i * piece, piece)];
        put_retrying(pair, &iov, remote.addr + (i * piece) as u64, &rkey, comp)?;
    }
    pair.flush().ctx("flush")?;
    let got = pair.remote_read(&remote, 0, count * piece)?;
    if let Some(at) = got.iter().zip(&data).position(|(a, b)| a != b) {
        return Err(format!(
            "the flush completed before put {} (byte {at}) had landed",
            at / piece
        ));
    }
    for (i, comp) in comps.iter().enumerate() {
        ensure!(
            comp.is_complete(),
            "put {i} was still pending when the flush after it completed"
        );
        comp.result().ctx(&format!("put {i}"))?;
    }
    Ok(())
}

/// How long flush_waits_for_target drives the initiator alone, with the
/// target stopped, before it lets the target go on.
const HELD_FOR: std::time::Duration = std::time::Duration::from_millis(300);

/// A flush completes only once what was put before it is at the target.
/// With the target stopped (`Target::hold`: its iface is not driven, here
/// or in the child), a few puts and a flush are posted, and only the
/// initiator progresses for [`HELD_FOR`]: a flush that completes meanwhile
/// must find every byte already in target memory. Where delivery needs
/// the target's progress (tcp, see [`delivery_needs_target`]) nothing can
/// land while it is stopped, so there the flush must still be pending: a
/// flush that completes once the local send queue has drained fails. Where
/// the initiator or a NIC writes target memory (self, loop, posix, cma,
/// rc), a flush may complete meanwhile, and then the bytes must be there.
/// Let go, the target executes what waited, the flush completes without
/// an error, and every byte is there.
fn flush_waits_for_target(pair: &mut Pair) -> TestResult {
    let count = 8usize;
    let piece = pair.attrs().put.max_bcopy.min(4096);
    ensure!(
        piece > 0,
        "put_bcopy is advertised with a largest size of 0"
    );
    let remote = pair.remote(count * piece, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let data = pattern(count * piece, 5000);
    let needs_target = delivery_needs_target(&pair.resource.tl.transport);
    pair.target.hold(true)?;
    let held = flush_while_held(pair, &remote, &rkey, &data, piece);
    // Let the target go on whatever happened, so that the pair closes.
    pair.target.hold(false)?;
    let (comp, flushed) = held?;
    let at_target = pair.remote_read(&remote, 0, data.len())?;
    if flushed && needs_target {
        return Err(format!(
            "the flush completed while the target was stopped ({} of {} bytes there): {} puts \
             land only when the target executes them, so the flush cannot know they did",
            at_target.iter().zip(&data).filter(|(a, b)| a == b).count(),
            data.len(),
            pair.resource.tl.transport
        ));
    }
    pair.wait_for("the flush, once the target goes on", |_| {
        Ok(comp.is_complete())
    })?;
    comp.result().ctx("the flush, once the target went on")?;
    let got = pair.remote_read(&remote, 0, data.len())?;
    if let Some(at) = got.iter().zip(&data).position(|(a, b)| a != b) {
        return Err(format!(
            "the flush completed before put {} (byte {at}) had landed",
            at / piece
        ));
    }
    Ok(())
}

/// The held part of flush_waits_for_target: puts, a flush, [`HELD_FOR`] of
/// the initiator's progress; if the flush completed, checks the target
/// memory at once, before anything else is driven. Returns the flush's
/// completion and whether it completed.
fn flush_while_held(
    pair: &mut Pair,
    remote: &crate::target::RemoteMem,
    rkey: &uct_core::RemoteKey,
    data: &[u8],
    piece: usize,
) -> Result<(Completion, bool), String> {
    for (i, chunk) in data.chunks(piece).enumerate() {
        let addr = remote.addr + (i * piece) as u64;
        post_retrying(pair, "put to the stopped target", |ep| {
            ep.put_bcopy(chunk, addr, rkey)
        })?;
    }
    let comp = Completion::new();
    let t0 = std::time::Instant::now();
    let mut flushed = loop {
        match pair.ep.flush(Some(&comp)).ctx("flush")? {
            Status::Done => break true,
            Status::InProgress => break false,
            Status::NoResource => {
                pair.progress();
                ensure!(t0.elapsed() < WAIT, "flush: no send resources for {WAIT:?}");
            }
        }
    };
    let t0 = std::time::Instant::now();
    while !flushed && t0.elapsed() < HELD_FOR {
        // The target is held: only the initiator progresses.
        pair.progress();
        flushed = comp.is_complete();
    }
    if flushed {
        comp.result()
            .ctx("a flush that completed while the target was stopped")?;
        let got = pair.remote_read(remote, 0, data.len())?;
        if let Some(at) = got.iter().zip(data).position(|(a, b)| a != b) {
            return Err(format!(
                "the flush completed while the target was stopped, before put {} (byte {at}) \
                 had landed",
                at / piece
            ));
        }
    }
    Ok((comp, flushed))
}

/// A put after a fence is not overtaken by a put before it: a large put,
/// a fence, then a small put into the middle of the same range, posted
/// without waiting for either; the small one's bytes must be the ones that
/// stay.
fn fence(pair: &mut Pair) -> TestResult {
    let big = pair.attrs().put.max_bcopy.min(64 << 10);
    let small = 512.min(big / 2);
    ensure!(
        small > 0,
        "put_bcopy is advertised with a largest size of {big}"
    );
    let remote = pair.remote(big, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for round in 0..50usize {
        let first = pattern(big, 3000 + round as u64);
        let second = pattern(small, 4000 + round as u64);
        let at = (round * 61) % (big - small);
        post_retrying(pair, "put before the fence", |ep| {
            ep.put_bcopy(&first, remote.addr, &rkey)
        })?;
        post_retrying(pair, "fence", |ep| ep.fence())?;
        post_retrying(pair, "put after the fence", |ep| {
            ep.put_bcopy(&second, remote.addr + at as u64, &rkey)
        })?;
        pair.flush().ctx("flush")?;
        let got = pair.remote_read(&remote, 0, big)?;
        ensure!(
            got[at..at + small] == second[..],
            "round {round}: the put before the fence landed last"
        );
        ensure!(
            got[..at] == first[..at] && got[at + small..] == first[at + small..],
            "round {round}: the put before the fence did not land"
        );
    }
    Ok(())
}

/// A message for back_pressure: its sequence number, then filler.
fn message(seq: u64, len: usize) -> Vec<u8> {
    let mut msg = vec![(seq % 251) as u8; len];
    msg[..8].copy_from_slice(&seq.to_le_bytes());
    msg
}

/// With the receiver stopped and the sender not progressing, a transport's
/// queues fill: it must answer NoResource (its queues are bounded) before
/// [`HELD_BYTES`]. Then, with the receiver draining, every message arrives
/// exactly once and in order.
fn back_pressure(pair: &mut Pair) -> TestResult {
    pair.target.listen(2)?;
    let len = pair.attrs().am.max_bcopy.clamp(8, 1024);
    let bound = (HELD_BYTES / len) as u64;
    pair.target.hold(true)?;
    let mut sent = 0u64;
    let mut refused = false;
    let t0 = std::time::Instant::now();
    while sent < bound && !refused {
        match pair.ep.am_bcopy(2, &message(sent, len)).ctx("am_bcopy")? {
            Status::Done | Status::InProgress => sent += 1,
            Status::NoResource => refused = true,
        }
        ensure!(t0.elapsed() < WAIT, "sent {sent} in {WAIT:?}");
    }
    pair.target.hold(false)?;
    ensure!(
        refused,
        "{sent} messages of {len} bytes posted to a receiver that drains nothing, and never a \
         NoResource: the send queue is not bounded"
    );
    log::info!(
        "{}: back_pressure: NoResource after {sent} messages of {len} bytes",
        pair.resource.tl.transport
    );
    let total = sent + 2000;
    while sent < total {
        match pair.ep.am_bcopy(2, &message(sent, len)).ctx("am_bcopy")? {
            Status::Done | Status::InProgress => sent += 1,
            Status::NoResource => {
                // Only now let the receiver drain.
                pair.progress();
            }
        }
        ensure!(t0.elapsed() < WAIT, "sent {sent} of {total} in {WAIT:?}");
    }
    let mut next = 0u64;
    while next < total {
        let batch = pair.target.take_some(2, 1000)?;
        if batch.is_empty() {
            pair.progress();
            ensure!(
                t0.elapsed() < WAIT,
                "{next} of {total} messages arrived in {WAIT:?}"
            );
            continue;
        }
        for msg in batch {
            let seq = u64::from_le_bytes(
                msg.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or("short message")?,
            );
            ensure!(seq == next, "message {seq} arrived in position {next}");
            ensure!(msg == message(seq, len), "message {seq} arrived changed");
            next += 1;
        }
    }
    pair.flush().ctx("flush")?;
    ensure!(
        pair.target.inbox_len(2)? == 0,
        "more than the {total} messages sent arrived"
    );
    Ok(())
}

/// Bytes back_pressure posts to a stopped receiver before it calls the
/// queue unbounded: far more than any transport's queues and socket
/// buffers (tcp: 8 MiB queued, plus the kernel's).
const HELD_BYTES: usize = 64 << 20;
