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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use dashmap::DashMap;
use uct_core::{
    Completion, EpParams, Iface, IfaceParams, MemoryDomain, MemoryType, Registry, UctError,
};

use crate::engine::{self, Dir, Engine, NotifyPath, Op, Part};
use crate::error::{Result, TransferError};
use crate::key::RemoteBuffer;
use crate::memory::View;
use crate::ops::{Inbox, OpFuture, Slot, WaitForWrite};
use crate::select;
use crate::stats::{Counters, Stats};
use crate::url::{self, Offer};

/// Who drives progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// A thread the Transport owns (the default).
    #[default]
    Thread,
    /// The caller, through [`Transport::progress`] (or [`Transport::wait`]).
    Manual,
}

/// Settings of a Transport; see [`Transport::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    transport: String,
    device: Option<String>,
    mem_types: Vec<MemoryType>,
    depth: usize,
    progress: Progress,
}

/// Operations in flight by default before a new one waits.
pub const DEFAULT_DEPTH: usize = 64;

impl Default for Builder {
    fn default() -> Self {
        Builder {
            transport: "auto".into(),
            device: None,
            mem_types: vec![MemoryType::Host],
            depth: DEFAULT_DEPTH,
            progress: Progress::Thread,
        }
    }
}

impl Builder {
    /// The transport: `rc`, `tcp`, `posix`, `cma`, `self`, or `auto` (the
    /// default): the best one for the memory types and the peer.
    pub fn transport(mut self, name: &str) -> Self {
        self.transport = name.to_string();
        self
    }

    /// The device (as `transport-info -d` names it); the first one found
    /// by default. `UCT_NET_DEVICES` limits network devices as well.
    pub fn device(mut self, name: &str) -> Self {
        self.device = Some(name.to_string());
        self
    }

    /// The memory types the Transport will register (host by default);
    /// `auto` chooses among transports that reach all of them.
    pub fn memory_types(mut self, types: &[MemoryType]) -> Self {
        self.mem_types = types.to_vec();
        self
    }

