//! The Transport: bind, connect, and the operations.
//!
//! A Transport is built for a transport (`auto` or a name) and the memory
//! types it will register; it opens an iface of each candidate transport
//! at once. bind() writes the URL that offers them, connect() picks the
//! first offer of the peer that this side prefers and can reach (both
//! sides prefer in the same order, so both pick the same), and the other
//! candidates are closed.
//!
//! Progress: by default a thread the Transport owns drives the iface (as
//! the seed's EventBase thread does); with [`Progress::Manual`] the caller
//! calls [`Transport::progress`]. Either way the futures are plain
//! `std::future::Future`s.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::thread::JoinHandle;

use uct_core::{Completion, EpParams, MemoryDomain, MemoryType, Registry};

pub use crate::builder::{Builder, Progress, DEFAULT_DEPTH, DEFAULT_STRIPE_MIN};
use crate::engine::{self, Dir, Engine, NotifyPath, Op, Part};
use crate::error::{Result, TransferError};
use crate::key::RemoteBuffer;
use crate::memory::{Memory, View};
use crate::ops::{OpFuture, Slot, WaitForWrite};
use crate::rails::Rails;
use crate::select;
use crate::shared::{with_deferred_wakes, Open, Phase, RegTarget, Shared};
use crate::stats::Stats;
use crate::stripe::PartReq;
use crate::url;

/// One side of a connection: bind, connect, write, read, wait.
/// `Send + Sync`: share it (in an `Arc`) between threads that write.
pub struct Transport {
    pub(crate) shared: Arc<Shared>,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("transport", &self.transport_name())
            .field("connected", &self.connected())
            .finish()
    }
}

/// A write of a batch: the view, where it goes, and its notification tag.
#[derive(Debug, Clone)]
pub struct BatchWrite {
    /// What to send.
    pub local: View,
    /// Where to: a remote buffer (or slice) of the view's length.
    pub remote: RemoteBuffer,
    /// `Some(tag)` notifies the peer with that tag.
    pub notify: Option<u32>,
}

impl Transport {
    /// The settings, to build a Transport from.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A Transport with the default settings: `auto`, host memory, a
    /// progress thread.
    pub fn new() -> Result<Transport> {
        Builder::default().build()
    }

    /// Whether this machine can connect two processes at all (some
    /// transport other than `self` is usable here).
    pub fn supported() -> bool {
        uct_builtins::link();
        select::probe(Registry::global())
            .iter()
            .any(|p| p.usable && p.transport != "self")
    }

    /// Every transport this process knows, usable or not, with the reason
    /// for those that are not.
    pub fn probe() -> Vec<select::Probe> {
        uct_builtins::link();
        select::probe(Registry::global())
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.shared.lock_to_post()
    }

    /// The URL the peer passes to [`connect`](Self::connect): the
    /// transports this side offers with their addresses, the token its
    /// notifications must carry, and the format version. Calling it again
    /// returns the same URL.
    pub fn bind(&self) -> Result<String> {
        let mut phase = self.lock();
        let (cands, url) = match &mut *phase {
            Phase::Open { cands, url } => (cands, url),
            Phase::Connected(_) => {
                return self
                    .shared
                    .url
                    .get()
                    .cloned()
                    .ok_or(TransferError::NotBound)
            }
            Phase::Failed(e) => return Err(e.clone()),
            Phase::Closed => return Err(TransferError::Closed),
        };
        if let Some(u) = url {
            return Ok(u.clone());
        }
        let mut offers = Vec::with_capacity(cands.len());
        for c in cands.iter_mut() {
            let by_iface = c
                .iface
                .attrs()
                .caps
                .contains(uct_core::Caps::CONNECT_TO_IFACE);
            let ep_addr = if by_iface {
                None
            } else {
                let ep = c.iface.create_ep(EpParams::Unconnected)?;
                let addr = ep.ep_address()?;
                c.pending_ep = Some(ep);
                Some(addr)
            };
            offers.push(url::Offer {
                transport: c.iface.transport().to_string(),
                device: c.iface.device().to_string(),
                device_addr: c.iface.device_address(),
                iface_addr: c.iface.iface_address(),
                ep_addr,
            });
        }
        let u = url::format(self.shared.token, &offers);
        *url = Some(u.clone());
        Ok(u)
    }

