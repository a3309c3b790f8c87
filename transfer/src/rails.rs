//! Rails: one Transport over the same transport on several devices (rc on
//! several NICs, tcp on several interfaces), each device a rail with its
//! own iface and endpoint.
//!
//! - One rail (the default) is the connection as it always was: every
//!   operation goes to its [`Engine`] unchanged, and its failure is the
//!   connection's.
//! - With several, every write and read is cut in stripes (`stripe.rs`):
//!   one stripe, on the next rail in turn, below the stripe minimum;
//!   one per rail in service, sized in proportion to the rails'
//!   bandwidth (equal when the transport does not say), at or above it.
//!   Each stripe is a plain put (or get) of its own, which completes once
//!   it has landed (tcp: its flush answered; rc: the peer's
//!   acknowledgement).
//! - A notified write is notified after every stripe has landed: its
//!   notification is an active message queued on the primary rail (the
//!   first in service) in the order of the writes, and sent only once
//!   every stripe's completion has come; the peer therefore sees it after
//!   all the bytes. Only a write that fits one put with immediate on every
//!   rail (below the stripe minimum) is that put instead, on the primary
//!   rail, behind the queued messages (`stripe::by_one_imm`).
//! - A rail whose endpoint fails (a stripe ends with the endpoint's
//!   failure and the endpoint's liveness check agrees, or the check fails
//!   on its own) is taken out of service, logged once with its reason: its
//!   endpoint closes, its iface stays (it still receives what the peer
//!   sends over it), and its stripes not known to have landed are posted
//!   again, whole, on the rails left; its unsent notifications move to the
//!   next primary. The same bytes written twice are harmless only if the
//!   first attempt cannot land after the re-post was notified (the
//!   application may have written that buffer again since): so a failed
//!   endpoint must send nothing more. tcp resets a link that failed
//!   (SO_LINGER 0: the kernel drops what it still held for the peer,
//!   rather than sending it for up to the peer timeout); what the peer had
//!   already received is executed by its next progress calls. A put with
//!   immediate posted again may notify twice (docs/design.md, Rails). The
//!   write succeeds while one rail remains; when none does, the connection
//!   fails as a single rail's would.
//! - A rail out of service stays out until `Transport::restore_rail`
//!   re-adds it (transports that connect to the peer's iface only: a new
//!   endpoint to the same address).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use uct_core::{Completion, EpParams, Iface, UctError};

use crate::engine::{Engine, NotifyPath};
use crate::error::{Result, TransferError};
use crate::shared::RegTarget;
use crate::stats::{Counters, RailStats};
use crate::stripe::{self, Events, PartReq, Stripe};
use crate::url::Offer;

/// What one rail did, counted as its stripes complete.
#[derive(Debug, Default)]
pub(crate) struct RailCounters {
    pub writes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub reads: AtomicU64,
    pub bytes_read: AtomicU64,
    pub reissued: AtomicU64,
}

pub(crate) enum State {
    Up(Box<Engine>),
    /// Out of service; the iface stays while the peer may still send.
    Down(Option<Box<dyn Iface>>),
}

/// One device of the connection.
pub(crate) struct Rail {
    pub device: String,
    pub target: RegTarget,
    /// The memory domain's name, as keys name it.
    pub md: String,
    /// The peer's offer this rail connected to (to reconnect it).
    pub peer: Offer,
    pub state: State,
    /// Stripes posted and not completed.
    pub in_flight: Arc<AtomicUsize>,
    pub counters: Arc<RailCounters>,
    /// Share of a striped write, relative to the others.
    pub weight: f64,
    /// Why it was taken out of service, the last time.
    pub failure: Option<String>,
    /// Stripes posted on it whose completion has not come: posted again
    /// elsewhere if it fails.
    pub flying: Vec<Arc<Stripe>>,
}

