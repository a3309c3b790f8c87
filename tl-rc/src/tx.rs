//! The send side of an rc endpoint as a state machine, with no verbs in it:
//! what is posted and in which order, which posts are signalled (tx
//! moderation), credits, fence and flush bookkeeping, and failure. The I/O
//! layer (`conn.rs`) asks it how to post, tells it what was posted and what
//! the completion queue said, and carries out the events it returns.
//!
//! RC completes a queue's work requests in order, so one signalled
//! completion also completes every unsignalled request posted before it. A
//! failed one fails the endpoint: every operation still outstanding fails,
//! none reports success after it. But the NIC may still be working on an
//! operation until its own completion (a flush error, once the I/O layer
//! has moved the QP to the error state) comes back, so each failed
//! operation, and the memory it keeps, is released only then, or when the
//! I/O layer gives up waiting ([`TxTracker::give_up`]) and keeps the memory
//! until the QP is destroyed.

use std::collections::VecDeque;
use std::fmt;

use uct_core::{Result, UctError};

/// Signal one post in this many; the others complete with it.
pub const MODERATION: u32 = 16;

/// Work request ids the tracker hands out are below this; the I/O layer
/// may use the top bit for its own (receive) requests.
pub const SEQ_LIMIT: u64 = 1 << 63;

/// What kind of work a completion says was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompareSwap,
    FetchAdd,
    /// Anything else, by its verbs number.
    Other(u32),
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcOpcode::Send => f.write_str("SEND"),
            WcOpcode::RdmaWrite => f.write_str("RDMA_WRITE"),
            WcOpcode::RdmaRead => f.write_str("RDMA_READ"),
            WcOpcode::CompareSwap => f.write_str("COMP_SWAP"),
            WcOpcode::FetchAdd => f.write_str("FETCH_ADD"),
            WcOpcode::Other(n) => write!(f, "opcode {n}"),
        }
    }
}

/// A completion's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The status's name as verbs gives it, its number, and the vendor's
    /// error code.
    Failed {
        name: String,
        code: u32,
        vendor_err: u32,
    },
}

/// Whether a post must be signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// As moderation says.
    Moderated,
    /// Always: the operation needs its own completion, or resources run
    /// low, or a flush needs the tail to be visible.
    Always,
}

/// How to post the next work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Its work request id.
    pub seq: u64,
    pub signalled: bool,
    /// Whether it carries a pending fence.
    pub fenced: bool,
}

/// An operation posted: what its completion must say, a name for errors,
/// and what the I/O layer keeps with it.
#[derive(Debug)]
pub struct TxOp<T> {
    pub expect: WcOpcode,
    pub what: &'static str,
    /// The bytes it moves (its SGEs' lengths), for the peer timeout.
    pub bytes: u64,
    pub payload: T,
}

/// What the I/O layer must do after a completion or a failure.
#[derive(Debug)]
pub enum TxEvent<T, F> {
    /// An operation completed. `named`: the completion is this operation's
    /// own (its byte count and data are this operation's).
    Done { payload: T, named: bool },
    /// An operation failed.
    Failed { payload: T, error: UctError },
    /// Nothing is outstanding any more: a flush is complete.
    Flushed(F),
    /// The endpoint failed with a flush waiting.
    FlushFailed(F, UctError),
    /// A successful completion that names no outstanding operation (a
    /// duplicate, or an id never handed out); nothing was completed.
    Stray { wr_id: u64 },
}

/// What a flush needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushNeed {
    /// Nothing is outstanding: the flush is done now.
    Done,
    /// The last post was unsignalled: post a signalled (empty) one so that
    /// the completion of everything becomes visible, then wait.
    SignalTail,
    /// As `SignalTail`, but no credit is left for it: try again later.
    NoResource,
    /// The last post is signalled: wait for it.
    Wait,
}

struct Posted<T> {
    seq: u64,
    signalled: bool,
    op: TxOp<T>,
}

/// The send-side state of one endpoint. `T` is what the I/O layer keeps
/// with each operation, `F` with each flush.
pub struct TxTracker<T, F> {
    device: String,
    credits: u32,
    /// Posted operations in order, with consecutive ids.
    ops: VecDeque<Posted<T>>,
    next_seq: u64,
    since_signal: u32,
    /// Whether the last post was signalled (true when none is outstanding).
    tail_signalled: bool,
    fence: bool,
    flushes: Vec<F>,
    failure: Option<UctError>,
}

impl<T, F> TxTracker<T, F> {
    /// A tracker with `credits` posts allowed in flight; `device` names the
    /// endpoint's device in errors.
    pub fn new(device: &str, credits: u32) -> Self {
        Self::starting_at(device, credits, 1)
    }

