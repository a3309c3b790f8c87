//! The adversary suite (issue 12): every attack of
//! `test_suite::adversary::all()` runs from its own attacker process
//! (`uct-attacker`) against a victim process (`uct-victim`) of its
//! transport, while this process is a well-behaved peer of the same victim,
//! putting fresh patterns into the first half of its read-write region and
//! reading them back.
//!
//! An attack passes when:
//! - the attacker's outcome is Refused (with a named error) or Closed;
//! - the well-behaved peer verified rounds while the attacker ran (when it
//!   ran for [`SHORT_ATTACK`] or longer: a shorter one may fit between two
//!   time slices of the peer's thread on a busy host) and after it, with no
//!   error and no corruption;
//! - the victim is still running afterwards, exits 0 when its stdin closes,
//!   and its peak RSS (VmHWM) stayed under [`RSS_BOUND_KIB`].
//!
//! One line per attack: `adversary: NAME: refused (ERROR) | good peer N
//! rounds verified (M during the T ms attack) | victim peak RSS R MiB`; an
//! attack whose transport is absent is SKIPPED with the registry's reason.
//! Then a summary and a libtest-style `test result:` line (which
//! scripts/test counts). Arguments: substrings of attack names to run,
//! `--skip SUBSTRING`, `--list`; libtest's other flags are ignored.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use test_suite::adversary::common::{self, named, Session};
use test_suite::adversary::{all, Attack, Outcome, Target};
use test_suite::pair::pattern;
use uct_core::{Registry, RemoteKey};

/// The victim's peak RSS must stay under this: its regions are about
/// 1.2 MiB and a quiet victim peaks near 6 MiB, so 256 MiB leaves room for
/// a transport's bounded queues and catches unbounded growth.
const RSS_BOUND_KIB: u64 = 256 << 10;
/// How long an attacker may run.
const ATTACK_DEADLINE: Duration = Duration::from_secs(90);
/// How long the attackers of the whole suite may run together: with each
/// attack a few seconds, a suite over this has attacks that hang, and the
/// rest are failed unrun rather than waited for.
const SUITE_BUDGET: Duration = Duration::from_secs(240);
/// An attack this long or longer must see the good peer verify rounds
/// while it runs.
const SHORT_ATTACK: Duration = Duration::from_millis(250);
/// How long the victim may take to print its target line, the good peer
/// to verify a round, and the victim to exit once its stdin is closed.
const STEP_DEADLINE: Duration = Duration::from_secs(20);
/// The victim's last stderr lines kept, shown when an attack fails.
const STDERR_TAIL: usize = 20;

