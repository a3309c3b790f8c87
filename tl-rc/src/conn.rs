//! The I/O half of an rc endpoint: its queue pair and completion queue,
//! bounce and receive buffers, and the calls into verbs. What is posted and
//! what a completion means is decided by the send tracker ([`crate::tx`]);
//! this file carries it out.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use md_ib::IbMd;
use rdma_sys::*;
use uct_core::{
    Access, Completion, CompletionData, MemHandle, MemoryDomain, MemoryType, Result, UctError,
};

use crate::qp::{wc_opcode, wc_status, Cq, LocalPath, Qp, RemoteQp};
use crate::tx::{FlushNeed, Signal, TxEvent, TxOp, TxTracker, WcOpcode, WcStatus, SEQ_LIMIT};
use crate::wire::Immediate;

/// Size of one bounce or receive segment: the largest bcopy and AM.
pub(crate) const SEG: usize = 8192;
/// Largest put_zcopy and get_zcopy, as the iface advertises it.
pub(crate) const MAX_ZCOPY: usize = 1 << 30;
/// Most scatter/gather entries in one work request.
pub(crate) const MAX_IOV: usize = 8;
/// Receive work requests carry this bit and their segment; send ones are
/// the tracker's ids, below it.
const RECV_BIT: u64 = SEQ_LIMIT;

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
}

impl Delivery {
    /// Whether the operation needs its own completion (is signalled).
    fn needs_signal(&self) -> bool {
        !matches!(self, Delivery::Nothing | Delivery::Complete(None))
    }

    fn fail(self, error: &UctError) {
        match self {
            Delivery::Nothing | Delivery::Complete(None) => {}
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
    /// Zero-copy memory, alive until the completion.
    pub _keep: Vec<MemHandle>,
}

type Events = Vec<TxEvent<OpData, Completion>>;

/// An rc endpoint's verbs resources and state; shared by the endpoint and
/// its iface, which polls it.
pub(crate) struct Connection {
    pub(crate) qp: Qp,
    cq: Arc<Cq>,
    /// The PSN our first send carries.
    pub(crate) psn: u32,
    pub(crate) connected: bool,
    tx: TxTracker<OpData, Completion>,
    /// Reused event list.
    events: Events,
    bounce: MemHandle,
    pub(crate) bounce_lkey: u32,
    free_segs: Vec<usize>,
    recv: MemHandle,
    recv_lkey: u32,
    /// Active messages received, for the iface to deliver: id, receive
    /// segment and length. The segment is reposted after delivery.
    pub(crate) ams: VecDeque<(u8, usize, usize)>,
    device: String,
    /// With operations outstanding and no completion for this long, the
    /// peer is taken for dead: some NICs (rxe) never time out a QP whose
    /// peer is gone.
    peer_timeout: Duration,
    /// When the clock last saw progress; `saw_progress` records progress
    /// seen since, without reading the clock each time.
    last_completion: Instant,
    saw_progress: bool,
    idle_polls: u32,
    /// Reused completion array.
    wcs: Vec<ibv_wc>,
}

/// Queue lengths and the peer timeout of a new connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queues {
    pub tx: u32,
    pub rx: u32,
    pub peer_timeout: Duration,
}

impl Connection {
    pub(crate) fn new(md: &Arc<IbMd>, port: u8, device: &str, queues: Queues) -> Result<Self> {
        let info = md.info();
        let cq = Cq::new(md.pd().context(), queues.tx + queues.rx + 16)?;
        let max_sge = info.max_sge.clamp(1, MAX_IOV as u32);
        let qp = Qp::new(md.pd(), &cq, port, queues.tx, queues.rx, max_sge)?;
        let local = Access::LOCAL_READ | Access::LOCAL_WRITE;
        let bounce = md.alloc(queues.tx as usize * SEG, MemoryType::Host, local)?;
        let recv = md.alloc(queues.rx as usize * SEG, MemoryType::Host, local)?;
        let (bounce_lkey, recv_lkey) = (md.lkey_of(&bounce)?, md.lkey_of(&recv)?);
        let mut conn = Connection {
            qp,
            cq,
            psn: (std::process::id() ^ 0x5a5a5a) & 0xff_ffff,
            connected: false,
            tx: TxTracker::new(device, queues.tx),
            events: Vec::new(),
            bounce,
            bounce_lkey,
            free_segs: (0..queues.tx as usize).rev().collect(),
            recv,
            recv_lkey,
            ams: VecDeque::new(),
            device: device.to_string(),
            peer_timeout: queues.peer_timeout,
            last_completion: Instant::now(),
            saw_progress: false,
            idle_polls: 0,
            // SAFETY: ibv_wc is plain C data (integers and a union of
            // integers): all zeroes is a valid value.
            wcs: (0..16).map(|_| unsafe { std::mem::zeroed() }).collect(),
        };
        for seg in 0..queues.rx as usize {
            conn.post_recv(seg)?;
        }
        Ok(conn)
    }

