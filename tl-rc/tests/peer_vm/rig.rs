//! What the peer tests share: an rc iface opened through the ib component,
//! a peer process (this binary, re-run as a child) that serves a region
//! and can be killed, and a hostile in-process queue pair that speaks raw
//! verbs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use md_ib::{IbMd, IbRkey};
use rdma_sys::*;
use uct_core::{
    Access, Completion, Component, Endpoint, EpParams, Iface, IfaceParams, MemHandle, MemoryDomain,
    MemoryType, RemoteKey, RkeyEntry,
};
use uct_ib::qp::{Cq, LocalPath, Qp, RemoteQp};
use uct_ib::wire::EpAddress;
use uct_ib::IbComponent;

/// What the peer's region holds; our buffers start zeroed.
pub const PATTERN: u8 = 0x5a;
/// The environment variable that makes this binary a peer process; its
/// value is the size of the region the peer serves.
pub const CHILD_ENV: &str = "RC_PEER_VM_CHILD";

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Result<Vec<u8>, Failed> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd hex {s:?}").into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| Failed::from(e.to_string())))
        .collect()
}

/// The device the tests run on: the VM's, else the first one.
pub fn device() -> Option<String> {
    let names = md_ib::verbs::Context::device_names();
    match std::env::var("RXE_VM_DEVICE") {
        Ok(want) => names.into_iter().find(|n| *n == want),
        Err(_) => names.into_iter().next(),
    }
}

/// An endpoint of the iface.
pub type Ep = Box<dyn Endpoint>;

/// An rc iface on the test device, with its component and MD.
pub struct Rc {
    pub comp: IbComponent,
    pub md: Arc<dyn MemoryDomain>,
    pub iface: Box<dyn Iface>,
}

impl Rc {
    pub fn open() -> Result<Rc, Failed> {
        let dev = device().ok_or("no RDMA device")?;
        Self::open_on(&dev)
    }

    /// An rc iface on the first active port of device `dev`.
    pub fn open_on(dev: &str) -> Result<Rc, Failed> {
        let comp = IbComponent::new();
        let md = comp.open_md(dev)?;
        let res = comp
            .tl_resources(&md)?
            .into_iter()
            .next()
            .ok_or_else(|| format!("{dev} has no active port"))?;
        let iface = comp.open_iface(&md, &res, &IfaceParams::default())?;
        Ok(Rc { comp, md, iface })
    }

    pub fn ep(&mut self) -> Result<Box<dyn Endpoint>, Failed> {
        Ok(self.iface.create_ep(EpParams::Unconnected)?)
    }

    /// A zeroed host buffer registered with every right.
    pub fn buffer(&self, len: usize) -> Result<MemHandle, Failed> {
        Ok(self.md.alloc(len, MemoryType::Host, Access::all_rights())?)
    }

    /// Two endpoints of this iface connected to each other.
    pub fn pair(&mut self) -> Result<(Ep, Ep), Failed> {
        let (mut a, mut b) = (self.ep()?, self.ep()?);
        let dev = self.iface.device_address();
        let (aa, ba) = (a.ep_address()?, b.ep_address()?);
        a.connect_to_ep(&dev, &ba)?;
        b.connect_to_ep(&dev, &aa)?;
        Ok((a, b))
    }

    /// The remote key of a region of this MD, as a peer would unpack it.
    pub fn rkey(&self, mem: &MemHandle) -> Result<RemoteKey, Failed> {
        let entry = self.md.pack_rkey(mem)?;
        Ok(self.comp.unpack_rkey(&entry)?)
    }

