//! dmabuf-demo: what the seed's rdma-dmabuf client and server set out to
//! show, done with verification. Two processes over rc: Send/Recv
//! iterations, then RDMA Write, then RDMA Read, each checked byte by byte.
//! Memory is host, Gaudi or CUDA (device memory exported as a DMA-buf and
//! imported by the NIC, or for CUDA reached through nvidia_peermem); the
//! CPU cannot read device memory, so there the data is checked by moving
//! it back to host memory over the NIC. A TCP handshake replaces
//! sleeps; the exit status says whether everything was verified.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, Parser, Subcommand};
use serde::{Deserialize, Serialize};
use tools::perf::pattern::{check_pattern, pattern_into};
use tools::perf::session::alloc;
use tools::perf::stage::Stage;
use uct_core::bootstrap::{BootstrapChannel, BootstrapError, BootstrapListener};
use uct_core::{
    Completion, Endpoint, EpParams, Iface, IfaceParams, Iov, MemHandle, MemoryType, Registry,
    RemoteKey, RkeyBundle, Status,
};

#[derive(Parser, Debug)]
#[command(
    name = "dmabuf-demo",
    about = "Zero-copy RDMA between two processes over rc, on host, Gaudi or CUDA memory, with every byte verified",
    after_help = "Examples:\n  dmabuf-demo server                         wait for a client on port 18516\n  dmabuf-demo client 192.168.1.10            run Send/Recv, RDMA Write and RDMA Read against it\n  dmabuf-demo server -m gaudi -d mlx5_0      Gaudi HBM on the server, registered with mlx5_0 as a DMA-buf\n  dmabuf-demo server -m cuda -d mlx5_0       CUDA memory of cuda0 (DMA-buf, or nvidia_peermem)\n  dmabuf-demo client HOST -s 4M -n 100 -g 3  4 MiB, 100 iterations, GID index 3\n\nExit status: 0 when every phase was verified, 1 on a failure (named), 2 on bad usage.\nDevice memory needs a NIC that imports DMA-buf (mlx5, efa, irdma, bnxt_re; for cuda\nnvidia_peermem also works); the CPU cannot read it, so it is checked by moving the data back to host memory over the NIC."
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Wait for one client, serve it, exit.
    Server(Opts),
    /// Connect to a server and run the phases.
    Client {
        /// The server's host name or address.
        host: String,
        #[command(flatten)]
        opts: Opts,
    },
}

#[derive(ClapArgs, Debug, Clone)]
struct Opts {
    /// Transport: rc (RDMA); tcp runs the same phases without RDMA, on
    /// host memory.
    #[arg(short = 't', long = "transport", default_value = "rc")]
    transport: String,
    /// RDMA device (e.g. mlx5_0, rxe0); default: the first with rc.
    #[arg(short = 'd', long = "device")]
    device: Option<String>,
    /// Port of the RDMA device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (sets UCT_IB_GID_INDEX); default: RoCE v2 IPv4-mapped.
    #[arg(short = 'g', long = "gid-index")]
    gid_index: Option<u32>,
    /// TCP port of the handshake.
    #[arg(short = 'p', long = "port", default_value_t = 18516)]
    port: u16,
    /// Bytes per RDMA Write and Read (units k, M, G).
    #[arg(short = 's', long = "size", default_value = "1M", value_parser = parse_size)]
    size: usize,
    /// Iterations of each phase.
    #[arg(short = 'n', long = "iters", default_value_t = 10)]
    iters: u64,
    /// Memory of this side's buffers: host, gaudi or cuda (cuda0).
    #[arg(short = 'm', long = "mem", default_value = "host", value_parser = parse_mem)]
    mem: MemoryType,
    /// Seconds to wait for the peer (connect, handshake, each phase).
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

fn parse_size(s: &str) -> Result<usize, String> {
    uct_core::config::parse_size(s)
        .map(|v| v as usize)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("'{s}' is not a size such as 4096, 64k or 1M"))
}

