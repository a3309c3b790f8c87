//! The receive side of an rc connection: the receive buffers handed to the
//! NIC, and what a receive completion means. Two things consume a receive
//! work request of ours:
//!
//! - a SEND WITH IMMEDIATE: an active message (the id in the immediate,
//!   the message in the segment) or, from a peer of an earlier build, a
//!   flush's empty send (dropped);
//! - an RDMA WRITE WITH IMMEDIATE: a put with immediate data. The data
//!   went to the target memory, the segment holds nothing; the immediate
//!   is the user's 32 bits and `byte_len` the write's length.
//!
//! Neither is credit-controlled by us: a sender facing an empty receive
//! queue gets RNR NAKs and retries for ever (rnr_retry 7, qp.rs), and the
//! peer timeout finds a receiver that stopped reposting. A segment is
//! reposted only after its message or immediate was delivered, so that a
//! peer writing faster than we progress meets that back-pressure rather
//! than a queue of events here that grows without bound.
//!
//! Delivered segments go back in one chained ibv_post_recv: once a batch
//! (a quarter of the queue, at most 16) has gathered, or when a poll finds
//! the completion queue empty, so that none is held while the connection
//! is idle and a ping-pong reposts while it waits for the reply.

use rdma_sys::*;
use uct_core::{ImmEvent, Result, UctError};

use super::{Connection, RECV_BIT, SEG};
use crate::qp::{wc_opcode, RECV_CHAIN};
use crate::tx::WcStatus;
use crate::wire::Immediate;

/// A receive completion for the iface to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// An active message: its id, and its bytes in place in receive
    /// segment `seg`.
    Am { id: u8, seg: usize, len: usize },
    /// A put with immediate data, its data already in the target memory;
    /// `seg` is the receive segment it consumed (holding nothing).
    Imm { seg: usize, event: ImmEvent },
}

impl Received {
    /// The receive segment to repost once it was delivered.
    pub(crate) fn seg(&self) -> usize {
        match *self {
            Received::Am { seg, .. } | Received::Imm { seg, .. } => seg,
        }
    }
}

impl Connection {
    /// Hands receive segments `segs` to the NIC.
    pub(super) fn post_recvs(&mut self, segs: &[usize]) -> Result<()> {
        let base = self.recv.addr();
        let mut bufs = [(0u64, 0u64); RECV_CHAIN];
        for chunk in segs.chunks(RECV_CHAIN) {
            for (buf, &seg) in bufs.iter_mut().zip(chunk) {
                *buf = (RECV_BIT | seg as u64, base + (seg * SEG) as u64);
            }
            // SAFETY: each segment lies inside `recv`, registered with
            // `recv_lkey` and owned by this connection (which outlives the
            // QP's work); the CPU reads it only after its completion, until
            // it is posted again.
            unsafe {
                self.qp()?
                    .post_recvs(&bufs[..chunk.len()], SEG as u32, self.recv_lkey)
            }?;
        }
        Ok(())
    }

    pub(super) fn on_receive(&mut self, wc: &ibv_wc, status: WcStatus) {
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
                    self.label
                )));
            }
            return;
        }
        let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        let kind = wc.opcode;
        if !with_imm
            || (kind != ibv_wc_opcode::IBV_WC_RECV
                && kind != ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM)
        {
            self.fail(UctError::Protocol(format!(
                "rc {}: a receive completed with {}{}; only sends and RDMA writes with immediate data are expected",
                self.label,
                wc_opcode(kind),
                if with_imm { "" } else { " and no immediate" }
            )));
            return;
        }
        // SAFETY: with IBV_WC_WITH_IMM set, the union holds the immediate,
        // which verbs carries in network byte order.
        let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
        if kind == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
            // Any length a peer wrote is a number we only report: nothing
            // here is read or indexed by it.
            let event = ImmEvent {
                imm,
                len: wc.byte_len as usize,
            };
            self.received.push(Received::Imm { seg, event });
            return;
        }
        match Immediate::decode(imm) {
            Ok(Immediate::Nop) => self.repost(seg),
            // Delivered in place by the iface, then reposted.
            Ok(Immediate::ActiveMessage(id)) => {
                let len = (wc.byte_len as usize).min(SEG);
                self.received.push(Received::Am { id, seg, len });
            }
            Err(e) => self.fail(UctError::Protocol(format!("rc {}: {e}", self.label))),
        }
    }

    /// The receive buffers' host address and length (checked in `new`),
    /// for delivering active messages in place: valid while this
    /// connection lives, whose `recv` is never replaced.
    pub(crate) fn recv_window(&self) -> (usize, usize) {
        (self.recv_host, self.recv_len)
    }

    /// Gives receive segment `seg` back to the NIC after what it received
    /// was delivered: with the others of its batch (module doc).
    pub(crate) fn repost(&mut self, seg: usize) {
        if self.tx.failure().is_some() {
            return;
        }
        self.repost_waiting.push(seg);
        if self.repost_waiting.len() >= self.repost_batch {
            self.repost_now();
        }
    }

    /// Gives back every delivered segment still waiting for its batch.
    pub(super) fn repost_now(&mut self) {
        if self.repost_waiting.is_empty() || self.tx.failure().is_some() {
            return;
        }
        let segs = std::mem::take(&mut self.repost_waiting);
        let posted = self.post_recvs(&segs);
        self.repost_waiting = segs;
        self.repost_waiting.clear();
        if let Err(e) = posted {
            self.fail(e);
        }
    }
}