    /// Progresses until `done`, for at most `limit`; Err says what did
    /// not happen.
    pub fn progress_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<Duration, Failed> {
        let t0 = Instant::now();
        while !done(self) {
            if t0.elapsed() > limit {
                return Err(format!("{what}: not within {limit:?}").into());
            }
            self.iface.progress();
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(t0.elapsed())
    }

    /// Progresses for `d`.
    pub fn idle(&mut self, d: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < d {
            self.iface.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Bytes of `mem` that hold the peer's pattern, counted in 4 KiB pages
/// compared whole (memcmp: a debug build under qemu counts bytes one by
/// one far too slowly); a page partly written counts as not written.
pub fn written(mem: &MemHandle) -> Result<usize, Failed> {
    Ok(pattern_bytes(&mem.to_vec()?))
}

/// As [`written`], of bytes already copied out.
pub fn pattern_bytes(bytes: &[u8]) -> usize {
    let page = [PATTERN; 4096];
    bytes
        .chunks(4096)
        .filter(|c| *c == &page[..c.len()])
        .map(<[u8]>::len)
        .sum()
}

/// A completion's result after `is_complete`, as text for messages.
pub fn outcome(c: &Completion) -> String {
    match c.result() {
        Ok(()) => "success".into(),
        Err(e) => format!("error: {e}"),
    }
}

/// A peer process: this binary re-run with [`CHILD_ENV`], serving a region
/// of the pattern through its own rc endpoint until killed.
pub struct Peer {
    pub child: Child,
    pub qpn: u32,
    pub region_addr: u64,
    pub rkey: RemoteKey,
    stdin: ChildStdin,
    lines: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts a peer serving `len` bytes and connects `ep` of `rc` to it.
    pub fn start(rc: &mut Rc, ep: &mut dyn Endpoint, len: usize) -> Result<Peer, Failed> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(CHILD_ENV, len.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("child stdin")?;
        let lines = BufReader::new(child.stdout.take().ok_or("child stdout")?);
        let mut peer = Peer {
            child,
            qpn: 0,
            region_addr: 0,
            rkey: RemoteKey::new("ib", "none", Box::new(0u8)),
            stdin,
            lines,
        };
        let line = peer.read_line()?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let [dev, epa, addr, payload, md] = f[..] else {
            return Err(format!("peer said {line:?}").into());
        };
        let epa = unhex(epa)?;
        peer.qpn = EpAddress::decode(&epa)?.qpn;
        peer.region_addr = u64::from_str_radix(addr, 16)?;
        peer.rkey = rc.comp.unpack_rkey(&RkeyEntry {
            component: "ib".into(),
            md: md.into(),
            payload: unhex(payload)?,
        })?;
        ep.connect_to_ep(&unhex(dev)?, &epa)?;
        let ours = format!(
            "{} {}\n",
            hex(&rc.iface.device_address()),
            hex(&ep.ep_address()?)
        );
        peer.stdin.write_all(ours.as_bytes())?;
        let ready = peer.read_line()?;
        if ready.trim() != "connected" {
            return Err(format!("peer said {ready:?}").into());
        }
        Ok(peer)
    }

    fn read_line(&mut self) -> Result<String, Failed> {
        let mut line = String::new();
        self.lines.read_line(&mut line)?;
        if line.is_empty() {
            return Err("the peer process exited before answering".into());
        }
        Ok(line)
    }

    /// SIGKILL, and reap it.
    pub fn kill(mut self) -> Result<(), Failed> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

/// The peer process's main: serves a region until stdin closes or it is
/// killed.
pub fn child_main(len: usize) -> ! {
    let run = || -> Result<(), Failed> {
        let mut rc = Rc::open()?;
        let mut ep = rc.ep()?;
        let region = rc.buffer(len)?;
        region.write(0, &vec![PATTERN; len])?;
        let entry = rc.md.pack_rkey(&region)?;
        println!(
            "{} {} {:x} {} {}",
            hex(&rc.iface.device_address()),
            hex(&ep.ep_address()?),
            region.addr(),
            hex(&entry.payload),
            entry.md
        );
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let [dev, epa] = f[..] else {
            return Err(format!("parent said {line:?}").into());
        };
        ep.connect_to_ep(&unhex(dev)?, &unhex(epa)?)?;
        println!("connected");
        // Stdin closes when the parent is done (or dies): then exit.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_line(&mut String::new());
            let _ = tx.send(());
        });
        while rx.try_recv().is_err() {
            rc.iface.progress();
            std::thread::sleep(Duration::from_micros(500));
        }
        drop(ep);
        Ok(())
    };
    match run() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("rc peer process: {e:?}");
            std::process::exit(2)
        }
    }
}

/// A hostile peer in this process: a raw RC queue pair on its own
/// protection domain, connected to one of our endpoints, serving a region
/// of the pattern, and sending whatever it likes.
pub struct Hostile {
    // Field order: the QP goes before its CQ and the region it serves.
    qp: Qp,
    _cq: Arc<Cq>,
    pub region: MemHandle,
    pub rkey: RemoteKey,
    /// The local key of `region`, for the writes it sends.
    lkey: u32,
}

impl Hostile {
    /// Connects a raw QP to `ep` of `rc`, serving `len` bytes.
    pub fn connect(rc: &Rc, ep: &mut dyn Endpoint, len: usize) -> Result<Hostile, Failed> {
        let dev = device().ok_or("no RDMA device")?;
        let md = Arc::new(IbMd::open("ib", &dev)?);
        let region = md.alloc(len, MemoryType::Host, Access::all_rights())?;
        region.write(0, &vec![PATTERN; len])?;
        let entry = md.pack_rkey(&region)?;
        let rkey = IbMd::unpack_rkey("ib", &entry)?;
        let lkey = md.lkey_of(&region)?;
        let port = md
            .info()
            .ports
            .iter()
            .find(|p| p.active)
            .cloned()
            .ok_or("no active port")?;
        let gid = port.choose_gid(None)?.clone();
        let cq = Cq::new(md.pd().context(), 64)?;
        let qp = Qp::new(md.pd(), &cq, port.num, 16, 16, 1)?;
        let ours = EpAddress::decode(&ep.ep_address()?)?;
        let local = LocalPath {
            port: port.num,
            gid_index: gid.index,
            ethernet: port.ethernet,
            mtu: port.mtu,
            rd_atomic: md.info().max_rd_atomic.clamp(1, 16) as u8,
        };
        let psn = 0x1234;
        let remote = RemoteQp {
            qpn: ours.qpn,
            psn: ours.psn,
            gid: gid.gid,
            lid: port.lid,
            mtu: port.mtu,
        };
        qp.connect(&local, psn, &remote)?;
        let theirs = EpAddress { qpn: qp.qpn(), psn }.encode();
        ep.connect_to_ep(&rc.iface.device_address(), &theirs)?;
        Ok(Hostile {
            qp,
            _cq: cq,
            region,
            rkey,
            lkey,
        })
    }

