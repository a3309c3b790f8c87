//! The progress thread, and a block_on that drives progress itself.
//!
//! The thread spins (yielding the core) while anything is in flight or
//! awaited, so that a notification is seen as soon as it lands, for
//! [`BUSY_SPIN`] after the last event; then it polls every [`BUSY_POLL`].
//! Idle, it polls every millisecond (for connection set-up and liveness).
//! A future wakes it when first polled pending, and an operation left
//! queued when posted; an operation that completed inside its post (most
//! over shared memory) needs nothing more.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Result, TransferError};
use crate::shared::{with_deferred_wakes, Shared};
use crate::transport::Transport;

/// Idle turns before the thread sleeps between polls when nothing is in
/// flight or awaited.
const SPIN_TURNS: u32 = 2000;

/// Sleep between polls when idle.
const IDLE_POLL: Duration = Duration::from_millis(1);

/// How long the thread spins with something in flight or awaited and no
/// event, before it polls every [`BUSY_POLL`] instead: a wait that nothing
/// answers must not burn a core for good.
const BUSY_SPIN: Duration = Duration::from_millis(50);

/// Sleep between polls once [`BUSY_SPIN`] has passed without an event.
const BUSY_POLL: Duration = Duration::from_micros(100);

pub(crate) fn spawn(shared: Arc<Shared>) -> Result<JoinHandle<()>> {
    let s = shared.clone();
    let handle = std::thread::Builder::new()
        .name("uct-transfer".into())
        .spawn(move || run(&s))
        .map_err(|e| TransferError::Config(format!("cannot start the progress thread: {e}")))?;
    let _ = shared.thread.set(handle.thread().clone());
    Ok(handle)
}

fn run(shared: &Shared) {
    // The spin hint's cost is timed here, before any transfer waits on it.
    uct_core::spin::use_pause();
    let mut idle = 0u32;
    let mut quiet_since: Option<Instant> = None;
    let mut drowsy = false;
    let mut last_nudges = 0;
    while !shared.stop.load(Ordering::Acquire) {
        if shared.drivers.load(Ordering::Acquire) > 0 {
            // A thread in Transport::wait drives progress.
            std::thread::park_timeout(IDLE_POLL);
            continue;
        }
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_deferred_wakes(|| {
                let mut phase = shared.phase.lock().unwrap_or_else(|p| p.into_inner());
                shared.progress_in(&mut phase)
            })
        }));
        let events = match turn {
            Ok(n) => n,
            Err(panic) => {
                // A transport's bug: the futures end with an error rather
                // than hang with nobody progressing.
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                log::error!("transfer: progress panicked: {what}");
                with_deferred_wakes(|| {
                    let mut phase = shared.phase.lock().unwrap_or_else(|p| p.into_inner());
                    shared.fail_connection(&mut phase, TransferError::Panicked { what });
                });
                1
            }
        };
        if shared.posters.load(Ordering::Acquire) > 0 {
            // A caller waits for the lock to post: let it in.
            std::thread::yield_now();
        }
        let nudged = shared.nudges.load(Ordering::Acquire);
        if events > 0 || nudged != last_nudges {
            last_nudges = nudged;
            idle = 0;
            quiet_since = None;
            drowsy = false;
            continue;
        }
        idle = idle.saturating_add(1);
        if shared.busy() {
            if idle <= 64 {
                uct_core::spin::relax();
                continue;
            }
            // The clock is read only every 64 turns.
            if idle.is_multiple_of(64) {
                drowsy = quiet_since.get_or_insert_with(Instant::now).elapsed() > BUSY_SPIN;
            }
            if drowsy {
                std::thread::park_timeout(BUSY_POLL);
            } else {
                std::thread::yield_now();
            }
        } else if idle > SPIN_TURNS {
            quiet_since = None;
            drowsy = false;
            std::thread::park_timeout(IDLE_POLL);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Wakes the thread that blocks on a future.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` to completion, calling `transport.progress()` between polls.
pub(crate) fn block_on_progress<F: Future>(
    transport: &Transport,
    shared: &Shared,
    fut: F,
    limit: Option<Duration>,
) -> Result<F::Output> {
    let started = limit.map(|l| (Instant::now(), l));
    /// Counts this thread as driving progress while it is in here.
    struct Driving<'a>(&'a Shared);
    impl Drop for Driving<'_> {
        fn drop(&mut self) {
            self.0.drivers.fetch_sub(1, Ordering::AcqRel);
            // Whatever is still in flight or awaited goes on without us.
            if self.0.busy() {
                self.0.nudge_progress();
            }
        }
    }
    shared.drivers.fetch_add(1, Ordering::AcqRel);
    let _driving = Driving(shared);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    // As the progress thread: spin while events come, then, after
    // BUSY_SPIN without one, poll every BUSY_POLL (the waker unparks).
    let mut quiet = 0u32;
    let mut quiet_since: Option<Instant> = None;
    let mut drowsy = false;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Ok(v);
        }
        if let Some((at, after)) = started {
            if quiet.is_multiple_of(64) && at.elapsed() > after {
                return Err(TransferError::TimedOut { after });
            }
        }
        if transport.progress() > 0 {
            quiet = 0;
            quiet_since = None;
            drowsy = false;
            continue;
        }
        quiet = quiet.wrapping_add(1);
        if quiet.is_multiple_of(64) {
            drowsy = quiet_since.get_or_insert_with(Instant::now).elapsed() > BUSY_SPIN;
        }
        if drowsy {
            std::thread::park_timeout(BUSY_POLL);
        } else {
            std::thread::yield_now();
        }
    }
}
