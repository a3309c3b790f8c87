//! A rail whose link goes down, inside `scripts/rxe-vm --rails 2` (two
//! Soft-RoCE devices: rxe0 on dummy0, rxe1 on dummy1): the rc endpoints on
//! rxe1 fail within [`DEADLINE`] of `ip link set dummy1 down` returning,
//! with an error naming the device, port and reason, their
//! pending operations complete with that error, and traffic on rxe0 goes
//! on. Each test also prints what the layers below did (raw verbs queue
//! pairs, the device's asynchronous events, the port state, tcp on the
//! downed address): docs/rails-testbed.md records it.
//!
//! Outside the VM (`RXE_VM_RAILS` unset), or with fewer than two rails,
//! every test is reported as ignored with the reason: they take links
//! down, which only the VM may do. Each test brings rxe1 back before it
//! ends, so that the tests after it (and the other suites of the same
//! boot) find it ACTIVE.

#[path = "rail_down_vm/observe.rs"]
mod observe;
#[path = "peer_vm/rig.rs"]
// rig.rs serves peer_vm's tests too: this binary uses only its peer
// process and iface helpers.
#[allow(dead_code)]
mod rig;

use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion as TestDone, Failed, Trial};
use uct_core::{Completion, Iov, Status, UctError};

use observe::{sh, wait_active, Raw, Timeline};
use rig::{Peer, Rc};

/// How soon after its link went down an endpoint on it must have failed.
const DEADLINE: Duration = Duration::from_secs(3);
/// The rail taken down, and the one that must go on.
const DOWN_DEV: &str = "rxe1";
const DOWN_LINK: &str = "dummy1";
const UP_DEV: &str = "rxe0";
/// Each put of the stream; a few in flight at once.
const PUT_LEN: usize = 256 << 10;
const IN_FLIGHT: usize = 8;

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// A stream of put_zcopy on one endpoint: at most [`IN_FLIGHT`] at once,
/// each with its completion.
struct Stream {
    name: &'static str,
    ep: rig::Ep,
    local: uct_core::MemHandle,
    remote: (u64, uct_core::RemoteKey),
    pending: Vec<Completion>,
    ok: u64,
    /// The first error, and when it came.
    failed: Option<(Instant, UctError)>,
    /// Puts that completed with an error.
    errors: u64,
    /// Posts refused, with the first refusal.
    refused: Option<(Instant, UctError)>,
    /// The receiving endpoint and buffer of an in-process pair, dropped
    /// after `ep`.
    keep: Option<(rig::Ep, uct_core::MemHandle)>,
}

impl Stream {
    fn new(
        name: &'static str,
        ep: rig::Ep,
        local: uct_core::MemHandle,
        remote: (u64, uct_core::RemoteKey),
    ) -> Self {
        Stream {
            name,
            ep,
            local,
            remote,
            pending: Vec::new(),
            ok: 0,
            failed: None,
            errors: 0,
            refused: None,
            keep: None,
        }
    }

    /// Reaps what completed, then posts while there is room (and no post
    /// was refused).
    fn turn(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            if !self.pending[i].is_complete() {
                i += 1;
                continue;
            }
            let c = self.pending.swap_remove(i);
            match c.result() {
                Ok(()) => self.ok += 1,
                Err(e) => {
                    self.errors += 1;
                    self.failed.get_or_insert((Instant::now(), e));
                }
            }
        }
        while self.refused.is_none() && self.pending.len() < IN_FLIGHT {
            let c = Completion::new();
            let iov = [Iov::new(&self.local, 0, PUT_LEN)];
            match self
                .ep
                .put_zcopy(&iov, self.remote.0, &self.remote.1, Some(&c))
            {
                Ok(Status::InProgress) => self.pending.push(c),
                Ok(Status::Done) => self.ok += 1,
                Ok(Status::NoResource) => break,
                Err(e) => self.refused = Some((Instant::now(), e)),
            }
        }
    }
}

