//! A cheap clock for per-iteration timestamps: the CPU's time-stamp counter
//! where it runs at a constant rate (x86_64 with constant_tsc), calibrated
//! against the monotonic clock; the monotonic clock elsewhere.

use std::time::{Duration, Instant};

/// Ticks and their length.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    ns_per_tick: f64,
    tsc: bool,
    origin: Instant,
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
        let origin = Instant::now();
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
                    origin,
                };
            }
        }
        Clock {
            ns_per_tick: 1.0,
            tsc: false,
            origin,
        }
    }

    /// Now, in ticks.
    #[inline]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            return rdtsc();
        }
        self.origin.elapsed().as_nanos() as u64
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
