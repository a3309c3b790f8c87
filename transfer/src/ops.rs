//! The futures: one for each write, read, batch or flush ([`OpFuture`]),
//! and one for each notification awaited ([`WaitForWrite`]). Plain
//! `std::future::Future`s: whoever completes an operation (the progress
//! thread, or the caller's `progress()` in manual mode) wakes the task that
//! waits for it, on whatever executor it runs.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use crate::error::{Result, TransferError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a waker panicked; the state is intact.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A result, once, and the waker of whoever waits for it.
struct Cell<T> {
    result: Option<T>,
    waker: Option<Waker>,
    /// The result was taken by a poll, or the future dropped unresolved.
    closed: bool,
}

impl<T> Cell<T> {
    fn new() -> Mutex<Cell<T>> {
        Mutex::new(Cell {
            result: None,
            waker: None,
            closed: false,
        })
    }
}

/// Stores the first result given; false when one was given before or the
/// future is gone.
fn fill<T>(cell: &Mutex<Cell<T>>, value: T) -> bool {
    let waker = {
        let mut c = lock(cell);
        if c.result.is_some() || c.closed {
            return false;
        }
        c.result = Some(value);
        c.waker.take()
    };
    if let Some(w) = waker {
        crate::shared::wake(w);
    }
    true
}

fn poll_cell<T>(cell: &Mutex<Cell<T>>, cx: &mut Context<'_>, gone: impl FnOnce() -> T) -> Poll<T> {
    let mut c = lock(cell);
    if let Some(r) = c.result.take() {
        c.closed = true;
        return Poll::Ready(r);
    }
    if c.closed {
        // Polled again after it resolved.
        return Poll::Ready(gone());
    }
    match &mut c.waker {
        Some(w) if w.will_wake(cx.waker()) => {}
        slot => *slot = Some(cx.waker().clone()),
    }
    Poll::Pending
}

/// What a future tells when it starts waiting: the progress thread then
/// spins, unless a caller drives progress itself. Told on the first
/// pending poll, not when the operation is made, so that a caller in
/// `Transport::wait` never wakes a thread that would only fight it.
pub(crate) trait Nudge: Send + Sync {
    fn nudge(&self);
}

/// Nudges once, on the first pending poll.
#[derive(Default)]
struct Nudger {
    to: Option<Weak<dyn Nudge>>,
    done: bool,
}

impl Nudger {
    fn pending(&mut self) {
        if !self.done {
            self.done = true;
            if let Some(n) = self.to.as_ref().and_then(Weak::upgrade) {
                n.nudge();
            }
        }
    }
}

fn polled_again<T>() -> Result<T> {
    Err(TransferError::PolledAgain)
}

/// Where an operation's result lands; `.1`: whether it was entered in the
/// Transport's table of pending operations (most are not: they complete
/// inside the post).
pub(crate) struct Slot(Mutex<Cell<Result<()>>>, AtomicBool);

impl Slot {
    pub(crate) fn new() -> Arc<Slot> {
        Arc::new(Slot(Cell::new(), AtomicBool::new(false)))
    }

    /// Marks the slot as entered in the table.
    pub(crate) fn set_tabled(&self) {
        self.1.store(true, Ordering::Release);
    }

    /// Whether the slot was entered in the table.
    pub(crate) fn tabled(&self) -> bool {
        self.1.load(Ordering::Acquire)
    }

    /// Whether the operation has resolved.
    pub(crate) fn is_done(&self) -> bool {
        let c = lock(&self.0);
        c.result.is_some() || c.closed
    }

    /// Resolves the operation; later results are ignored.
    pub(crate) fn complete(&self, result: Result<()>) {
        fill(&self.0, result);
    }
}

/// The future of a write, read, batch or flush: resolves once the
/// operation completed, with its error if it failed. The operation was
/// posted (or queued, past the depth) when the future was made: dropping
/// the future does not cancel it.
#[must_use = "the operation runs anyway; await the future to learn whether it succeeded"]
pub struct OpFuture {
    slot: Arc<Slot>,
    nudger: Nudger,
}

