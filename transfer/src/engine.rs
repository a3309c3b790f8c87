//! The connected side of a Transport: its iface and endpoint, and the
//! queue of operations not yet fully posted. Everything here runs under
//! the Transport's lock, from the caller that posts or from progress.
//!
//! A write moves zero-copy from the registered view, split at the
//! transport's largest zcopy. Its notification is, on transports with
//! immediate data (rc), the immediate of its single RDMA WRITE WITH
//! IMMEDIATE; elsewhere (and for a write split in pieces) an active
//! message posted after the data and a fence, so that the receiver never
//! sees a notification before its bytes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use uct_core::{Caps, Completion, Endpoint, Iface, Iov, MemHandle, RemoteKey, Status, UctError};

use crate::error::{Result, TransferError};
use crate::memory::View;
use crate::stats::Counters;

/// The active-message id of notifications.
pub(crate) const NOTIFY_AM_ID: u8 = 17;

/// The high half of a notification's header: what marks it as one.
const NOTIFY_MAGIC: u64 = 0x7466_6e74; // "tfnt"

/// A notification as an active message: the header (magic and tag) and
/// the length written.
pub(crate) fn notify_message(tag: u32, len: usize) -> (u64, [u8; 8]) {
    (NOTIFY_MAGIC << 32 | tag as u64, (len as u64).to_le_bytes())
}

/// Reads a notification message; `None` for anything else a peer sends.
pub(crate) fn parse_notify(data: &[u8]) -> Option<crate::Notification> {
    let header = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    let len = u64::from_le_bytes(data.get(8..16)?.try_into().ok()?);
    if data.len() != 16 || header >> 32 != NOTIFY_MAGIC {
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
        }
    }
}

/// The connected iface and endpoint, and what is waiting to be posted.
pub(crate) struct Engine {
    // The endpoint drops before its iface.
    pub ep: Box<dyn Endpoint>,
    pub iface: Box<dyn Iface>,
    pub transport: String,
    pub component: String,
    pub md: String,
    pub notify: NotifyPath,
    /// Whether a write's completion says only that it left (tcp), so that
    /// each write is flushed to learn it landed, and any refusal by the
    /// peer (a forged or stale key, a read-only buffer) reaches its future.
    pub flush_each: bool,
    max_put: usize,
    max_get: usize,
    queue: VecDeque<Op>,
    /// Operations made and not completed (queued ones included); the
    /// completion callbacks count them down.
    in_flight: Arc<AtomicUsize>,
    depth: usize,
    turns: u32,
}

/// Transports whose put completes once it has landed at the peer: rc (the
/// NIC's completion follows the peer's acknowledgement) and those that
/// write the peer's memory in the call (self, posix, cma). Every other
/// transport's writes are flushed, each, before their futures resolve.
const REMOTE_COMPLETION: [&str; 4] = ["rc", "self", "posix", "cma"];

/// Turns of progress between two liveness probes of the endpoint.
const CHECK_EVERY: u32 = 64;

impl Engine {
    pub(crate) fn new(
        ep: Box<dyn Endpoint>,
        iface: Box<dyn Iface>,
        component: String,
        in_flight: Arc<AtomicUsize>,
        depth: usize,
    ) -> Engine {
        let attrs = iface.attrs().clone();
        let transport = iface.transport().to_string();
        Engine {
            flush_each: !REMOTE_COMPLETION.contains(&transport.as_str()),
            transport,
            md: iface.md().name().to_string(),
            component,
            notify: NotifyPath::of(attrs.caps),
            max_put: attrs.put.max_zcopy.max(1),
            max_get: attrs.get.max_zcopy.max(1),
            ep,
            iface,
            queue: VecDeque::new(),
            in_flight,
            depth: depth.max(1),
            turns: 0,
        }
    }

    /// Whether anything waits to be posted.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Queues an operation and posts what may be posted.
    pub(crate) fn submit(&mut self, op: Op, counters: &Counters) {
        for p in &op.parts {
            match p.dir {
                Dir::Write => {
                    Counters::add(&counters.writes, 1);
                    Counters::add(&counters.bytes_written, p.len as u64);
                    if p.tag.is_some() {
                        let by_imm = self.notify == NotifyPath::Immediate && p.len <= self.max_put;
                        Counters::add(
                            if by_imm {
                                &counters.sent_imm
                            } else {
                                &counters.sent_msg
                            },
                            1,
                        );
                    }
                }
                Dir::Read => Counters::add(&counters.reads, 1),
            }
        }
        self.queue.push_back(op);
        self.pump();
    }

    /// Posts queued operations in order while the transport accepts them
    /// and fewer than `depth` are in flight.
    pub(crate) fn pump(&mut self) {
        while !self.queue.is_empty() {
            let queued = self.queue.len();
            let op = self.queue.front_mut().expect("not empty");
            if op.part == 0 && op.done == 0 && op.stage == Stage::Data {
                let posted = self
                    .in_flight
                    .load(Ordering::Acquire)
                    .saturating_sub(queued);
                if posted >= self.depth {
                    return;
                }
            }
            let (ep, notify, max_put, max_get) =
                (self.ep.as_mut(), self.notify, self.max_put, self.max_get);
            match advance(ep, op, notify, max_put, max_get) {
                Ok(false) => return,
                Ok(true) => {
                    let op = self.queue.pop_front().expect("front exists");
                    op.comp.finish(Ok(()));
                }
                Err(e) => {
                    let op = self.queue.pop_front().expect("front exists");
                    op.comp.finish(Err(e));
                }
            }
        }
    }

    /// One turn: progress, post, and now and then ask whether the peer
    /// lives. Returns the events handled, or the endpoint's failure.
    pub(crate) fn turn(&mut self) -> std::result::Result<usize, UctError> {
        let n = self.iface.progress();
        if !self.queue.is_empty() {
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
    notify: NotifyPath,
    max_put: usize,
    max_get: usize,
) -> std::result::Result<bool, UctError> {
    while op.part < op.parts.len() {
        let p = &op.parts[op.part];
        let comp = Some(&op.comp);
        if op.stage == Stage::Data {
            let max = if p.dir == Dir::Write {
                max_put
            } else {
                max_get
            };
            // One immediate write carries the notification when the write
            // fits one zcopy.
            let by_imm = p.tag.is_some() && notify == NotifyPath::Immediate && p.len <= max;
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
            op.stage = match p.tag {
                Some(_) if !by_imm => Stage::Fence,
                _ => {
                    op.part += 1;
                    op.done = 0;
                    Stage::Data
                }
            };
            continue;
        }
        if op.stage == Stage::Fence {
            if ep.fence()? == Status::NoResource {
                return Ok(false);
            }
            op.stage = Stage::Notify;
        }
        let (header, payload) = notify_message(p.tag.unwrap_or(0), p.len);
        if ep.am_short(NOTIFY_AM_ID, header, &payload)? == Status::NoResource {
            return Ok(false);
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
        let (h, p) = notify_message(0xdead_beef, 1 << 20);
        let mut data = h.to_le_bytes().to_vec();
        data.extend_from_slice(&p);
        let n = parse_notify(&data).unwrap();
        assert_eq!((n.tag, n.len), (0xdead_beef, 1 << 20));
        assert!(parse_notify(&data[..15]).is_none());
        let mut longer = data.clone();
        longer.push(0);
        assert!(parse_notify(&longer).is_none());
        data[7] ^= 1;
        assert!(parse_notify(&data).is_none());
        assert!(parse_notify(&[]).is_none());
    }
}
