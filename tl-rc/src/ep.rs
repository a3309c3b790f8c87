//! The rc endpoint: one RC queue pair with its own completion queue, send
//! credits, bounce and receive buffers. Every work completion's status and
//! opcode is checked; a failed one fails the endpoint with the status named.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use md_ib::{IbMd, IbRkey};
use rdma_sys::*;
use uct_core::{
    Access, AtomicValue, Completion, CompletionData, Endpoint, FetchOp, Iov, MemHandle,
    MemoryDomain, MemoryType, RemoteKey, Result, Status, UctError,
};

use crate::qp::{wc_status_name, Cq, Qp, Remote};

/// Size of one bounce or receive segment: the largest bcopy and AM.
pub(crate) const SEG: usize = 8192;
const RECV_BIT: u64 = 1 << 63;
pub(crate) const MAX_IOV: usize = 8;
/// Signal one send in this many (the others complete with it).
const MODERATION: u32 = 16;
/// Immediate of the empty sends a flush uses; the receiver drops them.
const NOP_ID: u8 = 0xff;

/// What a posted work request completes.
enum Kind {
    /// Nothing for the user (put short/bcopy, AM short/bcopy, atomic add).
    Plain,
    /// A zero-copy operation's completion.
    Comp(Option<Completion>),
    /// get_bcopy: bytes arrive in bounce segment `seg`.
    GetBcopy(Completion, usize),
    /// A fetching atomic: the old value arrives in bounce segment `seg`.
    Fetch(Completion, usize),
}

struct Op {
    kind: Kind,
    /// Bounce segment to free on completion.
    seg: Option<usize>,
    /// Zero-copy memory, alive until the completion.
    _keep: Vec<MemHandle>,
    expect: ibv_wc_opcode::Type,
    what: &'static str,
}

/// What the endpoint and its iface share.
pub(crate) struct EpInner {
    pub(crate) qp: Qp,
    cq: Arc<Cq>,
    pub(crate) psn: u32,
    connected: bool,
    failed: Option<UctError>,
    tx_free: u32,
    /// Posted operations in order, with their sequence numbers. Only some
    /// are signalled (tx moderation, as UCX does): a completion also
    /// completes every operation posted before it (RC keeps order).
    ops: VecDeque<(u64, Op)>,
    next_seq: u64,
    since_signal: u32,
    /// Whether the last posted operation was signalled.
    tail_signaled: bool,
    outstanding: usize,
    flushes: Vec<Completion>,
    fence: bool,
    bounce: MemHandle,
    bounce_lkey: u32,
    free_segs: Vec<usize>,
    recv: MemHandle,
    recv_lkey: u32,
    /// Active messages received, for the iface to deliver: id, receive
    /// segment and length. The segment is reposted after delivery.
    pub(crate) ams: VecDeque<(u8, usize, usize)>,
    dev: String,
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

impl EpInner {
    pub(crate) fn new(
        md: &Arc<IbMd>,
        port: u8,
        dev: &str,
        tx: u32,
        rx: u32,
        peer_timeout: Duration,
    ) -> Result<EpInner> {
        let info = md.info();
        let cq = Cq::new(md.pd().context(), tx + rx + 16)?;
        let qp = Qp::new(
            md.pd(),
            &cq,
            port,
            tx,
            rx,
            (info.max_sge.max(1)).min(MAX_IOV as u32),
        )?;
        let bounce = md.alloc(
            tx as usize * SEG,
            MemoryType::Host,
            Access::LOCAL_READ | Access::LOCAL_WRITE,
        )?;
        let recv = md.alloc(
            rx as usize * SEG,
            MemoryType::Host,
            Access::LOCAL_READ | Access::LOCAL_WRITE,
        )?;
        let (bounce_lkey, recv_lkey) = (md.lkey_of(&bounce)?, md.lkey_of(&recv)?);
        for i in 0..rx as u64 {
            qp.post_recv(
                RECV_BIT | i,
                recv.addr() + i * SEG as u64,
                SEG as u32,
                recv_lkey,
            )?;
        }
        Ok(EpInner {
            qp,
            cq,
            psn: (std::process::id() ^ 0x5a5a5a) & 0xff_ffff,
            connected: false,
            failed: None,
            tx_free: tx,
            ops: VecDeque::new(),
            next_seq: 1,
            since_signal: 0,
            tail_signaled: true,
            outstanding: 0,
            flushes: Vec::new(),
            fence: false,
            bounce,
            bounce_lkey,
            free_segs: (0..tx as usize).rev().collect(),
            recv,
            recv_lkey,
            ams: VecDeque::new(),
            dev: dev.to_string(),
            peer_timeout,
            last_completion: Instant::now(),
            saw_progress: false,
            idle_polls: 0,
            // SAFETY: ibv_wc is plain data; all zeroes is a valid value.
            wcs: (0..16).map(|_| unsafe { std::mem::zeroed() }).collect(),
        })
    }

