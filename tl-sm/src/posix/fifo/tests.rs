//! A ring in an anonymous segment of this process: the owner's mapping
//! drains, a second mapping of the same memory (through its
//! `/proc/<our pid>/fd/<fd>`, as a peer maps it) pushes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use uct_core::{Access, UctError};

use super::*;
use crate::segment::Peers;

/// A segment of `len` data bytes: the owner's mapping and the descriptor
/// that keeps it, which peers open.
fn segment(len: usize) -> (Mapping, OwnedFd) {
    Mapping::create(
        "uct-test-fifo",
        len,
        (0, 0),
        Access::empty(),
        Peers::ReadWrite,
    )
    .expect("create a segment")
}

/// A peer's mapping of the segment behind `fd`.
fn peer_map(fd: &OwnedFd) -> Mapping {
    Mapping::open(
        std::process::id(),
        fd.as_raw_fd() as u32,
        0,
        Peers::ReadWrite,
    )
    .expect("open the segment as a peer")
}

/// An initialised ring (the consumer) and a peer's view of it (a producer).
struct Pair {
    consumer: Ring,
    producer: Ring,
    _fd: OwnedFd,
}

fn pair() -> Pair {
    let (map, fd) = segment(ring_bytes());
    let consumer = Ring::init(map).unwrap();
    let producer = Ring::attach(peer_map(&fd), std::process::id()).unwrap();
    Pair {
        consumer,
        producer,
        _fd: fd,
    }
}

/// The messages `drain` hands over, copied.
fn drain_all(ring: &Ring) -> Vec<(u8, Vec<u8>)> {
    let mut got = Vec::new();
    let n = ring.drain(|id, data| {
        // More than the ring holds is messages that were never sent.
        assert!(
            got.len() < SLOTS as usize,
            "drain handed over unsent messages"
        );
        got.push((id, data.to_vec()))
    });
    assert_eq!(n, got.len(), "drain counts what it handed over");
    got
}

