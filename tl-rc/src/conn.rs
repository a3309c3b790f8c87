//! The I/O half of an rc endpoint: its queue pair and completion queue,
//! bounce and receive buffers, and the calls into verbs. What is posted and
//! what a completion means is decided by the send tracker ([`crate::tx`]);
//! this file carries it out.
//!
//! A port that goes down (port_watch.rs) fails the endpoint at its next
//! look at the clock, or at its first error completion, with an error
//! that names the device, the port and why.
//!
//! A failure moves the QP to the error state first, so that the NIC stops,
//! and each operation is failed (its memory released) only when its own
//! flushed completion says the NIC is done with it. After [`DRAIN_LIMIT`]
//! without one, or at once when the QP cannot be moved to the error state,
//! the QP is destroyed (ibv_destroy_qp returns once the NIC is done with
//! it) and only then do the rest fail. Dropping a connection moves the QP
//! to the error state, takes the flushed completions already there,
//! destroys the QP, then cancels the rest. If the QP cannot be destroyed,
//! the memory its requests point at is leaked, never freed.

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

use md_ib::IbMd;
use rdma_sys::*;
use uct_core::coarse_clock::CoarseInstant;
use uct_core::{
    Access, Completion, CompletionData, MemHandle, MemoryDomain, MemoryType, Result, UctError,
};

use crate::keepalive::Liveness;
use crate::port_watch::PortWatch;
use crate::qp::{wc_opcode, wc_status, Cq, LocalPath, Qp, RemoteQp, RECV_CHAIN};
use crate::tx::{FlushNeed, Plan, Signal, TxEvent, TxOp, TxTracker, WcOpcode, WcStatus, SEQ_LIMIT};

mod liveness;
mod recv;
pub(crate) use recv::Received;

/// Size of one bounce or receive segment: the largest bcopy and AM.
pub(crate) const SEG: usize = 8192;
/// Largest put_zcopy and get_zcopy, as the iface advertises it.
pub(crate) const MAX_ZCOPY: usize = 1 << 30;
/// Zero-copy posts of this many bytes or more are signalled, so that the
/// peer timeout sees their progress (keepalive::FLOOR_BANDWIDTH).
const SIGNAL_BYTES: u64 = 1 << 20;
/// Most scatter/gather entries in one work request.
pub(crate) const MAX_IOV: usize = 8;
/// Receive work requests carry this bit and their segment; send ones are
/// the tracker's ids, below it.
const RECV_BIT: u64 = SEQ_LIMIT;
/// After a failure, how long to wait for the flushed completions of the
/// operations outstanding before failing them anyway (their memory then
/// is released once the QP is destroyed).
const DRAIN_LIMIT: Duration = Duration::from_secs(1);
/// `check` looks at the clock once in this many calls, and `progress` once
/// in this many idle polls: reading it each time would cost more than the
/// poll.
const CHECK_EVERY: u32 = 16;
const IDLE_POLLS_EVERY: u32 = 256;
/// Completions taken from the CQ in one poll.
const POLL_BATCH: usize = 16;
/// A completion entry before the driver writes it.
// SAFETY: ibv_wc is plain C data (integers and a union of integers): all
// zeroes is a valid value.
const ZERO_WC: ibv_wc = unsafe { std::mem::zeroed() };

/// What the user learns when an operation completes.
pub(crate) enum Delivery {
    /// Nothing (put short/bcopy, AM short/bcopy, atomic add).
    Nothing,
    /// A zero-copy operation's completion, if the user gave one.
    Complete(Option<Completion>),
    /// get_bcopy: the bytes read, from the op's bounce segment.
    Bytes(Completion),
    /// A fetching atomic: the old value, from the op's bounce segment.
    Value(Completion),
    /// A keepalive: its completion is a sign of life.
    Keepalive,
}

impl Delivery {
    /// Whether the operation needs its own completion (is signalled).
    fn needs_signal(&self) -> bool {
        !matches!(self, Delivery::Nothing | Delivery::Complete(None))
    }

