//! Child processes of the tests that kill a server mid-run (peer_death on
//! the host, rc_vm in the VM): reaping, reading their output with
//! deadlines, and waiting for their exit.

use std::io::{BufRead, BufReader};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Kills and reaps the child when dropped, so that a failed case leaves no
/// process behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines of a child's stream, read on a thread, so that the test can
/// wait for one with a deadline.
pub fn lines_of(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to `limit` for a line containing `needle`; Err with what was
/// seen before the deadline.
pub fn wait_for_line(
    rx: &mpsc::Receiver<String>,
    needle: &str,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut seen = String::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(needle) => return Ok(()),
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => return Err(seen),
        }
    }
}

/// Everything left in `rx` once its stream ends, waiting at most `limit`.
pub fn drain(rx: &mpsc::Receiver<String>, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }
    lines.join("\n")
}

/// The child's exit status if it exits within `limit` of `since`, else
/// None (it is left running).
pub fn exit_within(
    child: &mut Child,
    since: Instant,
    limit: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if since.elapsed() > limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
