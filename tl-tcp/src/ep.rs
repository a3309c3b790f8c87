//! The tcp endpoint: requests go out on its connection; replies come back
//! on it and are matched to pending operations by the iface's `progress`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uct_core::memory::iov_total;
use uct_core::region_table::SoftRkey;
use uct_core::{
    AtomicValue, Completion, CompletionData, Endpoint, FetchOp, Iov, MemHandle, MemoryType,
    RemoteKey, Result, Status, UctError,
};

use crate::conn::{Conn, Payload};
use crate::iface::Connector;
use crate::iface::{MAX_AM_HEADER, MAX_AM_ZCOPY, MAX_BCOPY, MAX_IOV, MAX_SHORT, MAX_ZCOPY};
use crate::wire::{Header, Parsed, WireAtomic, WireKey};

enum Kind {
    GetBytes(Completion),
    GetIov(Vec<(MemHandle, usize, usize)>, Option<Completion>),
    Atomic(Completion),
    Flush(Option<Completion>),
}

/// What the endpoint and its iface share.
pub(crate) struct EpState {
    conn: Conn,
    peer: SocketAddr,
    pending: HashMap<u64, Pending>,
    next_req: u64,
    /// First error a peer reported for a request without a reply of its
    /// own (put, add); returned by the next flush.
    nack: Option<UctError>,
    /// The connection failed: every operation fails with this.
    failed: Option<UctError>,
    /// A request unanswered for this long fails the endpoint.
    timeout: Duration,
    last_check: Instant,
}

/// A request waiting for its reply, and when it was sent.
struct Pending {
    kind: Kind,
    since: Instant,
}

fn finish(p: Kind, r: std::result::Result<(), UctError>) {
    match p {
        Kind::GetBytes(c) | Kind::Atomic(c) => c.finish(r),
        Kind::GetIov(_, c) | Kind::Flush(c) => {
            if let Some(c) = c {
                c.finish(r)
            }
        }
    }
}

impl EpState {
    pub(crate) fn new(conn: Conn, peer: SocketAddr, timeout: Duration) -> Self {
        EpState {
            conn,
            peer,
            pending: HashMap::new(),
            next_req: 1,
            nack: None,
            failed: None,
            timeout,
            last_check: Instant::now(),
        }
    }

    /// Fails the endpoint when a request has waited longer than the peer
    /// timeout. Checked a few times a second, not on every progress call.
    fn check_timeout(&mut self) -> Result<()> {
        if self.pending.is_empty() || self.last_check.elapsed() < Duration::from_millis(100) {
            return Ok(());
        }
        self.last_check = Instant::now();
        if let Some(oldest) = self.pending.values().map(|p| p.since).min() {
            if oldest.elapsed() > self.timeout {
                return Err(UctError::EndpointFailed(format!(
                    "tcp peer {} left a request unanswered for {:?} (UCT_TCP_PEER_TIMEOUT); it is dead or stuck",
                    self.peer, self.timeout
                )));
            }
        }
        Ok(())
    }

    fn fail(&mut self, err: UctError) {
        log::debug!("tcp endpoint to {}: {err}", self.peer);
        for (_, p) in self.pending.drain() {
            finish(p.kind, Err(err.clone()));
        }
        self.conn.fail_queued(&err);
        self.failed.get_or_insert(err);
    }

    /// The socket and the readiness to wait for, while the endpoint works.
    pub(crate) fn poll_fd(&self) -> Option<libc::pollfd> {
        if self.failed.is_some() {
            return None;
        }
        let out = if self.conn.wants_write() {
            libc::POLLOUT
        } else {
            0
        };
        Some(libc::pollfd {
            fd: self.conn.fd(),
            events: libc::POLLIN | out,
            revents: 0,
        })
    }

    /// With nothing to read or write: only the peer timeout.
    pub(crate) fn idle(&mut self) {
        if self.failed.is_none() {
            if let Err(e) = self.check_timeout() {
                self.fail(e);
            }
        }
    }

