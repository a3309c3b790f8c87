//! The connected side of a Transport: its iface and endpoint, and the
//! queue of operations not yet fully posted. Everything here runs under
//! the Transport's lock, from the caller that posts or from progress.
//!
//! A write moves zero-copy from the registered view, split at the
//! transport's largest zcopy. Its notification is, on transports with
//! immediate data (rc, self, tcp), the immediate of its single put, which
//! completes only once it has landed (rc: the peer's acknowledgement;
//! self: in the call; tcp: the target's answer) and is never delivered
//! when the peer refuses it. Elsewhere (posix), and for a write split in
//! pieces (whose notification must carry the whole length), an active
//! message after the data:
//! - where a put completes once it has landed (posix, self, rc), after a
//!   fence, so that the receiver never sees a notification before its
//!   bytes;
//! - where a put completes when it has left (tcp, for a write over 16 MiB
//!   split in pieces), only once a flush says it landed, so that a write
//!   the peer refused (a stale or forged key, a read-only buffer) is never
//!   notified. Those notifications wait in order in [`Engine::notices`]
//!   while later writes go on; a later notified write by immediate waits
//!   for them, so that notifications arrive in the order of the writes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use uct_core::{Caps, Completion, Endpoint, Iface, Iov, MemHandle, RemoteKey, Status, UctError};

use crate::error::{Result, TransferError};
use crate::memory::View;
use crate::shared::RegTarget;
use crate::stats::Counters;

/// The active-message id of notifications.
pub(crate) const NOTIFY_AM_ID: u8 = 17;

/// The high half of a notification's header: what marks it as one.
const NOTIFY_MAGIC: u64 = 0x7466_6e74; // "tfnt"

/// Bytes of a notification message after its 8-byte header: the length
/// written and the receiver's token.
const NOTIFY_PAYLOAD: usize = 16;

/// A notification as an active message: the header (magic and tag), then
/// the length written and the receiver's token (from its URL).
pub(crate) fn notify_message(tag: u32, len: usize, token: u64) -> (u64, [u8; NOTIFY_PAYLOAD]) {
    let mut payload = [0u8; NOTIFY_PAYLOAD];
    payload[..8].copy_from_slice(&(len as u64).to_le_bytes());
    payload[8..].copy_from_slice(&token.to_le_bytes());
    (NOTIFY_MAGIC << 32 | tag as u64, payload)
}

/// Reads a notification message that carries `token`; `None` for anything
/// else (another sender's, or not a notification).
pub(crate) fn parse_notify(data: &[u8], token: u64) -> Option<crate::Notification> {
    if data.len() != 8 + NOTIFY_PAYLOAD {
        return None;
    }
    let word = |at: usize| {
        data.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let (header, len, theirs) = (word(0)?, word(8)?, word(16)?);
    if header >> 32 != NOTIFY_MAGIC || theirs != token {
        return None;
    }
    Some(crate::Notification {
        len: usize::try_from(len).ok()?,
        tag: header as u32,
    })
}

/// How this connection notifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotifyPath {
    /// The immediate of the write itself.
    Immediate,
    /// An active message after the data.
    Message,
    /// Neither: notified writes are refused.
    None,
}

impl NotifyPath {
    pub(crate) fn of(caps: Caps) -> NotifyPath {
        if caps.contains(Caps::PUT_IMM) {
            NotifyPath::Immediate
        } else if caps.contains(Caps::AM_SHORT) {
            NotifyPath::Message
        } else {
            NotifyPath::None
        }
    }
}

/// Whether a part writes or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Write,
    Read,
}

/// One write or read of an operation: a view and where it goes.
pub(crate) struct Part {
    pub dir: Dir,
    pub mem: MemHandle,
    /// Offset of the view in `mem`.
    pub offset: usize,
    pub len: usize,
    pub remote_addr: u64,
    pub rkey: Arc<RemoteKey>,
    /// The tag to notify with, for a notified write.
    pub tag: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Data,
    Fence,
    Notify,
}

