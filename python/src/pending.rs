//! `Pending`: an operation or a wait of the transfer API, for Python. It is
//! both blockable (`.wait(timeout)`, which drives progress on the calling
//! thread with the GIL released) and awaitable from asyncio (`await`).
//!
//! An await polls the future only from its own task (`done()`, and
//! `_on_wake`, which polls with a waker of ours); the waker only asks the
//! dispatcher thread ([`crate::dispatch`]) to run the await's callback,
//! which wakes the task through its event loop. So a wait whose task was
//! cancelled never took a notification: `_cancel` then gives its place up
//! to the next wait, as a dropped wait of the transfer API does.
//!
//! The result is kept once it came, so that it can be read again; the
//! future behind it is polled by whoever waits, under one lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use uct_transfer::{Notification, TransferError, Transport};

use crate::dispatch::{self, Job, Orphan};
use crate::errors::{self, Kind};
use crate::hold::Held;

/// What a pending operation gives once resolved.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// A write, read or flush completed.
    Done,
    /// A notified write arrived.
    Note(Notification),
}

/// The future behind a `Pending`.
pub type BoxFuture = Pin<Box<dyn Future<Output = Result<Outcome, TransferError>> + Send>>;

/// How long a blocking wait runs with the GIL released before it looks at
/// Python's signals (Ctrl-C) again.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// What a Pending is, for its messages and for what cancelling does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// A write, read or flush: it goes on whatever happens to its Pending.
    Op(&'static str),
    /// A wait for a notified write: cancelled, it gives its place up.
    Wait,
}

impl What {
    fn name(self) -> &'static str {
        match self {
            What::Op(name) => name,
            What::Wait => "wait for a notified write",
        }
    }
}

struct State {
    fut: Option<BoxFuture>,
    result: Option<Result<Outcome, TransferError>>,
    /// The wait was cancelled before it took a notification.
    cancelled: bool,
    /// What asyncio awaits run when woken (each once).
    callbacks: Vec<Py<PyAny>>,
}

/// The shared part of a `Pending`: the future, its result, and what keeps
/// the memory it uses alive.
pub struct Inner {
    state: Mutex<State>,
    transport: Weak<Transport>,
    /// The application's memory the operation uses: kept until the
    /// operation resolved (by an orphan, if this goes first; see `Drop`).
    holds: Vec<Held>,
    what: What,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A poisoned lock means a poll panicked; the state is still whole.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wakes an asyncio await: asks the dispatcher to run its callbacks.
struct AsyncWake(Weak<Inner>);

impl Wake for AsyncWake {
    fn wake(self: Arc<Self>) {
        dispatch::send(Job::Wake(self.0.clone()));
    }
}

impl Inner {
    pub fn new(
        fut: BoxFuture,
        transport: &Arc<Transport>,
        holds: Vec<Held>,
        what: What,
    ) -> Arc<Inner> {
        Arc::new(Inner {
            state: Mutex::new(State {
                fut: Some(fut),
                result: None,
                cancelled: false,
                callbacks: Vec::new(),
            }),
            transport: Arc::downgrade(transport),
            holds,
            what,
        })
    }

    /// Polls the future with `cx` unless it resolved; whether it has (a
    /// cancelled wait counts as resolved).
    pub fn poll_with(&self, cx: &mut Context<'_>) -> bool {
        let mut s = lock(&self.state);
        if s.result.is_some() || s.cancelled {
            return true;
        }
        let Some(fut) = s.fut.as_mut() else {
            return false;
        };
        match fut.as_mut().poll(cx) {
            Poll::Ready(r) => {
                s.result = Some(r);
                // Dropped under our lock: a wait dropped after it resolved
                // gives nothing back, so nothing calls us back.
                s.fut = None;
                true
            }
            Poll::Pending => false,
        }
    }

    /// Polls with the dispatcher's waker, so that an asyncio await is woken
    /// when there is news; whether it resolved.
    pub fn arm(self: &Arc<Self>) -> bool {
        let waker = Waker::from(Arc::new(AsyncWake(Arc::downgrade(self))));
        self.poll_with(&mut Context::from_waker(&waker))
    }

    /// Whether an asyncio await is waiting for this.
    fn awaited(&self) -> bool {
        !lock(&self.state).callbacks.is_empty()
    }

    /// Every callback registered (the dispatcher's, on a wake).
    pub fn take_all_callbacks(&self) -> Vec<Py<PyAny>> {
        std::mem::take(&mut lock(&self.state).callbacks)
    }

    /// The callbacks to run, once resolved.
    fn take_callbacks_if_resolved(&self) -> Vec<Py<PyAny>> {
        let mut s = lock(&self.state);
        if s.result.is_some() || s.cancelled {
            std::mem::take(&mut s.callbacks)
        } else {
            Vec::new()
        }
    }

