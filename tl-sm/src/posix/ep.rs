//! The posix endpoint: copies into and out of peer segments mapped through
//! their rkeys, after checking the owner's header; active messages into
//! the peer's ring.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uct_core::atomic_ops::fetch_at;
use uct_core::memory::check_host_iov;
use uct_core::{
    Access, AtomicValue, Completion, CompletionData, Endpoint, FetchOp, Iov, RemoteKey, Result,
    Status, UctError,
};

use super::cache::SegmentCache;
use super::fifo::{Push, Ring, SLOT_DATA};
use super::health::Health;
use super::iface::{MAX_AM_HEADER, MAX_BCOPY, MAX_IOV, MAX_SHORT, MAX_ZCOPY};
use super::PosixRkey;
use crate::segment::{Mapping, Peers, View};

/// How often an endpoint looks at its peer (process, iface, ring) at most;
/// `check` and operations in between answer from what it found.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);
/// Operations between two probes made by operations themselves, for loops
/// that post without calling `check` or progressing the iface.
const PROBE_EVERY_OPS: u32 = 256;

/// A posix endpoint: the peer iface's receive ring, the peer's pid and
/// health, and the iface's cache of mapped peer segments.
pub(crate) struct PosixEp {
    ring: Ring,
    /// The peer iface's identity page, read-only: whether it is open.
    ident: Mapping,
    pid: u32,
    cache: SegmentCache,
    health: Arc<Health>,
    /// UCT_POSIX_PEER_TIMEOUT: how long the peer's ring may hold messages
    /// without its tail moving.
    timeout: Duration,
    last_probe: Instant,
    /// The peer's ring held messages and its tail stood at this position
    /// since then.
    stall: Option<(Instant, u64)>,
    ops: u32,
}

impl PosixEp {
    pub(crate) fn new(
        ring: Ring,
        ident: Mapping,
        pid: u32,
        cache: SegmentCache,
        health: Arc<Health>,
        timeout: Duration,
    ) -> Self {
        PosixEp {
            ring,
            ident,
            pid,
            cache,
            health,
            timeout,
            last_probe: Instant::now(),
            stall: None,
            ops: 0,
        }
    }

    /// Before every operation: the endpoint has not failed, and every
    /// [`PROBE_EVERY_OPS`] operations, a probe.
    #[inline]
    fn usable(&mut self) -> Result<()> {
        self.health.failed()?;
        self.ops = self.ops.wrapping_add(1);
        if self.ops.is_multiple_of(PROBE_EVERY_OPS) {
            self.probe(false)?;
        }
        Ok(())
    }

    /// Looks at the peer, at most every [`PROBE_INTERVAL`] unless `now`:
    /// its iface still open, its process alive, its ring drained within
    /// the peer timeout. A failure fails the endpoint for good.
    fn probe(&mut self, now: bool) -> Result<()> {
        self.health.failed()?;
        let at = Instant::now();
        if !now && at.duration_since(self.last_probe) < PROBE_INTERVAL {
            return Ok(());
        }
        self.last_probe = at;
        // The identity page, which only the peer writes, not the ring's
        // header, which every sender may.
        if self.ident.is_dead() {
            return Err(self.health.fail(UctError::EndpointFailed(format!(
                "the posix iface of process {} was closed",
                self.pid
            ))));
        }
        self.health.watch()?;
        self.check_drained(at)
    }

    /// Fails the endpoint when the peer's ring has held messages for the
    /// peer timeout without its tail moving: the peer lives but does not
    /// progress (stopped, or stuck).
    fn check_drained(&mut self, at: Instant) -> Result<()> {
        let (head, tail) = (self.ring.shared_head(), self.ring.shared_tail());
        if head == tail {
            self.stall = None;
            return Ok(());
        }
        match self.stall {
            Some((since, seen)) if seen == tail => {
                if at.duration_since(since) > self.timeout {
                    return Err(self.health.fail(UctError::Timeout(format!(
                        "posix peer process {} has not drained its receive ring for {:?} \
                         (UCT_POSIX_PEER_TIMEOUT); it is stopped or stuck",
                        self.pid, self.timeout
                    ))));
                }
            }
            _ => self.stall = Some((at, tail)),
        }
        Ok(())
    }

