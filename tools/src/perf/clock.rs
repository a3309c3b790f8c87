//! A cheap clock for per-iteration timestamps: the CPU's time-stamp counter
//! where it runs at a constant rate (x86_64 with constant_tsc), calibrated
//! against the monotonic clock; the monotonic clock elsewhere.

use std::time::{Duration, Instant};

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

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

impl Clock {
    /// Calibrates for about 20 ms.
    pub fn new() -> Clock {
        let origin_ns = monotonic_ns();
        #[cfg(target_arch = "x86_64")]
        if tsc_usable() {
            let (t0, c0) = (Instant::now(), rdtsc());
            std::thread::sleep(Duration::from_millis(20));
            let (t1, c1) = (Instant::now(), rdtsc());
            let ticks = c1.wrapping_sub(c0);
            if ticks > 0 {
                return Clock {
                    ns_per_tick: (t1 - t0).as_nanos() as f64 / ticks as f64,
                    tsc: true,
                    origin_ns,
                };
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
    last: Instant,
}

impl Looks {
    const GAP: Duration = Duration::from_micros(50);

    pub(super) fn new(validate: bool) -> Self {
        Looks {
            calls: 0,
            validate,
            last: Instant::now(),
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
        let now = Instant::now();
        if now.duration_since(self.last) < Self::GAP {
            return false;
        }
        self.last = now;
        true
    }
}
