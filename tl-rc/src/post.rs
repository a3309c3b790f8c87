//! Building and posting each kind of work request: copies through inline
//! data or a bounce segment, zero-copy RDMA and sends, RDMA reads into a
//! bounce segment, atomics. The endpoint checks the arguments first.

use md_ib::IbMd;
use rdma_sys::*;
use uct_core::{
    Access, Completion, Iov, MemHandle, MemoryDomain, MemoryType, Result, Status, UctError,
};

#[cfg(test)]
use crate::conn::MAX_ZCOPY;
use crate::conn::{Connection, Delivery, OpData, MAX_IOV};
use crate::tx::WcOpcode;
use crate::wire::Immediate;

/// How an RDMA operation of each direction is posted and checked.
pub(crate) struct RdmaDirection {
    pub opcode: ibv_wr_opcode::Type,
    pub expect: WcOpcode,
    pub needed: Access,
    pub what: &'static str,
}

/// put_zcopy.
pub(crate) const RDMA_WRITE: RdmaDirection = RdmaDirection {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
    expect: WcOpcode::RdmaWrite,
    needed: Access::REMOTE_WRITE,
    what: "put_zcopy",
};

/// put_zcopy_imm: a write whose immediate consumes a receive of the peer,
/// completed there after the data.
pub(crate) const RDMA_WRITE_IMM: RdmaDirection = RdmaDirection {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
    // The sender's completion of a write with immediate is a write's.
    expect: WcOpcode::RdmaWrite,
    needed: Access::REMOTE_WRITE,
    what: "put_zcopy_imm",
};

/// get_zcopy.
pub(crate) const RDMA_READ: RdmaDirection = RdmaDirection {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_READ,
    expect: WcOpcode::RdmaRead,
    needed: Access::REMOTE_READ,
    what: "get_zcopy",
};

/// A verbs atomic: its opcode and operands, and where.
pub(crate) struct AtomicOp {
    pub opcode: ibv_wr_opcode::Type,
    pub compare_add: u64,
    pub swap: u64,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// The SGEs of an iov list of memory registered with `md` (or host memory
/// it registered), the handles to keep alive until the completion, and the
/// total length, which must not exceed `max` (`what` names the operation in
/// errors).
pub(crate) fn iov_sges(
    md: &IbMd,
    iov: &[Iov<'_>],
    what: &str,
    max: usize,
) -> Result<(Vec<ibv_sge>, Vec<MemHandle>, usize)> {
    if iov.len() > MAX_IOV {
        return Err(UctError::InvalidParam(format!(
            "{} iov entries, rc takes at most {MAX_IOV}",
            iov.len()
        )));
    }
    let mut sges = Vec::with_capacity(iov.len());
    let mut keep = Vec::with_capacity(iov.len());
    let total = check_zcopy_lengths(what, iov.iter().map(|e| e.len), max)?;
    for entry in iov {
        let mem = entry.mem;
        if mem.mem_type() != MemoryType::Host && mem.md_name() != md.name() {
            return Err(UctError::MemoryTypeUnsupported {
                mem_type: mem.mem_type(),
                owner: "transport rc".into(),
                hint: format!(
                    "register it with the NIC first (its MD {} registers DMA-buf fds{})",
                    md.name(),
                    if md.supports_dmabuf() {
                        ""
                    } else {
                        ", but this NIC cannot import DMA-buf"
                    }
                ),
            });
        }
        mem.check_range(entry.offset, entry.len)?;
        sges.push(ibv_sge {
            addr: mem.addr() + entry.offset as u64,
            // Fits: check_zcopy_lengths refused longer entries.
            length: entry.len as u32,
            lkey: md.lkey_of(mem)?,
        });
        keep.push(mem.clone());
    }
    Ok((sges, keep, total))
}

/// Checks the lengths of a zero-copy list against what rc can post: each
/// entry must fit an SGE's 32-bit length, and the total must not exceed
/// `max` (the advertised max_zcopy, or the AM limit). Returns the total.
pub(crate) fn check_zcopy_lengths(
    what: &str,
    lens: impl Iterator<Item = usize>,
    max: usize,
) -> Result<usize> {
    let mut total = 0usize;
    for len in lens {
        if u32::try_from(len).is_err() {
            return Err(UctError::InvalidParam(format!(
                "{what}: an iov entry of {len} bytes does not fit the 32-bit length of a verbs scatter/gather entry; split it into entries of at most {} bytes",
                u32::MAX
            )));
        }
        total = total
            .checked_add(len)
            .filter(|&t| t <= max)
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "{what}: the iov list exceeds rc's max_zcopy of {max} bytes; post it in pieces of at most max_zcopy"
                ))
            })?;
    }
    Ok(total)
}

