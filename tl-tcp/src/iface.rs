//! The tcp iface: listens on one interface; its endpoints send on links
//! (TCP connections) it dialled, one per peer iface address, and peers send
//! their requests on links they dialled to it, which it accepts. Its
//! `progress` polls them all at once, executes the requests that arrive and
//! completes its endpoints' operations. Accepted connections are capped
//! (UCT_TCP_MAX_ACCEPTED) and taken a few per progress call; at the cap, a
//! link without a Hello, then one that never sent a request and has been
//! idle for the peer timeout, gives way (a link that carried a request
//! never does: newcomers are refused); a
//! failed link leaves the list at the next call, so that junk connections
//! cost the other peers little.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uct_core::region_table::RegionTable;
use uct_core::{
    AmHandler, AmHandlers, Caps, Endpoint, EpParams, Iface, IfaceAttrs, ImmHandler, ImmHandlerSlot,
    MemoryDomain, MemoryType, Result, SizeLimits, UctError,
};

use crate::address::{iface_addr, ip_bytes, new_cookie, parse_addr, PeerAddr, IFACE_ADDR_LEN};
use crate::arrivals::Arrivals;
use crate::component::Settings;
use crate::conn::{Conn, Payload};
use crate::devices::NetDevice;
use crate::dial::dial;
use crate::ep::TcpEp;
use crate::hello::Role;
use crate::link::{Link, Timeouts};
use crate::quiet::Quiet;
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
/// Connections accepted by one progress call.
const ACCEPT_BUDGET: usize = 64;

/// The links of an iface, shared with its endpoints (which find or add a
/// link when they connect).
pub(crate) type Links = Arc<Mutex<Vec<Arc<Mutex<Link>>>>>;

/// What an endpoint needs to connect, now or later.
pub(crate) struct Connector {
    links: Links,
    /// The iface's activity counter (`quiet.rs`), for new connections.
    activity: Arc<AtomicU64>,
    timeouts: Timeouts,
    /// This iface: where it listens, and its cookie, announced in the
    /// Hello of new connections.
    ip: IpAddr,
    port: u16,
    cookie: u64,
    /// The address of the iface the endpoint belongs to; peers reach it
    /// there, so it is the endpoint's address too.
    pub(crate) iface_addr: Vec<u8>,
}

