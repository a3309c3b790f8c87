//! Puts with immediate data (RDMA WRITE WITH IMMEDIATE) between two rc
//! ifaces on the test device, and from a hostile raw queue pair.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use libtest_mimic::Failed;
use md_ib::IbRkey;
use uct_core::{Caps, Completion, Endpoint, ImmEvent, Iov, MemHandle, Status};

use crate::rig::{Ep, Hostile, Rc};

/// What a handler saw: the events in order, and any write whose data was
/// not in place when its immediate was delivered.
#[derive(Default)]
struct Seen {
    events: Vec<ImmEvent>,
    not_in_place: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn seen_len(seen: &Shared) -> usize {
    seen.lock().unwrap_or_else(|p| p.into_inner()).events.len()
}

/// Installs a handler on `rc` that records every event and checks that
/// the last byte of the write it names, at `slots[imm]` (offset, expected
/// byte) in `target`, is in place; immediates beyond `slots` are only
/// recorded.
fn install(rc: &mut Rc, target: &MemHandle, slots: Vec<(usize, u8)>) -> Result<Shared, Failed> {
    let seen: Shared = Arc::default();
    let (s, target) = (seen.clone(), target.clone());
    rc.iface.set_imm_handler(Box::new(move |e: ImmEvent| {
        let mut seen = s.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(offset, want)) = slots.get(e.imm as usize) {
            if e.len > 0 {
                let mut last = [0u8];
                let at = offset + e.len - 1;
                match target.read(at, &mut last) {
                    Ok(()) if last[0] == want => {}
                    Ok(()) => seen.not_in_place.push(format!(
                        "write {} ({} bytes): byte {at} is {:#x}, not {want:#x}, when its immediate arrived",
                        e.imm, e.len, last[0]
                    )),
                    Err(err) => seen.not_in_place.push(format!("write {}: {err}", e.imm)),
                }
            }
        }
        seen.events.push(e);
    }))?;
    Ok(seen)
}

/// Two ifaces on the device, an endpoint on each connected to the other.
fn two_ifaces() -> Result<(Rc, Rc, Ep, Ep), Failed> {
    let (mut a, mut b) = (Rc::open()?, Rc::open()?);
    let (mut ea, mut eb) = (a.ep()?, b.ep()?);
    let (aa, ba) = (ea.ep_address()?, eb.ep_address()?);
    ea.connect_to_ep(&b.iface.device_address(), &ba)?;
    eb.connect_to_ep(&a.iface.device_address(), &aa)?;
    for rc in [&a, &b] {
        if !rc.iface.attrs().caps.contains(Caps::PUT_IMM) {
            return Err(format!("rc on {} does not advertise PUT_IMM", rc.iface.device()).into());
        }
    }
    Ok((a, b, ea, eb))
}

/// Posts until it is not NoResource, progressing both sides meanwhile,
/// for at most 30 s.
fn post_imm(
    ep: &mut dyn Endpoint,
    sides: (&mut Rc, &mut Rc),
    iov: &[Iov<'_>],
    remote: (u64, &uct_core::RemoteKey),
    imm: u32,
) -> Result<(), Failed> {
    let t0 = std::time::Instant::now();
    loop {
        match ep.put_zcopy_imm(iov, remote.0, remote.1, imm, None)? {
            Status::NoResource => {
                if t0.elapsed() > Duration::from_secs(30) {
                    return Err(format!("write {imm}: NoResource for 30 s").into());
                }
                sides.0.iface.progress();
                sides.1.iface.progress();
            }
            _ => return Ok(()),
        }
    }
}

/// Flushes `ep` of `a`, progressing `b` too, within 60 s.
fn flush(ep: &mut dyn Endpoint, a: &mut Rc, b: &mut Rc) -> Result<(), Failed> {
    let done = Completion::new();
    let t0 = std::time::Instant::now();
    let mut st = ep.flush(Some(&done))?;
    while st == Status::NoResource {
        a.iface.progress();
        b.iface.progress();
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("flush: NoResource for 60 s".into());
        }
        st = ep.flush(Some(&done))?;
    }
    if st == Status::InProgress {
        while !done.is_complete() {
            a.iface.progress();
            b.iface.progress();
            if t0.elapsed() > Duration::from_secs(60) {
                return Err("flush: not complete within 60 s".into());
            }
        }
        done.result()?;
    }
    Ok(())
}

