//! The peer process: this same binary, run with UCT_TRANSFER_CHILD set to
//! `<transport>:<scenario>`, driven over its stdin and stdout.
//!
//! The scripted scenarios of [`crate::basic`] run one fixed exchange. The
//! `serve` scenario prints its URL and keys, connects, then answers one
//! command a line (see [`serve`]) until `quit` or the end of its input.

use std::io::BufRead;
use std::time::{Duration, Instant};

use uct_transfer::{Access, Memory, MemoryType, RemoteBuffer, Transport};

use crate::basic::{
    CONCURRENT_EACH, CONCURRENT_LEN, CONCURRENT_THREADS, KILL_LEN, ORDERED, PING_LEN, SLOT,
};
use crate::common::{fill_of, len_of, within};
use crate::{build, other_of, received_as_expected};

/// The serving peer's memory with all rights.
pub const SERVE_LEN: usize = 1 << 20;
/// Its read-only memory, and the byte that fills it.
pub const RO_LEN: usize = 4096;
pub const RO_FILL: u8 = 0x11;
/// Its memory dropped on `drop-spare`, and its memory of the other
/// Transport.
pub const SPARE_LEN: usize = 4096;
/// What `echo` adds to the tag of each notification it answers.
pub const ECHO_TAG: u32 = 100;

pub fn size_of(scenario: &str) -> usize {
    match scenario {
        "concurrent" => CONCURRENT_THREADS * CONCURRENT_EACH * CONCURRENT_LEN,
        "ordering" => ORDERED * SLOT,
        "kill" => KILL_LEN,
        _ => PING_LEN,
    }
}

/// Runs the peer's side of `scenario` over `tl`.
pub fn run(tl: &str, scenario: &str) -> Result<(), String> {
    if scenario == "serve" {
        serve(tl)
    } else {
        scripted(tl, scenario)
    }
}