    fn fail(&mut self, err: UctError) {
        log::debug!("rc {}: endpoint failed: {err}", self.dev);
        for (_, op) in self.ops.drain(..) {
            match op.kind {
                Kind::Plain => {}
                Kind::Comp(c) => {
                    if let Some(c) = c {
                        c.finish(Err(err.clone()));
                    }
                }
                Kind::GetBcopy(c, _) | Kind::Fetch(c, _) => c.finish(Err(err.clone())),
            }
        }
        for c in self.flushes.drain(..) {
            c.finish(Err(err.clone()));
        }
        self.outstanding = 0;
        self.failed.get_or_insert(err);
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
                    self.fail(e);
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
                    let e = UctError::EndpointFailed(format!(
                        "rc {}: no work completion for {:?} with {} operations outstanding; the peer is dead or unreachable (UCT_RC_PEER_TIMEOUT)",
                        self.dev, self.peer_timeout, self.outstanding
                    ));
                    self.qp.to_error();
                    self.fail(e);
                    return total + 1;
                }
                return total;
            }
        }
    }

    /// Whether operations have waited for a completion longer than the
    /// peer timeout.
    fn peer_timed_out(&mut self) -> bool {
        if self.outstanding == 0 || self.failed.is_some() || std::mem::take(&mut self.saw_progress)
        {
            self.last_completion = Instant::now();
            return false;
        }
        self.last_completion.elapsed() > self.peer_timeout
    }

    fn on_completion(&mut self, wc: &ibv_wc) {
        if wc.wr_id & RECV_BIT != 0 {
            let i = (wc.wr_id & !RECV_BIT) as usize;
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                if self.failed.is_none() {
                    let e = self.wc_error("a receive", wc);
                    self.fail(e);
                }
                return;
            }
            if wc.opcode != ibv_wc_opcode::IBV_WC_RECV
                || wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0
            {
                let e = UctError::Protocol(format!(
                    "rc {}: a receive completed with opcode {} and no immediate",
                    self.dev, wc.opcode
                ));
                self.fail(e);
                return;
            }
            // SAFETY: the union holds the immediate for IBV_WC_WITH_IMM.
            let id = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data }) as u8;
            if id == NOP_ID {
                self.repost(i);
                return;
            }
            let len = (wc.byte_len as usize).min(SEG);
            // Delivered in place by the iface, then reposted.
            self.ams.push_back((id, i, len));
            return;
        }
        let seq = wc.wr_id;
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            let what = self
                .ops
                .iter()
                .find(|(s, _)| *s == seq)
                .map_or("an operation", |(_, op)| op.what);
            let e = self.wc_error(what, wc);
            self.fail(e);
            return;
        }
        // This completion completes every operation up to it.
        while self.ops.front().is_some_and(|(s, _)| *s <= seq) {
            let Some((s, op)) = self.ops.pop_front() else {
                break;
            };
            self.tx_free += 1;
            self.outstanding = self.outstanding.saturating_sub(1);
            if s == seq && wc.opcode != op.expect {
                let e = UctError::Protocol(format!(
                    "rc {}: {} completed with opcode {}, expected {}",
                    self.dev, op.what, wc.opcode, op.expect
                ));
                if let Some(seg) = op.seg {
                    self.free_segs.push(seg);
                }
                self.fail(e);
                return;
            }
            match op.kind {
                Kind::Plain | Kind::Comp(None) => {}
                Kind::Comp(Some(c)) => c.finish(Ok(())),
                Kind::GetBcopy(c, seg) => {
                    let len = wc.byte_len as usize;
                    let mut data = vec![0u8; len.min(SEG)];
                    let _ = self.bounce.read(seg * SEG, &mut data);
                    c.set_data(CompletionData::Bytes(data));
                    c.finish(Ok(()));
                }
                Kind::Fetch(c, seg) => {
                    let mut b = [0u8; 8];
                    let _ = self.bounce.read(seg * SEG, &mut b);
                    c.set_data(CompletionData::Value(u64::from_ne_bytes(b)));
                    c.finish(Ok(()));
                }
            }
            if let Some(seg) = op.seg {
                self.free_segs.push(seg);
            }
        }
        if self.outstanding == 0 {
            for c in self.flushes.drain(..) {
                c.finish(Ok(()));
            }
        }
    }

    /// The receive buffers, for delivering active messages in place.
    pub(crate) fn recv_buffer(&self) -> &MemHandle {
        &self.recv
    }

    /// Gives receive segment `i` back to the NIC after its message was
    /// delivered.
    pub(crate) fn repost(&mut self, i: usize) {
        if self.failed.is_some() {
            return;
        }
        let addr = self.recv.addr() + (i * SEG) as u64;
        if let Err(e) = self
            .qp
            .post_recv(RECV_BIT | i as u64, addr, SEG as u32, self.recv_lkey)
        {
            self.fail(e);
        }
    }

    fn wc_error(&self, what: &str, wc: &ibv_wc) -> UctError {
        UctError::EndpointFailed(format!(
            "rc {}: {what} failed with work completion status {} ({}), vendor error {:#x}",
            self.dev,
            wc_status_name(wc.status),
            wc.status,
            wc.vendor_err
        ))
    }

    /// Ok(false) when out of send credits (NoResource).
    fn ready(&mut self) -> Result<bool> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if !self.connected {
            return Err(UctError::InvalidParam(
                "the rc endpoint is not connected; call connect_to_ep with the peer endpoint's address first".into(),
            ));
        }
        Ok(self.tx_free > 0)
    }

    fn seg(&mut self) -> Option<usize> {
        self.free_segs.pop()
    }

    fn seg_addr(&self, seg: usize) -> u64 {
        self.bounce.addr() + (seg * SEG) as u64
    }

    /// Posts `wr` for `op`, fenced if a fence is pending. It is signalled
    /// when the op needs its own completion, every MODERATION posts, when
    /// credits or bounce segments run low, or when `force` says so.
    fn post_with(&mut self, wr: &mut ibv_send_wr, op: Op, force: bool) -> Result<()> {
        let needs = !matches!(op.kind, Kind::Plain | Kind::Comp(None));
        let signal = force
            || needs
            || self.since_signal + 1 >= MODERATION
            || self.tx_free <= MODERATION
            || self.free_segs.len() < MODERATION as usize;
        let seq = self.next_seq;
        self.next_seq += 1;
        wr.wr_id = seq;
        if signal {
            wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if std::mem::take(&mut self.fence) {
            wr.send_flags |= ibv_send_flags::IBV_SEND_FENCE.0;
        }
        if let Err(e) = self.qp.post_send(wr) {
            if let Some(s) = op.seg {
                self.free_segs.push(s);
            }
            return Err(e);
        }
        self.since_signal = if signal { 0 } else { self.since_signal + 1 };
        self.tail_signaled = signal;
        self.ops.push_back((seq, op));
        self.tx_free -= 1;
        if self.outstanding == 0 {
            // The peer timeout counts from the first op outstanding.
            self.saw_progress = true;
        }
        self.outstanding += 1;
        Ok(())
    }

    fn post(&mut self, wr: &mut ibv_send_wr, op: Op) -> Result<()> {
        self.post_with(wr, op, false)
    }

    /// Makes the last posted operation's completion visible: a signalled
    /// empty send the peer drops (immediate NOP_ID). Ok(false): no credit.
    fn signal_tail(&mut self) -> Result<bool> {
        if self.tail_signaled {
            return Ok(true);
        }
        if self.tx_free == 0 {
            return Ok(false);
        }
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &mut []);
        wr.imm_data_invalidated_rkey_union.imm_data = (NOP_ID as u32).to_be();
        let op = Op {
            kind: Kind::Plain,
            seg: None,
            _keep: Vec::new(),
            expect: ibv_wc_opcode::IBV_WC_SEND,
            what: "flush",
        };
        self.post_with(&mut wr, op, true)?;
        Ok(true)
    }
}