impl Connector {
    /// The link to the peer iface at these addresses: one we dialled to
    /// them already, or a new connection. Never a link the peer opened: its
    /// Hello names the iface it claims to be, with that iface's cookie,
    /// which is public in its address, so it proves nothing.
    pub(crate) fn connect(
        &self,
        device_addr: &[u8],
        iface_addr: &[u8],
    ) -> Result<Arc<Mutex<Link>>> {
        let to = parse_addr(device_addr, iface_addr)?;
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        for link in links.iter() {
            let state = link.lock().unwrap_or_else(|p| p.into_inner());
            if state.failed.is_none() && state.role.reaches(&to) {
                return Ok(link.clone());
            }
        }
        let stream = dial(self.ip, to.sock, CONNECT_TIMEOUT)?;
        let mut conn = Conn::new(stream, MAX_FRAME_DATA, self.timeouts.peer)?;
        conn.report_activity_to(self.activity.clone());
        let hello = Header::Hello {
            addr: ip_bytes(self.ip),
            port: self.port,
            cookie: self.cookie,
            echo: to.cookie,
        };
        conn.send(&hello, Payload::None, None)?;
        let link = Link::new(conn, Role::Dialled(to), self.cookie, self.timeouts);
        let link = Arc::new(Mutex::new(link));
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
            | Caps::ERRHANDLE_PEER_FAILURE
            | Caps::PUT_IMM,
        put: limits(MAX_ZCOPY),
        get: limits(MAX_ZCOPY),
        am: limits(MAX_AM_ZCOPY),
        max_am_header: MAX_AM_HEADER,
        mem_types: vec![MemoryType::Host],
        latency_ns: 10_000.0,
        bandwidth_bps: 2.0e9,
        overhead_ns: 200.0,
        iface_addr_len: IFACE_ADDR_LEN,
        device_addr_len: 16,
        ep_addr_len: IFACE_ADDR_LEN,
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
    imm: ImmHandlerSlot,
    links: Links,
    settings: Settings,
    /// Drawn at open; peers learn it from our address and echo it.
    cookie: u64,
    /// Connections refused at the cap, for rate-limited warnings.
    refused: u64,
    /// Reused by progress: the poll set (the listener first, then one entry
    /// per link), the links polled, whether each is reading a large put,
    /// the ifaces this one dialled (whose immediates it delivers), and the
    /// active messages and immediates received.
    pfds: Vec<libc::pollfd>,
    polled: Vec<Arc<Mutex<Link>>>,
    reading: Vec<bool>,
    connected: Vec<PeerAddr>,
    arrivals: Arrivals,
    /// The links' writes counted at the last progress call: when they
    /// changed, this side wrote something since, and idle links send the
    /// ACKs they held back.
    writes: u64,
    /// Whether a progress call may skip the scan of the links.
    quiet: Quiet,
    /// Reused by progress: each link's socket and id, for `quiet`.
    socks: Vec<(RawFd, u64)>,
}

impl TcpIface {
    pub(crate) fn open(
        dev: NetDevice,
        md: Arc<dyn MemoryDomain>,
        table: Arc<RegionTable>,
        settings: Settings,
    ) -> Result<TcpIface> {
        let listener = TcpListener::bind(SocketAddr::new(dev.addr, 0))
            .map_err(|e| UctError::io(format!("tcp: listen on {} ({})", dev.name, dev.addr), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| UctError::io("tcp: set non-blocking", e))?;
        let quiet = Quiet::new(listener.as_raw_fd());
        Ok(TcpIface {
            dev,
            listener,
            md,
            table,
            attrs: tcp_attrs(),
            handlers: AmHandlers::new("tcp"),
            imm: ImmHandlerSlot::new("tcp"),
            links: Links::default(),
            settings,
            cookie: new_cookie()?,
            refused: 0,
            pfds: Vec::new(),
            polled: Vec::new(),
            reading: Vec::new(),
            connected: Vec::new(),
            arrivals: Arrivals::default(),
            writes: 0,
            quiet,
            socks: Vec::new(),
        })
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    fn connector(&self) -> Connector {
        Connector {
            links: self.links.clone(),
            activity: self.quiet.activity(),
            timeouts: self.settings.timeouts,
            ip: self.dev.addr,
            port: self.port(),
            cookie: self.cookie,
            iface_addr: self.iface_address(),
        }
    }

    /// Takes in up to ACCEPT_BUDGET new connections, each as a link that
    /// must say Hello first, within the cap on accepted links.
    fn accept_new(&mut self) -> usize {
        let mut accepted = 0;
        for _ in 0..ACCEPT_BUDGET {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if !self.make_room() {
                        self.refused += 1;
                        if self.refused % 1000 == 1 {
                            log::warn!(
                                "tcp {}: refusing {peer}: {} connections accepted, each said Hello and sent a request or was active within UCT_TCP_PEER_TIMEOUT (raise UCT_TCP_MAX_ACCEPTED for more peers); {} refused so far",
                                self.dev.name,
                                self.settings.max_accepted,
                                self.refused
                            );
                        }
                        continue;
                    }
                    match Conn::new(stream, MAX_FRAME_DATA, self.settings.timeouts.peer) {
                        Ok(mut conn) => {
                            conn.report_activity_to(self.quiet.activity());
                            log::debug!("tcp {}: accepted {peer}", self.dev.name);
                            let role = Role::AwaitingHello(Instant::now());
                            let link = Link::new(conn, role, self.cookie, self.settings.timeouts);
                            self.links
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(Arc::new(Mutex::new(link)));
                            accepted += 1;
                        }
                        Err(e) => log::warn!("tcp {}: dropping {peer}: {e}", self.dev.name),
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("tcp {}: accept failed: {e}", self.dev.name);
                    break;
                }
            }
        }
        accepted
    }

    /// Whether another accepted link fits under UCT_TCP_MAX_ACCEPTED: there
    /// is room, or a link was closed to make room: the oldest that has not
    /// said Hello, else, of the links that said Hello and never sent a
    /// request or wait for this iface to connect back, the one idle longest
    /// if it has been idle (taken in no frame) for the peer timeout. A link that carried a request is never
    /// pushed out by a new one, however long it has been idle: anyone with
    /// our address (the cookie is in it) can open links and say Hello, so
    /// a fresh link proves less than an old one a peer used; at the cap
    /// newcomers are refused instead.
    fn make_room(&self) -> bool {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = 0;
        let mut unhello: Option<(Instant, &Arc<Mutex<Link>>)> = None;
        let mut idle: Option<(Instant, &Arc<Mutex<Link>>)> = None;
        for link in links.iter() {
            let state = link.lock().unwrap_or_else(|p| p.into_inner());
            if state.failed.is_some() || !state.role.peer_opened() {
                continue;
            }
            count += 1;
            // A link whose put with immediate data waits for this iface
            // to connect back does nothing meanwhile: idle since then.
            let (since, oldest) = match (state.awaiting_hello_since(), state.waiting_back_since()) {
                (Some(since), _) => (since, &mut unhello),
                (None, Some(since)) => (since, &mut idle),
                (None, None) if state.carried_request() => continue,
                (None, None) => (state.idle_since(), &mut idle),
            };
            if oldest.is_none_or(|(t, _)| since < t) {
                *oldest = Some((since, link));
            }
        }
        if count < self.settings.max_accepted {
            return true;
        }
        let max = self.settings.max_accepted;
        let peer_timeout = self.settings.timeouts.peer;
        let (link, why) = match (unhello, idle) {
            (Some((_, link)), _) => (
                link,
                format!("closed without a Hello to make room for a new connection (UCT_TCP_MAX_ACCEPTED={max})"),
            ),
            (None, Some((since, link))) if since.elapsed() >= peer_timeout => (
                link,
                format!(
                    "closed after {:?} idle without a request, or waiting for this iface to connect back, to make room for a new connection (UCT_TCP_MAX_ACCEPTED={max}, idle for UCT_TCP_PEER_TIMEOUT={peer_timeout:?})",
                    since.elapsed()
                ),
            ),
            _ => return false,
        };
        link.lock()
            .unwrap_or_else(|p| p.into_inner())
            .fail(UctError::Protocol(why));
        true
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
        iface_addr(self.port(), self.cookie)
    }

    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        match parse_addr(device_addr, iface_addr) {
            // Loopback reaches only loopback; other addresses are assumed
            // routable (the connect will tell).
            Ok(peer) => {
                let ip = peer.sock.ip();
                ip.is_loopback() == self.dev.addr.is_loopback() || !ip.is_loopback()
            }
            Err(_) => false,
        }
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
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

    fn set_imm_handler(&mut self, handler: ImmHandler) -> Result<()> {
        self.imm.set(handler);
        Ok(())
    }

    fn progress(&mut self) -> usize {
        self.arrivals.tidy();
        if self.quiet.idle() {
            return 0;
        }
        self.quiet.scan_begins();
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
        let connected = &mut self.connected;
        connected.clear();
        let mut writes = 0u64;
        let socks = &mut self.socks;
        socks.clear();
        let mut hot = false;
        for link in &links {
            let state = link.lock().unwrap_or_else(|p| p.into_inner());
            if let Role::Dialled(peer) = state.role {
                connected.push(peer);
            }
            let pfd = state.poll_fd().unwrap_or(libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            });
            // Frames waiting for room, a large put being read, a budget
            // spent, a link waiting for us to connect back: the next call
            // must look again.
            hot |= pfd.events & libc::POLLOUT != 0
                || state.wants_progress()
                || state.waiting_back_since().is_some();
            socks.push((pfd.fd, state.id));
            pfds.push(pfd);
            reading.push(state.wants_progress());
            writes = writes.wrapping_add(state.conn.writes());
        }
        // Only a change counts (links come and go).
        let wrote = writes != self.writes;
        self.writes = writes;
        // SAFETY: `pfds` is a Vec of pfds.len() initialised pollfd entries,
        // exclusively borrowed for the call; poll writes only their revents
        // fields. Entries with fd -1 are ignored by poll.
        let ready = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 0) };
        let mut events = 0;
        for (i, link) in links.iter().enumerate() {
            let mut state = link.lock().unwrap_or_else(|p| p.into_inner());
            let connected_back = state.connected_back(&self.connected);
            if (ready > 0 && self.pfds[1 + i].revents != 0) || self.reading[i] || connected_back {
                events += state.progress(&self.table, &mut self.arrivals, &self.connected);
            } else {
                state.idle(wrote);
            }
            hot |= state.wants_progress() || state.conn.wants_write();
            drop(state);
            // Outside the link's lock: a handler may send on the same link.
            self.arrivals.deliver(&mut self.handlers, &mut self.imm);
        }
        if ready > 0 && self.pfds[0].revents != 0 {
            events += self.accept_new();
        }
        // A call that did something, or left a link with work, is followed
        // by a full scan.
        self.quiet.scan_ends(&self.socks, hot || events > 0);
        links.clear();
        self.polled = links;
        events
    }
}