    fn fail(self, error: &UctError) {
        match self {
            Delivery::Nothing | Delivery::Complete(None) | Delivery::Keepalive => {}
            Delivery::Complete(Some(c)) | Delivery::Bytes(c) | Delivery::Value(c) => {
                c.finish(Err(error.clone()))
            }
        }
    }
}

/// What the connection keeps with each posted operation.
pub(crate) struct OpData {
    pub delivery: Delivery,
    /// Bounce segment to free on completion.
    pub seg: Option<usize>,
    /// Zero-copy memory, alive until the completion (or, when the
    /// completion never came, until the QP is destroyed).
    pub keep: Vec<MemHandle>,
}

type Events = Vec<TxEvent<OpData, Completion>>;

/// An rc endpoint's verbs resources and state; shared by the endpoint and
/// its iface, which polls it.
///
/// The QP is the first field, so that it is destroyed (and the NIC is done
/// with every posted request) before anything its requests point at: the
/// bounce and receive buffers and the operations' memory in `tx`. A failed
/// connection may destroy it early (`None`).
pub(crate) struct Connection {
    qp: Option<Qp>,
    /// The QP's number, which the peer connects to.
    pub(crate) qpn: u32,
    /// What the QP inlines.
    pub(crate) max_inline: u32,
    /// ibv_destroy_qp failed: the NIC may still reach what the QP's
    /// requests point at, which is leaked.
    qp_stuck: bool,
    cq: Arc<Cq>,
    /// The PSN our first send carries.
    pub(crate) psn: u32,
    pub(crate) connected: bool,
    tx: TxTracker<OpData, Completion>,
    /// Reused event list.
    events: Events,
    bounce: MemHandle,
    /// The bounce buffer's host address and length, checked once here:
    /// a fetched value is read from it without a lookup per atomic.
    bounce_host: usize,
    bounce_len: usize,
    pub(crate) bounce_lkey: u32,
    free_segs: Vec<usize>,
    recv: MemHandle,
    /// `recv`'s host address and length, checked once here.
    recv_host: usize,
    recv_len: usize,
    recv_lkey: u32,
    /// Active messages and immediates received, in order, for the iface
    /// to deliver; their segments are reposted after delivery.
    pub(crate) received: Vec<Received>,
    /// Delivered segments not yet given back, and how many to give back in
    /// one call.
    repost_waiting: Vec<usize>,
    repost_batch: usize,
    /// The device, and once connected the peer's QP and GID: what errors
    /// name.
    label: String,
    /// Probes the peer and finds it dead (UCT_RC_PEER_TIMEOUT).
    live: Liveness,
    /// A send completion (or a post into an empty queue), and a message
    /// received, since the clock was last read: `live` learns them at the
    /// next tick, not on every poll or post.
    saw_progress: bool,
    heard: bool,
    idle_polls: u32,
    checks: u32,
    /// When the connection failed (the QP went to the error state).
    failed_at: Option<CoarseInstant>,
    /// The port's watcher, the port, and how many times it had gone down
    /// when this connection was made: the connection fails once it goes
    /// down again.
    watch: Arc<PortWatch>,
    port: u8,
    port_generation: u64,
    /// Where the CQ is polled into, all zeroes between polls: a driver
    /// writes only the fields valid for a completion's kind (mlx5 leaves
    /// the byte_len of a send, the opcode of an error), so the rest must
    /// hold a value before it is read. Kept here and re-zeroed entry by
    /// entry as completions are taken, not zeroed whole per progress call
    /// (768 bytes, a cost in every idle turn of a wait loop).
    wcs: [ibv_wc; POLL_BATCH],
    /// Entries of `wcs` the last poll wrote and not all taken yet: only
    /// other than 0 after a completion's handler (a user's callback)
    /// panicked; the next progress call zeroes them first. The
    /// completions not yet taken are lost with them (their operations or
    /// receive segments are not handled), as a panic leaves them in any
    /// case; what they point at stays allocated until the connection
    /// goes.
    wcs_written: usize,
}

/// Queue lengths and the peer timeout of a new connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queues {
    pub tx: u32,
    pub rx: u32,
    pub peer_timeout: Duration,
}

