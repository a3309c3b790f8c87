//! Requests: write, read and flush, each a request to test, wait for and
//! free.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use uct_transfer::{OpFuture, TransferError};

use crate::error::{call, CallResult, CapiError};
use crate::ffi::Out;
use crate::handle::{Kind, Table};
use crate::memory::{MemEntry, UctRsView, VIEWS};
use crate::remote::{UctRsRemote, REMOTES};
use crate::status::Status;
use crate::transport::{TransportCell, UctRsTransport, TRANSPORTS};

/// A request (opaque): a write, read or flush in flight or done.
pub struct UctRsRequest {
    _opaque: [u8; 0],
}

/// `uct_rs_write` flag: notify the peer, whose next `uct_rs_wait_for_write`
/// then returns this write's length and tag once its bytes have landed.
pub const UCT_RS_WRITE_NOTIFY: u32 = 1;

/// The longest a wait holds a transport before it looks again whether the
/// transport is being destroyed.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// The timeout of a wait: `None` for ever.
pub(crate) fn timeout_of(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

struct ReqState {
    /// The operation's future; out while a wait polls it.
    fut: Option<OpFuture>,
    result: Option<Result<(), TransferError>>,
}

/// An operation, as its request and the memory it uses see it.
pub(crate) struct ReqCore {
    state: Mutex<ReqState>,
    transport: Weak<TransportCell>,
}

fn lock(m: &Mutex<ReqState>) -> MutexGuard<'_, ReqState> {
    // Poisoned only by a panic while it was held; the state is whole.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Polls `fut` once, with a waker that does nothing: whoever completes the
/// operation stores its result, which the next poll takes.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

impl ReqCore {
    fn new(fut: OpFuture, cell: &Arc<TransportCell>) -> ReqCore {
        let mut state = ReqState {
            fut: Some(fut),
            result: None,
        };
        if state.fut.as_ref().is_some_and(OpFuture::is_done) {
            // Completed inside the post (most writes over shared memory).
            if let Some(Poll::Ready(r)) = state.fut.as_mut().map(poll_once) {
                state.result = Some(r);
                state.fut = None;
            }
        }
        ReqCore {
            state: Mutex::new(state),
            transport: Arc::downgrade(cell),
        }
    }

    /// The error of an operation that failed as it was posted.
    fn failed_at_once(&self) -> Option<TransferError> {
        match &lock(&self.state).result {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        }
    }

    /// Whether the operation may still touch its memory. A request that a
    /// wait is polling counts as pending.
    pub(crate) fn pending(&self) -> bool {
        let s = lock(&self.state);
        s.result.is_none() && s.fut.as_ref().is_none_or(|f| !f.is_done())
    }

    fn transport(&self) -> Option<(Arc<uct_transfer::Transport>, bool)> {
        let cell = self.transport.upgrade()?;
        let t = cell.get().ok()?;
        Some((t, cell.manual))
    }

    /// The result if the operation is done, after one turn of progress
    /// where the caller drives it.
    fn test(&self) -> Option<Result<(), TransferError>> {
        if let Some((t, true)) = self.transport() {
            t.progress();
        }
        let mut s = lock(&self.state);
        if let Some(r) = &s.result {
            return Some(r.clone());
        }
        // Out with a wait of another thread: not done as far as we know.
        let fut = s.fut.as_mut()?;
        match poll_once(fut) {
            Poll::Ready(r) => {
                s.result = Some(r.clone());
                s.fut = None;
                Some(r)
            }
            Poll::Pending => None,
        }
    }

    /// Waits for the result, driving progress, up to `limit` (`None`: for
    /// ever), in slices of at most [`SLICE`] that let a destroy through.
    pub(crate) fn wait(&self, limit: Option<Duration>) -> Result<(), TransferError> {
        let start = Instant::now();
        loop {
            let fut = {
                let mut s = lock(&self.state);
                if let Some(r) = &s.result {
                    return r.clone();
                }
                s.fut.take()
            };
            let left = limit.map(|l| l.saturating_sub(start.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            match fut {
                // Another thread waits on it: its result lands in the state.
                None => std::thread::sleep(Duration::from_millis(1).min(slice)),
                Some(mut fut) => {
                    // A panic while polling must not leave the request
                    // pending with its future gone: it resolves it.
                    let guard = PanicGuard(&self.state);
                    let outcome = match self.transport() {
                        Some((t, _)) => t.wait_within(&mut fut, slice).ok(),
                        // Destroyed: the operation is resolved by now, or
                        // once the destroy in flight has closed it.
                        None => match poll_once(&mut fut) {
                            Poll::Ready(r) => Some(r),
                            Poll::Pending => {
                                std::thread::sleep(Duration::from_millis(1).min(slice));
                                None
                            }
                        },
                    };
                    std::mem::forget(guard);
                    let mut s = lock(&self.state);
                    match outcome {
                        Some(r) => {
                            s.result = Some(r.clone());
                            return r;
                        }
                        None => s.fut = Some(fut),
                    }
                }
            }
            if let Some(l) = limit.filter(|l| start.elapsed() >= *l) {
                return Err(TransferError::TimedOut { after: l });
            }
        }
    }
}

/// Resolves a request whose future panicked while a wait polled it; a
/// polled-after-panic future is not polled again.
struct PanicGuard<'a>(&'a Mutex<ReqState>);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        let mut s = lock(self.0);
        if s.result.is_none() {
            s.result = Some(Err(TransferError::Panicked {
                what: "an operation panicked while a wait polled it".into(),
            }));
        }
    }
}

