//! The cma endpoint: reads the owner's registration record, checks it, then
//! moves the data with one process_vm_* call (more if partial).

use std::sync::Arc;

use uct_core::memory::check_host_iov;
use uct_core::{
    Access, AtomicValue, Completion, CompletionData, Endpoint, FetchOp, Iov, RemoteKey, Result,
    Status, UctError,
};

use super::iface::{MAX_BCOPY, MAX_IOV, MAX_SHORT, MAX_ZCOPY};
use super::vm::{transfer, Dir};
use super::{records, CmaRkey};
use crate::host;

pub(crate) struct CmaEp {
    pid: u32,
}

impl CmaEp {
    pub(crate) fn new(pid: u32) -> Self {
        CmaEp { pid }
    }

    /// Checks the owner's record for an access, in its mapped table.
    fn check(&self, rkey: &RemoteKey, addr: u64, len: usize, needed: Access) -> Result<()> {
        let key = rkey.downcast::<CmaRkey>("cma")?;
        if key.pid != self.pid {
            return Err(UctError::RkeyMismatch {
                expected: format!("an rkey of process {}", self.pid),
                found: format!("an rkey of process {}", key.pid),
            });
        }
        let map = match key.mapping.get() {
            Some(m) => m,
            None => {
                let m = Arc::new(records::open_table(&key.table, key.soft.region_id)?);
                let _ = key.mapping.set(m);
                key.mapping.get().ok_or(UctError::NoSuchRegion {
                    region_id: key.soft.region_id,
                })?
            }
        };
        records::check(
            map,
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

    fn pieces(iov: &[Iov<'_>]) -> Result<(Vec<(*mut u8, usize)>, usize)> {
        let total = check_host_iov(iov, "cma", MAX_IOV, MAX_ZCOPY)?;
        let v = iov
            .iter()
            .map(|e| e.mem.host_ptr(e.offset, e.len).map(|p| (p, e.len)))
            .collect::<Result<_>>()?;
        Ok((v, total))
    }

    fn put(
        &self,
        pieces: &[(*mut u8, usize)],
        len: usize,
        addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        self.check(rkey, addr, len, Access::REMOTE_WRITE)?;
        transfer(self.pid, pieces, addr, Dir::Write)?;
        Ok(Status::Done)
    }

    fn get(
        &self,
        pieces: &[(*mut u8, usize)],
        len: usize,
        addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        self.check(rkey, addr, len, Access::REMOTE_READ)?;
        transfer(self.pid, pieces, addr, Dir::Read)?;
        Ok(Status::Done)
    }

    fn no(what: &str) -> UctError {
        UctError::unsupported("cma", what)
    }
}

impl Endpoint for CmaEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), MAX_SHORT)?;
        self.put(
            &[(data.as_ptr() as *mut u8, data.len())],
            data.len(),
            remote_addr,
            rkey,
        )
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_bcopy", data.len(), MAX_BCOPY)?;
        self.put(
            &[(data.as_ptr() as *mut u8, data.len())],
            data.len(),
            remote_addr,
            rkey,
        )
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let (pieces, total) = Self::pieces(iov)?;
        self.put(&pieces, total, remote_addr, rkey)
    }

    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("get_short", buf.len(), MAX_SHORT)?;
        let len = buf.len();
        self.get(&[(buf.as_mut_ptr(), len)], len, remote_addr, rkey)
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
        let st = self.get(&[(buf.as_mut_ptr(), len)], len, remote_addr, rkey)?;
        comp.set_data(CompletionData::Bytes(buf));
        Ok(st)
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        _comp: Option<&Completion>,
    ) -> Result<Status> {
        let (pieces, total) = Self::pieces(iov)?;
        self.get(&pieces, total, remote_addr, rkey)
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
        if !host::pid_alive(self.pid) {
            return Err(host::peer_gone("cma", self.pid));
        }
        Ok(Status::Done)
    }

    fn fence(&mut self) -> Result<Status> {
        Ok(Status::Done)
    }
}
