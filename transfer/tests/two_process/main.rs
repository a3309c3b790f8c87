//! The transfer API between two processes, over posix, tcp and rc (self
//! reaches its own process only: reported skipped, by name). This binary
//! is both sides: run with UCT_TRANSFER_CHILD set, it is the peer, driven
//! over its stdin and stdout ([`child`]).
//!
//! - [`basic`]: ping-pong, 64 concurrent writes from 4 threads, 10,000
//!   notified writes never stale, a peer killed with SIGKILL.
//! - [`refusals`]: the peer's URL truncated, of another version or
//!   transport, or of a killed process; the peer's read-only memory (a
//!   write refused here, and through a forged key by the peer's
//!   transport), a stale key, out-of-range slices and views; a refused
//!   notified write is never notified.
//! - [`drops`]: a peer that drops its Transport, and ours dropped, with
//!   operations pending.
//! - [`runtimes`]: the futures under tokio and futures::executor::block_on.
//!
//! rc runs where an RDMA device is (inside scripts/rxe-vm, Soft-RoCE on
//! rxe0). There (`RXE_VM_DEVICE` set), or where `UCT_TEST_EXPECT` names rc,
//! rc is expected: if it is absent, its tests fail with the reason.
//! Elsewhere they are reported as skipped, by name, with the reason.
//!
//! Every receiving side checks how its notifications travelled
//! ([`Transport::stats`]): on rc each one is the immediate of one RDMA
//! WRITE WITH IMMEDIATE (the receiver saw IBV_WC_RECV_RDMA_WITH_IMM) and
//! none is a message; on posix and tcp each one is a message.

#[path = "../common/mod.rs"]
mod common;

mod basic;
mod child;
mod drops;
mod peer;
mod refusals;
mod runtimes;

use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use uct_transfer::{Progress, Transport};

/// The transports of the two-process tests; `self` is listed to be
/// reported as skipped.
const TRANSPORTS: [&str; 4] = ["self", "posix", "tcp", "rc"];

/// The peer timeout both sides run with: a dead peer must be found within
/// it (and [`GRACE`]).
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(3);

/// How much longer than the peer timeout `tl` may take to find the peer
/// dead with `ahead` bytes of writes in flight. rc finds a dead peer by
/// the clock only (rxe never times out a QP whose peer is gone): a
/// completion due, or a keepalive sent after half the timeout, is waited
/// for up to the peer timeout plus the time the bytes posted ahead of it
/// take at 64 MiB/s (UCT_RC_PEER_TIMEOUT's documentation), so that a slow
/// but live peer is not given up.
fn slack(tl: &str, ahead: usize) -> Duration {
    if tl == "rc" {
        Duration::from_secs_f64(ahead as f64 / (64u64 << 20) as f64)
    } else {
        Duration::ZERO
    }
}

fn build(tl: &str) -> Transport {
    common::transport(tl, Progress::Thread)
}

/// How `tl` notifies: by immediate on rc and tcp, by message on posix.
fn by_immediate(tl: &str) -> bool {
    tl == "rc" || tl == "tcp"
}

/// A transport other than `tl` that runs wherever `tl` does, for the
/// refusals of another transport's URL and key.
fn other_of(tl: &str) -> &'static str {
    if tl == "tcp" {
        "posix"
    } else {
        "tcp"
    }
}

/// Checks that `count` notifications reached `t`, each the way `tl` sends
/// them (and none the other way).
fn received_as_expected(tl: &str, t: &Transport, count: u64) -> Result<(), String> {
    let s = t.stats();
    let got = (
        s.notifications_received_by_immediate,
        s.notifications_received_by_message,
    );
    as_expected(tl, "received", got, count)
}

/// Checks that `t` sent `count` notifications, each the way `tl` sends
/// them.
fn sent_as_expected(tl: &str, t: &Transport, count: u64) -> Result<(), String> {
    let s = t.stats();
    let got = (
        s.notifications_sent_by_immediate,
        s.notifications_sent_by_message,
    );
    as_expected(tl, "sent", got, count)
}

/// `got` (by immediate, by message) against `count`, all of them the way
/// `tl` notifies.
fn as_expected(tl: &str, what: &str, got: (u64, u64), count: u64) -> Result<(), String> {
    let want = if by_immediate(tl) {
        (count, 0)
    } else {
        (0, count)
    };
    if got != want {
        return Err(format!(
            "{tl}: notifications {what} (by immediate, by message): {got:?}, expected {want:?}"
        ));
    }
    Ok(())
}

