//! Finding 12.9 for tcp: `Endpoint::check` finds a peer that died with
//! nothing outstanding, within UCT_TCP_PEER_TIMEOUT, and names it; whether
//! the waiting loop progresses the iface or only checks.

mod common;

use std::time::{Duration, Instant};

use common::Victim;
use libtest_mimic::{Arguments, Failed, Trial};

const TIMEOUT_MS: u64 = 1500;

/// Kills a victim after a good transfer, then turns a waiting loop (with or
/// without progress) until `check` fails; returns how long that took.
fn killed_peer_found(progress: bool) -> Result<(), Failed> {
    let mut victim = Victim::spawn(&[]);
    let port = victim.peer().port;
    let mut peer = victim.legit_peer()?;
    peer.transfer(1, Duration::from_secs(10))?;
    peer.check()
        .map_err(|e| format!("check failed with the peer alive: {e}"))?;
    victim.kill();
    let limit = Duration::from_millis(TIMEOUT_MS + 1000);
    let t0 = Instant::now();
    let err = loop {
        if progress {
            peer.iface.progress();
        }
        if let Err(e) = peer.check() {
            break e;
        }
        if t0.elapsed() > limit {
            return Err(format!(
                "check still Ok {limit:?} after the peer was killed (progress: {progress})"
            )
            .into());
        }
    };
    let took = t0.elapsed();
    println!("check found the killed peer after {took:?}: {err}");
    if !matches!(err, uct_core::UctError::EndpointFailed(_)) {
        return Err(format!("check failed with {err:?}, not EndpointFailed").into());
    }
    if !err.to_string().contains(&format!(":{port}")) && !err.to_string().contains("127.0.0.1") {
        return Err(format!("the error does not name the peer: {err}").into());
    }
    Ok(())
}

fn main() {
    if std::env::var(common::ROLE).as_deref() == Ok("victim") {
        common::victim_main();
    }
    std::env::set_var("UCT_TCP_PEER_TIMEOUT", format!("{TIMEOUT_MS}ms"));
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("check_alone_finds_a_killed_peer", || {
            killed_peer_found(false)
        }),
        Trial::test("check_with_progress_finds_a_killed_peer", || {
            killed_peer_found(true)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
