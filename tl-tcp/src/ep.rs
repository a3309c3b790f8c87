//! The tcp endpoint: requests go out on the link to its peer iface; replies
//! come back on it and are matched to pending operations by the iface's
//! `progress`. A put's completion says its frame was sent. A put with
//! immediate data is a request answered by the target, so its completion
//! says the data landed and the target took the immediate (its handler
//! runs in the progress call that answered), or carries the target's
//! refusal. The target executes it only once it has connected back to
//! this iface (it takes immediates only from ifaces it connected to): until
//! then it waits, and the endpoint fails after the peer timeout if the
//! target never connects back.

use std::sync::{Arc, Mutex, MutexGuard};

use uct_core::memory::check_host_iov;
use uct_core::region_table::SoftRkey;
use uct_core::{
    AtomicValue, Completion, Endpoint, FetchOp, Iov, MemHandle, RemoteKey, Result, Status, UctError,
};

use crate::conn::Payload;
use crate::iface::Connector;
use crate::iface::{MAX_AM_HEADER, MAX_AM_ZCOPY, MAX_BCOPY, MAX_IOV, MAX_SHORT, MAX_ZCOPY};
use crate::link::Link;
use crate::pending::PendingOp;
use crate::wire::{Header, WireAtomic, WireKey};

/// A tcp endpoint.
pub(crate) struct TcpEp {
    /// The link to the peer iface; None until `connect_to_ep`.
    link: Option<Arc<Mutex<Link>>>,
    /// This endpoint's id on its link: refusals are reported to it.
    id: u32,
    /// Set while the endpoint waits for `connect_to_ep`.
    connector: Option<Connector>,
}

impl TcpEp {
    /// An endpoint on `link`, connected to the peer iface.
    pub(crate) fn new(link: Arc<Mutex<Link>>) -> Self {
        let id = link.lock().unwrap_or_else(|p| p.into_inner()).new_ep_id();
        TcpEp {
            link: Some(link),
            id,
            connector: None,
        }
    }

    /// An endpoint that connects later, to a peer endpoint's address.
    pub(crate) fn unconnected(connector: Connector) -> Self {
        TcpEp {
            link: None,
            id: 0,
            connector: Some(connector),
        }
    }

    /// The link, if it still works.
    fn live(&self) -> Result<MutexGuard<'_, Link>> {
        let link = self.link.as_ref().ok_or_else(|| {
            UctError::InvalidParam(
                "the tcp endpoint is not connected; call connect_to_ep with the peer endpoint's address first".into(),
            )
        })?;
        let link = link.lock().unwrap_or_else(|p| p.into_inner());
        match &link.failed {
            Some(e) => Err(e.clone()),
            None => Ok(link),
        }
    }

    /// The link, if it still works and its send queue has room after
    /// writing out what the socket takes; None: NoResource.
    fn live_with_room(&self) -> Result<Option<MutexGuard<'_, Link>>> {
        let mut link = self.live()?;
        if link.conn.is_full() {
            link.conn.write_out()?;
            if link.conn.is_full() {
                return Ok(None);
            }
        }
        Ok(Some(link))
    }

    fn key(rkey: &RemoteKey) -> Result<WireKey> {
        let soft = rkey.downcast::<SoftRkey>("tcp")?;
        Ok(WireKey {
            region_id: soft.region_id,
            secret: soft.secret,
        })
    }

    fn check_size(what: &str, len: usize, max: usize) -> Result<()> {
        uct_core::memory::check_size("tcp", what, len, max)
    }

    fn iov_list(iov: &[Iov<'_>], max: usize) -> Result<Vec<(MemHandle, usize, usize)>> {
        check_host_iov(iov, "tcp", MAX_IOV, max)?;
        Ok(iov
            .iter()
            .map(|piece| (piece.mem.clone(), piece.offset, piece.len))
            .collect())
    }

    /// Sends a frame whose data is copied; Done, or NoResource when full.
    /// `make` builds the header from the request id, which is drawn under
    /// the same lock as the send, so that ids go out in order.
    fn send_copied(&mut self, make: impl FnOnce(u64) -> Header, parts: &[&[u8]]) -> Result<Status> {
        let id = self.id;
        let Some(mut link) = self.live_with_room()? else {
            return Ok(Status::NoResource);
        };
        let header = match link.next_req(id) {
            Ok(req) => make(req),
            Err(e) => {
                link.fail(e.clone());
                return Err(e);
            }
        };
        match link.conn.send_borrowed(&header, parts) {
            Ok(_) => Ok(Status::Done),
            Err(e) => {
                link.fail(e.clone());
                Err(e)
            }
        }
    }

    /// Sends a request that gets a reply, recorded as pending; NoResource
    /// while too many requests, or too many bytes of gets (`get_bytes`),
    /// wait for their replies.
    fn request(
        &mut self,
        make: impl FnOnce(u64) -> Header,
        pending: PendingOp,
        get_bytes: usize,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let Some(mut link) = self.live_with_room()? else {
            return Ok(Status::NoResource);
        };
        if !link.has_room_for_request(get_bytes) {
            return Ok(Status::NoResource);
        }
        let sent = link
            .next_req(self.id)
            .and_then(|req| link.conn.send(&make(req), Payload::None, None).map(|_| req));
        let req = match sent {
            Ok(req) => req,
            Err(e) => {
                link.fail(e.clone());
                return Err(e);
            }
        };
        if let Some(comp) = comp {
            comp.start();
        }
        link.add_pending(req, pending, get_bytes);
        Ok(Status::InProgress)
    }

    /// Sends a put with immediate data, a request whose data stays in user
    /// memory until written: InProgress, and `comp` fires once the target
    /// answered and the frame is all written (the memory is then no longer
    /// read); NoResource while the send queue or the requests are full.
    fn send_put_imm(
        &mut self,
        make: impl FnOnce(u64) -> Header,
        payload: Payload,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let Some(mut link) = self.live_with_room()? else {
            return Ok(Status::NoResource);
        };
        if !link.has_room_for_request(0) {
            return Ok(Status::NoResource);
        }
        let sent = link
            .next_req(self.id)
            .and_then(|req| link.conn.send(&make(req), payload, comp).map(|_| req));
        let req = match sent {
            Ok(req) => req,
            Err(e) => {
                link.fail(e.clone());
                return Err(e);
            }
        };
        if let Some(comp) = comp {
            comp.start();
        }
        let pending = PendingOp::PutImm {
            ep: self.id,
            comp: comp.cloned(),
        };
        link.add_pending(req, pending, 0);
        Ok(Status::InProgress)
    }

    /// Sends a frame whose data stays in user memory until written; Done
    /// when the socket took it all, else InProgress (`comp` fires later).
    fn send_zcopy(
        &mut self,
        make: impl FnOnce(u64) -> Header,
        payload: Payload,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let id = self.id;
        let Some(mut link) = self.live_with_room()? else {
            return Ok(Status::NoResource);
        };
        let header = match link.next_req(id) {
            Ok(req) => make(req),
            Err(e) => {
                link.fail(e.clone());
                return Err(e);
            }
        };
        match link.conn.send(&header, payload, comp) {
            Ok(true) => Ok(Status::Done),
            Ok(false) => Ok(Status::InProgress),
            Err(e) => {
                link.fail(e.clone());
                Err(e)
            }
        }
    }
}