/// Why rc cannot run here, if it cannot: no usable rc device (as
/// transport-info says), or no component provides rc at all.
fn rc_absent() -> Option<String> {
    let probes = Transport::probe();
    if probes.iter().any(|p| p.transport == "rc" && p.usable) {
        return None;
    }
    Some(
        probes
            .into_iter()
            .find(|p| p.transport == "rc")
            .and_then(|p| p.reason)
            .unwrap_or_else(|| uct_core::Registry::global().explain_absent("rc")),
    )
}

/// Whether this run expects rc: inside scripts/rxe-vm (which sets
/// `RXE_VM_DEVICE`), or where `UCT_TEST_EXPECT` names rc.
fn rc_expected() -> bool {
    match std::env::var("UCT_TEST_EXPECT") {
        Ok(names) => names.split(',').any(|n| n.trim() == "rc"),
        Err(_) => std::env::var_os("RXE_VM_DEVICE").is_some(),
    }
}

/// A scenario, run over the transport it is given.
type Scenario = fn(&str) -> Result<(), Failed>;

const SCENARIOS: [(&str, Scenario); 13] = [
    ("ping_pong", basic::pingpong),
    ("concurrent_writes_from_four_threads", basic::concurrent),
    ("ten_thousand_notified_writes_never_stale", basic::ordering),
    ("peer_killed_with_sigkill", basic::kill),
    (
        "peer_urls_truncated_of_another_version_or_transport_refused",
        refusals::peer_urls,
    ),
    ("a_killed_peers_url_refused", refusals::killed_peers_url),
    (
        "bad_keys_views_and_slices_refused_by_name",
        refusals::keys_views_and_slices,
    ),
    (
        "a_key_forged_to_write_read_only_memory_refused_by_the_peer",
        refusals::forged_key,
    ),
    ("a_stale_key_refused", refusals::stale_key),
    (
        "a_peer_that_drops_its_transport_fails_pending_operations",
        drops::peer_drops_its_transport,
    ),
    (
        "a_transport_dropped_with_operations_pending_resolves_them",
        drops::ours_dropped,
    ),
    ("futures_under_tokio_across_tasks", runtimes::under_tokio),
    ("futures_under_block_on", runtimes::under_block_on),
];

fn main() {
    for tl in ["POSIX", "TCP", "RC"] {
        // Before the registry reads the environment, in both processes.
        std::env::set_var(
            format!("UCT_{tl}_PEER_TIMEOUT"),
            format!("{}ms", PEER_TIMEOUT.as_millis()),
        );
    }
    if let Ok(what) = std::env::var("UCT_TRANSFER_CHILD") {
        let (tl, scenario) = what.split_once(':').unwrap_or((&what, ""));
        if let Err(e) = child::run(tl, scenario) {
            println!("bad: {e}");
            std::process::exit(1);
        }
        return;
    }
    let mut args = Arguments::from_args();
    let rc_absent = rc_absent();
    if rc_absent.is_none() && args.test_threads.is_none() {
        // One at a time where rc runs (the VM's two CPUs): the kill
        // scenario measures a deadline that contention would blur.
        args.test_threads = Some(1);
    }
    let rc_expected = rc_expected();
    let mut trials = Vec::new();
    for tl in TRANSPORTS {
        for (name, f) in SCENARIOS {
            let name = format!("{tl}::{name}");
            if tl == "self" {
                println!("two_process: SKIPPED {name}: self reaches its own process only");
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            match (tl, &rc_absent) {
                ("rc", Some(why)) if rc_expected => {
                    println!(
                        "two_process: FAILED {name}: this run expects rc, and it is absent ({why})"
                    );
                    let why = why.clone();
                    trials.push(Trial::test(name, move || {
                        Err(format!("this run expects rc, and it is absent: {why}").into())
                    }));
                }
                ("rc", Some(why)) => {
                    println!("two_process: SKIPPED {name}: rc is not available here ({why})");
                    let why = why.clone();
                    trials.push(Trial::ignorable_test(name, move || {
                        Ok(Completion::ignored_with(format!(
                            "rc is not available here: {why}"
                        )))
                    }));
                }
                _ => trials.push(Trial::test(name, move || f(tl))),
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
