//! A link: one TCP connection between two tcp ifaces, used one way. The
//! side that dialled it sends its requests on it (active messages, puts,
//! gets, atomics, flushes) and gets their replies on it; the side that
//! accepted it executes those requests, checked against its region table,
//! and answers. A request on a link we dialled, or a reply on one we
//! accepted, is a protocol error that closes the link: our own traffic for
//! a peer never rides on a connection that peer opened, whose Hello proves
//! nothing (`hello.rs`).
//!
//! What a peer can make a link cost is bounded: an accepted link must say
//! Hello first within the bootstrap timeout; one progress call handles at
//! most [`FRAME_BUDGET`] frames and [`BYTE_BUDGET`] bytes of a link; a get's
//! reply is read from its region a chunk at a time as the peer takes it
//! (`outgoing.rs`), and the link stops executing the peer's requests (and
//! reading its socket) while a reply is still being read from its region or
//! more than [`REPLY_HELD`] bytes or [`MAX_REPLY_FRAMES`] frames of replies
//! wait, so that a peer that does not read costs a chunk and a few replies
//! per link, whatever it asks for (TCP's flow control then holds it back);
//! a link whose peer takes nothing for the peer timeout is closed; a frame
//! announcing more data than its kind may carry closes the link from its
//! header on, so the receive buffer holds a chunk or one checked frame
//! (`conn.rs`); the requests of this side are capped and a Nack is taken
//! only for one of them, by the endpoint that sent it (`pending.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uct_core::region_table::RegionTable;
use uct_core::{Access, UctError};

use crate::address::PeerAddr;
use crate::arrivals::{Arrivals, Hold};
use crate::conn::{Conn, Payload};
use crate::execute::{execute, put_outcome, table_key};
use crate::hello::{check_hello, frame_name, Role};
use crate::iface::{MAX_AM_ZCOPY, MAX_BCOPY, MAX_SHORT};
use crate::pending::{PendingOp, Requests};
use crate::wire::{Header, Parsed, WireKey};

type Result<T, E = UctError> = std::result::Result<T, E>;

/// Frames of one link handled by one progress call.
pub(crate) const FRAME_BUDGET: usize = 1024;
/// Bytes of one link consumed by one progress call (a frame in progress is
/// finished first).
pub(crate) const BYTE_BUDGET: usize = 32 << 20;
/// Bytes of replies waiting to be written above which the peer's requests
/// wait. Pausing never stops a well-behaved peer for good: its replies come
/// on the links it dialled, which it always reads, and this side's replies
/// go on links this side accepted, which carry nothing else it waits for.
pub(crate) const REPLY_HELD: usize = 64 * 1024;
/// Reply frames waiting to be written above which the peer's requests wait
/// (small replies cost more memory than their bytes).
pub(crate) const MAX_REPLY_FRAMES: usize = 256;
/// Connections of this process closed before their Hello, for the log.
static UNAUTHENTICATED_CLOSED: AtomicU64 = AtomicU64::new(0);
/// Most data an active message carries (am_short, am_bcopy, am_zcopy).
const MAX_AM_DATA: usize = max(MAX_SHORT, max(MAX_BCOPY, MAX_AM_ZCOPY));

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// How often the timeouts of a link are looked at.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How often `check` probes the socket.
const PROBE_EVERY: Duration = Duration::from_millis(5);

/// How long a link may wait for its peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// A request unanswered for this long fails the link
    /// (UCT_TCP_PEER_TIMEOUT).
    pub(crate) peer: Duration,
    /// An accepted link that has not said Hello by then is closed
    /// (UCT_BOOTSTRAP_TIMEOUT).
    pub(crate) hello: Duration,
}

/// Puts of at least this much data are read straight into their target.
const DIRECT_MIN: usize = 16 * 1024;

/// The rest of a large put, read from the socket into the target region.
struct Direct {
    req: u64,
    key: WireKey,
    addr: u64,
    /// The immediate of a PutImm, delivered once all of the data is in.
    imm: Option<u32>,
    /// The put's whole length, for its immediate.
    len: usize,
    remaining: usize,
    /// Set when the access was refused: the data is read and dropped, and
    /// the refusal is reported when it ends.
    error: Option<UctError>,
}