/// An operation: parts posted one after the other, then a flush if asked.
/// `comp` fires once all of it completed; the operation holds one start of
/// it until it is fully posted, so that it cannot fire between pieces.
pub(crate) struct Op {
    parts: Vec<Part>,
    part: usize,
    done: usize,
    stage: Stage,
    flush: bool,
    comp: Completion,
    /// The first part's refusal, which the operation ends with.
    error: Option<UctError>,
}

impl Op {
    pub(crate) fn new(parts: Vec<Part>, flush: bool, comp: Completion) -> Op {
        comp.start();
        Op {
            parts,
            part: 0,
            done: 0,
            stage: Stage::Data,
            flush,
            comp,
            error: None,
        }
    }
}

/// A notification waiting for the flush that says its write landed. It
/// holds a start of its operation's completion, so that the operation ends
/// only once the flush has answered, with its error if the peer refused.
struct Notice {
    landed: Completion,
    op: Completion,
    tag: u32,
    len: usize,
}

/// What posting needs to know of the connection.
#[derive(Clone, Copy)]
struct Posting {
    notify: NotifyPath,
    /// Whether a write's completion says only that it left (tcp), so that
    /// each write is flushed to learn it landed, and any refusal by the
    /// peer (a forged or stale key, a read-only buffer) reaches its future.
    flush_each: bool,
    max_put: usize,
    max_get: usize,
    peer_token: u64,
}

/// The connected iface and endpoint, and what is waiting to be posted.
pub(crate) struct Engine {
    // The endpoint drops before its iface.
    pub ep: Box<dyn Endpoint>,
    pub iface: Box<dyn Iface>,
    pub transport: String,
    pub component: String,
    pub md: String,
    /// What new memory registers with.
    pub target: RegTarget,
    pub notify: NotifyPath,
    posting: Posting,
    queue: VecDeque<Op>,
    notices: VecDeque<Notice>,
    /// Operations made and not completed (queued ones included); the
    /// completion callbacks count them down.
    in_flight: Arc<AtomicUsize>,
    depth: usize,
    turns: u32,
}

/// What is left of an engine taken out of service.
pub(crate) struct Teardown {
    pub iface: Box<dyn Iface>,
    pub notices: Vec<(Completion, Completion, u32, usize)>,
}

/// Transports whose put completes once it has landed at the peer: rc (the
/// NIC's completion follows the peer's acknowledgement) and those that
/// write the peer's memory in the call (self, posix, cma). Every other
/// transport's writes are flushed, each, before their futures resolve,
/// but for a notified write sent as one put with immediate data, which
/// completes once it has landed wherever there is one (tcp: the target
/// answers it).
const REMOTE_COMPLETION: [&str; 4] = ["rc", "self", "posix", "cma"];

/// Turns of progress between two liveness probes of the endpoint.
const CHECK_EVERY: u32 = 64;

impl Engine {
    /// The engine of one connection; `in_flight` counts its operations
    /// (the Transport's for a single rail, the rail's own for one of
    /// several).
    pub(crate) fn new(
        ep: Box<dyn Endpoint>,
        iface: Box<dyn Iface>,
        component: String,
        target: RegTarget,
        peer_token: u64,
        shared: &crate::shared::Shared,
        in_flight: Arc<AtomicUsize>,
    ) -> Engine {
        let (depth, max_piece) = (shared.depth, shared.max_piece);
        let attrs = iface.attrs().clone();
        let transport = iface.transport().to_string();
        let flush_each = !REMOTE_COMPLETION.contains(&transport.as_str());
        let notify = NotifyPath::of(attrs.caps);
        Engine {
            posting: Posting {
                notify,
                flush_each,
                max_put: attrs.put.max_zcopy.min(max_piece).max(1),
                max_get: attrs.get.max_zcopy.min(max_piece).max(1),
                peer_token,
            },
            transport,
            md: iface.md().name().to_string(),
            component,
            target,
            notify,
            ep,
            iface,
            queue: VecDeque::new(),
            notices: VecDeque::new(),
            in_flight,
            depth: depth.max(1),
            turns: 0,
        }
    }