impl Rail {
    pub(crate) fn engine(&mut self) -> Option<&mut Engine> {
        match &mut self.state {
            State::Up(e) => Some(e),
            State::Down(_) => None,
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        matches!(self.state, State::Up(_))
    }
}

/// The connection: its rails.
pub(crate) struct Rails {
    pub transport: String,
    pub component: String,
    pub notify: NotifyPath,
    pub rails: Vec<Rail>,
    /// The rail notifications go on: the first in service, changed only
    /// when it fails, so that notifications stay in order.
    pub primary: usize,
    pub stripe_min: usize,
    /// The longest notified write sent whole as one put with immediate:
    /// the smallest put limit of the rails, so that it is one on whichever
    /// rail it is posted again.
    pub imm_max: usize,
    /// What stripe completions report, handled by the next turn.
    pub events: Arc<Mutex<Events>>,
    /// The rail the next single-stripe operation goes on.
    pub next: usize,
    pub peer_token: u64,
}

/// Locks `m`, whatever a panic elsewhere left.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether an operation's error says its endpoint failed (rather than that
/// the peer refused it): the rail is then checked, and taken out if dead.
pub(crate) fn is_rail_failure(e: &UctError) -> bool {
    matches!(
        e,
        UctError::EndpointFailed(_)
            | UctError::Canceled(_)
            | UctError::Timeout(_)
            | UctError::Io { .. }
    )
}

impl Rails {
    /// The rails of a connection, in rail order: engine, device, peer offer.
    pub(crate) fn new(
        engines: Vec<(Engine, String, Offer, Arc<AtomicUsize>)>,
        stripe_min: usize,
        peer_token: u64,
    ) -> Rails {
        let first = &engines[0].0;
        let (transport, component, notify) = (
            first.transport.clone(),
            first.component.clone(),
            first.notify,
        );
        let imm_max = engines.iter().map(|(e, ..)| e.max_put()).min().unwrap_or(0);
        let bandwidths: Vec<f64> = engines
            .iter()
            .map(|(e, ..)| e.iface.attrs().bandwidth_bps)
            .collect();
        let known = bandwidths.iter().all(|b| b.is_finite() && *b > 0.0);
        let rails = engines
            .into_iter()
            .zip(bandwidths)
            .map(|((eng, device, peer, in_flight), bw)| Rail {
                device,
                target: eng.target.clone(),
                md: eng.md.clone(),
                peer,
                state: State::Up(Box::new(eng)),
                in_flight,
                counters: Arc::new(RailCounters::default()),
                weight: if known { bw } else { 1.0 },
                failure: None,
                flying: Vec::new(),
            })
            .collect();
        Rails {
            transport,
            component,
            notify,
            rails,
            primary: 0,
            stripe_min: stripe_min.max(1),
            imm_max,
            events: Arc::new(Mutex::new(Events::default())),
            next: 0,
            peer_token,
        }
    }

    /// Whether there are several rails (else the one engine does all).
    pub(crate) fn is_multi(&self) -> bool {
        self.rails.len() > 1
    }

    /// The one rail's engine, while it is up.
    pub(crate) fn single(&mut self) -> Option<&mut Engine> {
        self.rails.first_mut().and_then(Rail::engine)
    }

    /// What new memory registers with: every rail's memory domain, in
    /// service or not (a rail re-added needs the memory registered).
    pub(crate) fn targets(&self) -> Vec<RegTarget> {
        self.rails.iter().map(|r| r.target.clone()).collect()
    }

    /// The rails in service.
    pub(crate) fn up(&self) -> Vec<usize> {
        (0..self.rails.len())
            .filter(|&i| self.rails[i].is_up())
            .collect()
    }

    pub(crate) fn has_queued(&self) -> bool {
        self.rails.iter().any(|r| match &r.state {
            State::Up(e) => e.has_queued(),
            State::Down(_) => false,
        })
    }

    /// Ends every queued operation of every rail with `err`.
    pub(crate) fn fail_queued(&mut self, err: &UctError) {
        for r in &mut self.rails {
            if let Some(e) = r.engine() {
                e.fail_queued(err);
            }
        }
    }