/// One connection, both roles.
pub(crate) struct Link {
    pub(crate) conn: Conn,
    /// Who is on the other end.
    pub(crate) role: Role,
    /// The cookie of our iface, which an accepted link's Hello must echo.
    cookie: u64,
    requests: Requests,
    /// The connection failed: every operation on it fails with this.
    pub(crate) failed: Option<UctError>,
    timeouts: Timeouts,
    last_check: Instant,
    last_probe: Instant,
    direct: Option<Direct>,
    /// Frames wait in the receive buffer (budget spent, or the peer's
    /// requests paused with nothing left to write): progress the link even
    /// if its socket is quiet.
    backlog: bool,
    /// The peer's requests wait for its replies to be written: the socket
    /// is polled for room to write, not for more requests.
    paused: bool,
    /// When the link last took in a frame.
    last_frame: Instant,
    /// The peer has sent a request on this link: it is in use, and never
    /// closed to make room for a new connection.
    carried_request: bool,
    /// Arrivals held until this iface connects to the peer (`arrivals.rs`).
    hold: Hold,
}

impl Link {
    pub(crate) fn new(conn: Conn, role: Role, cookie: u64, timeouts: Timeouts) -> Link {
        let now = Instant::now();
        Link {
            conn,
            role,
            cookie,
            requests: Requests::default(),
            failed: None,
            timeouts,
            last_check: now,
            last_probe: now,
            direct: None,
            backlog: false,
            paused: false,
            last_frame: now,
            carried_request: false,
            hold: Hold::default(),
        }
    }

    /// The peer, for messages: its iface once known, else the socket's.
    fn peer(&self) -> String {
        match self.role.peer() {
            Some(p) => p.to_string(),
            None => self.conn.peer(),
        }
    }

    /// A new endpoint id on this link.
    pub(crate) fn new_ep_id(&mut self) -> u32 {
        self.requests.new_ep_id()
    }

    /// Endpoint `ep` is gone.
    pub(crate) fn forget_ep(&mut self, ep: u32) {
        self.requests.forget_ep(ep);
    }

    /// The next request id of endpoint `ep`; the caller sends that request
    /// before the link numbers another. When endpoints taking turns have
    /// left a long record of who sent what, a flush of the link's own goes
    /// first, whose answer lets it forget the older part.
    pub(crate) fn next_req(&mut self, ep: u32) -> Result<u64> {
        if self.requests.needs_sync() {
            let req = self.requests.add_sync();
            self.conn
                .send(&Header::Flush { req }, Payload::None, None)?;
        }
        Ok(self.requests.next_req(ep))
    }

    /// Whether a request (a get of `get_bytes`, or 0) may be sent now.
    pub(crate) fn has_room_for_request(&self, get_bytes: usize) -> bool {
        self.requests.has_room(get_bytes)
    }

    /// Records a request that waits for its reply.
    pub(crate) fn add_pending(&mut self, req: u64, op: PendingOp, get_bytes: usize) {
        self.requests.add(req, op, get_bytes);
    }

    /// Whether progress must visit the link even if its socket is quiet.
    pub(crate) fn wants_progress(&self) -> bool {
        self.direct.is_some() || self.backlog
    }

    /// Since when the link has done nothing: taken in no frame, and the
    /// peer taken nothing of what it queued.
    pub(crate) fn idle_since(&self) -> Instant {
        self.last_frame.max(self.conn.last_sent())
    }

    /// Whether the peer has sent a request on this link.
    pub(crate) fn carried_request(&self) -> bool {
        self.carried_request
    }

    /// When the link was accepted, while it has not said Hello.
    pub(crate) fn awaiting_hello_since(&self) -> Option<Instant> {
        match self.role {
            Role::AwaitingHello(since) => Some(since),
            _ => None,
        }
    }

    /// Fails the link when a request has waited longer than the peer
    /// timeout, the peer has taken nothing of what we queued for as long,
    /// or an accepted link has not said Hello within the bootstrap timeout.
    /// Looked at a few times a second, not on every call.
    fn check_timeout(&mut self) -> Result<()> {
        let awaiting = self.awaiting_hello_since();
        if (self.requests.is_empty() && awaiting.is_none() && !self.conn.wants_write())
            || self.last_check.elapsed() < CHECK_EVERY
        {
            return Ok(());
        }
        self.last_check = Instant::now();
        if let Some(since) = awaiting {
            if since.elapsed() > self.timeouts.hello {
                return Err(UctError::Timeout(format!(
                    "tcp: {} connected and said no Hello within {:?} (UCT_BOOTSTRAP_TIMEOUT); closed",
                    self.conn.peer(),
                    self.timeouts.hello
                )));
            }
        }
        if let Some(stalled) = self.conn.stalled_for() {
            if stalled > self.timeouts.peer {
                return Err(UctError::EndpointFailed(format!(
                    "tcp peer {} took none of the {} bytes queued for it for {:?} (UCT_TCP_PEER_TIMEOUT); it is stuck, or does not read; closed",
                    self.peer(),
                    self.conn.queued(),
                    self.timeouts.peer
                )));
            }
        }
        if let Some(oldest) = self.requests.oldest() {
            if oldest.elapsed() > self.timeouts.peer {
                return Err(UctError::EndpointFailed(format!(
                    "tcp peer {} left a request unanswered for {:?} (UCT_TCP_PEER_TIMEOUT); it is dead or stuck",
                    self.peer(),
                    self.timeouts.peer
                )));
            }
        }
        Ok(())
    }