impl Connection {
    pub(crate) fn new(
        md: &Arc<IbMd>,
        (port, watch): (u8, &Arc<PortWatch>),
        device: &str,
        queues: Queues,
    ) -> Result<Self> {
        let info = md.info();
        let cq = Cq::new(md.pd().context(), queues.tx + queues.rx + 16)?;
        let max_sge = info.max_sge.clamp(1, MAX_IOV as u32);
        let qp = Qp::new(md.pd(), &cq, port, queues.tx, queues.rx, max_sge)?;
        let local = Access::LOCAL_READ | Access::LOCAL_WRITE;
        let bounce = md.alloc(queues.tx as usize * SEG, MemoryType::Host, local)?;
        let recv = md.alloc(queues.rx as usize * SEG, MemoryType::Host, local)?;
        let (bounce_lkey, recv_lkey) = (md.lkey_of(&bounce)?, md.lkey_of(&recv)?);
        let bounce_len = bounce.len();
        let bounce_host = bounce.host_ptr(0, bounce_len)? as usize;
        let recv_len = recv.len();
        let recv_host = recv.host_ptr(0, recv_len)? as usize;
        let mut conn = Connection {
            qpn: qp.qpn(),
            max_inline: qp.max_inline,
            qp: Some(qp),
            qp_stuck: false,
            cq,
            psn: (std::process::id() ^ 0x5a5a5a) & 0xff_ffff,
            connected: false,
            tx: TxTracker::new(device, queues.tx),
            events: Vec::new(),
            bounce,
            bounce_host,
            bounce_len,
            bounce_lkey,
            free_segs: (0..queues.tx as usize).rev().collect(),
            recv,
            recv_host,
            recv_len,
            recv_lkey,
            received: Vec::new(),
            repost_waiting: Vec::with_capacity(RECV_CHAIN),
            repost_batch: (queues.rx as usize / 4).clamp(1, RECV_CHAIN),
            label: device.to_string(),
            live: Liveness::new(queues.peer_timeout, CoarseInstant::now()),
            saw_progress: false,
            heard: false,
            idle_polls: 0,
            checks: 0,
            failed_at: None,
            port_generation: watch.generation(port),
            watch: watch.clone(),
            port,
            wcs: [ZERO_WC; POLL_BATCH],
            wcs_written: 0,
        };
        let segs: Vec<usize> = (0..queues.rx as usize).collect();
        conn.post_recvs(&segs)?;
        Ok(conn)
    }

    /// The QP, unless a failure destroyed it.
    fn qp(&self) -> Result<&Qp> {
        self.qp.as_ref().ok_or_else(|| {
            self.tx.failure().cloned().unwrap_or_else(|| {
                UctError::EndpointFailed(format!("rc {}: the QP was destroyed", self.label))
            })
        })
    }

    /// Destroys the QP, if it is still there: once ibv_destroy_qp returns
    /// the NIC no longer reaches anything its requests pointed at. Returns
    /// false if it could not be destroyed; what its requests point at (the
    /// bounce and receive buffers here, the operations' memory in
    /// `give_up`) is then leaked, never freed.
    fn destroy_qp(&mut self) -> bool {
        if let Some(qp) = self.qp.take() {
            if let Err(e) = qp.destroy() {
                log::error!(
                    "rc {}: {e}; the NIC may still read or write the memory of the requests posted on it, so that memory is leaked (never freed) until the process exits",
                    self.label
                );
                self.qp_stuck = true;
                std::mem::forget(self.bounce.clone());
                std::mem::forget(self.recv.clone());
            }
        }
        !self.qp_stuck
    }

    /// Fails the endpoint: the QP goes to the error state, so that the NIC
    /// stops and flushes what is posted; each operation fails when its
    /// flushed completion comes back (or at the drain limit). If the QP
    /// cannot be moved to the error state, it is destroyed at once and
    /// every operation fails now.
    fn fail(&mut self, error: UctError) {
        let mut stop = false;
        if self.failed_at.is_none() {
            log::debug!("rc {}: endpoint failed: {error}", self.label);
            self.failed_at = Some(CoarseInstant::now());
            if let Some(Err(e)) = self.qp.as_ref().map(Qp::to_error) {
                log::warn!(
                    "rc {}: {e}; the QP is destroyed now instead, so that the NIC stops",
                    self.label
                );
                stop = true;
            }
        }
        let mut events = std::mem::take(&mut self.events);
        self.tx.fail(error, &mut events);
        self.apply(&mut events, 0);
        self.events = events;
        if stop {
            self.give_up();
        }
    }

