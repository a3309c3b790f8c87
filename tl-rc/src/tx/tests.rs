//! Unit tests of the send tracker: no verbs, no device.

use super::*;

type Tracker = TxTracker<u32, &'static str>;
type Events = Vec<TxEvent<u32, &'static str>>;

fn op(id: u32) -> TxOp<u32> {
    TxOp {
        expect: WcOpcode::RdmaWrite,
        what: "put_bcopy",
        bytes: 100,
        payload: id,
    }
}

/// Posts `n` moderated writes with payloads from `first`; returns
/// their plans.
fn post_n(tx: &mut Tracker, first: u32, n: u32) -> Vec<Plan> {
    (first..first + n)
        .map(|id| {
            assert_eq!(tx.ready(), Ok(true));
            let plan = tx.plan(Signal::Moderated);
            tx.post(plan, op(id));
            plan
        })
        .collect()
}

fn ok(tx: &mut Tracker, wr_id: u64) -> Events {
    let mut events = Vec::new();
    tx.complete(wr_id, &WcStatus::Success, WcOpcode::RdmaWrite, &mut events);
    events
}

fn error(tx: &mut Tracker, wr_id: u64) -> Events {
    let status = WcStatus::Failed {
        name: "remote access error".into(),
        code: 10,
        vendor_err: 0x88,
    };
    let mut events = Vec::new();
    tx.complete(wr_id, &status, WcOpcode::Other(0), &mut events);
    events
}

fn done_ids(events: &Events) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            TxEvent::Done { payload, .. } => Some(*payload),
            _ => None,
        })
        .collect()
}

fn failed_ids(events: &Events) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            TxEvent::Failed { payload, .. } => Some(*payload),
            _ => None,
        })
        .collect()
}

fn signalled(plans: &[Plan]) -> Vec<usize> {
    (0..plans.len()).filter(|&i| plans[i].signalled).collect()
}

#[test]
fn moderation_signals_exactly_every_16th() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 48);
    // The 16th, 32nd and 48th posts, and no other.
    assert_eq!(signalled(&plans), vec![15, 31, 47]);
}

#[test]
fn moderation_counter_wraps_around_after_each_signal() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 15);
    assert!(plans.iter().all(|p| !p.signalled));
    let sixteenth = post_n(&mut tx, 15, 1);
    assert!(sixteenth[0].signalled);
    // Counting starts again from zero.
    let next = post_n(&mut tx, 16, 16);
    assert_eq!(signalled(&next), vec![15]);
}

#[test]
fn a_forced_signal_restarts_the_count() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 10);
    let plan = tx.plan(Signal::Always);
    assert!(plan.signalled);
    tx.post(plan, op(10));
    let plans = post_n(&mut tx, 11, 16);
    assert_eq!(signalled(&plans), vec![15]);
}

#[test]
fn every_post_is_signalled_when_credits_run_low() {
    let mut tx = Tracker::new("rxe0:1", MODERATION + 2);
    let plans = post_n(&mut tx, 0, 4);
    // Credits 18, 17 leave room; from 16 on every post is signalled.
    assert_eq!(signalled(&plans), vec![2, 3]);
}

#[test]
fn work_request_ids_wrap_below_the_receive_bit() {
    let mut tx = Tracker::starting_at("rxe0:1", 256, SEQ_LIMIT - 3);
    let plans = post_n(&mut tx, 0, 6);
    let ids: Vec<u64> = plans.iter().map(|p| p.seq).collect();
    assert_eq!(
        ids,
        vec![SEQ_LIMIT - 3, SEQ_LIMIT - 2, SEQ_LIMIT - 1, 0, 1, 2]
    );
    // A completion after the wrap covers the ones before it.
    let events = ok(&mut tx, 1);
    assert_eq!(done_ids(&events), vec![0, 1, 2, 3, 4]);
    assert_eq!(tx.outstanding(), 1);
}

#[test]
fn one_completion_covers_every_earlier_post() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 10);
    assert_eq!(tx.credits(), 246);
    let events = ok(&mut tx, plans[9].seq);
    assert_eq!(done_ids(&events), (0..10).collect::<Vec<_>>());
    let named: Vec<bool> = events
        .iter()
        .map(|e| matches!(e, TxEvent::Done { named: true, .. }))
        .collect();
    assert_eq!(named.iter().filter(|&&n| n).count(), 1);
    assert!(named[9], "only the last is the completion's own");
    assert_eq!(tx.credits(), 256);
    assert_eq!(tx.outstanding(), 0);
}