    /// The result, or None while pending; a cancelled wait's is an error.
    fn result(&self) -> Option<Result<Outcome, PyErr>> {
        // Copied out under the lock, made Python exceptions after it: that
        // attaches to Python (and may import), while other threads take
        // this lock holding the GIL.
        let (cancelled, result) = {
            let s = lock(&self.state);
            (s.cancelled, s.result.clone())
        };
        if cancelled {
            return Some(Err(errors::raise(
                Kind::Other,
                "this wait was cancelled (its await was); it took no notification: wait again",
            )));
        }
        result.map(|r| r.map_err(errors::to_py))
    }

    /// Blocks up to `limit`, driving progress on this thread; whether it
    /// resolved. Runs with the GIL released.
    fn block(self: &Arc<Self>, limit: Duration) -> bool {
        let poll = std::future::poll_fn(|cx| {
            if self.poll_with(cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        let resolved = match self.transport.upgrade() {
            Some(t) => t.wait_within(poll, limit).is_ok(),
            // The Transport is gone: dropping it resolved its operations
            // and waits (or is doing so on another thread).
            None => block_without_transport(self, limit),
        };
        if !resolved && self.awaited() {
            // Our waker replaced the dispatcher's: give it back.
            return self.arm();
        }
        resolved
    }
}

/// The future of the next notified write of `t`.
pub fn next_write(t: &Transport) -> BoxFuture {
    let wait = t.wait_for_write();
    Box::pin(async move { wait.await.map(Outcome::Note) })
}

impl Inner {
    /// A wait left pending with nobody waiting for it any more (a blocking
    /// wait that timed out, a `done()` that said no) steps out of line: its
    /// future is replaced by a fresh one that has not waited yet, so that
    /// the waker it left (of a thread that has moved on) is not the one a
    /// notification wakes while another wait, an await, sleeps. It takes
    /// its place in line again when next waited for.
    fn step_aside(self: &Arc<Self>) {
        if self.what != What::Wait || self.awaited() {
            return;
        }
        let Some(t) = self.transport.upgrade() else {
            return;
        };
        let old = {
            let mut s = lock(&self.state);
            if s.result.is_some() || s.cancelled || s.fut.is_none() {
                return;
            }
            s.fut.replace(next_write(&t))
        };
        // Dropped outside our lock: a wait woken for a notification it did
        // not take wakes the next one.
        drop(old);
    }
}

/// Polls `inner` until it resolves or `limit` passes, with nobody to drive
/// progress (the Transport is gone).
fn block_without_transport(inner: &Inner, limit: Duration) -> bool {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let start = Instant::now();
    loop {
        if inner.poll_with(&mut Context::from_waker(&waker)) {
            return true;
        }
        let Some(left) = limit.checked_sub(start.elapsed()) else {
            return false;
        };
        std::thread::park_timeout(left.min(Duration::from_millis(10)));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if s.result.is_some() || s.cancelled || self.holds.is_empty() {
            // Nothing of the application's is in use, or nothing more will
            // be: an operation goes on by itself, a wait gives its place up.
            return;
        }
        if let Some(fut) = s.fut.take() {
            // The application's memory stays held until the transport has
            // finished with it.
            dispatch::send(Job::Orphan(Orphan {
                fut,
                holds: std::mem::take(&mut self.holds),
            }));
        }
    }
}

/// Runs asyncio's callbacks (each hands the result to its event loop).
pub fn fire(py: Python<'_>, callbacks: Vec<Py<PyAny>>) {
    for cb in callbacks {
        if let Err(e) = cb.call0(py) {
            e.write_unraisable(py, None);
        }
    }
}

/// A notified write that arrived: its length and the writer's tag.
#[pyclass(frozen, name = "Notification", module = "uct_rs")]
pub struct PyNotification {
    note: Notification,
}

#[pymethods]
impl PyNotification {
    /// Bytes the write carried, as the writer says (on rc, as the NIC
    /// counted them): check it against your buffer before using it.
    #[getter]
    fn nbytes(&self) -> usize {
        self.note.len
    }

    /// The tag the writer chose (0 for a notified write without one).
    #[getter]
    fn tag(&self) -> u32 {
        self.note.tag
    }

    fn __repr__(&self) -> String {
        format!(
            "Notification(nbytes={}, tag={})",
            self.note.len, self.note.tag
        )
    }
}

/// An operation (write, read, flush) or a wait for a notified write, in
/// flight. Block on it with `wait(timeout)`, or `await` it from asyncio.
/// Dropping it does not cancel an operation: the memory it uses stays held
/// until the transport has finished with it.
#[pyclass(frozen, name = "Pending", module = "uct_rs")]
pub struct PyPending {
    pub inner: Arc<Inner>,
}

static AWAIT_HELPER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn to_python(py: Python<'_>, r: Result<Outcome, PyErr>) -> PyResult<Py<PyAny>> {
    match r? {
        Outcome::Done => Ok(py.None()),
        Outcome::Note(note) => Ok(Py::new(py, PyNotification { note })?.into_any()),
    }
}

/// Waits for `inner` up to `timeout` seconds (for ever with None), the GIL
/// released, looking at Python's signals every [`SIGNAL_CHECK`].
pub fn wait_for(py: Python<'_>, inner: &Arc<Inner>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
    let limit = match timeout {
        None => None,
        Some(t) if (0.0..1e9).contains(&t) => Some(Duration::from_secs_f64(t)),
        Some(t) => {
            return Err(errors::input(format!(
                "timeout {t} is not a duration; give seconds (0 or more), or None to wait for ever"
            )))
        }
    };
    let start = Instant::now();
    let noop = Waker::noop();
    // Most operations over shared memory are done before anyone waits.
    let mut resolved = inner.poll_with(&mut Context::from_waker(noop));
    if !resolved && inner.awaited() {
        resolved = inner.arm();
    }
    while !resolved {
        let left = match limit {
            None => SIGNAL_CHECK,
            Some(l) => match l.checked_sub(start.elapsed()) {
                Some(left) if !left.is_zero() => left.min(SIGNAL_CHECK),
                _ => {
                    inner.step_aside();
                    return Err(errors::raise(
                        Kind::Timeout,
                        format!(
                            "the {} did not complete within {:?}; the peer is stuck or slow (a dead one is reported as such)",
                            inner.what.name(),
                            limit.unwrap_or_default()
                        ),
                    ));
                }
            },
        };
        let inner2 = inner.clone();
        resolved = py.detach(move || inner2.block(left));
        if let Err(e) = py.check_signals() {
            inner.step_aside();
            return Err(e);
        }
    }
    fire(py, inner.take_callbacks_if_resolved());
    match inner.result() {
        Some(r) => to_python(py, r),
        None => Err(errors::raise(Kind::Other, "resolved without a result")),
    }
}

#[pymethods]
impl PyPending {
    /// Blocks until it completes (at most `timeout` seconds; None: for
    /// ever) with the GIL released, and returns its result: None for a
    /// write, read or flush, a Notification for a wait. Raises its error,
    /// or uct_rs.Timeout (the operation goes on; wait again).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        wait_for(py, &self.inner, timeout)
    }

    /// Whether it has completed (successfully or not).
    fn done(&self) -> bool {
        let resolved = self
            .inner
            .poll_with(&mut Context::from_waker(Waker::noop()));
        if resolved {
            return true;
        }
        if self.inner.awaited() {
            return self.inner.arm();
        }
        self.inner.step_aside();
        false
    }

    /// The result of a completed operation (as `wait` returns it); raises
    /// its error, or uct_rs.Error if it has not completed yet.
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.inner.result() {
            Some(r) => to_python(py, r),
            None => Err(errors::raise(
                Kind::Other,
                format!(
                    "the {} has not completed; wait() or await it first",
                    self.inner.what.name()
                ),
            )),
        }
    }

    /// Runs `callback()` (from any thread) when there may be news, at once
    /// if it completed: the hook of asyncio awaits, which then poll again
    /// with done().
    fn _on_wake(&self, py: Python<'_>, callback: Py<PyAny>) {
        lock(&self.inner.state).callbacks.push(callback);
        if self.inner.arm() {
            fire(py, self.inner.take_all_callbacks());
        }
    }

    /// The await of a wait was cancelled: unless it took a notification
    /// already, it gives its place up to the next wait. An operation goes
    /// on.
    fn _cancel(&self) {
        if self.inner.what != What::Wait {
            return;
        }
        let (fut, callbacks) = {
            let mut s = lock(&self.inner.state);
            if s.result.is_some() {
                return;
            }
            s.cancelled = true;
            (s.fut.take(), std::mem::take(&mut s.callbacks))
        };
        // Dropped outside our lock: a wait woken for a notification it did
        // not take wakes the next one.
        drop(fut);
        drop(callbacks);
    }

    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let helper = AWAIT_HELPER.get_or_try_init(py, || {
            py.import("uct_rs._aio")
                .and_then(|m| m.getattr("await_pending"))
                .map(Bound::unbind)
        })?;
        helper.bind(py).call1((slf,))
    }

    fn __repr__(&self) -> String {
        let state = match self.inner.result() {
            None => "pending".to_string(),
            Some(Ok(Outcome::Done)) => "done".to_string(),
            Some(Ok(Outcome::Note(n))) => format!("done, nbytes={} tag={}", n.len, n.tag),
            Some(Err(e)) => format!("failed: {e}"),
        };
        format!("<Pending {}: {state}>", self.inner.what.name())
    }
}