    /// Stops waiting for flushed completions: the QP is destroyed (the NIC
    /// is done with it when that returns), then the operations still
    /// outstanding fail and their memory is released; if the QP could not
    /// be destroyed, their memory is leaked.
    fn give_up(&mut self) {
        if self.tx.outstanding() > 0 {
            log::debug!(
                "rc {}: {} operations without a flushed completion; the QP is destroyed before they fail",
                self.label,
                self.tx.outstanding()
            );
        }
        let stopped = self.destroy_qp();
        let mut events = std::mem::take(&mut self.events);
        self.tx.give_up(&mut events);
        if !stopped {
            for event in &mut events {
                if let TxEvent::Failed { payload, .. } = event {
                    payload.keep.drain(..).for_each(std::mem::forget);
                }
            }
        }
        self.apply(&mut events, 0);
        self.events = events;
    }

    /// Carries out the tracker's events; `byte_len` is the completion's,
    /// for the operation it names.
    fn apply(&mut self, events: &mut Events, byte_len: u32) {
        for event in events.drain(..) {
            match event {
                TxEvent::Done { payload, named } => {
                    let len = if named { byte_len as usize } else { 0 };
                    self.deliver(payload, len);
                }
                TxEvent::Failed { payload, error } => {
                    if let Some(seg) = payload.seg {
                        self.free_segs.push(seg);
                    }
                    payload.delivery.fail(&error);
                }
                TxEvent::Flushed(c) => c.finish(Ok(())),
                TxEvent::FlushFailed(c, error) => c.finish(Err(error)),
                TxEvent::Stray { wr_id } => log::debug!(
                    "rc {}: a completion for work request {wr_id}, which is not outstanding",
                    self.label
                ),
            }
        }
    }

    fn deliver(&mut self, op: OpData, byte_len: usize) {
        let at = op.seg.unwrap_or(0) * SEG;
        match op.delivery {
            Delivery::Nothing | Delivery::Complete(None) => {}
            Delivery::Keepalive => self.live.probe_answered(),
            Delivery::Complete(Some(c)) => c.finish(Ok(())),
            Delivery::Bytes(c) => {
                let mut data = vec![0u8; byte_len.min(SEG)];
                let _ = self.bounce.read(at, &mut data);
                c.set_data(CompletionData::Bytes(data));
                c.finish(Ok(()));
            }
            Delivery::Value(c) => {
                let old = if at + 8 <= self.bounce_len {
                    // SAFETY: [at, at + 8) lies inside the bounce buffer
                    // (checked just above against the length `host_ptr`
                    // approved in `new`), which this connection owns and
                    // keeps mapped; the NIC wrote the 8 bytes before this
                    // completion and no longer does.
                    unsafe { ((self.bounce_host + at) as *const u64).read_unaligned() }
                } else {
                    0
                };
                c.set_data(CompletionData::Value(old));
                c.finish(Ok(()));
            }
        }
        if let Some(seg) = op.seg {
            self.free_segs.push(seg);
        }
    }