fn empty_wr(opcode: ibv_wr_opcode::Type, sges: &mut [ibv_sge]) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain data; zeroed is valid, then filled in.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.opcode = opcode;
    wr.sg_list = sges.as_mut_ptr();
    wr.num_sge = sges.len() as i32;
    wr
}

fn set_rdma(wr: &mut ibv_send_wr, addr: u64, rkey: u32) {
    wr.wr.rdma = rdma_t {
        remote_addr: addr,
        rkey,
    };
}

/// What connecting needs from the iface.
pub(crate) struct Local {
    pub port: u8,
    pub gid_index: u32,
    pub ethernet: bool,
    pub mtu: ibv_mtu::Type,
    pub rd_atomic: u8,
    /// Largest put_short: what the QP inlines.
    pub max_short: usize,
}

/// An rc endpoint.
pub(crate) struct RcEp {
    inner: Arc<Mutex<EpInner>>,
    md: Arc<IbMd>,
    local: Local,
    max_short: usize,
}

impl RcEp {
    pub(crate) fn new(inner: Arc<Mutex<EpInner>>, md: Arc<IbMd>, local: Local) -> Self {
        let inline = inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .qp
            .max_inline as usize;
        let max_short = local.max_short.min(inline);
        RcEp {
            inner,
            md,
            local,
            max_short,
        }
    }

