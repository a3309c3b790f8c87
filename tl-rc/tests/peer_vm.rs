//! rc against dying and hostile peers, on a real RDMA device (inside
//! scripts/rxe-vm, Soft-RoCE): a peer process killed while a READ is posted
//! or while the queue pair sits idle, a peer that sends garbage while a
//! READ is outstanding, an endpoint dropped with a READ outstanding,
//! zero-copy lists longer than rc's limit, and puts with immediate data
//! (peer_vm/imm.rs). Inside the VM
//! (`RXE_VM_DEVICE=rxe0`), or where `UCT_TEST_EXPECT` names rc, a missing
//! device fails every test; elsewhere they are reported as ignored, with
//! the reason, never as passed.
//!
//! The peer timeout is 3 s here (`UCT_RC_PEER_TIMEOUT`), so that a dead
//! peer must be found within 4 s, and the time the bytes ahead of the
//! completion waited for take at keepalive::FLOOR_BANDWIDTH.

#[path = "peer_vm/imm.rs"]
mod imm;
#[path = "peer_vm/rig.rs"]
mod rig;

use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion as TestDone, Failed, Trial};
use uct_core::{Completion, Iov, Status, UctError};

use uct_ib::keepalive::Liveness;

use rig::{forged_rkey, outcome, pattern_bytes, written, Hostile, Peer, Rc};

const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// A READ this long takes the NIC seconds (rxe under qemu moves tens of
/// MiB/s), so that it is still in flight when the peer acts.
const READ_LEN: usize = 64 << 20;

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// After the error was reported, the NIC must not write the buffer any
/// more: its bytes are the caller's again.
fn not_written_after(rc: &mut Rc, local: &uct_core::MemHandle, when: &str) -> Result<(), Failed> {
    let before = local.to_vec()?;
    rc.idle(Duration::from_millis(1500));
    let after = local.to_vec()?;
    let changed = before
        .chunks(4096)
        .zip(after.chunks(4096))
        .filter(|(b, a)| b != a)
        .count();
    check(changed == 0, || {
        format!(
            "the NIC wrote into {changed} pages of the buffer after {when} ({} bytes of the pattern before, {} after)",
            pattern_bytes(&before),
            pattern_bytes(&after)
        )
    })
}

/// Finding 12.6: a peer that sends a malformed immediate while our READ
/// from it is in flight fails the endpoint; the READ's completion must not
/// report the error while the NIC can still write the buffer.
fn protocol_error_with_a_read_outstanding() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let mut ep = rc.ep()?;
    let hostile = Hostile::connect(&rc, ep.as_mut(), READ_LEN)?;
    let local = rc.buffer(READ_LEN)?;
    let comp = Completion::new();
    let iov = [Iov::new(&local, 0, READ_LEN)];
    let st = ep.get_zcopy(&iov, hostile.region.addr(), &hostile.rkey, Some(&comp))?;
    check(st == Status::InProgress, || format!("get_zcopy: {st:?}"))?;
    hostile.send_imm(0x1234)?;
    let took = rc.progress_until("the READ's completion", Duration::from_secs(60), |_| {
        comp.is_complete()
    })?;
    let at_error = written(&local)?;
    println!(
        "peer_vm: protocol error: the READ completed ({}) after {took:?} with {at_error} of {READ_LEN} bytes written",
        outcome(&comp)
    );
    check(matches!(comp.result(), Err(UctError::Protocol(_))), || {
        format!(
            "the READ must fail with the peer's protocol error, got {}",
            outcome(&comp)
        )
    })?;
    check(at_error < READ_LEN, || {
        "inconclusive: the READ finished before the garbage arrived".into()
    })?;
    not_written_after(&mut rc, &local, "the error was reported")?;
    drop(hostile);
    Ok(())
}

