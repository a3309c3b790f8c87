//! The parent's side of the peer process: spawning it, its lines, and the
//! connected pair the scenarios start from.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use libtest_mimic::Failed;
use uct_transfer::{Memory, MemoryType, RemoteBuffer, Transport};

use crate::child::{size_of, SERVE_LEN};
use crate::common;

/// The parent's view of the peer process.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    pub fn spawn(tl: &str, scenario: &str) -> Result<Peer, Failed> {
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

    /// The peer's next line, which must start with `prefix`, within
    /// [`common::LIMIT`]; what follows the prefix.
    pub fn expect(&self, prefix: &str) -> Result<String, Failed> {
        self.expect_within(prefix, common::LIMIT)
    }

    /// The peer's next line, which must start with `prefix`, within
    /// `limit`.
    pub fn expect_within(&self, prefix: &str, limit: Duration) -> Result<String, Failed> {
        let line = self.lines.recv_timeout(limit).map_err(|e| {
            format!("the peer said nothing within {limit:?} (wanted {prefix:?}): {e}")
        })?;
        if let Some(rest) = line.strip_prefix("bad: ") {
            return Err(format!("the peer failed: {rest}").into());
        }
        line.strip_prefix(prefix)
            .map(str::to_string)
            .ok_or_else(|| format!("expected {prefix:?} from the peer, got {line:?}").into())
    }

    pub fn say(&mut self, line: &str) -> Result<(), Failed> {
        writeln!(self.stdin, "{line}")?;
        Ok(self.stdin.flush()?)
    }

    /// Sends a command of the serving peer and returns its answer, which
    /// must start with `prefix`.
    pub fn ask(&mut self, command: &str, prefix: &str) -> Result<String, Failed> {
        self.say(command)?;
        self.expect(prefix)
    }

    /// What the serving peer prints before it connects.
    pub fn hello(&self) -> Result<Hello, Failed> {
        Ok(Hello {
            url: self.expect("url ")?,
            key: self.expect("key ")?,
            rokey: self.expect("rokey ")?,
            sparekey: self.expect("sparekey ")?,
            other_url: self.expect("other ")?,
            other_key: self.expect("otherkey ")?,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Both sides connected, and the peer's memory as a remote buffer (the
/// scripted scenarios of [`crate::basic`]).
pub fn connect(
    tl: &str,
    scenario: &str,
) -> Result<(Transport, Memory, RemoteBuffer, Peer), Failed> {
    let mut peer = Peer::spawn(tl, scenario)?;
    let t = crate::build(tl);
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

/// The serving peer's URLs and keys (see [`crate::child`]).
pub struct Hello {
    /// Its URL.
    pub url: String,
    /// Its memory of [`SERVE_LEN`] bytes, all rights.
    pub key: String,
    /// Its read-only memory, [`crate::child::RO_LEN`] bytes of
    /// [`crate::child::RO_FILL`].
    pub rokey: String,
    /// Memory it drops when told (a stale key).
    pub sparekey: String,
    /// The URL of a Transport of [`crate::other_of`] it holds.
    pub other_url: String,
    /// Memory registered with that other Transport.
    pub other_key: String,
}

/// A serving peer, our Transport and memory of [`SERVE_LEN`] bytes, and
/// the peer's memory as a remote buffer.
pub struct Served {
    pub t: Transport,
    pub mem: Memory,
    pub hello: Hello,
    pub remote: RemoteBuffer,
    pub peer: Peer,
}

impl Served {
    /// A serving peer over `tl` and our Transport `t`, bound, not yet
    /// connected.
    pub fn spawn(tl: &str, t: Transport) -> Result<Served, Failed> {
        let peer = Peer::spawn(tl, "serve")?;
        let mem = Memory::alloc(&t, MemoryType::Host, SERVE_LEN)?;
        t.bind()?;
        let hello = peer.hello()?;
        let remote = RemoteBuffer::parse(&hello.key)?;
        Ok(Served {
            t,
            mem,
            hello,
            remote,
            peer,
        })
    }

    /// Both sides connect.
    pub fn connect(mut self) -> Result<Served, Failed> {
        self.t.connect(&self.hello.url)?;
        self.peer.say(&format!("url {}", self.t.bind()?))?;
        self.peer.say(&format!("key {}", self.mem.remote_key()))?;
        self.peer.expect("connected")?;
        Ok(self)
    }

    /// A serving peer over `tl`, connected.
    pub fn connected(tl: &str) -> Result<Served, Failed> {
        Served::spawn(tl, crate::build(tl))?.connect()
    }
}
