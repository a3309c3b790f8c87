//! Completion queues and RC queue pairs, with the RESET, INIT, RTR, RTS
//! transitions; a failed transition is a [`VerbsError`] that names it.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use md_ib::verbs::{Context, Pd};
use md_ib::{QpState, VerbsError};
use rdma_sys::*;

use crate::tx::{WcOpcode, WcStatus};

/// A completion queue.
pub struct Cq {
    ptr: NonNull<ibv_cq>,
    /// The CQ's device: open while the CQ exists.
    ctx: Arc<Context>,
}

// SAFETY: a CQ is not tied to the thread that created it; any thread may
// poll and destroy it.
unsafe impl Send for Cq {}
// SAFETY: through `&Cq` the CQ is only polled (ibv_poll_cq), which
// libibverbs providers make thread-safe with the CQ's own lock, or passed
// to ibv_create_qp, which is thread-safe too.
unsafe impl Sync for Cq {}

impl Cq {
    /// A CQ of at least `entries` entries on `ctx`, without a completion
    /// channel.
    pub fn new(ctx: &Arc<Context>, entries: u32) -> Result<Arc<Cq>, VerbsError> {
        // SAFETY: `ctx` is open (the Arc keeps it so); a null channel and
        // context pointer are allowed.
        let ptr = unsafe {
            ibv_create_cq(
                ctx.as_ptr(),
                entries as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(Arc::new(Cq {
                ptr,
                ctx: ctx.clone(),
            })),
            None => {
                // Read before the format! below allocates.
                let errno = md_ib::error::errno();
                Err(VerbsError::new(format!("ibv_create_cq({entries})"), errno).on(ctx.name()))
            }
        }
    }

    /// The device context the CQ was created on.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw CQ, valid while this `Cq` lives.
    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.ptr.as_ptr()
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many
    /// it wrote. A driver writes only the fields valid for a completion's
    /// kind, so `wcs` is initialised by the caller (zeroed).
    pub fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize, VerbsError> {
        let room = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: `ptr` is the CQ made in `new`, destroyed only in Drop, so
        // valid for `&self`; `wcs` has room for the `room` entries the call
        // may write.
        let n = unsafe { ibv_poll_cq(self.as_ptr(), room, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::new("ibv_poll_cq", -n));
        }
        Ok((n as usize).min(wcs.len()))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: made in `new`, destroyed once, here; every QP that uses
        // this CQ holds an Arc to it, so none is alive now.
        let r = unsafe { ibv_destroy_cq(self.ptr.as_ptr()) };
        if r != 0 {
            log::warn!(
                "verbs: ibv_destroy_cq failed: {}",
                md_ib::error::errno_text(r)
            );
        }
    }
}

/// The status of a work completion, as the send tracker takes it.
pub fn wc_status(wc: &ibv_wc) -> WcStatus {
    if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
        return WcStatus::Success;
    }
    WcStatus::Failed {
        name: wc_status_name(wc.status),
        code: wc.status,
        vendor_err: wc.vendor_err,
    }
}

/// The opcode of a work completion, as the send tracker takes it.
pub fn wc_opcode(opcode: ibv_wc_opcode::Type) -> WcOpcode {
    match opcode {
        ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
        ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
        ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        other => WcOpcode::Other(other),
    }
}