fn main() -> ExitCode {
    uct_builtins::link();
    let (filters, skips, list) = parse_args();
    let t0 = Instant::now();
    let attacks = all();
    let selected: Vec<&Attack> = attacks
        .iter()
        .filter(|a| filters.is_empty() || filters.iter().any(|f| a.name.contains(f.as_str())))
        .filter(|a| !skips.iter().any(|s| a.name.contains(s.as_str())))
        .collect();
    if list {
        for a in &selected {
            println!("{}: test", a.name);
        }
        return ExitCode::SUCCESS;
    }
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for attack in &selected {
        if let Some(reason) = absent(attack.transport) {
            println!(
                "adversary: {}: SKIPPED: transport {} is absent: {reason}",
                attack.name, attack.transport
            );
            skipped += 1;
            continue;
        }
        let _ = std::io::stdout().flush();
        let left = SUITE_BUDGET.saturating_sub(t0.elapsed());
        if left.is_zero() {
            println!(
                "adversary: {}: FAILED: not run: the suite's attackers used up its {SUITE_BUDGET:?}",
                attack.name
            );
            failed += 1;
            continue;
        }
        match run(attack, ATTACK_DEADLINE.min(left)) {
            Ok(line) => {
                println!("adversary: {}: {line}", attack.name);
                passed += 1;
            }
            Err(why) => {
                println!("adversary: {}: FAILED: {why}", attack.name);
                failed += 1;
            }
        }
    }
    let filtered = attacks.len() - selected.len();
    println!(
        "adversary: {passed} passed, {failed} failed, {skipped} skipped of {} attacks \
         (victim peak RSS bound {} MiB)",
        selected.len(),
        RSS_BOUND_KIB >> 10
    );
    println!(
        "test result: {}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; \
         {filtered} filtered out; finished in {:.2}s",
        if failed == 0 { "ok" } else { "FAILED" },
        t0.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Name filters, `--skip` substrings, and whether `--list` was given.
fn parse_args() -> (Vec<String>, Vec<String>, bool) {
    let (mut filters, mut skips, mut list) = (Vec::new(), Vec::new(), false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--list" => list = true,
            "--skip" => skips.extend(args.next()),
            // libtest flags with a separate value, ignored with it.
            "--test-threads" | "--format" | "--color" | "-Z" => drop(args.next()),
            flag if flag.starts_with('-') => {}
            name => filters.push(name.to_string()),
        }
    }
    (filters, skips, list)
}

/// Why `transport` cannot run here, if it cannot.
fn absent(transport: &str) -> Option<String> {
    Registry::global()
        .find_resource(transport, common::device(transport))
        .err()
        .map(|e| named(&e))
}

/// Runs one attack: its line on success, why it failed otherwise.
fn run(attack: &Attack, deadline: Duration) -> Result<String, String> {
    let mut victim = Victim::spawn(attack.transport)?;
    let result = attack_with_peer(attack, &mut victim, deadline);
    let finish = victim.finish();
    let (outcome, peer) = match result {
        Ok(r) => r,
        Err(e) => {
            return Err(format!(
                "{e}{}{}",
                finish.err().map_or(String::new(), |f| format!("; {f}")),
                victim.stderr_tail()
            ))
        }
    };
    let rss_kib = finish.map_err(|e| format!("{e}{}", victim.stderr_tail()))?;
    if rss_kib >= RSS_BOUND_KIB {
        return Err(format!(
            "the victim's peak RSS was {} MiB, over the bound of {} MiB",
            rss_kib >> 10,
            RSS_BOUND_KIB >> 10
        ));
    }
    let outcome = match outcome {
        Outcome::Refused(why) => format!("refused ({why})"),
        Outcome::Closed => "closed".into(),
        Outcome::Breach(what) => return Err(format!("BREACH: {what}")),
    };
    Ok(format!(
        "{outcome} | good peer {} rounds verified ({} during the {} ms attack) | victim peak RSS {} MiB",
        peer.total,
        peer.during,
        peer.attack.as_millis(),
        rss_kib.div_ceil(1024)
    ))
}

/// What the well-behaved peer achieved.
struct PeerRounds {
    total: u64,
    during: u64,
    /// How long the attacker ran.
    attack: Duration,
}

/// Starts the good peer, runs the attacker while it works, then stops it.
fn attack_with_peer(
    attack: &Attack,
    victim: &mut Victim,
    deadline: Duration,
) -> Result<(Outcome, PeerRounds), String> {
    let peer = GoodPeer::start(victim.target.clone());
    let result = (|| {
        peer.wait_rounds(1, "before the attack")?;
        let before = peer.rounds();
        let t0 = Instant::now();
        let outcome = run_attacker(attack, &victim.line, deadline)?;
        let took = t0.elapsed();
        let during = peer.rounds() - before;
        if during == 0 && took >= SHORT_ATTACK {
            return Err(format!(
                "the good peer verified no round in the {} ms the attacker ran ({})",
                took.as_millis(),
                peer.error()
                    .unwrap_or_else(|| "no error: it was starved".into())
            ));
        }
        // The victim still serves once the attack is over.
        peer.wait_rounds(before + during + 1, "after the attack")?;
        Ok((outcome, during, took))
    })();
    let total = peer.stop();
    let (outcome, during, took) = result?;
    let total = total?;
    if !victim.alive() {
        return Err("the victim died during the attack".into());
    }
    Ok((
        outcome,
        PeerRounds {
            total,
            during,
            attack: took,
        },
    ))
}

/// The bootstrap timeout victim and attacker run with: a link that says no
/// Hello within it is closed, so a short one lets `tcp/connection-flood`
/// see silent connections closed within the attack (3 s unless set).
fn hello_timeout() -> String {
    std::env::var("UCT_BOOTSTRAP_TIMEOUT").unwrap_or_else(|_| "3s".into())
}

/// Runs the attacker to its end (killed after `deadline`) and reads its
/// outcome.
fn run_attacker(attack: &Attack, target_line: &str, deadline: Duration) -> Result<Outcome, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_uct-attacker"))
        .args(["--attack", attack.name, "--target", target_line])
        .env("UCT_BOOTSTRAP_TIMEOUT", hello_timeout())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn uct-attacker: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_deadline(&mut child, deadline);
    let (stdout, stderr) = (joined(stdout), joined(stderr));
    let status = status.map_err(|e| format!("the attacker {e}"))?;
    let outcome = stdout
        .lines()
        .find_map(|l| l.strip_prefix("outcome: "))
        .and_then(Outcome::parse);
    match (status.code(), outcome) {
        (Some(0), Some(o @ (Outcome::Refused(_) | Outcome::Closed))) => Ok(o),
        (Some(1), Some(o @ Outcome::Breach(_))) => Ok(o),
        _ => Err(format!(
            "the attacker ended with {status} without an outcome: {}{}",
            stdout.trim(),
            tail_of("attacker", &stderr)
        )),
    }
}