    /// The longest write one put carries (max_zcopy capped by max_piece):
    /// a notified write up to it is one put with immediate.
    pub(crate) fn max_put(&self) -> usize {
        self.posting.max_put
    }

    /// Whether anything waits to be posted.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queue.is_empty() || !self.notices.is_empty()
    }

    /// Queues an operation and posts what may be posted.
    pub(crate) fn submit(&mut self, op: Op, counters: &Counters) {
        for p in &op.parts {
            match p.dir {
                Dir::Write => {
                    Counters::add(&counters.writes, 1);
                    Counters::add(&counters.bytes_written, p.len as u64);
                    if p.tag.is_some() {
                        let by_imm =
                            self.notify == NotifyPath::Immediate && p.len <= self.posting.max_put;
                        let counter = if by_imm {
                            &counters.sent_imm
                        } else {
                            &counters.sent_msg
                        };
                        Counters::add(counter, 1);
                    }
                }
                Dir::Read => Counters::add(&counters.reads, 1),
            }
        }
        self.queue.push_back(op);
        self.pump();
    }

    /// Queues an operation of a rail (counted by the rails) and posts what
    /// may be posted.
    pub(crate) fn enqueue(&mut self, op: Op) {
        self.queue.push_back(op);
        self.pump();
    }

    /// Queues the notification of a write whose stripes finish `landed`:
    /// sent in order with this engine's other notifications once `landed`
    /// is complete; `op` (started by the caller) finishes when it is sent.
    pub(crate) fn queue_notice(
        &mut self,
        landed: Completion,
        op: Completion,
        tag: u32,
        len: usize,
    ) {
        self.notices.push_back(Notice {
            landed,
            op,
            tag,
            len,
        });
        self.send_notices();
    }

    /// Whether the endpoint still reaches its peer.
    pub(crate) fn check(&mut self) -> std::result::Result<(), UctError> {
        self.ep.check()
    }

    /// Takes the connection out of service: its queued operations end with
    /// `err`, its endpoint closes (nothing touches their memory any more),
    /// and what is left is its iface (which still receives what the peer
    /// sends) and its notifications not sent yet, as (landed, op, tag, len).
    pub(crate) fn teardown(mut self, err: &UctError) -> Teardown {
        let notices = self
            .notices
            .drain(..)
            .map(|n| (n.landed, n.op, n.tag, n.len))
            .collect();
        for op in self.queue.drain(..) {
            op.comp.finish(Err(err.clone()));
        }
        drop(self.ep);
        Teardown {
            iface: self.iface,
            notices,
        }
    }

    /// Posts queued operations in order while the transport accepts them
    /// and fewer than `depth` are in flight, then the notifications whose
    /// writes have landed.
    pub(crate) fn pump(&mut self) {
        // Notices sent first let an immediate waiting behind them go now.
        self.send_notices();
        while !self.queue.is_empty() {
            let queued = self.queue.len();
            let op = self.queue.front_mut().expect("not empty");
            if op.part == 0 && op.done == 0 && op.stage == Stage::Data {
                let posted = self
                    .in_flight
                    .load(Ordering::Acquire)
                    .saturating_sub(queued);
                if posted >= self.depth {
                    break;
                }
            }
            match advance(self.ep.as_mut(), op, self.posting, &mut self.notices) {
                Ok(false) => break,
                Ok(true) => {
                    let mut op = self.queue.pop_front().expect("front exists");
                    op.comp.finish(op.error.take().map_or(Ok(()), Err));
                }
                Err(e) => {
                    let op = self.queue.pop_front().expect("front exists");
                    op.comp.finish(Err(e));
                }
            }
        }
        self.send_notices();
    }

    /// Sends, in order, the notifications whose writes a flush says have
    /// landed; drops those whose writes the peer refused (their writers'
    /// futures carry the refusal).
    fn send_notices(&mut self) {
        while let Some(n) = self.notices.front() {
            if !n.landed.is_complete() {
                return;
            }
            if let Err(e) = n.landed.result() {
                log::debug!("transfer: a write was refused ({e}); its notification is not sent");
                n.op.finish(Err(e));
                self.notices.pop_front();
                continue;
            }
            let (header, payload) = notify_message(n.tag, n.len, self.posting.peer_token);
            let sent = match self.ep.am_short(NOTIFY_AM_ID, header, &payload) {
                Ok(Status::NoResource) => return,
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            n.op.finish(sent);
            self.notices.pop_front();
        }
    }

    /// One turn: progress, post, and now and then ask whether the peer
    /// lives. Returns the events handled, or the endpoint's failure.
    pub(crate) fn turn(&mut self) -> std::result::Result<usize, UctError> {
        let n = self.iface.progress();
        if self.has_queued() {
            self.pump();
        }
        self.turns = self.turns.wrapping_add(1);
        if self.turns.is_multiple_of(CHECK_EVERY) {
            self.ep.check()?;
        }
        Ok(n)
    }

    /// Ends every queued operation with `err` (those posted end as the
    /// transport completes them, or by the Transport's table).
    pub(crate) fn fail_queued(&mut self, err: &UctError) {
        for n in self.notices.drain(..) {
            n.op.finish(Err(err.clone()));
        }
        for op in self.queue.drain(..) {
            op.comp.finish(Err(err.clone()));
        }
    }
}