#[test]
fn an_error_in_the_middle_fails_everything_after_and_nothing_succeeds() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 8);
    let events = error(&mut tx, plans[3].seq);
    assert!(done_ids(&events).is_empty());
    // The NIC is done with those up to the failed one; the rest wait for
    // their flushed completions.
    assert_eq!(failed_ids(&events), (0..4).collect::<Vec<_>>());
    assert_eq!(tx.outstanding(), 4);
    let e = tx.failure().expect("failed").to_string();
    assert!(
        e.contains("put_bcopy failed with work completion status remote access error (10)"),
        "{e}"
    );
    assert!(e.contains("vendor error 0x88"), "{e}");
    // The rest of the queue comes back flushed, or even successful: each
    // fails once, none succeeds.
    assert_eq!(failed_ids(&error(&mut tx, plans[4].seq)), vec![4]);
    assert_eq!(failed_ids(&ok(&mut tx, plans[7].seq)), vec![5, 6, 7]);
    assert!(ok(&mut tx, plans[7].seq).is_empty(), "reported twice");
    assert!(matches!(tx.ready(), Err(UctError::EndpointFailed(_))));
    assert_eq!(tx.credits(), 256);
}

#[test]
fn flush_and_fence_after_failure_return_the_failure() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 2);
    let mut events = Vec::new();
    tx.fail(UctError::EndpointFailed("first".into()), &mut events);
    tx.fail(UctError::EndpointFailed("second".into()), &mut events);
    assert!(failed_ids(&events).is_empty(), "released before the NIC");
    let first = UctError::EndpointFailed("first".into());
    assert_eq!(tx.flush(), Ok(FlushNeed::Wait), "operations are in the NIC");
    assert_eq!(tx.fence(), Err(first.clone()));
    assert_eq!(tx.ready(), Err(first.clone()));
    tx.give_up(&mut events);
    assert_eq!(failed_ids(&events), vec![0, 1]);
    assert!(events.iter().all(|e| matches!(
        e,
        TxEvent::Failed { error, .. } if *error == first
    )));
    assert_eq!(tx.credits(), 256, "credits come back on release");
    assert_eq!(tx.outstanding(), 0);
    assert_eq!(tx.flush(), Err(first.clone()), "nothing left to wait for");
}

#[test]
fn give_up_releases_everything_and_fails_the_flushes_once() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 3);
    tx.add_flush("waiting");
    let mut events = Vec::new();
    tx.give_up(&mut events);
    assert!(events.is_empty(), "nothing to give up before a failure");
    assert_eq!(tx.outstanding(), 3);
    tx.fail(UctError::Canceled("dropped".into()), &mut events);
    tx.give_up(&mut events);
    assert_eq!(failed_ids(&events), vec![0, 1, 2]);
    let flushes = events
        .iter()
        .filter(|e| matches!(e, TxEvent::FlushFailed("waiting", UctError::Canceled(_))))
        .count();
    assert_eq!(flushes, 1);
    let mut again = Vec::new();
    tx.give_up(&mut again);
    assert!(again.is_empty());
    assert!(ok(&mut tx, 2).is_empty(), "a late completion after give_up");
}

#[test]
fn a_failure_with_nothing_outstanding_fails_waiting_flushes_at_once() {
    let mut tx = Tracker::new("rxe0:1", 256);
    tx.add_flush("waiting");
    let mut events = Vec::new();
    tx.fail(UctError::EndpointFailed("dead".into()), &mut events);
    assert!(matches!(events[..], [TxEvent::FlushFailed("waiting", _)]));
}

#[test]
fn a_keepalive_leaves_the_fence_to_the_next_post() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 1);
    assert!(!tx.tail_signalled());
    tx.fence().unwrap();
    let keepalive = tx.plan_keepalive();
    assert!(keepalive.signalled && !keepalive.fenced);
    tx.post(keepalive, op(1));
    assert!(tx.tail_signalled());
    assert!(
        tx.plan(Signal::Moderated).fenced,
        "the fence is still pending"
    );
}

#[test]
fn credits_run_out_and_come_back() {
    let mut tx = Tracker::new("rxe0:1", 8);
    let plans = post_n(&mut tx, 0, 8);
    assert_eq!(tx.ready(), Ok(false), "out of credits: NoResource");
    assert_eq!(tx.credits(), 0);
    ok(&mut tx, plans[2].seq);
    assert_eq!(tx.credits(), 3);
    assert_eq!(tx.ready(), Ok(true));
    ok(&mut tx, plans[7].seq);
    assert_eq!(tx.credits(), 8);
}

#[test]
fn a_fence_goes_on_the_next_post_only() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 1);
    tx.fence().unwrap();
    let fenced = tx.plan(Signal::Moderated);
    assert!(fenced.fenced);
    tx.post(fenced, op(1));
    assert!(!tx.plan(Signal::Moderated).fenced);
}

