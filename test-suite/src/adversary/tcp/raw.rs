//! The raw-socket side of the tcp attacks: frames in the real wire format,
//! Hellos, writes and reads with deadlines, and what the attacker measures
//! of the victim.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tl_tcp::address::{ip_bytes, parse_addr, PeerAddr};
use tl_tcp::wire::{encode, parse, Header, Parsed, WireKey};
use uct_core::region_table::SoftRkey;
use uct_core::Registry;

use super::Target;

pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn seeded() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(t | 1)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(super) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The victim's iface, on the loopback only (no attack leaves the host).
pub(super) fn victim(t: &Target) -> Result<PeerAddr, String> {
    let v = parse_addr(&t.device_addr, &t.iface_addr)
        .map_err(|e| format!("the target's tcp address: {e}"))?;
    if !v.sock.ip().is_loopback() {
        return Err(format!(
            "the victim listens on {}, not on the loopback; tcp attacks run on lo only",
            v.sock
        ));
    }
    Ok(v)
}

pub(super) fn frame(header: &Header, data: &[u8]) -> Vec<u8> {
    let mut f = encode(header, data.len()).unwrap_or_default();
    f.extend_from_slice(data);
    f
}

/// A Hello from a made-up iface of this process at `port`, with `cookie`,
/// echoing `echo`.
pub(super) fn hello_from(port: u16, cookie: u64, echo: u64) -> Vec<u8> {
    let addr = ip_bytes(std::net::Ipv4Addr::LOCALHOST.into());
    let hello = Header::Hello {
        addr,
        port,
        cookie,
        echo,
    };
    frame(&hello, &[])
}

/// The Hello of a peer that got the victim's address as a peer does.
pub(super) fn honest_hello(v: &PeerAddr, rng: &mut Rng) -> Vec<u8> {
    hello_from(1 + (rng.next() % 60_000) as u16, rng.next(), v.cookie)
}

pub(super) fn connect(to: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .map_err(|e| format!("connect to the victim at {to}: {e}"))?;
    s.set_nonblocking(true)
        .map_err(|e| format!("set non-blocking: {e}"))?;
    Ok(s)
}

/// How a write ended: all written, the socket took nothing for the whole
/// limit (the peer stopped reading), or the peer closed the connection.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wrote {
    All,
    Stalled,
    Closed,
}

/// Writes `bytes`, waiting while the socket is full, for at most `limit`
/// without progress.
pub(super) fn write_all(s: &mut TcpStream, bytes: &[u8], limit: Duration) -> Wrote {
    let mut at = 0;
    let mut since = Instant::now();
    while at < bytes.len() {
        match s.write(&bytes[at..]) {
            Ok(0) => return Wrote::Closed,
            Ok(n) => {
                at += n;
                since = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if since.elapsed() > limit {
                    return Wrote::Stalled;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Wrote::Closed,
        }
    }
    Wrote::All
}

/// What came back on a raw socket within a time.
#[derive(Debug, Default)]
pub(super) struct Received {
    pub(super) frames: Vec<Header>,
    pub(super) bytes: usize,
    pub(super) closed: bool,
}

/// Reads for up to `limit`, or until the peer closes, or (with `until`)
/// until a frame satisfies it; `turn` runs between reads.
pub(super) fn read_for(
    s: &mut TcpStream,
    limit: Duration,
    mut until: impl FnMut(&Header) -> bool,
    mut turn: impl FnMut(),
) -> Received {
    let mut got = Received::default();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        turn();
        match s.read(&mut chunk) {
            Ok(0) => {
                got.closed = true;
                break;
            }
            Ok(n) => {
                got.bytes += n;
                buf.extend_from_slice(&chunk[..n]);
                let mut done = false;
                while let Ok(Parsed::Frame { header, total, .. }) = parse(&buf, usize::MAX) {
                    buf.drain(..total);
                    done |= until(&header);
                    got.frames.push(header);
                }
                if done {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                got.closed = true;
                break;
            }
        }
    }
    got
}

/// The part of a packed rkey that goes on the wire.
pub(super) fn wire_key(packed: &[u8]) -> Result<WireKey, String> {
    let rkey = Registry::global()
        .unpack_rkey(packed, "tcp")
        .map_err(|e| format!("unpack the target's rkey: {e}"))?;
    let soft = rkey
        .downcast::<SoftRkey>("tcp")
        .map_err(|e| format!("the target's rkey: {e}"))?;
    Ok(WireKey {
        region_id: soft.region_id,
        secret: soft.secret,
    })
}

/// The victim's peak RSS (VmHWM) in KiB.
pub(super) fn peak_rss_kib(pid: u32) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("read the victim's /proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no VmHWM in /proc/{pid}/status"))
}