/// Posts what it can of `op`: true once all of it is posted, false when the
/// transport is out of resources (post again after progress).
fn advance(
    ep: &mut dyn Endpoint,
    op: &mut Op,
    how: Posting,
    notices: &mut VecDeque<Notice>,
) -> std::result::Result<bool, UctError> {
    while op.part < op.parts.len() {
        match advance_part(ep, op, how, notices) {
            Ok(false) => return Ok(false),
            Ok(true) => {}
            // A part refused (a stale key, a read-only buffer): it is not
            // notified, the operation ends with its error, and the parts
            // after it still go, as they would where the refusal comes
            // from the peer later.
            Err(e) => {
                op.error.get_or_insert(e);
            }
        }
        op.part += 1;
        op.done = 0;
        op.stage = Stage::Data;
    }
    if op.flush {
        if ep.flush(Some(&op.comp))? == Status::NoResource {
            return Ok(false);
        }
        op.flush = false;
    }
    Ok(true)
}

/// Posts what it can of the operation's current part: true once all of
/// it (and its notification) is posted.
fn advance_part(
    ep: &mut dyn Endpoint,
    op: &mut Op,
    how: Posting,
    notices: &mut VecDeque<Notice>,
) -> std::result::Result<bool, UctError> {
    let p = &op.parts[op.part];
    let comp = Some(&op.comp);
    let max = match p.dir {
        Dir::Write => how.max_put,
        Dir::Read => how.max_get,
    };
    // One immediate write carries the notification when the write fits one
    // zcopy: a put with immediate data completes once it has landed, on
    // every transport that has it (tcp's too: the target answers it), so
    // it needs no flush of its own.
    let by_imm = p.tag.is_some() && how.notify == NotifyPath::Immediate && p.len <= max;
    // Notifications go in the order of the writes: an immediate waits
    // while an earlier write split in pieces still waits for its flush
    // before its message goes.
    if by_imm && op.stage == Stage::Data && op.done == 0 && !notices.is_empty() {
        return Ok(false);
    }
    if op.stage == Stage::Data {
        while op.done < p.len || (by_imm && p.len == 0 && op.done == 0) {
            let piece = (p.len - op.done).min(max);
            let iov = [Iov::new(&p.mem, p.offset + op.done, piece)];
            let iov: &[Iov<'_>] = if piece == 0 { &[] } else { &iov };
            let addr = p.remote_addr + op.done as u64;
            let status = match (p.dir, by_imm) {
                (Dir::Write, true) => {
                    ep.put_zcopy_imm(iov, addr, &p.rkey, p.tag.unwrap_or(0), comp)?
                }
                (Dir::Write, false) => ep.put_zcopy(iov, addr, &p.rkey, comp)?,
                (Dir::Read, _) => ep.get_zcopy(iov, addr, &p.rkey, comp)?,
            };
            if status == Status::NoResource {
                return Ok(false);
            }
            op.done += piece;
            if piece == 0 {
                break;
            }
        }
        // The immediate was the notification, and its put completes once
        // it has landed: nothing follows.
        if by_imm {
            return Ok(true);
        }
        let flushed_each = how.flush_each && p.dir == Dir::Write;
        if p.tag.is_none() && !flushed_each {
            return Ok(true);
        }
        op.stage = Stage::Fence;
    }
    let tag = p.tag.unwrap_or(0);
    if how.flush_each && p.tag.is_none() {
        // Each write's own flush, so that a refusal is the error of this
        // write, not of the next one's flush (a notified write after it
        // would lose its notification).
        if ep.flush(Some(&op.comp))? == Status::NoResource {
            return Ok(false);
        }
    } else if how.flush_each {
        // The notification goes once a flush says the write landed.
        let landed = Completion::new();
        if ep.flush(Some(&landed))? == Status::NoResource {
            return Ok(false);
        }
        op.comp.start();
        notices.push_back(Notice {
            landed,
            op: op.comp.clone(),
            tag,
            len: p.len,
        });
    } else {
        if op.stage == Stage::Fence {
            if ep.fence()? == Status::NoResource {
                return Ok(false);
            }
            op.stage = Stage::Notify;
        }
        let (header, payload) = notify_message(tag, p.len, how.peer_token);
        if ep.am_short(NOTIFY_AM_ID, header, &payload)? == Status::NoResource {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The error an operation ends with: the transport's, with a failed
/// endpoint named as the peer's failure.
pub(crate) fn op_error(e: &UctError) -> TransferError {
    match e {
        UctError::EndpointFailed(_) => TransferError::PeerFailed { source: e.clone() },
        _ => TransferError::Uct(e.clone()),
    }
}

/// Checks that `view` and the remote range fit for `dir`.
pub(crate) fn check_part(view: &View, remote: &crate::RemoteBuffer, dir: Dir) -> Result<()> {
    if view.len() != remote.len() {
        return Err(TransferError::LengthMismatch {
            local: view.len(),
            remote: remote.len(),
        });
    }
    let (needed, op) = match dir {
        Dir::Write => (uct_core::Access::REMOTE_WRITE, "write"),
        Dir::Read => (uct_core::Access::REMOTE_READ, "read"),
    };
    if !remote.access().contains(needed) {
        return Err(TransferError::RemoteAccess {
            op,
            granted: remote.access(),
            needed,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_messages_round_trip_and_others_are_ignored() {
        let (h, p) = notify_message(0xdead_beef, 1 << 20, 77);
        let mut data = h.to_le_bytes().to_vec();
        data.extend_from_slice(&p);
        let n = parse_notify(&data, 77).unwrap();
        assert_eq!((n.tag, n.len), (0xdead_beef, 1 << 20));
        assert!(parse_notify(&data, 78).is_none(), "another token");
        assert!(parse_notify(&data[..23], 77).is_none());
        let mut longer = data.clone();
        longer.push(0);
        assert!(parse_notify(&longer, 77).is_none());
        data[7] ^= 1;
        assert!(parse_notify(&data, 77).is_none());
        assert!(parse_notify(&[], 77).is_none());
    }
}