    fn lock(&self) -> MutexGuard<'_, EpInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(rkey: &RemoteKey) -> Result<&IbRkey> {
        rkey.downcast::<IbRkey>("rc")
    }

    fn check_id(id: u8) -> Result<()> {
        if id as usize >= uct_core::iface::AM_ID_MAX {
            return Err(UctError::InvalidParam(format!(
                "active message id {id} is not below {}",
                uct_core::iface::AM_ID_MAX
            )));
        }
        Ok(())
    }

    fn check_size(what: &str, len: usize, max: usize) -> Result<()> {
        uct_core::memory::check_size("rc", what, len, max)
    }

    fn sges(&self, iov: &[Iov<'_>]) -> Result<(Vec<ibv_sge>, Vec<MemHandle>, usize)> {
        if iov.len() > MAX_IOV {
            return Err(UctError::InvalidParam(format!(
                "{} iov entries, rc takes at most {MAX_IOV}",
                iov.len()
            )));
        }
        let mut sges = Vec::with_capacity(iov.len());
        let mut keep = Vec::with_capacity(iov.len());
        let mut total = 0usize;
        for e in iov {
            if e.mem.mem_type() != MemoryType::Host && e.mem.md_name() != self.md.name() {
                return Err(UctError::MemoryTypeUnsupported {
                    mem_type: e.mem.mem_type(),
                    owner: "transport rc".into(),
                    hint: format!(
                        "register it with the NIC first (its MD {} registers DMA-buf fds{})",
                        self.md.name(),
                        if self.md.supports_dmabuf() {
                            ""
                        } else {
                            ", but this NIC cannot import DMA-buf"
                        }
                    ),
                });
            }
            e.mem.check_range(e.offset, e.len)?;
            let lkey = self.md.lkey_of(e.mem)?;
            sges.push(ibv_sge {
                addr: e.mem.addr() + e.offset as u64,
                length: e.len as u32,
                lkey,
            });
            keep.push(e.mem.clone());
            total += e.len;
        }
        Ok((sges, keep, total))
    }

    /// A put or AM send of `data` via inline or a bounce segment.
    fn send_copy(
        &mut self,
        opcode: ibv_wr_opcode::Type,
        parts: &[&[u8]],
        remote: Option<(u64, u32)>,
        imm: Option<u8>,
        what: &'static str,
    ) -> Result<Status> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let max_short = self.max_short;
        let mut g = self.lock();
        if !g.ready()? {
            return Ok(Status::NoResource);
        }
        let expect = if opcode == ibv_wr_opcode::IBV_WR_RDMA_WRITE {
            ibv_wc_opcode::IBV_WC_RDMA_WRITE
        } else {
            ibv_wc_opcode::IBV_WC_SEND
        };
        let inline = total <= max_short && parts.len() <= MAX_IOV;
        let mut seg = None;
        // On the stack: no allocation per message.
        let mut sges = [ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_IOV];
        let mut n = 0;
        if inline {
            for p in parts {
                sges[n] = ibv_sge {
                    addr: p.as_ptr() as u64,
                    length: p.len() as u32,
                    lkey: 0,
                };
                n += 1;
            }
        } else {
            let Some(s) = g.seg() else {
                return Ok(Status::NoResource);
            };
            let mut at = s * SEG;
            for p in parts {
                g.bounce.write(at, p)?;
                at += p.len();
            }
            sges[0] = ibv_sge {
                addr: g.seg_addr(s),
                length: total as u32,
                lkey: g.bounce_lkey,
            };
            n = 1;
            seg = Some(s);
        }
        let mut wr = empty_wr(opcode, &mut sges[..n]);
        if inline {
            wr.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if let Some((addr, rkey)) = remote {
            set_rdma(&mut wr, addr, rkey);
        }
        if let Some(id) = imm {
            wr.imm_data_invalidated_rkey_union.imm_data = (id as u32).to_be();
        }
        g.post(
            &mut wr,
            Op {
                kind: Kind::Plain,
                seg,
                _keep: Vec::new(),
                expect,
                what,
            },
        )?;
        Ok(Status::Done)
    }
}