impl Drop for TcpEp {
    fn drop(&mut self) {
        if let Some(link) = &self.link {
            link.lock()
                .unwrap_or_else(|p| p.into_inner())
                .forget_ep(self.id);
        }
    }
}

impl Endpoint for TcpEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        Self::check_size("put_short", data.len(), MAX_SHORT)?;
        let key = Self::key(rkey)?;
        self.send_copied(
            |req| Header::Put {
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
        self.send_copied(
            |req| Header::Put {
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
        self.send_zcopy(
            |req| Header::Put {
                req,
                key,
                addr: remote_addr,
            },
            Payload::Iov(Vec::new(), list),
            comp,
        )
    }

    fn put_zcopy_imm(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        imm: u32,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let list = Self::iov_list(iov, MAX_ZCOPY)?;
        let key = Self::key(rkey)?;
        self.send_put_imm(
            |req| Header::PutImm {
                req,
                key,
                addr: remote_addr,
                imm,
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
            PendingOp::GetBytes(comp.clone()),
            len,
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
            PendingOp::GetIov(list, comp.cloned()),
            len,
            comp,
        )
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        Self::check_size("am_short", payload.len() + 8, MAX_SHORT)?;
        self.send_copied(|_| Header::Am { id }, &[&header.to_le_bytes(), payload])
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        Self::check_size("am_bcopy", data.len(), MAX_BCOPY)?;
        self.send_copied(|_| Header::Am { id }, &[data])
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
        self.send_zcopy(
            |_| Header::Am { id },
            Payload::Iov(header.to_vec(), list),
            comp,
        )
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        let key = Self::key(rkey)?;
        let header = |req| Header::Atomic {
            req,
            key,
            addr: remote_addr,
            width: value.width() as u8,
            op: WireAtomic::Add,
            value: value.as_u64(),
        };
        self.send_copied(header, &[])
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
            PendingOp::Atomic(comp.clone()),
            0,
            Some(comp),
        )
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        self.request(
            |req| Header::Flush { req },
            PendingOp::Flush {
                ep: self.id,
                comp: comp.cloned(),
            },
            0,
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
            Some(connector) => Ok(connector.iface_addr.clone()),
            None => Err(UctError::InvalidParam(
                "this tcp endpoint was connected to an iface; it has no endpoint address".into(),
            )),
        }
    }

    fn check(&mut self) -> Result<()> {
        // Unconnected: no peer yet, nothing to find dead.
        match &self.link {
            Some(link) => link.lock().unwrap_or_else(|p| p.into_inner()).check_alive(),
            None => Ok(()),
        }
    }

    fn connect_to_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        if self.link.is_some() {
            return Err(UctError::InvalidParam(
                "the tcp endpoint is already connected".into(),
            ));
        }
        let connector = self
            .connector
            .as_ref()
            .ok_or_else(|| UctError::InvalidParam("the tcp endpoint cannot connect".into()))?;
        let link = connector.connect(device_addr, ep_addr)?;
        self.id = link.lock().unwrap_or_else(|p| p.into_inner()).new_ep_id();
        self.link = Some(link);
        Ok(())
    }
}
