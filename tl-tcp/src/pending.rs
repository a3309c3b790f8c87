//! The requests this side sent on a link and what their answers complete,
//! without I/O. Request ids carry the endpoint in their high bits and a
//! per-link sequence number below; the peer executes requests in order and
//! answers in order, so a reply to request n means every request before n
//! was executed and any refusal (Nack) of it has arrived. A Nack is taken
//! only for a request that was sent, by the endpoint the Nack names, and
//! may still be refused; anything else a peer answers is a protocol error
//! that closes the link. A get reply must carry exactly the bytes asked
//! for, or that get fails. A put with immediate data is answered whether
//! it was done or refused: its completion takes the answer, or, without
//! one, the endpoint's next flush takes a refusal, as for a plain put.
//! Gets in flight are capped, in number and in bytes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use uct_core::{Completion, CompletionData, MemHandle, UctError};

use crate::iface::MAX_ZCOPY;
use crate::wire::Header;

type Result<T, E = UctError> = std::result::Result<T, E>;

/// Most bytes of gets in flight on one link (one get of any size is always
/// allowed).
pub(crate) const MAX_GET_BYTES_IN_FLIGHT: usize = MAX_ZCOPY;
/// Most requests awaiting a reply on one link.
pub(crate) const MAX_PENDING: usize = 1 << 16;

/// Runs of request owners (see `Requests::owners`) above which the link
/// sends a flush of its own, whose answer lets it forget the older ones.
const OWNER_RUNS_SYNC: usize = 4096;

const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const EP_MAX: u32 = 0xff_ffff;

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
    /// A put with immediate data of endpoint `ep`.
    PutImm { ep: u32, comp: Option<Completion> },
}

impl PendingOp {
    /// Completes the operation with `result` (no data).
    fn finish(self, result: Result<()>) {
        match self {
            PendingOp::GetBytes(comp) | PendingOp::Atomic(comp) => comp.finish(result),
            PendingOp::GetIov(_, comp)
            | PendingOp::Flush { comp, .. }
            | PendingOp::PutImm { comp, .. } => {
                if let Some(comp) = comp {
                    comp.finish(result)
                }
            }
        }
    }
}

/// A request waiting for its reply, when it was sent, and the bytes it
/// asked for (gets).
struct Pending {
    op: PendingOp,
    since: Instant,
    get_bytes: usize,
}

fn req_id(ep: u32, seq: u64) -> u64 {
    ((ep as u64) << SEQ_BITS) | (seq & SEQ_MASK)
}

fn req_ep(req: u64) -> u32 {
    (req >> SEQ_BITS) as u32
}

fn req_seq(req: u64) -> u64 {
    req & SEQ_MASK
}

/// The requests of one link.
pub(crate) struct Requests {
    pending: HashMap<u64, Pending>,
    get_bytes: usize,
    next_seq: u64,
    /// The peer answered a request of this sequence number: it executed
    /// every one before, and refused those it refused.
    answered_seq: u64,
    next_ep: u32,
    /// Every endpoint id was handed out once: any may be live.
    eps_wrapped: bool,
    /// Refusals of requests without a reply of their own (put, add), by
    /// endpoint; returned by that endpoint's next flush.
    nacks: HashMap<u32, UctError>,
    /// The endpoints not yet gone: only theirs are refusals kept for.
    live: HashSet<u32>,
    /// Which endpoint sent each request not yet known executed: runs of
    /// consecutive sequence numbers as (first, endpoint), oldest first, so
    /// that a Nack is taken only for the endpoint whose request it names.
    /// Runs before the last answered request are dropped.
    owners: VecDeque<(u64, u32)>,
    /// The link's own flush that lets it forget old runs, while it waits
    /// for its answer.
    sync: Option<u64>,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            pending: HashMap::new(),
            get_bytes: 0,
            next_seq: 1,
            answered_seq: 0,
            next_ep: 1,
            eps_wrapped: false,
            nacks: HashMap::new(),
            live: HashSet::new(),
            owners: VecDeque::new(),
            sync: None,
        }
    }
}

impl Requests {
    /// A new endpoint id.
    pub(crate) fn new_ep_id(&mut self) -> u32 {
        let id = self.next_ep;
        self.live.insert(id);
        if id == EP_MAX {
            self.eps_wrapped = true;
            self.next_ep = 1;
        } else {
            self.next_ep += 1;
        }
        id
    }

