//! What a Transport, its progress thread and its futures share: the phase
//! (candidates, connection, failure), the inbox of notifications, the table
//! of unresolved operations, and the counters that pace progress.
//!
//! A connection that fails, or a Transport that is dropped, closes its
//! endpoint and iface *before* any future resolves: once a future has
//! resolved, no transport touches its memory any more (an rc QP is
//! destroyed, a tcp socket closed), so the application may free it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::Waker;

use dashmap::DashMap;
use uct_core::{EpParams, Iface, MemoryDomain, MemoryType, UctError};

use crate::engine;
use crate::error::{Result, TransferError};
use crate::ops::{Inbox, Slot};
use crate::rails::Rails;
use crate::stats::Counters;
use crate::url::Offer;

thread_local! {
    /// Wakers to call once this thread has let go of the Transport's locks
    /// (an executor may poll, and so post, from inside `wake`).
    static DEFERRED: RefCell<Option<Vec<Waker>>> = const { RefCell::new(None) };
}

/// Wakes `w` now, or after the enclosing [`with_deferred_wakes`].
pub(crate) fn wake(w: Waker) {
    let w = DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        Some(list) => {
            list.push(w);
            None
        }
        None => Some(w),
    });
    if let Some(w) = w {
        w.wake();
    }
}

/// Runs `f` (which takes and releases the locks), then calls the wakers it
/// deferred, also when `f` panics (a thread an executor reuses after a
/// caught panic must not keep deferring wakes for ever).
pub(crate) fn with_deferred_wakes<R>(f: impl FnOnce() -> R) -> R {
    /// The outermost call's duty: restore "not deferring" and wake.
    struct Outer;
    impl Drop for Outer {
        fn drop(&mut self) {
            let list = DEFERRED.with(|d| d.borrow_mut().take()).unwrap_or_default();
            for w in list {
                w.wake();
            }
        }
    }
    let outer = DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_some() {
            false
        } else {
            *d = Some(Vec::new());
            true
        }
    });
    // Lazily: an `Outer` made and dropped at once would wake early.
    let _outer = outer.then(|| Outer);
    f()
}

/// A candidate transport, opened.
pub(crate) struct Open {
    // The endpoint drops before its iface.
    pub pending_ep: Option<Box<dyn uct_core::Endpoint>>,
    pub iface: Box<dyn Iface>,
    pub component: String,
    pub md: Arc<dyn MemoryDomain>,
    pub mem_types: Vec<MemoryType>,
    /// Its rail: 0, or its place among the rails of the one transport.
    pub rail: usize,
}

impl Open {
    pub(crate) fn target(&self) -> RegTarget {
        RegTarget {
            transport: self.iface.transport().to_string(),
            md: self.md.clone(),
            mem_types: self.mem_types.clone(),
            rail: self.rail,
        }
    }

    /// Whether bind() made this candidate an endpoint that a failed
    /// connect used up.
    pub(crate) fn spent(&self) -> bool {
        self.pending_ep.is_none()
            && !self
                .iface
                .attrs()
                .caps
                .contains(uct_core::Caps::CONNECT_TO_IFACE)
    }

    /// An endpoint to the peer's `offer`: the one bind() made, connected to
    /// the peer's endpoint, or a new one to the peer's iface.
    pub(crate) fn connect(&mut self, offer: &Offer) -> Result<Box<dyn uct_core::Endpoint>> {
        let transport = self.iface.transport().to_string();
        let unreachable = |source| TransferError::PeerUnreachable {
            transport: transport.clone(),
            source,
        };
        let by_iface = self
            .iface
            .attrs()
            .caps
            .contains(uct_core::Caps::CONNECT_TO_IFACE);
        if by_iface {
            return self
                .iface
                .create_ep(EpParams::ToIface {
                    device_addr: offer.device_addr.clone(),
                    iface_addr: offer.iface_addr.clone(),
                })
                .map_err(unreachable);
        }
        let Some(addr) = &offer.ep_addr else {
            return Err(TransferError::BadUrl {
                why: format!("its {transport} offer has no endpoint address"),
            });
        };
        let mut ep = self.pending_ep.take().ok_or_else(|| {
            TransferError::Config(format!(
                "this side's {transport} endpoint went to a connect that failed; build a new Transport"
            ))
        })?;
        ep.connect_to_ep(&offer.device_addr, addr)
            .map_err(unreachable)?;
        Ok(ep)
    }
}