pub(crate) static REQUESTS: LazyLock<Table<ReqCore>> = LazyLock::new(|| Table::new(Kind::Request));

/// Posts an operation from `local` and returns its request: an error of
/// the post itself (lengths, rights, state) is returned, with no request.
fn post(
    transport: *mut UctRsTransport,
    local: Option<(*mut UctRsView, *mut UctRsRemote)>,
    op: impl FnOnce(
        &uct_transfer::Transport,
        Option<(&uct_transfer::View, &uct_transfer::RemoteBuffer)>,
    ) -> OpFuture,
    out: Out<*mut UctRsRequest>,
) -> CallResult {
    let cell = TRANSPORTS.get(transport, "transport")?;
    let t = cell.get()?;
    let core = match local {
        None => Arc::new(ReqCore::new(op(&t, None), &cell)),
        Some((view, remote)) => {
            let view = VIEWS.get(view, "local")?;
            let remote = REMOTES.get(remote, "remote")?;
            let mem: Arc<MemEntry> = view.memory()?;
            // The memory cannot be freed between the post and its entry.
            let mut users = mem.users()?;
            let v = mem.mem.view(view.offset, view.len)?;
            let core = Arc::new(ReqCore::new(op(&t, Some((&v, &remote.buf))), &cell));
            if core.pending() {
                users.track(core.clone());
            }
            core
        }
    };
    if let Some(e) = core.failed_at_once() {
        return Err(e.into());
    }
    out.set(REQUESTS.insert(core)?);
    Ok(Status::UCT_RS_OK)
}

/// Writes `local` to `remote` (a remote buffer or slice of the same
/// length), zero-copy. With `UCT_RS_WRITE_NOTIFY` in `flags`, the peer's
/// next `uct_rs_wait_for_write` returns `tag` and the length once the bytes
/// have landed (`tag` is ignored without it). The request completes once
/// the write has landed at the peer: then `local` may be changed. An error
/// found at once (lengths, rights, not connected) is returned and makes no
/// request; later errors come from the request.
///
/// Ownership: `*request` is the caller's, to free with
/// `uct_rs_request_free`; `local`'s memory cannot be freed until the
/// request has completed (`UCT_RS_ERR_BUSY`). Thread-safe: several threads
/// may write at once; writes are posted in the order the calls are made.
///
/// # Safety
/// `request` is NULL (refused) or points to a writable
/// `uct_rs_request *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_write(
    transport: *mut UctRsTransport,
    local: *mut UctRsView,
    remote: *mut UctRsRemote,
    flags: u32,
    tag: u32,
    request: *mut *mut UctRsRequest,
) -> Status {
    call("uct_rs_write", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(request, "request") }?;
        if flags & !UCT_RS_WRITE_NOTIFY != 0 {
            return Err(CapiError::Argument(format!(
                "flags {flags:#x} has unknown bits; pass 0 or UCT_RS_WRITE_NOTIFY"
            )));
        }
        let notify = flags & UCT_RS_WRITE_NOTIFY != 0;
        post(
            transport,
            Some((local, remote)),
            |t, parts| match parts {
                Some((v, r)) if notify => t.write_tagged(v, r, tag),
                Some((v, r)) => t.write(v, r, false),
                None => t.flush(),
            },
            out,
        )
    })
}