    /// Connects to the peer whose bind() returned `peer_url`. Both sides
    /// bind and both connect.
    pub fn connect(&self, peer_url: &str) -> Result<()> {
        let (peer_token, offers) = url::parse(peer_url)?;
        let mut phase = self.lock();
        let cands = match &mut *phase {
            Phase::Open { url: None, .. } => return Err(TransferError::NotBound),
            Phase::Open { cands, .. } => cands,
            Phase::Connected(eng) => {
                return Err(TransferError::AlreadyConnected {
                    transport: eng.transport.clone(),
                })
            }
            Phase::Failed(e) => return Err(e.clone()),
            Phase::Closed => return Err(TransferError::Closed),
        };
        let duplicated = offers
            .iter()
            .enumerate()
            .any(|(i, o)| offers[..i].iter().any(|p| p.transport == o.transport));
        if self.shared.rails > 1 || duplicated {
            let rails = crate::rails::connect(cands, peer_token, &offers, &self.shared)?;
            return self.connected_over(&mut phase, rails);
        }
        // On any error the candidates stay: the caller may try another URL.
        let mut tried = Vec::new();
        let mut connected = None;
        for (index, offer) in select::choose(cands, &offers, |c| &*c.iface)? {
            match cands[index].connect(&offer) {
                Ok(ep) => {
                    connected = Some((index, ep, offer));
                    break;
                }
                Err(e) => {
                    log::info!("transfer: connect over {} failed: {e}", offer.transport);
                    tried.push(e);
                }
            }
        }
        let Some((index, ep, offer)) = connected else {
            // An endpoint bind() made went to a failed connect: the next
            // bind() makes a fresh URL.
            if cands.iter().any(|c| c.spent()) {
                if let Phase::Open { url, .. } = &mut *phase {
                    *url = None;
                }
            }
            return Err(tried.into_iter().next().unwrap_or(TransferError::NotBound));
        };
        let c = cands.swap_remove(index);
        let device = c.iface.device().to_string();
        let target = c.target();
        let eng = Engine::new(
            ep,
            c.iface,
            c.component,
            target,
            peer_token,
            &self.shared,
            self.shared.in_flight.clone(),
        );
        let in_flight = self.shared.in_flight.clone();
        let rails = Rails::new(
            vec![(eng, device, offer, in_flight)],
            self.shared.stripe_min,
            peer_token,
        );
        self.connected_over(&mut phase, rails)
    }

    /// Ends connect(): the connection is `rails`; the other candidates
    /// close.
    fn connected_over(&self, phase: &mut Phase, rails: Rails) -> Result<()> {
        if let Phase::Open { url: Some(u), .. } = &*phase {
            // bind() keeps answering with it once connected.
            let _ = self.shared.url.set(u.clone());
        }
        let transport = rails.transport.clone();
        *phase = Phase::Connected(Box::new(rails));
        let _ = self.shared.chosen.set(transport);
        self.shared.connected.store(true, Ordering::Release);
        Ok(())
    }

    /// Re-adds rail `i`, taken out of service when it failed, with a new
    /// endpoint to the peer's address on it: rails are never re-added
    /// silently. Transports that connect endpoint to endpoint (rc) cannot
    /// (their peer must take part), and say so.
    pub fn restore_rail(&self, i: usize) -> Result<()> {
        let mut phase = self.lock();
        match &mut *phase {
            Phase::Connected(rails) => rails.restore(i, &self.shared),
            Phase::Open { .. } => Err(TransferError::NotConnected),
            Phase::Failed(e) => Err(e.clone()),
            Phase::Closed => Err(TransferError::Closed),
        }
    }

    /// Each rail's state and counters, once connected (one entry with one
    /// rail; as they were at the end once the connection ended); empty
    /// before connect.
    pub fn rails(&self) -> Vec<crate::stats::RailStats> {
        match &*self.lock() {
            Phase::Connected(rails) => rails.stats(&self.shared.counters),
            // As they were when the connection ended.
            _ => self.shared.last_rails.get().cloned().unwrap_or_default(),
        }
    }

