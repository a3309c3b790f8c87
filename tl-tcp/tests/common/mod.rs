//! What the hostile-peer tests share: the wire format as a stranger speaks
//! it (addresses, Hello), raw sockets with a deadline on every wait, and a
//! victim process (this test binary started again) whose memory can be
//! measured and which may be killed.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tl_tcp::wire::{encode, parse, Header, Parsed, WireKey};
use uct_core::region_table::SoftRkey;
use uct_core::{Access, EpParams, Iface, MemHandle, MemoryType, Registry, RemoteKey, RkeyBundle};

/// Environment variable that makes this binary a victim.
pub const ROLE: &str = "UCT_TCP_TEST_ROLE";

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// A tcp iface on lo.
pub fn open() -> Box<dyn Iface> {
    Registry::global()
        .open_iface("tcp", Some("lo"), &Default::default())
        .expect("tcp on lo")
}

/// Counts the active messages with `id` that `iface` receives in `n`.
pub fn count_ams(iface: &mut dyn Iface, id: u8, n: &Arc<AtomicUsize>) {
    let c = n.clone();
    iface
        .set_am_handler(
            id,
            Box::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
}

/// A count of the active messages with `id` that `iface` receives.
pub fn counter(iface: &mut dyn Iface, id: u8) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    count_ams(iface, id, &n);
    n
}

/// The parameters of an endpoint to `iface`.
pub fn to_iface(iface: &dyn Iface) -> EpParams {
    EpParams::ToIface {
        device_addr: iface.device_address(),
        iface_addr: iface.iface_address(),
    }
}

/// `mem` (registered with `iface`'s MD) as a peer of this process would
/// address it.
pub fn own_rkey(iface: &dyn Iface, mem: &MemHandle) -> uct_core::Result<RemoteKey> {
    Registry::global().unpack_rkey(
        &RkeyBundle::single(iface.md().pack_rkey(mem)?).pack()?,
        "tcp",
    )
}

/// Allocates `len` bytes open to peers and prints
/// `READY <device> <iface> <rkey> <addr>` for the process that started
/// this one.
pub fn serve_region(iface: &dyn Iface, len: usize) -> MemHandle {
    let mem = iface
        .md()
        .alloc(len, MemoryType::Host, Access::all())
        .unwrap();
    let rkey = RkeyBundle::single(iface.md().pack_rkey(&mem).unwrap())
        .pack()
        .unwrap();
    println!(
        "READY {} {} {} {:x}",
        hex(&iface.device_address()),
        hex(&iface.iface_address()),
        hex(&rkey),
        mem.addr()
    );
    mem
}

/// A peer iface as its addresses describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub ip: [u8; 16],
    pub port: u16,
    /// The iface's cookie (0 where the address carries none).
    pub cookie: u64,
}

impl Peer {
    pub fn of(device_addr: &[u8], iface_addr: &[u8]) -> Peer {
        let a = tl_tcp::address::parse_addr(device_addr, iface_addr).expect("a tcp address");
        Peer {
            ip: device_addr.try_into().unwrap(),
            port: a.sock.port(),
            cookie: a.cookie,
        }
    }

    pub fn of_iface(iface: &dyn Iface) -> Peer {
        Peer::of(&iface.device_address(), &iface.iface_address())
    }

    pub fn socket_addr(&self) -> SocketAddr {
        let v6 = Ipv6Addr::from(self.ip);
        SocketAddr::new(
            v6.to_ipv4_mapped().map(Into::into).unwrap_or(v6.into()),
            self.port,
        )
    }

    /// The iface address bytes of this peer.
    pub fn iface_address(&self) -> Vec<u8> {
        tl_tcp::address::iface_addr(self.port, self.cookie)
    }

    /// The parameters of an endpoint to this peer.
    pub fn ep_params(&self) -> EpParams {
        EpParams::ToIface {
            device_addr: self.ip.to_vec(),
            iface_addr: self.iface_address(),
        }
    }
}

/// A fake peer: a listener with an iface address, and the link the iface
/// under test opens to it.
pub struct FakePeer {
    listener: TcpListener,
    pub peer: Peer,
}

impl FakePeer {
    pub fn new(cookie: u64) -> FakePeer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = Peer {
            ip: loopback_ip(),
            port: listener.local_addr().unwrap().port(),
            cookie,
        };
        FakePeer { listener, peer }
    }

    /// The link an iface opened to this peer, non-blocking.
    pub fn accept(&self) -> TcpStream {
        let (s, _) = self.listener.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }
}

/// The loopback address as a device address.
pub fn loopback_ip() -> [u8; 16] {
    std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets()
}

/// A Hello frame claiming to be `claim`, echoing `echo` as the cookie of
/// the iface it is sent to.
pub fn hello(claim: Peer, echo: u64) -> Vec<u8> {
    encode(
        &Header::Hello {
            addr: claim.ip,
            port: claim.port,
            cookie: claim.cookie,
            echo,
        },
        0,
    )
    .unwrap()
}