    /// Operations in flight before the next one waits (not fails);
    /// [`DEFAULT_DEPTH`] by default.
    pub fn max_in_flight(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// Who drives progress.
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Opens the candidate transports.
    pub fn build(self) -> Result<Transport> {
        if self.depth == 0 {
            return Err(TransferError::Config(
                "max_in_flight of 0: at least one operation must be able to run".into(),
            ));
        }
        uct_builtins::link();
        let registry = Registry::global();
        let picked = select::candidates(
            registry,
            &self.transport,
            self.device.as_deref(),
            &self.mem_types,
        )?;
        let inbox = Inbox::new();
        let counters = Arc::new(Counters::default());
        let mut cands = Vec::with_capacity(picked.len());
        for c in picked {
            let mut iface = match c.resource.component.open_iface(
                &c.resource.md,
                &c.resource.tl,
                &IfaceParams::default(),
            ) {
                Ok(i) => i,
                Err(e) if self.transport == "auto" => {
                    log::info!("transfer: {} not used: {e}", c.resource.tl.transport);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            install_handlers(iface.as_mut(), &inbox, &counters)?;
            cands.push(Open {
                mem_types: iface.attrs().mem_types.clone(),
                component: c.resource.component.name().to_string(),
                md: c.resource.md.clone(),
                iface,
                pending_ep: None,
            });
        }
        if cands.is_empty() {
            return Err(TransferError::NoTransport(
                "every candidate failed to open; run with RUST_LOG=info to see why".into(),
            ));
        }
        let shared = Arc::new(Shared {
            phase: Mutex::new(Phase::Open { cands, url: None }),
            inbox,
            counters,
            ops: DashMap::new(),
            next_id: AtomicU64::new(0),
            in_flight: Arc::new(AtomicUsize::new(0)),
            depth: self.depth,
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            posters: AtomicUsize::new(0),
            drivers: AtomicUsize::new(0),
            connected: AtomicBool::new(false),
            url: std::sync::OnceLock::new(),
            chosen: Mutex::new(None),
            thread: std::sync::OnceLock::new(),
        });
        let thread = match self.progress {
            Progress::Manual => None,
            Progress::Thread => Some(crate::progress::spawn(shared.clone())?),
        };
        Ok(Transport { shared, thread })
    }
}

/// Sets the notification handlers of a candidate iface: immediates where it
/// has them, the notification message where it has active messages.
fn install_handlers(
    iface: &mut dyn Iface,
    inbox: &Arc<Inbox>,
    counters: &Arc<Counters>,
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
        iface.set_am_handler(
            engine::NOTIFY_AM_ID,
            Box::new(move |msg| match engine::parse_notify(msg.data) {
                Some(n) => {
                    Counters::add(&counters.recv_msg, 1);
                    inbox.deliver(n)
                }
                None => log::warn!(
                    "transfer: {transport}: dropped a malformed notification of {} bytes",
                    msg.data.len()
                ),
            }),
        )?;
    }
    Ok(())
}

/// An endpoint from `c` to the peer's `offer`: the one bind() made,
/// connected to the peer's endpoint, or a new one to the peer's iface.
fn connect_candidate(c: &mut Open, offer: &Offer) -> Result<Box<dyn uct_core::Endpoint>> {
    let transport = c.iface.transport().to_string();
    let unreachable = |source| TransferError::PeerUnreachable {
        transport: transport.clone(),
        source,
    };
    let by_ep = !c
        .iface
        .attrs()
        .caps
        .contains(uct_core::Caps::CONNECT_TO_IFACE);
    if !by_ep {
        return c
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
    let mut ep = c.pending_ep.take().ok_or_else(|| {
        TransferError::Config(format!(
            "this side's {transport} endpoint went to a connect that failed; build a new Transport"
        ))
    })?;
    ep.connect_to_ep(&offer.device_addr, addr)
        .map_err(unreachable)?;
    Ok(ep)
}

/// A candidate transport, opened.
pub(crate) struct Open {
    // The endpoint drops before its iface.
    pending_ep: Option<Box<dyn uct_core::Endpoint>>,
    iface: Box<dyn Iface>,
    component: String,
    md: Arc<dyn MemoryDomain>,
    mem_types: Vec<MemoryType>,
}

pub(crate) enum Phase {
    /// Built, maybe bound: the candidates.
    Open {
        cands: Vec<Open>,
        url: Option<String>,
    },
    /// Connected over one of them (boxed: an Engine is much larger than
    /// the other phases).
    Connected(Box<Engine>, Option<TransferError>),
    /// Dropped.
    Closed,
}

/// A memory domain memory is registered with, and what its transport moves.
#[derive(Clone)]
pub(crate) struct RegTarget {
    pub transport: String,
    pub md: Arc<dyn MemoryDomain>,
    pub mem_types: Vec<MemoryType>,
}

/// What the Transport, its progress thread and its futures share.
pub(crate) struct Shared {
    pub phase: Mutex<Phase>,
    pub inbox: Arc<Inbox>,
    pub counters: Arc<Counters>,
    /// Every operation not yet resolved, so that a failure or a drop
    /// resolves them all whatever the transport still holds.
    pub ops: DashMap<u64, Arc<Slot>>,
    next_id: AtomicU64,
    pub in_flight: Arc<AtomicUsize>,
    depth: usize,
    pub stop: AtomicBool,
    /// The connection failed (or the Transport is closing).
    failed: AtomicBool,
    /// Threads waiting for the lock to post: the progress thread yields.
    pub posters: AtomicUsize,
    /// Threads in [`Transport::wait`], which drive progress themselves:
    /// the progress thread sleeps meanwhile instead of fighting them for
    /// the lock and the cores.
    pub drivers: AtomicUsize,
    connected: AtomicBool,
    /// What bind() returned: it stays the URL after connect.
    url: std::sync::OnceLock<String>,
    chosen: Mutex<Option<RegTarget>>,
    pub thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Shared {
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
        // A failed connection has nothing more to progress: what the
        // transport still holds is released when the Transport drops.
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
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// One turn of progress: the candidates' ifaces before connect, the
    /// connection after. Returns the events handled.
    pub(crate) fn progress_in(&self, phase: &mut Phase) -> usize {
        match phase {
            Phase::Open { cands, .. } => cands.iter_mut().map(|c| c.iface.progress()).sum(),
            Phase::Connected(eng, failed) if failed.is_none() => {
                let res = eng.turn();
                let err = match res {
                    Ok(n) if !self.inbox.overflowed() => return n,
                    Ok(_) => UctError::Protocol(format!(
                        "the peer sent more than {} notifications nobody waited for",
                        crate::ops::MAX_BACKLOG
                    )),
                    Err(e) => e,
                };
                self.fail(eng, failed, TransferError::PeerFailed { source: err });
                1
            }
            _ => 0,
        }
    }

    /// Ends every pending operation and wait with `err`.
    fn fail(&self, eng: &mut Engine, failed: &mut Option<TransferError>, err: TransferError) {
        log::warn!("transfer: {}: {err}", eng.transport);
        let uct = match &err {
            TransferError::PeerFailed { source } => source.clone(),
            other => UctError::Canceled(other.to_string()),
        };
        // The table first, so that every future gets `err` itself.
        self.resolve_all(&err);
        eng.fail_queued(&uct);
        *failed = Some(err);
        self.failed.store(true, Ordering::Release);
    }

    fn resolve_all(&self, err: &TransferError) {
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

/// One side of a connection: bind, connect, write, read, wait.
/// `Send + Sync`: share it (in an `Arc`) between threads that write.
pub struct Transport {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
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
    /// transports this side offers with their addresses, and the format
    /// version. Calling it again returns the same URL.
    pub fn bind(&self) -> Result<String> {
        let mut phase = self.lock();
        let Phase::Open { cands, url } = &mut *phase else {
            return match &*phase {
                Phase::Connected(..) => self
                    .shared
                    .url
                    .get()
                    .cloned()
                    .ok_or(TransferError::NotBound),
                _ => Err(TransferError::Closed),
            };
        };
        if let Some(u) = url {
            return Ok(u.clone());
        }
        let mut offers = Vec::with_capacity(cands.len());
        for c in cands.iter_mut() {
            let by_ep = !c
                .iface
                .attrs()
                .caps
                .contains(uct_core::Caps::CONNECT_TO_IFACE);
            let ep_addr = if by_ep {
                let ep = c.iface.create_ep(EpParams::Unconnected)?;
                let addr = ep.ep_address()?;
                c.pending_ep = Some(ep);
                Some(addr)
            } else {
                None
            };
            offers.push(Offer {
                transport: c.iface.transport().to_string(),
                device: c.iface.device().to_string(),
                device_addr: c.iface.device_address(),
                iface_addr: c.iface.iface_address(),
                ep_addr,
            });
        }
        let u = url::format(&offers);
        *url = Some(u.clone());
        let _ = self.shared.url.set(u.clone());
        Ok(u)
    }

    /// Connects to the peer whose bind() returned `peer_url`. Both sides
    /// bind and both connect.
    pub fn connect(&self, peer_url: &str) -> Result<()> {
        let offers = url::parse(peer_url)?;
        let mut phase = self.lock();
        let cands = match &mut *phase {
            Phase::Open { url: None, .. } => return Err(TransferError::NotBound),
            Phase::Open { cands, .. } => std::mem::take(cands),
            Phase::Connected(eng, _) => {
                return Err(TransferError::AlreadyConnected {
                    transport: eng.transport.clone(),
                })
            }
            Phase::Closed => return Err(TransferError::Closed),
        };
        let (index, offer) = match select::choose(&cands, &offers, |c| &*c.iface) {
            Ok(found) => found,
            Err(e) => {
                // Nothing changed: the caller may try another URL.
                if let Phase::Open { cands: back, .. } = &mut *phase {
                    *back = cands;
                }
                return Err(e);
            }
        };
        let mut cands = cands;
        let ep = match connect_candidate(&mut cands[index], &offer) {
            Ok(ep) => ep,
            Err(e) => {
                if let Phase::Open { cands: back, .. } = &mut *phase {
                    *back = cands;
                }
                return Err(e);
            }
        };
        let c = cands.swap_remove(index);
        drop(cands);
        let transport = c.iface.transport().to_string();
        *self.shared.chosen.lock().unwrap_or_else(|p| p.into_inner()) = Some(RegTarget {
            transport: transport.clone(),
            md: c.md.clone(),
            mem_types: c.mem_types.clone(),
        });
        let eng = Box::new(Engine::new(
            ep,
            c.iface,
            c.component,
            self.shared.in_flight.clone(),
            self.shared.depth,
        ));
        *phase = Phase::Connected(eng, None);
        self.shared.connected.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether connect() succeeded.
    pub fn connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// The transport connected over, once connected.
    pub fn transport_name(&self) -> Option<String> {
        let chosen = self.shared.chosen.lock().unwrap_or_else(|p| p.into_inner());
        chosen.as_ref().map(|c| c.transport.clone())
    }

    /// What this Transport has done so far.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The memory domains new memory is registered with: every candidate's
    /// before connect, the connection's after.
    pub(crate) fn reg_targets(&self) -> Vec<RegTarget> {
        if let Some(c) = &*self.shared.chosen.lock().unwrap_or_else(|p| p.into_inner()) {
            return vec![c.clone()];
        }
        match &*self.lock() {
            Phase::Open { cands, .. } => cands
                .iter()
                .map(|c| RegTarget {
                    transport: c.iface.transport().to_string(),
                    md: c.md.clone(),
                    mem_types: c.mem_types.clone(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The memory domain that allocates `mem_type` memory here.
    pub(crate) fn device_md(&self, mem_type: MemoryType) -> Result<Arc<dyn MemoryDomain>> {
        select::device_md(Registry::global(), mem_type)
    }

    /// Writes `local` to `remote` (of the same length), zero-copy from the
    /// registered view; with `notify`, the peer's next
    /// [`wait_for_write`](Self::wait_for_write) resolves once the bytes
    /// have landed. The future resolves once the view may be reused.
    pub fn write(&self, local: &View, remote: &RemoteBuffer, notify: bool) -> OpFuture {
        self.post(
            vec![(Dir::Write, local, remote, notify.then_some(0))],
            false,
        )
    }

    /// A notified write whose notification carries `tag`.
    pub fn write_tagged(&self, local: &View, remote: &RemoteBuffer, tag: u32) -> OpFuture {
        self.post(vec![(Dir::Write, local, remote, Some(tag))], false)
    }

    /// Reads `remote` into `local` (of the same length).
    pub fn read(&self, local: &View, remote: &RemoteBuffer) -> OpFuture {
        self.post(vec![(Dir::Read, local, remote, None)], false)
    }

    /// Posts every write, in order, then one flush: the future resolves
    /// once all of them have completed at the peer.
    pub fn write_batch(&self, writes: &[BatchWrite]) -> OpFuture {
        self.post(
            writes
                .iter()
                .map(|w| (Dir::Write, &w.local, &w.remote, w.notify))
                .collect(),
            true,
        )
    }

    /// Resolves once every operation posted before it has completed at the
    /// peer.
    pub fn flush(&self) -> OpFuture {
        self.post(Vec::new(), true)
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
        let mut phase = self.lock();
        self.shared.progress_in(&mut phase)
    }

    /// Runs `fut` to completion on this thread, driving progress between
    /// polls: a small `block_on` for manual progress (it works with the
    /// progress thread too).
    pub fn wait<F: std::future::Future>(&self, fut: F) -> F::Output {
        crate::progress::block_on_progress(self, &self.shared, fut)
    }

    fn post(&self, parts: Vec<(Dir, &View, &RemoteBuffer, Option<u32>)>, flush: bool) -> OpFuture {
        match self.try_post(parts, flush) {
            Ok(f) => f,
            Err(e) => OpFuture::ready(Err(e)),
        }
    }

    fn try_post(
        &self,
        parts: Vec<(Dir, &View, &RemoteBuffer, Option<u32>)>,
        flush: bool,
    ) -> Result<OpFuture> {
        let mut phase = self.lock();
        let (eng, failed) = match &mut *phase {
            Phase::Connected(eng, failed) => (eng, failed),
            Phase::Open { .. } => return Err(TransferError::NotConnected),
            Phase::Closed => return Err(TransferError::Closed),
        };
        if let Some(e) = failed {
            return Err(e.clone());
        }
        let mut built = Vec::with_capacity(parts.len());
        for (dir, view, remote, tag) in parts {
            engine::check_part(view, remote, dir)?;
            if tag.is_some() && eng.notify == NotifyPath::None {
                return Err(TransferError::NoNotifications {
                    transport: eng.transport.clone(),
                });
            }
            let (mem, base) = view.memory().handle_for(&eng.md)?;
            built.push(Part {
                dir,
                mem: mem.clone(),
                offset: base + view.offset(),
                len: view.len(),
                remote_addr: remote.addr(),
                rkey: remote.rkey_for(&eng.component, &eng.md)?,
                tag,
            });
        }
        let flush = flush || (eng.flush_each && built.iter().any(|p| p.dir == Dir::Write));
        let slot = Slot::new();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.ops.insert(id, slot.clone());
        let in_flight = self.shared.in_flight.clone();
        in_flight.fetch_add(1, Ordering::AcqRel);
        let shared = Arc::downgrade(&self.shared);
        let done = slot.clone();
        let comp = Completion::with_callback(move |r| {
            if let Some(s) = shared.upgrade() {
                s.ops.remove(&id);
            }
            in_flight.fetch_sub(1, Ordering::AcqRel);
            done.complete(r.as_ref().map_err(engine::op_error).copied());
        });
        eng.submit(Op::new(built, flush, comp), &self.shared.counters);
        // Operations left queued need progress to be posted, even if
        // nobody awaits them; the others nudge it when awaited.
        let queued = eng.has_queued();
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
        let mut phase = self.shared.phase.lock().unwrap_or_else(|p| p.into_inner());
        if let Phase::Connected(eng, failed) = &mut *phase {
            if failed.is_none() {
                self.shared.fail(eng, failed, TransferError::Closed);
            }
        }
        self.shared.resolve_all(&TransferError::Closed);
        // The endpoint and iface close here; what they still hold (the
        // memory of operations in the NIC) goes with them.
        *phase = Phase::Closed;
    }
}
