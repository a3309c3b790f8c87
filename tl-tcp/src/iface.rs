//! The tcp iface: listens on one interface, accepts connections from peer
//! endpoints and executes their requests; drives its own endpoints' sockets.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use uct_core::region_table::{RegionTable, SoftRkey};
use uct_core::{
    Access, AmHandler, AmMessage, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain,
    MemoryType, Result, SizeLimits, UctError,
};

use crate::conn::{Conn, Payload};
use crate::devices::NetDevice;
use crate::ep::{EpState, TcpEp};
use crate::wire::{Header, Parsed, WireAtomic, WireError, WireKey};

pub(crate) const MAX_SHORT: usize = 8 * 1024;
pub(crate) const MAX_BCOPY: usize = 64 * 1024;
pub(crate) const MAX_ZCOPY: usize = 16 << 20;
pub(crate) const MAX_AM_ZCOPY: usize = 64 * 1024;
pub(crate) const MAX_IOV: usize = 16;
pub(crate) const MAX_AM_HEADER: usize = 256;
/// Largest data a peer may put in one frame.
pub(crate) const MAX_FRAME_DATA: usize = MAX_ZCOPY;
const AM_IDS: usize = uct_core::iface::AM_ID_MAX;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The endpoints an iface progresses.
pub(crate) type EpList = Arc<Mutex<Vec<Weak<Mutex<EpState>>>>>;

/// What an endpoint needs to connect later and be progressed by its iface.
pub(crate) struct Connector {
    eps: EpList,
    timeout: Duration,
    /// The address of the iface the endpoint belongs to; peers connect to
    /// it, so it is the endpoint's address too.
    pub(crate) iface_addr: Vec<u8>,
}

impl Connector {
    /// Connects to the peer iface at these addresses and registers the new
    /// connection with the iface.
    pub(crate) fn connect(
        &self,
        device_addr: &[u8],
        iface_addr: &[u8],
    ) -> Result<Arc<Mutex<EpState>>> {
        let addr = parse_addr(device_addr, iface_addr).ok_or_else(|| {
            UctError::InvalidParam(format!(
                "not a tcp address (expected 16 + 2 bytes, got {} + {})",
                device_addr.len(),
                iface_addr.len()
            ))
        })?;
        let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
            .map_err(|e| UctError::Unreachable(format!("tcp connect to {addr}: {e}")))?;
        let state = Arc::new(Mutex::new(EpState::new(
            Conn::new(stream, MAX_FRAME_DATA, self.timeout)?,
            addr,
            self.timeout,
        )));
        let mut eps = self.eps.lock().unwrap_or_else(|p| p.into_inner());
        eps.retain(|w| w.strong_count() > 0);
        eps.push(Arc::downgrade(&state));
        Ok(state)
    }
}

fn tcp_attrs() -> IfaceAttrs {
    let lim = |max_zcopy| SizeLimits {
        max_short: MAX_SHORT,
        max_bcopy: MAX_BCOPY,
        min_zcopy: 0,
        max_zcopy,
        max_iov: MAX_IOV,
    };
    IfaceAttrs {
        caps: Caps::PUT_SHORT
            | Caps::PUT_BCOPY
            | Caps::PUT_ZCOPY
            | Caps::GET_BCOPY
            | Caps::GET_ZCOPY
            | Caps::AM
            | Caps::ATOMIC32
            | Caps::ATOMIC64
            | Caps::FLUSH
            | Caps::FENCE
            | Caps::CONNECT_TO_IFACE
            | Caps::CONNECT_TO_EP
            | Caps::ERRHANDLE_PEER_FAILURE,
        put: lim(MAX_ZCOPY),
        get: lim(MAX_ZCOPY),
        am: lim(MAX_AM_ZCOPY),
        max_am_header: MAX_AM_HEADER,
        mem_types: vec![MemoryType::Host],
        latency_ns: 10_000.0,
        bandwidth_bps: 2.0e9,
        overhead_ns: 200.0,
        iface_addr_len: 2,
        device_addr_len: 16,
        ep_addr_len: 2,
    }
}