/// Review finding 1: a flush right after a peer's garbage failed the
/// endpoint, with a READ that has no completion of its own still in the
/// NIC, must not fail at once (its caller would free the buffer under the
/// READ): it is InProgress, and fails once the NIC gave the READ back.
fn flush_after_a_protocol_error_waits_for_the_read() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let mut ep = rc.ep()?;
    let hostile = Hostile::connect(&rc, ep.as_mut(), READ_LEN)?;
    let local = rc.buffer(READ_LEN)?;
    let iov = [Iov::new(&local, 0, READ_LEN)];
    let st = ep.get_zcopy(&iov, hostile.region.addr(), &hostile.rkey, None)?;
    check(st == Status::InProgress, || format!("get_zcopy: {st:?}"))?;
    hostile.send_imm(0x1234)?;
    rc.progress_until("the endpoint's failure", Duration::from_secs(60), |_| {
        ep.check().is_err()
    })?;
    let flush = Completion::new();
    let st = ep.flush(Some(&flush));
    let at_flush = written(&local)?;
    println!(
        "peer_vm: flush after a protocol error: {st:?} with {at_flush} of {READ_LEN} bytes written"
    );
    check(at_flush < READ_LEN, || {
        "inconclusive: the READ finished before the flush".into()
    })?;
    check(matches!(st, Ok(Status::InProgress)), || {
        format!("a flush with a READ still in the NIC returned {st:?}: its caller would free the buffer under the READ")
    })?;
    rc.progress_until("the flush's completion", Duration::from_secs(10), |_| {
        flush.is_complete()
    })?;
    check(matches!(flush.result(), Err(UctError::Protocol(_))), || {
        format!(
            "the flush must fail with the peer's protocol error, got {}",
            outcome(&flush)
        )
    })?;
    not_written_after(&mut rc, &local, "the flush completed")?;
    drop(hostile);
    Ok(())
}

/// Review finding 5: a QP whose PD and CQ are of two open contexts is
/// refused by name, before verbs sees it.
fn a_qp_on_a_pd_and_a_cq_of_two_contexts_is_refused() -> Result<(), Failed> {
    let dev = rig::device().ok_or("no RDMA device")?;
    let (a, b) = (
        md_ib::IbMd::open("ib", &dev)?,
        md_ib::IbMd::open("ib", &dev)?,
    );
    let cq = uct_ib::qp::Cq::new(b.pd().context(), 16)?;
    match uct_ib::qp::Qp::new(a.pd(), &cq, 1, 16, 16, 1) {
        Ok(_) => Err("a QP was created on the PD of one context and the CQ of another".into()),
        Err(e) => check(e.to_string().contains("same Context"), || {
            format!("refused, but without saying why: {e}")
        }),
    }
}

/// Finding 12.6, on Drop: dropping an endpoint with a READ outstanding
/// finishes the READ's completion with an error, and the NIC does not
/// write the buffer after the drop returned.
fn drop_with_a_read_outstanding() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let (mut a, b) = rc.pair()?;
    let region = rc.buffer(READ_LEN)?;
    region.write(0, &vec![rig::PATTERN; READ_LEN])?;
    let rkey = rc.rkey(&region)?;
    let local = rc.buffer(READ_LEN)?;
    let comp = Completion::new();
    let iov = [Iov::new(&local, 0, READ_LEN)];
    let st = a.get_zcopy(&iov, region.addr(), &rkey, Some(&comp))?;
    check(st == Status::InProgress, || format!("get_zcopy: {st:?}"))?;
    rc.idle(Duration::from_millis(20));
    drop(a);
    rc.iface.progress();
    check(comp.is_complete(), || {
        "the completion of a READ outstanding when its endpoint was dropped never finished".into()
    })?;
    check(written(&local)? < READ_LEN, || {
        "inconclusive: the READ finished before the drop".into()
    })?;
    check(comp.result().is_err(), || {
        format!(
            "a READ cut short by dropping its endpoint reported {}",
            outcome(&comp)
        )
    })?;
    not_written_after(&mut rc, &local, "the endpoint was dropped")?;
    drop(b);
    Ok(())
}

