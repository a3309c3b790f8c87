//! The rc endpoint: checks each operation's arguments, builds its work
//! request and hands it to the endpoint's [`Connection`], which posts it
//! and tracks its completion.

use std::sync::{Arc, Mutex, MutexGuard};

use md_ib::{IbMd, IbRkey};
use rdma_sys::*;
use uct_core::{
    Access, AtomicValue, Completion, Endpoint, FetchOp, Iov, MemHandle, MemoryDomain, MemoryType,
    RemoteKey, Result, Status, UctError,
};

use crate::conn::{empty_wr, set_rdma, Connection, Delivery, OpData, MAX_IOV, SEG};
use crate::qp::{LocalPath, RemoteQp};
use crate::tx::WcOpcode;
use crate::wire::{DeviceAddress, EpAddress, Immediate};

/// Largest active message header of am_zcopy.
pub(crate) const MAX_AM_HEADER: usize = 128;

/// An rc endpoint.
pub(crate) struct RcEp {
    conn: Arc<Mutex<Connection>>,
    md: Arc<IbMd>,
    local: LocalPath,
    /// Largest put_short: what the QP inlines.
    max_short: usize,
}

/// How an RDMA operation of each direction is posted and checked.
struct RdmaDirection {
    opcode: ibv_wr_opcode::Type,
    expect: WcOpcode,
    needed: Access,
    what: &'static str,
}

const RDMA_WRITE: RdmaDirection = RdmaDirection {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
    expect: WcOpcode::RdmaWrite,
    needed: Access::REMOTE_WRITE,
    what: "put_zcopy",
};

const RDMA_READ: RdmaDirection = RdmaDirection {
    opcode: ibv_wr_opcode::IBV_WR_RDMA_READ,
    expect: WcOpcode::RdmaRead,
    needed: Access::REMOTE_READ,
    what: "get_zcopy",
};

/// A verbs atomic: its opcode and operands.
struct AtomicOp {
    opcode: ibv_wr_opcode::Type,
    compare_add: u64,
    swap: u64,
}

