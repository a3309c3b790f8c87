//! A link: one TCP connection between two tcp ifaces, used both ways.
//! Either side's endpoints send requests on it (active messages, puts,
//! gets, atomics, flushes) and get replies on it; either side executes the
//! requests that arrive, checked against its region table. Sharing one
//! connection per pair of ifaces lets replies and acknowledgements ride
//! together, as in UCX.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uct_core::region_table::RegionTable;
use uct_core::{Access, AmHandlers, Completion, CompletionData, MemHandle, UctError};

use crate::conn::{Conn, Payload};
use crate::execute::{execute, table_key};
use crate::wire::{Header, Parsed, WireError, WireKey};

type Result<T, E = UctError> = std::result::Result<T, E>;

/// A request that waits for its reply, and what the reply completes.
pub(crate) enum PendingOp {
    /// get_bcopy: the bytes go to the completion.
    GetBytes(Completion),
    /// get_zcopy: the bytes are scattered into these (memory, offset,
    /// length) pieces.
    GetIov(Vec<(MemHandle, usize, usize)>, Option<Completion>),
    /// A fetching atomic: the old value goes to the completion.
    Atomic(Completion),
    /// A flush of endpoint `ep`.
    Flush { ep: u32, comp: Option<Completion> },
}

impl PendingOp {
    /// Completes the operation with `result` (no data).
    fn finish(self, result: Result<()>) {
        match self {
            PendingOp::GetBytes(comp) | PendingOp::Atomic(comp) => comp.finish(result),
            PendingOp::GetIov(_, comp) | PendingOp::Flush { comp, .. } => {
                if let Some(comp) = comp {
                    comp.finish(result)
                }
            }
        }
    }
}

/// A request waiting for its reply, and when it was sent.
struct Pending {
    op: PendingOp,
    since: Instant,
}

/// Request ids carry the endpoint in their high bits, so that a refusal
/// (Nack) is reported to the endpoint that sent the request.
fn req_id(ep: u32, seq: u64) -> u64 {
    ((ep as u64) << 40) | (seq & ((1 << 40) - 1))
}