impl Connection {
    /// A put or AM send of `parts`: inline when `inline`, else copied into
    /// a bounce segment. Done as soon as it is posted.
    pub(crate) fn post_copy(
        &mut self,
        opcode: ibv_wr_opcode::Type,
        parts: &[&[u8]],
        remote: Option<(u64, u32)>,
        am_id: Option<u8>,
        what: &'static str,
        inline: bool,
    ) -> Result<Status> {
        if !self.ready()? {
            return Ok(Status::NoResource);
        }
        let expect = if opcode == ibv_wr_opcode::IBV_WR_RDMA_WRITE {
            WcOpcode::RdmaWrite
        } else {
            WcOpcode::Send
        };
        // On the stack: no allocation per message.
        let mut sges = [ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_IOV];
        let (count, seg) = if inline {
            for (sge, part) in sges.iter_mut().zip(parts) {
                sge.addr = part.as_ptr() as u64;
                sge.length = part.len() as u32;
            }
            (parts.len().min(MAX_IOV), None)
        } else {
            let Some(seg) = self.take_seg() else {
                return Ok(Status::NoResource);
            };
            let mut at = 0;
            for part in parts {
                if let Err(e) = self.write_seg(seg, at, part) {
                    self.give_seg(seg);
                    return Err(e);
                }
                at += part.len();
            }
            sges[0] = ibv_sge {
                addr: self.seg_addr(seg),
                length: at as u32,
                lkey: self.bounce_lkey,
            };
            (1, Some(seg))
        };
        let mut wr = empty_wr(opcode, &mut sges[..count]);
        if inline {
            wr.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if let Some((addr, rkey)) = remote {
            set_rdma(&mut wr, addr, rkey);
        }
        if let Some(id) = am_id {
            set_imm(&mut wr, Immediate::ActiveMessage(id));
        }
        let data = OpData {
            delivery: Delivery::Nothing,
            seg,
            keep: Vec::new(),
        };
        self.post(&mut wr, data, expect, what, false)?;
        Ok(Status::Done)
    }

    /// An RDMA read of `len` bytes into a bounce segment; `comp` gets them.
    pub(crate) fn post_get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        comp: &Completion,
    ) -> Result<Status> {
        if !self.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(seg) = self.take_seg() else {
            return Ok(Status::NoResource);
        };
        let mut sges = [ibv_sge {
            addr: self.seg_addr(seg),
            length: len as u32,
            lkey: self.bounce_lkey,
        }];
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_RDMA_READ, &mut sges);
        set_rdma(&mut wr, remote_addr, rkey);
        comp.start();
        let data = OpData {
            delivery: Delivery::Bytes(comp.clone()),
            seg: Some(seg),
            keep: Vec::new(),
        };
        self.post(&mut wr, data, WcOpcode::RdmaRead, "get_bcopy", false)?;
        Ok(Status::InProgress)
    }

    /// A zero-copy RDMA write or read of `sges` (memory kept alive by
    /// `keep`) to or from `remote` (address and rkey), with immediate data
    /// `imm` (host order) for a write with immediate.
    pub(crate) fn post_rdma_zcopy(
        &mut self,
        direction: &RdmaDirection,
        sges: &mut [ibv_sge],
        keep: Vec<MemHandle>,
        remote: (u64, u32),
        imm: Option<u32>,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        if !self.ready()? {
            return Ok(Status::NoResource);
        }
        let mut wr = empty_wr(direction.opcode, sges);
        set_rdma(&mut wr, remote.0, remote.1);
        if let Some(imm) = imm {
            set_imm_raw(&mut wr, imm);
        }
        if let Some(c) = comp {
            c.start();
        }
        let data = OpData {
            delivery: Delivery::Complete(comp.cloned()),
            seg: None,
            keep,
        };
        self.post(&mut wr, data, direction.expect, direction.what, false)?;
        Ok(Status::InProgress)
    }

    /// An active message: `header` through a bounce segment, then the
    /// iov's `sges` without copy (memory kept alive by `keep`).
    pub(crate) fn post_am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov_sges: Vec<ibv_sge>,
        keep: Vec<MemHandle>,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        if !self.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(seg) = self.take_seg() else {
            return Ok(Status::NoResource);
        };
        if let Err(e) = self.write_seg(seg, 0, header) {
            self.give_seg(seg);
            return Err(e);
        }
        let mut sges = Vec::with_capacity(iov_sges.len() + 1);
        sges.push(ibv_sge {
            addr: self.seg_addr(seg),
            length: header.len() as u32,
            lkey: self.bounce_lkey,
        });
        sges.extend(iov_sges);
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &mut sges);
        set_imm(&mut wr, Immediate::ActiveMessage(id));
        if let Some(c) = comp {
            c.start();
        }
        let data = OpData {
            delivery: Delivery::Complete(comp.cloned()),
            seg: Some(seg),
            keep,
        };
        self.post(&mut wr, data, WcOpcode::Send, "am_zcopy", false)?;
        Ok(Status::InProgress)
    }

    /// A verbs atomic on 8 remote bytes; the old value lands in a bounce
    /// segment, and goes to `fetch` when there is one.
    pub(crate) fn post_atomic(
        &mut self,
        atomic: &AtomicOp,
        fetch: Option<&Completion>,
    ) -> Result<Status> {
        if !self.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(seg) = self.take_seg() else {
            return Ok(Status::NoResource);
        };
        let mut sges = [ibv_sge {
            addr: self.seg_addr(seg),
            length: 8,
            lkey: self.bounce_lkey,
        }];
        let mut wr = empty_wr(atomic.opcode, &mut sges);
        wr.wr.atomic = atomic_t {
            remote_addr: atomic.remote_addr,
            compare_add: atomic.compare_add,
            swap: atomic.swap,
            rkey: atomic.rkey,
        };
        let expect = if atomic.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP {
            WcOpcode::CompareSwap
        } else {
            WcOpcode::FetchAdd
        };
        let delivery = match fetch {
            Some(c) => {
                c.start();
                Delivery::Value(c.clone())
            }
            None => Delivery::Nothing,
        };
        let data = OpData {
            delivery,
            seg: Some(seg),
            keep: Vec::new(),
        };
        self.post(&mut wr, data, expect, "an atomic", false)?;
        Ok(Status::InProgress)
    }

    /// A signalled zero-length RDMA write, as a keepalive is: makes the
    /// completion of everything posted before it visible, for a flush. It
    /// takes none of the peer's receive buffers, so flushes complete while
    /// the peer does not progress (`Caps::PASSIVE_TARGET`); an empty send
    /// took one each, which only the peer's progress put back.
    pub(crate) fn post_nop(&mut self) -> Result<()> {
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_RDMA_WRITE, &mut []);
        set_rdma(&mut wr, 0, 0);
        let data = OpData {
            delivery: Delivery::Nothing,
            seg: None,
            keep: Vec::new(),
        };
        self.post(&mut wr, data, WcOpcode::RdmaWrite, "flush", true)
    }

    /// A keepalive: a signalled zero-length RDMA write. It needs no remote
    /// memory (a zero-length access checks no rkey, IBA C9-88; rxe, mlx5
    /// follow it) and consumes no receive buffer of the peer; its
    /// completion shows the peer's NIC still answers for the QP. It also
    /// makes the completions of unsignalled posts before it visible.
    pub(crate) fn post_keepalive(&mut self) -> Result<()> {
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_RDMA_WRITE, &mut []);
        set_rdma(&mut wr, 0, 0);
        let data = OpData {
            delivery: Delivery::Keepalive,
            seg: None,
            keep: Vec::new(),
        };
        let plan = self.keepalive_plan();
        self.post_planned(&mut wr, data, 0, WcOpcode::RdmaWrite, "a keepalive", plan)?;
        Ok(())
    }
}

