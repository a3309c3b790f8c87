//! Waiting for the transfer API's futures on the measuring thread, with a
//! deadline, and the process CPU clock.
//!
//! With manual progress the measuring thread drives every Transport it was
//! given between polls; with progress threads it spins briefly, then parks
//! until the future's waker unparks it.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use uct_transfer::Transport;

use super::error::{BenchError, Result};

/// Turns of a wait between two looks at the clock: the short waits of a
/// measured loop never read it.
const CLOCK_EVERY: u32 = 1024;

/// Polls of a wait on a progress thread before the waiter parks.
const SPIN_POLLS: u32 = 200;

/// Wakes the thread that waits on a future.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits for futures, driving progress where it is manual.
pub struct Driver<'a> {
    /// The Transports whose progress this thread drives (none with
    /// progress threads).
    manual: Vec<&'a Transport>,
    limit: Duration,
    waker: Waker,
}

impl<'a> Driver<'a> {
    /// A driver that calls `progress()` on `manual` between polls, and
    /// gives every wait `limit`.
    pub fn new(manual: Vec<&'a Transport>, limit: Duration) -> Driver<'a> {
        // The spin hint's cost is timed now, not in the first timed wait.
        uct_core::spin::use_pause();
        let waker = if manual.is_empty() {
            Waker::from(Arc::new(ThreadWaker(std::thread::current())))
        } else {
            // Progress runs on this thread: nothing else wakes it.
            Waker::noop().clone()
        };
        Driver {
            manual,
            limit,
            waker,
        }
    }

    /// Runs `fut` to completion on this thread; an error once it has taken
    /// longer than the limit (a dead peer usually ends it sooner, with the
    /// transport's own error, within its peer timeout).
    #[inline]
    pub fn wait<F: Future>(&self, what: &str, fut: F) -> Result<F::Output> {
        let mut cx = Context::from_waker(&self.waker);
        let mut fut = pin!(fut);
        let mut turns = 0u32;
        let mut since: Option<Instant> = None;
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return Ok(v);
            }
            if self.manual.is_empty() {
                if turns < SPIN_POLLS {
                    uct_core::spin::relax();
                } else {
                    // The waker unparks; the timeout bounds a lost wake-up.
                    std::thread::park_timeout(Duration::from_millis(1));
                }
            } else {
                for t in &self.manual {
                    t.progress();
                }
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(CLOCK_EVERY) || (self.manual.is_empty() && turns > SPIN_POLLS) {
                let start = *since.get_or_insert_with(Instant::now);
                if start.elapsed() > self.limit {
                    return Err(BenchError::Timeout {
                        what: what.to_string(),
                        limit: self.limit,
                    });
                }
            }
        }
    }

    /// The deadline of every wait.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Drives progress once (nothing with progress threads).
    pub fn progress(&self) {
        for t in &self.manual {
            t.progress();
        }
    }
}

/// The CPU time this process has used, all its threads together.
pub fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call; CLOCK_PROCESS_CPUTIME_ID exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_never_ends_times_out() {
        let driver = Driver::new(Vec::new(), Duration::from_millis(50));
        let start = Instant::now();
        let r = driver.wait("nothing", std::future::pending::<()>());
        assert!(matches!(r, Err(BenchError::Timeout { .. })), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(driver.wait("ready", std::future::ready(7)).unwrap(), 7);
    }

    #[test]
    fn the_cpu_clock_moves() {
        let a = process_cpu();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(process_cpu() > a);
    }
}
