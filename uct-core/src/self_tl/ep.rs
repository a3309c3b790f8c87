//! The self endpoint: every operation executes at once against the target
//! iface's region table and AM queue; a put with immediate data writes at
//! once and queues its immediate for the target's `progress`.

use std::sync::{Arc, Weak};

use super::iface::{
    Event, SelfShared, MAX_AM_HEADER, MAX_BCOPY, MAX_IOV, MAX_SHORT, SELF_AM_QUEUE_LEN,
    SELF_IMM_QUEUE_LEN,
};
use crate::atomic_ops::{check_aligned, fetch_at};
use crate::completion::{Completion, CompletionData, Status};
use crate::ep::{AtomicValue, Endpoint, FetchOp};
use crate::error::{Result, UctError};
use crate::iface::{ImmEvent, AM_ID_MAX};
use crate::memory::{check_host_iov, check_size, Access, Iov};
use crate::region_table::SoftRkey;
use crate::rkey::RemoteKey;

/// A self endpoint: a weak reference to the target iface's shared part, so
/// that closing the target fails the endpoint instead of keeping it alive.
pub struct SelfEp {
    tl_name: &'static str,
    target: Weak<SelfShared>,
}

impl SelfEp {
    pub(super) fn new(tl_name: &'static str, target: Weak<SelfShared>) -> Self {
        SelfEp { tl_name, target }
    }

    fn target(&self) -> Result<Arc<SelfShared>> {
        self.target.upgrade().ok_or_else(|| {
            UctError::EndpointFailed(format!("the peer {} iface was closed", self.tl_name))
        })
    }