/// The test: 1000 writes with immediate data of varying length
/// (1 byte to 64 KiB + 900 bytes, many over a receive segment and the path
/// MTU) from one iface to another, then a zero-length one: each immediate
/// arrives once, in order, with its length, and its data is in place when
/// the handler runs.
pub fn thousand_immediates_in_order_after_their_data() -> Result<(), Failed> {
    const N: usize = 1000;
    let (mut a, mut b, mut ea, _eb) = two_ifaces()?;
    let lens: Vec<usize> = (0..N)
        .map(|i| match i % 100 {
            0 => 65536 + i,
            _ => (i * 37) % 8192 + 1,
        })
        .collect();
    let mut offsets = Vec::with_capacity(N);
    let mut total = 0;
    for &len in &lens {
        offsets.push(total);
        total += len;
    }
    let pattern = |i: usize| (i % 251) as u8 + 1;
    let source = a.buffer(total)?;
    for i in 0..N {
        source.write(offsets[i], &vec![pattern(i); lens[i]])?;
    }
    let target = b.buffer(total)?;
    let rkey = b.rkey(&target)?;
    let slots = (0..N).map(|i| (offsets[i], pattern(i))).collect();
    let seen = install(&mut b, &target, slots)?;

    for i in 0..N {
        let iov = [Iov::new(&source, offsets[i], lens[i])];
        let remote = (target.addr() + offsets[i] as u64, &rkey);
        post_imm(ea.as_mut(), (&mut a, &mut b), &iov, remote, i as u32)?;
        a.iface.progress();
        b.iface.progress();
    }
    let zero_imm = 0xdead_beef;
    post_imm(
        ea.as_mut(),
        (&mut a, &mut b),
        &[],
        (target.addr(), &rkey),
        zero_imm,
    )?;
    flush(ea.as_mut(), &mut a, &mut b)?;
    // The flush says the writes were acknowledged; their receive
    // completions follow on b's queue.
    b.progress_until("every immediate", Duration::from_secs(30), |_| {
        seen_len(&seen) > N
    })?;
    b.idle(Duration::from_millis(200));

    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let want: Vec<ImmEvent> = (0..N)
        .map(|i| ImmEvent {
            imm: i as u32,
            len: lens[i],
        })
        .chain([ImmEvent {
            imm: zero_imm,
            len: 0,
        }])
        .collect();
    if let Some(miss) = seen.not_in_place.first() {
        return Err(format!(
            "{} writes were not in place at their immediate; first: {miss}",
            seen.not_in_place.len()
        )
        .into());
    }
    if seen.events != want {
        let first = (0..want.len().max(seen.events.len()))
            .find(|&k| seen.events.get(k) != want.get(k))
            .unwrap_or(0);
        return Err(format!(
            "{} immediates, expected {}; first difference at {first}: got {:?}, expected {:?}",
            seen.events.len(),
            want.len(),
            seen.events.get(first),
            want.get(first)
        )
        .into());
    }
    if target.to_vec()?[offsets[N - 1]..] != vec![pattern(N - 1); lens[N - 1]][..] {
        return Err("the last write's bytes are not all in place".into());
    }
    println!(
        "peer_vm: {N} writes with immediate ({total} bytes) and a zero-length one: each immediate once, in order, after its data"
    );
    Ok(())
}

/// Immediates that arrive with no handler are dropped (one warning), and
/// their receive segments go back to the NIC: more of them than the
/// receive queue holds still complete, and a handler installed later gets
/// the next one. The endpoints stay healthy.
pub fn immediates_with_no_handler_are_dropped() -> Result<(), Failed> {
    let (mut a, mut b, mut ea, mut eb) = two_ifaces()?;
    let target = b.buffer(4096)?;
    let rkey = b.rkey(&target)?;
    let source = a.buffer(64)?;
    // UCT_RC_RX_QUEUE_LEN is 64 by default: twice that many.
    for imm in 0..128 {
        let iov = [Iov::new(&source, 0, 64)];
        let remote = (target.addr(), &rkey);
        post_imm(ea.as_mut(), (&mut a, &mut b), &iov, remote, imm)?;
    }
    flush(ea.as_mut(), &mut a, &mut b)?;
    b.idle(Duration::from_millis(100));
    let seen = install(&mut b, &target, Vec::new())?;
    post_imm(
        ea.as_mut(),
        (&mut a, &mut b),
        &[],
        (target.addr(), &rkey),
        4242,
    )?;
    b.progress_until(
        "the immediate after the handler",
        Duration::from_secs(10),
        |_| seen_len(&seen) >= 1,
    )?;
    let events = seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .events
        .clone();
    if events != [ImmEvent { imm: 4242, len: 0 }] {
        return Err(format!("after 128 dropped immediates the handler saw {events:?}").into());
    }
    ea.check()?;
    eb.check()?;
    Ok(())
}

/// A raw queue pair writes with immediate data of lengths our own sender
/// would also use and some it would not expect (zero, over a receive
/// segment, one byte): each arrives with the length the NIC reports, the
/// data in place, and the endpoint stays healthy.
pub fn hostile_writes_with_immediate_are_delivered_safely() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let mut ep = rc.ep()?;
    let hostile = Hostile::connect(&rc, ep.as_mut(), 64 << 10)?;
    let target = rc.buffer(128 << 10)?;
    let rkey = rc.rkey(&target)?;
    let raw = rkey.downcast::<IbRkey>("ib")?.rkey;
    let lens = [0usize, 3 * 8192 + 1, 1, 64 << 10];
    // Disjoint ranges of the zeroed target; each write carries the
    // hostile's pattern.
    let offsets = [0usize, 0, 30_000, 64 << 10];
    let slots = offsets.iter().map(|&o| (o, crate::rig::PATTERN)).collect();
    let seen = install(&mut rc, &target, slots)?;
    for (imm, (&len, &offset)) in lens.iter().zip(&offsets).enumerate() {
        hostile.write_imm(target.addr() + offset as u64, raw, len, imm as u32)?;
    }
    rc.progress_until("the hostile's immediates", Duration::from_secs(10), |_| {
        seen_len(&seen) >= lens.len()
    })?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let want: Vec<ImmEvent> = lens
        .iter()
        .enumerate()
        .map(|(imm, &len)| ImmEvent {
            imm: imm as u32,
            len,
        })
        .collect();
    if seen.events != want || !seen.not_in_place.is_empty() {
        return Err(format!(
            "from a raw QP: got {:?} ({:?}), expected {want:?}",
            seen.events, seen.not_in_place
        )
        .into());
    }
    ep.check()?;
    Ok(())
}