/// The test: the peer process is killed while a READ from it is
/// posted: no completion reports success, the endpoint fails within the
/// peer timeout, and the buffer is not written after the error.
fn peer_killed_while_a_read_is_posted() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let mut ep = rc.ep()?;
    let peer = Peer::start(&mut rc, ep.as_mut(), READ_LEN)?;
    let local = rc.buffer(READ_LEN)?;
    let comp = Completion::new();
    let iov = [Iov::new(&local, 0, READ_LEN)];
    let st = ep.get_zcopy(&iov, peer.region_addr, &peer.rkey, Some(&comp))?;
    check(st == Status::InProgress, || format!("get_zcopy: {st:?}"))?;
    let qpn = peer.qpn;
    peer.kill()?;
    let killed = Instant::now();
    let took = rc.progress_until(
        "the READ's completion after the peer was killed",
        PEER_TIMEOUT + Duration::from_secs(5),
        |_| comp.is_complete(),
    )?;
    // Taken before the 64 MiB scan below, which takes a debug build a
    // good part of a second under qemu and is not the endpoint's time.
    let found = killed.elapsed();
    println!(
        "peer_vm: peer (QP {qpn:#x}) killed with a READ posted: {} after {took:?}, {} bytes written",
        outcome(&comp),
        written(&local)?
    );
    check(comp.result().is_err(), || {
        format!("a READ from a killed peer reported {}", outcome(&comp))
    })?;
    // The peer timeout, plus the time the READ's bytes ahead of its
    // completion are given (keepalive::FLOOR_BANDWIDTH), plus a second.
    let bound = PEER_TIMEOUT + Liveness::slack(READ_LEN as u64) + Duration::from_secs(1);
    check(found <= bound, || {
        format!("found after {found:?}, not within {bound:?}")
    })?;
    not_written_after(&mut rc, &local, "the error was reported")?;
    check(ep.check().is_err(), || {
        "check() is Ok on a failed endpoint".into()
    })
}

