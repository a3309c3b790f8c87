//! A monotonic clock of tick resolution (`CLOCK_MONOTONIC_COARSE`, 1 to 10
//! ms with the kernel's HZ) for deadlines of seconds: peer timeouts,
//! keepalives, drain limits. Two readings may differ from the time between
//! them by up to a tick either way, so a deadline fires up to a tick early
//! or late.
//!
//! Why not [`std::time::Instant`]: it reads `CLOCK_MONOTONIC`, which the
//! vDSO serves only when the clocksource allows it (tsc, kvm-clock). With
//! hpet, acpi_pm or Xen's clocksource every read is a system call: 4.6 us
//! in the qemu TCG guest of scripts/rxe-vm, where rc read it for every
//! post that found its queue empty, two to three times per ping-pong round
//! trip. The coarse clock is the kernel's last tick, which the vDSO serves
//! from memory whatever the clocksource.

use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point on the coarse monotonic clock (same origin as `CLOCK_MONOTONIC`,
/// normally behind it by at most one kernel tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CoarseInstant(Duration);

impl CoarseInstant {
    /// Now, to the last kernel tick.
    pub fn now() -> CoarseInstant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; clock_gettime only
        // writes it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if rc != 0 {
            // Linux has had the coarse clock since 2.6.32; never seen to
            // fail. A fixed point would stop every deadline, so fall back
            // to the precise clock's reading of the same origin.
            // SAFETY: as above.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        }
        CoarseInstant(Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0).min(999_999_999),
        ))
    }

    /// Time from `earlier` to `self`, zero when `earlier` is later.
    pub fn saturating_duration_since(&self, earlier: CoarseInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since `self`, zero if the clock reads earlier.
    pub fn elapsed(&self) -> Duration {
        CoarseInstant::now().saturating_duration_since(*self)
    }
}

impl Add<Duration> for CoarseInstant {
    type Output = CoarseInstant;

    /// Saturates rather than panics: a deadline past the end of time is
    /// never reached.
    fn add(self, d: Duration) -> CoarseInstant {
        CoarseInstant(self.0.saturating_add(d))
    }
}

impl AddAssign<Duration> for CoarseInstant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for CoarseInstant {
    type Output = CoarseInstant;

    /// Saturates at the clock's origin rather than panics.
    fn sub(self, d: Duration) -> CoarseInstant {
        CoarseInstant(self.0.saturating_sub(d))
    }
}

impl Sub<CoarseInstant> for CoarseInstant {
    type Output = Duration;

    /// As [`CoarseInstant::saturating_duration_since`].
    fn sub(self, earlier: CoarseInstant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coarse clock's resolution, as the kernel reports it.
    fn tick() -> Duration {
        let mut res = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `res` is a valid, writable timespec; clock_getres only
        // writes it.
        let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) };
        assert_eq!(rc, 0, "clock_getres(CLOCK_MONOTONIC_COARSE)");
        Duration::new(res.tv_sec as u64, res.tv_nsec as u32)
    }

    #[test]
    fn it_moves_forward_with_the_precise_clock_within_a_few_ticks() {
        let precise = std::time::Instant::now();
        let t0 = CoarseInstant::now();
        let sleep = Duration::from_millis(150);
        std::thread::sleep(sleep);
        let t1 = CoarseInstant::now();
        let moved = t1.saturating_duration_since(t0);
        let real = precise.elapsed();
        assert!(t1 >= t0);
        // Each reading lags by a tick, normally; an emulated guest (the
        // rxe VM) may take its ticks late, so a few ticks of slack. The
        // sleep stays well above it (HZ=100: 30 ms), so a clock that did
        // not move fails.
        let slack = (tick() * 3).max(Duration::from_millis(20));
        assert!(
            slack < sleep / 2,
            "the coarse clock's tick {:?} is too coarse for this test",
            tick()
        );
        assert!(
            moved + slack >= sleep && moved <= real + slack,
            "coarse {moved:?}, precise {real:?}, slack {slack:?}"
        );
        assert_eq!(t0.saturating_duration_since(t1), Duration::ZERO);
    }

    #[test]
    fn adding_saturates() {
        let t = CoarseInstant::now();
        assert!(t + Duration::MAX >= t + Duration::from_secs(1));
        assert_eq!(
            (t + Duration::from_secs(2)).saturating_duration_since(t),
            Duration::from_secs(2)
        );
    }
}