/// A send work request of `opcode` over `sges`, to fill in.
fn empty_wr(opcode: ibv_wr_opcode::Type, sges: &mut [ibv_sge]) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data (integers, pointers that may be
    // null, unions of integers): all zeroes is valid, filled in below.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.opcode = opcode;
    wr.sg_list = sges.as_mut_ptr();
    wr.num_sge = sges.len() as i32;
    wr
}

/// Sets the remote address and key of an RDMA write or read.
fn set_rdma(wr: &mut ibv_send_wr, addr: u64, rkey: u32) {
    wr.wr.rdma = rdma_t {
        remote_addr: addr,
        rkey,
    };
}

/// Sets the immediate data of a send, in network order as verbs wants it.
fn set_imm(wr: &mut ibv_send_wr, imm: Immediate) {
    set_imm_raw(wr, imm.encode());
}

/// Sets `imm` (host order) as immediate data, in network order (htonl):
/// the receiver reads it back with ntohl (conn/recv.rs).
fn set_imm_raw(wr: &mut ibv_send_wr, imm: u32) {
    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 12.8 (rc): an entry longer than an SGE's 32-bit length was
    /// truncated (4 GiB + 8 bytes posted as 8), and the total was never
    /// checked against the advertised max_zcopy.
    #[test]
    fn zcopy_lengths_over_an_sge_or_max_zcopy_are_refused() {
        let max = MAX_ZCOPY;
        let total =
            |lens: &[usize], max| check_zcopy_lengths("put_zcopy", lens.iter().copied(), max);
        assert_eq!(total(&[8, 4096], max), Ok(4104));
        assert_eq!(total(&[max], max), Ok(max));
        assert_eq!(total(&[], max), Ok(0));
        let e = total(&[(1 << 32) + 8], usize::MAX).expect_err("truncated to 8 bytes");
        assert!(
            matches!(&e, UctError::InvalidParam(m) if m.contains("32-bit")),
            "{e}"
        );
        let e = total(&[max / 2 + 1, max / 2], max).expect_err("over max_zcopy");
        assert!(
            matches!(&e, UctError::InvalidParam(m) if m.contains("max_zcopy")),
            "{e}"
        );
        let e = total(&[u32::MAX as usize, u32::MAX as usize, 2], usize::MAX);
        assert!(e.is_ok(), "entries that fit, with a total that fits: {e:?}");
        let e = total(&[usize::MAX, 2], usize::MAX);
        assert!(e.is_err(), "a total that overflows: {e:?}");
    }
}
