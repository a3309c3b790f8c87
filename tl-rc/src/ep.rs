//! The rc endpoint: checks each operation's arguments, builds its work
//! request through the endpoint's `Connection`, which posts it and tracks
//! its completion.

use std::sync::{Arc, Mutex, MutexGuard};

use md_ib::{IbMd, IbRkey};
use rdma_sys::{ibv_mtu, ibv_wr_opcode};
use uct_core::{
    Access, AtomicValue, Completion, Endpoint, FetchOp, Iov, RemoteKey, Result, Status, UctError,
};

use crate::conn::{Connection, MAX_IOV, MAX_ZCOPY, SEG};
use crate::post::{iov_sges, AtomicOp, RdmaDirection, RDMA_READ, RDMA_WRITE, RDMA_WRITE_IMM};
use crate::qp::{LocalPath, RemoteQp};
use crate::wire::{DeviceAddress, EpAddress};

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

impl RcEp {
    pub(crate) fn new(
        conn: Arc<Mutex<Connection>>,
        md: Arc<IbMd>,
        local: LocalPath,
        max_short: usize,
    ) -> Self {
        let inline = conn.lock().unwrap_or_else(|p| p.into_inner()).max_inline as usize;
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

    /// A put or AM send of `parts`, inline when small enough.
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
        self.lock()
            .post_copy(opcode, parts, remote, am_id, what, inline)
    }

    /// A zero-copy RDMA write or read of the iov list; `imm` for a write
    /// with immediate.
    fn rdma_zcopy(
        &mut self,
        direction: &RdmaDirection,
        iov: &[Iov<'_>],
        remote: (u64, &RemoteKey),
        imm: Option<u32>,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let (remote_addr, rkey) = remote;
        let key = *Self::key(rkey)?;
        let (mut sges, keep, total) = iov_sges(&self.md, iov, direction.what, MAX_ZCOPY)?;
        key.precheck(remote_addr, total as u64, direction.needed)?;
        let remote = (remote_addr, key.rkey);
        self.lock()
            .post_rdma_zcopy(direction, &mut sges, keep, remote, imm, comp)
    }

    /// A verbs atomic on the 8 bytes at `remote_addr`; the old value goes
    /// to `fetch` if given.
    fn atomic(
        &mut self,
        opcode: ibv_wr_opcode::Type,
        operands: (u64, u64),
        remote_addr: u64,
        rkey: &RemoteKey,
        fetch: Option<&Completion>,
    ) -> Result<Status> {
        if !remote_addr.is_multiple_of(8) {
            return Err(UctError::Misaligned {
                addr: remote_addr,
                align: 8,
            });
        }
        let key = *Self::key(rkey)?;
        key.precheck(remote_addr, 8, Access::REMOTE_ATOMIC)?;
        let (compare_add, swap) = operands;
        let atomic = AtomicOp {
            opcode,
            compare_add,
            swap,
            remote_addr,
            rkey: key.rkey,
        };
        self.lock().post_atomic(&atomic, fetch)
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
        self.rdma_zcopy(&RDMA_WRITE, iov, (remote_addr, rkey), None, comp)
    }

    fn put_zcopy_imm(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        imm: u32,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.rdma_zcopy(&RDMA_WRITE_IMM, iov, (remote_addr, rkey), Some(imm), comp)
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
        self.lock().post_get_bcopy(len, remote_addr, key.rkey, comp)
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.rdma_zcopy(&RDMA_READ, iov, (remote_addr, rkey), None, comp)
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
        let (sges, keep, total) = iov_sges(&self.md, iov, "am_zcopy", SEG)?;
        Self::check_size("am_zcopy", header.len() + total, SEG)?;
        if sges.len() + 1 > MAX_IOV {
            return Err(UctError::InvalidParam(format!(
                "am_zcopy takes at most {} iov entries on rc",
                MAX_IOV - 1
            )));
        }
        self.lock().post_am_zcopy(id, header, sges, keep, comp)
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
        let opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
        // The old value is dropped; only the add matters.
        match self.atomic(opcode, (add, 0), remote_addr, rkey, None)? {
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
        let (opcode, operands) = match op {
            FetchOp::Add(AtomicValue::U64(add)) => {
                (ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, (add, 0))
            }
            FetchOp::CompareSwap {
                compare: AtomicValue::U64(compare),
                swap: AtomicValue::U64(swap),
            } => (ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, (compare, swap)),
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
        self.atomic(opcode, operands, remote_addr, rkey, Some(comp))
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        self.lock().flush(comp)
    }

    fn fence(&mut self) -> Result<Status> {
        self.lock().fence()?;
        Ok(Status::Done)
    }

    fn check(&mut self) -> Result<()> {
        self.lock().check()
    }

    fn ep_address(&self) -> Result<Vec<u8>> {
        let conn = self.lock();
        Ok(EpAddress {
            qpn: conn.qpn,
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
