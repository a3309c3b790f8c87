//! The transfer API between two processes, over posix, tcp and rc (self
//! reaches its own process only: reported skipped, by name). This binary
//! is both sides: run with UCT_TRANSFER_CHILD set, it is the peer, driven
//! over its stdin and stdout.
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

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{fill_of, len_of, within};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use uct_transfer::{Memory, MemoryType, Progress, RemoteBuffer, Transport};

/// The transports of the two-process tests; `self` is listed to be
/// reported as skipped.
const TRANSPORTS: [&str; 4] = ["self", "posix", "tcp", "rc"];

/// The peer timeout both sides run with: a dead peer must be found within
/// it (and [`GRACE`]).
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(3);

/// Writes in flight when the peer is killed, and the length of each.
const KILL_WRITES: usize = 32;
const KILL_LEN: usize = 1 << 20;
/// Writes posted on rc once the killed peer is reaped.
const AFTER_KILL: usize = 4;

/// How much longer than the peer timeout `tl` may take to find the peer
/// dead with the kill scenario's writes in flight. rc finds a dead peer by
/// the clock only (rxe never times out a QP whose peer is gone): a
/// completion due, or a keepalive sent after half the timeout, is waited
/// for up to the peer timeout plus the time the bytes posted ahead of it
/// take at 64 MiB/s (UCT_RC_PEER_TIMEOUT's documentation), so that a slow
/// but live peer is not given up. 36 MiB ahead at most: 0.56 s more.
fn slack(tl: &str) -> Duration {
    if tl == "rc" {
        let ahead = (KILL_WRITES + AFTER_KILL) * KILL_LEN;
        Duration::from_secs_f64(ahead as f64 / (64u64 << 20) as f64)
    } else {
        Duration::ZERO
    }
}

const CONCURRENT_THREADS: usize = 4;
const CONCURRENT_EACH: usize = 16;
const CONCURRENT_LEN: usize = 16 << 10;
const ORDERED: usize = 10_000;
const SLOT: usize = 64;
const PING_LEN: usize = 8192;

fn size_of(scenario: &str) -> usize {
    match scenario {
        "concurrent" => CONCURRENT_THREADS * CONCURRENT_EACH * CONCURRENT_LEN,
        "ordering" => ORDERED * SLOT,
        "kill" => KILL_LEN,
        _ => PING_LEN,
    }
}

fn build(tl: &str) -> Transport {
    common::transport(tl, Progress::Thread)
}

/// How `tl` notifies: by immediate on rc, by message on posix and tcp.
fn by_immediate(tl: &str) -> bool {
    tl == "rc"
}

/// Checks that `count` notifications reached `t`, each the way `tl` sends
/// them (and none the other way).
fn received_as_expected(tl: &str, t: &Transport, count: u64) -> Result<(), String> {
    let s = t.stats();
    let got = (
        s.notifications_received_by_immediate,
        s.notifications_received_by_message,
    );
    let want = if by_immediate(tl) {
        (count, 0)
    } else {
        (0, count)
    };
    if got != want {
        return Err(format!(
            "{tl}: notifications received (by immediate, by message): {got:?}, expected {want:?}"
        ));
    }
    Ok(())
}

/// Checks that `t` sent `count` notifications, each the way `tl` sends
/// them.
fn sent_as_expected(tl: &str, t: &Transport, count: u64) -> Result<(), String> {
    let s = t.stats();
    let got = (
        s.notifications_sent_by_immediate,
        s.notifications_sent_by_message,
    );
    let want = if by_immediate(tl) {
        (count, 0)
    } else {
        (0, count)
    };
    if got != want {
        return Err(format!(
            "{tl}: notifications sent (by immediate, by message): {got:?}, expected {want:?}"
        ));
    }
    Ok(())
}