/// The Hello a well-behaved stranger sends to `to`: its own (made-up)
/// identity, and `to`'s cookie echoed.
pub fn honest_hello(to: Peer) -> Vec<u8> {
    let me = Peer {
        ip: loopback_ip(),
        port: 9,
        cookie: 0x1234_5678,
    };
    hello(me, to.cookie)
}

pub fn frame(header: &Header, data: &[u8]) -> Vec<u8> {
    let mut f = encode(header, data.len()).unwrap();
    f.extend_from_slice(data);
    f
}

/// A connected, non-blocking socket.
pub fn connect(to: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect");
    s.set_nonblocking(true).unwrap();
    s
}

/// Writes all of `bytes`, calling `turn` while the socket is full; false if
/// the peer closed or `limit` passed first.
pub fn write_all(s: &mut TcpStream, bytes: &[u8], limit: Duration, mut turn: impl FnMut()) -> bool {
    let t0 = Instant::now();
    let mut at = 0;
    while at < bytes.len() {
        match s.write(&bytes[at..]) {
            Ok(0) => return false,
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if t0.elapsed() > limit {
                    return false;
                }
                turn();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Writes all of `bytes` within 5 s, doing nothing else meanwhile.
pub fn send(s: &mut TcpStream, bytes: &[u8]) -> bool {
    write_all(s, bytes, Duration::from_secs(5), || {})
}

/// What came back on a raw socket.
#[derive(Debug, Default)]
pub struct Received {
    pub frames: Vec<Header>,
    pub bytes: usize,
    /// The other side closed (EOF or reset).
    pub closed: bool,
}

/// Reads what arrives on `s` for `limit` (or until it closes), calling
/// `turn` between reads, and decodes the frames.
pub fn read_for(s: &mut TcpStream, limit: Duration, mut turn: impl FnMut()) -> Received {
    let mut got = Received::default();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
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
    while let Ok(Parsed::Frame { header, total, .. }) = parse(&buf, usize::MAX) {
        got.frames.push(header);
        buf.drain(..total);
    }
    got
}

/// Whether the other side closed `s` within `limit`.
pub fn closed_within(s: &mut TcpStream, limit: Duration, turn: impl FnMut()) -> bool {
    read_for(s, limit, turn).closed
}

/// Whether `iface` closed `s` within `limit`, progressing it meanwhile.
pub fn closed_by(iface: &mut dyn Iface, s: &mut TcpStream, limit: Duration) -> bool {
    closed_within(s, limit, || {
        iface.progress();
    })
}

/// How many of `links` the other side has closed, waiting `limit` on each.
pub fn count_closed(links: &mut [TcpStream], limit: Duration) -> usize {
    links
        .iter_mut()
        .map(|s| usize::from(closed_within(s, limit, || {})))
        .sum()
}

/// The part of a packed rkey that goes on the wire.
pub fn wire_key(packed: &[u8]) -> WireKey {
    let rkey = Registry::global().unpack_rkey(packed, "tcp").unwrap();
    let soft = rkey.downcast::<SoftRkey>("tcp").unwrap();
    WireKey {
        region_id: soft.region_id,
        secret: soft.secret,
    }
}

/// Memory of a process, from /proc: (VmRSS, VmHWM) in KiB.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Size of the region a victim registers for remote access.
pub const VICTIM_REGION: usize = 1 << 20;

/// The victim: this binary started with ROLE=victim. It opens a tcp iface
/// on lo, registers a region, prints `READY <device> <iface> <rkey> <addr>`
/// and serves until its stdin closes; it counts active messages and prints
/// the count on `AMS` lines every 100 ms.
pub fn victim_main() -> ! {
    let mut iface = open();
    let ams = Arc::new(AtomicUsize::new(0));
    for id in 0..8u8 {
        count_ams(iface.as_mut(), id, &ams);
    }
    let _mem = serve_region(iface.as_ref(), VICTIM_REGION);
    let stdin_closed = Arc::new(AtomicUsize::new(0));
    let flag = stdin_closed.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        flag.store(1, Ordering::SeqCst);
    });
    let mut last = Instant::now();
    while stdin_closed.load(Ordering::SeqCst) == 0 {
        if iface.progress() == 0 {
            std::thread::yield_now();
        }
        if last.elapsed() > Duration::from_millis(100) {
            println!("AMS {}", ams.load(Ordering::Relaxed));
            last = Instant::now();
        }
    }
    std::process::exit(0)
}

/// A running victim.
pub struct Victim {
    child: Child,
    _stdin: ChildStdin,
    pub device_addr: Vec<u8>,
    pub iface_addr: Vec<u8>,
    pub rkey: Vec<u8>,
    pub addr: u64,
    ams: Arc<AtomicUsize>,
}

impl Victim {
    /// Starts a victim with these extra environment variables.
    pub fn spawn(env: &[(&str, &str)]) -> Victim {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env(ROLE, "victim")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start the victim");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() == 5 && f[0] == "READY", "the victim said {line:?}");
        let ams = Arc::new(AtomicUsize::new(0));
        let count = ams.clone();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("AMS ").and_then(|n| n.parse().ok()) {
                    count.store(n, Ordering::SeqCst);
                }
            }
        });
        Victim {
            device_addr: unhex(f[1]),
            iface_addr: unhex(f[2]),
            rkey: unhex(f[3]),
            addr: u64::from_str_radix(f[4], 16).unwrap(),
            child,
            _stdin: stdin,
            ams,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn peer(&self) -> Peer {
        Peer::of(&self.device_addr, &self.iface_addr)
    }

    /// Active messages the victim has received, as last reported.
    pub fn ams(&self) -> usize {
        self.ams.load(Ordering::SeqCst)
    }

    /// A well-behaved peer's transfer to the victim: a 4 KiB put, then a get
    /// of the same bytes, verified, each with a deadline.
    pub fn legit_transfer(&self, seed: u8) -> Result<(), String> {
        legit_transfer(
            &self.device_addr,
            &self.iface_addr,
            &self.rkey,
            self.addr,
            seed,
        )
    }

    pub fn legit_peer(&self) -> Result<LegitPeer, String> {
        LegitPeer::connect(&self.device_addr, &self.iface_addr, &self.rkey, self.addr)
    }

    /// Open file descriptors of the victim.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Kills the victim (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the victim process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A well-behaved peer: a tcp iface of this process and an endpoint to
/// the victim's region.
pub struct LegitPeer {
    pub iface: Box<dyn Iface>,
    ep: Box<dyn uct_core::Endpoint>,
    rkey: uct_core::RemoteKey,
    base: u64,
}

impl LegitPeer {
    pub fn connect(
        device_addr: &[u8],
        iface_addr: &[u8],
        rkey: &[u8],
        base: u64,
    ) -> Result<LegitPeer, String> {
        let reg = Registry::global();
        let mut iface = reg
            .open_iface("tcp", Some("lo"), &Default::default())
            .map_err(|e| e.to_string())?;
        let rkey = reg.unpack_rkey(rkey, "tcp").map_err(|e| e.to_string())?;
        let ep = iface
            .create_ep(uct_core::EpParams::ToIface {
                device_addr: device_addr.to_vec(),
                iface_addr: iface_addr.to_vec(),
            })
            .map_err(|e| format!("connect: {e}"))?;
        Ok(LegitPeer {
            iface,
            ep,
            rkey,
            base,
        })
    }

    /// The endpoint's liveness check.
    pub fn check(&mut self) -> Result<(), uct_core::UctError> {
        self.ep.check()
    }

    /// Puts 4 KiB into the region and gets them back, verified; every wait
    /// has a deadline of `limit`.
    pub fn transfer(&mut self, seed: u8, limit: Duration) -> Result<(), String> {
        use uct_core::{Completion, CompletionData, Status};
        let data: Vec<u8> = (0..4096)
            .map(|i| (i as u8).wrapping_mul(seed | 1) ^ seed)
            .collect();
        let t0 = Instant::now();
        while self
            .ep
            .put_bcopy(&data, self.base, &self.rkey)
            .map_err(|e| format!("put: {e}"))?
            == Status::NoResource
        {
            self.iface.progress();
            if t0.elapsed() > limit {
                return Err(format!("put: no room for {limit:?}"));
            }
        }
        let comp = Completion::new();
        while self
            .ep
            .get_bcopy(data.len(), self.base, &self.rkey, &comp)
            .map_err(|e| format!("get: {e}"))?
            == Status::NoResource
        {
            self.iface.progress();
            if t0.elapsed() > limit {
                return Err(format!("get: no room for {limit:?}"));
            }
        }
        while !comp.is_complete() {
            self.iface.progress();
            if t0.elapsed() > limit {
                return Err(format!("get: no answer in {limit:?}"));
            }
        }
        comp.result().map_err(|e| format!("get: {e}"))?;
        match comp.take_data() {
            Some(CompletionData::Bytes(b)) if b == data => Ok(()),
            _ => Err("the get returned other bytes than the put wrote".into()),
        }
    }
}

/// A well-behaved peer's transfer to a region: see [`LegitPeer::transfer`].
pub fn legit_transfer(
    device_addr: &[u8],
    iface_addr: &[u8],
    rkey: &[u8],
    base: u64,
    seed: u8,
) -> Result<(), String> {
    LegitPeer::connect(device_addr, iface_addr, rkey, base)?.transfer(seed, Duration::from_secs(10))
}
