//! Stripes: the pieces of a write or read over several rails, and what
//! their completions report (see `rails.rs` for the design).
//!
//! A stripe holds one start of its target completion (the operation's, or
//! for a notified write the completion its notification waits for), and
//! finishes it once, whichever attempt settles it: the first to land, or
//! the peer's refusal. An attempt whose rail failed settles as "post
//! again", and a new attempt on another rail carries the start on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use uct_core::{Completion, UctError};

use crate::engine::{Dir, Op, Part};
use crate::error::{Result, TransferError};
use crate::key::RemoteBuffer;
use crate::memory::Memory;
use crate::rails::{is_rail_failure, lock, Rails};
use crate::stats::Counters;

/// What stripe completions report to the rails, under the Transport's
/// lock but outside the engines.
#[derive(Default)]
pub(crate) struct Events {
    /// Stripes that ended with an endpoint's failure, and the error: the
    /// next turn decides whether their rail died (post again) or the peer
    /// refused them (the error stands).
    pub suspects: Vec<(Arc<Stripe>, UctError)>,
}

/// One write or read of an operation, before it is cut in stripes.
pub(crate) struct PartReq {
    pub dir: Dir,
    pub mem: Memory,
    /// Offset of the view in `mem`.
    pub offset: usize,
    pub len: usize,
    pub remote: RemoteBuffer,
    pub tag: Option<u32>,
}

/// What a stripe moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Move(Dir),
    /// A flush of its rail: done once what the rail carried before it is.
    Flush,
}

/// One attempt at a stripe.
pub(crate) struct Stripe {
    pub kind: Kind,
    pub mem: Option<Memory>,
    pub offset: usize,
    pub len: usize,
    pub remote: Option<RemoteBuffer>,
    /// The notification it carries itself: a notified write sent whole,
    /// on the primary rail (the immediate of its put, on tcp and rc).
    pub tag: Option<u32>,
    /// What it finishes once it has landed.
    pub target: Completion,
    pub rail: usize,
    settled: AtomicBool,
}