    /// Whether connect() succeeded.
    pub fn connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// The transport connected over, once connected.
    pub fn transport_name(&self) -> Option<String> {
        self.shared.chosen.get().cloned()
    }

    /// What this Transport has done so far.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The memory domains new memory is registered with: every candidate's
    /// before connect, the connection's after. Decided under the lock, so
    /// that a connect racing with a registration is seen whole.
    pub(crate) fn reg_targets(&self) -> Result<Vec<RegTarget>> {
        match &*self.lock() {
            Phase::Open { cands, .. } => Ok(cands.iter().map(Open::target).collect()),
            Phase::Connected(rails) => Ok(rails.targets()),
            Phase::Failed(e) => Err(e.clone()),
            Phase::Closed => Err(TransferError::Closed),
        }
    }

    /// The memory domain that allocates `mem_type` memory here.
    pub(crate) fn device_md(&self, mem_type: MemoryType) -> Result<Arc<dyn MemoryDomain>> {
        select::device_md(Registry::global(), mem_type)
    }

    /// Writes `local` to `remote` (of the same length), zero-copy from the
    /// registered view; with `notify`, the peer's next
    /// [`wait_for_write`](Self::wait_for_write) resolves once the bytes
    /// have landed. The future resolves once the write has landed at the
    /// peer (or failed): the view may then be reused.
    pub fn write(&self, local: &View, remote: &RemoteBuffer, notify: bool) -> OpFuture {
        self.post(&[(Dir::Write, local, remote, notify.then_some(0))], false)
    }

    /// A notified write whose notification carries `tag`.
    pub fn write_tagged(&self, local: &View, remote: &RemoteBuffer, tag: u32) -> OpFuture {
        self.post(&[(Dir::Write, local, remote, Some(tag))], false)
    }

    /// Reads `remote` into `local` (of the same length).
    pub fn read(&self, local: &View, remote: &RemoteBuffer) -> OpFuture {
        self.post(&[(Dir::Read, local, remote, None)], false)
    }

    /// Posts every write, in order, then one flush: the future resolves
    /// once all of them have landed at the peer, with the first error.
    pub fn write_batch(&self, writes: &[BatchWrite]) -> OpFuture {
        let parts: Vec<_> = writes
            .iter()
            .map(|w| (Dir::Write, &w.local, &w.remote, w.notify))
            .collect();
        self.post(&parts, true)
    }

    /// Resolves once every operation posted before it has completed at the
    /// peer.
    pub fn flush(&self) -> OpFuture {
        self.post(&[], true)
    }

    /// The next notification of a notified write from the peer.
    pub fn wait_for_write(&self) -> WaitForWrite {
        self.shared.inbox.wait_nudging(self.nudge())
    }

    fn nudge(&self) -> std::sync::Weak<dyn crate::ops::Nudge> {
        let weak: std::sync::Weak<Shared> = Arc::downgrade(&self.shared);
        weak
    }

    /// Drives progress once (what the progress thread does in a loop);
    /// returns the events handled. Needed only with [`Progress::Manual`].
    pub fn progress(&self) -> usize {
        with_deferred_wakes(|| {
            let mut phase = self.lock();
            self.shared.progress_in(&mut phase)
        })
    }

    /// Runs `fut` to completion on this thread, driving progress between
    /// polls: a small `block_on` for manual progress (it works with the
    /// progress thread too, which sleeps meanwhile).
    pub fn wait<F: std::future::Future>(&self, fut: F) -> F::Output {
        crate::progress::block_on_progress(self, &self.shared, fut, None)
            .expect("no deadline, so no timeout")
    }

    /// [`wait`](Self::wait) with a deadline: `TimedOut` once `limit` has
    /// passed (the future is dropped: a write goes on, a wait gives its
    /// place up).
    pub fn wait_within<F: std::future::Future>(
        &self,
        fut: F,
        limit: std::time::Duration,
    ) -> Result<F::Output> {
        crate::progress::block_on_progress(self, &self.shared, fut, Some(limit))
    }