#[test]
fn an_abandoned_post_keeps_its_fence_and_its_id() {
    let mut tx = Tracker::new("rxe0:1", 256);
    tx.fence().unwrap();
    let refused = tx.plan(Signal::Moderated);
    assert!(refused.fenced);
    tx.abandon(refused);
    let retry = tx.plan(Signal::Moderated);
    assert!(retry.fenced, "the fence is still pending");
    assert_eq!(retry.seq, refused.seq);
    assert_eq!(tx.credits(), 256);
    assert_eq!(tx.outstanding(), 0);
}

#[test]
fn unknown_and_duplicate_ids_complete_nothing() {
    let mut tx = Tracker::new("rxe0:1", 256);
    assert!(matches!(ok(&mut tx, 5)[..], [TxEvent::Stray { wr_id: 5 }]));
    let plans = post_n(&mut tx, 0, 4);
    assert_eq!(done_ids(&ok(&mut tx, plans[1].seq)), vec![0, 1]);
    // Again, and one never handed out, and one with the receive bit.
    for wr_id in [plans[1].seq, plans[3].seq + 10, SEQ_LIMIT | plans[2].seq] {
        let events = ok(&mut tx, wr_id);
        assert!(matches!(events[..], [TxEvent::Stray { .. }]), "{wr_id}");
    }
    assert_eq!(tx.outstanding(), 2);
    assert!(tx.failure().is_none());
}

#[test]
fn ids_just_outside_the_queue_are_stray_and_post_says_who_is_first() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let first = tx.plan(Signal::Moderated);
    assert!(tx.post(first, op(0)), "the only operation outstanding");
    let second = tx.plan(Signal::Moderated);
    assert!(!tx.post(second, op(1)), "not the only one");
    // One past the newest, and the id limit.
    for wr_id in [second.seq + 1, SEQ_LIMIT] {
        assert!(matches!(ok(&mut tx, wr_id)[..], [TxEvent::Stray { .. }]));
    }
    assert_eq!(tx.outstanding(), 2);
    // From id 0, the limit itself would wrap onto the oldest post.
    let mut tx = Tracker::starting_at("rxe0:1", 256, 0);
    post_n(&mut tx, 0, 1);
    assert!(matches!(
        ok(&mut tx, SEQ_LIMIT)[..],
        [TxEvent::Stray { .. }]
    ));
}

#[test]
fn an_error_with_an_unknown_id_still_fails_the_endpoint() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 3);
    let events = error(&mut tx, 999);
    // It names none of them: they wait for their own completions.
    assert!(failed_ids(&events).is_empty());
    assert_eq!(tx.outstanding(), 3);
    let e = tx.failure().expect("failed").to_string();
    assert!(
        e.contains("an operation failed with work completion status"),
        "{e}"
    );
}

#[test]
fn a_wrong_opcode_is_a_protocol_error() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 3);
    let mut events = Vec::new();
    tx.complete(
        plans[2].seq,
        &WcStatus::Success,
        WcOpcode::RdmaRead,
        &mut events,
    );
    // The two before it completed; the one named failed.
    assert_eq!(done_ids(&events), vec![0, 1]);
    assert_eq!(failed_ids(&events), vec![2]);
    let e = tx.failure().expect("failed").to_string();
    assert!(
        e.contains("put_bcopy completed with opcode RDMA_READ, expected RDMA_WRITE"),
        "{e}"
    );
}

#[test]
fn flush_with_nothing_outstanding_is_done() {
    let mut tx = Tracker::new("rxe0:1", 256);
    assert_eq!(tx.flush(), Ok(FlushNeed::Done));
    let plans = post_n(&mut tx, 0, 16);
    assert_eq!(tx.flush(), Ok(FlushNeed::Wait), "the 16th is signalled");
    ok(&mut tx, plans[15].seq);
    assert_eq!(tx.flush(), Ok(FlushNeed::Done));
}

#[test]
fn flush_signals_an_unsignalled_tail_and_completes_with_it() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 3);
    assert_eq!(tx.flush(), Ok(FlushNeed::SignalTail));
    let nop = tx.plan(Signal::Always);
    tx.post(nop, op(99));
    assert_eq!(tx.flush(), Ok(FlushNeed::Wait));
    tx.add_flush("flush 1");
    tx.add_flush("flush 2");
    let events = ok(&mut tx, nop.seq);
    assert_eq!(done_ids(&events), vec![0, 1, 2, 99]);
    let flushed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TxEvent::Flushed(f) => Some(*f),
            _ => None,
        })
        .collect();
    assert_eq!(flushed, vec!["flush 1", "flush 2"]);
}