    /// One turn of every rail; a rail that fails is taken out and its
    /// stripes go on the others. Fails only when no rail is left.
    pub(crate) fn turn(&mut self) -> std::result::Result<usize, UctError> {
        if !self.is_multi() {
            return match self.single() {
                Some(e) => e.turn(),
                None => Ok(0),
            };
        }
        let mut events = 0;
        let mut down: Vec<(usize, String)> = Vec::new();
        for (i, r) in self.rails.iter_mut().enumerate() {
            match &mut r.state {
                State::Up(e) => match e.turn() {
                    Ok(n) => events += n,
                    Err(err) => down.push((i, err.to_string())),
                },
                State::Down(Some(iface)) => events += iface.progress(),
                State::Down(None) => {}
            }
        }
        let mut again = Vec::new();
        self.settle_suspects(&mut down, &mut again);
        if !down.is_empty() {
            // Every rail at once (the peer went): the connection's failure
            // is the one line logged, naming each rail.
            let up = self.up();
            let all = up.iter().all(|i| down.iter().any(|(d, _)| d == i));
            for (i, why) in down {
                self.take_down(i, &why, !all, &mut again);
            }
            // What the closing endpoints ended reports now.
            let mut more = Vec::new();
            self.settle_suspects(&mut more, &mut again);
            for (i, why) in more {
                self.take_down(i, &why, true, &mut again);
            }
            events += 1;
        }
        if self.up().is_empty() {
            let why: Vec<String> = self
                .rails
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    format!(
                        "rail {i} ({}): {}",
                        r.device,
                        r.failure.as_deref().unwrap_or("?")
                    )
                })
                .collect();
            return Err(UctError::EndpointFailed(format!(
                "every rail is out of service: {}",
                why.join("; ")
            )));
        }
        for s in again {
            self.repost(&s);
        }
        for r in &mut self.rails {
            if r.flying.len() > 64 {
                r.flying.retain(|s| !s.is_settled());
            }
        }
        Ok(events)
    }

    /// Stripes that ended with an endpoint's failure: posted again if
    /// their rail is dead (added to `down` when its check says so now),
    /// ended with the error if the rail lives (the peer refused them).
    fn settle_suspects(&mut self, down: &mut Vec<(usize, String)>, again: &mut Vec<Arc<Stripe>>) {
        let suspects = std::mem::take(&mut lock(&self.events).suspects);
        for (s, err) in suspects {
            let rail = s.rail;
            let dead = down.iter().any(|(i, _)| *i == rail)
                || match self.rails.get_mut(rail).map(|r| &mut r.state) {
                    Some(State::Up(e)) => match e.check() {
                        Ok(()) => false,
                        Err(why) => {
                            down.push((rail, why.to_string()));
                            true
                        }
                    },
                    _ => true,
                };
            if dead {
                again.push(s);
            } else {
                s.target.finish(Err(err));
            }
        }
    }

    /// Takes rail `i` out of service (once), logging why; its stripes in
    /// flight join `again`, its notifications not sent move to the next
    /// primary.
    fn take_down(&mut self, i: usize, why: &str, log: bool, again: &mut Vec<Arc<Stripe>>) {
        let Some(rail) = self.rails.get_mut(i) else {
            return;
        };
        let State::Up(_) = rail.state else {
            return;
        };
        let State::Up(eng) = std::mem::replace(&mut rail.state, State::Down(None)) else {
            return;
        };
        if log {
            log::warn!(
                "transfer: {} rail {i} ({}) is out of service: {why}; its operations go on the other rails, and Transport::restore_rail({i}) brings it back",
                self.transport,
                rail.device
            );
        }
        rail.failure = Some(why.to_string());
        let left = eng.teardown(&UctError::Canceled(format!(
            "rail {i} out of service: {why}"
        )));
        rail.state = State::Down(Some(left.iface));
        for s in rail.flying.drain(..) {
            if s.settle() {
                again.push(s);
            }
        }
        // The closing endpoint's own completions came in the teardown.
        let suspects = std::mem::take(&mut lock(&self.events).suspects);
        for (s, _) in suspects {
            again.push(s);
        }
        if self.primary == i {
            if let Some(&p) = self.up().first() {
                self.primary = p;
            }
        }
        let primary = self.primary;
        match self.rails.get_mut(primary).and_then(Rail::engine) {
            Some(e) => {
                for (landed, op, tag, len) in left.notices {
                    e.queue_notice(landed, op, tag, len);
                }
            }
            None => {
                for (_, op, ..) in left.notices {
                    op.finish(Err(UctError::EndpointFailed(format!(
                        "every rail is out of service; the last, rail {i}: {why}"
                    ))));
                }
            }
        }
    }

    /// Posts a stripe whose rail failed on the next rail in service.
    fn repost(&mut self, s: &Arc<Stripe>) {
        let up = self.up();
        // One that carries its notification goes on the primary rail, in
        // order with the others. If its put had landed and only the answer
        // went with the rail, the peer is notified twice: an immediate
        // carries only the tag, nothing to drop a repeat by.
        let at = if s.tag.is_some() {
            up.iter().position(|&i| i == self.primary).unwrap_or(0)
        } else {
            self.next % up.len().max(1)
        };
        let Some(&to) = up.get(at) else {
            s.target.finish(Err(UctError::EndpointFailed(
                "every rail is out of service".into(),
            )));
            return;
        };
        self.next = self.next.wrapping_add(1);
        self.rails[to]
            .counters
            .reissued
            .fetch_add(1, Ordering::Relaxed);
        let again = s.moved_to(to);
        if let Err(e) = stripe::post(self, &again) {
            again
                .target
                .finish(Err(UctError::InvalidParam(e.to_string())));
        }
    }

    /// Takes rail `i` out of service as a failure found by `turn` would,
    /// at a moment the test chose.
    #[cfg(test)]
    pub(crate) fn fail_rail(&mut self, i: usize, why: &str) {
        let mut again = Vec::new();
        self.take_down(i, why, false, &mut again);
        for s in again {
            self.repost(&s);
        }
    }

    /// Posts an operation over the rails (several of them).
    pub(crate) fn submit(
        &mut self,
        parts: Vec<PartReq>,
        flush: bool,
        comp: &Completion,
        counters: &Counters,
    ) -> Result<()> {
        stripe::submit(self, parts, flush, comp, counters)
    }

    /// Re-adds rail `i`, out of service, with a new endpoint to the peer's
    /// iface on that rail.
    pub(crate) fn restore(&mut self, i: usize, shared: &crate::shared::Shared) -> Result<()> {
        let n = self.rails.len();
        let transport = self.transport.clone();
        let component = self.component.clone();
        let peer_token = self.peer_token;
        let rail = self.rails.get_mut(i).ok_or_else(|| {
            TransferError::Config(format!("there is no rail {i}: this connection has {n}"))
        })?;
        let State::Down(iface) = &mut rail.state else {
            return Err(TransferError::Config(format!(
                "rail {i} ({}) is in service already",
                rail.device
            )));
        };
        let by_iface = iface
            .as_ref()
            .is_some_and(|f| f.attrs().caps.contains(uct_core::Caps::CONNECT_TO_IFACE));
        if !by_iface {
            return Err(TransferError::Config(format!(
                "rail {i} ({transport} on {}) connects endpoint to endpoint: it cannot be re-added without a new exchange of addresses with the peer; build a new Transport and connect again",
                rail.device
            )));
        }
        let Some(mut iface) = iface.take() else {
            return Err(TransferError::Closed);
        };
        let ep = iface.create_ep(EpParams::ToIface {
            device_addr: rail.peer.device_addr.clone(),
            iface_addr: rail.peer.iface_addr.clone(),
        });
        let ep = match ep {
            Ok(ep) => ep,
            Err(source) => {
                rail.state = State::Down(Some(iface));
                return Err(TransferError::PeerUnreachable {
                    transport: format!("{transport} rail {i}"),
                    source,
                });
            }
        };
        let eng = Engine::new(
            ep,
            iface,
            component,
            rail.target.clone(),
            peer_token,
            shared,
            rail.in_flight.clone(),
        );
        rail.state = State::Up(Box::new(eng));
        log::info!(
            "transfer: {transport} rail {i} ({}) is back in service",
            rail.device
        );
        Ok(())
    }

    /// Each rail's counters.
    pub(crate) fn stats(&self, whole: &Counters) -> Vec<RailStats> {
        self.rails
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let c = &r.counters;
                let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let single = !self.is_multi();
                RailStats {
                    rail: i,
                    transport: self.transport.clone(),
                    device: r.device.clone(),
                    in_service: r.is_up(),
                    failure: r.failure.clone(),
                    // One rail carries everything: the Transport's counts.
                    writes: if single {
                        g(&whole.writes)
                    } else {
                        g(&c.writes)
                    },
                    bytes_written: if single {
                        g(&whole.bytes_written)
                    } else {
                        g(&c.bytes_written)
                    },
                    reads: if single { g(&whole.reads) } else { g(&c.reads) },
                    bytes_read: g(&c.bytes_read),
                    reissued: g(&c.reissued),
                }
            })
            .collect()
    }
}