/// A tcp iface on one network interface.
pub struct TcpIface {
    dev: NetDevice,
    listener: TcpListener,
    md: Arc<dyn MemoryDomain>,
    table: Arc<RegionTable>,
    attrs: IfaceAttrs,
    handlers: Vec<Option<AmHandler>>,
    /// Connections from peer endpoints: requests come in here.
    accepted: Vec<Peer>,
    /// This iface's own endpoints, progressed here. Shared with endpoints
    /// not yet connected, which add themselves when they connect.
    eps: EpList,
    peer_timeout: Duration,
    /// Reused by progress: the poll set and the live endpoints.
    pfds: Vec<libc::pollfd>,
    ep_scratch: Vec<Arc<Mutex<EpState>>>,
}

fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn parse_addr(device_addr: &[u8], iface_addr: &[u8]) -> Option<SocketAddr> {
    let ip: [u8; 16] = device_addr.try_into().ok()?;
    let port = u16::from_le_bytes(iface_addr.try_into().ok()?);
    let v6 = Ipv6Addr::from(ip);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    Some(SocketAddr::new(ip, port))
}

impl TcpIface {
    pub(crate) fn open(
        dev: NetDevice,
        md: Arc<dyn MemoryDomain>,
        table: Arc<RegionTable>,
        peer_timeout: Duration,
    ) -> Result<TcpIface> {
        let listener = TcpListener::bind(SocketAddr::new(dev.addr, 0))
            .map_err(|e| UctError::io(format!("tcp: listen on {} ({})", dev.name, dev.addr), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| UctError::io("tcp: set non-blocking", e))?;
        Ok(TcpIface {
            dev,
            listener,
            md,
            table,
            attrs: tcp_attrs(),
            handlers: (0..AM_IDS).map(|_| None).collect(),
            accepted: Vec::new(),
            eps: EpList::default(),
            peer_timeout,
            pfds: Vec::new(),
            ep_scratch: Vec::new(),
        })
    }

    fn accept_new(&mut self) -> usize {
        let mut n = 0;
        loop {
            match self.listener.accept() {
                Ok((s, peer)) => match Conn::new(s, MAX_FRAME_DATA, self.peer_timeout) {
                    Ok(c) => {
                        log::debug!("tcp {}: accepted {peer}", self.dev.name);
                        self.accepted.push(Peer {
                            conn: c,
                            direct: None,
                        });
                        n += 1;
                    }
                    Err(e) => log::warn!("tcp {}: dropping {peer}: {e}", self.dev.name),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("tcp {}: accept failed: {e}", self.dev.name);
                    return n;
                }
            }
        }
    }

    /// Reads and executes requests on accepted connections; a connection
    /// that sends nonsense or fails is closed, the others go on.
    fn serve(&mut self, ready: &[bool]) -> usize {
        let mut events = 0;
        let table = &self.table;
        let handlers = &mut self.handlers;
        let dev = &self.dev.name;
        let mut i = 0;
        self.accepted.retain_mut(|peer| {
            let go = ready.get(i).copied().unwrap_or(true);
            i += 1;
            if !go {
                return true;
            }
            match serve_peer(table, handlers, peer, &mut events) {
                Ok(()) => true,
                Err(e) => {
                    log::warn!(
                        "tcp {dev}: closing connection from {}: {e}",
                        peer.conn.peer()
                    );
                    false
                }
            }
        });
        events
    }
}

/// A connection from a peer endpoint, and the large put whose data is
/// being read straight into its target, if any.
struct Peer {
    conn: Conn,
    direct: Option<Direct>,
}

/// Puts of at least this much data are read straight into their target.
const DIRECT_MIN: usize = 16 * 1024;

/// The rest of a large put, read from the socket into the target region.
struct Direct {
    req: u64,
    key: WireKey,
    addr: u64,
    remaining: usize,
    /// Set when the access was refused: the data is read and dropped, and
    /// the refusal is reported when it ends.
    error: Option<UctError>,
}

fn serve_peer(
    table: &RegionTable,
    handlers: &mut [Option<AmHandler>],
    peer: &mut Peer,
    events: &mut usize,
) -> std::result::Result<(), String> {
    let err = |e: UctError| e.to_string();
    loop {
        if let Some(d) = peer.direct.as_mut() {
            match direct_step(table, &mut peer.conn, d).map_err(err)? {
                None => break,
                Some(refused) => {
                    *events += 1;
                    let req = d.req;
                    peer.direct = None;
                    if let Some(error) = refused {
                        peer.conn
                            .send(
                                &Header::Nack {
                                    req,
                                    error: WireError::from(&error),
                                },
                                Payload::None,
                                None,
                            )
                            .map_err(err)?;
                    }
                }
            }
        }
        peer.conn.read_in().map_err(err)?;
        let mut replies = Vec::new();
        loop {
            match peer.conn.peek()? {
                Parsed::Frame {
                    header,
                    data_at,
                    data_len,
                    total,
                } => {
                    *events += 1;
                    if let Some(r) =
                        execute(table, handlers, header, peer.conn.data(data_at, data_len))
                            .map_err(err)?
                    {
                        replies.push(r);
                    }
                    peer.conn.consume(total);
                }
                Parsed::HeaderOnly {
                    header: Header::Put { req, key: k, addr },
                    data_at,
                    data_len,
                    have,
                } if data_len >= DIRECT_MIN => {
                    // What is here goes in now; the rest straight from the
                    // socket. The whole range is checked first, so a refusal
                    // names the put, not a piece of it.
                    let first = peer.conn.data(data_at, have);
                    let r =
                        table.access(&key(k), addr, data_len as u64, Access::REMOTE_WRITE, |p| {
                            // SAFETY: the table checked [p, p+data_len) and
                            // have <= data_len.
                            unsafe { std::ptr::copy_nonoverlapping(first.as_ptr(), p, have) }
                        });
                    peer.conn.consume(data_at + have);
                    peer.direct = Some(Direct {
                        req,
                        key: k,
                        addr: addr + have as u64,
                        remaining: data_len - have,
                        error: r.err(),
                    });
                    break;
                }
                _ => break,
            }
        }
        for (h, p) in replies {
            peer.conn.send(&h, p, None).map_err(err)?;
        }
        if peer.direct.is_none() {
            break;
        }
    }
    peer.conn.write_out().map_err(err)?;
    Ok(())
}

/// Reads the rest of a large put into its target. None: the socket has
/// nothing more now; Some(refusal): the put is complete.
fn direct_step(
    table: &RegionTable,
    conn: &mut Conn,
    d: &mut Direct,
) -> Result<Option<Option<UctError>>> {
    let mut scratch = Vec::new();
    while d.remaining > 0 {
        let n = if d.error.is_none() {
            // The region cannot be deregistered while the bytes land: the
            // table's read lock is held around the receive.
            let want = d.remaining;
            match table.access(
                &key(d.key),
                d.addr,
                want as u64,
                Access::REMOTE_WRITE,
                |p| conn.recv_into(p, want),
            ) {
                Ok(r) => r?,
                Err(e) => {
                    d.error = Some(e);
                    continue;
                }
            }
        } else {
            scratch.resize(d.remaining.min(64 * 1024), 0);
            let len = scratch.len();
            conn.recv_into(scratch.as_mut_ptr(), len)?
        };
        if n == 0 {
            return Ok(None);
        }
        d.addr += n as u64;
        d.remaining -= n;
    }
    Ok(Some(d.error.take()))
}

fn key(k: WireKey) -> SoftRkey {
    // Only id and secret matter to the table; range and rights are its own.
    SoftRkey {
        region_id: k.region_id,
        secret: k.secret,
        base: 0,
        len: 0,
        access: Access::empty(),
    }
}

fn atomic(
    table: &RegionTable,
    k: WireKey,
    addr: u64,
    width: u8,
    op: WireAtomic,
    value: u64,
) -> std::result::Result<u64, UctError> {
    if width != 4 && width != 8 {
        return Err(UctError::InvalidParam(format!("atomic width {width}")));
    }
    if !addr.is_multiple_of(width as u64) {
        return Err(UctError::Misaligned {
            addr,
            align: width as u64,
        });
    }
    table.access(&key(k), addr, width as u64, Access::REMOTE_ATOMIC, |p| {
        if width == 4 {
            // SAFETY: the table checked a live 4-byte range granting atomic
            // access; alignment was checked above.
            let a = unsafe { AtomicU32::from_ptr(p as *mut u32) };
            let v = value as u32;
            (match op {
                WireAtomic::Add | WireAtomic::FetchAdd => a.fetch_add(v, Ordering::SeqCst),
                WireAtomic::Swap => a.swap(v, Ordering::SeqCst),
                WireAtomic::CompareSwap { compare } => {
                    match a.compare_exchange(compare as u32, v, Ordering::SeqCst, Ordering::SeqCst)
                    {
                        Ok(x) | Err(x) => x,
                    }
                }
            }) as u64
        } else {
            // SAFETY: as above for 8 bytes.
            let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
            match op {
                WireAtomic::Add | WireAtomic::FetchAdd => a.fetch_add(value, Ordering::SeqCst),
                WireAtomic::Swap => a.swap(value, Ordering::SeqCst),
                WireAtomic::CompareSwap { compare } => {
                    match a.compare_exchange(compare, value, Ordering::SeqCst, Ordering::SeqCst) {
                        Ok(x) | Err(x) => x,
                    }
                }
            }
        }
    })
}

/// Executes one request from a peer and returns its reply, if it has one.
fn execute(
    table: &RegionTable,
    handlers: &mut [Option<AmHandler>],
    h: Header,
    data: &[u8],
) -> Result<Option<(Header, Payload)>> {
    let nack = |req, e: UctError| {
        Some((
            Header::Nack {
                req,
                error: WireError::from(&e),
            },
            Payload::None,
        ))
    };
    Ok(match h {
        Header::Am { id } => {
            match handlers.get_mut(id as usize).and_then(Option::as_mut) {
                Some(handler) => handler(AmMessage { id, data }),
                None => log::warn!(
                    "tcp: dropped active message {id} ({} bytes): no handler set",
                    data.len()
                ),
            }
            None
        }
        Header::Put { req, key: k, addr } => {
            let r = table.access(
                &key(k),
                addr,
                data.len() as u64,
                Access::REMOTE_WRITE,
                |p| {
                    // SAFETY: the table checked that [p, p+len) is live and
                    // grants remote write.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
                },
            );
            r.err().and_then(|e| nack(req, e))
        }
        Header::Get {
            req,
            key: k,
            addr,
            len,
        } => {
            if len as usize > MAX_FRAME_DATA {
                let error =
                    WireError::Other(format!("get of {len} bytes exceeds {MAX_FRAME_DATA}"));
                return Ok(Some((
                    Header::GetReply {
                        req,
                        error: Some(error),
                    },
                    Payload::None,
                )));
            }
            // Allocate only once the access is known to be good.
            let r = table.access(&key(k), addr, len, Access::REMOTE_READ, |p| {
                // SAFETY: as for put, with remote read granted.
                unsafe { std::slice::from_raw_parts(p as *const u8, len as usize) }.to_vec()
            });
            Some(match r {
                Ok(buf) => (Header::GetReply { req, error: None }, Payload::Bytes(buf)),
                Err(e) => (
                    Header::GetReply {
                        req,
                        error: Some(WireError::from(&e)),
                    },
                    Payload::None,
                ),
            })
        }
        Header::Atomic {
            req,
            key: k,
            addr,
            width,
            op,
            value,
        } => match (op, atomic(table, k, addr, width, op, value)) {
            (WireAtomic::Add, Ok(_)) => None,
            (WireAtomic::Add, Err(e)) => nack(req, e),
            (_, Ok(old)) => Some((
                Header::AtomicReply {
                    req,
                    old,
                    error: None,
                },
                Payload::None,
            )),
            (_, Err(e)) => Some((
                Header::AtomicReply {
                    req,
                    old: 0,
                    error: Some(WireError::from(&e)),
                },
                Payload::None,
            )),
        },
        Header::Flush { req } => Some((Header::FlushReply { req }, Payload::None)),
        other => {
            return Err(UctError::Protocol(format!(
                "a reply ({other:?}) sent as a request"
            )));
        }
    })
}

impl Iface for TcpIface {
    fn transport(&self) -> &str {
        "tcp"
    }