    /// Hands receive segment `seg` to the NIC.
    fn post_recv(&mut self, seg: usize) -> Result<()> {
        let addr = self.recv.addr() + (seg * SEG) as u64;
        // SAFETY: the segment lies inside `recv`, registered with
        // `recv_lkey` and owned by this connection (which outlives the QP's
        // work); the CPU reads it only after its completion, until it is
        // posted again.
        unsafe {
            self.qp
                .post_recv(RECV_BIT | seg as u64, addr, SEG as u32, self.recv_lkey)
        }?;
        Ok(())
    }

    fn fail(&mut self, error: UctError) {
        log::debug!("rc {}: endpoint failed: {error}", self.device);
        let mut events = std::mem::take(&mut self.events);
        self.tx.fail(error, &mut events);
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
                    self.device
                ),
            }
        }
    }

    fn deliver(&mut self, op: OpData, byte_len: usize) {
        let at = op.seg.unwrap_or(0) * SEG;
        match op.delivery {
            Delivery::Nothing | Delivery::Complete(None) => {}
            Delivery::Complete(Some(c)) => c.finish(Ok(())),
            Delivery::Bytes(c) => {
                let mut data = vec![0u8; byte_len.min(SEG)];
                let _ = self.bounce.read(at, &mut data);
                c.set_data(CompletionData::Bytes(data));
                c.finish(Ok(()));
            }
            Delivery::Value(c) => {
                let mut old = [0u8; 8];
                let _ = self.bounce.read(at, &mut old);
                c.set_data(CompletionData::Value(u64::from_ne_bytes(old)));
                c.finish(Ok(()));
            }
        }
        if let Some(seg) = op.seg {
            self.free_segs.push(seg);
        }
    }

    /// Polls the completion queue; returns how many completions it handled.
    pub(crate) fn progress(&mut self) -> usize {
        let mut wcs = std::mem::take(&mut self.wcs);
        let n = self.poll_into(&mut wcs);
        self.wcs = wcs;
        n
    }

    fn poll_into(&mut self, wcs: &mut [ibv_wc]) -> usize {
        let mut total = 0;
        loop {
            let n = match self.cq.poll(wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.fail(e.on(&self.device).into());
                    return total + 1;
                }
            };
            for wc in &wcs[..n] {
                self.on_completion(wc);
            }
            total += n;
            if n > 0 {
                self.saw_progress = true;
            }
            if n < wcs.len() {
                // Reading the clock on every poll would cost more than the
                // poll: look at it every few thousand idle polls.
                self.idle_polls = self.idle_polls.wrapping_add(1);
                if self.idle_polls.is_multiple_of(4096) && self.peer_timed_out() {
                    let error = UctError::EndpointFailed(format!(
                        "rc {}: no work completion for {:?} with {} operations outstanding; the peer is dead or unreachable (UCT_RC_PEER_TIMEOUT)",
                        self.device, self.peer_timeout, self.tx.outstanding()
                    ));
                    self.qp.to_error();
                    self.fail(error);
                    return total + 1;
                }
                return total;
            }
        }
    }

    /// Whether operations have waited for a completion longer than the
    /// peer timeout.
    fn peer_timed_out(&mut self) -> bool {
        if self.tx.outstanding() == 0
            || self.tx.failure().is_some()
            || std::mem::take(&mut self.saw_progress)
        {
            self.last_completion = Instant::now();
            return false;
        }
        self.last_completion.elapsed() > self.peer_timeout
    }

    fn on_completion(&mut self, wc: &ibv_wc) {
        let status = wc_status(wc);
        if wc.wr_id & RECV_BIT != 0 {
            self.on_receive(wc, status);
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        self.tx
            .complete(wc.wr_id, &status, wc_opcode(wc.opcode), &mut events);
        self.apply(&mut events, wc.byte_len);
        self.events = events;
    }

    fn on_receive(&mut self, wc: &ibv_wc, status: WcStatus) {
        let seg = (wc.wr_id & !RECV_BIT) as usize;
        if let WcStatus::Failed {
            name,
            code,
            vendor_err,
        } = status
        {
            if self.tx.failure().is_none() {
                self.fail(UctError::EndpointFailed(format!(
                    "rc {}: a receive failed with work completion status {name} ({code}), vendor error {vendor_err:#x}",
                    self.device
                )));
            }
            return;
        }
        if wc.opcode != ibv_wc_opcode::IBV_WC_RECV
            || wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0
        {
            self.fail(UctError::Protocol(format!(
                "rc {}: a receive completed with {} and no immediate",
                self.device,
                wc_opcode(wc.opcode)
            )));
            return;
        }
        // SAFETY: with IBV_WC_WITH_IMM set, the union holds the immediate.
        let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
        match Immediate::decode(imm) {
            Ok(Immediate::Nop) => self.repost(seg),
            // Delivered in place by the iface, then reposted.
            Ok(Immediate::ActiveMessage(id)) => {
                let len = (wc.byte_len as usize).min(SEG);
                self.ams.push_back((id, seg, len));
            }
            Err(e) => self.fail(UctError::Protocol(format!("rc {}: {e}", self.device))),
        }
    }

    /// The receive buffers, for delivering active messages in place.
    pub(crate) fn recv_buffer(&self) -> &MemHandle {
        &self.recv
    }

    /// Gives receive segment `seg` back to the NIC after its message was
    /// delivered.
    pub(crate) fn repost(&mut self, seg: usize) {
        if self.tx.failure().is_some() {
            return;
        }
        if let Err(e) = self.post_recv(seg) {
            self.fail(e);
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
        let always = force
            || data.delivery.needs_signal()
            || self.free_segs.len() < crate::tx::MODERATION as usize;
        let plan = self.tx.plan(if always {
            Signal::Always
        } else {
            Signal::Moderated
        });
        wr.wr_id = plan.seq;
        if plan.signalled {
            wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if plan.fenced {
            wr.send_flags |= ibv_send_flags::IBV_SEND_FENCE.0;
        }
        // SAFETY: the SGEs point into this connection's bounce buffer
        // (registered, alive as long as the QP), into memory the op keeps
        // alive in `data.keep` until its completion, or are inline.
        if let Err(e) = unsafe { self.qp.post_send(wr) } {
            self.tx.abandon(plan);
            let e = UctError::from(e);
            if let Some(seg) = data.seg {
                self.free_segs.push(seg);
            }
            data.delivery.fail(&e);
            return Err(e);
        }
        let op = TxOp {
            expect,
            what,
            payload: data,
        };
        if self.tx.post(plan, op) {
            // The peer timeout counts from the first op outstanding.
            self.saw_progress = true;
        }
        Ok(())
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
        self.qp.connect(local, self.psn, remote)?;
        self.connected = true;
        Ok(())
    }
}