    /// Forgets what endpoint `ep` had to be told (it is gone).
    pub(crate) fn forget_ep(&mut self, ep: u32) {
        self.nacks.remove(&ep);
        self.live.remove(&ep);
    }

    /// Keeps a refusal for endpoint `ep`'s next flush, unless it is gone.
    fn keep_nack(&mut self, ep: u32, e: UctError) {
        if self.live.contains(&ep) {
            self.nacks.entry(ep).or_insert(e);
        }
    }

    /// The id of the next request of endpoint `ep`; the caller sends it
    /// before another request is numbered, so ids go out in order.
    pub(crate) fn next_req(&mut self, ep: u32) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.owners.back().map(|&(_, owner)| owner) != Some(ep) {
            self.owners.push_back((seq, ep));
        }
        req_id(ep, seq)
    }

    /// Whether the link should send a flush of its own (endpoint 0, which
    /// no Nack may name) before its next request: the runs of owners grew
    /// long (endpoints taking turns with requests that have no reply) and
    /// no such flush is on its way.
    pub(crate) fn needs_sync(&self) -> bool {
        self.sync.is_none() && self.owners.len() >= OWNER_RUNS_SYNC && self.has_room(0)
    }

    /// Numbers and records the link's own flush; the caller sends it.
    pub(crate) fn add_sync(&mut self) -> u64 {
        let req = self.next_req(0);
        self.add(req, PendingOp::Flush { ep: 0, comp: None }, 0);
        self.sync = Some(req);
        req
    }

    /// The endpoint that sent request number `seq`, while it is recorded.
    fn owner(&self, seq: u64) -> Option<u32> {
        let after = self.owners.partition_point(|&(first, _)| first <= seq);
        after.checked_sub(1).map(|i| self.owners[i].1)
    }

    /// Whether another request (a get of `get_bytes`, or 0) may be sent now;
    /// false: NoResource until replies come.
    pub(crate) fn has_room(&self, get_bytes: usize) -> bool {
        self.pending.len() < MAX_PENDING
            && (get_bytes == 0
                || self.get_bytes == 0
                || self.get_bytes + get_bytes <= MAX_GET_BYTES_IN_FLIGHT)
    }

    /// Records a request that waits for its reply.
    pub(crate) fn add(&mut self, req: u64, op: PendingOp, get_bytes: usize) {
        self.get_bytes += get_bytes;
        self.pending.insert(
            req,
            Pending {
                op,
                since: Instant::now(),
                get_bytes,
            },
        );
    }

    /// Bytes the get `req` asked for (0 when it is not a pending get).
    pub(crate) fn get_len(&self, req: u64) -> usize {
        self.pending.get(&req).map_or(0, |p| p.get_bytes)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// When the oldest request waiting for a reply was sent, and whether it
    /// is a put with immediate data (which waits for the receiver to
    /// connect back).
    pub(crate) fn oldest(&self) -> Option<(Instant, bool)> {
        self.pending
            .values()
            .min_by_key(|p| p.since)
            .map(|p| (p.since, matches!(p.op, PendingOp::PutImm { .. })))
    }

    /// Fails every request waiting for a reply.
    pub(crate) fn fail_all(&mut self, err: &UctError) {
        for (_, pending) in self.pending.drain() {
            pending.op.finish(Err(err.clone()));
        }
        self.get_bytes = 0;
        self.owners.clear();
        self.sync = None;
    }

    /// The request a reply answers, and the bytes it asked for (gets).
    fn take(&mut self, req: u64) -> Result<(PendingOp, usize)> {
        let p = self
            .pending
            .remove(&req)
            .ok_or_else(|| UctError::Protocol(format!("reply to unknown request {req}")))?;
        self.get_bytes -= p.get_bytes;
        self.answered_seq = self.answered_seq.max(req_seq(req));
        if self.sync == Some(req) {
            self.sync = None;
        }
        // Every request up to answered_seq was executed: no Nack may come
        // for them, so their owners are forgotten (the last run stays, it
        // may go on).
        while self.owners.len() > 1 && self.owners[1].0 <= self.answered_seq + 1 {
            self.owners.pop_front();
        }
        Ok((p.op, p.get_bytes))
    }

    /// Whether a Nack of `req` may be true: the request was sent, by the
    /// endpoint it names, not answered otherwise, and no later request was
    /// answered yet.
    fn nack_fits(&self, req: u64) -> bool {
        let (ep, seq) = (req_ep(req), req_seq(req));
        let ep_known = ep != 0 && ep <= EP_MAX && (self.eps_wrapped || ep < self.next_ep);
        ep_known
            && seq > self.answered_seq
            && seq < self.next_seq
            && self.owner(seq) == Some(ep)
            && !self.pending.contains_key(&req)
    }

    /// Completes the request a reply answers. An answer to nothing is a
    /// protocol error.
    pub(crate) fn on_reply(&mut self, header: Header, data: Vec<u8>) -> Result<()> {
        let mismatch = |what: &str| UctError::Protocol(format!("{what} reply to another request"));
        match header {
            Header::GetReply { req, error } => match self.take(req)? {
                (PendingOp::GetBytes(comp), asked) => match error {
                    Some(e) => comp.finish(Err(e.into())),
                    None if data.len() != asked => comp.finish(Err(UctError::Protocol(format!(
                        "get reply has {} bytes, {asked} asked for",
                        data.len()
                    )))),
                    None => {
                        comp.set_data(CompletionData::Bytes(data));
                        comp.finish(Ok(()));
                    }
                },
                (PendingOp::GetIov(iov, comp), _) => {
                    let result = match error {
                        Some(e) => Err(e.into()),
                        None => scatter(&iov, &data),
                    };
                    if let Some(comp) = comp {
                        comp.finish(result);
                    }
                }
                (other, _) => {
                    other.finish(Err(mismatch("get")));
                    return Err(mismatch("get"));
                }
            },
            Header::AtomicReply { req, old, error } => match self.take(req)?.0 {
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
            },
            Header::FlushReply { req } => match self.take(req)?.0 {
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
            },
            Header::PutImmReply { req, error } => match self.take(req)?.0 {
                PendingOp::PutImm { ep, comp } => match (error, comp) {
                    (None, Some(comp)) => comp.finish(Ok(())),
                    (None, None) => {}
                    (Some(e), Some(comp)) => comp.finish(Err(e.into())),
                    (Some(e), None) => {
                        // Nobody waits for this put: its refusal goes to the
                        // endpoint's next flush, as a plain put's does.
                        self.keep_nack(ep, e.into());
                    }
                },
                other => {
                    other.finish(Err(mismatch("put with immediate data")));
                    return Err(mismatch("put with immediate data"));
                }
            },
            Header::Nack { req, error } => {
                if !self.nack_fits(req) {
                    return Err(UctError::Protocol(format!(
                        "a Nack of request {req}, which this side did not send or the peer already answered"
                    )));
                }
                let e: UctError = error.into();
                log::debug!("tcp: the peer refused request {req}: {e}");
                self.keep_nack(req_ep(req), e);
            }
            other => {
                return Err(UctError::Protocol(format!(
                    "{} where only a reply fits",
                    crate::hello::frame_name(&other)
                )))
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WireError;

    fn nack(req: u64) -> Header {
        Header::Nack {
            req,
            error: WireError::BadSecret,
        }
    }

    fn flush(r: &mut Requests, ep: u32) -> (u64, Completion) {
        let comp = Completion::new();
        let req = r.next_req(ep);
        let op = PendingOp::Flush {
            ep,
            comp: Some(comp.clone()),
        };
        r.add(req, op, 0);
        (req, comp)
    }

    #[test]
    fn a_nack_of_a_put_sent_and_not_yet_flushed_fails_that_endpoints_flush() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        let put = r.next_req(ep);
        r.on_reply(nack(put), vec![]).unwrap();
        let (f, comp) = flush(&mut r, ep);
        r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
        assert_eq!(comp.result(), Err(UctError::BadSecret));
    }

    #[test]
    fn nacks_of_requests_never_sent_already_answered_or_awaiting_a_reply_are_refused() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        let put = r.next_req(ep);
        // Never sent: a later sequence number, another endpoint, endpoint 0.
        assert!(r.on_reply(nack(put + 1), vec![]).is_err());
        assert!(r
            .on_reply(nack(req_id(ep + 1, req_seq(put))), vec![])
            .is_err());
        assert!(r.on_reply(nack(req_id(0, req_seq(put))), vec![]).is_err());
        // Awaiting its own reply: a flush is answered, never refused.
        let (f, comp) = flush(&mut r, ep);
        assert!(r.on_reply(nack(f), vec![]).is_err());
        r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
        assert_eq!(comp.result(), Ok(()));
        // Answered: the flush after the put came back, so the put is done.
        assert!(r.on_reply(nack(put), vec![]).is_err());
        // A reply to nothing.
        assert!(r.on_reply(Header::FlushReply { req: f }, vec![]).is_err());
        assert!(r.on_reply(Header::Am { id: 1 }, vec![]).is_err());
    }

    #[test]
    fn many_nacks_of_one_endpoint_keep_one_refusal() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        let reqs: Vec<u64> = (0..1000).map(|_| r.next_req(ep)).collect();
        for req in reqs {
            r.on_reply(nack(req), vec![]).unwrap();
        }
        assert_eq!(r.nacks.len(), 1);
        r.forget_ep(ep);
        assert!(r.nacks.is_empty());
    }

    #[test]
    fn refusals_for_a_forgotten_endpoint_are_not_kept() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        let put = r.next_req(ep);
        let put_imm = r.next_req(ep);
        r.add(put_imm, PendingOp::PutImm { ep, comp: None }, 0);
        r.forget_ep(ep);
        r.on_reply(nack(put), vec![]).unwrap();
        let refused = Header::PutImmReply {
            req: put_imm,
            error: Some(WireError::BadSecret),
        };
        r.on_reply(refused, vec![]).unwrap();
        assert!(r.nacks.is_empty(), "a refusal kept for a gone endpoint");
    }

    #[test]
    fn gets_in_flight_are_capped_in_bytes_and_requests_in_number() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        // One get of any size is allowed alone.
        assert!(r.has_room(MAX_GET_BYTES_IN_FLIGHT * 2));
        let get = |r: &mut Requests, len| {
            let req = r.next_req(ep);
            r.add(req, PendingOp::GetBytes(Completion::new()), len);
            req
        };
        let a = get(&mut r, MAX_GET_BYTES_IN_FLIGHT / 2);
        assert!(r.has_room(MAX_GET_BYTES_IN_FLIGHT / 2));
        let b = get(&mut r, MAX_GET_BYTES_IN_FLIGHT / 2);
        assert!(!r.has_room(1));
        assert!(r.has_room(0), "requests that are not gets still go");
        r.on_reply(
            Header::GetReply {
                req: a,
                error: Some(WireError::BadSecret),
            },
            vec![],
        )
        .unwrap();
        assert!(r.has_room(MAX_GET_BYTES_IN_FLIGHT / 2));
        r.fail_all(&UctError::Canceled("test".into()));
        assert!(r.is_empty());
        assert!(r.has_room(MAX_GET_BYTES_IN_FLIGHT));
        let _ = b;
        for _ in 0..MAX_PENDING {
            flush(&mut r, ep);
        }
        assert!(!r.has_room(0));
    }

    fn get_bytes(r: &mut Requests, ep: u32, len: usize) -> (u64, Completion) {
        let comp = Completion::new();
        let req = r.next_req(ep);
        r.add(req, PendingOp::GetBytes(comp.clone()), len);
        (req, comp)
    }

    #[test]
    fn a_get_bcopy_reply_of_another_length_fails_that_get() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        let ok = |req| Header::GetReply { req, error: None };
        let (short, short_comp) = get_bytes(&mut r, ep, 64);
        r.on_reply(ok(short), vec![7; 10]).unwrap();
        let e = short_comp.result().unwrap_err();
        assert!(
            matches!(&e, UctError::Protocol(m) if m.contains("10 bytes") && m.contains("64")),
            "{e}"
        );
        assert!(
            short_comp.take_data().is_none(),
            "a short reply's bytes were delivered"
        );
        let (long, long_comp) = get_bytes(&mut r, ep, 4);
        r.on_reply(ok(long), vec![7; 5]).unwrap();
        assert!(matches!(long_comp.result(), Err(UctError::Protocol(_))));
        let (exact, exact_comp) = get_bytes(&mut r, ep, 3);
        r.on_reply(ok(exact), vec![1, 2, 3]).unwrap();
        assert_eq!(exact_comp.result(), Ok(()));
        assert!(matches!(exact_comp.take_data(), Some(CompletionData::Bytes(b)) if b == [1, 2, 3]));
    }

    #[test]
    fn a_nack_naming_another_endpoints_request_is_refused() {
        let mut r = Requests::default();
        let (a, b) = (r.new_ep_id(), r.new_ep_id());
        // a's put, then b's flush: b sent nothing the peer may refuse.
        let put = r.next_req(a);
        let (f, comp) = flush(&mut r, b);
        let misattributed = req_id(b, req_seq(put));
        assert!(
            r.on_reply(nack(misattributed), vec![]).is_err(),
            "a Nack of a's put under b's id was taken"
        );
        r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
        assert_eq!(comp.result(), Ok(()), "b's flush failed for a's put");
        // The Nack of a's put under its own id still counts for a.
        let put = r.next_req(a);
        r.on_reply(nack(put), vec![]).unwrap();
        let (f, comp) = flush(&mut r, a);
        r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
        assert_eq!(comp.result(), Err(UctError::BadSecret));
    }

    #[test]
    fn owners_of_endpoints_taking_turns_stay_bounded_through_the_links_own_flush() {
        let mut r = Requests::default();
        let (a, b) = (r.new_ep_id(), r.new_ep_id());
        let mut synced = 0;
        for i in 0..20_000 {
            if r.needs_sync() {
                let f = r.add_sync();
                // A Nack never names the link's own flush (endpoint 0).
                assert!(r.on_reply(nack(f), vec![]).is_err());
                r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
                synced += 1;
            }
            r.next_req(if i % 2 == 0 { a } else { b });
        }
        assert!(synced >= 4, "{synced} syncs");
        assert!(r.owners.len() <= OWNER_RUNS_SYNC, "{} runs", r.owners.len());
        assert!(r.is_empty());
        // The last requests can still be refused, each for its own endpoint.
        let put = r.next_req(a);
        assert!(r.on_reply(nack(req_id(b, req_seq(put))), vec![]).is_err());
        r.on_reply(nack(put), vec![]).unwrap();
    }

    fn put_imm(r: &mut Requests, ep: u32, comp: Option<&Completion>) -> u64 {
        let req = r.next_req(ep);
        let op = PendingOp::PutImm {
            ep,
            comp: comp.cloned(),
        };
        r.add(req, op, 0);
        req
    }

    #[test]
    fn a_put_imm_completes_with_its_answer_and_a_refusal_without_a_waiter_goes_to_the_flush() {
        let mut r = Requests::default();
        let ep = r.new_ep_id();
        let reply = |req, error| Header::PutImmReply { req, error };
        let (ok, refused) = (Completion::new(), Completion::new());
        let (a, b) = (
            put_imm(&mut r, ep, Some(&ok)),
            put_imm(&mut r, ep, Some(&refused)),
        );
        r.on_reply(reply(a, None), vec![]).unwrap();
        r.on_reply(reply(b, Some(WireError::BadSecret)), vec![])
            .unwrap();
        assert_eq!(ok.result(), Ok(()));
        assert_eq!(refused.result(), Err(UctError::BadSecret));
        // Answered with a completion: the next flush owes nothing.
        let (f, comp) = flush(&mut r, ep);
        r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
        assert_eq!(comp.result(), Ok(()));
        // Without a completion, the refusal is the next flush's.
        let c = put_imm(&mut r, ep, None);
        let denied = WireError::AccessDenied {
            needed: 2,
            granted: 1,
        };
        r.on_reply(reply(c, Some(denied)), vec![]).unwrap();
        let (f, comp) = flush(&mut r, ep);
        r.on_reply(Header::FlushReply { req: f }, vec![]).unwrap();
        assert!(matches!(comp.result(), Err(UctError::AccessDenied { .. })));
        // A put with immediate data awaits its own answer: a Nack of it, a
        // second answer, or an answer of the wrong kind is refused.
        let d = put_imm(&mut r, ep, None);
        assert!(r.on_reply(nack(d), vec![]).is_err());
        assert!(r.on_reply(Header::FlushReply { req: d }, vec![]).is_err());
        let e = put_imm(&mut r, ep, None);
        r.on_reply(reply(e, None), vec![]).unwrap();
        assert!(r.on_reply(reply(e, None), vec![]).is_err());
        let (f, _) = flush(&mut r, ep);
        assert!(r.on_reply(reply(f, None), vec![]).is_err());
    }

    #[test]
    fn endpoint_ids_wrap_and_stay_known() {
        let mut r = Requests {
            next_ep: EP_MAX,
            ..Default::default()
        };
        assert_eq!(r.new_ep_id(), EP_MAX);
        assert_eq!(r.new_ep_id(), 1);
        let put = r.next_req(EP_MAX);
        r.on_reply(nack(put), vec![]).unwrap();
    }
}