    /// Polls the completion queue; returns how many completions it handled.
    pub(crate) fn progress(&mut self) -> usize {
        if self.wcs_written > 0 {
            let written = self.wcs_written.min(POLL_BATCH);
            self.wcs[..written].fill_with(|| ZERO_WC);
            self.wcs_written = 0;
        }
        let mut total = 0;
        loop {
            let n = match self.cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => {
                    // What a failed poll may have written is wiped.
                    self.wcs = [ZERO_WC; POLL_BATCH];
                    self.fail(e.on(&self.label).into());
                    return total + 1;
                }
            };
            self.wcs_written = n;
            for i in 0..n {
                // Taken out and the slot zeroed again for the next poll.
                let wc = std::mem::replace(&mut self.wcs[i], ZERO_WC);
                self.on_completion(&wc);
            }
            self.wcs_written = 0;
            total += n;
            if n == 0 {
                // Idle: what waits for a batch goes back now.
                self.repost_now();
            }
            if n < POLL_BATCH {
                self.idle_polls = self.idle_polls.wrapping_add(1);
                if self.idle_polls.is_multiple_of(IDLE_POLLS_EVERY) {
                    self.tick(CoarseInstant::now());
                }
                return total;
            }
        }
    }

    fn on_completion(&mut self, wc: &ibv_wc) {
        let status = wc_status(wc);
        if self.failed_at.is_none() && !matches!(status, WcStatus::Success) {
            // An error completion may be the port's doing: then the port
            // is what the endpoint's error names.
            let now = CoarseInstant::now();
            if let Some(why) = self.watch.check_now(self.port, self.port_generation, now) {
                self.port_failed(why);
            }
        }
        if wc.wr_id & RECV_BIT != 0 {
            self.heard = true;
            self.on_receive(wc, status);
            return;
        }
        self.saw_progress = true;
        if matches!(status, WcStatus::Success) {
            if let Some(count) = self.tx.complete_run(wc.wr_id, wc_opcode(wc.opcode)) {
                // The unsignalled operations before the one named, then it.
                for index in 1..=count {
                    if let Some(op) = self.tx.pop_completed() {
                        let len = if index == count {
                            wc.byte_len as usize
                        } else {
                            0
                        };
                        self.deliver(op, len);
                    }
                }
                return;
            }
        }
        let mut events = std::mem::take(&mut self.events);
        self.tx
            .complete(wc.wr_id, &status, wc_opcode(wc.opcode), &mut events);
        self.apply(&mut events, wc.byte_len);
        self.events = events;
        if self.failed_at.is_none() {
            // The tracker failed on this completion (an error status, a
            // wrong opcode): the rest of the failure path is ours.
            if let Some(error) = self.tx.failure().cloned() {
                self.fail(error);
            }
        }
    }

    /// Ok(false) when out of send credits (NoResource).
    pub(crate) fn ready(&mut self) -> Result<bool> {
        if let Some(e) = self.tx.failure() {
            return Err(e.clone());
        }
        if !self.connected {
            return Err(UctError::InvalidParam(
                "the rc endpoint is not connected; call connect_to_ep with the peer endpoint's address first".into(),
            ));
        }
        self.tx.ready()
    }

    /// A free bounce segment, if any.
    pub(crate) fn take_seg(&mut self) -> Option<usize> {
        self.free_segs.pop()
    }

    /// Gives back a segment taken for an operation that was not posted.
    pub(crate) fn give_seg(&mut self, seg: usize) {
        self.free_segs.push(seg);
    }

    /// The address of bounce segment `seg`.
    pub(crate) fn seg_addr(&self, seg: usize) -> u64 {
        self.bounce.addr() + (seg * SEG) as u64
    }

    /// Copies `data` into bounce segment `seg` at `offset`.
    pub(crate) fn write_seg(&self, seg: usize, offset: usize, data: &[u8]) -> Result<()> {
        self.bounce.write(seg * SEG + offset, data)
    }

    /// Posts `wr` for the operation, signalled as the tracker says (always
    /// when the op needs its own completion, when bounce segments run low,
    /// or when `force` says so), fenced if a fence is pending. On error the
    /// op's segment is freed and its completion failed.
    pub(crate) fn post(
        &mut self,
        wr: &mut ibv_send_wr,
        data: OpData,
        expect: WcOpcode,
        what: &'static str,
        force: bool,
    ) -> Result<()> {
        let bytes = wr_bytes(wr);
        let always = force
            || data.delivery.needs_signal()
            || self.free_segs.len() < crate::tx::MODERATION as usize
            || bytes >= SIGNAL_BYTES;
        let plan = self.tx.plan(if always {
            Signal::Always
        } else {
            Signal::Moderated
        });
        if self.post_planned(wr, data, bytes, expect, what, plan)? {
            // The peer timeout counts from the first op outstanding, as of
            // the next look at the clock (`tick`, which comes before any
            // verdict): a ping-pong that empties the queue every time reads
            // no clock per post.
            self.saw_progress = true;
        }
        Ok(())
    }

    /// How to post a keepalive (signalled, unfenced).
    pub(crate) fn keepalive_plan(&self) -> Plan {
        self.tx.plan_keepalive()
    }

    /// Posts `wr` (which moves `bytes`) as `plan` says; returns whether it
    /// is the only operation outstanding.
    pub(crate) fn post_planned(
        &mut self,
        wr: &mut ibv_send_wr,
        data: OpData,
        bytes: u64,
        expect: WcOpcode,
        what: &'static str,
        plan: Plan,
    ) -> Result<bool> {
        wr.wr_id = plan.seq;
        if plan.signalled {
            wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if plan.fenced {
            wr.send_flags |= ibv_send_flags::IBV_SEND_FENCE.0;
        }
        let posted = match self.qp() {
            // SAFETY: the SGEs point into this connection's bounce buffer
            // (registered, alive as long as the QP), into memory the op
            // keeps alive in `data.keep` until its completion (or the QP's
            // destruction), or are inline.
            Ok(qp) => unsafe { qp.post_send(wr) }.map_err(UctError::from),
            Err(e) => Err(e),
        };
        if let Err(e) = posted {
            self.tx.abandon(plan);
            if let Some(seg) = data.seg {
                self.free_segs.push(seg);
            }
            data.delivery.fail(&e);
            return Err(e);
        }
        let op = TxOp {
            expect,
            what,
            bytes,
            payload: data,
        };
        Ok(self.tx.post(plan, op))
    }

    /// Flushes: done now, or `comp` fires when everything posted before
    /// has completed.
    pub(crate) fn flush(&mut self, comp: Option<&Completion>) -> Result<uct_core::Status> {
        match self.tx.flush()? {
            FlushNeed::Done => return Ok(uct_core::Status::Done),
            FlushNeed::NoResource => return Ok(uct_core::Status::NoResource),
            FlushNeed::Wait => {}
            FlushNeed::SignalTail => self.post_nop()?,
        }
        if let Some(c) = comp {
            c.start();
            self.tx.add_flush(c.clone());
        }
        Ok(uct_core::Status::InProgress)
    }

    /// Orders the next post after every one before it.
    pub(crate) fn fence(&mut self) -> Result<()> {
        self.tx.fence()
    }

    /// Connects the QP to the peer's.
    pub(crate) fn connect(&mut self, local: &LocalPath, remote: &RemoteQp) -> Result<()> {
        if self.connected {
            return Err(UctError::InvalidParam(
                "the rc endpoint is already connected".into(),
            ));
        }
        self.qp()?.connect(local, self.psn, remote)?;
        self.connected = true;
        self.label = format!(
            "{} to peer QP {:#x} at {}",
            self.label,
            remote.qpn,
            Ipv6Addr::from(remote.gid)
        );
        self.tx.rename(&self.label);
        self.live.sign_of_life(CoarseInstant::now());
        Ok(())
    }
}

impl Drop for Connection {
    /// Operations still outstanding fail (Canceled) once the NIC is done
    /// with them: the QP goes to the error state, the flushed completions
    /// already there are taken, the QP is destroyed (the NIC is done with
    /// it when that returns), then the rest are canceled. No waiting.
    fn drop(&mut self) {
        if self.tx.outstanding() == 0 {
            // No flush waits either: flushes wait only for operations.
            return;
        }
        self.fail(UctError::Canceled(format!(
            "rc {}: the endpoint was destroyed with the operation outstanding",
            self.label
        )));
        self.progress();
        self.give_up();
    }
}

/// The bytes `wr` moves: the lengths of its SGEs.
fn wr_bytes(wr: &ibv_send_wr) -> u64 {
    if wr.sg_list.is_null() || wr.num_sge <= 0 {
        return 0;
    }
    // SAFETY: the work requests of this file are built by post.rs, whose
    // `sg_list` points at `num_sge` SGEs that live while the request is
    // being posted (the caller's contract for posting it at all).
    let sges = unsafe { std::slice::from_raw_parts(wr.sg_list, wr.num_sge as usize) };
    sges.iter().map(|sge| u64::from(sge.length)).sum()
}