/// The peer process: connects, swaps keys, runs its side of `scenario`,
/// prints `ok` or `bad: why`.
fn child(tl: &str, scenario: &str) -> Result<(), String> {
    let t = build(tl);
    let mem = Memory::alloc(&t, MemoryType::Host, size_of(scenario)).map_err(|e| e.to_string())?;
    println!("url {}", t.bind().map_err(|e| e.to_string())?);
    println!("key {}", mem.remote_key());
    let mut lines = std::io::stdin().lock().lines();
    let mut next = |prefix: &str| -> Result<String, String> {
        let line = lines
            .next()
            .ok_or("stdin closed")?
            .map_err(|e| e.to_string())?;
        line.strip_prefix(prefix)
            .map(str::to_string)
            .ok_or_else(|| format!("expected {prefix:?}, got {line:?}"))
    };
    t.connect(&next("url ")?).map_err(|e| e.to_string())?;
    let remote = RemoteBuffer::parse(&next("key ")?).map_err(|e| e.to_string())?;
    println!("connected");
    let verdict = match scenario {
        "pingpong" => {
            let n = within("ping", &[], t.wait_for_write()).map_err(|e| e.to_string())?;
            let mut got = vec![0u8; n.len];
            mem.read_bytes(0, &mut got).map_err(|e| e.to_string())?;
            if n.len != PING_LEN || got.iter().any(|&b| b != 0xab) {
                return Err(format!("ping of {} bytes, data wrong", n.len));
            }
            received_as_expected(tl, &t, 1)?;
            mem.write_bytes(0, &vec![0xcd; PING_LEN])
                .map_err(|e| e.to_string())?;
            within(
                "pong",
                &[],
                t.write_tagged(&mem.whole(), &remote, n.tag + 1),
            )
            .map_err(|e| e.to_string())?;
            Ok(())
        }
        "concurrent" => {
            let total = CONCURRENT_THREADS * CONCURRENT_EACH;
            let mut tags = Vec::new();
            for _ in 0..total {
                let n =
                    within("a notification", &[], t.wait_for_write()).map_err(|e| e.to_string())?;
                tags.push(n.tag);
            }
            tags.sort_unstable();
            if tags != (0..total as u32).collect::<Vec<_>>() {
                return Err(format!("tags {tags:?}"));
            }
            received_as_expected(tl, &t, total as u64)?;
            let mut got = vec![0u8; CONCURRENT_LEN];
            for i in 0..total {
                mem.read_bytes(i * CONCURRENT_LEN, &mut got)
                    .map_err(|e| e.to_string())?;
                if got.iter().any(|&b| b != fill_of(i)) {
                    return Err(format!("region {i} holds the wrong bytes"));
                }
            }
            Ok(())
        }
        "ordering" => {
            let mut last = [0u8; 1];
            for i in 0..ORDERED {
                let n =
                    within("a notification", &[], t.wait_for_write()).map_err(|e| e.to_string())?;
                if (n.tag, n.len) != (i as u32, len_of(i, SLOT)) {
                    return Err(format!("notification {i} was {n:?}"));
                }
                mem.read_bytes(i * SLOT + n.len - 1, &mut last)
                    .map_err(|e| e.to_string())?;
                if last[0] != fill_of(i) {
                    return Err(format!("write {i} was stale when its notification came"));
                }
            }
            received_as_expected(tl, &t, ORDERED as u64)?;
            Ok(())
        }
        "kill" => {
            // Stay connected until killed.
            std::thread::sleep(Duration::from_secs(600));
            Ok(())
        }
        other => Err(format!("unknown scenario {other}")),
    };
    verdict?;
    println!("ok");
    // Stay until the parent is done with our memory.
    let _ = next("quit");
    Ok(())
}