impl OpFuture {
    pub(crate) fn new(slot: Arc<Slot>, nudge: Weak<dyn Nudge>) -> OpFuture {
        OpFuture {
            slot,
            nudger: Nudger {
                to: Some(nudge),
                done: false,
            },
        }
    }

    /// A future that is resolved already.
    pub(crate) fn ready(result: Result<()>) -> OpFuture {
        let slot = Slot::new();
        slot.complete(result);
        OpFuture {
            slot,
            nudger: Nudger::default(),
        }
    }

    /// Whether the operation has completed (the future will be ready).
    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }
}

impl Future for OpFuture {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let r = poll_cell(&this.slot.0, cx, polled_again);
        if r.is_pending() {
            this.nudger.pending();
        }
        r
    }
}

/// What a notified write tells its receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// Bytes the write carried: on rc as the NIC counted them; elsewhere as
    /// the writer says, unchecked. Check it against your buffer before
    /// using it as a length.
    pub len: usize,
    /// The tag the writer chose (`write_tagged`); 0 for `write(.., true)`.
    pub tag: u32,
}

/// Notifications that arrived, and the waits that are waiting for one.
/// A wait takes the oldest notification when it is polled, so that the
/// application sees them in the order the writes were made, whichever of
/// its waits it polls, and a wait that is dropped (a timeout) takes
/// nothing with it.
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    /// Waits polled and pending: the progress thread spins while there
    /// are any.
    waiting: AtomicUsize,
    /// Set when a peer sent more notifications than the backlog holds.
    overflowed: AtomicBool,
    /// The most notifications kept for waits not yet made.
    backlog: usize,
}

struct InboxState {
    arrived: VecDeque<Notification>,
    /// Pending waits, by id, in the order they first waited.
    waiters: VecDeque<(u64, Waker)>,
    next_id: u64,
    failed: Option<TransferError>,
}

/// Notifications kept by default for waits not yet made: a peer that sends
/// more is flooding (or the application does not wait), and the connection
/// fails.
pub(crate) const MAX_BACKLOG: usize = 1 << 20;

impl Inbox {
    pub(crate) fn new(backlog: usize) -> Arc<Inbox> {
        Arc::new(Inbox {
            state: Mutex::new(InboxState {
                arrived: VecDeque::new(),
                waiters: VecDeque::new(),
                next_id: 0,
                failed: None,
            }),
            waiting: AtomicUsize::new(0),
            overflowed: AtomicBool::new(false),
            backlog,
        })
    }

    /// The most notifications kept for waits not yet made.
    pub(crate) fn backlog(&self) -> usize {
        self.backlog
    }

    /// Removes and returns the oldest pending wait's waker.
    fn pop_waiter(&self, s: &mut InboxState) -> Option<Waker> {
        let (_, w) = s.waiters.pop_front()?;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        Some(w)
    }

    /// A notification arrived: queued, and the oldest pending wait woken
    /// to take it.
    pub(crate) fn deliver(&self, n: Notification) {
        let woken = {
            let mut s = lock(&self.state);
            if s.failed.is_some() {
                return;
            }
            if s.arrived.len() >= self.backlog {
                self.overflowed.store(true, Ordering::Release);
                return;
            }
            s.arrived.push_back(n);
            self.pop_waiter(&mut s)
        };
        if let Some(w) = woken {
            crate::shared::wake(w);
        }
    }

    /// Whether the peer flooded notifications past the backlog.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// Whether a wait is pending.
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Ends every pending wait, and every later one once the notifications
    /// that arrived before are taken, with `err`.
    pub(crate) fn fail(&self, err: &TransferError) {
        let woken: Vec<Waker> = {
            let mut s = lock(&self.state);
            s.failed.get_or_insert_with(|| err.clone());
            std::iter::from_fn(|| self.pop_waiter(&mut s)).collect()
        };
        for w in woken {
            crate::shared::wake(w);
        }
    }