    fn key<'a>(&self, rkey: &'a RemoteKey) -> Result<&'a SoftRkey> {
        rkey.downcast::<SoftRkey>(self.tl_name)
    }

    fn check_size(&self, what: &str, len: usize, max: usize) -> Result<()> {
        check_size(self.tl_name, what, len, max)
    }

    fn check_iov(&self, iov: &[Iov<'_>]) -> Result<usize> {
        check_host_iov(iov, self.tl_name, MAX_IOV, usize::MAX)
    }

    /// Copies `data` into the target region.
    fn write_remote(&self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<()> {
        let key = self.key(rkey)?;
        let target = self.target()?;
        target.table.access(
            key,
            remote_addr,
            data.len() as u64,
            Access::REMOTE_WRITE,
            |dst| {
                // SAFETY: `access` checked that [dst, dst + data.len()) lies
                // inside a registered region granting remote write, and holds
                // the table's read lock while this closure runs, so the
                // region cannot be deregistered (and its memory freed) under
                // the copy. `copy` allows the source to overlap the target
                // (a put from a region into itself).
                unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) }
            },
        )
    }

    /// Copies the iov list into the target region; returns its length.
    fn write_iov(
        &self,
        target: &SelfShared,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<usize> {
        let total = self.check_iov(iov)?;
        let key = *self.key(rkey)?;
        target.table.access(
            &key,
            remote_addr,
            total as u64,
            Access::REMOTE_WRITE,
            |dst| {
                let mut at = 0usize;
                for piece in iov {
                    // The local range was checked by check_iov; host memory.
                    let src = piece.mem.host_ptr(piece.offset, piece.len)?;
                    // SAFETY: the piece lengths sum to `total` and `access`
                    // checked [dst, dst + total), so [dst + at, dst + at +
                    // piece.len) is inside it and stays registered while this
                    // closure runs; host_ptr checked piece.len bytes at `src`
                    // inside the local handle, which the iov borrows.
                    unsafe { std::ptr::copy(src, dst.add(at), piece.len) };
                    at += piece.len;
                }
                Ok::<(), UctError>(())
            },
        )??;
        Ok(total)
    }

    /// Copies from the target region into `out`.
    fn read_remote(&self, out: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<()> {
        let key = self.key(rkey)?;
        let target = self.target()?;
        target.table.access(
            key,
            remote_addr,
            out.len() as u64,
            Access::REMOTE_READ,
            |src| {
                // SAFETY: `access` checked that [src, src + out.len()) lies
                // inside a registered region granting remote read and keeps
                // it registered (read lock) while this closure runs; `out`
                // is an exclusive borrow of out.len() bytes.
                unsafe { std::ptr::copy(src, out.as_mut_ptr(), out.len()) }
            },
        )
    }

    fn gather(&self, header: &[u8], iov: &[Iov<'_>]) -> Result<Vec<u8>> {
        let total = self.check_iov(iov)?;
        let mut buf = Vec::with_capacity(header.len() + total);
        buf.extend_from_slice(header);
        for piece in iov {
            let at = buf.len();
            buf.resize(at + piece.len, 0);
            piece.mem.read(piece.offset, &mut buf[at..])?;
        }
        Ok(buf)
    }

    fn enqueue_am(&self, id: u8, data: Vec<u8>) -> Result<Status> {
        if id as usize >= AM_ID_MAX {
            return Err(UctError::InvalidParam(format!(
                "active message id {id} is not below {AM_ID_MAX}"
            )));
        }
        let target = self.target()?;
        let mut queue = target.incoming.lock().unwrap_or_else(|p| p.into_inner());
        if queue.ams >= SELF_AM_QUEUE_LEN {
            return Ok(Status::NoResource);
        }
        queue.ams += 1;
        queue.events.push_back(Event::Am(id, data));
        Ok(Status::Done)
    }

    /// Runs a fetching atomic on the target word, every access check first.
    fn atomic(&self, op: FetchOp, remote_addr: u64, rkey: &RemoteKey) -> Result<u64> {
        check_aligned(remote_addr, op.width())?;
        let key = self.key(rkey)?;
        let target = self.target()?;
        target.table.access(
            key,
            remote_addr,
            op.width() as u64,
            Access::REMOTE_ATOMIC,
            |word| {
                // SAFETY: `access` checked that the op.width() bytes at
                // `word` lie in a registered region granting atomic access
                // and keeps it registered while this closure runs;
                // check_aligned above made remote_addr (and so `word`, the
                // same address in this process) a multiple of op.width();
                // a word granted REMOTE_ATOMIC is accessed only atomically.
                unsafe { fetch_at(word, op) }
            },
        )?
    }
}

impl Endpoint for SelfEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.check_size("put_short", data.len(), MAX_SHORT)?;
        self.write_remote(data, remote_addr, rkey)?;
        Ok(Status::Done)
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.check_size("put_bcopy", data.len(), MAX_BCOPY)?;
        self.write_remote(data, remote_addr, rkey)?;
        Ok(Status::Done)
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let target = self.target()?;
        self.write_iov(&target, iov, remote_addr, rkey)?;
        Ok(Status::Done)
    }

    fn put_zcopy_imm(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        imm: u32,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let target = self.target()?;
        // The queue stays locked across the write, so a full queue posts
        // nothing and the event goes in right after its data: the target's
        // progress never sees an event whose bytes are not there.
        let mut queue = target.incoming.lock().unwrap_or_else(|p| p.into_inner());
        if queue.imms >= SELF_IMM_QUEUE_LEN {
            return Ok(Status::NoResource);
        }
        let len = self.write_iov(&target, iov, remote_addr, rkey)?;
        queue.imms += 1;
        queue.events.push_back(Event::Imm(ImmEvent { imm, len }));
        Ok(Status::Done)
    }

    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.check_size("get_short", buf.len(), MAX_SHORT)?;
        self.read_remote(buf, remote_addr, rkey)?;
        Ok(Status::Done)
    }

    fn get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        self.check_size("get_bcopy", len, MAX_BCOPY)?;
        let mut buf = vec![0u8; len];
        self.read_remote(&mut buf, remote_addr, rkey)?;
        comp.set_data(CompletionData::Bytes(buf));
        Ok(Status::Done)
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let total = self.check_iov(iov)?;
        let key = *self.key(rkey)?;
        let target = self.target()?;
        target.table.access(
            &key,
            remote_addr,
            total as u64,
            Access::REMOTE_READ,
            |src| {
                let mut at = 0usize;
                for piece in iov {
                    let dst = piece.mem.host_ptr(piece.offset, piece.len)?;
                    // SAFETY: the piece lengths sum to `total` and `access`
                    // checked [src, src + total) for remote read, so [src +
                    // at, src + at + piece.len) is inside it and stays
                    // registered while this closure runs; host_ptr checked
                    // piece.len bytes at `dst` inside the local handle.
                    unsafe { std::ptr::copy(src.add(at), dst, piece.len) };
                    at += piece.len;
                }
                Ok::<(), UctError>(())
            },
        )??;
        Ok(Status::Done)
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        self.check_size("am_short payload", payload.len() + 8, MAX_SHORT)?;
        let mut data = Vec::with_capacity(8 + payload.len());
        data.extend_from_slice(&header.to_le_bytes());
        data.extend_from_slice(payload);
        self.enqueue_am(id, data)
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        self.check_size("am_bcopy", data.len(), MAX_BCOPY)?;
        self.enqueue_am(id, data.to_vec())
    }

    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        self.check_size("am_zcopy header", header.len(), MAX_AM_HEADER)?;
        let data = self.gather(header, iov)?;
        self.check_size("am_zcopy", data.len(), MAX_BCOPY)?;
        self.enqueue_am(id, data)
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        self.atomic(FetchOp::Add(value), remote_addr, rkey)?;
        Ok(Status::Done)
    }

    fn atomic_fetch(
        &mut self,
        op: FetchOp,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        let old = self.atomic(op, remote_addr, rkey)?;
        comp.set_data(CompletionData::Value(old));
        Ok(Status::Done)
    }

    fn flush(&mut self, _comp: Option<&Completion>) -> Result<Status> {
        // Every operation completed when it was posted; the peer must exist.
        self.target()?;
        Ok(Status::Done)
    }

    fn fence(&mut self) -> Result<Status> {
        Ok(Status::Done)
    }
}