#[test]
fn low_credits_make_the_tail_signalled() {
    let mut tx = Tracker::new("rxe0:1", 40);
    // With 40 credits, posts 1..=15 are unsignalled, the 16th signalled,
    // then 17..=24 unsignalled until credits reach 16.
    let plans = post_n(&mut tx, 0, 24);
    assert!(!plans[23].signalled);
    assert_eq!(tx.flush(), Ok(FlushNeed::SignalTail));
    post_n(&mut tx, 24, 16);
    assert_eq!(tx.flush(), Ok(FlushNeed::Wait), "low credits signal");
    let mut full = Tracker::new("rxe0:1", 8);
    let plans = post_n(&mut full, 0, 8);
    assert!(plans.iter().all(|p| p.signalled));
    assert_eq!(full.flush(), Ok(FlushNeed::Wait));
}

#[test]
fn flush_no_resource_when_the_tail_is_unsignalled_and_no_credit() {
    let mut tx = Tracker::new("rxe0:1", 256);
    post_n(&mut tx, 0, 3);
    tx.credits = 0;
    assert_eq!(tx.flush(), Ok(FlushNeed::NoResource));
}

#[test]
fn a_failure_fails_waiting_flushes() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 2);
    tx.add_flush("waiting");
    let events = error(&mut tx, plans[0].seq);
    assert_eq!(failed_ids(&events), vec![0]);
    assert!(
        !events.iter().any(|e| matches!(e, TxEvent::FlushFailed(..))),
        "the flush failed with an operation still in the NIC"
    );
    let events = error(&mut tx, plans[1].seq);
    assert!(events.iter().any(|e| matches!(
        e,
        TxEvent::FlushFailed("waiting", UctError::EndpointFailed(_))
    )));
    assert_eq!(tx.outstanding(), 0);
}

/// Finding 12.6: after a failure the NIC may still use an operation's
/// memory until the operation's own completion (a flush error, once the QP
/// is in the error state) comes back: nothing is released before, each is
/// released (failed) at its completion, a success after the failure is
/// still a failure, and waiting flushes fail once nothing is left.
#[test]
fn after_a_failure_each_operation_is_released_only_at_its_completion() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 4);
    tx.add_flush("waiting");
    let mut events = Vec::new();
    tx.fail(UctError::Protocol("garbage".into()), &mut events);
    assert!(
        failed_ids(&events).is_empty(),
        "operations released before the NIC said it was done with them"
    );
    assert!(events.is_empty(), "the flush failed before the operations");
    assert!(matches!(tx.ready(), Err(UctError::Protocol(_))));
    assert_eq!(tx.outstanding(), 4);
    let events = error(&mut tx, plans[1].seq);
    assert_eq!(failed_ids(&events), vec![0, 1]);
    assert!(!events.iter().any(|e| matches!(e, TxEvent::FlushFailed(..))));
    let events = ok(&mut tx, plans[3].seq);
    assert_eq!(failed_ids(&events), vec![2, 3]);
    assert!(done_ids(&events).is_empty());
    assert!(events
        .iter()
        .any(|e| matches!(e, TxEvent::FlushFailed("waiting", UctError::Protocol(_)))));
    assert_eq!(tx.outstanding(), 0);
    assert_eq!(tx.credits(), 256);
}

/// Review finding 1: a flush after a failure, with operations still in the
/// NIC, must not fail at once: its caller would free a buffer a READ may
/// still land in. It waits (InProgress) and fails once the NIC gave back
/// every operation; only with nothing outstanding does it fail at once.
#[test]
fn a_flush_after_a_failure_waits_for_the_operations_in_the_nic() {
    let mut tx = Tracker::new("rxe0:1", 256);
    let plans = post_n(&mut tx, 0, 2);
    let mut events = Vec::new();
    tx.fail(UctError::Protocol("bad immediate".into()), &mut events);
    assert_eq!(
        tx.flush(),
        Ok(FlushNeed::Wait),
        "a flush failed with 2 operations still in the NIC"
    );
    tx.add_flush("waiting");
    let events = error(&mut tx, plans[0].seq);
    assert!(!events.iter().any(|e| matches!(e, TxEvent::FlushFailed(..))));
    let events = error(&mut tx, plans[1].seq);
    assert!(events
        .iter()
        .any(|e| matches!(e, TxEvent::FlushFailed("waiting", UctError::Protocol(_)))));
    assert!(matches!(tx.flush(), Err(UctError::Protocol(_))));
}