/// Runs `streams` (with progress on `rcs`) until `until` says stop or
/// `limit` passes.
fn drive(
    rcs: &mut [&mut Rc],
    streams: &mut [&mut Stream],
    limit: Duration,
    mut until: impl FnMut(&mut [&mut Stream]) -> bool,
) -> Duration {
    let t0 = Instant::now();
    while t0.elapsed() < limit && !until(streams) {
        for rc in rcs.iter_mut() {
            rc.iface.progress();
        }
        for s in streams.iter_mut() {
            s.turn();
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    t0.elapsed()
}

/// The rc test: a put stream from this process to a peer process on rxe1
/// and one on rxe0 in this process; dummy1 goes down mid-stream.
fn link_down_fails_rxe1_endpoints_and_spares_rxe0() -> Result<(), Failed> {
    let mut rc1 = Rc::open_on(DOWN_DEV)?;
    let mut ep1 = rc1.ep()?;
    let mut peer = Peer::start(&mut rc1, ep1.as_mut(), PUT_LEN)?;
    let local1 = rc1.buffer(PUT_LEN)?;
    let mut s1 = Stream::new(
        "rxe1 (to a peer process)",
        ep1,
        local1,
        (
            peer.region_addr,
            std::mem::replace(
                &mut peer.rkey,
                uct_core::RemoteKey::new("ib", "none", Box::new(0u8)),
            ),
        ),
    );
    let mut rc0 = Rc::open_on(UP_DEV)?;
    let mut s0 = pair_stream_on(&mut rc0, "rxe0 (in process)")?;
    // Raw verbs beside it: a QP pair on rxe1 that nothing watches, and the
    // device's events and port state as seen from a context of its own.
    let mut raw = Raw::open(DOWN_DEV, PUT_LEN)?;
    let mut tl = Timeline::new(DOWN_DEV)?;

    drive(
        &mut [&mut rc1, &mut rc0],
        &mut [&mut s1, &mut s0],
        Duration::from_secs(2),
        |_| false,
    );
    check(
        s1.ok > 0 && s0.ok > 0 && s1.failed.is_none() && s0.failed.is_none(),
        || {
            format!(
                "before the link went down: rxe1 {} puts ({:?}), rxe0 {} puts ({:?})",
                s1.ok, s1.failed, s0.ok, s0.failed
            )
        },
    )?;
    let (before1, before0) = (s1.ok, s0.ok);
    let raw_before = raw.ok;

    let t0 = Instant::now();
    sh(&format!("ip link set {DOWN_LINK} down"))?;
    // The deadline runs from here: the command returns once the kernel
    // took the link down, which under emulation took up to 1.7 s.
    let down_at = t0.elapsed();
    println!("rail_down_vm: ip link set {DOWN_LINK} down took {down_at:?}");
    let mut check_err: Option<(Duration, UctError)> = None;
    drive(
        &mut [&mut rc1, &mut rc0],
        &mut [&mut s1, &mut s0],
        DEADLINE + Duration::from_secs(5),
        |s| {
            raw.turn();
            tl.look(t0);
            if check_err.is_none() {
                if let Err(e) = s[0].ep.check() {
                    check_err = Some((t0.elapsed(), e));
                }
            }
            check_err.is_some() && s[0].pending.is_empty() && t0.elapsed() > down_at + DEADLINE
        },
    );
    // The raw pair for longer: does the QP ever fail by itself?
    let raw_limit = Duration::from_secs(12);
    while t0.elapsed() < raw_limit && raw.failed.is_none() {
        raw.turn();
        tl.look(t0);
        rc0.iface.progress();
        s0.turn();
    }
    tl.print();
    raw.print(t0, raw_before);
    println!(
        "rail_down_vm: rxe1 endpoint: check() failed after {:?}: {}",
        check_err.as_ref().map(|c| c.0),
        check_err.as_ref().map_or("no".into(), |c| c.1.to_string())
    );
    println!(
        "rail_down_vm: {}: {} puts after the link went down, {} failed, first after {:?}: {:?}; {} still pending; post refused after {:?}",
        s1.name,
        s1.ok - before1,
        s1.errors,
        s1.failed.as_ref().map(|f| f.0.saturating_duration_since(t0)),
        s1.failed.as_ref().map(|f| f.1.to_string()),
        s1.pending.len(),
        s1.refused.as_ref().map(|f| f.0.saturating_duration_since(t0)),
    );
    println!(
        "rail_down_vm: {}: {} puts completed after {DOWN_LINK} went down, {} failed",
        s0.name,
        s0.ok - before0,
        s0.errors
    );
    let restored = restore_link();
    drop(peer);

    let (took, err) = check_err.ok_or("the rxe1 endpoint's check() never failed")?;
    let late = |at: Duration| at.saturating_sub(down_at) > DEADLINE;
    check(!late(took), || {
        format!("the rxe1 endpoint failed {took:?} after `ip link set {DOWN_LINK} down` started ({down_at:?} after it returned), over the deadline {DEADLINE:?}")
    })?;
    if let Some((at, _)) = &s1.failed {
        let at = at.saturating_duration_since(t0);
        check(!late(at), || {
            format!("the first put on rxe1 failed {at:?} after the link went down, over the deadline {DEADLINE:?}")
        })?;
    }
    let text = err.to_string();
    check(
        matches!(err, UctError::EndpointFailed(_))
            && text.contains("rxe1 port 1")
            && text.contains("DOWN"),
        || {
            format!("the rxe1 endpoint's error must be EndpointFailed naming rxe1 port 1 and DOWN: {err:?}")
        },
    )?;
    check(s1.pending.is_empty(), || {
        format!(
            "{} puts on rxe1 still pending {:?} after the link went down",
            s1.pending.len(),
            t0.elapsed()
        )
    })?;
    check(s1.errors > 0 || s1.refused.is_some(), || {
        "no put on rxe1 reported the failure".into()
    })?;
    if let Some((_, e)) = &s1.failed {
        check(e.to_string().contains("rxe1"), || {
            format!("a failed put's error does not name rxe1: {e}")
        })?;
    }
    check(s0.errors == 0 && s0.refused.is_none(), || {
        format!("rxe0 failed: {:?} {:?}", s0.failed, s0.refused)
    })?;
    check(s0.ok > before0, || {
        "no put on rxe0 completed after dummy1 went down".into()
    })?;
    restored?;
    // A new endpoint on the port once it is ACTIVE again works.
    let mut rc1b = Rc::open_on(DOWN_DEV)?;
    let mut fresh = pair_stream_on(&mut rc1b, "rxe1 (a new pair)")?;
    drive(
        &mut [&mut rc1b],
        &mut [&mut fresh],
        Duration::from_secs(10),
        |s| s[0].ok >= 4 || s[0].failed.is_some(),
    );
    check(fresh.ok >= 4 && fresh.failed.is_none(), || {
        format!(
            "a new rxe1 endpoint after the link came back: {} puts, {:?}",
            fresh.ok, fresh.failed
        )
    })?;
    Ok(())
}

/// A stream between two endpoints of `rc`, which it keeps.
fn pair_stream_on(rc: &mut Rc, name: &'static str) -> Result<Stream, Failed> {
    let (a, b) = rc.pair()?;
    let target = rc.buffer(PUT_LEN)?;
    let rkey = rc.rkey(&target)?;
    let local = rc.buffer(PUT_LEN)?;
    let addr = target.addr();
    let mut s = Stream::new(name, a, local, (addr, rkey));
    s.keep = Some((b, target));
    Ok(s)
}

/// Brings dummy1 up and waits for rxe1 to be ACTIVE again.
fn restore_link() -> Result<(), Failed> {
    sh(&format!("ip link set {DOWN_LINK} up"))?;
    let took = wait_active(DOWN_DEV, Duration::from_secs(20))?;
    println!("rail_down_vm: {DOWN_DEV} ACTIVE again {took:?} after ip link set {DOWN_LINK} up");
    Ok(())
}

type TestFn = fn() -> Result<(), Failed>;

fn main() {
    if let Ok(len) = std::env::var(rig::CHILD_ENV) {
        rig::child_main(len.parse().unwrap_or(4096));
    }
    // Before any thread: the peer process serves on rxe1 (rig's device()),
    // and a dead peer is not what these tests are about.
    std::env::set_var("RXE_VM_DEVICE", DOWN_DEV);
    std::env::set_var("UCT_RC_PEER_TIMEOUT", "30s");
    let mut args = Arguments::from_args();
    // One at a time: they take the same link down.
    args.test_threads = Some(1);
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "link_down_fails_rxe1_endpoints_and_spares_rxe0",
            link_down_fails_rxe1_endpoints_and_spares_rxe0,
        ),
        (
            "tcp_on_the_downed_address",
            observe::tcp_on_the_downed_address,
        ),
        (
            "rdma_link_delete_with_the_device_open",
            observe::rdma_link_delete_with_the_device_open,
        ),
    ];
    let absent = match std::env::var("RXE_VM_RAILS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    {
        None => Some(
            "not inside scripts/rxe-vm (RXE_VM_RAILS unset): these tests take links down"
                .to_string(),
        ),
        Some(n) if n < 2 => Some(format!("RXE_VM_RAILS={n}: run scripts/rxe-vm --rails 2")),
        Some(_) => None,
    };
    let trials = tests
        .into_iter()
        .map(|(name, f)| match absent.clone() {
            None => Trial::test(name, f),
            Some(why) => {
                println!("rail_down_vm: SKIPPED {name}: {why}");
                Trial::ignorable_test(name, move || Ok(TestDone::ignored_with(why)))
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