/// Liveness: the peer process dies while our queue pair sits idle, with
/// nothing outstanding; `check` (with `progress`) finds it within the peer
/// timeout, and names the peer's queue pair.
fn keepalive_finds_a_peer_killed_while_idle() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let mut ep = rc.ep()?;
    let peer = Peer::start(&mut rc, ep.as_mut(), 4096)?;
    let st = ep.put_short(&[1u8; 8], peer.region_addr, &peer.rkey)?;
    check(st == Status::Done, || format!("put_short: {st:?}"))?;
    let flushed = Completion::new();
    if ep.flush(Some(&flushed))? == Status::InProgress {
        rc.progress_until(
            "the flush to the live peer",
            Duration::from_secs(10),
            |_| flushed.is_complete(),
        )?;
    }
    check(flushed.result().is_ok(), || outcome(&flushed))?;
    rc.idle(Duration::from_secs(1));
    let qpn = peer.qpn;
    peer.kill()?;
    let killed = Instant::now();
    let limit = PEER_TIMEOUT + Duration::from_secs(1);
    let error = loop {
        rc.iface.progress();
        if let Err(e) = ep.check() {
            break e;
        }
        if killed.elapsed() > limit {
            return Err(format!(
                "check() did not find the peer killed while idle within {limit:?}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    println!(
        "peer_vm: idle peer killed: found after {:?}: {error}",
        killed.elapsed()
    );
    let text = error.to_string();
    check(matches!(error, UctError::EndpointFailed(_)), || {
        format!("not EndpointFailed: {error:?}")
    })?;
    check(text.contains(&format!("QP {qpn:#x}")), || {
        format!("the error does not name the peer's QP {qpn:#x}: {text}")
    })
}

/// No false alarm: a live peer with one unsignalled put outstanding, then
/// nothing, for twice the peer timeout, with `progress` and `check` every
/// turn: the endpoint stays healthy and a flush completes.
fn live_idle_peer_stays_healthy() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let mut ep = rc.ep()?;
    let peer = Peer::start(&mut rc, ep.as_mut(), 4096)?;
    let st = ep.put_short(&[2u8; 8], peer.region_addr, &peer.rkey)?;
    check(st == Status::Done, || format!("put_short: {st:?}"))?;
    let t0 = Instant::now();
    while t0.elapsed() < PEER_TIMEOUT * 2 {
        rc.iface.progress();
        if let Err(e) = ep.check() {
            return Err(format!("a live peer taken for dead after {:?}: {e}", t0.elapsed()).into());
        }
    }
    let flushed = Completion::new();
    let st = ep
        .flush(Some(&flushed))
        .map_err(|e| Failed::from(format!("flush after {:?} idle: {e}", PEER_TIMEOUT * 2)))?;
    if st == Status::InProgress {
        rc.progress_until("the flush", Duration::from_secs(10), |_| {
            flushed.is_complete()
        })?;
    }
    check(flushed.result().is_ok(), || {
        format!("flush: {}", outcome(&flushed))
    })?;
    peer.kill()
}

/// Finding 12.8 (rc): a zero-copy list whose total exceeds the advertised
/// max_zcopy is refused with a named error before anything is posted.
fn zcopy_over_max_zcopy_is_refused() -> Result<(), Failed> {
    let mut rc = Rc::open()?;
    let limits = rc.iface.attrs().put;
    let entries = limits.max_iov.max(1);
    let piece = limits.max_zcopy / entries + 1;
    let (mut a, _b) = rc.pair()?;
    let local = rc.buffer(piece)?;
    let iov: Vec<Iov> = (0..entries).map(|_| Iov::new(&local, 0, piece)).collect();
    let rkey = forged_rkey(1 << 40);
    let total = piece * entries;
    for (what, r) in [
        ("put_zcopy", a.put_zcopy(&iov, 0, &rkey, None)),
        ("get_zcopy", a.get_zcopy(&iov, 0, &rkey, None)),
    ] {
        match r {
            Err(UctError::InvalidParam(m)) if m.contains("max_zcopy") => {
                println!("peer_vm: {what} of {total} bytes refused: {m}")
            }
            other => {
                return Err(format!(
                    "{what} of {total} bytes in {entries} entries (max_zcopy {}) gave {other:?}, not a refusal naming max_zcopy",
                    limits.max_zcopy
                )
                .into())
            }
        }
    }
    Ok(())
}

type TestFn = fn() -> Result<(), Failed>;

fn rc_expected() -> bool {
    match std::env::var("UCT_TEST_EXPECT") {
        Ok(names) => names.split(',').any(|n| n.trim() == "rc"),
        Err(_) => std::env::var_os("RXE_VM_DEVICE").is_some(),
    }
}

fn main() {
    if let Ok(len) = std::env::var(rig::CHILD_ENV) {
        rig::child_main(len.parse().unwrap_or(4096));
    }
    // Before any thread: this binary's own peer timeout, for its children too.
    std::env::set_var("UCT_RC_PEER_TIMEOUT", "3s");
    let mut args = Arguments::from_args();
    // One at a time: the timings are the point, and the VM has two CPUs.
    args.test_threads = Some(1);
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "protocol_error_with_a_read_outstanding",
            protocol_error_with_a_read_outstanding,
        ),
        (
            "flush_after_a_protocol_error_waits_for_the_read",
            flush_after_a_protocol_error_waits_for_the_read,
        ),
        (
            "a_qp_on_a_pd_and_a_cq_of_two_contexts_is_refused",
            a_qp_on_a_pd_and_a_cq_of_two_contexts_is_refused,
        ),
        ("drop_with_a_read_outstanding", drop_with_a_read_outstanding),
        (
            "peer_killed_while_a_read_is_posted",
            peer_killed_while_a_read_is_posted,
        ),
        (
            "keepalive_finds_a_peer_killed_while_idle",
            keepalive_finds_a_peer_killed_while_idle,
        ),
        ("live_idle_peer_stays_healthy", live_idle_peer_stays_healthy),
        (
            "zcopy_over_max_zcopy_is_refused",
            zcopy_over_max_zcopy_is_refused,
        ),
        (
            "thousand_immediates_in_order_after_their_data",
            imm::thousand_immediates_in_order_after_their_data,
        ),
        (
            "immediates_with_no_handler_are_dropped",
            imm::immediates_with_no_handler_are_dropped,
        ),
        (
            "hostile_writes_with_immediate_are_delivered_safely",
            imm::hostile_writes_with_immediate_are_delivered_safely,
        ),
    ];
    let absent = match rig::device() {
        Some(_) => None,
        None => Some(format!(
            "no RDMA device here (devices: {:?}; scripts/rxe-vm runs this with Soft-RoCE)",
            md_ib::verbs::Context::device_names()
        )),
    };
    let expected = rc_expected();
    let trials = tests
        .into_iter()
        .map(|(name, f)| match absent.clone() {
            None => Trial::test(name, f),
            Some(why) if expected => {
                println!("peer_vm: FAILED {name}: this run expects rc, and {why}");
                Trial::test(name, move || {
                    Err(format!("this run expects rc, and {why}").into())
                })
            }
            Some(why) => {
                println!("peer_vm: SKIPPED {name}: {why}");
                Trial::ignorable_test(name, move || Ok(TestDone::ignored_with(why)))
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