/// Sets the notification handlers of a candidate iface: immediates where it
/// has them, the notification message (with this side's token) where it
/// has active messages.
pub(crate) fn install_handlers(
    iface: &mut dyn Iface,
    inbox: &Arc<Inbox>,
    counters: &Arc<Counters>,
    token: u64,
) -> Result<()> {
    let caps = iface.attrs().caps;
    if caps.contains(uct_core::Caps::PUT_IMM) {
        let inbox = inbox.clone();
        let counters = counters.clone();
        iface.set_imm_handler(Box::new(move |ev| {
            Counters::add(&counters.recv_imm, 1);
            inbox.deliver(crate::Notification {
                len: ev.len,
                tag: ev.imm,
            })
        }))?;
    }
    if caps.contains(uct_core::Caps::AM_SHORT) {
        let inbox = inbox.clone();
        let counters = counters.clone();
        let transport = iface.transport().to_string();
        let mut dropped = 0u64;
        iface.set_am_handler(
            engine::NOTIFY_AM_ID,
            Box::new(move |msg| match engine::parse_notify(msg.data, token) {
                Some(n) => {
                    Counters::add(&counters.recv_msg, 1);
                    inbox.deliver(n)
                }
                None => {
                    // Not from our peer (no token, or another's), or not a
                    // notification at all: dropped, logged once.
                    dropped += 1;
                    if dropped == 1 {
                        log::warn!(
                            "transfer: {transport}: dropped a notification of {} bytes that does not carry this side's token (not from the connected peer, or malformed); later ones are dropped silently",
                            msg.data.len()
                        );
                    }
                }
            }),
        )?;
    }
    Ok(())
}

pub(crate) enum Phase {
    /// Built, maybe bound: the candidates.
    Open {
        cands: Vec<Open>,
        url: Option<String>,
    },
    /// Connected over one of them, on one rail or several (boxed: it is
    /// much larger than the other phases).
    Connected(Box<Rails>),
    /// The connection failed; its endpoint and iface are closed.
    Failed(TransferError),
    /// Dropped.
    Closed,
}

/// A memory domain memory is registered with, and what its transport moves.
#[derive(Clone)]
pub(crate) struct RegTarget {
    pub transport: String,
    pub md: Arc<dyn MemoryDomain>,
    pub mem_types: Vec<MemoryType>,
    /// The rail it serves: memory keys carry one bundle per rail.
    pub rail: usize,
}

/// What the Transport, its progress thread and its futures share.
pub(crate) struct Shared {
    pub phase: Mutex<Phase>,
    pub inbox: Arc<Inbox>,
    pub counters: Arc<Counters>,
    /// Every operation not yet resolved, so that a failure or a drop
    /// resolves them all, whatever the transport did with them.
    pub ops: DashMap<u64, Arc<Slot>>,
    pub next_id: AtomicU64,
    pub in_flight: Arc<AtomicUsize>,
    pub depth: usize,
    /// The largest piece a write or read is split in (a test seam).
    pub max_piece: usize,
    /// Rails of the connection (1 unless asked for more).
    pub rails: usize,
    /// The smallest write striped over several rails.
    pub stripe_min: usize,
    /// This side's notification token: in its URL, and in every
    /// notification message its peer sends.
    pub token: u64,
    pub stop: AtomicBool,
    /// Why the connection ended, once it has: operations the transport
    /// finishes while closing end with this, not with its own words.
    pub failure: OnceLock<TransferError>,
    failed: AtomicBool,
    /// Threads waiting for the lock to post: the progress thread yields.
    pub posters: AtomicUsize,
    /// Threads in `Transport::wait`, which drive progress themselves: the
    /// progress thread sleeps meanwhile instead of fighting them for the
    /// lock and the cores.
    pub drivers: AtomicUsize,
    pub connected: AtomicBool,
    /// Times the progress thread was woken: new work ends its drowsiness.
    pub nudges: AtomicU64,
    /// What bind() returned: it stays the URL after connect.
    pub url: OnceLock<String>,
    /// The transport connected over.
    pub chosen: OnceLock<String>,
    /// The rails' counts when the connection ended, for `Transport::rails`.
    pub last_rails: OnceLock<Vec<crate::stats::RailStats>>,
    pub thread: OnceLock<std::thread::Thread>,
}

