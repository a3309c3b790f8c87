//! The measured loops: one notified write at a time, each timed from its
//! post to the receiver's notification, or (`-O N`) N writes in flight,
//! timed as a whole.
//!
//! - One process ([`loopback_phase`]): the measuring thread posts the write
//!   and drives both Transports until the receiver's `wait_for_write`
//!   resolves (and the write's own future, so that the view may be reused).
//!   With `-O N` it keeps N writes posted: the oldest is retired (the
//!   receiver's wait for it, then its future) before the next is posted.
//! - Two processes ([`client_phase`], [`serve`]): the receiver answers each
//!   notification with a zero-length notified write; the client times the
//!   round trip and takes the answer's one-way time off it (half the round
//!   trip of a zero-length write, measured interleaved). With `-O N` the
//!   client posts a write whenever fewer than N of its futures are
//!   pending, the receiver waits for every notification and answers the
//!   last one; the time runs from the first post to that answer, less
//!   half a zero-length round trip measured after the phase.
//!
//! With validation the sender fills the view with the iteration's pattern
//! before posting and the receiver checks every byte after the
//! notification; both are outside the timed part (in two processes the
//! receiver measures its checks and the client takes them off).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uct_core::bootstrap::BootstrapChannel;
use uct_transfer::{Memory, Notification, RemoteBuffer, Transport, View};

use super::drive::{process_cpu, Driver};
use super::error::{BenchError, Result};
use super::params::{Plan, MAX_ITERS, MAX_OUTSTANDING};
use super::window;
use crate::perf::pattern::{check_pattern, pattern_into};

/// What one phase of a size produced.
#[derive(Debug, Clone, Copy)]
pub struct Measurement {
    pub size: usize,
    pub iters: u64,
    /// Wall-clock time of the timed parts, all iterations together.
    pub real: Duration,
    /// Process CPU time over the same parts.
    pub cpu: Duration,
}

impl Measurement {
    pub fn real_per_iter(&self) -> Duration {
        self.real / self.iters.max(1) as u32
    }
}

/// Validation settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checks {
    pub validate: bool,
    /// Testing aid: corrupt the bytes of this iteration (counted over the
    /// whole run, warm-up included) so that validation must catch it.
    pub inject: Option<u64>,
}

/// Messages of a two-process run after the set-up, over the bootstrap
/// channel.
#[derive(Debug, Serialize, Deserialize)]
pub enum Ctl {
    /// The client will send `iters` notified writes of `size` bytes,
    /// tagged with the low 32 bits of `first`, `first + 1`, ..., with
    /// `outstanding` in flight (1: each followed by a zero-length one, both
    /// answered; more: the last one answered, or each one when validating,
    /// then [`window::ZERO_RTTS`] zero-length ones, each answered).
    Phase {
        size: u64,
        iters: u64,
        first: u64,
        outstanding: u64,
    },
    /// The server received them all: the first bad one, and how long its
    /// checks took.
    Done {
        bad: Option<(u64, String)>,
        check_ns: u64,
    },
    /// No more phases.
    End,
}

/// A timer of the measured parts of a loop: the whole loop at once when
/// nothing is left out, each iteration otherwise.
pub(super) struct Timer {
    each: bool,
    real: Duration,
    cpu: Duration,
    started: (Instant, Duration),
}

impl Timer {
    pub(super) fn new(each: bool) -> Timer {
        Timer {
            each,
            real: Duration::ZERO,
            cpu: Duration::ZERO,
            started: (Instant::now(), process_cpu()),
        }
    }

    #[inline]
    fn start(&mut self) {
        if self.each {
            self.started = (Instant::now(), process_cpu());
        }
    }

    #[inline]
    fn stop(&mut self) {
        if self.each {
            self.add();
        }
    }

    fn add(&mut self) {
        self.real += self.started.0.elapsed();
        self.cpu += process_cpu().saturating_sub(self.started.1);
    }

    pub(super) fn finish(mut self, size: usize, iters: u64) -> Measurement {
        if !self.each {
            self.add();
        }
        Measurement {
            size,
            iters,
            real: self.real,
            cpu: self.cpu,
        }
    }
}

