//! A cheap clock for per-iteration timestamps: the CPU's time-stamp counter
//! (x86_64), calibrated against the monotonic clock, where it runs at a
//! constant rate (constant_tsc and nonstop_tsc) or where reading the
//! monotonic clock is slow (typically a system call); the monotonic clock
//! elsewhere, and on other architectures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Intervals the clock gave as negative (the TSCs of two CPUs out of step),
/// recorded as 0; see [`backwards`].
static BACKWARDS: AtomicU64 = AtomicU64::new(0);

/// How many intervals so far ran backwards and were recorded as 0: the
/// thread moved between CPUs whose TSCs are not in step.
pub fn backwards() -> u64 {
    BACKWARDS.load(Ordering::Relaxed)
}

/// Ticks and their length.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    ns_per_tick: f64,
    tsc: bool,
    /// CLOCK_MONOTONIC at `new`, in ns.
    origin_ns: u64,
}

/// CLOCK_MONOTONIC in ns, read directly: `Instant::elapsed` and its
/// Duration arithmetic were some 50 instructions a lap, a measurable part
/// of a small rc atomic under emulation (docs/perf-rc-notes.md).
#[inline]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC exists on
    // every Linux, so the call cannot fail (it would leave `ts` zero).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(target_arch = "x86_64")]
fn tsc_usable() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.contains(" constant_tsc") && s.contains(" nonstop_tsc"))
        .unwrap_or(false)
}

/// Whether reading CLOCK_MONOTONIC is slow here, typically a system call: the fastest of
/// a few back-to-back reads takes over 300 ns (a vDSO read takes some 20 to
/// 100). Then the kernel did not take the TSC as its clocksource (a VM on
/// hpet: about 1.9 us a read under the rxe testbed's emulation, 2026-11-29,
/// against 20 ns for the TSC), and a read per iteration is a measurable part
/// of a small operation. ucx_perftest reads the TSC on x86_64 regardless.
#[cfg(target_arch = "x86_64")]
fn monotonic_is_slow() -> bool {
    let mut prev = monotonic_ns();
    let mut fastest = u64::MAX;
    for _ in 0..8 {
        let now = monotonic_ns();
        fastest = fastest.min(now.wrapping_sub(prev));
        prev = now;
    }
    fastest > 300
}

