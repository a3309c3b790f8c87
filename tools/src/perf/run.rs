//! The measurement loops. The client drives and times; the server answers
//! ping-pongs, keeps its iface progressing, checks data when asked, and
//! confirms the end of every phase, so that bandwidth is counted only when
//! the receiver has the data.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uct_core::{AtomicValue, Caps, Completion, CompletionData, Endpoint, FetchOp, Iov, Status};

use super::clock::Clock;
use super::error::{PerfError, Result};
use super::params::{Layout, Op, TestKind};
use super::session::{Role, Session, AM_ID};

/// The process's calibrated clock.
fn clock() -> Clock {
    static CLOCK: std::sync::OnceLock<Clock> = std::sync::OnceLock::new();
    *CLOCK.get_or_init(Clock::new)
}

/// What one measured phase produced (client side).
#[derive(Debug, Clone)]
pub struct Measurement {
    pub size: usize,
    pub iters: u64,
    /// Per-iteration times in nanoseconds: one-way latency for ping-pong
    /// tests, operation latency for the other latency tests, posting
    /// overhead for bandwidth tests.
    pub samples: Vec<f64>,
    /// From the first post to the receiver's confirmation.
    pub total: Duration,
}

/// Messages between the phases' ends, over the bootstrap channel.
#[derive(Debug, Serialize, Deserialize)]
enum Ctl {
    /// Validation: check the receive buffer against iteration `iter`'s
    /// pattern.
    Check { iter: u64 },
    /// Validation: fill the receive buffer with iteration `iter`'s pattern.
    Fill { iter: u64 },
    /// The client is done; the server waits for this many active messages
    /// and confirms.
    Done { am_expected: u64 },
    /// Answer: Ok, or the first bad iteration and what was wrong.
    Ack { bad: Option<(u64, String)> },
}