/// Reads a child's pipe to its end in a thread, so that it never blocks
/// on a full pipe.
fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

fn joined(h: JoinHandle<String>) -> String {
    h.join().unwrap_or_default()
}

/// The last lines of a process's stderr, each on its own line after `who`.
fn tail_of(who: &str, stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    lines[lines.len().saturating_sub(STDERR_TAIL)..]
        .iter()
        .map(|l| format!("\n    {who} stderr: {l}"))
        .collect()
}

/// Waits for `child` until `deadline`, killing it then.
fn wait_deadline(child: &mut Child, deadline: Duration) -> Result<ExitStatus, String> {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if t0.elapsed() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not exit within {deadline:?} and was killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("could not be waited for: {e}")),
        }
    }
}

/// The victim process: its target, its stdin (closing it ends it), its
/// stdout lines after the target line, and its last stderr lines.
struct Victim {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    target: Target,
    line: String,
}

impl Victim {
    fn spawn(transport: &str) -> Result<Victim, String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_uct-victim"))
            .args(["--transport", transport])
            .env("UCT_BOOTSTRAP_TIMEOUT", hello_timeout())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn uct-victim: {e}"))?;
        let (tx, lines) = channel();
        let stdout = child.stdout.take().map(BufReader::new);
        std::thread::spawn(move || {
            for line in stdout
                .into_iter()
                .flat_map(|s| s.lines())
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // The last lines only: a victim under attack may log without end.
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let sink = stderr.clone();
        let err_pipe = child.stderr.take().map(BufReader::new);
        std::thread::spawn(move || {
            for line in err_pipe
                .into_iter()
                .flat_map(|s| s.lines())
                .map_while(Result::ok)
            {
                let mut tail = sink.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let stdin = child.stdin.take();
        let mut victim = Victim {
            child,
            stdin,
            lines,
            stderr,
            target: Target::default(),
            line: String::new(),
        };
        let line = match victim.lines.recv_timeout(STEP_DEADLINE) {
            Ok(line) => line,
            Err(e) => {
                let status = victim.finish().err().unwrap_or_default();
                return Err(format!(
                    "the victim printed no target line within {STEP_DEADLINE:?} ({e}; {status}){}",
                    victim.stderr_tail()
                ));
            }
        };
        victim.target = Target::from_line(&line)?;
        victim.line = line;
        Ok(victim)
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Closes the victim's stdin and waits for it to exit 0: its peak RSS
    /// in KiB. Kills it if it does not exit in time.
    fn finish(&mut self) -> Result<u64, String> {
        drop(self.stdin.take());
        let status = wait_deadline(&mut self.child, STEP_DEADLINE)
            .map_err(|e| format!("the victim, its stdin closed, {e}"))?;
        if !status.success() {
            return Err(format!("the victim exited with {status}"));
        }
        let deadline = Instant::now() + STEP_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(kib) = line.strip_prefix("peak_rss_kib=") {
                        return kib
                            .parse()
                            .map_err(|_| format!("the victim printed {line:?}"));
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    return Err("the victim exited without printing peak_rss_kib".into())
                }
            }
        }
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        tail_of(
            "victim",
            &tail.iter().cloned().collect::<Vec<_>>().join("\n"),
        )
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The well-behaved peer: a thread of this process with an iface of the
/// victim's transport, putting fresh patterns into the first half of the
/// victim's rw region and reading each back, until stopped.
struct GoodPeer {
    rounds: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<String>>>,
    thread: JoinHandle<()>,
}

impl GoodPeer {
    fn start(target: Target) -> GoodPeer {
        let rounds = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let (r, s, e) = (rounds.clone(), stop.clone(), error.clone());
        let thread = std::thread::spawn(move || {
            if let Err(why) = good_peer(&target, &r, &s) {
                *e.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            }
        });
        GoodPeer {
            rounds,
            stop,
            error,
            thread,
        }
    }

    fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until `n` rounds are verified; fails at once if the peer
    /// failed.
    fn wait_rounds(&self, n: u64, when: &str) -> Result<(), String> {
        let t0 = Instant::now();
        while self.rounds() < n {
            if let Some(e) = self.error() {
                return Err(format!("the good peer failed {when}: {e}"));
            }
            if t0.elapsed() > STEP_DEADLINE {
                return Err(format!(
                    "the good peer verified {} rounds, not {n}, within {STEP_DEADLINE:?} {when}",
                    self.rounds()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Stops the peer: its verified rounds, or its error.
    fn stop(self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Relaxed);
        if self.thread.join().is_err() {
            return Err("the good peer panicked".into());
        }
        let n = self.rounds.load(Ordering::Relaxed);
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(format!("the good peer failed after {n} rounds: {e}")),
            None => Ok(n),
        }
    }
}

/// Bytes per round: small enough for every transport's bcopy limit.
const ROUND_LEN: usize = 4096;

fn good_peer(target: &Target, rounds: &AtomicU64, stop: &AtomicBool) -> Result<(), String> {
    let mut s = Session::to_target(target).map_err(|e| format!("connect: {}", named(&e)))?;
    let rkey: RemoteKey = s
        .rkey(&target.rw.rkey)
        .map_err(|e| format!("unpack the rw rkey: {}", named(&e)))?;
    let slots = (target.rw.len / 2 / ROUND_LEN).max(1) as u64;
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let addr = target.rw.addr + (round % slots) * ROUND_LEN as u64;
        // A fresh pattern per round, so that a stale read is caught.
        let data = pattern(
            ROUND_LEN,
            round.wrapping_mul(0x1_0001) ^ u64::from(target.pid),
        );
        s.put(&data, addr, &rkey)
            .map_err(|e| format!("round {round}: put at {addr:#x}: {e}"))?;
        let back = s
            .get(ROUND_LEN, addr, &rkey)
            .map_err(|e| format!("round {round}: get at {addr:#x}: {e}"))?;
        if let Some(i) = (0..ROUND_LEN).find(|&i| back[i] != data[i]) {
            return Err(format!(
                "round {round}: CORRUPTION at {addr:#x}+{i}: read {:#04x}, wrote {:#04x}",
                back[i], data[i]
            ));
        }
        round += 1;
        rounds.store(round, Ordering::Relaxed);
    }
    Ok(())
}
