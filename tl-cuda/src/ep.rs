//! The cuda_copy endpoint: put and get zero-copy between host and CUDA
//! memory of this process, as `cuMemcpyAsync` on the iface's stream, each
//! followed by an event the iface's `progress` queries. The remote range
//! is checked against md-cuda's region table (the rkey's region, secret,
//! range and rights) while the copy is queued. Short, bcopy, active
//! messages and atomics are not offered (the CPU would have to touch
//! device memory): each is refused by name.

use std::sync::{Arc, Weak};

use md_cuda::Event;
use uct_core::region_table::SoftRkey;
use uct_core::{
    Access, AtomicValue, Completion, Endpoint, FetchOp, Iov, MemoryType, RemoteKey, Result, Status,
    UctError,
};

use crate::iface::{Inner, Shared, MAX_IOV, MAX_ZCOPY, TRANSPORT};

/// Which way a copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Local -> remote.
    Put,
    /// Remote -> local.
    Get,
}

/// An endpoint to a cuda_copy iface of this process.
pub struct CudaCopyEp {
    /// The iface this endpoint was made by: its stream carries the copies.
    shared: Arc<Shared>,
    /// The iface it connects to: gone means the peer closed.
    target: Weak<Shared>,
}

impl CudaCopyEp {
    pub(crate) fn new(shared: Arc<Shared>, target: Weak<Shared>) -> Self {
        CudaCopyEp { shared, target }
    }

    fn peer(&self) -> Result<()> {
        if self.target.strong_count() == 0 {
            return Err(UctError::EndpointFailed(
                "the peer cuda_copy iface was closed".into(),
            ));
        }
        Ok(())
    }

    fn unsupported(&self, what: &str) -> Result<Status> {
        Err(UctError::unsupported(TRANSPORT, what))
    }

    /// The rkey as md-cuda packed it.
    fn key<'a>(&self, rkey: &'a RemoteKey) -> Result<&'a SoftRkey> {
        if rkey.component() != md_cuda::COMPONENT {
            return Err(UctError::RkeyMismatch {
                expected: "an rkey of a cuda memory domain".into(),
                found: format!(
                    "memory domain {} of component {}",
                    rkey.md(),
                    rkey.component()
                ),
            });
        }
        rkey.downcast::<SoftRkey>(rkey.md())
    }

    /// Checks the local pieces: at most MAX_IOV, inside their handles, of
    /// memory the GPU can reach; returns the total.
    fn check_iov(iov: &[Iov<'_>]) -> Result<usize> {
        if iov.len() > MAX_IOV {
            return Err(UctError::InvalidParam(format!(
                "{} iov entries, {TRANSPORT} takes at most {MAX_IOV}",
                iov.len()
            )));
        }
        let mut total = 0usize;
        for piece in iov {
            piece.mem.check_range(piece.offset, piece.len)?;
            if !matches!(piece.mem.mem_type(), MemoryType::Host | MemoryType::Cuda) {
                return Err(UctError::MemoryTypeUnsupported {
                    mem_type: piece.mem.mem_type(),
                    owner: format!("transport {TRANSPORT}"),
                    hint: "it copies between host and cuda memory only".into(),
                });
            }
            total = total
                .checked_add(piece.len)
                .filter(|&t| t <= MAX_ZCOPY)
                .ok_or_else(|| {
                    UctError::InvalidParam(format!(
                        "zcopy of more than {MAX_ZCOPY} bytes; use smaller pieces"
                    ))
                })?;
        }
        Ok(total)
    }

    fn zcopy(
        &mut self,
        dir: Dir,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.peer()?;
        let key = self.key(rkey)?;
        let total = Self::check_iov(iov)?;
        if self.shared.lock().queue.is_full() {
            return Ok(Status::NoResource);
        }
        let needed = match dir {
            Dir::Put => Access::REMOTE_WRITE,
            Dir::Get => Access::REMOTE_READ,
        };
        let shared = &self.shared;
        // The table stays locked for reading while the copies are queued:
        // the remote region cannot be deregistered (and freed) meanwhile,
        // and its deregistration waits for them after (md-cuda quiesces).
        shared
            .table
            .access(key, remote_addr, total as u64, needed, |remote| {
                let mut inner = shared.lock();
                if inner.queue.is_full() {
                    return Ok(Status::NoResource);
                }
                if total == 0 {
                    return Ok(Status::Done);
                }
                let posted = post(&shared.dev, &mut inner, dir, iov, remote as u64, comp);
                if posted.is_err() {
                    // Copies queued before the failure must not outlive
                    // their memory untracked.
                    if let Err(e) = inner.stream.synchronize() {
                        log::error!("{TRANSPORT}: waiting after a failed post: {e}");
                    }
                }
                posted
            })?
    }
}

