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
//!
//! A put with immediate data is executed, and its immediate delivered, only
//! from a peer this iface has connected to itself, as on rc, whose
//! immediates come only over a connection both sides made: the peer's
//! Hello claims an iface (address and cookie), and this iface must have
//! dialled that very iface, whose cookie it has from the address the
//! application gave it. A process that knows only our address (an
//! application's URL without the peer's) does not know the cookie of the
//! peer it would claim to be, so its immediates never reach the handler,
//! even with a key to our memory. Until this iface connects to the peer
//! (it may write before we connect back), the link stops at that frame:
//! nothing from it or after it is executed or answered, and its socket is
//! not read, so the writer's completion says the immediate was delivered,
//! and what waits costs the receive buffer of a link. A link that waits so
//! for the longer of the bootstrap and peer timeouts is closed (the
//! writer's request times out after its peer timeout); at the cap on
//! accepted links it is idle. A put the checks refuse (a forged or stale key) is
//! answered with its refusal at once: it delivers nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uct_core::region_table::RegionTable;
use uct_core::UctError;

use crate::address::PeerAddr;
use crate::arrivals::Arrivals;
use crate::conn::{Conn, Payload};
use crate::direct::{accepts, put_target, Direct, DIRECT_MIN};
use crate::execute::{execute, put_outcome};
use crate::hello::{check_hello, frame_name, Role};
use crate::iface::{MAX_AM_ZCOPY, MAX_BCOPY, MAX_SHORT};
use crate::pending::{PendingOp, Requests};
use crate::wire::{Header, Parsed};

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

impl Timeouts {
    /// How long a peer's put with immediate data waits for this iface to
    /// connect back before its link is closed: the application may take
    /// its bootstrap to connect, and the writer's own request fails after
    /// its peer timeout first (naming the cause) where both use the same.
    pub(crate) fn waiting_back(&self) -> Duration {
        self.hello.max(self.peer)
    }
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
    /// Since when the peer's next request, a put with immediate data,
    /// waits for this iface to connect to the peer (module documentation).
    waiting_back: Option<Instant>,
    /// Unique in the process (never 0).
    pub(crate) id: u64,
}

/// Ids of links, never reused in a process (the idle fast path tells a
/// new link from an old one whose socket number it got).
static NEXT_LINK_ID: AtomicU64 = AtomicU64::new(1);