/// Reads `remote` (a remote buffer or slice) into `local` of the same
/// length. The request completes once the bytes are in `local`.
///
/// Ownership: as `uct_rs_write`. Thread-safe.
///
/// # Safety
/// `request` is NULL (refused) or points to a writable
/// `uct_rs_request *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_read(
    transport: *mut UctRsTransport,
    local: *mut UctRsView,
    remote: *mut UctRsRemote,
    request: *mut *mut UctRsRequest,
) -> Status {
    call("uct_rs_read", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(request, "request") }?;
        post(
            transport,
            Some((local, remote)),
            |t, parts| match parts {
                Some((v, r)) => t.read(v, r),
                None => t.flush(),
            },
            out,
        )
    })
}

/// A request that completes once every write and read posted before it
/// has completed at the peer.
///
/// Ownership: `*request` is the caller's, to free with
/// `uct_rs_request_free`. Thread-safe.
///
/// # Safety
/// `request` is NULL (refused) or points to a writable
/// `uct_rs_request *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_flush(
    transport: *mut UctRsTransport,
    request: *mut *mut UctRsRequest,
) -> Status {
    call("uct_rs_flush", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(request, "request") }?;
        post(transport, None, |t, _| t.flush(), out)
    })
}

fn outcome(r: Option<Result<(), TransferError>>) -> CallResult {
    match r {
        None => Ok(Status::UCT_RS_IN_PROGRESS),
        Some(Ok(())) => Ok(Status::UCT_RS_OK),
        Some(Err(e)) => Err(e.into()),
    }
}

/// Whether the request has completed, without blocking: `UCT_RS_OK`,
/// `UCT_RS_IN_PROGRESS` (test again), or the operation's error (the
/// message in `uct_rs_last_error`). With `UCT_RS_PROGRESS_MANUAL` it
/// drives progress once first. Once complete, every later test gives the
/// same status.
///
/// Ownership: nothing changes hands. Thread-safe.
#[no_mangle]
pub extern "C" fn uct_rs_request_test(request: *mut UctRsRequest) -> Status {
    call("uct_rs_request_test", || {
        outcome(REQUESTS.get(request, "request")?.test())
    })
}

/// Waits until the request has completed, at most `timeout_ms`
/// milliseconds (negative: for ever; 0: test once), driving progress
/// meanwhile. Gives `UCT_RS_OK`, the operation's error, or
/// `UCT_RS_ERR_TIMED_OUT` (the operation goes on: wait again). A request
/// whose transport is destroyed ends with `UCT_RS_ERR_CLOSED`.
///
/// Ownership: nothing changes hands. Thread-safe: several threads may
/// wait on one request.
#[no_mangle]
pub extern "C" fn uct_rs_request_wait(request: *mut UctRsRequest, timeout_ms: i64) -> Status {
    call("uct_rs_request_wait", || {
        let core = REQUESTS.get(request, "request")?;
        match timeout_of(timeout_ms) {
            Some(Duration::ZERO) => match core.test() {
                None => Err(TransferError::TimedOut {
                    after: Duration::ZERO,
                }
                .into()),
                done => outcome(done),
            },
            limit => outcome(Some(core.wait(limit))),
        }
    })
}

/// Frees the request. A request still in flight goes on (an operation
/// cannot be called back); its memory stays busy until it completes,
/// which only the transport then sees (or its destroy ends).
///
/// Ownership: the handle is invalid afterwards. Thread-safe.
#[no_mangle]
pub extern "C" fn uct_rs_request_free(request: *mut UctRsRequest) -> Status {
    call("uct_rs_request_free", || {
        REQUESTS.remove(request, "request")?;
        Ok(Status::UCT_RS_OK)
    })
}