/// Queues one copy per piece and the event after them.
fn post(
    dev: &Arc<md_cuda::Device>,
    inner: &mut Inner,
    dir: Dir,
    iov: &[Iov<'_>],
    remote: u64,
    comp: Option<&Completion>,
) -> Result<Status> {
    let mut at = remote;
    for piece in iov {
        let local = piece.mem.addr() + piece.offset as u64;
        let (dst, src) = match dir {
            Dir::Put => (at, local),
            Dir::Get => (local, at),
        };
        // SAFETY: the local range was checked inside its handle, which
        // the queue holds until the event after this copy says it is done;
        // the remote range was checked inside a registered region, whose
        // deregistration waits for the GPU's queued copies before it frees.
        // Both are host or cuda memory, which the driver reaches through
        // unified addressing.
        unsafe { inner.stream.copy(dst, src, piece.len) }?;
        at += piece.len as u64;
    }
    let event = match inner.spare.pop() {
        Some(e) => e,
        None => Event::new(dev)?,
    };
    event.record(&inner.stream)?;
    let hold = iov.iter().map(|p| p.mem.clone()).collect();
    // Counted while the remote region is still locked for this post: its
    // deregistration, which waits for the lock, then waits for the GPU.
    dev.ops_queued(1);
    inner.queue.push(event, comp, hold);
    Ok(Status::InProgress)
}

impl Endpoint for CudaCopyEp {
    fn put_short(&mut self, _data: &[u8], _addr: u64, _rkey: &RemoteKey) -> Result<Status> {
        self.unsupported("put_short (the CPU cannot write device memory; use put_zcopy)")
    }

    fn put_bcopy(&mut self, _data: &[u8], _addr: u64, _rkey: &RemoteKey) -> Result<Status> {
        self.unsupported("put_bcopy (the CPU cannot write device memory; use put_zcopy)")
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.zcopy(Dir::Put, iov, remote_addr, rkey, comp)
    }

    fn get_short(&mut self, _buf: &mut [u8], _addr: u64, _rkey: &RemoteKey) -> Result<Status> {
        self.unsupported("get_short (the CPU cannot read device memory; use get_zcopy)")
    }

    fn get_bcopy(
        &mut self,
        _len: usize,
        _addr: u64,
        _rkey: &RemoteKey,
        _comp: &Completion,
    ) -> Result<Status> {
        self.unsupported("get_bcopy (the CPU cannot read device memory; use get_zcopy)")
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.zcopy(Dir::Get, iov, remote_addr, rkey, comp)
    }

    fn am_short(&mut self, _id: u8, _header: u64, _payload: &[u8]) -> Result<Status> {
        self.unsupported("active messages")
    }

    fn am_bcopy(&mut self, _id: u8, _data: &[u8]) -> Result<Status> {
        self.unsupported("active messages")
    }

    fn am_zcopy(
        &mut self,
        _id: u8,
        _header: &[u8],
        _iov: &[Iov<'_>],
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        self.unsupported("active messages")
    }

    fn atomic_add(&mut self, _v: AtomicValue, _addr: u64, _rkey: &RemoteKey) -> Result<Status> {
        self.unsupported("atomics")
    }

    fn atomic_fetch(
        &mut self,
        _op: FetchOp,
        _addr: u64,
        _rkey: &RemoteKey,
        _comp: &Completion,
    ) -> Result<Status> {
        self.unsupported("atomics")
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        self.peer()?;
        Ok(self.shared.lock().queue.flush(comp))
    }

    fn fence(&mut self) -> Result<Status> {
        // One stream runs its copies in order: already fenced.
        Ok(Status::Done)
    }

    fn check(&mut self) -> Result<()> {
        self.peer()
    }
}
