//! The measurement loops. The client drives and times; the server answers
//! ping-pongs, keeps its iface progressing, checks data when asked, and
//! confirms the end of every phase, so that bandwidth is counted only when
//! the receiver has the data.
//!
//! A [`phase`] is: `prepare` (both sides reset what they count), then the
//! client runs the loop of its test (`client`: ping-pong, a stream of puts
//! or active messages, gets, fetching atomics or an add rate) while the
//! server answers (`server`), then the client asks the server to confirm
//! the end (`Ctl::Done`) and only then stops the clock.
//!
//! Every wait, over the transport or over the bootstrap channel, progresses
//! the iface and probes the peer's liveness (`Endpoint::check`), so that a
//! peer that dies is named within the transport's peer timeout.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uct_core::bootstrap::BootstrapError;
use uct_core::{AtomicValue, Caps, Completion, CompletionData, FetchOp, Status};

mod pingpong;

use super::clock::Clock;
use super::error::{PerfError, Result};
use super::layout::layout_for;
use super::params::{Layout, TestKind};
use super::pattern::{check_pattern, pattern_into};
use super::session::{Role, Session};
use super::transfer::{
    alive, fill_send, flush, is_staged, post_data, post_get, read_buffer, read_recv_u64, spin,
    wait, write_buffer, Buffer, Deadline, WAIT_LIMIT,
};

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
    /// Both sides send it, then wait for the other's: a barrier.
    Ready,
}

/// The first bad iteration and what was wrong with it.
type Bad = (u64, String);

/// Waits for the peer's next bootstrap message, progressing the iface and
/// probing the peer meanwhile: a peer whose host died closes no socket.
fn await_message(session: &mut Session, what: &str) -> Result<()> {
    let mut deadline = Deadline::new(what);
    while !session.ch.poll_readable(Duration::ZERO)? {
        session.iface.progress();
        alive(session)?;
        deadline.tick()?;
    }
    Ok(())
}

/// How long a closed bootstrap connection is given to be explained by the
/// transport: posix, cma and tcp see a dead process at once, rc only by its
/// keepalive, within its peer timeout (a put_lat client saw the socket close
/// 0.27 s after the kill, long before rc could name the peer's QP).
const EXPLAIN_WITHIN: Duration = Duration::from_secs(5);

