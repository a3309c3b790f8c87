//! A link: one TCP connection between two tcp ifaces, used both ways.
//! Either side's endpoints send requests on it (active messages, puts,
//! gets, atomics, flushes) and get replies on it; either side executes the
//! requests that arrive, checked against its region table. Sharing one
//! connection per pair of ifaces lets replies and acknowledgements ride
//! together, as in UCX.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uct_core::atomic_ops::{check_aligned, fetch_at};
use uct_core::region_table::{RegionTable, SoftRkey};
use uct_core::{Access, AtomicValue, Completion, CompletionData, FetchOp, MemHandle, UctError};

use crate::conn::{Conn, Payload};
use crate::wire::{Header, Parsed, WireAtomic, WireError, WireKey};

type Result<T, E = UctError> = std::result::Result<T, E>;

/// What a pending request delivers its result to.
pub(crate) enum Kind {
    GetBytes(Completion),
    GetIov(Vec<(MemHandle, usize, usize)>, Option<Completion>),
    Atomic(Completion),
    /// A flush of endpoint `ep`.
    Flush {
        ep: u32,
        comp: Option<Completion>,
    },
}

/// A request waiting for its reply, and when it was sent.
struct Pending {
    kind: Kind,
    since: Instant,
}

fn finish(p: Kind, r: Result<()>) {
    match p {
        Kind::GetBytes(c) | Kind::Atomic(c) => c.finish(r),
        Kind::GetIov(_, c) | Kind::Flush { comp: c, .. } => {
            if let Some(c) = c {
                c.finish(r)
            }
        }
    }
}

/// Request ids carry the endpoint in their high bits, so that a refusal
/// (Nack) is reported to the endpoint that sent the request.
pub(crate) fn req_id(ep: u32, seq: u64) -> u64 {
    ((ep as u64) << 40) | (seq & ((1 << 40) - 1))
}

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
    pub(crate) msgs: Vec<(u8, usize, usize)>,
    pub(crate) bytes: Vec<u8>,
}

impl AmBatch {
    fn push(&mut self, id: u8, data: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(data);
        self.msgs.push((id, at, data.len()));
    }

    pub(crate) fn clear(&mut self) {
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
        let s = self.next_seq;
        self.next_seq += 1;
        req_id(ep, s)
    }

    /// Records a request that waits for its reply.
    pub(crate) fn add_pending(&mut self, req: u64, kind: Kind) {
        self.pending.insert(
            req,
            Pending {
                kind,
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
        for (_, p) in self.pending.drain() {
            finish(p.kind, Err(err.clone()));
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
                            let r = execute(table, ams, &mut self.remote_iface, header, data)?;
                            if let Some(r) = r {
                                replies.push(r);
                            }
                            self.conn.consume(total);
                        }
                    }
                    Parsed::HeaderOnly {
                        header: Header::Put { req, key: k, addr },
                        data_at,
                        data_len,
                        have,
                    } if data_len >= DIRECT_MIN => {
                        // What is here goes in now; the rest straight from
                        // the socket. The whole range is checked first, so a
                        // refusal names the put, not a piece of it.
                        let first = self.conn.data(data_at, have);
                        let r = table.access(
                            &key(k),
                            addr,
                            data_len as u64,
                            Access::REMOTE_WRITE,
                            |p| {
                                // SAFETY: the table checked [p, p+data_len) and
                                // have <= data_len.
                                unsafe { std::ptr::copy_nonoverlapping(first.as_ptr(), p, have) }
                            },
                        );
                        self.conn.consume(data_at + have);
                        self.direct = Some(Direct {
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
                self.conn.send(&h, p, None)?;
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
        let Some(d) = self.direct.as_mut() else {
            return Ok(Some(None));
        };
        let conn = &mut self.conn;
        let mut scratch = Vec::new();
        while d.remaining > 0 {
            let n = if d.error.is_none() {
                // The region cannot be deregistered while the bytes land:
                // the table's read lock is held around the receive.
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

    fn on_reply(&mut self, h: Header, data: Vec<u8>) -> Result<()> {
        let unknown = |req| UctError::Protocol(format!("reply to unknown request {req}"));
        let mismatch = |what: &str| UctError::Protocol(format!("{what} reply to another request"));
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
                        finish(other, Err(mismatch("get")));
                        return Err(mismatch("get"));
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
                        finish(other, Err(mismatch("atomic")));
                        return Err(mismatch("atomic"));
                    }
                }
            }
            Header::FlushReply { req } => {
                match self.pending.remove(&req).ok_or_else(|| unknown(req))?.kind {
                    Kind::Flush { ep, comp } => {
                        let r = match self.nacks.remove(&ep) {
                            Some(e) => Err(e),
                            None => Ok(()),
                        };
                        if let Some(c) = comp {
                            c.finish(r);
                        }
                    }
                    other => {
                        finish(other, Err(mismatch("flush")));
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
        for (_, p) in self.pending.drain() {
            finish(p.kind, Err(err.clone()));
        }
        self.conn.fail_queued(&err);
    }
}

fn is_reply(h: &Header) -> bool {
    matches!(
        h,
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
) -> Result<u64> {
    let val = |v: u64| match width {
        4 => Ok(AtomicValue::U32(v as u32)),
        8 => Ok(AtomicValue::U64(v)),
        w => Err(UctError::InvalidParam(format!("atomic width {w}"))),
    };
    let fop = match op {
        WireAtomic::Add | WireAtomic::FetchAdd => FetchOp::Add(val(value)?),
        WireAtomic::Swap => FetchOp::Swap(val(value)?),
        WireAtomic::CompareSwap { compare } => FetchOp::CompareSwap {
            compare: val(compare)?,
            swap: val(value)?,
        },
    };
    check_aligned(addr, width as usize)?;
    table.access(&key(k), addr, width as u64, Access::REMOTE_ATOMIC, |p| {
        // SAFETY: the table checked a live word granting atomic access;
        // alignment was checked above.
        unsafe { fetch_at(p, fop) }
    })?
}

/// Executes one request from the peer and returns its reply, if it has one.
fn execute(
    table: &RegionTable,
    ams: &mut AmBatch,
    remote_iface: &mut Option<SocketAddr>,
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
        Header::Hello { addr, port } => {
            *remote_iface = crate::iface::parse_addr(&addr, &port.to_le_bytes());
            None
        }
        Header::Am { id } => {
            ams.push(id, data);
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
            if len as usize > crate::iface::MAX_FRAME_DATA {
                let error = WireError::Other(format!(
                    "get of {len} bytes exceeds {}",
                    crate::iface::MAX_FRAME_DATA
                ));
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
            )))
        }
    })
}