    fn device(&self) -> &str {
        &self.dev.name
    }

    fn attrs(&self) -> &IfaceAttrs {
        &self.attrs
    }

    fn md(&self) -> &Arc<dyn MemoryDomain> {
        &self.md
    }

    fn device_address(&self) -> Vec<u8> {
        ip_bytes(self.dev.addr).to_vec()
    }

    fn iface_address(&self) -> Vec<u8> {
        let port = self.listener.local_addr().map(|a| a.port()).unwrap_or(0);
        port.to_le_bytes().to_vec()
    }

    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        match parse_addr(device_addr, iface_addr) {
            // Loopback reaches only loopback; other addresses are assumed
            // routable (the connect will tell).
            Some(a) => a.ip().is_loopback() == self.dev.addr.is_loopback() || !a.ip().is_loopback(),
            None => false,
        }
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        let connector = Connector {
            eps: self.eps.clone(),
            timeout: self.peer_timeout,
            iface_addr: self.iface_address(),
        };
        match params {
            EpParams::ToIface {
                device_addr,
                iface_addr,
            } => Ok(Box::new(TcpEp::new(
                connector.connect(&device_addr, &iface_addr)?,
            ))),
            EpParams::Unconnected => Ok(Box::new(TcpEp::unconnected(connector))),
        }
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        let slot = self.handlers.get_mut(id as usize).ok_or_else(|| {
            UctError::InvalidParam(format!("active message id {id} is not below {AM_IDS}"))
        })?;
        *slot = Some(handler);
        Ok(())
    }

