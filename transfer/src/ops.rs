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

type WaitCell = Mutex<Cell<Result<Notification>>>;

/// Notifications that arrived and the waits that want them, each in order.
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    /// Waits registered and not resolved: the progress thread spins while
    /// there are any.
    waiting: AtomicUsize,
    /// Set when a peer sent more notifications than anyone waited for.
    overflowed: AtomicBool,
}

struct InboxState {
    arrived: VecDeque<Notification>,
    waiters: VecDeque<Arc<WaitCell>>,
    failed: Option<TransferError>,
}

/// Notifications kept for waits not yet made: a peer that sends more is
/// flooding, and the connection fails.
pub(crate) const MAX_BACKLOG: usize = 1 << 20;

impl Inbox {
    pub(crate) fn new() -> Arc<Inbox> {
        Arc::new(Inbox {
            state: Mutex::new(InboxState {
                arrived: VecDeque::new(),
                waiters: VecDeque::new(),
                failed: None,
            }),
            waiting: AtomicUsize::new(0),
            overflowed: AtomicBool::new(false),
        })
    }

    /// A notification arrived: to the oldest wait, or kept for the next.
    pub(crate) fn deliver(&self, n: Notification) {
        let mut s = lock(&self.state);
        if s.failed.is_some() {
            return;
        }
        while let Some(w) = s.waiters.pop_front() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            if fill(&w, Ok(n)) {
                return;
            }
        }
        if s.arrived.len() >= MAX_BACKLOG {
            self.overflowed.store(true, Ordering::Release);
            return;
        }
        s.arrived.push_back(n);
    }

    /// Whether the peer flooded notifications past [`MAX_BACKLOG`].
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
        let mut s = lock(&self.state);
        s.failed.get_or_insert_with(|| err.clone());
        while let Some(w) = s.waiters.pop_front() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            fill(&w, Err(err.clone()));
        }
    }

    /// A notification a wait was given but dropped without taking: to the
    /// oldest wait still pending, or back to the front of the queue (it is
    /// older than anything there).
    fn give_back(&self, n: Notification) {
        loop {
            let next = {
                let mut s = lock(&self.state);
                match s.waiters.pop_front() {
                    Some(w) => {
                        self.waiting.fetch_sub(1, Ordering::Relaxed);
                        w
                    }
                    None => {
                        s.arrived.push_front(n);
                        return;
                    }
                }
            };
            // Filled outside the inbox lock: a dropped wait's cell is
            // closed and refuses it, and the next is tried.
            if fill(&next, Ok(n)) {
                return;
            }
        }
    }

    /// Takes a wait that was dropped unresolved out of the queue, so that
    /// it no longer counts as waiting.
    fn forget(&self, cell: &Arc<WaitCell>) {
        let mut s = lock(&self.state);
        if let Some(i) = s.waiters.iter().position(|w| Arc::ptr_eq(w, cell)) {
            s.waiters.remove(i);
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The next notification, as a future.
    pub(crate) fn wait(self: &Arc<Self>) -> WaitForWrite {
        let cell = Arc::new(Cell::new());
        let mut s = lock(&self.state);
        if let Some(n) = s.arrived.pop_front() {
            fill(&cell, Ok(n));
        } else if let Some(e) = &s.failed {
            fill(&cell, Err(e.clone()));
        } else {
            s.waiters.push_back(cell.clone());
            self.waiting.fetch_add(1, Ordering::Relaxed);
        }
        WaitForWrite {
            cell,
            inbox: Arc::downgrade(self),
            nudger: Nudger::default(),
        }
    }

    /// [`wait`](Self::wait), nudging `nudge` when it starts waiting.
    pub(crate) fn wait_nudging(self: &Arc<Self>, nudge: Weak<dyn Nudge>) -> WaitForWrite {
        let mut w = self.wait();
        w.nudger.to = Some(nudge);
        w
    }
}

/// The future of [`Transport::wait_for_write`](crate::Transport::wait_for_write):
/// the next notification, in the order the peer's notified writes were
/// made. Waits are served in the order they were made; dropping one gives
/// its place up, and a notification it was given but did not return goes
/// to the next wait (a timeout around a wait loses nothing).
#[must_use = "a wait does nothing unless awaited"]
pub struct WaitForWrite {
    cell: Arc<WaitCell>,
    inbox: Weak<Inbox>,
    nudger: Nudger,
}

impl WaitForWrite {
    /// Whether the wait has resolved.
    pub fn is_done(&self) -> bool {
        let c = lock(&self.cell);
        c.result.is_some() || c.closed
    }
}

impl Future for WaitForWrite {
    type Output = Result<Notification>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Notification>> {
        let this = self.get_mut();
        let r = poll_cell(&this.cell, cx, polled_again);
        if r.is_pending() {
            this.nudger.pending();
        }
        r
    }
}

impl Drop for WaitForWrite {
    fn drop(&mut self) {
        // Closed: a delivery racing with this skips the cell and hands its
        // notification on. The cell lock is released before the inbox's is
        // taken (deliver takes them the other way round).
        let (pending, untaken) = {
            let mut c = lock(&self.cell);
            let pending = c.result.is_none() && !c.closed;
            c.closed = true;
            (pending, c.result.take())
        };
        let Some(inbox) = self.inbox.upgrade() else {
            return;
        };
        if pending {
            inbox.forget(&self.cell);
        } else if let Some(Ok(n)) = untaken {
            // Given a notification, dropped before taking it (a timeout
            // that fired as it came): it goes to the next wait, not lost.
            inbox.give_back(n);
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

    #[test]
    fn notifications_go_to_waits_in_order() {
        let inbox = Inbox::new();
        let w1 = inbox.wait();
        let w2 = inbox.wait();
        assert!(inbox.has_waiters());
        inbox.deliver(Notification { len: 1, tag: 1 });
        inbox.deliver(Notification { len: 2, tag: 2 });
        inbox.deliver(Notification { len: 3, tag: 3 });
        assert!(!inbox.has_waiters());
        assert_eq!(block_on(w1).unwrap().tag, 1);
        assert_eq!(block_on(w2).unwrap().tag, 2);
        assert_eq!(block_on(inbox.wait()).unwrap().tag, 3);
    }

    #[test]
    fn a_dropped_wait_gives_its_place_up() {
        let inbox = Inbox::new();
        let w1 = inbox.wait();
        let w2 = inbox.wait();
        drop(w1);
        // Dropped unresolved: no longer counted as waiting.
        assert_eq!(inbox.waiting.load(Ordering::Relaxed), 1);
        inbox.deliver(Notification { len: 7, tag: 7 });
        assert_eq!(block_on(w2).unwrap().tag, 7);
        assert!(!inbox.has_waiters());
        let w3 = inbox.wait();
        drop(w3);
        assert!(
            !inbox.has_waiters(),
            "a timed-out wait keeps progress spinning"
        );
    }

    #[test]
    fn a_notification_given_to_a_dropped_wait_goes_to_the_next() {
        let inbox = Inbox::new();
        let w1 = inbox.wait();
        let w2 = inbox.wait();
        inbox.deliver(Notification { len: 1, tag: 1 });
        // w1 was given tag 1 and is dropped before it is polled.
        drop(w1);
        inbox.deliver(Notification { len: 2, tag: 2 });
        assert_eq!(block_on(w2).unwrap().tag, 1);
        assert_eq!(block_on(inbox.wait()).unwrap().tag, 2);
        // With no wait pending, it goes back to the front of the queue.
        let w3 = inbox.wait();
        inbox.deliver(Notification { len: 3, tag: 3 });
        inbox.deliver(Notification { len: 4, tag: 4 });
        drop(w3);
        assert_eq!(block_on(inbox.wait()).unwrap().tag, 3);
        assert_eq!(block_on(inbox.wait()).unwrap().tag, 4);
    }

    #[test]
    fn failure_ends_pending_waits_after_what_arrived() {
        let inbox = Inbox::new();
        inbox.deliver(Notification { len: 1, tag: 1 });
        let w = inbox.wait();
        let pending = {
            // Taken already: the next wait is pending.
            assert!(w.is_done());
            inbox.wait()
        };
        inbox.fail(&TransferError::Closed);
        assert_eq!(block_on(w).unwrap().tag, 1);
        assert_eq!(block_on(pending), Err(TransferError::Closed));
        assert_eq!(block_on(inbox.wait()), Err(TransferError::Closed));
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