fn parse_mem(s: &str) -> Result<MemoryType, String> {
    match MemoryType::parse(s) {
        Ok(t @ (MemoryType::Host | MemoryType::Gaudi | MemoryType::Cuda)) => Ok(t),
        Ok(t) => Err(format!(
            "{t} memory is not supported here; use host, gaudi or cuda"
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error(transparent)]
    Uct(#[from] uct_core::UctError),
    #[error("handshake with the peer: {0}")]
    Bootstrap(#[from] uct_core::bootstrap::BootstrapError),
    #[error(transparent)]
    Perf(#[from] tools::perf::error::PerfError),
    #[error("the peer refused: {0}")]
    Refused(String),
    #[error("VERIFICATION FAILED in {phase}, iteration {iter}: {detail}")]
    Verify {
        phase: &'static str,
        iter: u64,
        detail: String,
    },
    #[error("timed out after {0:?} waiting for {1}; is the peer alive?")]
    Timeout(Duration, &'static str),
    #[error("the peer failed while waiting for {0}: {1}")]
    PeerDied(&'static str, #[source] uct_core::UctError),
    #[error("protocol: {0}")]
    Protocol(String),
}

type Result<T, E = DemoError> = std::result::Result<T, E>;

const AM_ID: u8 = 3;
/// How long a server waits for its client.
const CLIENT_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Send/Recv replies carry a different pattern from requests.
const REPLY: u64 = 1 << 32;
/// RDMA Read iterations use patterns of their own.
const READ: u64 = 2 << 32;

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Hello {
        size: u64,
        iters: u64,
        mem: String,
        device_addr: Vec<u8>,
        ep_addr: Vec<u8>,
    },
    Welcome {
        mem: String,
        device_addr: Vec<u8>,
        ep_addr: Vec<u8>,
        buf_addr: u64,
        rkey: Vec<u8>,
        am_size: u64,
    },
    Refuse(String),
    /// Check the server buffer against pattern `iter`.
    Check {
        iter: u64,
    },
    /// Fill the server buffer with pattern `iter`.
    Fill {
        iter: u64,
    },
    /// Answer to Check/Fill: checked is false where the CPU cannot read.
    Ack {
        bad: Option<String>,
        checked: bool,
    },
    Done {
        ok: bool,
    },
}

/// One side: iface, endpoint, buffers, staging for device memory.
struct Side {
    iface: Box<dyn Iface>,
    ep: Box<dyn Endpoint>,
    bufs: Vec<MemHandle>,
    stage: Option<Stage>,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    timeout: Duration,
    /// Turns of waiting loops, which pace the liveness probes.
    turns: u32,
    _host: Vec<Box<[u8]>>,
}

/// Turns of a waiting loop between two liveness probes (`Endpoint::check`,
/// which the transport rate-limits by time): a turn is a progress call.
const CHECK_EVERY: u32 = 64;

/// How long a closed bootstrap connection is given to be explained by the
/// transport, which names the peer.
const EXPLAIN_WITHIN: Duration = Duration::from_millis(200);

fn open_side(reg: &Registry, opts: &Opts, nbufs: usize) -> Result<Side> {
    let device = opts.device.as_ref().map(|d| {
        if opts.transport == "rc" {
            format!("{d}:{}", opts.ib_port)
        } else {
            d.clone()
        }
    });
    let res = reg.find_resource(&opts.transport, device.as_deref())?;
    let mut iface = res
        .component
        .open_iface(&res.md, &res.tl, &IfaceParams::default())?;
    let mut host = Vec::new();
    let mut bufs = Vec::new();
    for _ in 0..nbufs {
        bufs.push(alloc(reg, iface.as_ref(), opts.mem, opts.size, &mut host)?);
    }
    let stage = if opts.mem.is_host_accessible() {
        None
    } else {
        let refs: Vec<&MemHandle> = bufs.iter().collect();
        Some(Stage::open(reg, &mut iface, opts.size, &refs)?)
    };
    let received = Arc::new(Mutex::new(Vec::new()));
    let inbox = received.clone();
    iface.set_am_handler(
        AM_ID,
        Box::new(move |m| {
            inbox
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(m.data.to_vec())
        }),
    )?;
    let ep = iface.create_ep(EpParams::Unconnected)?;
    eprintln!(
        "dmabuf-demo: {} on {}, {} memory ({} x {} bytes{})",
        opts.transport,
        res.tl.device,
        opts.mem,
        nbufs,
        opts.size,
        if opts.mem.is_host_accessible() {
            String::new()
        } else {
            format!(
                ", registered with {} as device memory; checked through host memory over the NIC",
                res.md.name()
            )
        }
    );
    Ok(Side {
        iface,
        ep,
        bufs,
        stage,
        received,
        timeout: Duration::from_secs(opts.timeout),
        turns: 0,
        _host: host,
    })
}

impl Side {
    /// One turn of a wait: progress, and every [`CHECK_EVERY`]-th turn a
    /// liveness probe, so that a dead peer ends the wait within the
    /// transport's peer timeout.
    fn turn(&mut self, what: &'static str) -> Result<()> {
        self.iface.progress();
        self.turns = self.turns.wrapping_add(1);
        if self.turns.is_multiple_of(CHECK_EVERY) {
            self.ep.check().map_err(|e| DemoError::PeerDied(what, e))?;
        }
        Ok(())
    }

    fn until(&mut self, what: &'static str, done: impl FnMut(&mut Self) -> bool) -> Result<()> {
        self.within(self.timeout, what, done)
    }

    /// Progresses until `done`, probing the peer, for at most `limit`.
    fn within(
        &mut self,
        limit: Duration,
        what: &'static str,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        let t0 = Instant::now();
        while !done(self) {
            self.turn(what)?;
            if t0.elapsed() > limit {
                return Err(DemoError::Timeout(limit, what));
            }
        }
        Ok(())
    }

    /// Posts with `op` until the transport takes it.
    fn retry(
        &mut self,
        what: &'static str,
        mut op: impl FnMut(&mut dyn Endpoint) -> uct_core::Result<Status>,
    ) -> Result<Status> {
        let t0 = Instant::now();
        loop {
            match op(self.ep.as_mut())? {
                Status::NoResource => {
                    self.turn(what)?;
                    if t0.elapsed() > self.timeout {
                        return Err(DemoError::Timeout(self.timeout, what));
                    }
                }
                status => return Ok(status),
            }
        }
    }

    /// Waits for the peer's next bootstrap message, progressing and probing
    /// meanwhile; then receives it.
    fn message(&mut self, ch: &mut BootstrapChannel, what: &'static str) -> Result<Msg> {
        self.until(what, |_| ch.poll_readable(Duration::ZERO).unwrap_or(true))?;
        ch.recv_msg::<Msg>().map_err(|e| self.explain(what, e))
    }

    /// A bootstrap connection that closed usually means that the peer
    /// process died: the transport's probe then names the peer.
    fn explain(&mut self, what: &'static str, e: BootstrapError) -> DemoError {
        if matches!(e, BootstrapError::Closed | BootstrapError::Io { .. }) {
            let t0 = Instant::now();
            while t0.elapsed() < EXPLAIN_WITHIN {
                self.iface.progress();
                if let Err(dead) = self.ep.check() {
                    return DemoError::PeerDied(what, dead);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        e.into()
    }

    fn post(
        &mut self,
        what: &'static str,
        mut op: impl FnMut(&mut dyn Endpoint, &Completion) -> uct_core::Result<Status>,
    ) -> Result<()> {
        let comp = Completion::new();
        let status = self.retry(what, |ep| op(ep, &comp))?;
        if status == Status::InProgress {
            let fired = comp.clone();
            self.until(what, |_| fired.is_complete())?;
        }
        comp.result()?;
        Ok(())
    }

    /// Writes pattern `iter` into buffer `i` (CPU, or staged for device memory).
    fn fill(&mut self, i: usize, len: usize, iter: u64) -> Result<()> {
        let mem = self.bufs[i].clone();
        match self.stage.as_mut() {
            Some(stage) => stage.write(self.iface.as_mut(), &mem, len, |bytes| {
                pattern_into(bytes, iter)
            })?,
            None => {
                let mut bytes = vec![0u8; len];
                pattern_into(&mut bytes, iter);
                mem.write(0, &bytes)?;
            }
        }
        Ok(())
    }

    fn read(&mut self, i: usize, len: usize) -> Result<Vec<u8>> {
        let mem = self.bufs[i].clone();
        Ok(match self.stage.as_mut() {
            Some(stage) => stage.read(self.iface.as_mut(), &mem, len)?,
            None => mem.to_vec()?[..len].to_vec(),
        })
    }

    fn send_am(&mut self, data: &[u8]) -> Result<()> {
        // A bcopy message is copied out when accepted: nothing to wait for.
        let _accepted = self.retry("room to send a message", |ep| ep.am_bcopy(AM_ID, data))?;
        Ok(())
    }

    fn take_am(&mut self) -> Result<Vec<u8>> {
        let inbox = self.received.clone();
        let mut got = None;
        self.until("a Send/Recv message", |_| {
            let mut queue = inbox.lock().unwrap_or_else(|p| p.into_inner());
            if !queue.is_empty() {
                got = Some(queue.remove(0));
            }
            got.is_some()
        })?;
        got.ok_or_else(|| DemoError::Protocol("no message".into()))
    }
}

fn pattern(len: usize, iter: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    pattern_into(&mut bytes, iter);
    bytes
}

fn verify(phase: &'static str, iter: u64, data: &[u8], want_iter: u64) -> Result<()> {
    match check_pattern(data, data.len(), want_iter) {
        None => Ok(()),
        Some(detail) => Err(DemoError::Verify {
            phase,
            iter,
            detail,
        }),
    }
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1u64 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

fn server(opts: Opts) -> Result<()> {
    let reg = Registry::global();
    let mut side = open_side(reg, &opts, 1)?;
    // The channel keeps the listener's timeout: every wait on it is bounded
    // by --timeout; the wait for a client, by a day.
    let listener = BootstrapListener::bind(("0.0.0.0", opts.port), side.timeout)?;
    eprintln!(
        "dmabuf-demo server: waiting for a client on port {}",
        opts.port
    );
    let started = Instant::now();
    let mut ch = loop {
        match listener.accept() {
            Ok(ch) => break ch,
            Err(e) => {
                // The listening socket itself failed: nothing to wait for.
                let listening = matches!(&e, BootstrapError::Io { what, .. } if what == "accept");
                if listening || started.elapsed() >= CLIENT_WAIT {
                    return Err(e.into());
                }
                if !matches!(e, BootstrapError::Timeout { .. }) {
                    eprintln!("dmabuf-demo server: a connection failed its handshake ({e}); still waiting");
                }
            }
        }
    };
    drop(listener);
    let (size, iters, their_mem, dev, ep_addr) = match ch.recv_msg::<Msg>()? {
        Msg::Hello {
            size,
            iters,
            mem,
            device_addr,
            ep_addr,
        } => (size, iters, mem, device_addr, ep_addr),
        other => {
            return Err(DemoError::Protocol(format!(
                "expected hello, got {other:?}"
            )))
        }
    };
    if size as usize != opts.size || iters != opts.iters {
        let why = format!(
            "size/iterations: client {size}/{iters}, server {}/{}; start both with the same -s and -n",
            opts.size, opts.iters
        );
        let _ = ch.send_msg(&Msg::Refuse(why.clone()));
        return Err(DemoError::Refused(why));
    }
    let am_size = (opts.size as u64).min(side.iface.attrs().am.max_bcopy as u64);
    let md = side.iface.md().clone();
    let rkey = RkeyBundle::single(md.pack_rkey(&side.bufs[0])?).pack()?;
    ch.send_msg(&Msg::Welcome {
        mem: opts.mem.name().into(),
        device_addr: side.iface.device_address(),
        ep_addr: side.ep.ep_address()?,
        buf_addr: side.bufs[0].addr(),
        rkey,
        am_size,
    })?;
    side.ep.connect_to_ep(&dev, &ep_addr)?;
    ch.barrier()?;
    eprintln!(
        "dmabuf-demo server: client connected ({their_mem} memory there, {} here)",
        opts.mem
    );
    // Send/Recv: verify each request, answer with a reply of its own.
    for i in 0..iters {
        let got = side.take_am()?;
        verify("send/recv (server side)", i, &got, i)?;
        side.send_am(&pattern(am_size as usize, i | REPLY))?;
    }
    // RDMA Write and Read: answer checks and fills until the client is done.
    // Between two requests the client makes a few transfers, each bounded
    // by --timeout.
    let mut checked = 0u64;
    loop {
        let next = "the client's next request";
        side.within(side.timeout * 4, next, |_| {
            ch.poll_readable(Duration::from_millis(1)).unwrap_or(true)
        })?;
        match ch.recv_msg::<Msg>().map_err(|e| side.explain(next, e))? {
            Msg::Check { iter } => {
                let (bad, ok) = if opts.mem.is_host_accessible() {
                    let data = side.read(0, opts.size)?;
                    checked += 1;
                    (check_pattern(&data, opts.size, iter), true)
                } else {
                    (None, false)
                };
                ch.send_msg(&Msg::Ack { bad, checked: ok })?;
            }
            Msg::Fill { iter } => {
                side.fill(0, opts.size, iter)?;
                ch.send_msg(&Msg::Ack {
                    bad: None,
                    checked: true,
                })?;
            }
            Msg::Done { ok } => {
                ch.send_msg(&Msg::Ack {
                    bad: None,
                    checked: true,
                })?;
                println!(
                    "dmabuf-demo server: send/recv {iters} verified; rdma write checked here {checked} times{}; client says {}",
                    if opts.mem.is_host_accessible() {
                        String::new()
                    } else {
                        format!(" ({} memory: the client verifies by reading back)", opts.mem)
                    },
                    if ok { "all verified" } else { "a phase FAILED" }
                );
                return if ok {
                    Ok(())
                } else {
                    Err(DemoError::Protocol("the client reported a failure".into()))
                };
            }
            other => return Err(DemoError::Protocol(format!("unexpected {other:?}"))),
        }
    }
}

fn ack(side: &mut Side, ch: &mut BootstrapChannel) -> Result<(Option<String>, bool)> {
    match side.message(ch, "the server's answer")? {
        Msg::Ack { bad, checked } => Ok((bad, checked)),
        other => Err(DemoError::Protocol(format!("expected ack, got {other:?}"))),
    }
}

fn client(host: &str, opts: Opts) -> Result<()> {
    let reg = Registry::global();
    // Buffer 0: source of writes; buffer 1: destination of reads.
    let mut side = open_side(reg, &opts, 2)?;
    let timeout = Duration::from_secs(opts.timeout);
    let mut ch = BootstrapChannel::connect((host, opts.port), timeout)?;
    ch.send_msg(&Msg::Hello {
        size: opts.size as u64,
        iters: opts.iters,
        mem: opts.mem.name().into(),
        device_addr: side.iface.device_address(),
        ep_addr: side.ep.ep_address()?,
    })?;
    let (their_mem, dev, ep_addr, raddr, rkey, am_size) = match ch.recv_msg::<Msg>()? {
        Msg::Welcome {
            mem,
            device_addr,
            ep_addr,
            buf_addr,
            rkey,
            am_size,
        } => (mem, device_addr, ep_addr, buf_addr, rkey, am_size),
        Msg::Refuse(why) => return Err(DemoError::Refused(why)),
        other => {
            return Err(DemoError::Protocol(format!(
                "expected welcome, got {other:?}"
            )))
        }
    };
    side.ep.connect_to_ep(&dev, &ep_addr)?;
    ch.barrier()?;
    let md = side.iface.md().clone();
    let rkey: RemoteKey = reg.unpack_rkey(&rkey, md.name())?;
    println!(
        "dmabuf-demo client: connected to {host}; {} memory here, {their_mem} memory there; {} bytes x {} iterations",
        opts.mem, opts.size, opts.iters
    );
    let result = phases(&mut side, &mut ch, &opts, raddr, &rkey, am_size as usize);
    let ok = result.is_ok();
    let _ = ch.send_msg(&Msg::Done { ok });
    let _ = ack(&mut side, &mut ch);
    result?;
    println!("dmabuf-demo client: ALL PHASES VERIFIED");
    Ok(())
}

fn phases(
    side: &mut Side,
    ch: &mut BootstrapChannel,
    opts: &Opts,
    raddr: u64,
    rkey: &RemoteKey,
    am_size: usize,
) -> Result<()> {
    let iters = opts.iters;
    let size = opts.size;
    // Send/Recv.
    let t0 = Instant::now();
    for i in 0..iters {
        side.send_am(&pattern(am_size, i))?;
        let got = side.take_am()?;
        verify("send/recv (reply)", i, &got, i | REPLY)?;
    }
    println!(
        "send/recv:  {iters} round trips of {am_size} bytes, both directions verified ({:.1} us per round trip)",
        t0.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64
    );
    // RDMA Write: local buffer 0 -> server; read back into buffer 1.
    let mut moved = Duration::ZERO;
    let mut server_checked = 0u64;
    for i in 0..iters {
        side.fill(0, size, i)?;
        let src = side.bufs[0].clone();
        let started = Instant::now();
        side.post("an RDMA Write", |ep, c| {
            ep.put_zcopy(&[Iov::new(&src, 0, size)], raddr, rkey, Some(c))
        })?;
        side.post("a flush", |ep, c| ep.flush(Some(c)))?;
        moved += started.elapsed();
        ch.send_msg(&Msg::Check { iter: i })?;
        let (bad, checked) = ack(side, ch)?;
        if let Some(detail) = bad {
            return Err(DemoError::Verify {
                phase: "rdma write (checked by the server)",
                iter: i,
                detail,
            });
        }
        server_checked += checked as u64;
        let dst = side.bufs[1].clone();
        side.post("an RDMA Read", |ep, c| {
            ep.get_zcopy(&[Iov::new(&dst, 0, size)], raddr, rkey, Some(c))
        })?;
        let data = side.read(1, size)?;
        verify("rdma write (read back)", i, &data, i)?;
    }
    println!(
        "rdma write: {iters} x {size} bytes verified by read-back{} ({:.1} MiB/s)",
        if server_checked == iters {
            " and by the server"
        } else {
            " (the server's memory is not CPU-readable)"
        },
        mib_s(iters * size as u64, moved)
    );
    // RDMA Read: the server fills, the client reads and checks.
    let mut moved = Duration::ZERO;
    for i in 0..iters {
        ch.send_msg(&Msg::Fill { iter: i | READ })?;
        ack(side, ch)?;
        let dst = side.bufs[1].clone();
        let started = Instant::now();
        side.post("an RDMA Read", |ep, c| {
            ep.get_zcopy(&[Iov::new(&dst, 0, size)], raddr, rkey, Some(c))
        })?;
        moved += started.elapsed();
        let data = side.read(1, size)?;
        verify("rdma read", i, &data, i | READ)?;
    }
    println!(
        "rdma read:  {iters} x {size} bytes verified ({:.1} MiB/s)",
        mib_s(iters * size as u64, moved)
    );
    Ok(())
}

fn main() {
    uct_builtins::link();
    uct_core::logging::init();
    let cli = Cli::parse();
    let (name, opts) = match &cli.role {
        Role::Server(opts) => ("server", opts.clone()),
        Role::Client { opts, .. } => ("client", opts.clone()),
    };
    if let Some(g) = opts.gid_index {
        // Read by the rc transport when the iface opens; set before any
        // thread starts.
        std::env::set_var("UCT_IB_GID_INDEX", g.to_string());
    }
    let outcome = match cli.role {
        Role::Server(opts) => server(opts),
        Role::Client { host, opts } => client(&host, opts),
    };
    if let Err(e) = outcome {
        eprintln!("dmabuf-demo {name}: {e}");
        std::process::exit(1);
    }
}