impl Endpoint for RcEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), self.max_short)?;
        let k = Self::key(rkey)?;
        k.precheck(remote_addr, data.len() as u64, Access::REMOTE_WRITE)?;
        self.send_copy(
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[data],
            Some((remote_addr, k.rkey)),
            None,
            "put_short",
        )
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_bcopy", data.len(), SEG)?;
        let k = Self::key(rkey)?;
        k.precheck(remote_addr, data.len() as u64, Access::REMOTE_WRITE)?;
        self.send_copy(
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[data],
            Some((remote_addr, k.rkey)),
            None,
            "put_bcopy",
        )
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.rdma_zcopy(RDMA_WRITE, iov, remote_addr, rkey, comp)
    }

    fn get_short(
        &mut self,
        _buf: &mut [u8],
        _remote_addr: u64,
        _rkey: &RemoteKey,
    ) -> Result<Status> {
        Err(UctError::unsupported(
            "rc",
            "get_short (an RDMA read completes later; use get_bcopy or get_zcopy)",
        ))
    }

    fn get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        Self::check_size("get_bcopy", len, SEG)?;
        let k = *Self::key(rkey)?;
        k.precheck(remote_addr, len as u64, Access::REMOTE_READ)?;
        let mut g = self.lock();
        if !g.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(s) = g.seg() else {
            return Ok(Status::NoResource);
        };
        let mut sges = [ibv_sge {
            addr: g.seg_addr(s),
            length: len as u32,
            lkey: g.bounce_lkey,
        }];
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_RDMA_READ, &mut sges);
        set_rdma(&mut wr, remote_addr, k.rkey);
        comp.start();
        let op = Op {
            kind: Kind::GetBcopy(comp.clone(), s),
            seg: Some(s),
            _keep: Vec::new(),
            expect: ibv_wc_opcode::IBV_WC_RDMA_READ,
            what: "get_bcopy",
        };
        if let Err(e) = g.post(&mut wr, op) {
            comp.finish(Err(e.clone()));
            return Err(e);
        }
        Ok(Status::InProgress)
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.rdma_zcopy(RDMA_READ, iov, remote_addr, rkey, comp)
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        Self::check_id(id)?;
        Self::check_size("am_short", payload.len() + 8, SEG)?;
        self.send_copy(
            ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            &[&header.to_le_bytes(), payload],
            None,
            Some(id),
            "am_short",
        )
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        Self::check_id(id)?;
        Self::check_size("am_bcopy", data.len(), SEG)?;
        self.send_copy(
            ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            &[data],
            None,
            Some(id),
            "am_bcopy",
        )
    }

    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        comp: Option<&Completion>,
    ) -> Result<Status> {
        Self::check_id(id)?;
        Self::check_size("am_zcopy header", header.len(), 128)?;
        let (iov_sges, keep, total) = self.sges(iov)?;
        Self::check_size("am_zcopy", header.len() + total, SEG)?;
        let mut g = self.lock();
        if !g.ready()? {
            return Ok(Status::NoResource);
        }
        // The header goes through a bounce segment, the iov without copy.
        let Some(s) = g.seg() else {
            return Ok(Status::NoResource);
        };
        g.bounce.write(s * SEG, header)?;
        let mut sges = vec![ibv_sge {
            addr: g.seg_addr(s),
            length: header.len() as u32,
            lkey: g.bounce_lkey,
        }];
        sges.extend(iov_sges);
        if sges.len() > MAX_IOV {
            g.free_segs.push(s);
            return Err(UctError::InvalidParam(format!(
                "am_zcopy takes at most {} iov entries on rc",
                MAX_IOV - 1
            )));
        }
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &mut sges);
        wr.imm_data_invalidated_rkey_union.imm_data = (id as u32).to_be();
        if let Some(c) = comp {
            c.start();
        }
        let op = Op {
            kind: Kind::Comp(comp.cloned()),
            seg: Some(s),
            _keep: keep,
            expect: ibv_wc_opcode::IBV_WC_SEND,
            what: "am_zcopy",
        };
        if let Err(e) = g.post(&mut wr, op) {
            if let Some(c) = comp {
                c.finish(Err(e.clone()));
            }
            return Err(e);
        }
        Ok(Status::InProgress)
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        let AtomicValue::U64(v) = value else {
            return Err(UctError::unsupported(
                "rc",
                "32-bit atomics (verbs atomics are 64-bit)",
            ));
        };
        let c = Completion::new();
        // The old value is dropped; only the add matters.
        match self.fetch(
            ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
            v,
            0,
            remote_addr,
            rkey,
            &c,
            Kind::Plain,
        )? {
            Status::NoResource => Ok(Status::NoResource),
            _ => Ok(Status::Done),
        }
    }

    fn atomic_fetch(
        &mut self,
        op: FetchOp,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        match op {
            FetchOp::Add(AtomicValue::U64(v)) => self.fetch(
                ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
                v,
                0,
                remote_addr,
                rkey,
                comp,
                Kind::Fetch(comp.clone(), 0),
            ),
            FetchOp::CompareSwap {
                compare: AtomicValue::U64(c),
                swap: AtomicValue::U64(s),
            } => self.fetch(
                ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                c,
                s,
                remote_addr,
                rkey,
                comp,
                Kind::Fetch(comp.clone(), 0),
            ),
            FetchOp::Swap(_) => Err(UctError::unsupported(
                "rc",
                "atomic swap (verbs has none; use compare-and-swap)",
            )),
            _ => Err(UctError::unsupported(
                "rc",
                "32-bit atomics (verbs atomics are 64-bit)",
            )),
        }
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        let mut g = self.lock();
        if let Some(e) = &g.failed {
            return Err(e.clone());
        }
        if g.outstanding == 0 {
            return Ok(Status::Done);
        }
        if !g.signal_tail()? {
            return Ok(Status::NoResource);
        }
        if let Some(c) = comp {
            c.start();
            g.flushes.push(c.clone());
        }
        Ok(Status::InProgress)
    }

    fn fence(&mut self) -> Result<Status> {
        let mut g = self.lock();
        if let Some(e) = &g.failed {
            return Err(e.clone());
        }
        g.fence = true;
        Ok(Status::Done)
    }

    fn ep_address(&self) -> Result<Vec<u8>> {
        let g = self.lock();
        let mut a = g.qp.qpn().to_le_bytes().to_vec();
        a.extend_from_slice(&g.psn.to_le_bytes());
        Ok(a)
    }

    fn connect_to_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        let (gid, lid, mtu) = crate::iface::parse_device_address(device_addr).ok_or_else(|| {
            UctError::InvalidParam(format!(
                "not an rc device address ({} bytes)",
                device_addr.len()
            ))
        })?;
        if ep_addr.len() != 8 {
            return Err(UctError::InvalidParam(format!(
                "not an rc endpoint address ({} bytes)",
                ep_addr.len()
            )));
        }
        let qpn = u32::from_le_bytes(ep_addr[..4].try_into().unwrap_or_default());
        let psn = u32::from_le_bytes(ep_addr[4..].try_into().unwrap_or_default());
        let mut g = self.lock();
        if g.connected {
            return Err(UctError::InvalidParam(
                "the rc endpoint is already connected".into(),
            ));
        }
        let l = &self.local;
        let my_psn = g.psn;
        g.qp.connect(
            l.port,
            l.gid_index,
            l.ethernet,
            l.mtu,
            my_psn,
            l.rd_atomic,
            &Remote {
                qpn,
                psn,
                gid,
                lid,
                mtu,
            },
        )?;
        g.connected = true;
        Ok(())
    }
}