    /// The next notification, as a future.
    pub(crate) fn wait(self: &Arc<Self>) -> WaitForWrite {
        let id = {
            let mut s = lock(&self.state);
            s.next_id += 1;
            s.next_id
        };
        WaitForWrite {
            inbox: self.clone(),
            id,
            done: false,
            nudger: Nudger::default(),
        }
    }

    /// [`wait`](Self::wait), nudging `nudge` when it starts waiting.
    pub(crate) fn wait_nudging(self: &Arc<Self>, nudge: Weak<dyn Nudge>) -> WaitForWrite {
        let mut w = self.wait();
        w.nudger.to = Some(nudge);
        w
    }

    /// Takes the oldest notification for wait `id`, or registers its waker.
    fn poll_wait(&self, id: u64, cx: &mut Context<'_>) -> Poll<Result<Notification>> {
        let mut s = lock(&self.state);
        let at = s.waiters.iter().position(|(w, _)| *w == id);
        if let Some(n) = s.arrived.pop_front() {
            if let Some(i) = at {
                s.waiters.remove(i);
                self.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            return Poll::Ready(Ok(n));
        }
        if let Some(e) = &s.failed {
            return Poll::Ready(Err(e.clone()));
        }
        match at {
            Some(i) => {
                if !s.waiters[i].1.will_wake(cx.waker()) {
                    s.waiters[i].1 = cx.waker().clone();
                }
            }
            None => {
                s.waiters.push_back((id, cx.waker().clone()));
                self.waiting.fetch_add(1, Ordering::Relaxed);
            }
        }
        Poll::Pending
    }

    /// Wait `id` is gone unresolved: out of the queue; if it was woken for
    /// a notification it did not take, the next wait is woken instead.
    fn forget(&self, id: u64) {
        let woken = {
            let mut s = lock(&self.state);
            let was_waiting = match s.waiters.iter().position(|(w, _)| *w == id) {
                Some(i) => {
                    s.waiters.remove(i);
                    self.waiting.fetch_sub(1, Ordering::Relaxed);
                    true
                }
                None => false,
            };
            if !was_waiting && !s.arrived.is_empty() {
                self.pop_waiter(&mut s)
            } else {
                None
            }
        };
        if let Some(w) = woken {
            crate::shared::wake(w);
        }
    }
}

/// The future of [`Transport::wait_for_write`](crate::Transport::wait_for_write):
/// the next notification, in the order the peer's notified writes were
/// made. It takes one when polled, so the application sees them in order
/// whichever of its waits it polls; dropping a wait (a timeout around it)
/// takes nothing with it.
#[must_use = "a wait does nothing unless awaited"]
pub struct WaitForWrite {
    inbox: Arc<Inbox>,
    id: u64,
    done: bool,
    nudger: Nudger,
}

impl Future for WaitForWrite {
    type Output = Result<Notification>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Notification>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(polled_again());
        }
        let r = this.inbox.poll_wait(this.id, cx);
        if r.is_ready() {
            this.done = true;
        } else {
            this.nudger.pending();
        }
        r
    }
}

