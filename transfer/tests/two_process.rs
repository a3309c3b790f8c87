//! The transfer API between two processes, over posix and tcp (self
//! reaches its own process only: reported skipped, by name). This binary
//! is both sides: run with UCT_TRANSFER_CHILD set, it is the peer, driven
//! over its stdin and stdout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{fill_of, len_of, within};
use libtest_mimic::{Arguments, Failed, Trial};
use uct_transfer::{Memory, MemoryType, Progress, RemoteBuffer, Transport};

/// The transports of the two-process tests; `self` is listed to be
/// reported as skipped.
const TRANSPORTS: [&str; 3] = ["self", "posix", "tcp"];

/// The peer timeout both sides run with: a dead peer must be found within
/// it (and [`GRACE`]).
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(3);

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
        "kill" => 1 << 20,
        _ => PING_LEN,
    }
}

fn build(tl: &str) -> Transport {
    common::transport(tl, Progress::Thread)
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
    peer.say("quit")?;
    Ok(())
}

fn ordering(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "ordering")?;
    for i in 0..ORDERED {
        src.write_bytes(i * SLOT, &vec![fill_of(i); SLOT])?;
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
    peer.say("quit")?;
    Ok(())
}

/// SIGKILL the peer with a wait and writes pending: they all end with an
/// error within the peer timeout (and a grace for the machine's load).
fn kill(tl: &str) -> Result<(), Failed> {
    let (t, src, remote, mut peer) = connect(tl, "kill")?;
    let wait = t.wait_for_write();
    // Writes in flight when the peer dies.
    let pending: Vec<_> = (0..32)
        .map(|_| t.write(&src.whole(), &remote, true))
        .collect();
    peer.child.kill()?;
    let killed = Instant::now();
    let _ = peer.child.wait();
    let err = within("the wait", &[], wait).expect_err("a wait on a dead peer resolved Ok");
    let took = killed.elapsed();
    assert!(
        took < PEER_TIMEOUT + GRACE,
        "{tl}: the wait ended after {took:?}: {err}"
    );
    for w in pending {
        let _ = within("a pending write", &[], w);
    }
    // Every later write fails too, at once.
    let e = within("a later write", &[], t.write(&src.whole(), &remote, true));
    assert!(e.is_err(), "{tl}: a write to a dead peer succeeded");
    assert!(
        killed.elapsed() < PEER_TIMEOUT + GRACE,
        "{tl}: took {:?}",
        killed.elapsed()
    );
    eprintln!("{tl}: the wait ended {took:?} after SIGKILL: {err}");
    Ok(())
}

fn main() {
    for tl in ["POSIX", "TCP"] {
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
    let args = Arguments::from_args();
    let scenarios: [(&str, fn(&str) -> Result<(), Failed>); 4] = [
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
            trials.push(Trial::test(name, move || f(tl)));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