impl Shared {
    pub(crate) fn new(
        cands: Vec<Open>,
        inbox: Arc<Inbox>,
        counters: Arc<Counters>,
        depth: usize,
        token: u64,
    ) -> Shared {
        Shared {
            phase: Mutex::new(Phase::Open { cands, url: None }),
            inbox,
            counters,
            ops: DashMap::new(),
            next_id: AtomicU64::new(0),
            in_flight: Arc::new(AtomicUsize::new(0)),
            depth,
            max_piece: usize::MAX,
            rails: 1,
            stripe_min: crate::transport::DEFAULT_STRIPE_MIN,
            token,
            stop: AtomicBool::new(false),
            failure: OnceLock::new(),
            failed: AtomicBool::new(false),
            posters: AtomicUsize::new(0),
            drivers: AtomicUsize::new(0),
            connected: AtomicBool::new(false),
            nudges: AtomicU64::new(0),
            url: OnceLock::new(),
            chosen: OnceLock::new(),
            last_rails: OnceLock::new(),
            thread: OnceLock::new(),
        }
    }

    /// The lock, for a caller that posts: counted, so that the progress
    /// thread lets it in.
    pub(crate) fn lock_to_post(&self) -> MutexGuard<'_, Phase> {
        self.posters.fetch_add(1, Ordering::AcqRel);
        let g = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        self.posters.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// Whether the progress thread should keep spinning.
    pub(crate) fn busy(&self) -> bool {
        // A failed connection has nothing more to progress.
        !self.failed.load(Ordering::Acquire)
            && (self.in_flight.load(Ordering::Acquire) > 0 || self.inbox.has_waiters())
    }

    /// Wakes the progress thread unless a caller drives progress.
    pub(crate) fn nudge_progress(&self) {
        if self.drivers.load(Ordering::Acquire) == 0 {
            self.wake_progress();
        }
    }

    pub(crate) fn wake_progress(&self) {
        self.nudges.fetch_add(1, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// One turn of progress: the candidates' ifaces before connect, the
    /// connection after. Returns the events handled.
    pub(crate) fn progress_in(&self, phase: &mut Phase) -> usize {
        let err = match phase {
            Phase::Open { cands, .. } => {
                return cands.iter_mut().map(|c| c.iface.progress()).sum()
            }
            Phase::Connected(eng) => match eng.turn() {
                Ok(n) if !self.inbox.overflowed() => return n,
                Ok(_) => UctError::Protocol(format!(
                    "the peer sent more than {} notifications that no wait_for_write took; wait for them as they come, or raise Builder::max_notification_backlog",
                    self.inbox.backlog()
                )),
                Err(e) => e,
            },
            _ => return 0,
        };
        self.fail_connection(phase, TransferError::PeerFailed { source: err });
        1
    }

    /// Ends the connection with `err`: closes its endpoint and iface (so
    /// that nothing touches the memory of its operations any more), then
    /// resolves every pending operation and wait with `err`.
    pub(crate) fn fail_connection(&self, phase: &mut Phase, err: TransferError) {
        let _ = self.failure.set(err.clone());
        self.failed.store(true, Ordering::Release);
        let next = if err == TransferError::Closed {
            Phase::Closed
        } else {
            Phase::Failed(err.clone())
        };
        if let Phase::Connected(mut eng) = std::mem::replace(phase, next) {
            let _ = self.last_rails.set(eng.stats(&self.counters));
            let pending = eng.has_queued() || !self.ops.is_empty();
            if err != TransferError::Closed {
                log::warn!("transfer: {}: {err}", eng.transport);
            } else if pending {
                log::info!(
                    "transfer: {}: dropped with operations pending",
                    eng.transport
                );
            }
            eng.fail_queued(&UctError::Canceled(err.to_string()));
            // The endpoint and iface close here: an rc QP is destroyed,
            // a tcp socket closed.
            drop(eng);
        }
        self.resolve_all(&err);
    }

    /// Resolves every operation still in the table, and every wait.
    pub(crate) fn resolve_all(&self, err: &TransferError) {
        let slots: Vec<Arc<Slot>> = self.ops.iter().map(|e| e.value().clone()).collect();
        self.ops.clear();
        for s in slots {
            s.complete(Err(err.clone()));
        }
        self.inbox.fail(err);
    }
}

impl crate::ops::Nudge for Shared {
    fn nudge(&self) {
        self.nudge_progress();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn wakes_are_deferred_to_the_outermost_call_and_survive_a_panic() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        with_deferred_wakes(|| {
            with_deferred_wakes(|| wake(waker.clone()));
            assert_eq!(count.0.load(Ordering::Relaxed), 0, "woken under the locks");
        });
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_deferred_wakes(|| {
                wake(waker.clone());
                panic!("a transport bug");
            })
        }));
        assert!(caught.is_err());
        assert_eq!(count.0.load(Ordering::Relaxed), 2, "the deferred wake ran");
        // Not deferring any more: a wake outside runs at once.
        wake(waker.clone());
        assert_eq!(count.0.load(Ordering::Relaxed), 3);
    }
}