    /// Sends queued frames and handles replies; called by the iface when
    /// the socket is ready.
    pub(crate) fn progress(&mut self) -> usize {
        if self.failed.is_some() {
            return 0;
        }
        let r = (|| -> Result<usize> {
            let mut n = 0;
            self.conn.write_out()?;
            self.conn.read_in()?;
            while let Parsed::Frame {
                header,
                data_at,
                data_len,
                total,
            } = self.conn.peek().map_err(UctError::Protocol)?
            {
                n += 1;
                let data = self.conn.data(data_at, data_len).to_vec();
                self.conn.consume(total);
                self.on_reply(header, data)?;
            }
            self.check_timeout()?;
            Ok(n)
        })();
        r.unwrap_or_else(|e| {
            self.fail(e);
            1
        })
    }

    fn on_reply(&mut self, h: Header, data: Vec<u8>) -> Result<()> {
        let unknown = |req| UctError::Protocol(format!("reply to unknown request {req}"));
        match h {
            Header::GetReply { req, error } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.kind {
                    Kind::GetBytes(c) => match error {
                        Some(e) => c.finish(Err(e.into())),
                        None => {
                            c.set_data(CompletionData::Bytes(data));
                            c.finish(Ok(()));
                        }
                    },
                    Kind::GetIov(iov, c) => {
                        let r = match error {
                            Some(e) => Err(e.into()),
                            None => scatter(&iov, &data),
                        };
                        if let Some(c) = c {
                            c.finish(r);
                        }
                    }
                    other => {
                        finish(
                            other,
                            Err(UctError::Protocol("get reply to another request".into())),
                        );
                        return Err(UctError::Protocol("get reply to another request".into()));
                    }
                }
            }
            Header::AtomicReply { req, old, error } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.kind {
                    Kind::Atomic(c) => match error {
                        Some(e) => c.finish(Err(e.into())),
                        None => {
                            c.set_data(CompletionData::Value(old));
                            c.finish(Ok(()));
                        }
                    },
                    other => {
                        finish(
                            other,
                            Err(UctError::Protocol("atomic reply to another request".into())),
                        );
                        return Err(UctError::Protocol("atomic reply to another request".into()));
                    }
                }
            }
            Header::FlushReply { req } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.kind {
                    Kind::Flush(c) => {
                        let r = match self.nack.take() {
                            Some(e) => Err(e),
                            None => Ok(()),
                        };
                        if let Some(c) = c {
                            c.finish(r);
                        }
                    }
                    other => {
                        finish(
                            other,
                            Err(UctError::Protocol("flush reply to another request".into())),
                        );
                        return Err(UctError::Protocol("flush reply to another request".into()));
                    }
                }
            }
            Header::Nack { error, .. } => {
                let e: UctError = error.into();
                log::debug!("tcp endpoint to {}: peer refused a request: {e}", self.peer);
                self.nack.get_or_insert(e);
            }
            other => {
                return Err(UctError::Protocol(format!(
                    "unexpected {other:?} on an endpoint"
                )))
            }
        }
        Ok(())
    }
}

impl Drop for EpState {
    fn drop(&mut self) {
        for (_, p) in self.pending.drain() {
            finish(
                p.kind,
                Err(UctError::Canceled("the tcp endpoint was closed".into())),
            );
        }
        self.conn
            .fail_queued(&UctError::Canceled("the tcp endpoint was closed".into()));
    }
}

/// Copies a get reply into the iov list it was asked for.
fn scatter(iov: &[(MemHandle, usize, usize)], data: &[u8]) -> std::result::Result<(), UctError> {
    let want: usize = iov.iter().map(|(_, _, l)| l).sum();
    if want != data.len() {
        return Err(UctError::Protocol(format!(
            "get reply has {} bytes, {want} asked for",
            data.len()
        )));
    }
    let mut at = 0;
    for (mem, off, len) in iov {
        mem.write(*off, &data[at..at + len])?;
        at += len;
    }
    Ok(())
}

/// A tcp endpoint.
pub(crate) struct TcpEp {
    state: Option<Arc<Mutex<EpState>>>,
    /// Set while the endpoint waits for `connect_to_ep`.
    connector: Option<Connector>,
}

impl TcpEp {
    pub(crate) fn new(state: Arc<Mutex<EpState>>) -> Self {
        TcpEp {
            state: Some(state),
            connector: None,
        }
    }

    pub(crate) fn unconnected(connector: Connector) -> Self {
        TcpEp {
            state: None,
            connector: Some(connector),
        }
    }