/// Connects rail by rail: our rail i to the peer's offer i of the same
/// transport. The peer must offer as many rails as this side has (a URL of
/// another rail count is refused by name; nothing is connected then).
pub(crate) fn connect(
    cands: &mut Vec<crate::shared::Open>,
    peer_token: u64,
    offers: &[Offer],
    shared: &crate::shared::Shared,
) -> Result<Rails> {
    let transport = cands
        .first()
        .map(|c| c.iface.transport().to_string())
        .ok_or(TransferError::NotBound)?;
    let theirs: Vec<&Offer> = offers.iter().filter(|o| o.transport == transport).collect();
    let ours = shared.rails;
    let mixed = cands.iter().any(|c| c.iface.transport() != transport);
    if theirs.len() != ours || mixed {
        let offered: Vec<String> = offers
            .iter()
            .map(|o| format!("{} on {}", o.transport, o.device))
            .collect();
        return Err(TransferError::NoCommonTransport {
            offered: format!("{} rail(s): {}", offers.len(), offered.join(", ")),
            ours: format!("{ours} rail(s) of {transport}"),
            hint: "both sides must have the same rails of the same transport: set Builder::rails (or devices, or UCT_TRANSFER_RAILS) alike on both".into(),
        });
    }
    for (i, (c, o)) in cands.iter().zip(&theirs).enumerate() {
        if !c.iface.is_reachable(&o.device_addr, &o.iface_addr) {
            return Err(TransferError::PeerUnreachable {
                transport: format!(
                    "{transport} rail {i} ({} to the peer's {})",
                    c.iface.device(),
                    o.device
                ),
                source: UctError::Unreachable(
                    "the peer's address on this rail cannot be reached from this device".into(),
                ),
            });
        }
    }
    let mut eps = Vec::with_capacity(ours);
    for (i, (c, o)) in cands.iter_mut().zip(&theirs).enumerate() {
        let ep = c.connect(o).map_err(|e| match e {
            TransferError::PeerUnreachable { transport, source } => {
                TransferError::PeerUnreachable {
                    transport: format!("{transport} rail {i}"),
                    source,
                }
            }
            other => other,
        })?;
        eps.push(ep);
    }
    let mut engines = Vec::with_capacity(ours);
    for ((c, ep), o) in cands.drain(..).zip(eps).zip(theirs) {
        let device = c.iface.device().to_string();
        let target = c.target();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let eng = Engine::new(
            ep,
            c.iface,
            c.component,
            target,
            peer_token,
            shared,
            in_flight.clone(),
        );
        engines.push((eng, device, o.clone(), in_flight));
    }
    Ok(Rails::new(engines, shared.stripe_min, peer_token))
}