/// How an RDMA operation of each direction is posted and checked.
struct RdmaKind {
    opcode: ibv_wr_opcode::Type,
    expect: ibv_wc_opcode::Type,
    needed: Access,
    what: &'static str,
}

const RDMA_WRITE: RdmaKind = RdmaKind {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
    expect: ibv_wc_opcode::IBV_WC_RDMA_WRITE,
    needed: Access::REMOTE_WRITE,
    what: "put_zcopy",
};

const RDMA_READ: RdmaKind = RdmaKind {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_READ,
    expect: ibv_wc_opcode::IBV_WC_RDMA_READ,
    needed: Access::REMOTE_READ,
    what: "get_zcopy",
};

impl RcEp {
    /// A zero-copy RDMA write or read of the iov list.
    fn rdma_zcopy(
        &mut self,
        kind: RdmaKind,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let k = *Self::key(rkey)?;
        let (mut sges, keep, total) = self.sges(iov)?;
        k.precheck(remote_addr, total as u64, kind.needed)?;
        let mut g = self.lock();
        if !g.ready()? {
            return Ok(Status::NoResource);
        }
        let mut wr = empty_wr(kind.opcode, &mut sges);
        set_rdma(&mut wr, remote_addr, k.rkey);
        if let Some(c) = comp {
            c.start();
        }
        let op = Op {
            kind: Kind::Comp(comp.cloned()),
            seg: None,
            _keep: keep,
            expect: kind.expect,
            what: kind.what,
        };
        if let Err(e) = g.post(&mut wr, op) {
            if let Some(c) = comp {
                c.finish(Err(e.clone()));
            }
            return Err(e);
        }
        Ok(Status::InProgress)
    }