/// A bootstrap connection that closed or failed usually means that the
/// peer process died: the transport's probe then names the peer, which the
/// bootstrap error cannot.
fn explain(session: &mut Session, e: PerfError) -> PerfError {
    if !matches!(
        e,
        PerfError::Bootstrap(BootstrapError::Closed | BootstrapError::Io { .. })
    ) {
        return e;
    }
    let until = Instant::now() + EXPLAIN_WITHIN;
    while Instant::now() < until {
        session.iface.progress();
        if let Err(dead) = session.ep.check() {
            return dead.into();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    match session.ch.peer_addr() {
        Some(addr) => PerfError::Protocol(format!(
            "the peer perftest at {addr} closed the bootstrap connection ({e}); it exited or was killed"
        )),
        None => e,
    }
}

/// Sends `msg` to the server and returns its answer.
fn ctl(session: &mut Session, msg: &Ctl) -> Result<Option<Bad>> {
    session.ch.send_msg(msg)?;
    await_message(session, "the peer's answer")?;
    match session.ch.recv_msg::<Ctl>()? {
        Ctl::Ack { bad } => Ok(bad),
        other => Err(PerfError::Protocol(format!(
            "expected an acknowledgement, got {other:?}"
        ))),
    }
}

/// The validation error for `bad` at `size`.
fn fail(session: &Session, size: usize, (iter, detail): Bad) -> PerfError {
    PerfError::Validation {
        test: session.params.test.name(),
        size,
        iter,
        detail,
    }
}

/// Takes the first bad active message (or ping-pong) this side saw.
fn take_first_bad(session: &Session) -> Option<Bad> {
    session
        .am
        .first_bad
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()
}

/// Records `bad` unless an earlier iteration was already bad.
fn note_bad(session: &Session, bad: Bad) {
    session
        .am
        .first_bad
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get_or_insert(bad);
}

/// Resets what a phase counts, on both sides.
fn prepare(session: &mut Session, size: usize) -> Result<()> {
    session.am.count.store(0, Ordering::Release);
    session.am.size.store(size as u64, Ordering::Relaxed);
    session
        .am
        .validate
        .store(session.params.validate, Ordering::Relaxed);
    *session
        .am
        .first_bad
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    if !session.recv.mem_type().is_host_accessible() && session.stage.is_none() {
        // Device memory without validation: nothing reads it, nothing to clear.
    } else {
        let len = session.recv.len();
        write_buffer(session, Buffer::Recv, len, |bytes| bytes.fill(0))?;
    }
    session.ch.send_msg(&Ctl::Ready)?;
    await_message(session, "the peer to be ready")?;
    match session.ch.recv_msg::<Ctl>()? {
        Ctl::Ready => Ok(()),
        other => Err(PerfError::Protocol(format!(
            "expected the peer to be ready, got {other:?}"
        ))),
    }
}

/// Runs one phase of `iters` iterations at `size`; the client gets the
/// measurement.
pub fn phase(session: &mut Session, size: usize, iters: u64) -> Result<Option<Measurement>> {
    let run = |session: &mut Session| {
        prepare(session, size)?;
        let layout = layout_for(session, size)?;
        match session.role {
            Role::Client => client(session, size, iters, layout).map(Some),
            Role::Server => server(session, size, iters, layout).map(|_| None),
        }
    };
    run(session).map_err(|e| explain(session, e))
}

/// One non-fetching add of 1 to the peer's counter, posted until accepted.
fn add_one(session: &mut Session) -> Result<()> {
    let addr = session.peer_addr;
    let mut deadline = Deadline::new("room to post an atomic");
    loop {
        let status = session
            .ep
            .atomic_add(AtomicValue::U64(1), addr, &session.peer_rkey)?;
        if status != Status::NoResource {
            return Ok(());
        }
        session.iface.progress();
        alive(session)?;
        deadline.tick()?;
    }
}

/// The client's side of a phase: the loop of the test, then the server's
/// confirmation.
fn client(session: &mut Session, size: usize, iters: u64, layout: Layout) -> Result<Measurement> {
    let test = session.params.test;
    let start = Instant::now();
    let samples = match test {
        TestKind::PutLat | TestKind::AmLat | TestKind::AddLat => {
            pingpong::client(session, layout, size, iters)?
        }
        TestKind::PutBw | TestKind::AmBw => client_stream(session, layout, size, iters)?,
        TestKind::GetLat | TestKind::GetBw => client_gets(session, layout, size, iters)?,
        TestKind::FaddLat | TestKind::CswapLat => client_fetch_atomics(session, size, iters)?,
        TestKind::AddMr => client_add_rate(session, iters)?,
    };
    let am_expected = if test == TestKind::AmBw { iters } else { 0 };
    // The receiver confirms; only then does the clock stop.
    let bad = ctl(session, &Ctl::Done { am_expected })?;
    let total = start.elapsed();
    if let Some(bad) = bad.or_else(|| take_first_bad(session)) {
        return Err(fail(session, size, bad));
    }
    Ok(Measurement {
        size,
        iters,
        samples,
        total,
    })
}

/// The per-iteration times of one phase, in nanoseconds, on the process's
/// calibrated clock.
struct Samples {
    clock: Clock,
    times: Vec<f64>,
    /// When the previous interval ended, in ticks.
    last: u64,
    /// Posting intervals per sample (see [`INTERVAL_BATCH`]).
    batch: u32,
    /// Intervals since the last sample.
    count: u32,
}

/// Bandwidth and rate loops of at least [`BATCH_FROM`] iterations take one
/// sample per this many operations (their mean interval): reading the
/// clock and storing a sample per 8 B operation was a third of its cost,
/// and the rate comes from the total time anyway.
const INTERVAL_BATCH: u32 = 16;
const BATCH_FROM: u64 = 16 * 1024;

impl Samples {
    fn new(iters: u64) -> Samples {
        let clock = clock();
        Samples {
            clock,
            // Long runs grow the vector as they go rather than reserve
            // gigabytes up front.
            times: Vec::with_capacity(iters.min(1 << 24) as usize),
            last: clock.now(),
            batch: 1,
            count: 0,
        }
    }

    /// Samples of posting intervals, batched for long runs.
    fn intervals(iters: u64) -> Samples {
        let mut samples = Samples::new(iters / u64::from(INTERVAL_BATCH));
        if iters >= BATCH_FROM {
            samples.batch = INTERVAL_BATCH;
        }
        samples
    }

    /// Now, in ticks.
    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Records the time since `start` (ticks), divided by `divisor`.
    fn since(&mut self, start: u64, divisor: f64) {
        let ns = self.clock.ns_between(start, self.clock.now());
        self.times.push(ns / divisor);
    }

    /// Records the time since the previous lap ended (or since `new`),
    /// divided by `divisor`: one clock read per lap.
    #[inline]
    fn lap(&mut self, divisor: f64) {
        let now = self.clock.now();
        self.times
            .push(self.clock.ns_between(self.last, now) / divisor);
        self.last = now;
    }

    /// Records the time since the previous interval ended (the posting
    /// interval of bandwidth and rate tests).
    #[inline]
    fn interval(&mut self) {
        self.count += 1;
        if self.count < self.batch {
            return;
        }
        let now = self.clock.now();
        let ns = self.clock.ns_between(self.last, now);
        self.times.push(ns / f64::from(self.count));
        self.last = now;
        self.count = 0;
    }
}

/// Progresses until fewer than `--outstanding` operations of `comp` are in
/// flight, probing the peer even when there are (operations that complete
/// at once, such as puts into a dead peer's shared memory, never wait).
#[inline]
fn within_window(session: &mut Session, comp: &Completion) -> Result<()> {
    let outstanding = session.params.outstanding.max(1);
    if comp.pending() < outstanding {
        // The common case of a bandwidth run, kept to a count and a load.
        return alive(session);
    }
    wait_for_window(session, comp, outstanding)
}

/// [`within_window`] when the window is full.
#[cold]
#[inline(never)]
fn wait_for_window(session: &mut Session, comp: &Completion, outstanding: usize) -> Result<()> {
    spin(session, "room in the window of transfers", |_| {
        comp.pending() < outstanding
    })
}

/// put_bw, am_bw: keep up to `--outstanding` transfers in flight; with
/// validation, one at a time, each checked by the server (puts) or by the
/// AM handler (active messages). Samples are the posting intervals.
fn client_stream(
    session: &mut Session,
    layout: Layout,
    size: usize,
    iters: u64,
) -> Result<Vec<f64>> {
    let validate = session.params.validate;
    let mut samples = Samples::intervals(iters);
    let comp = Completion::new();
    for iter in 0..iters {
        if validate {
            fill_send(session, size, iter)?;
        }
        post_data(session, layout, size, Some(&comp))?;
        if validate {
            wait(session, &comp, "the transfer")?;
            flush(session)?;
            if session.params.test == TestKind::PutBw {
                if let Some(bad) = ctl(session, &Ctl::Check { iter })? {
                    return Err(fail(session, size, bad));
                }
            }
        }
        within_window(session, &comp)?;
        samples.interval();
    }
    wait(session, &comp, "the last transfers")?;
    comp.result()?;
    flush(session)?;
    Ok(samples.times)
}

/// get_lat, get_bw: gets from the peer's receive buffer (filled by the
/// server with the pattern when validating). Samples are each get's
/// latency (get_lat) or the posting intervals (get_bw).
fn client_gets(session: &mut Session, layout: Layout, size: usize, iters: u64) -> Result<Vec<f64>> {
    let latency = session.params.test == TestKind::GetLat;
    let validate = session.params.validate;
    let mut samples = if latency {
        Samples::new(iters)
    } else {
        Samples::intervals(iters)
    };
    let comp = Completion::new();
    for iter in 0..iters {
        if validate {
            if let Some(bad) = ctl(session, &Ctl::Fill { iter })? {
                return Err(fail(session, size, bad));
            }
        }
        // Bandwidth runs read the clock once per get (interval), not twice.
        let posted = if latency { samples.now() } else { 0 };
        let status = post_get(session, layout, size, &comp)?;
        if latency || validate {
            alive(session)?;
            if status == Status::InProgress {
                wait(session, &comp, "a get")?;
            }
            if latency {
                samples.since(posted, 1.0);
            }
            if validate {
                check_get(session, layout, &comp, size, iter)?;
            }
        } else {
            within_window(session, &comp)?;
        }
        if !latency {
            samples.interval();
        }
        // bcopy data is not needed in bandwidth runs.
        if layout == Layout::Bcopy && !validate {
            comp.take_data();
        }
    }
    wait(session, &comp, "the last gets")?;
    Ok(samples.times)
}

/// Checks what get `iter` brought: the completion's bytes (bcopy) or the
/// send buffer it landed in.
fn check_get(
    session: &mut Session,
    layout: Layout,
    comp: &Completion,
    size: usize,
    iter: u64,
) -> Result<()> {
    let mut got = match (layout, comp.take_data()) {
        (Layout::Bcopy, Some(CompletionData::Bytes(bytes))) => bytes,
        _ => read_buffer(session, Buffer::Send, size)?,
    };
    if session.params.inject_corruption == Some(iter) && !got.is_empty() {
        got[size / 2] ^= 0x5a;
    }
    match check_pattern(&got, size, iter) {
        Some(why) => Err(fail(session, size, (iter, why))),
        None => Ok(()),
    }
}

/// fadd_lat, cswap_lat: one fetching atomic at a time on the peer's
/// counter; with validation, each old value is checked.
fn client_fetch_atomics(session: &mut Session, size: usize, iters: u64) -> Result<Vec<f64>> {
    let test = session.params.test;
    let mut samples = Samples::new(iters);
    let (addr, comp) = (session.peer_addr, Completion::new());
    for iter in 0..iters {
        let op = if test == TestKind::FaddLat {
            FetchOp::Add(AtomicValue::U64(1))
        } else {
            FetchOp::CompareSwap {
                compare: AtomicValue::U64(iter),
                swap: AtomicValue::U64(iter + 1),
            }
        };
        alive(session)?;
        let mut deadline = Deadline::new("room to post an atomic");
        let status = loop {
            let status = session
                .ep
                .atomic_fetch(op, addr, &session.peer_rkey, &comp)?;
            if status != Status::NoResource {
                break status;
            }
            session.iface.progress();
            alive(session)?;
            deadline.tick()?;
        };
        if status == Status::InProgress {
            wait(session, &comp, "an atomic")?;
        }
        // One clock read per atomic, as ucx_perftest times: the lap from
        // the end of the previous one (where the clock is a system call,
        // as in a VM whose clocksource is hpet, a second read was 3% of
        // an rc atomic there).
        samples.lap(1.0);
        let old = comp.value().unwrap_or(u64::MAX);
        if session.params.validate && old != iter {
            return Err(fail(
                session,
                size,
                (iter, format!("the old value was {old}, expected {iter}")),
            ));
        }
    }
    Ok(samples.times)
}

/// add_mr: non-fetching adds as fast as they are accepted; the server
/// checks the counter at the end. Samples are the posting intervals.
fn client_add_rate(session: &mut Session, iters: u64) -> Result<Vec<f64>> {
    let mut samples = Samples::intervals(iters);
    for _ in 0..iters {
        alive(session)?;
        add_one(session)?;
        samples.interval();
    }
    flush(session)?;
    Ok(samples.times)
}

/// The server's side of a phase: answers ping-pongs, then progresses and
/// answers the client's requests until it says it is done.
fn server(session: &mut Session, size: usize, iters: u64, layout: Layout) -> Result<()> {
    if session.params.test.is_pingpong() {
        pingpong::server(session, layout, size, iters)?;
    }
    // Keep progressing, answer checks, until the client is done. This wait
    // is as long as the client's run; a dead client ends it through the
    // probe or the bootstrap socket, and a live one that stalls through
    // the phase's budget.
    let budget = phase_budget(iters, size);
    let started = Instant::now();
    let passive = waits_passively(session);
    let mut looks = super::clock::Looks::new(session.params.validate, clock());
    let mut looked = 0u32;
    loop {
        session.iface.progress();
        let readable = if passive {
            // A turn is PASSIVE_POLL long: probe on every one. (A
            // transport may look at its clock only every few probes, rc
            // every 16th, and a verdict takes two looks, so a peer that
            // dies without closing the socket is named up to some 0.3 s
            // later than by a spinning server.)
            session.ep.check()?;
            session.ch.poll_readable(PASSIVE_POLL)?
        } else {
            alive(session)?;
            if !looks.due() {
                continue;
            }
            session.ch.poll_readable(Duration::ZERO)?
        };
        if !readable {
            looked = looked.wrapping_add(1);
            if (passive || looked.is_multiple_of(4096)) && started.elapsed() > budget {
                return Err(PerfError::Protocol(format!(
                    "the client has not finished {iters} iterations of {size} bytes in {} s, though it looks alive; it is stuck (or slower than 1 MB/s and 1000 iterations/s)",
                    budget.as_secs()
                )));
            }
            continue;
        }
        match session.ch.recv_msg::<Ctl>()? {
            Ctl::Check { iter } => {
                let got = read_buffer(session, Buffer::Recv, size)?;
                let bad = check_pattern(&got, size, iter).map(|why| (iter, why));
                session.ch.send_msg(&Ctl::Ack { bad })?;
            }
            Ctl::Fill { iter } => {
                write_buffer(session, Buffer::Recv, size, |bytes| {
                    pattern_into(bytes, iter)
                })?;
                session.ch.send_msg(&Ctl::Ack { bad: None })?;
            }
            Ctl::Done { am_expected } => {
                let bad = server_end(session, iters, am_expected)?;
                session.ch.send_msg(&Ctl::Ack { bad })?;
                return Ok(());
            }
            other => return Err(PerfError::Protocol(format!("unexpected {other:?}"))),
        }
    }
}

/// How long a server that waits passively sleeps in poll(2) on the
/// bootstrap socket between progress calls: a message from the client,
/// or its socket's close, wakes it at once; the timeout only paces its
/// progress and liveness probes, a hundred a second against peer
/// timeouts of seconds (rc's: 10 s by default; at its smallest, 100 ms,
/// the server's clock looks some 160 ms apart are coarser than the
/// timeout: start the server with --server-spin for timeouts that short).
const PASSIVE_POLL: Duration = Duration::from_millis(10);

/// Whether the server may sleep through this phase instead of spinning in
/// progress: the test is one-sided (the client's puts, gets and atomics
/// ask nothing of the server until `Ctl::Done`), the transport moves them
/// without the target's progress (`Caps::PASSIVE_TARGET`), and the server
/// was not started with `--server-spin`. A spinning server takes a CPU
/// that the client, or on an emulated testbed the client's vCPU, could
/// use; the plain verbs programs' servers sleep.
fn waits_passively(session: &Session) -> bool {
    session.params.test.target_is_passive()
        && !session.server_spin
        && session.iface.attrs().caps.contains(Caps::PASSIVE_TARGET)
}

/// How long the server waits for a live client to finish a phase:
/// [`WAIT_LIMIT`] plus what the slowest client worth waiting for takes
/// (1 ms and a MB/s per iteration), so that a connected client that stalls
/// cannot hold the server for ever.
fn phase_budget(iters: u64, size: usize) -> Duration {
    let per_iter = 1e-3 + size as f64 / 1e6;
    WAIT_LIMIT.saturating_add(Duration::from_secs_f64((iters as f64 * per_iter).min(1e9)))
}

/// What the server confirms at the end of a phase: waits for the last
/// active messages, and after add_mr checks that the counter is `iters`.
fn server_end(session: &mut Session, iters: u64, am_expected: u64) -> Result<Option<Bad>> {
    if am_expected > 0 {
        spin(session, "the last active messages", |session| {
            session.am.count.load(Ordering::Acquire) >= am_expected
        })?;
    }
    let bad = take_first_bad(session);
    if bad.is_some() || session.params.test != TestKind::AddMr {
        return Ok(bad);
    }
    let counter = if is_staged(session, &session.recv.clone()) {
        let bytes = read_buffer(session, Buffer::Recv, 8)?;
        u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]))
    } else {
        read_recv_u64(session, 0)
    };
    if counter != iters {
        return Ok(Some((
            iters,
            format!("the counter is {counter} after {iters} adds"),
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_budget_grows_with_the_run_and_never_overflows() {
        let short = phase_budget(10, 8);
        assert!(short >= WAIT_LIMIT && short < WAIT_LIMIT + Duration::from_secs(1));
        assert!(phase_budget(1_000_000, 8) > short);
        assert!(phase_budget(1_000, 4 << 20) > phase_budget(1_000, 8));
        // The client's own limits (100M iterations of 1 GiB) stay finite.
        let huge = phase_budget(u64::MAX, usize::MAX);
        assert!(huge > WAIT_LIMIT && huge < Duration::from_secs(2_000_000_000));
    }
}