impl Link {
    pub(crate) fn new(conn: Conn, role: Role, cookie: u64, timeouts: Timeouts) -> Link {
        let now = Instant::now();
        Link {
            id: NEXT_LINK_ID.fetch_add(1, Ordering::Relaxed),
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
            waiting_back: None,
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

    /// Since when the link waits for this iface to connect to its peer
    /// before it executes the peer's put with immediate data.
    pub(crate) fn waiting_back_since(&self) -> Option<Instant> {
        self.waiting_back
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
    /// an accepted link has not said Hello within the bootstrap timeout, or
    /// its peer's put with immediate data has waited for this iface to
    /// connect back for the longer of the two. Looked at a few times a
    /// second, not on every call.
    fn check_timeout(&mut self) -> Result<()> {
        let awaiting = self.awaiting_hello_since();
        let quiet = self.requests.is_empty()
            && awaiting.is_none()
            && self.waiting_back.is_none()
            && !self.conn.wants_write();
        if quiet || self.last_check.elapsed() < CHECK_EVERY {
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
        if let Some(since) = self.waiting_back {
            let limit = self.timeouts.waiting_back();
            if since.elapsed() > limit {
                return Err(UctError::Timeout(format!(
                    "tcp: {} sent a put with immediate data, and this iface has not connected back to it within {limit:?} (the longer of UCT_BOOTSTRAP_TIMEOUT and UCT_TCP_PEER_TIMEOUT): the receiver has not connected back to this writer, and takes immediates only from ifaces it connected to; closed",
                    self.peer()
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
        if let Some((oldest, put_imm)) = self.requests.oldest() {
            if oldest.elapsed() > self.timeouts.peer {
                let why = if put_imm {
                    "a put with immediate data: the receiver has not connected back to this writer (it executes immediates only from ifaces it connected to), or it is dead or stuck"
                } else {
                    "it is dead or stuck"
                };
                return Err(UctError::EndpointFailed(format!(
                    "tcp peer {} left a request unanswered for {:?} (UCT_TCP_PEER_TIMEOUT); {why}",
                    self.peer(),
                    self.timeouts.peer
                )));
            }
        }
        Ok(())
    }

    /// Fails every operation on the link with `err` and resets the
    /// connection: the peer sees it end now, and nothing queued before
    /// reaches it any more (`Conn::abort`).
    pub(crate) fn fail(&mut self, err: UctError) {
        if self.failed.is_some() {
            return;
        }
        log::debug!("tcp link to {}: {err}", self.peer());
        self.requests.fail_all(&err);
        self.conn.fail_queued(&err);
        self.conn.abort();
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
        // Paused, the link reads nothing more until its replies are out, or
        // until this iface connects to its peer (hang-ups and errors are
        // reported whatever the events).
        let inp = if self.paused || self.waiting_back.is_some() {
            0
        } else {
            libc::POLLIN
        };
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

    /// Whether the link waited for this iface to connect to its peer and
    /// now may go on, this iface having connected to it (one of
    /// `connected`, the ifaces it dialled): progress it now.
    pub(crate) fn connected_back(&mut self, connected: &[PeerAddr]) -> bool {
        if self.waiting_back.is_none() || !self.may_deliver_imm(connected) {
            return false;
        }
        self.waiting_back = None;
        self.backlog = true;
        true
    }

    /// Whether this iface has connected to the link's peer (one of
    /// `connected`): only then are its immediates executed.
    fn may_deliver_imm(&self, connected: &[PeerAddr]) -> bool {
        self.role.peer().is_some_and(|p| connected.contains(&p))
    }

    /// Writes, reads, executes requests and matches replies, within the
    /// budget of one call; active messages and immediates go to
    /// `arrivals`. A put with immediate data from a peer not among the
    /// ifaces this one connected to (`connected`) waits (module
    /// documentation). A link that fails is marked failed and closed; a
    /// peer that sends nonsense is cut off.
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
                let step = match self.direct.as_mut() {
                    Some(put) => put.step(&mut self.conn, table, &mut bytes)?,
                    None => Some(None),
                };
                match step {
                    None => break,
                    Some(refused) => {
                        frames += 1;
                        if let Some(put) = self.direct.take() {
                            let done = refused.map_or(Ok(()), Err);
                            if let Some(reply) =
                                put_outcome(arrivals, put.req, put.imm, put.len, done)
                            {
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
                if !is_reply(header) && self.replies_wait() {
                    // The peer has not taken its answers yet: its requests
                    // wait (and, once the receive buffer is full, its
                    // socket).
                    self.paused = true;
                    break 'turn;
                }
                if let Header::PutImm { key, addr, .. } = *header {
                    if !self.may_deliver_imm(connected) && accepts(table, key, addr, data_len) {
                        // Not connected back yet: it waits, unread, and so
                        // does all after it (module documentation).
                        if self.waiting_back.is_none() {
                            log::debug!(
                                "tcp: a put with immediate data from {} waits until this iface connects to it: immediates are delivered only from ifaces it connected to",
                                self.peer()
                            );
                            self.waiting_back = Some(Instant::now());
                        }
                        break 'turn;
                    }
                    // It goes now (connected back, or refused: its key
                    // went stale while it waited).
                    self.waiting_back = None;
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
                            let reply = execute(table, arrivals, header, data)?;
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
                            self.direct = Some(put.start(&mut self.conn, table, data_at, have));
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