/// The endpoint that sent request `req`.
fn req_ep(req: u64) -> u32 {
    (req >> 40) as u32
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

/// Active messages received under the link's lock, delivered to the
/// handlers after it is released (a handler may send on the same link).
#[derive(Default)]
pub(crate) struct AmBatch {
    /// Each message's id, and where its bytes are in `bytes` (start, length).
    msgs: Vec<(u8, usize, usize)>,
    bytes: Vec<u8>,
}

impl AmBatch {
    /// Adds a received message.
    pub(crate) fn push(&mut self, id: u8, data: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(data);
        self.msgs.push((id, at, data.len()));
    }

    /// Hands every message to its handler, in order, and empties the batch.
    pub(crate) fn deliver(&mut self, handlers: &mut AmHandlers) {
        for &(id, at, len) in &self.msgs {
            handlers.deliver(id, &self.bytes[at..at + len]);
        }
        self.msgs.clear();
        self.bytes.clear();
    }
}

/// One connection, both roles.
pub(crate) struct Link {
    pub(crate) conn: Conn,
    /// Where the other side's iface listens, once known: its hello, or the
    /// address this side connected to.
    pub(crate) remote_iface: Option<SocketAddr>,
    pending: HashMap<u64, Pending>,
    next_seq: u64,
    next_ep: u32,
    /// Refusals of requests without a reply of their own (put, add), by
    /// endpoint; returned by that endpoint's next flush.
    nacks: HashMap<u32, UctError>,
    /// The connection failed: every operation on it fails with this.
    pub(crate) failed: Option<UctError>,
    /// A request unanswered for this long fails the link.
    timeout: Duration,
    last_check: Instant,
    direct: Option<Direct>,
}

impl Link {
    pub(crate) fn new(conn: Conn, remote_iface: Option<SocketAddr>, timeout: Duration) -> Link {
        Link {
            conn,
            remote_iface,
            pending: HashMap::new(),
            next_seq: 1,
            next_ep: 1,
            nacks: HashMap::new(),
            failed: None,
            timeout,
            last_check: Instant::now(),
            direct: None,
        }
    }

    fn peer(&self) -> String {
        self.conn.peer()
    }

    /// A new endpoint id on this link.
    pub(crate) fn new_ep_id(&mut self) -> u32 {
        let id = self.next_ep;
        self.next_ep = self.next_ep.wrapping_add(1).max(1) & 0xff_ffff;
        id
    }

    /// The next request id of endpoint `ep`.
    pub(crate) fn next_req(&mut self, ep: u32) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        req_id(ep, seq)
    }

    /// Records a request that waits for its reply.
    pub(crate) fn add_pending(&mut self, req: u64, op: PendingOp) {
        self.pending.insert(
            req,
            Pending {
                op,
                since: Instant::now(),
            },
        );
    }

    /// Whether a large put is being read into its target.
    pub(crate) fn reading_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Fails the link when a request has waited longer than the peer
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
                    self.peer(),
                    self.timeout
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn fail(&mut self, err: UctError) {
        log::debug!("tcp link to {}: {err}", self.peer());
        for (_, pending) in self.pending.drain() {
            pending.op.finish(Err(err.clone()));
        }
        self.conn.fail_queued(&err);
        self.failed.get_or_insert(err);
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

    /// Writes, reads, executes requests and matches replies; active
    /// messages go to `ams`. A link that fails is marked failed; a peer
    /// that sends nonsense is cut off.
    pub(crate) fn progress(&mut self, table: &RegionTable, ams: &mut AmBatch) -> usize {
        if self.failed.is_some() {
            return 0;
        }
        match self.progress_inner(table, ams) {
            Ok(n) => n,
            Err(e) => {
                if matches!(e, UctError::Protocol(_)) {
                    log::warn!("tcp: closing the connection from {}: {e}", self.peer());
                }
                self.fail(e);
                1
            }
        }
    }

    fn progress_inner(&mut self, table: &RegionTable, ams: &mut AmBatch) -> Result<usize> {
        let mut events = 0;
        loop {
            if self.direct.is_some() {
                match self.direct_step(table)? {
                    None => break,
                    Some(refused) => {
                        events += 1;
                        let req = self.direct.take().map(|d| d.req).unwrap_or(0);
                        if let Some(error) = refused {
                            self.conn.send(
                                &Header::Nack {
                                    req,
                                    error: WireError::from(&error),
                                },
                                Payload::None,
                                None,
                            )?;
                        }
                    }
                }
            }
            self.conn.write_out()?;
            self.conn.read_in()?;
            let mut replies: Vec<(Header, Payload)> = Vec::new();
            loop {
                match self.conn.peek().map_err(UctError::Protocol)? {
                    Parsed::Frame {
                        header,
                        data_at,
                        data_len,
                        total,
                    } => {
                        events += 1;
                        if is_reply(&header) {
                            let data = self.conn.data(data_at, data_len).to_vec();
                            self.conn.consume(total);
                            self.on_reply(header, data)?;
                        } else {
                            let data = self.conn.data(data_at, data_len);
                            let reply = execute(table, ams, &mut self.remote_iface, header, data)?;
                            replies.extend(reply);
                            self.conn.consume(total);
                        }
                    }
                    Parsed::HeaderOnly {
                        header: Header::Put { req, key, addr },
                        data_at,
                        data_len,
                        have,
                    } if data_len >= DIRECT_MIN => {
                        // What is here goes in now; the rest straight from
                        // the socket. The whole range is checked first, so a
                        // refusal names the put, not a piece of it.
                        let first = self.conn.data(data_at, have);
                        let checked = table.access(
                            &table_key(key),
                            addr,
                            data_len as u64,
                            Access::REMOTE_WRITE,
                            |dst| {
                                // SAFETY: `access` checked [dst, dst + data_len)
                                // for remote write and keeps it registered
                                // while this closure runs; have <= data_len
                                // (parse returns HeaderOnly only for a frame
                                // not yet complete); `first` is the receive
                                // buffer, which no region overlaps.
                                unsafe { std::ptr::copy_nonoverlapping(first.as_ptr(), dst, have) }
                            },
                        );
                        self.conn.consume(data_at + have);
                        self.direct = Some(Direct {
                            req,
                            key,
                            // A peer-chosen address: wrap, never overflow (a range that
                            // wraps was refused by `access` above).
                            addr: addr.wrapping_add(have as u64),
                            remaining: data_len - have,
                            error: checked.err(),
                        });
                        break;
                    }
                    _ => break,
                }
            }
            for (header, payload) in replies {
                self.conn.send(&header, payload, None)?;
            }
            if self.direct.is_none() {
                break;
            }
        }
        self.conn.write_out()?;
        self.check_timeout()?;
        Ok(events)
    }

    /// Reads the rest of a large put into its target. None: the socket has
    /// nothing more now; Some(refusal): the put is complete.
    fn direct_step(&mut self, table: &RegionTable) -> Result<Option<Option<UctError>>> {
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
        }
        Ok(Some(put.error.take()))
    }

    /// Completes the pending operation a reply answers.
    fn on_reply(&mut self, header: Header, data: Vec<u8>) -> Result<()> {
        let unknown = |req| UctError::Protocol(format!("reply to unknown request {req}"));
        let mismatch = |what: &str| UctError::Protocol(format!("{what} reply to another request"));
        match header {
            Header::GetReply { req, error } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.op {
                    PendingOp::GetBytes(comp) => match error {
                        Some(e) => comp.finish(Err(e.into())),
                        None => {
                            comp.set_data(CompletionData::Bytes(data));
                            comp.finish(Ok(()));
                        }
                    },
                    PendingOp::GetIov(iov, comp) => {
                        let result = match error {
                            Some(e) => Err(e.into()),
                            None => scatter(&iov, &data),
                        };
                        if let Some(comp) = comp {
                            comp.finish(result);
                        }
                    }
                    other => {
                        other.finish(Err(mismatch("get")));
                        return Err(mismatch("get"));
                    }
                }
            }
            Header::AtomicReply { req, old, error } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.op {
                    PendingOp::Atomic(comp) => match error {
                        Some(e) => comp.finish(Err(e.into())),
                        None => {
                            comp.set_data(CompletionData::Value(old));
                            comp.finish(Ok(()));
                        }
                    },
                    other => {
                        other.finish(Err(mismatch("atomic")));
                        return Err(mismatch("atomic"));
                    }
                }
            }
            Header::FlushReply { req } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.op {
                    PendingOp::Flush { ep, comp } => {
                        let result = match self.nacks.remove(&ep) {
                            Some(e) => Err(e),
                            None => Ok(()),
                        };
                        if let Some(comp) = comp {
                            comp.finish(result);
                        }
                    }
                    other => {
                        other.finish(Err(mismatch("flush")));
                        return Err(mismatch("flush"));
                    }
                }
            }
            Header::Nack { req, error } => {
                let e: UctError = error.into();
                log::debug!(
                    "tcp link to {}: the peer refused request {req}: {e}",
                    self.peer()
                );
                self.nacks.entry(req_ep(req)).or_insert(e);
            }
            other => return Err(UctError::Protocol(format!("unexpected {other:?}"))),
        }
        Ok(())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let err = UctError::Canceled("the tcp connection was closed".into());
        for (_, pending) in self.pending.drain() {
            pending.op.finish(Err(err.clone()));
        }
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
    )
}

/// Copies a get reply into the iov list it was asked for.
fn scatter(iov: &[(MemHandle, usize, usize)], data: &[u8]) -> Result<()> {
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