    fn progress(&mut self) -> usize {
        // One poll() over the listener, the accepted connections and this
        // iface's endpoints; only ready sockets are read or written.
        let mut eps = std::mem::take(&mut self.ep_scratch);
        eps.clear();
        self.eps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|w| match w.upgrade() {
                Some(s) => {
                    eps.push(s);
                    true
                }
                None => false,
            });
        let pfds = &mut self.pfds;
        pfds.clear();
        pfds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for p in &self.accepted {
            let out = if p.conn.wants_write() {
                libc::POLLOUT
            } else {
                0
            };
            pfds.push(libc::pollfd {
                fd: p.conn.fd(),
                events: libc::POLLIN | out,
                revents: 0,
            });
        }
        let ep_fds: Vec<Option<libc::pollfd>> = eps
            .iter()
            .map(|e| e.lock().unwrap_or_else(|p| p.into_inner()).poll_fd())
            .collect();
        pfds.extend(ep_fds.iter().flatten().copied());
        // SAFETY: pfds is a valid array of pollfd of that length.
        let ready = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 0) };
        let mut n = 0;
        if ready > 0 {
            let polled = self.accepted.len();
            if pfds[0].revents != 0 {
                n += self.accept_new();
            }
            // Serve ready peers, those reading a large put, and new ones.
            let ready_peers: Vec<bool> = (0..self.accepted.len())
                .map(|i| {
                    i >= polled
                        || self.pfds[1 + i].revents != 0
                        || self.accepted[i].direct.is_some()
                })
                .collect();
            n += self.serve(&ready_peers);
            let mut at = 1 + polled;
            for (e, fd) in eps.iter().zip(&ep_fds) {
                let mut st = e.lock().unwrap_or_else(|p| p.into_inner());
                match fd {
                    Some(_) if self.pfds.get(at).is_some_and(|p| p.revents != 0) => {
                        n += st.progress()
                    }
                    Some(_) => st.idle(),
                    None => {}
                }
                if fd.is_some() {
                    at += 1;
                }
            }
        } else {
            for e in &eps {
                e.lock().unwrap_or_else(|p| p.into_inner()).idle();
            }
        }
        eps.clear();
        self.ep_scratch = eps;
        n
    }
}