/// The parent's view of the peer process.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn spawn(tl: &str, scenario: &str) -> Result<Peer, Failed> {
        let mut child = Command::new(std::env::current_exe()?)
            .env("UCT_TRANSFER_CHILD", format!("{tl}:{scenario}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Peer {
            child,
            stdin,
            lines,
        })
    }

    fn expect(&self, prefix: &str) -> Result<String, Failed> {
        let line = self.lines.recv_timeout(common::LIMIT).map_err(|_| {
            format!(
                "the peer said nothing within {:?} (wanted {prefix:?})",
                common::LIMIT
            )
        })?;
        if let Some(rest) = line.strip_prefix("bad: ") {
            return Err(format!("the peer failed: {rest}").into());
        }
        line.strip_prefix(prefix)
            .map(str::to_string)
            .ok_or_else(|| format!("expected {prefix:?} from the peer, got {line:?}").into())
    }

    fn say(&mut self, line: &str) -> Result<(), Failed> {
        writeln!(self.stdin, "{line}")?;
        Ok(self.stdin.flush()?)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Both sides connected, and the peer's memory as a remote buffer.
fn connect(tl: &str, scenario: &str) -> Result<(Transport, Memory, RemoteBuffer, Peer), Failed> {
    let mut peer = Peer::spawn(tl, scenario)?;
    let t = build(tl);
    let mem = Memory::alloc(&t, MemoryType::Host, size_of(scenario))?;
    let ours = t.bind()?;
    let url = peer.expect("url ")?;
    let key = peer.expect("key ")?;
    t.connect(&url)?;
    peer.say(&format!("url {ours}"))?;
    peer.say(&format!("key {}", mem.remote_key()))?;
    peer.expect("connected")?;
    Ok((t, mem, RemoteBuffer::parse(&key)?, peer))
}

fn pingpong(tl: &str) -> Result<(), Failed> {
    let (t, mem, remote, mut peer) = connect(tl, "pingpong")?;
    mem.write_bytes(0, &vec![0xab; PING_LEN])?;
    let w = t.write_tagged(&mem.whole(), &remote, 41);
    within("the ping", &[], w)?;
    // The pong lands in our memory, after our ping was read.
    let n = within("the pong", &[], t.wait_for_write())?;
    assert_eq!((n.len, n.tag), (PING_LEN, 42));
    let mut got = vec![0u8; PING_LEN];
    mem.read_bytes(0, &mut got)?;
    assert!(got.iter().all(|&b| b == 0xcd), "{tl}: pong data");
    peer.expect("ok")?;
    sent_as_expected(tl, &t, 1)?;
    received_as_expected(tl, &t, 1)?;
    peer.say("quit")?;
    Ok(())
}

fn concurrent(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "concurrent")?;
    for i in 0..CONCURRENT_THREADS * CONCURRENT_EACH {
        src.write_bytes(i * CONCURRENT_LEN, &vec![fill_of(i); CONCURRENT_LEN])?;
    }
    let t = std::sync::Arc::new(t);
    let writers: Vec<_> = (0..CONCURRENT_THREADS)
        .map(|k| {
            let (t, src, remote) = (t.clone(), src.clone(), remote.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let futs: Vec<_> = (0..CONCURRENT_EACH)
                    .map(|j| {
                        let i = k * CONCURRENT_EACH + j;
                        let at = i * CONCURRENT_LEN;
                        let view = src.view(at, CONCURRENT_LEN).map_err(|e| e.to_string())?;
                        let to = remote
                            .slice(at, CONCURRENT_LEN)
                            .map_err(|e| e.to_string())?;
                        Ok(t.write_tagged(&view, &to, i as u32))
                    })
                    .collect::<Result<_, String>>()?;
                for f in futs {
                    within("a write", &[], f).map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for w in writers {
        w.join().map_err(|_| "a writer panicked")??;
    }
    peer.expect("ok")?;
    sent_as_expected(tl, &t, (CONCURRENT_THREADS * CONCURRENT_EACH) as u64)?;
    peer.say("quit")?;
    Ok(())
}

fn ordering(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "ordering")?;
    for i in 0..ORDERED {
        src.write_bytes(i * SLOT, &[fill_of(i); SLOT])?;
    }
    let mut futs = Vec::with_capacity(ORDERED);
    for i in 0..ORDERED {
        let len = len_of(i, SLOT);
        futs.push(t.write_tagged(
            &src.view(i * SLOT, len)?,
            &remote.slice(i * SLOT, len)?,
            i as u32,
        ));
    }
    for f in futs {
        within("a write", &[], f)?;
    }
    peer.expect("ok")?;
    sent_as_expected(tl, &t, ORDERED as u64)?;
    peer.say("quit")?;
    Ok(())
}

/// SIGKILL the peer with a wait and writes pending: they all end with an
/// error within the peer timeout (and a grace for the machine's load, and
/// on rc the [`slack`] its peer timeout gives the bytes in flight).
fn kill(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "kill")?;
    let wait = t.wait_for_write();
    // Writes in flight when the peer dies.
    let pending: Vec<_> = (0..KILL_WRITES)
        .map(|_| t.write(&src.whole(), &remote, true))
        .collect();
    peer.child.kill()?;
    let killed = Instant::now();
    let _ = peer.child.wait();
    // On rc the writes above may all land while the killed process is torn
    // down; writes posted now, to a peer that is gone, are pending when it
    // is found dead: nothing will acknowledge them. (posix writes land in
    // the call, into memory we still map; tcp may buffer: not asserted.)
    let after: Vec<_> = if tl == "rc" {
        (0..AFTER_KILL)
            .map(|_| t.write(&src.whole(), &remote, true))
            .collect()
    } else {
        Vec::new()
    };
    let err = within("the wait", &[], wait).expect_err("a wait on a dead peer resolved Ok");
    let took = killed.elapsed();
    let limit = PEER_TIMEOUT + slack(tl) + GRACE;
    assert!(took < limit, "{tl}: the wait ended after {took:?}: {err}");
    // Each pending write ends, landed before the kill or failed.
    let failed = pending
        .into_iter()
        .map(|w| within("a pending write", &[], w))
        .filter(Result::is_err)
        .count();
    for (i, w) in after.into_iter().enumerate() {
        let r = within("a write posted after the kill", &[], w);
        assert!(r.is_err(), "{tl}: write {i} to the dead peer succeeded");
    }
    // Every later write fails too, at once.
    let e = within("a later write", &[], t.write(&src.whole(), &remote, true));
    assert!(e.is_err(), "{tl}: a write to a dead peer succeeded");
    assert!(
        killed.elapsed() < limit,
        "{tl}: took {:?}",
        killed.elapsed()
    );
    eprintln!(
        "{tl}: the wait ended {took:?} after SIGKILL ({failed} of {KILL_WRITES} writes pending at the kill failed): {err}"
    );
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
        if let Err(e) = child(tl, scenario) {
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
    let scenarios: [(&str, Scenario); 4] = [
        ("ping_pong", pingpong),
        ("concurrent_writes_from_four_threads", concurrent),
        ("ten_thousand_notified_writes_never_stale", ordering),
        ("peer_killed_with_sigkill", kill),
    ];
    let mut trials = Vec::new();
    for tl in TRANSPORTS {
        for (name, f) in scenarios {
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