    /// The shared state, if the connection still works.
    fn live(&self) -> Result<MutexGuard<'_, EpState>> {
        let state = self.state.as_ref().ok_or_else(|| {
            UctError::InvalidParam(
                "the tcp endpoint is not connected; call connect_to_ep with the peer endpoint's address first".into(),
            )
        })?;
        let s = state.lock().unwrap_or_else(|p| p.into_inner());
        match &s.failed {
            Some(e) => Err(e.clone()),
            None => Ok(s),
        }
    }

    fn key(rkey: &RemoteKey) -> Result<WireKey> {
        let k = rkey.downcast::<SoftRkey>("tcp")?;
        Ok(WireKey {
            region_id: k.region_id,
            secret: k.secret,
        })
    }

    fn check_size(what: &str, len: usize, max: usize) -> Result<()> {
        if len > max {
            return Err(UctError::InvalidParam(format!(
                "{what} of {len} bytes exceeds tcp's {max}-byte limit; use the zcopy variant or smaller pieces"
            )));
        }
        Ok(())
    }

    fn iov_list(iov: &[Iov<'_>], max: usize) -> Result<Vec<(MemHandle, usize, usize)>> {
        if iov.len() > MAX_IOV {
            return Err(UctError::InvalidParam(format!(
                "{} iov entries, tcp takes at most {MAX_IOV}",
                iov.len()
            )));
        }
        for e in iov {
            if e.mem.mem_type() != MemoryType::Host {
                return Err(UctError::MemoryTypeUnsupported {
                    mem_type: e.mem.mem_type(),
                    owner: "transport tcp".into(),
                    hint: "it moves host memory only; an RDMA NIC with DMA-buf support (rc over mlx5, efa, irdma, bnxt_re) is needed for device memory".into(),
                });
            }
        }
        Self::check_size("zcopy", iov_total(iov)?, max)?;
        Ok(iov
            .iter()
            .map(|e| (e.mem.clone(), e.offset, e.len))
            .collect())
    }

    /// Sends a frame whose data is copied; Done, or NoResource when full.
    fn send_copied(&mut self, h: Header, parts: &[&[u8]]) -> Result<Status> {
        let mut s = self.live()?;
        if s.conn.is_full() {
            s.conn.write_out()?;
            if s.conn.is_full() {
                return Ok(Status::NoResource);
            }
        }
        match s.conn.send_borrowed(&h, parts) {
            Ok(_) => Ok(Status::Done),
            Err(e) => {
                s.fail(e.clone());
                Err(e)
            }
        }
    }

    /// Sends a request that gets a reply, recorded as pending.
    fn request(
        &mut self,
        make: impl FnOnce(u64) -> Header,
        pending: Kind,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let mut s = self.live()?;
        if s.conn.is_full() {
            s.conn.write_out()?;
            if s.conn.is_full() {
                return Ok(Status::NoResource);
            }
        }
        let req = s.next_req;
        s.next_req += 1;
        if let Err(e) = s.conn.send(&make(req), Payload::None, None) {
            s.fail(e.clone());
            return Err(e);
        }
        if let Some(c) = comp {
            c.start();
        }
        s.pending.insert(
            req,
            Pending {
                kind: pending,
                since: Instant::now(),
            },
        );
        Ok(Status::InProgress)
    }

    fn send_zcopy(
        &mut self,
        h: Header,
        payload: Payload,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let mut s = self.live()?;
        if s.conn.is_full() {
            s.conn.write_out()?;
            if s.conn.is_full() {
                return Ok(Status::NoResource);
            }
        }
        match s.conn.send(&h, payload, comp) {
            Ok(true) => Ok(Status::Done),
            Ok(false) => Ok(Status::InProgress),
            Err(e) => {
                s.fail(e.clone());
                Err(e)
            }
        }
    }

    fn next_req(&self) -> Result<u64> {
        let mut s = self.live()?;
        let r = s.next_req;
        s.next_req += 1;
        Ok(r)
    }
}

