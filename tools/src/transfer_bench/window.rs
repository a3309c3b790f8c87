//! The windowed loops of `-O N` (N > 1): N notified writes in flight,
//! timed as a whole (elapsed time / writes).
//!
//! - One process (`loopback`): the measuring thread keeps N writes
//!   posted; before each new post it retires the oldest (the receiver's
//!   `wait_for_write` for it, its check when validating, its future).
//! - Two processes (`client`, `serve`): the client posts a write
//!   whenever fewer than N of its futures are pending; the receiver waits
//!   for every notification and answers the last one with a zero-length
//!   notified write; the time runs from the first post to that answer,
//!   less half the median of [`ZERO_RTTS`] zero-length round trips.
//!
//! Without validation every write goes to one place (as perftest's
//! put_bw); with it each write in flight has its slot, refilled only once
//! the receiver checked it (in two processes the receiver answers every
//! write). In one process filling and checking are taken off the time; in
//! two, the receiver's checks overlap the sender's next writes and stay in
//! it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use uct_transfer::{Memory, OpFuture, RemoteBuffer, Transport, View};

use super::drive::{process_cpu, Driver};
use super::error::{BenchError, Result};
use super::run::{
    check, expect, fill, median, round_trip, summary, Checks, Client, Ctl, Loopback, Measurement,
    Server, Timer,
};

/// The places of a windowed run's writes: with validation one slot per
/// write in flight (a slot is refilled only once its last write was
/// checked), else one slot that every write uses (as perftest's put_bw).
struct Slots {
    size: usize,
    views: Vec<View>,
    remotes: Vec<RemoteBuffer>,
}

impl Slots {
    fn new(src: &Memory, remote: &RemoteBuffer, size: usize, n: usize) -> Result<Slots> {
        let mut slots = Slots {
            size,
            views: Vec::with_capacity(n),
            remotes: Vec::with_capacity(n),
        };
        for i in 0..n.max(1) {
            slots.views.push(src.view(i * size, size)?);
            slots.remotes.push(remote.slice(i * size, size)?);
        }
        Ok(slots)
    }

    /// Iteration `it`'s slot: its index and its byte offset.
    fn of(&self, it: u64) -> (usize, usize) {
        let i = (it % self.views.len() as u64) as usize;
        (i, i * self.size)
    }
}

/// Time spent on validation inside a timed loop, taken off its result.
#[derive(Default)]
struct Untimed {
    real: Duration,
    cpu: Duration,
}

impl Untimed {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (t, c) = (Instant::now(), process_cpu());
        let v = f();
        self.real += t.elapsed();
        self.cpu += process_cpu().saturating_sub(c);
        v
    }

    fn take_off(&self, m: &mut Measurement) {
        m.real = m.real.saturating_sub(self.real);
        m.cpu = m.cpu.saturating_sub(self.cpu);
    }
}

/// `iters` notified writes of `size` bytes in one process, `-O` of them in
/// flight: before each post past the first `-O`, the oldest write is
/// retired (the receiver's wait for its notification, its check when
/// validating, then its own future). The time is the whole loop's, less
/// the validation's filling and checking.
pub(super) fn loopback(
    lb: &Loopback,
    driver: &Driver<'_>,
    size: usize,
    iters: u64,
    first: u64,
    checks: &Checks,
) -> Result<Measurement> {
    let depth = lb.outstanding;
    let slots = Slots::new(
        &lb.src,
        &lb.remote,
        size,
        if checks.validate { depth } else { 1 },
    )?;
    let mut buf = Vec::new();
    let mut untimed = Untimed::default();
    let mut pending = VecDeque::with_capacity(depth);
    let retire = |it: u64, wrote, untimed: &mut Untimed, buf: &mut Vec<u8>| -> Result<()> {
        let note = driver.wait("the receiver's notification", lb.rx.wait_for_write())??;
        expect(note, size, it as u32, "the")?;
        if checks.validate {
            let at = slots.of(it).1;
            if let Some(detail) = untimed.time(|| check(&lb.dst, at, size, it, buf))? {
                return Err(BenchError::Validation {
                    size,
                    iter: it,
                    detail,
                });
            }
        }
        driver.wait("the write's completion", wrote)??;
        Ok(())
    };
    let timer = Timer::new(false);
    for it in first..first + iters {
        if pending.len() == depth {
            if let Some((old, wrote)) = pending.pop_front() {
                retire(old, wrote, &mut untimed, &mut buf)?;
            }
        }
        let (slot, at) = slots.of(it);
        if checks.validate {
            untimed.time(|| fill(&lb.src, at, size, it, checks, &mut buf))?;
        }
        let wrote = lb
            .tx
            .write_tagged(&slots.views[slot], &slots.remotes[slot], it as u32);
        pending.push_back((it, wrote));
    }
    while let Some((old, wrote)) = pending.pop_front() {
        retire(old, wrote, &mut untimed, &mut buf)?;
    }
    let mut m = timer.finish(size, iters);
    untimed.take_off(&mut m);
    Ok(m)
}

/// Zero-length round trips after a windowed phase: half their median is
/// the way back of the receiver's answer to the phase's last write.
pub const ZERO_RTTS: u64 = 15;