/// The user's choice of clock, PERFTEST_CLOCK=tsc (true) or =monotonic
/// (false); None leaves it to the CPU.
#[cfg(target_arch = "x86_64")]
fn chosen_clock() -> Option<bool> {
    match std::env::var("PERFTEST_CLOCK").as_deref() {
        Ok("tsc") => Some(true),
        Ok("monotonic") => Some(false),
        Ok(other) => {
            log::warn!("PERFTEST_CLOCK={other} is neither tsc nor monotonic; choosing by the CPU");
            None
        }
        Err(_) => None,
    }
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The TSC's length of a tick in ns over one sleep of `ms`, or None where
/// it is not believable. Each end reads the monotonic clock between two TSC
/// reads, the tightest of three brackets, so that a preemption at an end
/// (a monotonic read that is a system call is a point for one) does not
/// skew it.
#[cfg(target_arch = "x86_64")]
fn tsc_window(ms: u64) -> Option<f64> {
    let end = || {
        let mut best = (u64::MAX, 0u64, 0u64);
        for _ in 0..3 {
            let (a, ns, b) = (rdtsc(), monotonic_ns(), rdtsc());
            let bracket = b.wrapping_sub(a);
            if bracket < best.0 {
                best = (bracket, a.wrapping_add(bracket / 2), ns);
            }
        }
        best
    };
    let (w0, c0, n0) = end();
    std::thread::sleep(Duration::from_millis(ms));
    let (w1, c1, n1) = end();
    let (ticks, ns) = (c1.wrapping_sub(c0), n1.wrapping_sub(n0));
    // Brackets or a window that ran backwards: TSCs out of step.
    if w0.max(w1) > u64::MAX / 2 || ticks == 0 || ticks > u64::MAX / 2 || ns == 0 {
        return None;
    }
    let ns_per_tick = ns as f64 / ticks as f64;
    // A TSC between 100 MHz and 100 GHz.
    (0.01..=10.0).contains(&ns_per_tick).then_some(ns_per_tick)
}

impl Clock {
    /// Calibrates for about 20 ms: two windows of 10 ms that must agree
    /// within 2% (a TSC whose rate follows the CPU's frequency, or that
    /// moved between CPUs out of step, does not), else the monotonic clock.
    pub fn new() -> Clock {
        let origin_ns = monotonic_ns();
        #[cfg(target_arch = "x86_64")]
        {
            // The TSC where the user chose it, else where it is invariant
            // or the monotonic clock is slow.
            let chosen = chosen_clock();
            if chosen.unwrap_or_else(|| tsc_usable() || monotonic_is_slow()) {
                match (tsc_window(10), tsc_window(10)) {
                    (Some(a), Some(b)) if (a - b).abs() <= 0.02 * a => {
                        return Clock {
                            ns_per_tick: (a + b) / 2.0,
                            tsc: true,
                            origin_ns,
                        };
                    }
                    // Said out loud only to a user who asked for the TSC.
                    windows if chosen == Some(true) => log::warn!(
                        "PERFTEST_CLOCK=tsc: the TSC's calibration windows disagree or are not \
                         believable ({windows:?} ns a tick), so it is not used; timing with the \
                         monotonic clock (pin with taskset, or leave PERFTEST_CLOCK unset)"
                    ),
                    windows => log::debug!(
                        "perftest: the TSC's calibration windows disagree or are not believable \
                         ({windows:?} ns a tick); timing with the monotonic clock"
                    ),
                }
            }
        }
        Clock {
            ns_per_tick: 1.0,
            tsc: false,
            origin_ns,
        }
    }

    /// Now, in ticks.
    #[inline]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            return rdtsc();
        }
        monotonic_ns().wrapping_sub(self.origin_ns)
    }

    /// Ticks to nanoseconds.
    #[inline]
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * self.ns_per_tick
    }

    /// Nanoseconds from tick `from` to tick `to`; 0, counted in
    /// [`backwards`], where `to` comes first (TSCs of two CPUs out of step).
    #[inline]
    pub fn ns_between(&self, from: u64, to: u64) -> f64 {
        let ticks = to.wrapping_sub(from);
        if ticks > u64::MAX / 2 {
            BACKWARDS.fetch_add(1, Ordering::Relaxed);
            return 0.0;
        }
        self.ns(ticks)
    }

    /// Whether this clock is the TSC.
    pub fn is_tsc(&self) -> bool {
        self.tsc
    }

    /// Ticks to a duration.
    pub fn duration(&self, ticks: u64) -> Duration {
        Duration::from_secs_f64(self.ns(ticks) / 1e9)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// When the perftest server, waiting for the client's end, looks at the
/// bootstrap socket. A look is a poll() system call (about 1 us here):
/// every 64 progress calls it was a quarter of a posix am_bw server's
/// time, the side that bounds that test. Unvalidated, the client sends
/// nothing until it is done, so look at most every [`Looks::GAP`] (the
/// clock read every 64 calls; the wait for Done counts in the client's
/// time); validated, it waits for an answer after every iteration, so
/// every 64 calls.
pub(super) struct Looks {
    calls: u32,
    validate: bool,
    clock: Clock,
    /// [`Looks::GAP`] in the clock's ticks.
    gap: u64,
    last: u64,
}

impl Looks {
    const GAP: Duration = Duration::from_micros(50);

    /// Looks timed by `clock` (the cheap one: a monotonic read was a
    /// system call of about 2 us on the rxe testbed).
    pub(super) fn new(validate: bool, clock: Clock) -> Self {
        Looks {
            calls: 0,
            validate,
            clock,
            gap: (Self::GAP.as_nanos() as f64 / clock.ns_per_tick) as u64,
            last: clock.now(),
        }
    }

    /// Counts one progress call; whether to look now.
    #[inline]
    pub(super) fn due(&mut self) -> bool {
        self.calls = self.calls.wrapping_add(1);
        if !self.calls.is_multiple_of(64) {
            return false;
        }
        if self.validate {
            return true;
        }
        let now = self.clock.now();
        // A clock that ran backwards (TSCs out of step) looks at once.
        if now.wrapping_sub(self.last) < self.gap {
            return false;
        }
        self.last = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn an_interval_that_runs_backwards_is_zero_and_counted() {
        let clock = Clock::new();
        let before = backwards();
        assert_eq!(clock.ns_between(1_000, 999), 0.0);
        assert!(backwards() > before);
        let ns = clock.ns_between(1_000, 3_000);
        assert!((ns - clock.ns(2_000)).abs() < 1e-9 && ns > 0.0);
    }

    /// Three tries: a loaded machine may preempt between the reads.
    #[test]
    fn the_clock_moves_forward_at_about_the_monotonic_rate() {
        let mut tries = Vec::new();
        for _ in 0..3 {
            let clock = Clock::new();
            let (t0, c0) = (Instant::now(), clock.now());
            std::thread::sleep(Duration::from_millis(30));
            let (c1, t1) = (clock.now(), Instant::now());
            let ns = clock.ns_between(c0, c1);
            let wall = (t1 - t0).as_nanos() as f64;
            // The clock's reads lie between the wall clock's, around the
            // sleep between them.
            if ns > 15e6 && ns < 1.5 * wall + 5e6 {
                return;
            }
            tries.push((ns, wall, clock.is_tsc()));
        }
        panic!("clock against wall ns (tsc?), three tries: {tries:?}");
    }

    #[test]
    fn looks_without_validation_come_after_the_gap() {
        let clock = Clock::new();
        let mut looks = Looks::new(false, clock);
        let gap_ns = clock.ns(looks.gap);
        assert!(
            (gap_ns - 50_000.0).abs() <= clock.ns(1) + 1.0,
            "gap {gap_ns} ns"
        );
        std::thread::sleep(Duration::from_micros(200));
        assert!(
            (0..64).any(|_| looks.due()),
            "no look 200 us after the last"
        );
    }

    #[test]
    fn looks_come_every_64_calls_when_validating() {
        let mut looks = Looks::new(true, Clock::new());
        let due = (0..128).filter(|_| looks.due()).count();
        assert_eq!(due, 2);
    }
}