    /// Fails every operation on the link with `err` and closes the
    /// connection (the peer sees it closed now).
    pub(crate) fn fail(&mut self, err: UctError) {
        if self.failed.is_some() {
            return;
        }
        log::debug!("tcp link to {}: {err}", self.peer());
        self.requests.fail_all(&err);
        self.conn.fail_queued(&err);
        self.conn.close();
        self.failed = Some(err);
    }

    /// The liveness check of the endpoints on this link: the error that
    /// failed it, or a probe of the socket (rate-limited) that finds a peer
    /// that closed the connection or died, even with nothing outstanding,
    /// and the peer timeout.
    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.last_probe.elapsed() < PROBE_EVERY {
            return Ok(());
        }
        self.last_probe = Instant::now();
        let found = match self.conn.peer_gone() {
            Some(e) => Err(e),
            None => self.check_timeout(),
        };
        if let Err(e) = found {
            self.fail(e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// The socket and the readiness to wait for, while the link works.
    pub(crate) fn poll_fd(&self) -> Option<libc::pollfd> {
        if self.failed.is_some() {
            return None;
        }
        let out = if self.conn.wants_write() {
            libc::POLLOUT
        } else {
            0
        };
        // Paused, the link reads nothing more until its replies are out
        // (hang-ups and errors are reported whatever the events).
        let inp = if self.paused { 0 } else { libc::POLLIN };
        Some(libc::pollfd {
            fd: self.conn.fd(),
            events: inp | out,
            revents: 0,
        })
    }

    /// With nothing to read or write: the ACK held back for what was read
    /// when this side `wrote` anything since the last progress call (an
    /// answer, whose path the ACK stayed off), and the timeouts.
    pub(crate) fn idle(&mut self, wrote: bool) {
        if self.failed.is_none() {
            if wrote {
                self.conn.send_owed_ack();
            }
            if let Err(e) = self.check_timeout() {
                self.fail(e);
            }
        }
    }

    /// Hands the arrivals held for the peer to `arrivals` once this iface
    /// has connected to it (`connected`: the ifaces it dialled).
    pub(crate) fn release_held(&mut self, connected: &[PeerAddr], arrivals: &mut Arrivals) {
        if self.hold.release(self.role.peer(), connected, arrivals) {
            // Requests it stopped executing while full go on.
            self.backlog = true;
        }
    }

    /// Writes, reads, executes requests and matches replies, within the
    /// budget of one call; active messages and immediates go to
    /// `arrivals`, or are held while the peer, not among the ifaces this
    /// one connected to (`connected`), may not deliver immediates. A link
    /// that fails is marked failed and closed; a peer that sends nonsense
    /// is cut off.
    pub(crate) fn progress(
        &mut self,
        table: &Arc<RegionTable>,
        arrivals: &mut Arrivals,
        connected: &[PeerAddr],
    ) -> usize {
        if self.failed.is_some() {
            return 0;
        }
        match self.progress_inner(table, arrivals, connected) {
            Ok(n) => n,
            Err(e) => {
                if matches!(e, UctError::Protocol(_)) {
                    self.log_cut_off(&e);
                }
                self.fail(e);
                1
            }
        }
    }

    /// Says why a peer is cut off: always for a peer that said Hello; for
    /// connections refused before it, the first and every 1000th (a flood
    /// of junk connections must not flood the log).
    fn log_cut_off(&self, e: &UctError) {
        if self.awaiting_hello_since().is_none() {
            log::warn!("tcp: closing the connection from {}: {e}", self.peer());
            return;
        }
        let n = UNAUTHENTICATED_CLOSED.fetch_add(1, Ordering::Relaxed) + 1;
        if n % 1000 == 1 {
            log::warn!(
                "tcp: closing the connection from {} before its Hello: {e} ({n} such so far, one in 1000 logged)",
                self.conn.peer()
            );
        }
    }

    fn progress_inner(
        &mut self,
        table: &Arc<RegionTable>,
        arrivals: &mut Arrivals,
        connected: &[PeerAddr],
    ) -> Result<usize> {
        let mut frames = 0;
        let mut bytes = 0;
        self.backlog = false;
        self.paused = false;
        'turn: loop {
            if self.direct.is_some() {
                match self.direct_step(table, &mut bytes)? {
                    None => break,
                    Some(refused) => {
                        frames += 1;
                        if let Some(put) = self.direct.take() {
                            let done = refused.map_or(Ok(()), Err);
                            if let Some(reply) = put_outcome(
                                self.hold.target(arrivals),
                                put.req,
                                put.imm,
                                put.len,
                                done,
                            ) {
                                self.conn.queue_reply(&reply, Payload::None)?;
                            }
                        }
                    }
                }
            }
            self.conn.write_out()?;
            let more = self.conn.read_in()?;
            loop {
                if frames >= FRAME_BUDGET || bytes >= BYTE_BUDGET {
                    self.backlog = true;
                    break 'turn;
                }
                let parsed = self.conn.peek().map_err(UctError::Protocol)?;
                let (header, data_len) = match &parsed {
                    Parsed::Incomplete => break,
                    Parsed::Frame {
                        header, data_len, ..
                    }
                    | Parsed::HeaderOnly {
                        header, data_len, ..
                    } => (header, *data_len),
                };
                if self.awaiting_hello_since().is_some() {
                    let peer = check_hello(header, self.cookie, self.conn.peer_ip())
                        .map_err(UctError::Protocol)?;
                    // A Hello carries no data: it is whole once parsed.
                    let Parsed::Frame { total, .. } = parsed else {
                        break;
                    };
                    log::debug!("tcp: {} said Hello as {peer}", self.conn.peer());
                    self.role = Role::Accepted(peer);
                    self.conn.consume(total);
                    frames += 1;
                    bytes += total;
                    continue;
                }
                if is_reply(header) == self.role.peer_opened() {
                    return Err(UctError::Protocol(self.wrong_way(header)));
                }
                let limit = self.data_limit(header);
                if data_len > limit {
                    return Err(UctError::Protocol(format!(
                        "{} announces {data_len} bytes of data, more than the {limit} it may carry",
                        frame_name(header)
                    )));
                }
                if !is_reply(header) {
                    self.carried_request = true;
                }
                if !is_reply(header) && (self.replies_wait() || self.hold.is_full()) {
                    // The peer has not taken its answers yet, or holds all
                    // it may: its requests wait (and, once the receive
                    // buffer is full, its socket).
                    self.paused = true;
                    break 'turn;
                }
                if matches!(header, Header::PutImm { .. })
                    && !self.role.peer().is_some_and(|p| connected.contains(&p))
                {
                    self.hold.start(&self.peer());
                }
                match parsed {
                    Parsed::Frame {
                        header,
                        data_at,
                        data_len,
                        total,
                    } => {
                        frames += 1;
                        bytes += total;
                        if is_reply(&header) {
                            let data = self.conn.data(data_at, data_len).to_vec();
                            self.conn.consume(total);
                            self.requests.on_reply(header, data)?;
                        } else {
                            let data = self.conn.data(data_at, data_len);
                            let reply = execute(table, self.hold.target(arrivals), header, data)?;
                            self.conn.consume(total);
                            if let Some((header, payload)) = reply {
                                self.conn.queue_reply(&header, payload)?;
                            }
                        }
                    }
                    Parsed::HeaderOnly {
                        header,
                        data_at,
                        data_len,
                        have,
                    } => match put_target(&header) {
                        Some((req, key, addr, imm)) if data_len >= DIRECT_MIN => {
                            let put = Direct {
                                req,
                                key,
                                addr,
                                imm,
                                len: data_len,
                                remaining: data_len,
                                error: None,
                            };
                            self.start_direct(table, put, data_at, have);
                            bytes += data_at + have;
                            break;
                        }
                        _ => {
                            // Its size was checked: it may be buffered whole.
                            self.conn.expect_frame(data_at + data_len);
                            break;
                        }
                    },
                    Parsed::Incomplete => break,
                }
            }
            if self.direct.is_none() && !more {
                break;
            }
        }
        self.conn.write_out()?;
        if self.paused && !self.conn.wants_write() {
            // Nothing left to wait for: go on at the next call.
            self.paused = false;
            self.backlog = true;
        }
        if frames > 0 {
            self.last_frame = Instant::now();
        }
        self.check_timeout()?;
        Ok(frames)
    }

    /// Whether the peer's requests wait for their replies to be written: a
    /// reply still reads its region (what follows must not change what it
    /// reads), or too many wait.
    fn replies_wait(&self) -> bool {
        self.conn.reading_replies()
            || self.conn.replies_queued() > REPLY_HELD
            || self.conn.reply_frames() > MAX_REPLY_FRAMES
    }

    /// Why a frame cannot come this way on this link.
    fn wrong_way(&self, header: &Header) -> String {
        if self.role.peer_opened() {
            format!(
                "{} on a connection the peer opened: this side sends its requests only on connections it opens, so nothing there awaits an answer",
                frame_name(header)
            )
        } else {
            format!(
                "{} on a connection this side opened: a peer sends its requests on a connection it opens",
                frame_name(header)
            )
        }
    }

    /// Most data a frame of this kind may carry on this link: an active
    /// message what this transport sends at most, a get reply what the get
    /// asked for; puts are bounded by the codec's frame limit, and the other
    /// kinds carry none (the codec refuses data on them).
    fn data_limit(&self, header: &Header) -> usize {
        match header {
            Header::Am { .. } => MAX_AM_DATA,
            Header::GetReply { req, .. } => self.requests.get_len(*req),
            _ => usize::MAX,
        }
    }

    /// Starts a large put: what is here goes in now, the rest straight from
    /// the socket. The whole range is checked first, so that a refusal
    /// names the put, not a piece of it.
    fn start_direct(&mut self, table: &Arc<RegionTable>, put: Direct, data_at: usize, have: usize) {
        let first = self.conn.data(data_at, have);
        let checked = table.access(
            &table_key(put.key),
            put.addr,
            put.len as u64,
            Access::REMOTE_WRITE,
            |dst| {
                // SAFETY: `access` checked [dst, dst + put.len) for remote
                // write and keeps it registered while this closure runs;
                // have <= put.len (parse returns HeaderOnly only for a
                // frame not yet complete); `first` is the receive buffer,
                // which no region overlaps.
                unsafe { std::ptr::copy_nonoverlapping(first.as_ptr(), dst, have) }
            },
        );
        self.conn.consume(data_at + have);
        self.direct = Some(Direct {
            // A peer-chosen address: wrap, never overflow (a range that
            // wraps was refused by `access` above).
            addr: put.addr.wrapping_add(have as u64),
            remaining: put.len - have,
            error: checked.err(),
            ..put
        });
    }

    /// Reads the rest of a large put into its target, adding the bytes
    /// read to `bytes`. None: the socket has nothing more now;
    /// Some(refusal): the put is complete.
    fn direct_step(
        &mut self,
        table: &Arc<RegionTable>,
        bytes: &mut usize,
    ) -> Result<Option<Option<UctError>>> {
        let Some(put) = self.direct.as_mut() else {
            return Ok(Some(None));
        };
        let conn = &mut self.conn;
        let mut scratch = Vec::new();
        while put.remaining > 0 {
            let received = if put.error.is_none() {
                let want = put.remaining;
                match table.access(
                    &table_key(put.key),
                    put.addr,
                    want as u64,
                    Access::REMOTE_WRITE,
                    |dst| {
                        // SAFETY: `access` checked that [dst, dst + want) lies
                        // in a registered region granting remote write, and
                        // holds the table's read lock around the receive, so
                        // the region cannot be deregistered while the bytes
                        // land.
                        unsafe { conn.recv_into(dst, want) }
                    },
                ) {
                    Ok(received) => received?,
                    Err(e) => {
                        put.error = Some(e);
                        continue;
                    }
                }
            } else {
                // Refused: read the rest and drop it.
                scratch.resize(put.remaining.min(64 * 1024), 0);
                conn.recv(&mut scratch)?
            };
            if received == 0 {
                return Ok(None);
            }
            put.addr = put.addr.wrapping_add(received as u64);
            put.remaining -= received;
            *bytes += received;
        }
        Ok(Some(put.error.take()))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let err = UctError::Canceled("the tcp connection was closed".into());
        self.requests.fail_all(&err);
        self.conn.fail_queued(&err);
    }
}

/// Whether a frame answers a request of this side (rather than asking).
fn is_reply(header: &Header) -> bool {
    matches!(
        header,
        Header::GetReply { .. }
            | Header::AtomicReply { .. }
            | Header::FlushReply { .. }
            | Header::Nack { .. }
            | Header::PutImmReply { .. }
    )
}

/// A put's request id, key, address and immediate (PutImm), for a frame
/// that writes.
fn put_target(header: &Header) -> Option<(u64, WireKey, u64, Option<u32>)> {
    match *header {
        Header::Put { req, key, addr } => Some((req, key, addr, None)),
        Header::PutImm {
            req,
            key,
            addr,
            imm,
        } => Some((req, key, addr, Some(imm))),
        _ => None,
    }
}
