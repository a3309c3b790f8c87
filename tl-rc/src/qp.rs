//! Completion queues and RC queue pairs, with the RESET, INIT, RTR, RTS
//! transitions; a failed transition is an error that names it.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use md_ib::verbs::{errno_error, last_error, Context, Pd};
use rdma_sys::*;
use uct_core::UctError;

/// A completion queue.
pub struct Cq {
    ptr: NonNull<ibv_cq>,
    _ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread-safe; the owner polls from one thread.
unsafe impl Send for Cq {}
// SAFETY: as for Send.
unsafe impl Sync for Cq {}

impl Cq {
    pub fn new(ctx: &Arc<Context>, entries: u32) -> Result<Arc<Cq>, UctError> {
        // SAFETY: a live context; no completion channel.
        let p = unsafe {
            ibv_create_cq(
                ctx.as_ptr(),
                entries as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        NonNull::new(p)
            .map(|ptr| {
                Arc::new(Cq {
                    ptr,
                    _ctx: ctx.clone(),
                })
            })
            .ok_or_else(|| last_error(&format!("ibv_create_cq({entries})")))
    }

    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.ptr.as_ptr()
    }

    /// Polls up to `wcs.len()` completions.
    pub fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize, UctError> {
        // SAFETY: a live CQ and an array of that many entries.
        let n = unsafe { ibv_poll_cq(self.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(errno_error("ibv_poll_cq", -n));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it.
        unsafe { ibv_destroy_cq(self.ptr.as_ptr()) };
    }
}

/// The text verbs gives a work completion status.
pub fn wc_status_name(status: ibv_wc_status::Type) -> String {
    // SAFETY: returns a static string for any value.
    unsafe { CStr::from_ptr(ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

/// Where the peer QP is.
#[derive(Debug, Clone, Copy)]
pub struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub lid: u16,
    pub mtu: ibv_mtu::Type,
}

/// An RC queue pair.
pub struct Qp {
    ptr: NonNull<ibv_qp>,
    _pd: Arc<Pd>,
    _cq: Arc<Cq>,
    pub max_inline: u32,
}

// SAFETY: verbs objects are thread-safe; one owner posts at a time.
unsafe impl Send for Qp {}
// SAFETY: as for Send.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates an RC QP on `cq` and takes it to INIT on `port`.
    pub fn new(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        port: u8,
        send_wr: u32,
        recv_wr: u32,
        max_sge: u32,
    ) -> Result<Qp, UctError> {
        // SAFETY: zeroed is a valid init attr to fill in.
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
        // SAFETY: a live PD and CQ; init is filled in.
        let p = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let ptr = NonNull::new(p).ok_or_else(|| last_error("ibv_create_qp (RC)"))?;
        let qp = Qp {
            ptr,
            _pd: pd.clone(),
            _cq: cq.clone(),
            max_inline: init.cap.max_inline_data,
        };
        // SAFETY: zeroed is a valid attr to fill in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0) as _;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ibv_qp_attr_mask::IBV_QP_PORT.0
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        qp.modify(&mut a, mask, "RESET -> INIT")?;
        Ok(qp)
    }

    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.ptr.as_ptr()
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    fn modify(&self, a: &mut ibv_qp_attr, mask: u32, what: &str) -> Result<(), UctError> {
        // SAFETY: a live QP and a filled-in attr.
        let r = unsafe { ibv_modify_qp(self.as_ptr(), a, mask as i32) };
        if r != 0 {
            let mut e = errno_error(&format!("ibv_modify_qp {what} on QP {}", self.qpn()), r);
            if let UctError::Device { message, .. } = &mut e {
                message.push_str("; the peer address (GID, QP number, MTU) may be wrong, or UCT_IB_GID_INDEX names a GID of another type");
            }
            return Err(e);
        }
        Ok(())
    }

    /// INIT -> RTR -> RTS towards `remote`.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &self,
        port: u8,
        gid_index: u32,
        ethernet: bool,
        my_mtu: ibv_mtu::Type,
        my_psn: u32,
        rd_atomic: u8,
        remote: &Remote,
    ) -> Result<(), UctError> {
        // SAFETY: zeroed is a valid attr to fill in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = my_mtu.min(remote.mtu);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = rd_atomic;
        a.min_rnr_timer = 12;
        a.ah_attr.port_num = port;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = 0;
        if ethernet || remote.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = gid_index as u8;
            a.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_AV.0
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
        self.modify(&mut a, mask, "INIT -> RTR")?;
        // SAFETY: as above.
        let mut b: ibv_qp_attr = unsafe { std::mem::zeroed() };
        b.qp_state = ibv_qp_state::IBV_QPS_RTS;
        b.timeout = 14;
        b.retry_cnt = 7;
        b.rnr_retry = 7;
        b.sq_psn = my_psn;
        b.max_rd_atomic = rd_atomic;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut b, mask, "RTR -> RTS")
    }

    /// Moves the QP to the error state: the NIC stops working on it and
    /// flushes what is posted.
    pub fn to_error(&self) {
        // SAFETY: zeroed is a valid attr; only the state is set.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        if let Err(e) = self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE.0, "-> ERR") {
            log::debug!("{e}");
        }
    }

    /// Posts one send work request.
    pub fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), UctError> {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a live QP; the WR and its SGE list live for the call (the
        // data they point at is registered and kept alive by the caller).
        let r = unsafe { ibv_post_send(self.as_ptr(), wr, &mut bad) };
        if r != 0 {
            return Err(errno_error(
                &format!("ibv_post_send on QP {}", self.qpn()),
                r,
            ));
        }
        Ok(())
    }

    /// Posts one receive buffer.
    pub fn post_recv(&self, wr_id: u64, addr: u64, len: u32, lkey: u32) -> Result<(), UctError> {
        let mut sge = ibv_sge {
            addr,
            length: len,
            lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: a live QP; the buffer is registered and owned by the
        // endpoint until its completion.
        let r = unsafe { ibv_post_recv(self.as_ptr(), &mut wr, &mut bad) };
        if r != 0 {
            return Err(errno_error(
                &format!("ibv_post_recv on QP {}", self.qpn()),
                r,
            ));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; outstanding WRs are flushed
        // by the provider.
        let r = unsafe { ibv_destroy_qp(self.ptr.as_ptr()) };
        if r != 0 {
            log::warn!(
                "verbs: ibv_destroy_qp failed: {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
    }
}
