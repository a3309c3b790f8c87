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

use uct_core::{Completion, EpParams, IfaceParams, MemoryDomain, MemoryType, Registry};

use crate::engine::{self, Dir, Engine, NotifyPath, Op, Part};
use crate::error::{Result, TransferError};
use crate::key::RemoteBuffer;
use crate::memory::{Memory, View};
use crate::ops::{Inbox, OpFuture, Slot, WaitForWrite};
use crate::rails::Rails;
use crate::select;
use crate::shared::{install_handlers, with_deferred_wakes, Open, Phase, RegTarget, Shared};
use crate::stats::{Counters, Stats};
use crate::stripe::PartReq;
use crate::url;

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
    max_piece: usize,
    backlog: usize,
    rails: Option<usize>,
    devices: Option<Vec<String>>,
    stripe_min: Option<usize>,
}

/// Operations in flight by default before a new one waits.
pub const DEFAULT_DEPTH: usize = 64;

/// The smallest write striped over several rails by default
/// (`UCT_TRANSFER_STRIPE_MIN`); see docs/perf-rails.md for the
/// measurement behind it.
pub const DEFAULT_STRIPE_MIN: usize = 256 * 1024;

impl Default for Builder {
    fn default() -> Self {
        Builder {
            transport: "auto".into(),
            device: None,
            mem_types: vec![MemoryType::Host],
            depth: DEFAULT_DEPTH,
            progress: Progress::Thread,
            max_piece: usize::MAX,
            backlog: crate::ops::MAX_BACKLOG,
            rails: None,
            devices: None,
            stripe_min: None,
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

    /// Who drives progress. With [`Progress::Manual`] nothing moves, and
    /// no dead peer is noticed, unless the caller calls
    /// [`Transport::progress`] (or waits with [`Transport::wait`]): a
    /// future awaited on another executor without it never resolves.
    pub fn progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Notifications kept for waits not yet made (2^20 by default). A peer
    /// that sends more than this ahead of the application's
    /// `wait_for_write`s fails the connection: wait for notifications as
    /// they come, or raise this.
    pub fn max_notification_backlog(mut self, notifications: usize) -> Self {
        self.backlog = notifications.max(1);
        self
    }

    /// Rails: `n` devices of the (named) transport, each with its own
    /// connection, as the transport lists them (`Builder::device` first).
    /// Writes of at least the stripe minimum are split over them, and a
    /// rail that fails is taken out while the others carry on. One by
    /// default, or `UCT_TRANSFER_RAILS`. Both sides must have the same
    /// rails: connect refuses another count by name.
    pub fn rails(mut self, n: usize) -> Self {
        self.rails = Some(n);
        self
    }

    /// Rails on these devices, in this order (as `transport-info -d` names
    /// them); a device may repeat (two connections over one link: no more
    /// bandwidth, but a rail that can fail alone, for tests).
    pub fn devices(mut self, names: &[&str]) -> Self {
        self.devices = Some(names.iter().map(|d| d.to_string()).collect());
        self
    }

    /// The smallest write split over several rails (smaller ones go whole
    /// on one rail, in turn); [`DEFAULT_STRIPE_MIN`] by default, or
    /// `UCT_TRANSFER_STRIPE_MIN`.
    pub fn stripe_min(mut self, bytes: usize) -> Self {
        self.stripe_min = Some(bytes.max(1));
        self
    }

    /// The rails asked for: devices(), rails(), `UCT_TRANSFER_RAILS`, or 1.
    fn rail_count(&self) -> Result<usize> {
        let n = match (&self.devices, self.rails) {
            (Some(d), Some(n)) if d.len() != n => {
                return Err(TransferError::Config(format!(
                    "rails({n}) and devices() naming {} devices; give one or the other",
                    d.len()
                )))
            }
            (Some(d), _) => d.len(),
            (None, Some(n)) => n,
            (None, None) => match std::env::var("UCT_TRANSFER_RAILS") {
                Ok(v) => {
                    let n = v.trim().parse::<usize>().map_err(|_| {
                        TransferError::Config(format!(
                            "UCT_TRANSFER_RAILS={v:?} is not a number of rails (1 to {})",
                            crate::key::MAX_RAILS
                        ))
                    })?;
                    if n > 1 && self.transport == "auto" {
                        log::warn!("transfer: UCT_TRANSFER_RAILS={n} applies to a named transport (tcp, rc); auto uses one rail");
                        1
                    } else {
                        n
                    }
                }
                Err(_) => 1,
            },
        };
        if n == 0 || n > crate::key::MAX_RAILS {
            return Err(TransferError::Config(format!(
                "{n} rails: a Transport has 1 to {}",
                crate::key::MAX_RAILS
            )));
        }
        if (n > 1 || self.devices.is_some()) && self.transport == "auto" {
            return Err(TransferError::Config(format!(
                "{n} rails of auto: rails are devices of one transport; name it with .transport(\"tcp\") or \"rc\""
            )));
        }
        Ok(n)
    }

    /// The stripe minimum: stripe_min(), `UCT_TRANSFER_STRIPE_MIN`, or the
    /// default.
    fn stripe_min_bytes(&self) -> Result<usize> {
        if let Some(b) = self.stripe_min {
            return Ok(b);
        }
        match std::env::var("UCT_TRANSFER_STRIPE_MIN") {
            Ok(v) => uct_core::config::parse_size(&v)
                .map(|b| (b as usize).max(1))
                .ok_or_else(|| {
                    TransferError::Config(format!(
                        "UCT_TRANSFER_STRIPE_MIN={v:?} is not a size (bytes, or with K, M, G)"
                    ))
                }),
            Err(_) => Ok(DEFAULT_STRIPE_MIN),
        }
    }

    /// Splits writes and reads in pieces of at most `bytes` (besides the
    /// transport's own largest zcopy): a test seam for writes split in
    /// pieces, which real transports do only beyond a GiB.
    #[doc(hidden)]
    pub fn max_write_piece(mut self, bytes: usize) -> Self {
        self.max_piece = bytes.max(1);
        self
    }

    /// Opens the candidate transports.
    pub fn build(self) -> Result<Transport> {
        if self.depth == 0 {
            return Err(TransferError::Config(
                "max_in_flight of 0: at least one operation must be able to run".into(),
            ));
        }
        let rails = self.rail_count()?;
        let stripe_min = self.stripe_min_bytes()?;
        uct_builtins::link();
        let registry = Registry::global();
        let picked = if rails > 1 || self.devices.is_some() {
            select::rail_candidates(
                registry,
                &self.transport,
                self.device.as_deref(),
                self.devices.as_deref(),
                rails,
            )?
        } else {
            select::candidates(
                registry,
                &self.transport,
                self.device.as_deref(),
                &self.mem_types,
            )?
        };
        let inbox = Inbox::new(self.backlog);
        let counters = Arc::new(Counters::default());
        let token = random_token();
        let mut cands = Vec::with_capacity(picked.len());
        for (rail, c) in picked.into_iter().enumerate() {
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
            install_handlers(iface.as_mut(), &inbox, &counters, token)?;
            cands.push(Open {
                mem_types: iface.attrs().mem_types.clone(),
                component: c.resource.component.name().to_string(),
                md: c.resource.md.clone(),
                iface,
                pending_ep: None,
                rail: if rails > 1 { rail } else { 0 },
            });
        }
        if cands.is_empty() {
            return Err(TransferError::NoTransport(
                "every candidate failed to open; run with RUST_LOG=info to see why".into(),
            ));
        }
        let mut shared = Shared::new(cands, inbox, counters, self.depth, token);
        shared.max_piece = self.max_piece;
        shared.rails = rails;
        shared.stripe_min = stripe_min;
        let shared = Arc::new(shared);
        let thread = match self.progress {
            Progress::Manual => None,
            Progress::Thread => Some(crate::progress::spawn(shared.clone())?),
        };
        Ok(Transport { shared, thread })
    }
}

/// A random token for notifications (see [`Shared::token`]); never 0.
fn random_token() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Only distinct from other Transports, not secret: the URL's
        // secrecy is what the token rests on.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        return t ^ (std::process::id() as u64).rotate_left(40) | 1;
    }
    u64::from_ne_bytes(b) | 1
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
    /// rail); empty before.
    pub fn rails(&self) -> Vec<crate::stats::RailStats> {
        match &*self.lock() {
            Phase::Connected(rails) => rails.stats(&self.shared.counters),
            _ => Vec::new(),
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