/// The text verbs gives a work completion status.
pub fn wc_status_name(status: ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for
    // any value ("unknown" for those it does not know).
    unsafe { CStr::from_ptr(ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

/// Our side of a connection: the port, the GID to send from, and limits.
#[derive(Debug, Clone, Copy)]
pub struct LocalPath {
    pub port: u8,
    pub gid_index: u32,
    /// RoCE: every packet carries a GRH.
    pub ethernet: bool,
    pub mtu: ibv_mtu::Type,
    /// RDMA reads and atomics in flight, each way.
    pub rd_atomic: u8,
}

/// Where the peer QP is.
#[derive(Debug, Clone, Copy)]
pub struct RemoteQp {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub lid: u16,
    pub mtu: ibv_mtu::Type,
}

/// An RC queue pair.
pub struct Qp {
    ptr: NonNull<ibv_qp>,
    /// The PD and CQ the QP was created with: alive while the QP is.
    _pd: Arc<Pd>,
    _cq: Arc<Cq>,
    device: String,
    pub max_inline: u32,
}

// SAFETY: a QP is not tied to the thread that created it; any thread may
// post to it and destroy it.
unsafe impl Send for Qp {}
// SAFETY: through `&Qp` the QP is posted to (ibv_post_send/recv) and
// modified (ibv_modify_qp); libibverbs makes these thread-safe (providers
// lock the send and receive queues), and our fields are never written.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates an RC QP on `cq` and takes it to INIT on `port`. The PD and
    /// the CQ must be of the same open context (the same `Arc<Context>`),
    /// or it is refused (EINVAL, naming both).
    pub fn new(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        port: u8,
        send_wr: u32,
        recv_wr: u32,
        max_sge: u32,
    ) -> Result<Qp, VerbsError> {
        let device = pd.context().name().to_string();
        if !Arc::ptr_eq(pd.context(), cq.context()) {
            return Err(VerbsError::new(
                format!(
                    "ibv_create_qp (RC): the PD is of one open context of {device} and the CQ of another (of {}); create the PD and the CQ from the same Context",
                    cq.context().name()
                ),
                libc::EINVAL,
            )
            .on(&device));
        }
        // SAFETY: ibv_qp_init_attr is plain C data (pointers may be null):
        // all zeroes is valid, filled in below.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = send_wr;
        init.cap.max_recv_wr = recv_wr;
        init.cap.max_send_sge = max_sge;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = 64;
        // SAFETY: the PD and CQ are live (the Arcs keep them so) and belong
        // to the same context (checked above); `init` is filled in.
        let ptr = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let ptr =
            NonNull::new(ptr).ok_or_else(|| VerbsError::last("ibv_create_qp (RC)").on(&device))?;
        let qp = Qp {
            ptr,
            _pd: pd.clone(),
            _cq: cq.clone(),
            device,
            max_inline: init.cap.max_inline_data,
        };
        let mut init_attr = zeroed_attr();
        init_attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        init_attr.pkey_index = 0;
        init_attr.port_num = port;
        init_attr.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0)
            as _;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ibv_qp_attr_mask::IBV_QP_PORT.0
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        qp.modify(&mut init_attr, mask, QpState::Reset, QpState::Init)?;
        Ok(qp)
    }

    /// The raw QP, valid while this `Qp` lives.
    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.ptr.as_ptr()
    }

    /// The QP number, which the peer connects to.
    pub fn qpn(&self) -> u32 {
        // SAFETY: `ptr` is the QP made in `new`, destroyed only in Drop, so
        // valid for `&self`; qp_num is set at creation and never changes.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: u32,
        from: QpState,
        to: QpState,
    ) -> Result<(), VerbsError> {
        // SAFETY: `ptr` is valid for `&self` (see `qpn`); `attr` is filled
        // in for every bit of `mask`.
        let r = unsafe { ibv_modify_qp(self.as_ptr(), attr, mask as i32) };
        if r != 0 {
            return Err(
                VerbsError::new(format!("ibv_modify_qp on QP {}", self.qpn()), r)
                    .on(&self.device)
                    .in_transition(from, to),
            );
        }
        Ok(())
    }

    /// INIT -> RTR -> RTS from `local` towards `remote`, sending from
    /// `my_psn`.
    pub fn connect(
        &self,
        local: &LocalPath,
        my_psn: u32,
        remote: &RemoteQp,
    ) -> Result<(), VerbsError> {
        let mut rtr_attr = zeroed_attr();
        rtr_attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        rtr_attr.path_mtu = local.mtu.min(remote.mtu);
        rtr_attr.dest_qp_num = remote.qpn;
        rtr_attr.rq_psn = remote.psn;
        rtr_attr.max_dest_rd_atomic = local.rd_atomic;
        rtr_attr.min_rnr_timer = 12;
        rtr_attr.ah_attr.port_num = local.port;
        rtr_attr.ah_attr.dlid = remote.lid;
        rtr_attr.ah_attr.sl = 0;
        if local.ethernet || remote.lid == 0 {
            rtr_attr.ah_attr.is_global = 1;
            rtr_attr.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            rtr_attr.ah_attr.grh.sgid_index = local.gid_index as u8;
            rtr_attr.ah_attr.grh.hop_limit = 64;
        }
        let rtr_mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_AV.0
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
        self.modify(&mut rtr_attr, rtr_mask, QpState::Init, QpState::Rtr)?;
        let mut rts_attr = zeroed_attr();
        rts_attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        rts_attr.timeout = 14;
        rts_attr.retry_cnt = 7;
        rts_attr.rnr_retry = 7;
        rts_attr.sq_psn = my_psn;
        rts_attr.max_rd_atomic = local.rd_atomic;
        let rts_mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut rts_attr, rts_mask, QpState::Rtr, QpState::Rts)
    }

    /// Moves the QP to the error state: the NIC stops working on it and
    /// flushes what is posted. If this fails, the QP may still be working:
    /// destroy it ([`destroy`](Qp::destroy)) before releasing anything its
    /// requests point at.
    pub fn to_error(&self) -> Result<(), VerbsError> {
        let mut err_attr = zeroed_attr();
        err_attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0;
        self.modify(&mut err_attr, mask, QpState::Rts, QpState::Error)
    }

    /// Destroys the QP now: when ibv_destroy_qp returns, the NIC no longer
    /// reaches what its requests pointed at. If it fails, the QP (and its
    /// PD and CQ) are leaked rather than freed under the NIC, and so must
    /// be whatever its requests point at.
    pub fn destroy(self) -> Result<(), VerbsError> {
        let qpn = self.qpn();
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: made in `new`, destroyed once: here, and `this` is never
        // dropped, so Drop does not destroy it again.
        let r = unsafe { ibv_destroy_qp(this.ptr.as_ptr()) };
        if r != 0 {
            return Err(VerbsError::new(format!("ibv_destroy_qp on QP {qpn}"), r).on(&this.device));
        }
        // SAFETY: each field is read once, out of `this`, which is never
        // used or dropped again; the QP is gone, so its PD and CQ may go.
        unsafe {
            drop(std::ptr::read(&this._pd));
            drop(std::ptr::read(&this._cq));
            drop(std::ptr::read(&this.device));
        }
        Ok(())
    }

    /// Posts one send work request.
    ///
    /// # Safety
    /// Every SGE of `wr` must point at memory that stays valid until the
    /// request completes: registered with the lkey it names (or, with
    /// IBV_SEND_INLINE, valid for this call only), and for RDMA the remote
    /// fields must be the peer's.
    pub unsafe fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), VerbsError> {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `ptr` is valid for `&self` (see `qpn`); `wr` and its SGE
        // list live for the call, and the caller keeps the memory they
        // point at valid until the completion.
        let r = unsafe { ibv_post_send(self.as_ptr(), wr, &mut bad) };
        if r != 0 {
            return Err(
                VerbsError::new(format!("ibv_post_send on QP {}", self.qpn()), r).on(&self.device),
            );
        }
        Ok(())
    }

    /// Posts receive buffers of `len` bytes, each `(wr_id, addr)` of
    /// `bufs`, as chained lists of at most [`RECV_CHAIN`]. On error the
    /// buffers before the one refused may be posted: the caller fails the
    /// QP, whose flushed completions then return them.
    ///
    /// # Safety
    /// Each `addr..addr+len` must be registered with `lkey` and stay valid,
    /// and untouched by the CPU, until its receive completes.
    pub unsafe fn post_recvs(
        &self,
        bufs: &[(u64, u64)],
        len: u32,
        lkey: u32,
    ) -> Result<(), VerbsError> {
        for (k, chunk) in bufs.chunks(RECV_CHAIN).enumerate() {
            let mut sges = [ibv_sge {
                addr: 0,
                length: len,
                lkey,
            }; RECV_CHAIN];
            // SAFETY: ibv_recv_wr is plain C data (integers and pointers
            // that may be null): all zeroes is valid, filled in below.
            let mut wrs: [ibv_recv_wr; RECV_CHAIN] = unsafe { std::mem::zeroed() };
            // Written through these pointers only, so that the links
            // between entries stay valid.
            let (w, g) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
            for (i, &(wr_id, addr)) in chunk.iter().enumerate() {
                // SAFETY: i < chunk.len() <= RECV_CHAIN, inside both arrays,
                // which outlive the call below.
                unsafe {
                    (*g.add(i)).addr = addr;
                    (*w.add(i)).wr_id = wr_id;
                    (*w.add(i)).sg_list = g.add(i);
                    (*w.add(i)).num_sge = 1;
                    if i > 0 {
                        (*w.add(i - 1)).next = w.add(i);
                    }
                }
            }
            let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: `ptr` is valid for `&self` (see `qpn`); the first
            // `chunk.len()` WRs form a list ended by a null `next` (zeroed),
            // whose SGEs live for the call; the caller keeps the buffers
            // valid until the completions.
            let r = unsafe { ibv_post_recv(self.as_ptr(), w, &mut bad) };
            if r != 0 {
                let refused = if bad.is_null() {
                    0
                } else {
                    // SAFETY: verbs sets `bad` to one of the WRs passed.
                    unsafe { bad.offset_from(w) }.max(0) as usize
                };
                return Err(VerbsError::new(
                    format!(
                        "ibv_post_recv on QP {} (receive {} of {})",
                        self.qpn(),
                        k * RECV_CHAIN + refused + 1,
                        bufs.len()
                    ),
                    r,
                )
                .on(&self.device));
            }
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: made in `new`, destroyed once, here; the provider flushes
        // what is still posted. The PD and CQ outlive it (fields dropped
        // after this).
        let r = unsafe { ibv_destroy_qp(self.ptr.as_ptr()) };
        if r != 0 {
            log::warn!(
                "verbs: ibv_destroy_qp failed: {}",
                md_ib::error::errno_text(r)
            );
        }
    }
}

/// Most receive work requests posted in one ibv_post_recv call.
pub const RECV_CHAIN: usize = 16;

/// An all-zero QP attribute to fill in.
fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain C data (integers, arrays and a union of
    // byte arrays): all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}
