//! A record's busy counter held by a peer that died inside a transfer
//! (issue 12 review, finding 2): the peer counted its access and was killed
//! before it took the count back. Its transfer is over with it, so
//! deregistration must not wait `UCT_CMA_PEER_TIMEOUT` for it, retire the
//! record or keep the memory. The peer is this test binary, re-run with
//! `CMA_BUSY_CHILD` set: it maps our table as any peer does, counts an
//! access, says so, and waits to be killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tl_sm::cma::records::{self, PeerTable};
use uct_core::Access;

const CHILD: &str = "CMA_BUSY_CHILD";
const REGION: u64 = 5;
const SECRET: u64 = 0x5ec2e7;
const BASE: u64 = 0x7100_0000_0000;
const LEN: u64 = 4096;

/// The child: count an access to the record of `CHILD`'s value ("pid path
/// index") and never take it back.
fn hold_a_count(spec: &str) {
    let mut words = spec.split(' ');
    let pid: u32 = words.next().unwrap().parse().unwrap();
    let path = words.next().unwrap();
    let index: u32 = words.next().unwrap().parse().unwrap();
    let table = PeerTable::open(path, pid, REGION).expect("the parent's table");
    let in_flight = table
        .access(index, REGION, SECRET, BASE, 8, Access::REMOTE_WRITE)
        .expect("an access to the parent's record");
    std::mem::forget(in_flight);
    println!("held");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Runs the child against `slot`, waits until it holds a count, and kills
/// it with SIGKILL (reaped).
fn killed_holding_a_count(slot: &records::Slot) {
    let spec = format!("{} {} {}", std::process::id(), slot.table, slot.index);
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "a_dead_peers_count_does_not_hold_deregistration",
            "--nocapture",
        ])
        .env(CHILD, spec)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the child");
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().expect("its stdout"));
    while !line.contains("held") {
        line.clear();
        if out.read_line(&mut line).expect("the child's output") == 0 {
            let _ = child.kill();
            panic!("the child ended before it held a count");
        }
    }
    child.kill().expect("kill the child");
    child.wait().expect("reap the child");
}

#[test]
fn a_dead_peers_count_does_not_hold_deregistration() {
    if let Some(spec) = std::env::var_os(CHILD) {
        return hold_a_count(spec.to_str().expect("a utf-8 spec"));
    }
    let mut slot = records::publish(SECRET, BASE, LEN, Access::all()).expect("publish");
    killed_holding_a_count(&slot);
    let start = Instant::now();
    let drained = slot.retire(Duration::from_secs(5));
    let took = start.elapsed();
    assert!(
        drained && took < Duration::from_secs(1),
        "deregistration waited {took:?} (drained: {drained}) for the count of a peer killed in its transfer"
    );
}