/// Fills `size` bytes of `src` at `offset` with iteration `it`'s pattern.
pub(super) fn fill(
    src: &Memory,
    offset: usize,
    size: usize,
    it: u64,
    checks: &Checks,
    buf: &mut Vec<u8>,
) -> Result<()> {
    buf.resize(size, 0);
    pattern_into(buf, it);
    if checks.inject == Some(it) && size > 0 {
        buf[size / 2] ^= 0x5a;
    }
    Ok(src.write_bytes(offset, buf)?)
}

/// Why the `size` bytes of `dst` at `offset` are not iteration `it`'s
/// pattern.
pub(super) fn check(
    dst: &Memory,
    offset: usize,
    size: usize,
    it: u64,
    buf: &mut Vec<u8>,
) -> Result<Option<String>> {
    buf.resize(size, 0);
    dst.read_bytes(offset, buf)?;
    Ok(check_pattern(buf, size, it))
}

/// A notification that is not the one expected: the peer is not running
/// the same loop.
pub(super) fn expect(note: Notification, len: usize, tag: u32, whose: &str) -> Result<()> {
    if note.len == len && note.tag == tag {
        return Ok(());
    }
    Err(BenchError::Protocol(format!(
        "{whose} notification carried {} bytes and tag {}, expected {len} bytes and tag {tag}",
        note.len, note.tag
    )))
}

/// The two Transports of a one-process run and their buffers.
pub struct Loopback {
    pub tx: Transport,
    pub rx: Transport,
    pub src: Memory,
    pub dst: Memory,
    /// `dst` as the sender sees it.
    pub remote: RemoteBuffer,
    /// `-O`: writes in flight.
    pub outstanding: usize,
}

/// `iters` notified writes of `size` bytes in one process.
pub fn loopback_phase(
    lb: &Loopback,
    driver: &Driver<'_>,
    size: usize,
    iters: u64,
    first: u64,
    checks: &Checks,
) -> Result<Measurement> {
    if lb.outstanding > 1 {
        return window::loopback(lb, driver, size, iters, first, checks);
    }
    let view = lb.src.view(0, size)?;
    let remote = lb.remote.slice(0, size)?;
    let mut buf = Vec::new();
    let mut timer = Timer::new(checks.validate);
    for it in first..first + iters {
        if checks.validate {
            fill(&lb.src, 0, size, it, checks, &mut buf)?;
        }
        timer.start();
        let tag = it as u32;
        let wrote = lb.tx.write_tagged(&view, &remote, tag);
        let note = driver.wait("the receiver's notification", lb.rx.wait_for_write())??;
        driver.wait("the write's completion", wrote)??;
        timer.stop();
        expect(note, size, tag, "the")?;
        if checks.validate {
            if let Some(detail) = check(&lb.dst, 0, size, it, &mut buf)? {
                return Err(BenchError::Validation {
                    size,
                    iter: it,
                    detail,
                });
            }
        }
    }
    Ok(timer.finish(size, iters))
}

/// The client's side of a two-process run (its Transport apart, which the
/// driver borrows).
pub struct Client {
    pub ch: BootstrapChannel,
    pub src: Memory,
    /// Where the server's answers land (never read: they carry no bytes).
    pub _answers: Memory,
    /// The server's receive buffer.
    pub remote: RemoteBuffer,
    /// `-O`: writes in flight.
    pub outstanding: usize,
}

/// Zero-length round trips kept per phase for their median.
const MAX_RTT_SAMPLES: usize = 1 << 20;