/// A message body of `len` bytes that differs for every `k`.
fn body(k: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (k.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

/// Sets the slots of `ring` as those of a ring whose positions before
/// `head` were all published: each free for its position from `head` on
/// (tests that start a ring elsewhere than at 0).
fn slots_free_from(ring: &Ring, head: u64) {
    for k in 0..SLOTS {
        let pos = head.wrapping_add(k);
        ring.seq(pos).store(free_for(pos), Ordering::Relaxed);
    }
}

fn push(ring: &Ring, id: u8, parts: &[&[u8]]) -> Push {
    ring.push(id, parts).expect("push")
}

#[test]
fn a_ring_costs_its_slots_and_little_more() {
    let data = SLOTS as usize * SLOT_DATA;
    assert!(ring_bytes() >= data, "{} bytes", ring_bytes());
    assert!(ring_bytes() <= data + data / 8, "{} bytes", ring_bytes());
}

#[test]
fn a_ring_needs_ring_bytes() {
    for len in [ring_bytes(), ring_bytes() + 4096] {
        let (map, fd) = segment(len);
        assert!(Ring::init(map).is_ok(), "{len} bytes");
        assert!(Ring::attach(peer_map(&fd), std::process::id()).is_ok());
    }
    for len in [1, ring_bytes() - 1] {
        let (map, fd) = segment(len);
        assert!(matches!(Ring::init(map), Err(UctError::InvalidParam(_))));
        assert!(matches!(
            Ring::attach(peer_map(&fd), std::process::id()),
            Err(UctError::Unreachable(_))
        ));
    }
}

#[test]
fn attach_refuses_a_segment_that_holds_no_ring() {
    for len in [ring_bytes(), ring_bytes() + 4096] {
        let (map, _fd) = segment(len);
        assert!(matches!(
            Ring::attach(map, std::process::id()),
            Err(UctError::Unreachable(_))
        ));
    }
}

#[test]
fn the_ring_names_its_owner() {
    let pair = pair();
    assert_eq!(pair.consumer.owner_pid(), std::process::id());
    assert_eq!(pair.producer.owner_pid(), std::process::id());
    assert_eq!(
        pair.producer.mapping().data_len(),
        pair.consumer.mapping().data_len()
    );
}

#[test]
fn messages_arrive_once_in_order() {
    let pair = pair();
    assert!(drain_all(&pair.consumer).is_empty());
    let mut sent = Vec::new();
    for k in 0..10u64 {
        let data = body(k, (k as usize * 37) % 300);
        assert!(matches!(
            push(&pair.producer, k as u8 + 1, &[&data]),
            Push::Done
        ));
        sent.push((k as u8 + 1, data));
    }
    assert_eq!(drain_all(&pair.consumer), sent);
    assert!(drain_all(&pair.consumer).is_empty());
    assert!(matches!(push(&pair.producer, 42, &[b"x"]), Push::Done));
    assert_eq!(drain_all(&pair.consumer), vec![(42, b"x".to_vec())]);
}

#[test]
fn parts_are_concatenated() {
    let pair = pair();
    assert!(matches!(
        push(&pair.producer, 3, &[b"ab", b"", b"cde", b"f"]),
        Push::Done
    ));
    assert!(matches!(push(&pair.producer, 4, &[]), Push::Done));
    assert_eq!(
        drain_all(&pair.consumer),
        vec![(3, b"abcdef".to_vec()), (4, Vec::new())]
    );
}

#[test]
fn a_message_is_at_most_one_slot() {
    let pair = pair();
    let full = body(1, SLOT_DATA);
    assert!(matches!(push(&pair.producer, 1, &[&full]), Push::Done));
    let (head, tail) = full.split_at(SLOT_DATA / 2);
    assert!(matches!(
        pair.producer.push(2, &[head, tail, b"!"]),
        Err(UctError::InvalidParam(_))
    ));
    assert!(matches!(
        pair.producer.push(2, &[&body(2, SLOT_DATA + 1)]),
        Err(UctError::InvalidParam(_))
    ));
    assert_eq!(drain_all(&pair.consumer), vec![(1, full)]);
}

#[test]
fn a_full_ring_refuses_until_drained() {
    let pair = pair();
    let mut sent = Vec::new();
    for k in 0..SLOTS {
        let data = body(k, SLOT_DATA);
        assert!(
            matches!(push(&pair.producer, k as u8, &[&data]), Push::Done),
            "{k}"
        );
        sent.push((k as u8, data));
    }
    assert!(matches!(push(&pair.producer, 0, &[b"late"]), Push::Full));
    assert!(matches!(push(&pair.producer, 0, &[b"late"]), Push::Full));
    assert_eq!(drain_all(&pair.consumer), sent);
    // The producer sees the drained slots again.
    for k in 0..SLOTS {
        assert!(
            matches!(push(&pair.producer, 9, &[&body(k, 8)]), Push::Done),
            "{k}"
        );
    }
    assert!(matches!(push(&pair.producer, 0, &[b"late"]), Push::Full));
    assert_eq!(drain_all(&pair.consumer).len(), SLOTS as usize);
}

#[test]
fn positions_wrap_around_the_slots() {
    let pair = pair();
    for k in 0..3 * SLOTS + 7 {
        let data = body(k, 100 + (k as usize % 5) * 1000);
        assert!(matches!(
            push(&pair.producer, k as u8, &[&data]),
            Push::Done
        ));
        if k % 3 == 2 {
            let got = drain_all(&pair.consumer);
            assert_eq!(got.len(), 3);
            assert_eq!(got[2], (k as u8, data));
        }
    }
}

#[test]
fn positions_wrap_around_u64() {
    // A ring that ran for 2^64 messages: positions from shared memory wrap,
    // they never overflow.
    let pair = pair();
    let header = pair.consumer.header();
    header.head.store(u64::MAX - 2, Ordering::Relaxed);
    header.tail.store(u64::MAX - 2, Ordering::Relaxed);
    pair.consumer.tail.set(u64::MAX - 2);
    slots_free_from(&pair.consumer, u64::MAX - 2);
    let mut sent = Vec::new();
    for k in 0..6u64 {
        let data = body(k, 64);
        assert!(matches!(
            push(&pair.producer, k as u8, &[&data]),
            Push::Done
        ));
        sent.push((k as u8, data));
    }
    assert_eq!(drain_all(&pair.consumer), sent);
    assert_eq!(header.tail.load(Ordering::Relaxed), 3);
}

#[test]
fn a_producer_refuses_positions_no_honest_ring_has() {
    // The consumer's process owns head and tail; a hostile one sets them
    // further apart than the ring has slots, or tail past head. A producer
    // reads the tail only when the ring looks full to it (reading it on every
    // push would cost a cache miss per message), so each case has a head at
    // least a ring ahead of the tail a fresh producer assumes (0).
    for (head, tail) in [
        (SLOTS + 1, 0),
        (SLOTS, SLOTS + 5),
        (2 * SLOTS, u64::MAX - 1000),
    ] {
        let pair = pair();
        let header = pair.consumer.header();
        header.head.store(head, Ordering::Relaxed);
        header.tail.store(tail, Ordering::Relaxed);
        let got = pair.producer.push(1, &[b"x"]);
        assert!(
            matches!(got, Err(UctError::Protocol(_))),
            "head {head} tail {tail}: {:?}",
            got.map(|p| matches!(p, Push::Full))
        );
    }
}

#[test]
fn a_full_ring_is_full_whatever_its_positions() {
    // An honest ring a lap or more along, its positions wrapped past 0 or
    // not: exactly SLOTS apart is full, not corrupt, for a producer that
    // attaches to it then.
    for (head, tail) in [(SLOTS, 0), (SLOTS / 2, u64::MAX - SLOTS / 2 + 1)] {
        let (map, fd) = segment(ring_bytes());
        let consumer = Ring::init(map).unwrap();
        let header = consumer.header();
        header.head.store(head, Ordering::Relaxed);
        header.tail.store(tail, Ordering::Relaxed);
        slots_free_from(&consumer, head);
        let producer = Ring::attach(peer_map(&fd), std::process::id()).unwrap();
        assert!(
            matches!(push(&producer, 1, &[b"x"]), Push::Full),
            "head {head} tail {tail}"
        );
        header.tail.store(tail.wrapping_add(1), Ordering::Relaxed);
        assert!(matches!(push(&producer, 1, &[b"x"]), Push::Done));
    }
}

#[test]
fn a_rewritten_tail_does_not_replay_messages() {
    // A producer moves the shared tail back over slots the consumer already
    // delivered: the consumer must not deliver them again.
    let pair = pair();
    assert!(matches!(push(&pair.producer, 1, &[b"one"]), Push::Done));
    assert!(matches!(push(&pair.producer, 2, &[b"two"]), Push::Done));
    assert_eq!(drain_all(&pair.consumer).len(), 2);
    pair.producer.header().tail.store(0, Ordering::Relaxed);
    assert_eq!(drain_all(&pair.consumer), vec![]);
}

#[test]
fn the_handler_sees_a_copy_a_producer_cannot_change() {
    let pair = pair();
    let sent = body(3, 64);
    assert!(matches!(push(&pair.producer, 3, &[&sent]), Push::Done));
    let mut seen = Vec::new();
    pair.consumer.drain(|_, data| {
        // A hostile producer rewrites the published slot while the handler
        // reads it.
        // SAFETY: position 0's slot lies inside the producer's mapping;
        // its data is plain bytes, written through a raw pointer.
        unsafe { addr_of_mut!((*pair.producer.slot(0)).data).write_bytes(0xee, 1) };
        seen = data.to_vec();
    });
    assert!(seen == sent, "the handler's bytes changed under it");
}

#[test]
fn one_drain_delivers_at_most_a_ring_of_messages() {
    // A producer that publishes as fast as the consumer drains must not keep
    // one progress call busy for ever.
    let pair = pair();
    assert!(matches!(push(&pair.producer, 1, &[b"x"]), Push::Done));
    let mut delivered = 0u64;
    let n = pair.consumer.drain(|_, _| {
        delivered += 1;
        // Bounded, so that the test ends on code without a budget too.
        if delivered < 4 * SLOTS {
            let _ = pair.producer.push(1, &[b"x"]);
        }
    });
    assert!(n as u64 <= SLOTS, "one drain delivered {n} messages");
}

#[test]
fn a_slot_with_a_corrupt_length_or_id_is_dropped() {
    // A hostile producer publishes slots whose length reaches past the slot
    // or whose id is no AM id: nothing of them reaches a handler.
    let pair = pair();
    assert!(matches!(push(&pair.producer, 5, &[b"bad len"]), Push::Done));
    assert!(matches!(push(&pair.producer, 6, &[b"bad id"]), Push::Done));
    assert!(matches!(push(&pair.producer, 7, &[b"good"]), Push::Done));
    // SAFETY: positions 0 and 1 lie inside the ring; len and id are atomics.
    unsafe {
        (*pair.producer.slot(0))
            .len
            .store(u64::MAX, Ordering::Relaxed);
        (*pair.producer.slot(1)).id.store(0x105, Ordering::Relaxed);
    }
    let got: Vec<(u8, usize)> = drain_all(&pair.consumer)
        .iter()
        .map(|(id, data)| (*id, data.len()))
        .collect();
    assert_eq!(got, vec![(7, 4)], "(id, length) delivered");
}

/// Drains until `want` messages arrived in all, at most `deadline`.
fn drain_until(ring: &Ring, want: usize, deadline: Duration) -> Vec<(u8, Vec<u8>)> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < want && start.elapsed() < deadline {
        got.extend(drain_all(ring));
    }
    got
}

#[test]
fn a_slot_claimed_and_never_published_is_skipped_after_the_bound() {
    let mut pair = pair();
    let bound = Duration::from_millis(50);
    pair.consumer.set_stuck_after(bound);
    // A producer claims position 0 (its CAS on head) and dies before it
    // publishes; another pushes two messages after it.
    pair.producer.header().head.fetch_add(1, Ordering::AcqRel);
    let start = Instant::now();
    assert!(matches!(push(&pair.producer, 1, &[b"one"]), Push::Done));
    assert!(matches!(push(&pair.producer, 2, &[b"two"]), Push::Done));
    for _ in 0..1000 {
        assert!(
            drain_all(&pair.consumer).is_empty(),
            "delivered past an unpublished slot"
        );
    }
    let got = drain_until(&pair.consumer, 2, Duration::from_secs(5));
    assert!(
        start.elapsed() >= bound,
        "skipped after {:?}",
        start.elapsed()
    );
    assert_eq!(got, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
    // The dead producer's late publication names a position the ring has
    // passed: ignored, and the ring goes on.
    // SAFETY: position 0's slot lies inside the ring; seq is an atomic.
    unsafe { (*pair.producer.slot(0)).seq.store(1, Ordering::Release) };
    for _ in 0..1000 {
        assert!(
            drain_all(&pair.consumer).is_empty(),
            "a late publication was delivered"
        );
    }
    assert!(matches!(push(&pair.producer, 3, &[b"three"]), Push::Done));
    assert_eq!(drain_all(&pair.consumer), vec![(3, b"three".to_vec())]);
}

#[test]
fn a_slot_claimed_just_now_is_waited_for() {
    // Only positions claimed when the consumer first saw them stuck, and a
    // bound ago, are skipped: a claim made later is waited for.
    let mut pair = pair();
    pair.consumer.set_stuck_after(Duration::from_millis(30));
    pair.producer.header().head.fetch_add(1, Ordering::AcqRel);
    let got = drain_until(&pair.consumer, 1, Duration::from_millis(10));
    assert!(got.is_empty());
    std::thread::sleep(Duration::from_millis(40));
    // A second claim, published late but within the bound.
    let pos = pair.producer.header().head.fetch_add(1, Ordering::AcqRel);
    assert!(drain_until(&pair.consumer, 1, Duration::from_millis(20)).is_empty());
    // SAFETY: the slot of `pos` lies inside the ring; its fields are
    // atomics.
    unsafe {
        let slot = pair.producer.slot(pos);
        (*slot).len.store(0, Ordering::Relaxed);
        (*slot).id.store(4, Ordering::Relaxed);
        (*slot).seq.store(pos + 1, Ordering::Release);
    }
    assert_eq!(
        drain_until(&pair.consumer, 1, Duration::from_secs(2)),
        vec![(4, Vec::new())]
    );
}

#[test]
fn a_push_gives_up_when_every_claim_fails() {
    // Another process keeps rewriting head, so no compare-and-swap wins:
    // the push returns instead of spinning.
    let pair = pair();
    pair.producer.fail_claims.set(true);
    assert!(matches!(push(&pair.producer, 1, &[b"x"]), Push::Contended));
    pair.producer.fail_claims.set(false);
    assert!(matches!(push(&pair.producer, 1, &[b"x"]), Push::Done));
    assert_eq!(drain_all(&pair.consumer), vec![(1, b"x".to_vec())]);
}

/// How long the consumers of the paused-sender tests wait for a claimed
/// slot before they take it for stuck.
const BOUND: Duration = Duration::from_millis(30);

/// A ring whose consumer skips after [`BOUND`], and a producer on a thread
/// of its own whose first push stops at `stage` until told to go on: the
/// join handle of that push, the position it claimed, and the sender that
/// resumes it.
struct Paused {
    pair: Pair,
    push: std::thread::JoinHandle<Push>,
    pos: u64,
    resume: std::sync::mpsc::Sender<()>,
}

fn paused_at(stage: Stage) -> Paused {
    let mut pair = pair();
    pair.consumer.set_stuck_after(BOUND);
    let paused = Ring::attach(peer_map(&pair._fd), std::process::id()).unwrap();
    let (claimed_tx, claimed_rx) = std::sync::mpsc::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
    let mut once = Some((claimed_tx, resume_rx));
    *paused.pause.borrow_mut() = Some(Box::new(move |at, pos| {
        if at != stage {
            return;
        }
        if let Some((claimed, resume)) = once.take() {
            claimed.send(pos).unwrap();
            // Stopped until the test says so (or gives up on it).
            let _ = resume.recv_timeout(Duration::from_secs(30));
        }
    }));
    let push = std::thread::spawn(move || {
        paused
            .push(9, &[b"the paused sender's message"])
            .expect("push")
    });
    let pos = claimed_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the paused sender claimed no position");
    Paused {
        pair,
        push,
        pos,
        resume,
    }
}

/// Drains for `how_long`; nothing may arrive.
fn nothing_arrives(ring: &Ring, how_long: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < how_long {
        assert!(drain_all(ring).is_empty(), "{what}");
    }
}

#[test]
fn a_sender_paused_after_its_claim_loses_nothing_when_the_ring_wraps() {
    // A claims position 0 (its CAS on head) and is stopped there for more
    // than the bound; the consumer skips position 0; B sends a lap of
    // messages, the last of them at position 256, slot 0 again. When A goes
    // on it must neither write over B's message nor lose its own.
    let p = paused_at(Stage::Claimed);
    assert_eq!(p.pos, 0);
    nothing_arrives(&p.pair.consumer, BOUND * 4, "nothing was sent");
    for k in 1..SLOTS {
        assert!(matches!(
            push(&p.pair.producer, 1, &[&body(k, 100)]),
            Push::Done
        ));
    }
    let got = drain_until(&p.pair.consumer, SLOTS as usize - 1, Duration::from_secs(5));
    assert_eq!(got.len(), SLOTS as usize - 1, "B's first messages");
    assert!(matches!(
        push(&p.pair.producer, 1, &[&body(SLOTS, 100)]),
        Push::Done
    ));
    p.resume.send(()).unwrap();
    assert!(matches!(p.push.join().unwrap(), Push::Done));
    let got = drain_until(&p.pair.consumer, 2, Duration::from_secs(2));
    assert_eq!(
        got,
        vec![
            (1, body(SLOTS, 100)),
            (9, b"the paused sender's message".to_vec())
        ],
        "B's message at position 256, then A's"
    );
    nothing_arrives(&p.pair.consumer, BOUND * 2, "more than was sent");
}

#[test]
fn a_sender_paused_mid_copy_is_waited_for_while_it_lives() {
    // A marked its slot and is stopped mid-copy for more than the bound: a
    // live sender's message is not skipped, so the ring fills behind it
    // and nothing is delivered past it until it goes on.
    let p = paused_at(Stage::Marked);
    assert_eq!(p.pos, 0);
    nothing_arrives(&p.pair.consumer, BOUND * 4, "nothing was published");
    for k in 1..SLOTS {
        assert!(matches!(
            push(&p.pair.producer, 1, &[&body(k, 100)]),
            Push::Done
        ));
    }
    assert!(
        matches!(push(&p.pair.producer, 1, &[b"one too many"]), Push::Full),
        "the paused sender's slot was given to another"
    );
    nothing_arrives(
        &p.pair.consumer,
        BOUND * 4,
        "delivered past a live sender's slot",
    );
    p.resume.send(()).unwrap();
    assert!(matches!(p.push.join().unwrap(), Push::Done));
    let got = drain_until(&p.pair.consumer, SLOTS as usize, Duration::from_secs(5));
    let mut want = vec![(9, b"the paused sender's message".to_vec())];
    want.extend((1..SLOTS).map(|k| (1, body(k, 100))));
    assert!(got == want, "{} messages, not A's then B's", got.len());
}

#[test]
fn a_slot_marked_by_a_sender_that_exited_is_skipped_after_the_bound() {
    let mut pair = pair();
    pair.consumer.set_stuck_after(BOUND);
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait for true");
    // A sender claimed position 0, marked its slot and died mid-copy.
    pair.producer.header().head.fetch_add(1, Ordering::AcqRel);
    pair.producer
        .seq(0)
        .store(writing(dead, 0), Ordering::Release);
    let start = Instant::now();
    assert!(matches!(push(&pair.producer, 1, &[b"one"]), Push::Done));
    let got = drain_until(&pair.consumer, 1, Duration::from_secs(5));
    assert!(
        start.elapsed() >= BOUND,
        "skipped after {:?}",
        start.elapsed()
    );
    assert_eq!(got, vec![(1, b"one".to_vec())]);
    // The ring goes on a lap later through slot 0.
    for k in 0..SLOTS {
        assert!(matches!(
            push(&pair.producer, 2, &[&body(k, 8)]),
            Push::Done
        ));
        assert_eq!(drain_all(&pair.consumer), vec![(2, body(k, 8))]);
    }
}

#[test]
fn a_mark_is_never_a_position() {
    // A writing mark is never any position + 1 of its own slot, nor free
    // for one, at any lap or pid.
    for pos in [0, 1, 255, 256, 1 << 40, u64::MAX - 1, u64::MAX] {
        for pid in [1, 4_194_304, u32::MAX] {
            let mark = writing(pid, pos);
            assert_eq!(writer(mark, pos), Some(pid));
            for lap in [0u64, 1, 2, 1 << 50] {
                let other = pos.wrapping_add(lap.wrapping_mul(SLOTS));
                assert_ne!(mark, other.wrapping_add(1));
                assert_ne!(mark, free_for(other));
                assert_eq!(writer(other.wrapping_add(1), pos), None);
            }
        }
    }
}