impl RcEp {
    pub(crate) fn new(
        conn: Arc<Mutex<Connection>>,
        md: Arc<IbMd>,
        local: LocalPath,
        max_short: usize,
    ) -> Self {
        let inline = conn.lock().unwrap_or_else(|p| p.into_inner()).qp.max_inline as usize;
        RcEp {
            conn,
            md,
            local,
            max_short: max_short.min(inline),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The SGEs of an iov list, the handles to keep alive until the
    /// completion, and the total length.
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
        for entry in iov {
            let mem = entry.mem;
            if mem.mem_type() != MemoryType::Host && mem.md_name() != self.md.name() {
                return Err(UctError::MemoryTypeUnsupported {
                    mem_type: mem.mem_type(),
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
            mem.check_range(entry.offset, entry.len)?;
            sges.push(ibv_sge {
                addr: mem.addr() + entry.offset as u64,
                length: entry.len as u32,
                lkey: self.md.lkey_of(mem)?,
            });
            keep.push(mem.clone());
            total += entry.len;
        }
        Ok((sges, keep, total))
    }

    /// A put or AM send of `parts` inline, or through a bounce segment.
    fn send_copy(
        &mut self,
        opcode: ibv_wr_opcode::Type,
        parts: &[&[u8]],
        remote: Option<(u64, u32)>,
        am_id: Option<u8>,
        what: &'static str,
    ) -> Result<Status> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let inline = total <= self.max_short && parts.len() <= MAX_IOV;
        let mut conn = self.lock();
        if !conn.ready()? {
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
            (parts.len(), None)
        } else {
            let Some(seg) = conn.take_seg() else {
                return Ok(Status::NoResource);
            };
            let mut at = 0;
            for part in parts {
                if let Err(e) = conn.write_seg(seg, at, part) {
                    conn.give_seg(seg);
                    return Err(e);
                }
                at += part.len();
            }
            sges[0] = ibv_sge {
                addr: conn.seg_addr(seg),
                length: total as u32,
                lkey: conn.bounce_lkey,
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
            wr.imm_data_invalidated_rkey_union.imm_data =
                Immediate::ActiveMessage(id).encode().to_be();
        }
        let data = OpData {
            delivery: Delivery::Nothing,
            seg,
            _keep: Vec::new(),
        };
        conn.post(&mut wr, data, expect, what, false)?;
        Ok(Status::Done)
    }

    /// A zero-copy RDMA write or read of the iov list.
    fn rdma_zcopy(
        &mut self,
        direction: RdmaDirection,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let key = *Self::key(rkey)?;
        let (mut sges, keep, total) = self.sges(iov)?;
        key.precheck(remote_addr, total as u64, direction.needed)?;
        let mut conn = self.lock();
        if !conn.ready()? {
            return Ok(Status::NoResource);
        }
        let mut wr = empty_wr(direction.opcode, &mut sges);
        set_rdma(&mut wr, remote_addr, key.rkey);
        if let Some(c) = comp {
            c.start();
        }
        let data = OpData {
            delivery: Delivery::Complete(comp.cloned()),
            seg: None,
            _keep: keep,
        };
        conn.post(&mut wr, data, direction.expect, direction.what, false)?;
        Ok(Status::InProgress)
    }

    /// A verbs atomic on the 8 bytes at `remote_addr`; the old value lands
    /// in a bounce segment, and goes to `comp` if `fetch`.
    fn atomic(
        &mut self,
        atomic: AtomicOp,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
        fetch: bool,
    ) -> Result<Status> {
        if !remote_addr.is_multiple_of(8) {
            return Err(UctError::Misaligned {
                addr: remote_addr,
                align: 8,
            });
        }
        let key = *Self::key(rkey)?;
        key.precheck(remote_addr, 8, Access::REMOTE_ATOMIC)?;
        let mut conn = self.lock();
        if !conn.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(seg) = conn.take_seg() else {
            return Ok(Status::NoResource);
        };
        let mut sges = [ibv_sge {
            addr: conn.seg_addr(seg),
            length: 8,
            lkey: conn.bounce_lkey,
        }];
        let mut wr = empty_wr(atomic.opcode, &mut sges);
        wr.wr.atomic = atomic_t {
            remote_addr,
            compare_add: atomic.compare_add,
            swap: atomic.swap,
            rkey: key.rkey,
        };
        let expect = if atomic.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP {
            WcOpcode::CompareSwap
        } else {
            WcOpcode::FetchAdd
        };
        let delivery = if fetch {
            comp.start();
            Delivery::Value(comp.clone())
        } else {
            Delivery::Nothing
        };
        let data = OpData {
            delivery,
            seg: Some(seg),
            _keep: Vec::new(),
        };
        conn.post(&mut wr, data, expect, "an atomic", false)?;
        Ok(Status::InProgress)
    }
}

impl Endpoint for RcEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), self.max_short)?;
        let key = Self::key(rkey)?;
        key.precheck(remote_addr, data.len() as u64, Access::REMOTE_WRITE)?;
        let remote = Some((remote_addr, key.rkey));
        self.send_copy(
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[data],
            remote,
            None,
            "put_short",
        )
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_bcopy", data.len(), SEG)?;
        let key = Self::key(rkey)?;
        key.precheck(remote_addr, data.len() as u64, Access::REMOTE_WRITE)?;
        let remote = Some((remote_addr, key.rkey));
        self.send_copy(
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            &[data],
            remote,
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

    fn get_short(&mut self, _buf: &mut [u8], _addr: u64, _rkey: &RemoteKey) -> Result<Status> {
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
        let key = *Self::key(rkey)?;
        key.precheck(remote_addr, len as u64, Access::REMOTE_READ)?;
        let mut conn = self.lock();
        if !conn.ready()? {
            return Ok(Status::NoResource);
        }
        let Some(seg) = conn.take_seg() else {
            return Ok(Status::NoResource);
        };
        let mut sges = [ibv_sge {
            addr: conn.seg_addr(seg),
            length: len as u32,
            lkey: conn.bounce_lkey,
        }];
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_RDMA_READ, &mut sges);
        set_rdma(&mut wr, remote_addr, key.rkey);
        comp.start();
        let data = OpData {
            delivery: Delivery::Bytes(comp.clone()),
            seg: Some(seg),
            _keep: Vec::new(),
        };
        conn.post(&mut wr, data, WcOpcode::RdmaRead, "get_bcopy", false)?;
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
        let parts: [&[u8]; 2] = [&header.to_le_bytes(), payload];
        self.send_copy(
            ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            &parts,
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
        Self::check_size("am_zcopy header", header.len(), MAX_AM_HEADER)?;
        let (iov_sges, keep, total) = self.sges(iov)?;
        Self::check_size("am_zcopy", header.len() + total, SEG)?;
        if iov_sges.len() + 1 > MAX_IOV {
            return Err(UctError::InvalidParam(format!(
                "am_zcopy takes at most {} iov entries on rc",
                MAX_IOV - 1
            )));
        }
        let mut conn = self.lock();
        if !conn.ready()? {
            return Ok(Status::NoResource);
        }
        // The header goes through a bounce segment, the iov without copy.
        let Some(seg) = conn.take_seg() else {
            return Ok(Status::NoResource);
        };
        if let Err(e) = conn.write_seg(seg, 0, header) {
            conn.give_seg(seg);
            return Err(e);
        }
        let mut sges = vec![ibv_sge {
            addr: conn.seg_addr(seg),
            length: header.len() as u32,
            lkey: conn.bounce_lkey,
        }];
        sges.extend(iov_sges);
        let mut wr = empty_wr(ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, &mut sges);
        wr.imm_data_invalidated_rkey_union.imm_data = Immediate::ActiveMessage(id).encode().to_be();
        if let Some(c) = comp {
            c.start();
        }
        let data = OpData {
            delivery: Delivery::Complete(comp.cloned()),
            seg: Some(seg),
            _keep: keep,
        };
        conn.post(&mut wr, data, WcOpcode::Send, "am_zcopy", false)?;
        Ok(Status::InProgress)
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        let AtomicValue::U64(add) = value else {
            return Err(UctError::unsupported(
                "rc",
                "32-bit atomics (verbs atomics are 64-bit)",
            ));
        };
        let add = AtomicOp {
            opcode: ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
            compare_add: add,
            swap: 0,
        };
        // The old value is dropped; only the add matters.
        let unused = Completion::new();
        match self.atomic(add, remote_addr, rkey, &unused, false)? {
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
        let atomic = match op {
            FetchOp::Add(AtomicValue::U64(add)) => AtomicOp {
                opcode: ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
                compare_add: add,
                swap: 0,
            },
            FetchOp::CompareSwap {
                compare: AtomicValue::U64(compare),
                swap: AtomicValue::U64(swap),
            } => AtomicOp {
                opcode: ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                compare_add: compare,
                swap,
            },
            FetchOp::Swap(_) => {
                return Err(UctError::unsupported(
                    "rc",
                    "atomic swap (verbs has none; use compare-and-swap)",
                ))
            }
            _ => {
                return Err(UctError::unsupported(
                    "rc",
                    "32-bit atomics (verbs atomics are 64-bit)",
                ))
            }
        };
        self.atomic(atomic, remote_addr, rkey, comp, true)
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        self.lock().flush(comp)
    }

    fn fence(&mut self) -> Result<Status> {
        self.lock().fence()?;
        Ok(Status::Done)
    }

    fn ep_address(&self) -> Result<Vec<u8>> {
        let conn = self.lock();
        Ok(EpAddress {
            qpn: conn.qp.qpn(),
            psn: conn.psn,
        }
        .encode())
    }

    fn connect_to_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        let device = DeviceAddress::decode(device_addr)?;
        let ep = EpAddress::decode(ep_addr)?;
        let remote = RemoteQp {
            qpn: ep.qpn,
            psn: ep.psn,
            gid: device.gid,
            lid: device.lid,
            mtu: ibv_mtu::Type::from(device.mtu),
        };
        self.lock().connect(&self.local, &remote)
    }
}
