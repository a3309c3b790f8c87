//! The cma endpoint: reads the owner's registration record, checks it, then
//! moves the data with one process_vm_* call (more if partial).

use uct_core::memory::check_host_iov;
use uct_core::{
    Access, AtomicValue, Completion, CompletionData, Endpoint, FetchOp, Iov, RemoteKey, Result,
    Status, UctError,
};

use super::iface::{MAX_BCOPY, MAX_IOV, MAX_SHORT, MAX_ZCOPY};
use super::records::{InFlight, PeerTable};
use super::vm::{transfer, Direction};
use super::CmaRkey;
use crate::host::PeerWatch;

/// Local memory of a transfer: (pointer, length) pieces.
type Pieces = [(*mut u8, usize)];

/// A cma endpoint: the peer's process, watched through a pidfd; every
/// access reads the peer's record table, mapped once per rkey.
pub(crate) struct CmaEp {
    pid: u32,
    peer: PeerWatch,
}

impl CmaEp {
    pub(crate) fn new(pid: u32) -> Self {
        CmaEp {
            pid,
            peer: PeerWatch::new("cma", pid),
        }
    }

    /// Checks the owner's record for an access, in its mapped table, and
    /// holds it in flight (so that the owner does not hand the memory back)
    /// until the returned guard is dropped after the transfer. A peer known
    /// dead is refused first; [`transfer_to_peer`](Self::transfer_to_peer)
    /// asks again right before the transfer.
    fn check<'k>(
        &mut self,
        rkey: &'k RemoteKey,
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<InFlight<'k>> {
        self.peer.check()?;
        let key = rkey.downcast::<CmaRkey>("cma")?;
        if key.pid != self.pid {
            return Err(UctError::RkeyMismatch {
                expected: format!("an rkey of process {}", self.pid),
                found: format!("an rkey of process {}", key.pid),
            });
        }
        let table = match key.mapping.get() {
            Some(table) => table,
            None => {
                let table = PeerTable::open(&key.table, key.pid, key.soft.region_id)?;
                let _ = key.mapping.set(table);
                key.mapping.get().ok_or(UctError::NoSuchRegion {
                    region_id: key.soft.region_id,
                })?
            }
        };
        table.access(
            key.index,
            key.soft.region_id,
            key.soft.secret,
            addr,
            len as u64,
            needed,
        )
    }

    fn check_size(what: &str, len: usize, max: usize) -> Result<()> {
        uct_core::memory::check_size("cma", what, len, max)
    }

    /// The iov as pieces, each checked by host_ptr to lie in its handle's
    /// host memory; valid while the iov borrows the handles.
    fn pieces(iov: &[Iov<'_>]) -> Result<Vec<(*mut u8, usize)>> {
        check_host_iov(iov, "cma", MAX_IOV, MAX_ZCOPY)?;
        iov.iter()
            .map(|piece| {
                piece
                    .mem
                    .host_ptr(piece.offset, piece.len)
                    .map(|ptr| (ptr, piece.len))
            })
            .collect()
    }

    /// Writes the pieces to `addr` in the peer, after checking its record.
    ///
    /// # Safety
    /// Every piece must be readable for its length for the whole call.
    unsafe fn put(&mut self, pieces: &Pieces, addr: u64, rkey: &RemoteKey) -> Result<Status> {
        let len = pieces.iter().map(|(_, len)| len).sum();
        let in_flight = self.check(rkey, addr, len, Access::REMOTE_WRITE)?;
        between_check_and_transfer();
        // SAFETY: the pieces are readable for the whole call (this
        // function's contract).
        unsafe { self.transfer_to_peer(pieces, addr, Direction::Write) }?;
        drop(in_flight);
        Ok(Status::Done)
    }

    /// Reads from `addr` in the peer into the pieces, after checking its
    /// record.
    ///
    /// # Safety
    /// Every piece must be writable for its length for the whole call, and
    /// borrowed by nothing else.
    unsafe fn get(&mut self, pieces: &Pieces, addr: u64, rkey: &RemoteKey) -> Result<Status> {
        let len = pieces.iter().map(|(_, len)| len).sum();
        let in_flight = self.check(rkey, addr, len, Access::REMOTE_READ)?;
        between_check_and_transfer();
        // SAFETY: the pieces are writable and unborrowed for the whole call
        // (this function's contract).
        unsafe { self.transfer_to_peer(pieces, addr, Direction::Read) }?;
        drop(in_flight);
        Ok(Status::Done)
    }

    /// [`transfer`] on the peer's pid, each of its process_vm_* calls (a
    /// partial result is finished with another) once the peer's pidfd
    /// says, asked right then, that the peer still runs: then the pid is
    /// still the peer's (a pid is recycled only after its process exited),
    /// not a recycled one's. The window left is the few instructions
    /// between that poll and the system call, against a pid reused within
    /// them.
    ///
    /// # Safety
    /// As [`transfer`].
    unsafe fn transfer_to_peer(
        &mut self,
        pieces: &Pieces,
        addr: u64,
        direction: Direction,
    ) -> Result<()> {
        let peer = &mut self.peer;
        // SAFETY: forwarded from this function's contract.
        unsafe { transfer(self.pid, pieces, addr, direction, || peer.check_now()) }
    }

    fn no(what: &str) -> UctError {
        UctError::unsupported("cma", what)
    }
}