/// The tag of a windowed phase's `k`th zero-length round trip.
pub(super) fn zero_tag(k: u64) -> u32 {
    u32::MAX - k as u32
}

/// `iters` notified writes of `size` bytes with `-O` of them in flight: a
/// write is posted whenever fewer than `-O` are pending, a write stops
/// pending once its future resolved (and, when validating, once the
/// receiver answered it: it checked the write's slot, which may then be
/// refilled). The receiver waits for every notification and answers the
/// last one (every one when validating) with a zero-length notified write.
/// The time runs from the first post to that answer, less the receiver's
/// checks and the sender's filling, less half the median of [`ZERO_RTTS`]
/// zero-length round trips made right after.
pub(super) fn client(
    t: &Transport,
    c: &mut Client,
    driver: &Driver<'_>,
    size: usize,
    iters: u64,
    first: u64,
    checks: &Checks,
) -> Result<Measurement> {
    let depth = c.outstanding;
    let validate = checks.validate;
    let slots = Slots::new(&c.src, &c.remote, size, if validate { depth } else { 1 })?;
    let (zero, zero_remote) = (c.src.view(0, 0)?, c.remote.slice(0, 0)?);
    c.ch.send_msg(&Ctl::Phase {
        size: size as u64,
        iters,
        first,
        outstanding: depth as u64,
    })?;
    let answered = |it: u64| -> Result<()> {
        let answer = driver.wait("the receiver's answer", t.wait_for_write())??;
        expect(answer, 0, it as u32, "the receiver's answer:")
    };
    let retire = |it: u64, wrote| -> Result<()> {
        driver.wait("the write's completion", wrote)??;
        if validate {
            answered(it)?;
        }
        Ok(())
    };
    let mut buf = Vec::new();
    let mut untimed = Untimed::default();
    let mut pending = VecDeque::with_capacity(depth);
    let timer = Timer::new(false);
    for it in first..first + iters {
        if pending.len() == depth {
            if let Some((old, wrote)) = pending.pop_front() {
                retire(old, wrote)?;
            }
        }
        let (slot, at) = slots.of(it);
        if validate {
            untimed.time(|| fill(&c.src, at, size, it, checks, &mut buf))?;
        }
        let wrote = t.write_tagged(&slots.views[slot], &slots.remotes[slot], it as u32);
        pending.push_back((it, wrote));
    }
    while let Some((old, wrote)) = pending.pop_front() {
        retire(old, wrote)?;
    }
    if !validate && iters > 0 {
        answered(first + iters - 1)?;
    }
    let mut m = timer.finish(size, iters);
    untimed.take_off(&mut m);
    let mut rtts = Vec::with_capacity(ZERO_RTTS as usize);
    for k in 0..ZERO_RTTS {
        let z = Instant::now();
        round_trip(t, driver, &zero, &zero_remote, zero_tag(k))?;
        rtts.push(z.elapsed());
    }
    let back = median(&mut rtts) / 2;
    summary(c, driver, m, back)
}

/// The receiver of a windowed phase: waits for every notification (and
/// checks its slot when validating), answers the last one (every one when
/// validating) with a zero-length notified write, then answers the
/// client's [`ZERO_RTTS`] zero-length writes.
// One argument more than run::serve_phase's: the slots of a validated window.
#[allow(clippy::too_many_arguments)]
pub(super) fn serve(
    t: &Transport,
    s: &mut Server,
    driver: &Driver<'_>,
    size: usize,
    iters: u64,
    first: u64,
    slots: usize,
    validate: bool,
) -> Result<Ctl> {
    let zero = s.zero.view(0, 0)?;
    let answers = s.answers.slice(0, 0)?;
    let mut bad = None;
    let mut buf = Vec::new();
    let mut answered = None;
    let answer = |tag: u32, answered: &mut Option<OpFuture>| -> Result<()> {
        // The previous answer completed while this write came in.
        if let Some(prev) = answered.take() {
            driver.wait("an answer's completion", prev)??;
        }
        *answered = Some(t.write_tagged(&zero, &answers, tag));
        Ok(())
    };
    let last = first + iters;
    for it in first..last {
        let note = driver.wait("the client's next write", t.wait_for_write())??;
        if bad.is_none() {
            if let Err(e) = expect(note, size, it as u32, "the client's") {
                bad = Some((it, e.to_string()));
            }
        }
        if validate && bad.is_none() {
            let at = (it % slots as u64) as usize * size;
            if let Some(why) = check(&s.dst, at, size, it, &mut buf)? {
                bad = Some((it, why));
            }
        }
        if validate || it + 1 == last {
            answer(note.tag, &mut answered)?;
        }
    }
    for k in 0..ZERO_RTTS {
        let note = driver.wait("the client's next write", t.wait_for_write())??;
        if bad.is_none() {
            if let Err(e) = expect(note, 0, zero_tag(k), "the client's") {
                bad = Some((last, e.to_string()));
            }
        }
        answer(note.tag, &mut answered)?;
    }
    if let Some(prev) = answered {
        driver.wait("an answer's completion", prev)??;
    }
    // With writes in flight the checks overlap the sender's next writes:
    // they stay in the time (taking their sum off made it zero).
    Ok(Ctl::Done { bad, check_ns: 0 })
}