impl Drop for WaitForWrite {
    fn drop(&mut self) {
        if !self.done {
            self.inbox.forget(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    struct NoNudge;
    impl Nudge for NoNudge {
        fn nudge(&self) {}
    }

    /// Polls once with a no-op waker.
    fn poll_once(w: &mut WaitForWrite) -> Poll<Result<Notification>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(w).poll(&mut cx)
    }

    #[test]
    fn waits_take_notifications_in_order_when_polled() {
        let inbox = Inbox::new(MAX_BACKLOG);
        let mut w1 = inbox.wait();
        let mut w2 = inbox.wait();
        assert!(poll_once(&mut w1).is_pending() && poll_once(&mut w2).is_pending());
        assert!(inbox.has_waiters());
        inbox.deliver(Notification { len: 1, tag: 1 });
        inbox.deliver(Notification { len: 2, tag: 2 });
        inbox.deliver(Notification { len: 3, tag: 3 });
        // Whichever wait is polled first gets the oldest.
        assert_eq!(block_on(w2).unwrap().tag, 1);
        assert_eq!(block_on(w1).unwrap().tag, 2);
        assert_eq!(block_on(inbox.wait()).unwrap().tag, 3);
        assert!(!inbox.has_waiters());
    }

    #[test]
    fn a_dropped_wait_takes_nothing_and_stops_counting() {
        let inbox = Inbox::new(MAX_BACKLOG);
        let mut w1 = inbox.wait();
        let mut w2 = inbox.wait();
        assert!(poll_once(&mut w1).is_pending() && poll_once(&mut w2).is_pending());
        // w1 is woken for tag 1 and dropped (a timeout) before it polls.
        inbox.deliver(Notification { len: 1, tag: 1 });
        drop(w1);
        inbox.deliver(Notification { len: 2, tag: 2 });
        assert_eq!(block_on(w2).unwrap().tag, 1);
        assert_eq!(block_on(inbox.wait()).unwrap().tag, 2);
        let mut w3 = inbox.wait();
        assert!(poll_once(&mut w3).is_pending());
        drop(w3);
        assert!(
            !inbox.has_waiters(),
            "a timed-out wait keeps progress spinning"
        );
    }

    #[test]
    fn a_wait_woken_for_a_notification_it_did_not_take_wakes_the_next() {
        struct Flag(AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let inbox = Inbox::new(MAX_BACKLOG);
        let (f1, f2) = (
            Arc::new(Flag(AtomicBool::new(false))),
            Arc::new(Flag(AtomicBool::new(false))),
        );
        let mut w1 = inbox.wait();
        let mut w2 = inbox.wait();
        let (k1, k2) = (Waker::from(f1.clone()), Waker::from(f2.clone()));
        assert!(Pin::new(&mut w1)
            .poll(&mut Context::from_waker(&k1))
            .is_pending());
        assert!(Pin::new(&mut w2)
            .poll(&mut Context::from_waker(&k2))
            .is_pending());
        inbox.deliver(Notification { len: 1, tag: 1 });
        assert!(f1.0.load(Ordering::Relaxed) && !f2.0.load(Ordering::Relaxed));
        drop(w1);
        assert!(f2.0.load(Ordering::Relaxed), "the next wait was not woken");
        assert_eq!(block_on(w2).unwrap().tag, 1);
    }

    #[test]
    fn failure_ends_waits_after_what_arrived() {
        let inbox = Inbox::new(MAX_BACKLOG);
        inbox.deliver(Notification { len: 1, tag: 1 });
        let w = inbox.wait();
        let mut pending = inbox.wait();
        inbox.fail(&TransferError::Closed);
        assert_eq!(block_on(w).unwrap().tag, 1);
        assert_eq!(block_on(&mut pending), Err(TransferError::Closed));
        assert_eq!(block_on(inbox.wait()), Err(TransferError::Closed));
        assert_eq!(block_on(pending), Err(TransferError::PolledAgain));
    }

    #[test]
    fn past_the_backlog_the_inbox_overflows() {
        let inbox = Inbox::new(2);
        for tag in 0..3 {
            inbox.deliver(Notification { len: 0, tag });
        }
        assert!(inbox.overflowed());
    }

    #[test]
    fn an_op_resolves_once_with_its_first_result() {
        let slot = Slot::new();
        let fut = OpFuture::new(slot.clone(), Weak::<NoNudge>::new());
        assert!(!fut.is_done());
        slot.complete(Err(TransferError::Closed));
        slot.complete(Ok(()));
        assert_eq!(block_on(fut), Err(TransferError::Closed));
    }
}