/// The bytes of iteration `iter` for a message of `size` bytes.
pub fn pattern_into(buf: &mut [u8], iter: u64) {
    let mut x = (iter.wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ buf.len() as u64;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Why `data` is not iteration `iter`'s pattern of `size` bytes, if not.
pub fn check_pattern(data: &[u8], size: usize, iter: u64) -> Option<String> {
    if data.len() != size {
        return Some(format!("{} bytes arrived, {size} were sent", data.len()));
    }
    let mut want = vec![0u8; size];
    pattern_into(&mut want, iter);
    data.iter()
        .zip(&want)
        .position(|(a, b)| a != b)
        .map(|at| format!("byte {at} is {:#04x}, expected {:#04x}", data[at], want[at]))
}

/// The layout used for `size`: the one asked for, or the cheapest the
/// transport offers; an error says what would work.
pub fn layout_for(s: &Session, size: usize) -> Result<Layout> {
    let a = s.iface.attrs();
    let test = s.params.test;
    let tl = &s.params.transport;
    if test.op() == Op::Atomic {
        return Ok(Layout::Short);
    }
    let (lim, short, bcopy, zcopy) = match test.op() {
        Op::Put => (a.put, Caps::PUT_SHORT, Caps::PUT_BCOPY, Caps::PUT_ZCOPY),
        Op::Get => (a.get, Caps::GET_SHORT, Caps::GET_BCOPY, Caps::GET_ZCOPY),
        _ => (a.am, Caps::AM_SHORT, Caps::AM_BCOPY, Caps::AM_ZCOPY),
    };
    let offered: Vec<(Layout, Caps, usize)> = vec![
        (Layout::Short, short, lim.max_short),
        (Layout::Bcopy, bcopy, lim.max_bcopy),
        (Layout::Zcopy, zcopy, lim.max_zcopy),
    ]
    .into_iter()
    .filter(|(_, c, _)| a.caps.contains(*c))
    .collect();
    let what_works = || {
        offered
            .iter()
            .map(|(l, _, m)| format!("-D {} up to {}", l.name(), crate::text::size(*m as u64)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if offered.is_empty() {
        let what = match test.op() {
            Op::Put => "puts",
            Op::Get => "gets",
            _ => "active messages",
        };
        return Err(PerfError::Usage(format!(
            "{tl} cannot run {}: it has no {what}; `transport-info -d` shows what each transport offers (posix has them all)",
            test.name()
        )));
    }
    match s.params.layout {
        Some(l) => match offered.iter().find(|(o, _, _)| *o == l) {
            Some((_, _, max)) if size <= *max => Ok(l),
            Some((_, _, max)) => Err(PerfError::Usage(format!(
                "{} {} carries at most {} bytes on {tl}, not {size}; use {}",
                test.name(),
                l.name(),
                max,
                what_works()
            ))),
            None => Err(PerfError::Usage(format!(
                "{tl} has no {} {}; use {}",
                l.name(),
                test.name(),
                what_works()
            ))),
        },
        None => offered
            .iter()
            .find(|(_, _, max)| size <= *max)
            .map(|(l, _, _)| *l)
            .ok_or_else(|| {
                PerfError::Usage(format!(
                    "{size} bytes is more than {tl} carries in one {}; use sizes up to {}",
                    test.name(),
                    crate::text::size(offered.iter().map(|(_, _, m)| *m).max().unwrap_or(0) as u64)
                ))
            }),
    }
}

/// Checks that every size can run, before anything is measured.
pub fn check_sizes(s: &Session) -> Result<()> {
    let t = s.params.test;
    for &size in &s.params.sizes {
        if t.is_atomic() && size != 8 {
            return Err(PerfError::Usage(format!(
                "{} works on 8-byte words; use -s 8",
                t.name()
            )));
        }
        if matches!(t, TestKind::PutLat | TestKind::AmLat) && size < 8 {
            return Err(PerfError::Usage(format!(
                "{} needs at least 8 bytes to carry its sequence number; use -s 8 or more",
                t.name()
            )));
        }
        if t.is_atomic() && !s.iface.attrs().caps.contains(Caps::ATOMIC64) {
            return Err(PerfError::Usage(format!(
                "{} has no 64-bit atomics; use posix, tcp or rc",
                s.params.transport
            )));
        }
        layout_for(s, size)?;
    }
    Ok(())
}

fn read_u64(s: &Session, off: usize) -> u64 {
    match s.recv.host_ptr(off, 8) {
        // SAFETY: a checked 8-byte range of live host memory the peer
        // writes; read as bytes, so alignment does not matter.
        Ok(p) => u64::from_le_bytes(unsafe { std::ptr::read_volatile(p as *const [u8; 8]) }),
        Err(_) => 0,
    }
}

/// The first `len` bytes of a session buffer.
fn buf(m: &uct_core::MemHandle, len: usize) -> &[u8] {
    match m.host_ptr(0, len) {
        // SAFETY: a checked range of a live host buffer owned by the
        // session; the peer may write it, as with any RDMA buffer.
        Ok(p) => unsafe { std::slice::from_raw_parts(p, len) },
        Err(_) => &[],
    }
}

/// Runs `f` on the first `len` bytes of a session buffer.
fn with_mut<R>(m: &uct_core::MemHandle, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    match m.host_ptr(0, len) {
        // SAFETY: a checked range of a host buffer owned by the session;
        // only this thread writes it, and the slice lives only during `f`.
        Ok(p) => f(unsafe { std::slice::from_raw_parts_mut(p, len) }),
        Err(_) => f(&mut []),
    }
}

/// Progresses until `done`, failing after a generous bound.
fn spin(s: &mut Session, what: &str, mut done: impl FnMut(&Session) -> bool) -> Result<()> {
    let mut n = 0u32;
    let mut t0: Option<Instant> = None;
    while !done(s) {
        s.iface.progress();
        n = n.wrapping_add(1);
        if n.is_multiple_of(4096) {
            let start = *t0.get_or_insert_with(Instant::now);
            if start.elapsed() > Duration::from_secs(60) {
                return Err(PerfError::Protocol(format!(
                    "no progress for 60 s waiting for {what}; is the peer alive?"
                )));
            }
        }
    }
    Ok(())
}

/// Posts with `op` until it is accepted.
fn post(
    s: &mut Session,
    mut op: impl FnMut(&mut dyn Endpoint) -> uct_core::Result<Status>,
) -> Result<Status> {
    loop {
        match op(s.ep.as_mut())? {
            Status::NoResource => {
                s.iface.progress();
            }
            st => return Ok(st),
        }
    }
}

fn wait(s: &mut Session, comp: &Completion, what: &str) -> Result<()> {
    let c = comp.clone();
    spin(s, what, |_| c.is_complete())?;
    comp.result().map_err(PerfError::from)
}

fn flush(s: &mut Session) -> Result<()> {
    let c = Completion::new();
    if post(s, |ep| ep.flush(Some(&c)))? == Status::InProgress {
        wait(s, &c, "flush")?;
    }
    Ok(())
}

/// One put, get or AM of `size` bytes with `layout`, from/to the send
/// buffer and the peer's receive buffer.
/// Done or InProgress (the completion, if given, fires later).
fn post_data(
    s: &mut Session,
    layout: Layout,
    size: usize,
    comp: Option<&Completion>,
) -> Result<()> {
    let test = s.params.test;
    // Borrow the fields apart: no handle clones on the hot path.
    let Session {
        ep,
        iface,
        send,
        peer_rkey: rkey,
        peer_addr: addr,
        ..
    } = s;
    let addr = *addr;
    let data = buf(send, size);
    loop {
        let r = match (test.op(), layout) {
            (Op::Put, Layout::Short) => ep.put_short(data, addr, rkey),
            (Op::Put, Layout::Bcopy) => ep.put_bcopy(data, addr, rkey),
            (Op::Put, Layout::Zcopy) => ep.put_zcopy(&[Iov::new(send, 0, size)], addr, rkey, comp),
            // The first 8 bytes travel as the header.
            (Op::Am, Layout::Short) => {
                let mut h = [0u8; 8];
                h[..size.min(8)].copy_from_slice(&data[..size.min(8)]);
                ep.am_short(AM_ID, u64::from_le_bytes(h), &data[8.min(size)..])
            }
            (Op::Am, Layout::Bcopy) => ep.am_bcopy(AM_ID, data),
            (Op::Am, Layout::Zcopy) => ep.am_zcopy(AM_ID, &[], &[Iov::new(send, 0, size)], comp),
            _ => {
                return Err(PerfError::Protocol(
                    "post_data is for puts and active messages".into(),
                ))
            }
        }?;
        if r != Status::NoResource {
            return Ok(());
        }
        iface.progress();
    }
}

/// One get of `size` bytes into the send buffer.
fn post_get(s: &mut Session, layout: Layout, size: usize, comp: &Completion) -> Result<Status> {
    let addr = s.peer_addr;
    let send = s.send.clone();
    loop {
        let rkey = &s.peer_rkey;
        let r = match layout {
            Layout::Short => {
                let ep = s.ep.as_mut();
                with_mut(&send, size, |b| ep.get_short(b, addr, rkey))
            }
            Layout::Bcopy => s.ep.get_bcopy(size, addr, rkey, comp),
            Layout::Zcopy => {
                s.ep.get_zcopy(&[Iov::new(&send, 0, size)], addr, rkey, Some(comp))
            }
        }?;
        if r != Status::NoResource {
            return Ok(r);
        }
        s.iface.progress();
    }
}

/// Whether validation reaches `mem` through the staging endpoint.
fn is_staged(s: &Session, mem: &uct_core::MemHandle) -> bool {
    s.stage.is_some() && (s.params.stage_validation || !mem.mem_type().is_host_accessible())
}

/// The first `len` bytes of the receive (or send) buffer, for validation.
fn read_buf(s: &mut Session, recv: bool, len: usize) -> Result<Vec<u8>> {
    let mem = if recv { s.recv.clone() } else { s.send.clone() };
    if is_staged(s, &mem) {
        if let Some(st) = s.stage.as_mut() {
            return st.read(s.iface.as_mut(), &mem, len);
        }
    }
    Ok(buf(&mem, len).to_vec())
}

/// Writes the first `len` bytes of the receive (or send) buffer.
fn write_buf(s: &mut Session, recv: bool, len: usize, f: impl FnOnce(&mut [u8])) -> Result<()> {
    let mem = if recv { s.recv.clone() } else { s.send.clone() };
    if is_staged(s, &mem) {
        if let Some(st) = s.stage.as_mut() {
            return st.write(s.iface.as_mut(), &mem, len, f);
        }
    }
    with_mut(&mem, len, f);
    Ok(())
}

/// Fills the send buffer for iteration `iter` (validation only).
fn fill_send(s: &mut Session, size: usize, iter: u64) -> Result<()> {
    let corrupt = s.params.inject_corruption == Some(iter);
    write_buf(s, false, size, |buf| {
        pattern_into(buf, iter);
        if corrupt && !buf.is_empty() {
            // Testing aid: this transfer is corrupted on purpose.
            buf[size / 2] ^= 0x5a;
        }
    })
}

fn ctl(s: &mut Session, msg: &Ctl) -> Result<Option<(u64, String)>> {
    s.ch.send_msg(msg)?;
    match s.ch.recv_msg::<Ctl>()? {
        Ctl::Ack { bad } => Ok(bad),
        other => Err(PerfError::Protocol(format!(
            "expected an acknowledgement, got {other:?}"
        ))),
    }
}

fn fail(s: &Session, size: usize, (iter, detail): (u64, String)) -> PerfError {
    PerfError::Validation {
        test: s.params.test.name(),
        size,
        iter,
        detail,
    }
}

/// Resets what a phase counts, on both sides.
fn prepare(s: &mut Session, size: usize) -> Result<()> {
    s.am.count.store(0, Ordering::Release);
    s.am.size.store(size as u64, Ordering::Relaxed);
    s.am.validate.store(s.params.validate, Ordering::Relaxed);
    *s.am.first_bad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    if !s.recv.mem_type().is_host_accessible() && s.stage.is_none() {
        // Device memory without validation: nothing reads it, nothing to clear.
    } else {
        let len = s.recv.len();
        write_buf(s, true, len, |b| b.fill(0))?;
    }
    s.ch.barrier()?;
    Ok(())
}

/// Runs one phase of `iters` iterations at `size`; the client gets the
/// measurement.
pub fn phase(s: &mut Session, size: usize, iters: u64) -> Result<Option<Measurement>> {
    prepare(s, size)?;
    let layout = layout_for(s, size)?;
    match s.role {
        Role::Client => client(s, size, iters, layout).map(Some),
        Role::Server => server(s, size, iters, layout).map(|_| None),
    }
}

/// Where the ping-pong sequence number lives in the receive buffer.
fn seq_offset(test: TestKind, size: usize) -> usize {
    if test == TestKind::AddLat {
        0
    } else {
        size - 8
    }
}

/// Sends ping-pong message `i` (sequence `i + 1`).
fn ping(s: &mut Session, layout: Layout, size: usize, i: u64) -> Result<()> {
    let seq = i + 1;
    match s.params.test {
        TestKind::AddLat => {
            let (addr, rkey) = (s.peer_addr, &s.peer_rkey);
            let ep = s.ep.as_mut();
            loop {
                if ep.atomic_add(AtomicValue::U64(1), addr, rkey)? != Status::NoResource {
                    break;
                }
                s.iface.progress();
            }
        }
        TestKind::PutLat => {
            if s.params.validate {
                fill_send(s, size - 8, i)?;
            }
            let p = s.send.host_ptr(size - 8, 8)?;
            // SAFETY: a checked 8-byte range of the send buffer, which only
            // this thread writes.
            unsafe { std::ptr::copy_nonoverlapping(seq.to_le_bytes().as_ptr(), p, 8) };
            post_data(s, layout, size, None)?;
        }
        _ => {
            if s.params.validate {
                fill_send(s, size, i)?;
            } else {
                s.send.write(0, &seq.to_le_bytes())?;
            }
            post_data(s, layout, size, None)?;
        }
    }
    Ok(())
}

/// Waits for ping-pong message `i` to arrive here.
fn pong_arrived(s: &mut Session, size: usize, i: u64) -> Result<()> {
    let seq = i + 1;
    let test = s.params.test;
    let off = seq_offset(test, size);
    match test {
        TestKind::AmLat => spin(s, "an active message", |s| {
            s.am.count.load(Ordering::Acquire) >= seq
        })?,
        _ => {
            // The word the peer writes, located once: the wait loop is one
            // load and one progress call.
            let p = s.recv.host_ptr(off, 8)? as *const [u8; 8];
            // SAFETY: a checked 8-byte range of the live receive buffer,
            // which the peer writes; read as bytes, so alignment does not
            // matter.
            let arrived = move || u64::from_le_bytes(unsafe { std::ptr::read_volatile(p) }) >= seq;
            spin(s, "the peer's write", |_| arrived())?
        }
    }
    if test == TestKind::PutLat && s.params.validate {
        let got = buf(&s.recv, size - 8).to_vec();
        if let Some(why) = check_pattern(&got, size - 8, i) {
            s.am.first_bad
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert((i, why));
        }
    }
    Ok(())
}

fn client(s: &mut Session, size: usize, iters: u64, layout: Layout) -> Result<Measurement> {
    let test = s.params.test;
    let mut samples = Vec::with_capacity(iters as usize);
    let validate = s.params.validate;
    let outstanding = s.params.outstanding.max(1);
    let mut am_expected = 0;
    let clk = clock();
    let start = Instant::now();
    match test {
        TestKind::PutLat | TestKind::AmLat | TestKind::AddLat => {
            for i in 0..iters {
                let t0 = clk.now();
                ping(s, layout, size, i)?;
                pong_arrived(s, size, i)?;
                samples.push(clk.ns(clk.now().wrapping_sub(t0)) / 2.0);
            }
        }
        TestKind::PutBw | TestKind::AmBw => {
            let comp = Completion::new();
            let mut last = clk.now();
            for i in 0..iters {
                if validate {
                    fill_send(s, size, i)?;
                }
                post_data(s, layout, size, Some(&comp))?;
                if validate {
                    wait(s, &comp, "the transfer")?;
                    flush(s)?;
                    if test == TestKind::PutBw {
                        if let Some(bad) = ctl(s, &Ctl::Check { iter: i })? {
                            return Err(fail(s, size, bad));
                        }
                    }
                }
                while comp.pending() >= outstanding {
                    s.iface.progress();
                }
                let now = clk.now();
                samples.push(clk.ns(now.wrapping_sub(last)));
                last = now;
            }
            wait(s, &comp, "the last transfers")?;
            comp.result()?;
            flush(s)?;
            if test == TestKind::AmBw {
                am_expected = iters;
            }
        }
        TestKind::GetLat | TestKind::GetBw => {
            let comp = Completion::new();
            let mut last = clk.now();
            for i in 0..iters {
                if validate {
                    if let Some(bad) = ctl(s, &Ctl::Fill { iter: i })? {
                        return Err(fail(s, size, bad));
                    }
                }
                let t0 = clk.now();
                let st = post_get(s, layout, size, &comp)?;
                if test == TestKind::GetLat || validate {
                    if st == Status::InProgress {
                        wait(s, &comp, "a get")?;
                    }
                    if test == TestKind::GetLat {
                        samples.push(clk.ns(clk.now().wrapping_sub(t0)));
                    }
                    if validate {
                        let mut got = match (layout, comp.take_data()) {
                            (Layout::Bcopy, Some(CompletionData::Bytes(b))) => b,
                            _ => read_buf(s, false, size)?,
                        };
                        if s.params.inject_corruption == Some(i) && !got.is_empty() {
                            got[size / 2] ^= 0x5a;
                        }
                        if let Some(why) = check_pattern(&got, size, i) {
                            return Err(fail(s, size, (i, why)));
                        }
                    }
                } else {
                    while comp.pending() >= outstanding {
                        s.iface.progress();
                    }
                }
                if test == TestKind::GetBw {
                    let now = clk.now();
                    samples.push(clk.ns(now.wrapping_sub(last)));
                    last = now;
                }
                // bcopy data is not needed in bandwidth runs.
                if layout == Layout::Bcopy && !validate {
                    comp.take_data();
                }
            }
            wait(s, &comp, "the last gets")?;
        }
        TestKind::FaddLat | TestKind::CswapLat => {
            let (addr, comp) = (s.peer_addr, Completion::new());
            for i in 0..iters {
                let op = if test == TestKind::FaddLat {
                    FetchOp::Add(AtomicValue::U64(1))
                } else {
                    FetchOp::CompareSwap {
                        compare: AtomicValue::U64(i),
                        swap: AtomicValue::U64(i + 1),
                    }
                };
                let t0 = clk.now();
                let st = loop {
                    let st = s.ep.atomic_fetch(op, addr, &s.peer_rkey, &comp)?;
                    if st != Status::NoResource {
                        break st;
                    }
                    s.iface.progress();
                };
                if st == Status::InProgress {
                    wait(s, &comp, "an atomic")?;
                }
                samples.push(clk.ns(clk.now().wrapping_sub(t0)));
                let old = comp.value().unwrap_or(u64::MAX);
                if validate && old != i {
                    return Err(fail(
                        s,
                        size,
                        (i, format!("the old value was {old}, expected {i}")),
                    ));
                }
            }
        }
        TestKind::AddMr => {
            let addr = s.peer_addr;
            let mut last = clk.now();
            for _ in 0..iters {
                loop {
                    if s.ep.atomic_add(AtomicValue::U64(1), addr, &s.peer_rkey)?
                        != Status::NoResource
                    {
                        break;
                    }
                    s.iface.progress();
                }
                let now = clk.now();
                samples.push(clk.ns(now.wrapping_sub(last)));
                last = now;
            }
            flush(s)?;
        }
    }
    // The receiver confirms; only then does the clock stop.
    let bad = ctl(s, &Ctl::Done { am_expected })?;
    let total = start.elapsed();
    if let Some(bad) = bad {
        return Err(fail(s, size, bad));
    }
    let mine =
        s.am.first_bad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    if let Some(bad) = mine {
        return Err(fail(s, size, bad));
    }
    Ok(Measurement {
        size,
        iters,
        samples,
        total,
    })
}

fn server(s: &mut Session, size: usize, iters: u64, layout: Layout) -> Result<()> {
    if s.params.test.is_pingpong() {
        for i in 0..iters {
            pong_arrived(s, size, i)?;
            ping(s, layout, size, i)?;
        }
    }
    // Keep progressing, answer checks, until the client is done.
    let mut n = 0u32;
    loop {
        s.iface.progress();
        n = n.wrapping_add(1);
        if !n.is_multiple_of(64) || !s.ch.poll_readable(Duration::ZERO)? {
            continue;
        }
        match s.ch.recv_msg::<Ctl>()? {
            Ctl::Check { iter } => {
                let got = read_buf(s, true, size)?;
                let bad = check_pattern(&got, size, iter).map(|w| (iter, w));
                s.ch.send_msg(&Ctl::Ack { bad })?;
            }
            Ctl::Fill { iter } => {
                write_buf(s, true, size, |b| pattern_into(b, iter))?;
                s.ch.send_msg(&Ctl::Ack { bad: None })?;
            }
            Ctl::Done { am_expected } => {
                if am_expected > 0 {
                    spin(s, "the last active messages", |s| {
                        s.am.count.load(Ordering::Acquire) >= am_expected
                    })?;
                }
                let mut bad =
                    s.am.first_bad
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take();
                if bad.is_none() && s.params.test == TestKind::AddMr {
                    let v = if is_staged(s, &s.recv.clone()) {
                        let b = read_buf(s, true, 8)?;
                        u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))
                    } else {
                        read_u64(s, 0)
                    };
                    if v != iters {
                        bad = Some((iters, format!("the counter is {v} after {iters} adds")));
                    }
                }
                s.ch.send_msg(&Ctl::Ack { bad })?;
                return Ok(());
            }
            other => return Err(PerfError::Protocol(format!("unexpected {other:?}"))),
        }
    }
}