    #[allow(clippy::too_many_arguments)]
    fn fetch(
        &mut self,
        opcode: ibv_wr_opcode::Type,
        compare_add: u64,
        swap: u64,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
        kind: Kind,
    ) -> Result<Status> {
        if !remote_addr.is_multiple_of(8) {
            return Err(UctError::Misaligned {
                addr: remote_addr,
                align: 8,
            });
        }
        let k = *Self::key(rkey)?;
        k.precheck(remote_addr, 8, Access::REMOTE_ATOMIC)?;
        let mut g = self.lock();
        if !g.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(s) = g.seg() else {
            return Ok(Status::NoResource);
        };
        let mut sges = [ibv_sge {
            addr: g.seg_addr(s),
            length: 8,
            lkey: g.bounce_lkey,
        }];
        let mut wr = empty_wr(opcode, &mut sges);
        wr.wr.atomic = atomic_t {
            remote_addr,
            compare_add,
            swap,
            rkey: k.rkey,
        };
        let kind = match kind {
            Kind::Fetch(c, _) => {
                c.start();
                Kind::Fetch(c, s)
            }
            other => other,
        };
        let expect = if opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP {
            ibv_wc_opcode::IBV_WC_COMP_SWAP
        } else {
            ibv_wc_opcode::IBV_WC_FETCH_ADD
        };
        let fetching = matches!(kind, Kind::Fetch(..));
        let op = Op {
            kind,
            seg: Some(s),
            _keep: Vec::new(),
            expect,
            what: "an atomic",
        };
        if let Err(e) = g.post(&mut wr, op) {
            if fetching {
                comp.finish(Err(e.clone()));
            }
            return Err(e);
        }
        Ok(Status::InProgress)
    }
}