/// Test seam: runs the hook a test set, between an access's check and its
/// transfer, where a deregistration by the owner races the access.
#[cfg(test)]
fn between_check_and_transfer() {
    if let Some(hook) = tests::BETWEEN.with(|h| h.borrow_mut().take()) {
        hook();
    }
}

#[cfg(not(test))]
#[inline(always)]
fn between_check_and_transfer() {}

impl Endpoint for CmaEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), MAX_SHORT)?;
        // SAFETY: `data` is borrowed, readable, for this call; the pointer
        // is only read from (process_vm_writev).
        unsafe { self.put(&[(data.as_ptr() as *mut u8, data.len())], remote_addr, rkey) }
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_bcopy", data.len(), MAX_BCOPY)?;
        // SAFETY: as in put_short.
        unsafe { self.put(&[(data.as_ptr() as *mut u8, data.len())], remote_addr, rkey) }
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let pieces = Self::pieces(iov)?;
        // SAFETY: host_ptr checked each piece inside its handle's host
        // memory, which the iov borrows for this call.
        unsafe { self.put(&pieces, remote_addr, rkey) }
    }

    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("get_short", buf.len(), MAX_SHORT)?;
        // SAFETY: `buf` is exclusively borrowed, writable, for this call.
        unsafe { self.get(&[(buf.as_mut_ptr(), buf.len())], remote_addr, rkey) }
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
        // SAFETY: `buf` is a fresh local buffer of `len` bytes, borrowed by
        // nothing else during the call.
        let status = unsafe { self.get(&[(buf.as_mut_ptr(), len)], remote_addr, rkey) }?;
        comp.set_data(CompletionData::Bytes(buf));
        Ok(status)
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let pieces = Self::pieces(iov)?;
        // SAFETY: host_ptr checked each piece inside its handle's host
        // memory, which the iov borrows for this call; the caller lends that
        // memory to the transport for the get, as zcopy requires.
        unsafe { self.get(&pieces, remote_addr, rkey) }
    }

    fn am_short(&mut self, _id: u8, _header: u64, _payload: &[u8]) -> Result<Status> {
        Err(Self::no("active messages (use posix on this host)"))
    }

    fn am_bcopy(&mut self, _id: u8, _data: &[u8]) -> Result<Status> {
        Err(Self::no("active messages (use posix on this host)"))
    }

    fn am_zcopy(
        &mut self,
        _id: u8,
        _header: &[u8],
        _iov: &[Iov<'_>],
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        Err(Self::no("active messages (use posix on this host)"))
    }

    fn atomic_add(
        &mut self,
        _value: AtomicValue,
        _remote_addr: u64,
        _rkey: &RemoteKey,
    ) -> Result<Status> {
        Err(Self::no("atomics (use posix on this host)"))
    }

    fn atomic_fetch(
        &mut self,
        _op: FetchOp,
        _remote_addr: u64,
        _rkey: &RemoteKey,
        _comp: &Completion,
    ) -> Result<Status> {
        Err(Self::no("atomics (use posix on this host)"))
    }

    fn flush(&mut self, _comp: Option<&Completion>) -> Result<Status> {
        // Every transfer finished in its call; the peer must still exist.
        self.peer.check()?;
        Ok(Status::Done)
    }

    fn fence(&mut self) -> Result<Status> {
        Ok(Status::Done)
    }

    /// The peer process's exit, seen through its pidfd (probed every few
    /// milliseconds at most). cma has nothing outstanding to fail: every
    /// operation finishes in its call, and fails there once the peer is gone.
    fn check(&mut self) -> Result<()> {
        self.peer.check()
    }
}

#[cfg(test)]
mod tests;