impl Endpoint for TcpEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), MAX_SHORT)?;
        let key = Self::key(rkey)?;
        let req = self.next_req()?;
        self.send_copied(
            Header::Put {
                req,
                key,
                addr: remote_addr,
            },
            &[data],
        )
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_bcopy", data.len(), MAX_BCOPY)?;
        let key = Self::key(rkey)?;
        let req = self.next_req()?;
        self.send_copied(
            Header::Put {
                req,
                key,
                addr: remote_addr,
            },
            &[data],
        )
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let list = Self::iov_list(iov, MAX_ZCOPY)?;
        let key = Self::key(rkey)?;
        let req = self.next_req()?;
        self.send_zcopy(
            Header::Put {
                req,
                key,
                addr: remote_addr,
            },
            Payload::Iov(Vec::new(), list),
            comp,
        )
    }

    fn get_short(
        &mut self,
        _buf: &mut [u8],
        _remote_addr: u64,
        _rkey: &RemoteKey,
    ) -> Result<Status> {
        Err(UctError::unsupported(
            "tcp",
            "get_short (a get needs a round trip; use get_bcopy or get_zcopy)",
        ))
    }

    fn get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        Self::check_size("get_bcopy", len, MAX_BCOPY)?;
        let key = Self::key(rkey)?;
        self.request(
            |req| Header::Get {
                req,
                key,
                addr: remote_addr,
                len: len as u64,
            },
            Kind::GetBytes(comp.clone()),
            Some(comp),
        )
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let list = Self::iov_list(iov, MAX_ZCOPY)?;
        let len: usize = list.iter().map(|(_, _, l)| l).sum();
        let key = Self::key(rkey)?;
        self.request(
            |req| Header::Get {
                req,
                key,
                addr: remote_addr,
                len: len as u64,
            },
            Kind::GetIov(list, comp.cloned()),
            comp,
        )
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        Self::check_size("am_short", payload.len() + 8, MAX_SHORT)?;
        self.send_copied(Header::Am { id }, &[&header.to_le_bytes(), payload])
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        Self::check_size("am_bcopy", data.len(), MAX_BCOPY)?;
        self.send_copied(Header::Am { id }, &[data])
    }

    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        comp: Option<&Completion>,
    ) -> Result<Status> {
        Self::check_size("am_zcopy header", header.len(), MAX_AM_HEADER)?;
        let list = Self::iov_list(iov, MAX_AM_ZCOPY - header.len().min(MAX_AM_ZCOPY))?;
        self.send_zcopy(Header::Am { id }, Payload::Iov(header.to_vec(), list), comp)
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        let key = Self::key(rkey)?;
        let req = self.next_req()?;
        let h = Header::Atomic {
            req,
            key,
            addr: remote_addr,
            width: value.width() as u8,
            op: WireAtomic::Add,
            value: value.as_u64(),
        };
        self.send_copied(h, &[])
    }

    fn atomic_fetch(
        &mut self,
        op: FetchOp,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        let key = Self::key(rkey)?;
        let (wop, value) = match op {
            FetchOp::Add(v) => (WireAtomic::FetchAdd, v),
            FetchOp::Swap(v) => (WireAtomic::Swap, v),
            FetchOp::CompareSwap { compare, swap } => {
                if compare.width() != swap.width() {
                    return Err(UctError::InvalidParam(
                        "compare and swap values must have the same width".into(),
                    ));
                }
                (
                    WireAtomic::CompareSwap {
                        compare: compare.as_u64(),
                    },
                    swap,
                )
            }
        };
        self.request(
            |req| Header::Atomic {
                req,
                key,
                addr: remote_addr,
                width: value.width() as u8,
                op: wop,
                value: value.as_u64(),
            },
            Kind::Atomic(comp.clone()),
            Some(comp),
        )
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        self.request(
            |req| Header::Flush { req },
            Kind::Flush(comp.cloned()),
            comp,
        )
    }

    fn fence(&mut self) -> Result<Status> {
        // One ordered stream, executed in order by the target.
        self.live().map(|_| Status::Done)
    }

    fn ep_address(&self) -> Result<Vec<u8>> {
        // Peers reach an endpoint through its iface's listener.
        match &self.connector {
            Some(c) => Ok(c.iface_addr.clone()),
            None => Err(UctError::InvalidParam(
                "this tcp endpoint was connected to an iface; it has no endpoint address".into(),
            )),
        }
    }

    fn connect_to_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        if self.state.is_some() {
            return Err(UctError::InvalidParam(
                "the tcp endpoint is already connected".into(),
            ));
        }
        let c = self
            .connector
            .as_ref()
            .ok_or_else(|| UctError::InvalidParam("the tcp endpoint cannot connect".into()))?;
        self.state = Some(c.connect(device_addr, ep_addr)?);
        Ok(())
    }
}