    fn post(&self, parts: &[(Dir, &View, &RemoteBuffer, Option<u32>)], flush: bool) -> OpFuture {
        match with_deferred_wakes(|| self.try_post(parts, flush)) {
            Ok(f) => f,
            Err(e) => OpFuture::ready(Err(e)),
        }
    }

    fn try_post(
        &self,
        parts: &[(Dir, &View, &RemoteBuffer, Option<u32>)],
        flush: bool,
    ) -> Result<OpFuture> {
        let mut phase = self.lock();
        let rails = match &mut *phase {
            Phase::Connected(rails) => rails,
            Phase::Open { .. } => return Err(TransferError::NotConnected),
            Phase::Failed(e) => return Err(e.clone()),
            Phase::Closed => return Err(TransferError::Closed),
        };
        let mut built = Vec::with_capacity(parts.len());
        let mut striped = Vec::new();
        let mut keep: Vec<Memory> = Vec::with_capacity(parts.len());
        let multi = rails.is_multi();
        let (component, notify, transport) = (
            rails.component.clone(),
            rails.notify,
            rails.transport.clone(),
        );
        for &(dir, view, remote, tag) in parts {
            engine::check_part(view, remote, dir)?;
            if tag.is_some() && notify == NotifyPath::None {
                return Err(TransferError::NoNotifications { transport });
            }
            keep.push(view.memory().clone());
            if multi {
                striped.push(PartReq {
                    dir,
                    mem: view.memory().clone(),
                    offset: view.offset(),
                    len: view.len(),
                    remote: remote.clone(),
                    tag,
                });
                continue;
            }
            let Some(eng) = rails.single() else {
                return Err(TransferError::NotConnected);
            };
            let (mem, base) = view.memory().handle_for(&eng.target.md)?;
            built.push(Part {
                dir,
                mem: mem.clone(),
                offset: base + view.offset(),
                len: view.len(),
                remote_addr: remote.addr(),
                rkey: remote.rkey_for(0, 1, &component, &eng.md)?,
                tag,
            });
        }
        let slot = Slot::new();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let in_flight = self.shared.in_flight.clone();
        in_flight.fetch_add(1, Ordering::AcqRel);
        let shared = Arc::downgrade(&self.shared);
        let done = slot.clone();
        let comp = Completion::with_callback(move |r| {
            // The memory stays registered (and allocated) until the
            // transport has finished with every piece: a registration by
            // address of another MD's allocation does not keep it alive.
            drop(keep);
            let shared = shared.upgrade();
            let failure = shared.as_ref().and_then(|s| s.failure.get().cloned());
            if let Some(s) = shared.as_ref().filter(|_| done.tabled()) {
                s.ops.remove(&id);
            }
            in_flight.fetch_sub(1, Ordering::AcqRel);
            done.complete(match r {
                Ok(()) => Ok(()),
                Err(e) => Err(failure.unwrap_or_else(|| engine::op_error(e))),
            });
        });
        if multi {
            if let Err(e) = rails.submit(striped, flush, &comp, &self.shared.counters) {
                // Nothing was posted: the operation never ran.
                comp.start();
                comp.finish(Ok(()));
                return Err(e);
            }
        } else if let Some(eng) = rails.single() {
            eng.submit(Op::new(built, flush, comp), &self.shared.counters);
        }
        // Into the table only if still pending: most operations over shared
        // memory complete inside the post. Still under the lock, so its
        // completion (from progress) cannot run before the insert.
        if !slot.is_done() {
            slot.set_tabled();
            self.shared.ops.insert(id, slot.clone());
        }
        // Operations left queued need progress to be posted, even if
        // nobody awaits them; the others nudge it when awaited.
        let queued = rails.has_queued();
        drop(phase);
        if queued {
            self.shared.nudge_progress();
        }
        Ok(OpFuture::new(slot, self.nudge()))
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_progress();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("transfer: the progress thread panicked");
            }
        }
        with_deferred_wakes(|| {
            let mut phase = self.shared.phase.lock().unwrap_or_else(|p| p.into_inner());
            // The endpoint and iface close before any future resolves.
            self.shared
                .fail_connection(&mut phase, TransferError::Closed);
            *phase = Phase::Closed;
        });
    }
}