    /// As `new`, handing out ids from `first_seq` (tests use it to cross
    /// the wraparound).
    pub fn starting_at(device: &str, credits: u32, first_seq: u64) -> Self {
        TxTracker {
            device: device.to_string(),
            credits,
            ops: VecDeque::new(),
            next_seq: first_seq % SEQ_LIMIT,
            since_signal: 0,
            tail_signalled: true,
            fence: false,
            flushes: Vec::new(),
            failure: None,
        }
    }

    /// Names the endpoint in errors from now on (the device and, once
    /// connected, the peer).
    pub fn rename(&mut self, name: &str) {
        self.device = name.to_string();
    }

    /// Posts still allowed in flight.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Operations posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.ops.len()
    }

    /// Why the endpoint failed, if it did.
    pub fn failure(&self) -> Option<&UctError> {
        self.failure.as_ref()
    }

    /// Whether a post may go now: the failure if the endpoint failed,
    /// `Ok(false)` when out of credits (NoResource).
    pub fn ready(&self) -> Result<bool> {
        match &self.failure {
            Some(e) => Err(e.clone()),
            None => Ok(self.credits > 0),
        }
    }

    /// How to post the next work request; takes a pending fence. Call only
    /// when `ready()` said yes, then `post` it, or `abandon` it if verbs
    /// refused it.
    pub fn plan(&mut self, signal: Signal) -> Plan {
        let signalled = signal == Signal::Always
            || self.since_signal + 1 >= MODERATION
            || self.credits <= MODERATION;
        Plan {
            seq: self.next_seq,
            signalled,
            fenced: std::mem::take(&mut self.fence),
        }
    }

    /// How to post a keepalive: signalled, and leaving a pending fence to
    /// the next real post (a fenced keepalive would not order it).
    pub fn plan_keepalive(&self) -> Plan {
        Plan {
            seq: self.next_seq,
            signalled: true,
            fenced: false,
        }
    }

    /// Whether the last post was signalled (true when nothing is
    /// outstanding): if not, a live peer's completions of the posts since
    /// the last signalled one never become visible.
    pub fn tail_signalled(&self) -> bool {
        self.tail_signalled
    }

    /// The bytes of the operations up to and including the first
    /// signalled one outstanding (all of them when none is): what must move
    /// before the next completion can be seen.
    pub fn bytes_ahead(&self) -> u64 {
        let mut bytes = 0u64;
        for posted in &self.ops {
            bytes = bytes.saturating_add(posted.op.bytes);
            if posted.signalled {
                break;
            }
        }
        bytes
    }

    /// A planned post that was not made: its fence is pending again.
    pub fn abandon(&mut self, plan: Plan) {
        if plan.fenced {
            self.fence = true;
        }
    }

    /// Records the post of `op` as `plan` said. Returns whether it is the
    /// only operation outstanding (a peer timeout counts from it).
    pub fn post(&mut self, plan: Plan, op: TxOp<T>) -> bool {
        debug_assert_eq!(plan.seq, self.next_seq, "posts follow their plans in order");
        debug_assert!(self.credits > 0, "posted without a credit");
        self.next_seq = (plan.seq + 1) % SEQ_LIMIT;
        self.since_signal = if plan.signalled {
            0
        } else {
            self.since_signal + 1
        };
        self.tail_signalled = plan.signalled;
        self.credits = self.credits.saturating_sub(1);
        self.ops.push_back(Posted {
            seq: plan.seq,
            signalled: plan.signalled,
            op,
        });
        self.ops.len() == 1
    }

    /// Where operation `wr_id` is in the queue.
    fn position(&self, wr_id: u64) -> Option<usize> {
        let front = self.ops.front()?.seq;
        let offset = (wr_id.wrapping_sub(front) % SEQ_LIMIT) as usize;
        (wr_id < SEQ_LIMIT && offset < self.ops.len()).then_some(offset)
    }

    /// Handles the completion of work request `wr_id`, pushing what to do
    /// onto `events`.
    pub fn complete(
        &mut self,
        wr_id: u64,
        status: &WcStatus,
        opcode: WcOpcode,
        events: &mut Vec<TxEvent<T, F>>,
    ) {
        if self.failure.is_some() {
            // Draining: whatever its status, the completion says the NIC is
            // done with this operation and every one before it.
            self.release_through(wr_id, events);
            return;
        }
        if let WcStatus::Failed {
            name,
            code,
            vendor_err,
        } = status
        {
            let what = self
                .position(wr_id)
                .map_or("an operation", |i| self.ops[i].op.what);
            let error = UctError::EndpointFailed(format!(
                "rc {}: {what} failed with work completion status {name} ({code}), vendor error {vendor_err:#x}",
                self.device
            ));
            self.fail(error, events);
            self.release_through(wr_id, events);
            return;
        }
        let Some(last) = self.position(wr_id) else {
            events.push(TxEvent::Stray { wr_id });
            return;
        };
        for index in 0..=last {
            let Some(posted) = self.ops.pop_front() else {
                break;
            };
            self.credits += 1;
            let named = index == last;
            if named && opcode != posted.op.expect {
                let error = UctError::Protocol(format!(
                    "rc {}: {} completed with opcode {opcode}, expected {}",
                    self.device, posted.op.what, posted.op.expect
                ));
                events.push(TxEvent::Failed {
                    payload: posted.op.payload,
                    error: error.clone(),
                });
                self.fail(error, events);
                return;
            }
            events.push(TxEvent::Done {
                payload: posted.op.payload,
                named,
            });
        }
        if self.ops.is_empty() {
            self.tail_signalled = true;
            if !self.flushes.is_empty() {
                events.extend(self.flushes.drain(..).map(TxEvent::Flushed));
            }
        }
    }

    /// The common completion, on its own path: the successful completion,
    /// with the opcode expected, of an operation outstanding, no flush
    /// waiting on the last of the operations it completes. Returns how many
    /// operations it completes (the front one through `wr_id`; take each
    /// with [`pop_completed`](Self::pop_completed), the last is the one the
    /// completion names), or None, having changed nothing, when any of that
    /// does not hold: then [`complete`](Self::complete) handles it. Nothing
    /// goes through an event list.
    pub fn complete_run(&mut self, wr_id: u64, opcode: WcOpcode) -> Option<usize> {
        if self.failure.is_some() {
            return None;
        }
        let last = self.position(wr_id)?;
        if self.ops[last].op.expect != opcode
            || (self.ops.len() == last + 1 && !self.flushes.is_empty())
        {
            return None;
        }
        Some(last + 1)
    }

    /// Takes the front operation of a run [`complete_run`](Self::complete_run)
    /// counted: done, its credit back.
    pub fn pop_completed(&mut self) -> Option<T> {
        let posted = self.ops.pop_front()?;
        self.credits += 1;
        if self.ops.is_empty() {
            self.tail_signalled = true;
        }
        Some(posted.op.payload)
    }

    /// After a failure: the operations up to `wr_id` (if it is outstanding)
    /// are done with, and fail; once none is left, so do the flushes.
    fn release_through(&mut self, wr_id: u64, events: &mut Vec<TxEvent<T, F>>) {
        let count = self.position(wr_id).map_or(0, |i| i + 1);
        self.release(count, events);
    }

    fn release(&mut self, count: usize, events: &mut Vec<TxEvent<T, F>>) {
        let Some(error) = self.failure.clone() else {
            return;
        };
        for posted in self.ops.drain(..count) {
            self.credits += 1;
            events.push(TxEvent::Failed {
                payload: posted.op.payload,
                error: error.clone(),
            });
        }
        if self.ops.is_empty() {
            self.tail_signalled = true;
            for flush in self.flushes.drain(..) {
                events.push(TxEvent::FlushFailed(flush, error.clone()));
            }
        }
    }

    /// Fails the endpoint with `error` (the first failure is the one
    /// kept). Operations still outstanding fail as their completions come
    /// back ([`complete`](Self::complete)), or at [`give_up`](Self::give_up);
    /// waiting flushes fail once none is left.
    pub fn fail(&mut self, error: UctError, events: &mut Vec<TxEvent<T, F>>) {
        self.failure.get_or_insert(error);
        self.release(0, events);
    }

    /// After a failure, stops waiting for completions: every operation
    /// still outstanding, and every flush, fails now. The I/O layer keeps
    /// their memory until the QP is destroyed.
    pub fn give_up(&mut self, events: &mut Vec<TxEvent<T, F>>) {
        let count = self.ops.len();
        self.release(count, events);
    }

    /// Orders the next post after every one before it.
    pub fn fence(&mut self) -> Result<()> {
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        self.fence = true;
        Ok(())
    }

    /// What a flush needs now. After a failure, a flush waits while
    /// operations are still in the NIC (their memory is not free to reuse
    /// before their flushed completions), then fails: the failure is
    /// returned only when nothing is outstanding.
    pub fn flush(&self) -> Result<FlushNeed> {
        if let Some(e) = &self.failure {
            if self.ops.is_empty() {
                return Err(e.clone());
            }
            return Ok(FlushNeed::Wait);
        }
        Ok(if self.ops.is_empty() {
            FlushNeed::Done
        } else if self.tail_signalled {
            FlushNeed::Wait
        } else if self.credits == 0 {
            FlushNeed::NoResource
        } else {
            FlushNeed::SignalTail
        })
    }

    /// A flush to complete when nothing is outstanding any more (to fail
    /// then, after a failure).
    pub fn add_flush(&mut self, flush: F) {
        self.flushes.push(flush);
    }
}

#[cfg(test)]
mod tests;
