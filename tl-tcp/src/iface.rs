//! The tcp iface: listens on one interface and keeps one link (TCP
//! connection) per peer iface, whichever side opened it; its `progress`
//! polls them all at once, executes the requests that arrive and completes
//! its endpoints' operations.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uct_core::region_table::RegionTable;
use uct_core::{
    AmHandler, AmHandlers, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType,
    Result, SizeLimits, UctError,
};

use crate::address::{ip_bytes, parse_addr};
use crate::conn::{Conn, Payload};
use crate::devices::NetDevice;
use crate::ep::TcpEp;
use crate::link::{AmBatch, Link};
use crate::wire::Header;

pub(crate) const MAX_SHORT: usize = 8 * 1024;
pub(crate) const MAX_BCOPY: usize = 64 * 1024;
pub(crate) const MAX_ZCOPY: usize = 16 << 20;
pub(crate) const MAX_AM_ZCOPY: usize = 64 * 1024;
pub(crate) const MAX_IOV: usize = 16;
pub(crate) const MAX_AM_HEADER: usize = 256;
/// Largest data a peer may put in one frame.
pub(crate) const MAX_FRAME_DATA: usize = MAX_ZCOPY;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The links of an iface, shared with its endpoints (which find or add a
/// link when they connect).
pub(crate) type Links = Arc<Mutex<Vec<Arc<Mutex<Link>>>>>;

/// What an endpoint needs to connect, now or later.
pub(crate) struct Connector {
    links: Links,
    timeout: Duration,
    /// This iface's own address, announced on new connections.
    hello: Header,
    /// The address of the iface the endpoint belongs to; peers reach it
    /// there, so it is the endpoint's address too.
    pub(crate) iface_addr: Vec<u8>,
}

impl Connector {
    /// The link to the peer iface at these addresses: the one already open
    /// to it (either side may have opened it), or a new connection.
    pub(crate) fn connect(
        &self,
        device_addr: &[u8],
        iface_addr: &[u8],
    ) -> Result<Arc<Mutex<Link>>> {
        let addr = parse_addr(device_addr, iface_addr).ok_or_else(|| {
            UctError::InvalidParam(format!(
                "not a tcp address (expected 16 + 2 bytes, got {} + {})",
                device_addr.len(),
                iface_addr.len()
            ))
        })?;
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        for link in links.iter() {
            let state = link.lock().unwrap_or_else(|p| p.into_inner());
            if state.remote_iface == Some(addr) && state.failed.is_none() {
                return Ok(link.clone());
            }
        }
        let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
            .map_err(|e| UctError::Unreachable(format!("tcp connect to {addr}: {e}")))?;
        let mut conn = Conn::new(stream, MAX_FRAME_DATA, self.timeout)?;
        conn.send(&self.hello, Payload::None, None)?;
        let link = Arc::new(Mutex::new(Link::new(conn, Some(addr), self.timeout)));
        links.push(link.clone());
        Ok(link)
    }
}

fn tcp_attrs() -> IfaceAttrs {
    let limits = |max_zcopy| SizeLimits {
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
            | Caps::ATOMIC_SWAP
            | Caps::FLUSH
            | Caps::FENCE
            | Caps::CONNECT_TO_IFACE
            | Caps::CONNECT_TO_EP
            | Caps::ERRHANDLE_PEER_FAILURE,
        put: limits(MAX_ZCOPY),
        get: limits(MAX_ZCOPY),
        am: limits(MAX_AM_ZCOPY),
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
    handlers: AmHandlers,
    links: Links,
    peer_timeout: Duration,
    /// Reused by progress: the poll set (the listener first, then one entry
    /// per link), the links polled, whether each is reading a large put,
    /// and the active messages received.
    pfds: Vec<libc::pollfd>,
    polled: Vec<Arc<Mutex<Link>>>,
    reading: Vec<bool>,
    ams: AmBatch,
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
            handlers: AmHandlers::new("tcp"),
            links: Links::default(),
            peer_timeout,
            pfds: Vec::new(),
            polled: Vec::new(),
            reading: Vec::new(),
            ams: AmBatch::default(),
        })
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    fn connector(&self) -> Connector {
        Connector {
            links: self.links.clone(),
            timeout: self.peer_timeout,
            hello: Header::Hello {
                addr: ip_bytes(self.dev.addr),
                port: self.port(),
            },
            iface_addr: self.iface_address(),
        }
    }

    fn accept_new(&mut self) -> usize {
        let mut accepted = 0;
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => match Conn::new(stream, MAX_FRAME_DATA, self.peer_timeout) {
                    Ok(conn) => {
                        log::debug!("tcp {}: accepted {peer}", self.dev.name);
                        let link = Arc::new(Mutex::new(Link::new(conn, None, self.peer_timeout)));
                        self.links
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(link);
                        accepted += 1;
                    }
                    Err(e) => log::warn!("tcp {}: dropping {peer}: {e}", self.dev.name),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => return accepted,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("tcp {}: accept failed: {e}", self.dev.name);
                    return accepted;
                }
            }
        }
    }
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
        self.port().to_le_bytes().to_vec()
    }

    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        match parse_addr(device_addr, iface_addr) {
            // Loopback reaches only loopback; other addresses are assumed
            // routable (the connect will tell).
            Some(peer) => {
                peer.ip().is_loopback() == self.dev.addr.is_loopback() || !peer.ip().is_loopback()
            }
            None => false,
        }
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        // Take in connections (first pass) and their hellos (second) first:
        // a peer that already connected to this iface is reached back over
        // its link.
        self.progress();
        self.progress();
        let connector = self.connector();
        match params {
            EpParams::ToIface {
                device_addr,
                iface_addr,
            } => {
                let link = connector.connect(&device_addr, &iface_addr)?;
                Ok(Box::new(TcpEp::new(link)))
            }
            EpParams::Unconnected => Ok(Box::new(TcpEp::unconnected(connector))),
        }
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        self.handlers.set(id, handler)
    }

    fn progress(&mut self) -> usize {
        // One poll() over the listener and every link; only ready sockets
        // (and links reading a large put) are touched.
        let mut links = std::mem::take(&mut self.polled);
        links.clear();
        {
            let mut all = self.links.lock().unwrap_or_else(|p| p.into_inner());
            // A failed link is dropped here; endpoints holding it keep
            // reporting its error.
            all.retain(|link| {
                link.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .failed
                    .is_none()
            });
            links.extend(all.iter().cloned());
        }
        let pfds = &mut self.pfds;
        pfds.clear();
        pfds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let reading = &mut self.reading;
        reading.clear();
        for link in &links {
            let state = link.lock().unwrap_or_else(|p| p.into_inner());
            pfds.push(state.poll_fd().unwrap_or(libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }));
            reading.push(state.reading_direct());
        }
        // SAFETY: `pfds` is a Vec of pfds.len() initialised pollfd entries,
        // exclusively borrowed for the call; poll writes only their revents
        // fields. Entries with fd -1 are ignored by poll.
        let ready = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 0) };
        let mut events = 0;
        for (i, link) in links.iter().enumerate() {
            let mut state = link.lock().unwrap_or_else(|p| p.into_inner());
            if (ready > 0 && self.pfds[1 + i].revents != 0) || self.reading[i] {
                events += state.progress(&self.table, &mut self.ams);
            } else {
                state.idle();
            }
            drop(state);
            // Outside the link's lock: a handler may send on the same link.
            self.ams.deliver(&mut self.handlers);
        }
        if ready > 0 && self.pfds[0].revents != 0 {
            events += self.accept_new();
        }
        links.clear();
        self.polled = links;
        events
    }
}