    /// The segment of `key`, mapped once per key (and once per iface for
    /// keys of the same segment), read-only unless the key grants writes or
    /// atomics.
    #[inline]
    fn mapping<'k>(&self, key: &'k PosixRkey) -> Result<&'k (Arc<Mapping>, View)> {
        if key.pid != self.pid {
            return Err(self.foreign(key));
        }
        if let Some(mapped) = key.mapping.get() {
            return Ok(mapped);
        }
        if key.freed.get().is_some() {
            return Err(UctError::NoSuchRegion {
                region_id: key.soft.region_id,
            });
        }
        self.map(key)
    }

    #[cold]
    fn foreign(&self, key: &PosixRkey) -> UctError {
        UctError::BadRkey(format!(
            "the rkey names memory of process {}, but this posix endpoint reaches process {}; use it on an endpoint to {}",
            key.pid, self.pid, key.pid
        ))
    }

    /// [`mapping`](Self::mapping) the first time a key is used.
    #[cold]
    #[inline(never)]
    fn map<'k>(&self, key: &'k PosixRkey) -> Result<&'k (Arc<Mapping>, View)> {
        let peers = Peers::for_access(key.soft.access);
        let id = (key.pid, key.fd, peers == Peers::ReadWrite);
        let mapping = self
            .cache
            .get_or_open(id, || {
                Mapping::open(key.pid, key.fd, key.soft.region_id, peers)
            })
            .inspect_err(|e| {
                if matches!(e, UctError::NoSuchRegion { .. }) {
                    let _ = key.freed.set(());
                }
            })?;
        let view = mapping.view(key.soft.region_id, key.soft.secret);
        let _ = key.mapping.set((mapping, view));
        key.mapping.get().ok_or(UctError::NoSuchRegion {
            region_id: key.soft.region_id,
        })
    }

    /// Checks an access and returns the address in this endpoint's mapping
    /// of the segment: `len` bytes there are inside the mapping, which the
    /// rkey keeps (it holds an Arc of it) while the caller borrows the rkey.
    #[inline]
    fn target(&self, rkey: &RemoteKey, addr: u64, len: usize, needed: Access) -> Result<*mut u8> {
        let key = rkey.downcast::<PosixRkey>("posix")?;
        let (mapping, view) = self.mapping(key)?;
        mapping.check_view(
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
        let dst = self.target(rkey, addr, data.len(), Access::REMOTE_WRITE)?;
        // SAFETY: `target` checked that [dst, dst + data.len()) lies in this
        // endpoint's own mapping of the segment, which `rkey` (borrowed for
        // this call) keeps mapped, even if the owner frees the segment
        // meanwhile; no Rust borrow covers that mapping, so it does not
        // overlap `data`.
        unsafe { copy(data.as_ptr(), dst, data.len()) };
        Ok(Status::Done)
    }

    fn read(&self, out: &mut [u8], addr: u64, rkey: &RemoteKey) -> Result<()> {
        let src = self.target(rkey, addr, out.len(), Access::REMOTE_READ)?;
        // SAFETY: `target` checked that [src, src + out.len()) lies in this
        // endpoint's own mapping of the segment, which `rkey` keeps mapped
        // for this call; `out` is an exclusive borrow, so it does not
        // overlap that mapping.
        unsafe { copy(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn am(&mut self, id: u8, parts: &[&[u8]]) -> Result<Status> {
        if id as usize >= uct_core::iface::AM_ID_MAX {
            return Err(UctError::InvalidParam(format!(
                "active message id {id} is not below {}",
                uct_core::iface::AM_ID_MAX
            )));
        }
        let total: usize = parts.iter().map(|part| part.len()).sum();
        Self::check_size("active message", total, SLOT_DATA)?;
        match self.ring.push(id, parts) {
            Ok(Push::Done) => Ok(Status::Done),
            Ok(Push::Full | Push::Contended) => {
                // A full ring of a dead or stalled peer stays full: say so.
                // (Contended: another sender keeps moving the ring's head.)
                self.probe(false)?;
                Ok(Status::NoResource)
            }
            Err(e @ UctError::Protocol(_)) => Err(self.health.fail(e)),
            Err(e) => Err(e),
        }
    }

    fn atomic(&self, op: FetchOp, addr: u64, rkey: &RemoteKey) -> Result<u64> {
        let key = rkey.downcast::<PosixRkey>("posix")?;
        let (mapping, view) = self.mapping(key)?;
        let word =
            mapping.check_atomic(view, key.soft.region_id, key.soft.secret, addr, op.width())?;
        // SAFETY: `check_atomic` checked that the op.width() bytes at `word`
        // lie in this endpoint's mapping, kept by `rkey` for this call, and
        // that `word` itself is aligned to op.width(). A word granted
        // REMOTE_ATOMIC is accessed only atomically.
        unsafe { fetch_at(word, op) }
    }
}

/// `copy_nonoverlapping`, with the small sizes of short operations copied
/// inline: a call into libc's memmove for 8 bytes cost as much as the
/// access checks.
///
/// # Safety
/// As for `std::ptr::copy_nonoverlapping(src, dst, len)`.
#[inline(always)]
unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    if len == 8 {
        // SAFETY: the caller guarantees 8 readable bytes at `src` and 8
        // writable bytes at `dst`; unaligned accesses need no alignment.
        unsafe {
            dst.cast::<u64>()
                .write_unaligned(src.cast::<u64>().read_unaligned())
        };
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

impl Endpoint for PosixEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.usable()?;
        Self::check_size("put_short", data.len(), MAX_SHORT)?;
        self.write(data, remote_addr, rkey)
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.usable()?;
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
        self.usable()?;
        let total = Self::check_iov(iov, MAX_ZCOPY)?;
        let dst = self.target(rkey, remote_addr, total, Access::REMOTE_WRITE)?;
        let mut at = 0;
        for piece in iov {
            let src = piece.mem.host_ptr(piece.offset, piece.len)?;
            // SAFETY: the piece lengths sum to `total`, and `target` checked
            // [dst, dst + total) inside this endpoint's mapping (kept by
            // `rkey`), so [dst + at, dst + at + piece.len) is inside it;
            // host_ptr checked piece.len bytes at `src` in the local handle,
            // which the iov borrows, and no local handle is this mapping.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(at), piece.len) };
            at += piece.len;
        }
        Ok(Status::Done)
    }

    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.usable()?;
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
        self.usable()?;
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
        self.usable()?;
        let total = Self::check_iov(iov, MAX_ZCOPY)?;
        let src = self.target(rkey, remote_addr, total, Access::REMOTE_READ)?;
        let mut at = 0;
        for piece in iov {
            let dst = piece.mem.host_ptr(piece.offset, piece.len)?;
            // SAFETY: the piece lengths sum to `total`, and `target` checked
            // [src, src + total) inside this endpoint's mapping (kept by
            // `rkey`), so [src + at, src + at + piece.len) is inside it;
            // host_ptr checked piece.len writable bytes at `dst` in the local
            // handle, which the iov borrows, and no local handle is this
            // mapping.
            unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst, piece.len) };
            at += piece.len;
        }
        Ok(Status::Done)
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        self.usable()?;
        self.am(id, &[&header.to_le_bytes(), payload])
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        self.usable()?;
        self.am(id, &[data])
    }

    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        self.usable()?;
        Self::check_size("am_zcopy header", header.len(), MAX_AM_HEADER)?;
        Self::check_iov(iov, SLOT_DATA)?;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(iov.len() + 1);
        parts.push(header);
        for piece in iov {
            let src = piece.mem.host_ptr(piece.offset, piece.len)?;
            // SAFETY: host_ptr checked that piece.len bytes at `src` lie in
            // the handle's host memory; the iov borrows the handle for this
            // call, and `parts` does not outlive it.
            parts.push(unsafe { std::slice::from_raw_parts(src, piece.len) });
        }
        self.am(id, &parts)
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        self.usable()?;
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
        self.usable()?;
        let old = self.atomic(op, remote_addr, rkey)?;
        comp.set_data(CompletionData::Value(old));
        Ok(Status::Done)
    }

    fn flush(&mut self, _comp: Option<&Completion>) -> Result<Status> {
        // Every copy is complete when posted; what is left is whether the
        // peer is still there to see it.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.probe(true)?;
        Ok(Status::Done)
    }

    fn check(&mut self) -> Result<()> {
        self.probe(false)
    }

    fn fence(&mut self) -> Result<Status> {
        self.usable()?;
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(Status::Done)
    }
}
