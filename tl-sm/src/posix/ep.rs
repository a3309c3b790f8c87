//! The posix endpoint: copies into and out of peer segments mapped through
//! their rkeys, after checking the owner's header; active messages into
//! the peer's ring.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use uct_core::atomic_ops::{check_aligned, fetch_at};
use uct_core::memory::check_host_iov;
use uct_core::{
    Access, AtomicValue, Completion, CompletionData, Endpoint, FetchOp, Iov, RemoteKey, Result,
    Status, UctError,
};

use super::fifo::{Push, Ring, SLOT_DATA};
use super::iface::{SegmentCache, MAX_AM_HEADER, MAX_BCOPY, MAX_IOV, MAX_SHORT, MAX_ZCOPY};
use super::segment::{Mapping, View};
use super::PosixRkey;
use crate::host;

pub(crate) struct PosixEp {
    ring: Ring,
    pid: u32,
    cache: SegmentCache,
}

impl PosixEp {
    pub(crate) fn new(ring: Ring, pid: u32, cache: SegmentCache) -> Self {
        PosixEp { ring, pid, cache }
    }

    /// The peer is still there: its iface open, its process alive.
    fn peer_ok(&self) -> Result<()> {
        if self.ring.mapping().is_dead() {
            return Err(UctError::EndpointFailed(
                "the posix peer iface was closed".into(),
            ));
        }
        if !host::pid_alive(self.pid) {
            return Err(host::peer_gone("posix", self.pid));
        }
        Ok(())
    }

    /// The segment of `key`, mapped once per key (and once per iface for
    /// keys of the same segment).
    fn mapping<'k>(&self, key: &'k PosixRkey) -> Result<&'k (Arc<Mapping>, View)> {
        if let Some(m) = key.mapping.get() {
            return Ok(m);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let m = match cache.get(&key.segment) {
            Some(m) if !m.is_dead() => m.clone(),
            _ => {
                // Not mapped yet, or freed by its owner: opening the name
                // again fails for a freed segment.
                cache.remove(&key.segment);
                let m = Arc::new(Mapping::open(&key.segment, key.soft.region_id)?);
                cache.insert(key.segment.clone(), m.clone());
                m
            }
        };
        let view = m.view(key.soft.secret);
        let _ = key.mapping.set((m, view));
        key.mapping.get().ok_or(UctError::NoSuchRegion {
            region_id: key.soft.region_id,
        })
    }

    /// Checks an access and returns the address in the mapping, which the
    /// rkey keeps mapped while the caller copies.
    fn target(&self, rkey: &RemoteKey, addr: u64, len: usize, needed: Access) -> Result<*mut u8> {
        let key = rkey.downcast::<PosixRkey>("posix")?;
        let (m, view) = self.mapping(key)?;
        m.check_view(
            view,
            key.soft.region_id,
            key.soft.secret,
            addr,
            len as u64,
            needed,
        )
    }

    fn check_size(what: &str, len: usize, max: usize) -> Result<()> {
        uct_core::memory::check_size("posix", what, len, max)
    }

    fn check_iov(iov: &[Iov<'_>], max: usize) -> Result<usize> {
        check_host_iov(iov, "posix", MAX_IOV, max)
    }

    fn write(&self, data: &[u8], addr: u64, rkey: &RemoteKey) -> Result<Status> {
        let p = self.target(rkey, addr, data.len(), Access::REMOTE_WRITE)?;
        // SAFETY: `check` placed [p, p+len) inside the mapping, which the
        // rkey keeps mapped.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(Status::Done)
    }

    fn read(&self, out: &mut [u8], addr: u64, rkey: &RemoteKey) -> Result<()> {
        let p = self.target(rkey, addr, out.len(), Access::REMOTE_READ)?;
        // SAFETY: as in write.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn am(&self, id: u8, parts: &[&[u8]]) -> Result<Status> {
        if id as usize >= uct_core::iface::AM_ID_MAX {
            return Err(UctError::InvalidParam(format!(
                "active message id {id} is not below {}",
                uct_core::iface::AM_ID_MAX
            )));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        Self::check_size("active message", total, SLOT_DATA)?;
        if self.ring.mapping().is_dead() {
            return Err(UctError::EndpointFailed(
                "the posix peer iface was closed".into(),
            ));
        }
        match self.ring.push(id, parts) {
            Push::Done => Ok(Status::Done),
            Push::Full => {
                // A full ring of a dead peer stays full: say so.
                self.peer_ok()?;
                Ok(Status::NoResource)
            }
        }
    }

    fn atomic(&self, op: FetchOp, addr: u64, rkey: &RemoteKey) -> Result<u64> {
        check_aligned(addr, op.width())?;
        let p = self.target(rkey, addr, op.width(), Access::REMOTE_ATOMIC)?;
        // SAFETY: a checked, aligned word in a live shared mapping (segment
        // data is page-aligned in every process).
        unsafe { fetch_at(p, op) }
    }
}

impl Endpoint for PosixEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), MAX_SHORT)?;
        self.write(data, remote_addr, rkey)
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_bcopy", data.len(), MAX_BCOPY)?;
        self.write(data, remote_addr, rkey)
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let total = Self::check_iov(iov, MAX_ZCOPY)?;
        let p = self.target(rkey, remote_addr, total, Access::REMOTE_WRITE)?;
        let mut at = 0;
        for e in iov {
            let src = e.mem.host_ptr(e.offset, e.len)?;
            // SAFETY: the pieces sum to `total`, which `check` placed inside
            // the mapping; src is a checked local range.
            unsafe { std::ptr::copy_nonoverlapping(src, p.add(at), e.len) };
            at += e.len;
        }
        Ok(Status::Done)
    }

    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("get_short", buf.len(), MAX_SHORT)?;
        self.read(buf, remote_addr, rkey)?;
        Ok(Status::Done)
    }

    fn get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        Self::check_size("get_bcopy", len, MAX_BCOPY)?;
        let mut buf = vec![0u8; len];
        self.read(&mut buf, remote_addr, rkey)?;
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
        let total = Self::check_iov(iov, MAX_ZCOPY)?;
        let p = self.target(rkey, remote_addr, total, Access::REMOTE_READ)?;
        let mut at = 0;
        for e in iov {
            let dst = e.mem.host_ptr(e.offset, e.len)?;
            // SAFETY: as in put_zcopy, in the other direction.
            unsafe { std::ptr::copy_nonoverlapping(p.add(at), dst, e.len) };
            at += e.len;
        }
        Ok(Status::Done)
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        self.am(id, &[&header.to_le_bytes(), payload])
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        self.am(id, &[data])
    }

    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        Self::check_size("am_zcopy header", header.len(), MAX_AM_HEADER)?;
        Self::check_iov(iov, SLOT_DATA)?;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(iov.len() + 1);
        parts.push(header);
        for e in iov {
            let p = e.mem.host_ptr(e.offset, e.len)?;
            // SAFETY: a checked local host range, alive for this call.
            parts.push(unsafe { std::slice::from_raw_parts(p, e.len) });
        }
        self.am(id, &parts)
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
        // Every copy is complete when posted; what is left is whether the
        // peer is still there to see it.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.peer_ok()?;
        Ok(Status::Done)
    }

    fn fence(&mut self) -> Result<Status> {
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(Status::Done)
    }
}