impl Stripe {
    /// Claims the right to settle this attempt; false if settled already.
    pub(crate) fn settle(&self) -> bool {
        !self.settled.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// A new attempt of the same stripe on rail `rail`.
    pub(crate) fn moved_to(&self, rail: usize) -> Arc<Stripe> {
        Arc::new(Stripe {
            kind: self.kind,
            mem: self.mem.clone(),
            offset: self.offset,
            len: self.len,
            remote: self.remote.clone(),
            tag: self.tag,
            target: self.target.clone(),
            rail,
            settled: AtomicBool::new(false),
        })
    }
}

/// Sizes of the stripes of `len` bytes over rails of `weights`: in
/// proportion, in multiples of 64 bytes, the last taking the rest; rails
/// whose share is empty get none (0-byte entries).
pub(crate) fn split(len: usize, weights: &[f64]) -> Vec<usize> {
    let total: f64 = weights.iter().sum();
    let mut out = Vec::with_capacity(weights.len());
    let mut left = len;
    for (i, w) in weights.iter().enumerate() {
        let share = if i + 1 == weights.len() || total <= 0.0 {
            left
        } else {
            let raw = (len as f64 * w / total) as usize;
            (raw & !63).min(left)
        };
        out.push(share);
        left -= share;
    }
    if total <= 0.0 {
        // Unreachable with the weights rails make; keep all bytes.
        out.iter_mut().for_each(|s| *s = 0);
        if let Some(last) = out.last_mut() {
            *last = len;
        }
    }
    out
}

/// Posts an operation over several rails: each part cut in stripes, a
/// notified write's notification queued on the primary rail behind its
/// stripes, and with `flush` a flush of every rail. Everything is checked
/// before anything is posted.
pub(crate) fn submit(
    rails: &mut Rails,
    parts: Vec<PartReq>,
    flush: bool,
    comp: &Completion,
    counters: &Counters,
) -> Result<()> {
    let up = rails.up();
    if up.is_empty() {
        return Err(TransferError::PeerFailed {
            source: UctError::EndpointFailed("every rail is out of service".into()),
        });
    }
    // The memory and the key must serve every rail in service.
    for p in &parts {
        for &i in &up {
            check_rail(rails, i, p.mem.clone(), &p.remote)?;
        }
    }
    // Held while posting, so that the operation cannot end between pieces.
    comp.start();
    for p in parts {
        match p.dir {
            Dir::Write => {
                Counters::add(&counters.writes, 1);
                Counters::add(&counters.bytes_written, p.len as u64);
            }
            Dir::Read => Counters::add(&counters.reads, 1),
        }
        let notified = p.tag.filter(|_| p.dir == Dir::Write);
        let small = p.len < rails.stripe_min || up.len() < 2;
        let stripes = match notified {
            // Sent whole on the primary rail as one put with immediate, in
            // order with the other notifications.
            Some(tag) if small && by_one_imm(rails, p.len) => {
                Counters::add(&counters.sent_imm, 1);
                comp.start();
                vec![stripe_of(&p, rails.primary, 0, p.len, Some(tag), comp)]
            }
            // Its stripes (one below the stripe minimum), then its
            // notification on the primary rail once every one has landed.
            Some(tag) => {
                Counters::add(&counters.sent_msg, 1);
                let landed = Completion::new();
                let stripes = plan(rails, &up, &p, &landed);
                comp.start();
                let primary = rails.primary;
                match rails.rails.get_mut(primary).and_then(|r| r.engine()) {
                    Some(e) => e.queue_notice(landed, comp.clone(), tag, p.len),
                    None => comp.finish(Err(UctError::EndpointFailed(
                        "the primary rail is out of service".into(),
                    ))),
                }
                stripes
            }
            None => plan(rails, &up, &p, comp),
        };
        for s in stripes {
            if let Err(e) = post(rails, &s) {
                if s.settle() {
                    s.target.finish(Err(UctError::InvalidParam(e.to_string())));
                }
            }
        }
    }
    if flush {
        for &i in &up {
            comp.start();
            let s = Arc::new(Stripe {
                kind: Kind::Flush,
                mem: None,
                offset: 0,
                len: 0,
                remote: None,
                tag: None,
                target: comp.clone(),
                rail: i,
                settled: AtomicBool::new(false),
            });
            if let Err(e) = post(rails, &s) {
                if s.settle() {
                    comp.finish(Err(UctError::InvalidParam(e.to_string())));
                }
            }
        }
    }
    comp.finish(Ok(()));
    Ok(())
}

/// Whether a notified write of `len` bytes goes whole as one put with
/// immediate: only where the transport notifies by immediate and `len`
/// fits one put on every rail (so on any it is posted again on). Anything
/// else the engine would notify itself (a flush then its own queued
/// message, or a fence then a message that skips the queue): a rail
/// failure would then both move that notification and post the write
/// again (two notifications), or a message could overtake an earlier
/// striped write's. So it goes as a plain stripe whose notification the
/// rails queue, like a striped write's.
fn by_one_imm(rails: &Rails, len: usize) -> bool {
    rails.notify == crate::engine::NotifyPath::Immediate && len <= rails.imm_max
}

/// A stripe of `p`: `len` bytes from `at`, on `rail`. The caller has
/// started `target` for it.
fn stripe_of(
    p: &PartReq,
    rail: usize,
    at: usize,
    len: usize,
    tag: Option<u32>,
    target: &Completion,
) -> Arc<Stripe> {
    Arc::new(Stripe {
        kind: Kind::Move(p.dir),
        mem: Some(p.mem.clone()),
        offset: p.offset + at,
        len,
        remote: p.remote.slice(at, len).ok(),
        tag,
        target: target.clone(),
        rail,
        settled: AtomicBool::new(false),
    })
}

/// The stripes of part `p` (not notified by itself), each holding a start
/// of `target`: one, on the next rail in turn, below the stripe minimum;
/// else one per rail in service, in proportion to their weights.
fn plan(rails: &mut Rails, up: &[usize], p: &PartReq, target: &Completion) -> Vec<Arc<Stripe>> {
    let make = |rail: usize, at: usize, len: usize| {
        target.start();
        stripe_of(p, rail, at, len, None, target)
    };
    if p.len < rails.stripe_min || up.len() < 2 {
        // Nothing to move for 0 bytes (a notified one has its notice).
        if p.len == 0 {
            return Vec::new();
        }
        let rail = up[rails.next % up.len()];
        rails.next = rails.next.wrapping_add(1);
        return vec![make(rail, 0, p.len)];
    }
    let weights: Vec<f64> = up.iter().map(|&i| rails.rails[i].weight).collect();
    let mut at = 0;
    let mut out = Vec::with_capacity(up.len());
    for (&rail, size) in up.iter().zip(split(p.len, &weights)) {
        if size > 0 {
            out.push(make(rail, at, size));
        }
        at += size;
    }
    out
}

/// Checks that `mem` is registered with rail `i` and `remote`'s key has
/// an entry for it.
fn check_rail(rails: &Rails, i: usize, mem: Memory, remote: &RemoteBuffer) -> Result<()> {
    let r = &rails.rails[i];
    mem.handle_for(&r.target.md)?;
    remote.rkey_for(i, rails.rails.len(), &rails.component, &r.md)?;
    Ok(())
}

/// Posts attempt `s` on its rail, with a completion that settles it.
pub(crate) fn post(rails: &mut Rails, s: &Arc<Stripe>) -> Result<()> {
    let n = rails.rails.len();
    let component = rails.component.clone();
    let events = rails.events.clone();
    let rail = rails
        .rails
        .get_mut(s.rail)
        .ok_or_else(|| TransferError::Config(format!("there is no rail {}", s.rail)))?;
    let parts = match (s.kind, &s.mem, &s.remote) {
        (Kind::Move(dir), Some(mem), Some(remote)) => {
            let (handle, base) = mem.handle_for(&rail.target.md)?;
            vec![Part {
                dir,
                mem: handle.clone(),
                offset: base + s.offset,
                len: s.len,
                remote_addr: remote.addr(),
                rkey: remote.rkey_for(s.rail, n, &component, &rail.md)?,
                tag: s.tag,
            }]
        }
        (Kind::Flush, ..) => Vec::new(),
        _ => {
            return Err(TransferError::Config(
                "a stripe without its memory or key (a bug)".into(),
            ))
        }
    };
    let in_flight = rail.in_flight.clone();
    let counters = rail.counters.clone();
    let me = s.clone();
    let comp = Completion::with_callback(move |r| {
        in_flight.fetch_sub(1, Ordering::AcqRel);
        match r {
            Ok(()) => {
                if me.settle() {
                    if let Kind::Move(dir) = me.kind {
                        let (ops, bytes) = match dir {
                            Dir::Write => (&counters.writes, &counters.bytes_written),
                            Dir::Read => (&counters.reads, &counters.bytes_read),
                        };
                        Counters::add(ops, 1);
                        Counters::add(bytes, me.len as u64);
                    }
                    me.target.finish(Ok(()));
                }
            }
            Err(e) if is_rail_failure(e) => {
                if me.settle() {
                    lock(&events).suspects.push((me.clone(), e.clone()));
                }
            }
            Err(e) => {
                if me.settle() {
                    me.target.finish(Err(e.clone()));
                }
            }
        }
    });
    if !rail.is_up() {
        return Err(TransferError::Config(format!(
            "rail {} is out of service",
            s.rail
        )));
    }
    rail.in_flight.fetch_add(1, Ordering::AcqRel);
    rail.flying.push(s.clone());
    let op = Op::new(parts, s.kind == Kind::Flush, comp);
    if let Some(eng) = rail.engine() {
        eng.enqueue(op);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_are_in_proportion_and_cover_every_byte() {
        assert_eq!(split(4 << 20, &[1.0, 1.0]), vec![2 << 20, 2 << 20]);
        let s = split(1000, &[1.0, 3.0]);
        assert_eq!(s.iter().sum::<usize>(), 1000);
        assert_eq!(s[0] % 64, 0);
        assert!(s[0] < s[1]);
        let s = split(100, &[1.0, 1.0, 1.0]);
        assert_eq!(s.iter().sum::<usize>(), 100);
        assert_eq!(split(7, &[1.0]), vec![7]);
    }

    /// A notified write below the stripe minimum that one put with
    /// immediate cannot carry (longer than max_write_piece) has landed, and
    /// its notification waits behind an earlier striped write's, when the
    /// primary rail fails: the peer gets one notification per write (the
    /// notification moved to the next primary, the write not posted again
    /// with one of its own).
    #[test]
    fn a_small_notified_write_is_notified_once_when_the_primary_fails() {
        use crate::shared::Phase;
        use crate::{MemoryType, Progress, RemoteBuffer, Transport};
        use std::time::{Duration, Instant};

        const BIG: usize = 128 << 10;
        const SMALL: usize = 8 << 10;
        let limit = Duration::from_secs(30);
        let build = |progress| {
            Transport::builder()
                .transport("tcp")
                .devices(&["lo", "lo"])
                .stripe_min(64 << 10)
                .max_write_piece(4096)
                .progress(progress)
                .build()
                .expect("two tcp rails on lo")
        };
        // The writer's progress is driven here, rail by rail.
        let (w, r) = (build(Progress::Manual), build(Progress::Thread));
        let (uw, ur) = (w.bind().unwrap(), r.bind().unwrap());
        w.connect(&ur).unwrap();
        r.connect(&uw).unwrap();
        let src = Memory::alloc(&w, MemoryType::Host, BIG + SMALL).unwrap();
        let dst = Memory::alloc(&r, MemoryType::Host, BIG + SMALL).unwrap();
        let data: Vec<u8> = (0..BIG + SMALL).map(|i| (i / 64) as u8 ^ 0x5a).collect();
        src.write_bytes(0, &data).unwrap();
        let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
        let part = |at, len| (src.view(at, len).unwrap(), remote.slice(at, len).unwrap());
        let (v, to) = part(0, BIG);
        let striped = w.write_tagged(&v, &to, 1);
        let (v, to) = part(BIG, SMALL);
        let small = w.write_tagged(&v, &to, 2);
        let with_rails = |f: &mut dyn FnMut(&mut Rails)| {
            let mut phase = lock(&w.shared.phase);
            let Phase::Connected(rails) = &mut *phase else {
                panic!("the writer is not connected");
            };
            f(rails);
        };
        // Rail 0 alone: the small write lands (its flush is answered) while
        // the striped write's stripe on rail 1 is not seen to complete, so
        // its notification, and the small one's behind it, wait.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            with_rails(&mut |rails: &mut Rails| {
                let eng = rails.rails[0].engine().expect("rail 0 in service");
                eng.turn().expect("rail 0 works");
            });
        }
        assert!(
            !striped.is_done() && !small.is_done(),
            "a notification went before the striped write's stripe on rail 1 completed"
        );
        with_rails(&mut |rails: &mut Rails| rails.fail_rail(0, "failed by the test"));
        w.wait_within(striped, limit).unwrap().unwrap();
        w.wait_within(small, limit).unwrap().unwrap();
        for tag in [1, 2] {
            let n = r.wait_within(r.wait_for_write(), limit).unwrap().unwrap();
            assert_eq!(n.tag, tag, "notification {tag} out of order");
        }
        // Anything more was sent before the small write resolved.
        match r.wait_within(r.wait_for_write(), Duration::from_millis(500)) {
            Err(TransferError::TimedOut { .. }) => {}
            other => panic!("a third notification for two writes: {other:?}"),
        }
        let mut got = vec![0u8; BIG + SMALL];
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got == data, "the writes did not land whole");
    }
}
