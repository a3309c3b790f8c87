//! Notifications of the peer's notified writes: a blocking wait with a
//! timeout, and a test that does not block.

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use uct_transfer::{Notification, TransferError};

use crate::error::{call, CallResult};
use crate::ffi::Out;
use crate::request::{timeout_of, SLICE};
use crate::status::Status;
use crate::transport::{TransportCell, UctRsTransport, TRANSPORTS};

/// What a notified write tells its receiver.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UctRsNotification {
    /// Bytes the write carried: on rc as the NIC counted them, elsewhere
    /// as the writer says. Check it against your buffer before using it.
    pub length: usize,
    /// The writer's tag (0 for a write without one).
    pub tag: u32,
}

fn deliver(n: Notification, out: Out<UctRsNotification>) -> CallResult {
    out.set(UctRsNotification {
        length: n.len,
        tag: n.tag,
    });
    Ok(Status::UCT_RS_OK)
}

/// One look for a notification, after a turn of progress where the caller
/// drives it.
fn test(cell: &TransportCell) -> Result<Option<Notification>, crate::error::CapiError> {
    let t = cell.get()?;
    if cell.manual {
        t.progress();
    }
    let mut w = t.wait_for_write();
    let polled = std::pin::Pin::new(&mut w)
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    // A wait dropped pending takes nothing with it.
    match polled {
        Poll::Ready(r) => Ok(Some(r?)),
        Poll::Pending => Ok(None),
    }
}

/// Waits for the peer's next notified write, at most `timeout_ms`
/// milliseconds (negative: for ever; 0: look once), driving progress
/// meanwhile, and puts its length and tag in `*notification`.
/// Notifications come in the order the peer's writes were made; each is
/// returned once. Gives `UCT_RS_ERR_TIMED_OUT` when none came (a later
/// wait gets the next one), `UCT_RS_ERR_PEER_FAILED` once the peer died
/// and the notifications that came before were taken,
/// `UCT_RS_ERR_CLOSED` if the transport is destroyed meanwhile.
///
/// Ownership: the caller owns `*notification`. Thread-safe: several
/// threads may wait; each notification goes to one of them.
///
/// # Safety
/// `notification` is NULL (refused) or points to a writable
/// `uct_rs_notification`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_wait_for_write(
    transport: *mut UctRsTransport,
    timeout_ms: i64,
    notification: *mut UctRsNotification,
) -> Status {
    call("uct_rs_wait_for_write", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(notification, "notification") }?;
        let cell = TRANSPORTS.get(transport, "transport")?;
        let limit = timeout_of(timeout_ms);
        if limit == Some(Duration::ZERO) {
            return match test(&cell)? {
                Some(n) => deliver(n, out),
                None => Err(TransferError::TimedOut {
                    after: Duration::ZERO,
                }
                .into()),
            };
        }
        let start = Instant::now();
        let mut w = cell.get()?.wait_for_write();
        loop {
            let left = limit.map(|l| l.saturating_sub(start.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            // Between slices the transport is given back, so that a
            // destroy in another thread goes through (and this wait then
            // ends with UCT_RS_ERR_CLOSED).
            let t = cell.get()?;
            if let Ok(r) = t.wait_within(&mut w, slice) {
                return deliver(r?, out);
            }
            drop(t);
            if let Some(l) = limit.filter(|l| start.elapsed() >= *l) {
                return Err(TransferError::TimedOut { after: l }.into());
            }
        }
    })
}

/// Takes the peer's next notified write if one has come, without
/// blocking: `UCT_RS_OK` with `*notification` filled, or
/// `UCT_RS_IN_PROGRESS` when none has (nothing is taken). With
/// `UCT_RS_PROGRESS_MANUAL` it drives progress once first.
///
/// Ownership: the caller owns `*notification`. Thread-safe.
///
/// # Safety
/// `notification` is NULL (refused) or points to a writable
/// `uct_rs_notification`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_test_for_write(
    transport: *mut UctRsTransport,
    notification: *mut UctRsNotification,
) -> Status {
    call("uct_rs_test_for_write", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(notification, "notification") }?;
        let cell = TRANSPORTS.get(transport, "transport")?;
        match test(&cell)? {
            Some(n) => deliver(n, out),
            None => Ok(Status::UCT_RS_IN_PROGRESS),
        }
    })
}