/// The peer process of a scripted scenario ([`crate::basic`]): connects,
/// swaps keys, runs its side of `scenario`, prints `ok` or `bad: why`.
fn scripted(tl: &str, scenario: &str) -> Result<(), String> {
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

/// The next line of stdin, which must start with `prefix`.
fn next(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    prefix: &str,
) -> Result<String, String> {
    let line = lines
        .next()
        .ok_or("stdin closed")?
        .map_err(|e| e.to_string())?;
    line.strip_prefix(prefix)
        .map(str::to_string)
        .ok_or_else(|| format!("expected {prefix:?}, got {line:?}"))
}

/// The serving peer. It prints `url`, `key` (memory of [`SERVE_LEN`]
/// bytes, all rights), `rokey` (read-only memory of [`RO_LEN`] bytes of
/// [`RO_FILL`]), `sparekey` (memory it drops when told), `other` and
/// `otherkey` (a Transport of [`other_of`] `tl` and memory registered with
/// it), reads `url` and `key`, connects and prints `connected`. Then, one
/// answer a command (`bad: why` where a check fails):
///
/// - `wait`: one wait_for_write: `note <tag> <len>` or `err <error>`;
/// - `drain`: waits until a wait fails: `ended <notifications before> <ms
///   from the first failed wait's start> <error>`;
/// - `check-ro`: `ok` if the read-only memory still holds [`RO_FILL`];
/// - `drop-spare`, `drop-transport`: drops that memory, or the Transport
///   (with the other one; the memory stays): `dropped`;
/// - `echo <n>`: for each of `n` notifications (tag, len), checks that
///   [tag * len, +len) of its memory holds `fill_of(tag)`, fills it with
///   the complement and writes it to the same place of ours with tag
///   `tag + ECHO_TAG`; `ok` once every write completed;
/// - `received <n>`: `ok` if `n` notifications came, the way `tl` sends
///   them;
/// - `quit`.
fn serve(tl: &str) -> Result<(), String> {
    let s = |e: uct_transfer::TransferError| e.to_string();
    let t = build(tl);
    let mem = Memory::alloc(&t, MemoryType::Host, SERVE_LEN).map_err(s)?;
    let ro =
        Memory::alloc_with(&t, MemoryType::Host, RO_LEN, Access::remote_read_only()).map_err(s)?;
    ro.write_bytes(0, &[RO_FILL; RO_LEN]).map_err(s)?;
    let spare = Memory::alloc(&t, MemoryType::Host, SPARE_LEN).map_err(s)?;
    let other = build(other_of(tl));
    let other_mem = Memory::alloc(&other, MemoryType::Host, SPARE_LEN).map_err(s)?;
    println!("url {}", t.bind().map_err(s)?);
    println!("key {}", mem.remote_key());
    println!("rokey {}", ro.remote_key());
    println!("sparekey {}", spare.remote_key());
    println!("other {}", other.bind().map_err(s)?);
    println!("otherkey {}", other_mem.remote_key());
    let mut lines = std::io::stdin().lock().lines();
    t.connect(&next(&mut lines, "url ")?).map_err(s)?;
    let remote = RemoteBuffer::parse(&next(&mut lines, "key ")?).map_err(s)?;
    println!("connected");
    let mut t = Some(t);
    let mut other = Some((other, other_mem));
    let mut spare = Some(spare);
    for line in lines {
        let line = line.map_err(|e| e.to_string())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match (words.as_slice(), &t) {
            (["quit"], _) => return Ok(()),
            (["drop-spare"], _) => {
                spare = None;
                Ok("dropped".to_string())
            }
            (["drop-transport"], _) => {
                other = None;
                t = None;
                Ok("dropped".to_string())
            }
            (["check-ro"], _) => check_ro(&ro),
            (_, None) => Err(format!("{line:?} after drop-transport")),
            (["wait"], Some(t)) => Ok(match within("a notification", &[], t.wait_for_write()) {
                Ok(n) => format!("note {} {}", n.tag, n.len),
                Err(e) => format!("err {e}"),
            }),
            (["drain"], Some(t)) => Ok(drain(t)),
            (["echo", n], Some(t)) => n
                .parse()
                .map_err(|e| format!("echo {n}: {e}"))
                .and_then(|n| echo(t, &mem, &remote, n)),
            (["received", n], Some(t)) => n
                .parse()
                .map_err(|e| format!("received {n}: {e}"))
                .and_then(|n| received_as_expected(tl, t, n))
                .map(|()| "ok".to_string()),
            _ => Err(format!("unknown command {line:?}")),
        };
        match answer {
            Ok(a) => println!("{a}"),
            Err(e) => println!("bad: {e}"),
        }
    }
    drop((spare, other));
    Ok(())
}

fn check_ro(ro: &Memory) -> Result<String, String> {
    let mut got = vec![0u8; RO_LEN];
    ro.read_bytes(0, &mut got).map_err(|e| e.to_string())?;
    match got.iter().position(|&b| b != RO_FILL) {
        None => Ok("ok".to_string()),
        Some(i) => Err(format!(
            "the read-only memory changed: byte {i} is {:#x}, was {RO_FILL:#x}",
            got[i]
        )),
    }
}

fn drain(t: &Transport) -> String {
    let mut count = 0;
    loop {
        let start = Instant::now();
        match within("a notification", &[], t.wait_for_write()) {
            Ok(_) => count += 1,
            Err(e) => {
                let ms = start.elapsed().as_millis();
                return format!("ended {count} {ms} {e}");
            }
        }
    }
}

fn echo(t: &Transport, mem: &Memory, remote: &RemoteBuffer, n: usize) -> Result<String, String> {
    let s = |e: uct_transfer::TransferError| e.to_string();
    let mut writes = Vec::with_capacity(n);
    for _ in 0..n {
        let note = within("a notification", &[], t.wait_for_write()).map_err(s)?;
        let at = note.tag as usize * note.len;
        let mut got = vec![0u8; note.len];
        mem.read_bytes(at, &mut got).map_err(s)?;
        let fill = fill_of(note.tag as usize);
        if got.iter().any(|&b| b != fill) {
            return Err(format!(
                "the write tagged {} holds the wrong bytes",
                note.tag
            ));
        }
        mem.write_bytes(at, &vec![!fill; note.len]).map_err(s)?;
        let view = mem.view(at, note.len).map_err(s)?;
        let to = remote.slice(at, note.len).map_err(s)?;
        writes.push(t.write_tagged(&view, &to, note.tag + ECHO_TAG));
    }
    for w in writes {
        within("an echo", &[], w).map_err(s)?;
    }
    Ok("ok".to_string())
}