/// The median of `samples` (zero when there are none).
pub(super) fn median(samples: &mut [Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mid = samples.len() / 2;
    *samples.select_nth_unstable(mid).1
}

/// One notified write and the receiver's zero-length answer to it.
pub(super) fn round_trip(
    t: &Transport,
    driver: &Driver<'_>,
    view: &View,
    remote: &RemoteBuffer,
    tag: u32,
) -> Result<()> {
    let wrote = t.write_tagged(view, remote, tag);
    let answer = driver.wait("the receiver's answer", t.wait_for_write())??;
    driver.wait("the write's completion", wrote)??;
    expect(answer, 0, tag, "the receiver's answer:")
}

/// `iters` notified writes of `size` bytes, each answered by the server
/// with a zero-length notified write, and each followed by a zero-length
/// write answered the same way. The measurement is the time from a write's
/// post to its notification: its round trip, less the receiver's checks,
/// less the answer's one-way time, which is half the median zero-length
/// round trip (the same operation both ways), measured interleaved with
/// the writes so that both see the same conditions.
pub fn client_phase(
    t: &Transport,
    c: &mut Client,
    driver: &Driver<'_>,
    size: usize,
    iters: u64,
    first: u64,
    checks: &Checks,
) -> Result<Measurement> {
    if c.outstanding > 1 {
        return window::client(t, c, driver, size, iters, first, checks);
    }
    let view = c.src.view(0, size)?;
    let remote = c.remote.slice(0, size)?;
    let (zero, zero_remote) = (c.src.view(0, 0)?, c.remote.slice(0, 0)?);
    c.ch.send_msg(&Ctl::Phase {
        size: size as u64,
        iters,
        first,
        outstanding: 1,
    })?;
    let mut buf = Vec::new();
    let mut timer = Timer::new(true);
    // The zero-length round trips, up to a bound: their median is the
    // return trip, so that a hiccup while measuring the way back (a
    // preemption) cannot eat the writes' own time.
    let mut zero_rtts = Vec::with_capacity(iters.min(MAX_RTT_SAMPLES as u64) as usize);
    for it in first..first + iters {
        if checks.validate {
            fill(&c.src, 0, size, it, checks, &mut buf)?;
        }
        let tag = it as u32;
        timer.start();
        round_trip(t, driver, &view, &remote, tag)?;
        timer.stop();
        let z = Instant::now();
        round_trip(t, driver, &zero, &zero_remote, !tag)?;
        if zero_rtts.len() < MAX_RTT_SAMPLES {
            zero_rtts.push(z.elapsed());
        }
    }
    let m = timer.finish(size, iters);
    let back = median(&mut zero_rtts) / 2;
    summary(
        c,
        driver,
        m,
        back.saturating_mul(iters.min(u32::MAX as u64) as u32),
    )
}

/// The receiver's summary of a phase: its first bad write, or the
/// measurement less its checks and less `back` (the answers' way back).
pub(super) fn summary(
    c: &mut Client,
    driver: &Driver<'_>,
    mut m: Measurement,
    back: Duration,
) -> Result<Measurement> {
    let size = m.size;
    match recv_ctl(&mut c.ch, driver, "the receiver's summary")? {
        Ctl::Done {
            bad: Some((iter, detail)),
            ..
        } => Err(BenchError::Validation { size, iter, detail }),
        Ctl::Done {
            bad: None,
            check_ns,
        } => {
            // This side waited through the receiver's checks and the
            // answers' way back: they leave the real time, and the CPU time
            // in the same proportion (a polling sender burnt it, a parked
            // one did not).
            let rtt = m.real;
            let unchecked = rtt.saturating_sub(Duration::from_nanos(check_ns));
            // On an overloaded machine the zero-length round trips can take
            // as long as the run itself: then the way back is left in
            // (and said), rather than a time of zero reported.
            let real = if back.saturating_mul(2) < unchecked {
                unchecked - back
            } else {
                log::warn!(
                    "transfer-bench: the way back ({back:?}) is not small against the run ({unchecked:?}); the machine is overloaded, and the time includes it"
                );
                unchecked
            };
            if !rtt.is_zero() {
                m.cpu = m.cpu.mul_f64(real.as_secs_f64() / rtt.as_secs_f64());
            }
            m.real = real;
            Ok(m)
        }
        other => Err(BenchError::Protocol(format!(
            "expected the receiver's summary, got {other:?}"
        ))),
    }
}

/// Waits for the peer's next control message, driving progress meanwhile.
pub fn recv_ctl(ch: &mut BootstrapChannel, driver: &Driver<'_>, what: &str) -> Result<Ctl> {
    let (start, limit) = (Instant::now(), driver.limit());
    while !ch.poll_readable(Duration::ZERO)? {
        driver.progress();
        if start.elapsed() > limit {
            return Err(BenchError::Timeout {
                what: what.to_string(),
                limit,
            });
        }
        uct_core::spin::relax();
    }
    Ok(ch.recv_msg::<Ctl>()?)
}

/// The server's side of a two-process run (its Transport apart).
pub struct Server {
    pub ch: BootstrapChannel,
    pub dst: Memory,
    /// The zero-length answers are views of this.
    pub zero: Memory,
    /// The client's answer buffer.
    pub answers: RemoteBuffer,
}

/// Answers the client's phases until it says it is done.
pub fn serve(t: &Transport, s: &mut Server, driver: &Driver<'_>, validate: bool) -> Result<()> {
    loop {
        match recv_ctl(&mut s.ch, driver, "the client's next phase")? {
            Ctl::Phase {
                size,
                iters,
                first,
                outstanding,
            } => {
                let depth = usize::try_from(outstanding)
                    .ok()
                    .filter(|&n| (1..=MAX_OUTSTANDING).contains(&n))
                    .ok_or_else(|| {
                        BenchError::Protocol(format!(
                            "the client asked for {outstanding} writes in flight"
                        ))
                    })?;
                let slots = if validate { depth } else { 1 };
                let size = usize::try_from(size)
                    .ok()
                    .filter(|&n| n.saturating_mul(slots) <= s.dst.len())
                    .ok_or_else(|| {
                        BenchError::Protocol(format!(
                            "the client asked for {slots} x {size} bytes, more than the {} agreed",
                            s.dst.len()
                        ))
                    })?;
                if iters > MAX_ITERS || first.checked_add(iters).is_none() {
                    return Err(BenchError::Protocol(format!(
                        "the client asked for {iters} iterations from {first}"
                    )));
                }
                let done = if depth > 1 {
                    window::serve(t, s, driver, size, iters, first, slots, validate)?
                } else {
                    serve_phase(t, s, driver, size, iters, first, validate)?
                };
                s.ch.send_msg(&done)?;
            }
            Ctl::End => return Ok(()),
            other => {
                return Err(BenchError::Protocol(format!(
                    "expected a phase, got {other:?}"
                )))
            }
        }
    }
}

fn serve_phase(
    t: &Transport,
    s: &mut Server,
    driver: &Driver<'_>,
    size: usize,
    iters: u64,
    first: u64,
    validate: bool,
) -> Result<Ctl> {
    let zero = s.zero.view(0, 0)?;
    let answers = s.answers.slice(0, 0)?;
    let mut bad = None;
    let mut checking = Duration::ZERO;
    let mut buf = Vec::new();
    let mut answered = None;
    for it in first..first + iters {
        let tag = it as u32;
        // The write, then the zero-length one that measures the way back.
        for (len, tag) in [(size, tag), (0, !tag)] {
            let note = driver.wait("the client's next write", t.wait_for_write())??;
            if bad.is_none() {
                if let Err(e) = expect(note, len, tag, "the client's") {
                    bad = Some((it, e.to_string()));
                }
            }
            if validate && bad.is_none() && len > 0 {
                let started = Instant::now();
                if let Some(why) = check(&s.dst, 0, len, it, &mut buf)? {
                    bad = Some((it, why));
                }
                checking += started.elapsed();
            }
            // The previous answer completed while this write came in.
            if let Some(prev) = answered.take() {
                driver.wait("an answer's completion", prev)??;
            }
            answered = Some(t.write_tagged(&zero, &answers, note.tag));
        }
    }
    if let Some(prev) = answered {
        driver.wait("an answer's completion", prev)??;
    }
    Ok(Ctl::Done {
        bad,
        check_ns: checking.as_nanos().min(u64::MAX as u128) as u64,
    })
}

/// Runs size `size`: a warm-up (which also sizes the measured phase), then
/// the measured phase. `next` counts iterations over the whole run, so
/// that every iteration's pattern and tag differ from the last ones'.
pub fn measure_size(
    size: usize,
    plan: &Plan,
    next: &mut u64,
    mut phase: impl FnMut(usize, u64, u64) -> Result<Measurement>,
) -> Result<Measurement> {
    let mut warmup = plan.warmup_for(size);
    if plan.iters.is_none() {
        // The measured count is estimated from the warm-up.
        warmup = warmup.max(1);
    }
    let mut per_iter = Duration::ZERO;
    if warmup > 0 {
        let w = phase(size, warmup, *next).map_err(|e| e.during(size, "warm-up"))?;
        *next += warmup;
        per_iter = w.real_per_iter();
    }
    let iters = plan.iters_for(per_iter);
    let m = phase(size, iters, *next).map_err(|e| e.during(size, "measurement"))?;
    *next += iters;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_return_trip_is_the_median_and_a_hiccup_does_not_move_it() {
        let us = Duration::from_micros;
        let mut rtts = vec![us(2), us(3), us(10_000), us(2), us(3)];
        assert_eq!(median(&mut rtts), us(3));
        assert_eq!(median(&mut []), Duration::ZERO);
    }
}