#[test]
fn bytes_ahead_count_up_to_the_first_signalled_post() {
    let mut tx = Tracker::new("rxe0:1", 256);
    assert_eq!(tx.bytes_ahead(), 0);
    let plans = post_n(&mut tx, 0, 20);
    // The 16th is signalled: 16 posts of 100 bytes are ahead of its
    // completion.
    assert_eq!(tx.bytes_ahead(), 1600);
    ok(&mut tx, plans[15].seq);
    assert_eq!(tx.bytes_ahead(), 400, "none signalled: all of them");
}

/// The fast path changes the tracker exactly as `complete` would, or not
/// at all: two trackers fed the same posts, flushes, failures and
/// completions (of the front, past it, stray, old, failed, with the wrong
/// opcode), one through `complete_run` first, agree after every step,
/// across the id wraparound too.
#[test]
fn complete_run_agrees_with_complete() {
    for first in [1, SEQ_LIMIT - 20] {
        fast_path_against_slow_path(first);
    }
}

fn fast_path_against_slow_path(first: u64) {
    let fresh = || Tracker::starting_at("rxe0", 64, first);
    let (mut fast, mut slow) = (fresh(), fresh());
    let mut seed = 0x9e37_79b9_u32;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let (mut taken_fast, mut after_failure, mut old_front) = (0, 0, first);
    let mut runs_longer = 0;
    for step in 0..4_000u32 {
        let roll = next() % 16;
        if roll < 7 && fast.ready() == Ok(true) {
            let signal = if roll == 0 {
                Signal::Always
            } else {
                Signal::Moderated
            };
            let (a, b) = (fast.plan(signal), slow.plan(signal));
            assert_eq!(a, b);
            fast.post(a, op(step));
            slow.post(b, op(step));
        } else if roll == 7 && fast.outstanding() > 0 {
            fast.add_flush("flush");
            slow.add_flush("flush");
        } else if roll == 8 && next() % 8 == 0 {
            let error = UctError::EndpointFailed("peer gone".into());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            fast.fail(error.clone(), &mut a);
            slow.fail(error, &mut b);
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {step}");
        } else if let Some(front) = fast.ops.front().map(|p| p.seq) {
            old_front = old_front.min(front);
            let wr_id = match next() % 10 {
                0 => (front + fast.outstanding() as u64 + u64::from(next() % 3)) % SEQ_LIMIT,
                1 => old_front.wrapping_sub(1) % SEQ_LIMIT,
                2 => SEQ_LIMIT + u64::from(next() % 4),
                _ => (front + u64::from(next()) % (fast.outstanding() as u64).min(3)) % SEQ_LIMIT,
            };
            let opcode = if next() % 50 == 0 {
                WcOpcode::Send
            } else {
                WcOpcode::RdmaWrite
            };
            let status = if next() % 100 == 0 {
                WcStatus::Failed {
                    name: "retry exceeded".into(),
                    code: 12,
                    vendor_err: 0,
                }
            } else {
                WcStatus::Success
            };
            if fast.failure().is_some() {
                after_failure += 1;
            }
            let mut a = Vec::new();
            let run = (status == WcStatus::Success)
                .then(|| fast.complete_run(wr_id, opcode))
                .flatten();
            match run {
                Some(count) => {
                    taken_fast += 1;
                    runs_longer += usize::from(count > 1);
                    for index in 0..count {
                        let payload = fast.pop_completed().expect("a run of outstanding ops");
                        a.push(TxEvent::Done {
                            payload,
                            named: index + 1 == count,
                        });
                    }
                }
                None => fast.complete(wr_id, &status, opcode, &mut a),
            }
            let mut b = Vec::new();
            slow.complete(wr_id, &status, opcode, &mut b);
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {step}");
        }
        assert_eq!(fast.credits(), slow.credits(), "step {step}");
        assert_eq!(fast.outstanding(), slow.outstanding(), "step {step}");
        assert_eq!(fast.tail_signalled(), slow.tail_signalled(), "step {step}");
        assert_eq!(fast.flush(), slow.flush(), "step {step}");
        assert_eq!(fast.failure(), slow.failure(), "step {step}");
        if fast.failure().is_some() && (fast.outstanding() == 0 || next() % 64 == 0) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            fast.give_up(&mut a);
            slow.give_up(&mut b);
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {step}");
            (fast, slow, old_front) = (fresh(), fresh(), first);
        }
    }
    assert!(
        taken_fast > 100,
        "the fast path was taken {taken_fast} times"
    );
    assert!(runs_longer > 50, "runs of more than one op: {runs_longer}");
    assert!(
        after_failure > 20,
        "{after_failure} completions after a failure"
    );
}