    /// Sends an empty SEND with immediate data `imm` (host order).
    pub fn send_imm(&self, imm: u32) -> Result<(), Failed> {
        // SAFETY: ibv_send_wr is plain C data; all zeroes is valid (no
        // SGE list, no next).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        // SAFETY: the request carries no memory (no SGE).
        unsafe { self.qp.post_send(&mut wr) }?;
        Ok(())
    }
}

impl Hostile {
    /// Sends an RDMA WRITE WITH IMMEDIATE of the first `len` bytes of its
    /// region (at most its length) to `addr` under the peer's `rkey`, with
    /// immediate `imm` (host order), unsignalled: what a peer may send
    /// whether or not the receiver expects it.
    pub fn write_imm(&self, addr: u64, rkey: u32, len: usize, imm: u32) -> Result<(), Failed> {
        if len > self.region.len() {
            return Err(format!("{len} bytes from a region of {}", self.region.len()).into());
        }
        let mut sge = ibv_sge {
            addr: self.region.addr(),
            length: len as u32,
            lkey: self.lkey,
        };
        // SAFETY: ibv_send_wr is plain C data; all zeroes is valid, filled
        // in below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.sg_list = &mut sge;
        wr.num_sge = i32::from(len > 0);
        wr.wr.rdma = rdma_t {
            remote_addr: addr,
            rkey,
        };
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        // SAFETY: the SGE points at `len` bytes (checked above) of `region`,
        // registered with `lkey` and owned by `self`, which the QP (its
        // first field) does not outlive.
        unsafe { self.qp.post_send(&mut wr) }?;
        Ok(())
    }
}

/// A key for `len` bytes at address 0 that no region has: the sender's
/// check passes it, the peer's NIC would refuse it.
pub fn forged_rkey(len: u64) -> RemoteKey {
    let key = IbRkey {
        rkey: 0xdead,
        base: 0,
        len,
        access: Access::all_rights(),
    };
    RemoteKey::new(
        "ib",
        device().unwrap_or_default(),
        Box::new(key) as Box<dyn std::any::Any + Send + Sync>,
    )
}
