//! What the layers under rc do when a rail goes away, watched from this
//! process: a raw verbs QP pair that nothing watches, the device's
//! asynchronous events and port state from a context of their own, tcp on
//! the downed address, and `rdma link delete` with the device open.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use md_ib::verbs::Context;
use md_ib::{IbMd, IbRkey};
use rdma_sys::*;
use uct_core::{Access, MemHandle, MemoryDomain, MemoryType};
use uct_ib::qp::{wc_status_name, Cq, LocalPath, Qp, RemoteQp};

use super::{check, drive, pair_stream_on, Rc, DEADLINE, DOWN_DEV, DOWN_LINK};

/// Runs `cmd` with sh; Err with its output when it fails.
pub fn sh(cmd: &str) -> Result<(), Failed> {
    let out = Command::new("sh").arg("-c").arg(cmd).output()?;
    if !out.status.success() {
        return Err(format!(
            "`{cmd}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// Port 1's state from sysfs ("4: ACTIVE"), or why there is none.
pub fn port_state(dev: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/state"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("no port state ({e})"))
}

/// Waits for `dev`'s port 1 to be ACTIVE; how long it took.
pub fn wait_active(dev: &str, limit: Duration) -> Result<Duration, Failed> {
    let t0 = Instant::now();
    loop {
        if port_state(dev).contains("ACTIVE") {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return Err(format!(
                "{dev} not ACTIVE {limit:?} later (port state: {})",
                port_state(dev)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `struct ibv_async_event` as C lays it out.
#[repr(C)]
struct RawEvent {
    element: u64,
    event_type: u32,
}

fn event_name(t: u32) -> String {
    const NAMES: [&str; 20] = [
        "CQ_ERR",
        "QP_FATAL",
        "QP_REQ_ERR",
        "QP_ACCESS_ERR",
        "COMM_EST",
        "SQ_DRAINED",
        "PATH_MIG",
        "PATH_MIG_ERR",
        "DEVICE_FATAL",
        "PORT_ACTIVE",
        "PORT_ERR",
        "LID_CHANGE",
        "PKEY_CHANGE",
        "SM_CHANGE",
        "SRQ_ERR",
        "SRQ_LIMIT_REACHED",
        "QP_LAST_WQE_REACHED",
        "CLIENT_REREGISTER",
        "GID_CHANGE",
        "WQ_FATAL",
    ];
    match NAMES.get(t as usize) {
        Some(n) => format!("IBV_EVENT_{n}"),
        None => format!("event {t}"),
    }
}

/// The device's events and port state over time, from a context of its
/// own.
pub struct Timeline {
    ctx: Arc<Context>,
    seen: Vec<(Duration, String)>,
    state: String,
}

impl Timeline {
    pub fn new(dev: &str) -> Result<Timeline, Failed> {
        let ctx = Context::open(dev)?;
        // SAFETY: the context is open; its event file is made
        // non-blocking so that reading it never waits.
        let ok = unsafe {
            let fd = (*ctx.as_ptr()).async_fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        check(ok, || "cannot make the event file non-blocking".into())?;
        Ok(Timeline {
            ctx,
            seen: Vec::new(),
            state: String::new(),
        })
    }

    /// Reads the events waiting and the port state, noting changes since
    /// `t0`.
    pub fn look(&mut self, t0: Instant) {
        loop {
            let mut ev = RawEvent {
                element: 0,
                event_type: 0,
            };
            // SAFETY: `ev` has struct ibv_async_event's layout; the file is
            // non-blocking.
            let r = unsafe {
                ibv_get_async_event(
                    self.ctx.as_ptr(),
                    &mut ev as *mut RawEvent as *mut ibv_async_event,
                )
            };
            if r != 0 {
                break;
            }
            self.seen.push((
                t0.elapsed(),
                format!(
                    "{} (element {})",
                    event_name(ev.event_type),
                    ev.element as u32
                ),
            ));
            // SAFETY: acknowledged once, as read.
            unsafe { ibv_ack_async_event(&mut ev as *mut RawEvent as *mut ibv_async_event) };
        }
        // SAFETY: ibv_port_attr is plain C data: all zeroes is valid.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; the compat prefix is filled.
        let r = unsafe {
            ibv_query_port(
                self.ctx.as_ptr(),
                1,
                &mut attr as *mut _ as *mut _compat_ibv_port_attr,
            )
        };
        let state = if r == 0 {
            format!("ibv_query_port: state {}", attr.state)
        } else {
            format!("ibv_query_port failed: {}", md_ib::error::errno_text(r))
        };
        if state != self.state {
            self.seen.push((t0.elapsed(), state.clone()));
            self.state = state;
        }
    }

    pub fn print(&self) {
        for (at, what) in &self.seen {
            println!("rail_down_vm: {} +{at:?}: {what}", self.ctx.name());
        }
    }
}

/// A raw RC QP pair on one device, in this process, that nothing but the
/// NIC watches: RDMA writes of one buffer into another, a few in flight.
pub struct Raw {
    // Field order: the QPs go before their CQ and memory.
    a: Qp,
    _b: Qp,
    cq: Arc<Cq>,
    src: MemHandle,
    lkey: u32,
    dst: MemHandle,
    rkey: u32,
    len: usize,
    outstanding: usize,
    pub ok: u64,
    pub failed: Option<(Instant, String)>,
    pub flushed: u64,
    _md: Arc<IbMd>,
}

impl Raw {
    pub fn open(dev: &str, len: usize) -> Result<Raw, Failed> {
        let md = Arc::new(IbMd::open("ib", dev)?);
        let src = md.alloc(len, MemoryType::Host, Access::all_rights())?;
        let dst = md.alloc(len, MemoryType::Host, Access::all_rights())?;
        let lkey = md.lkey_of(&src)?;
        let rkey = IbMd::unpack_rkey("ib", &md.pack_rkey(&dst)?)?;
        let rkey = rkey.downcast::<IbRkey>("ib")?.rkey;
        let port = md
            .info()
            .ports
            .iter()
            .find(|p| p.active)
            .cloned()
            .ok_or("no active port")?;
        let gid = port.choose_gid(None)?.clone();
        let cq = Cq::new(md.pd().context(), 64)?;
        let a = Qp::new(md.pd(), &cq, port.num, 16, 1, 1)?;
        let b = Qp::new(md.pd(), &cq, port.num, 1, 1, 1)?;
        let local = LocalPath {
            port: port.num,
            gid_index: gid.index,
            ethernet: port.ethernet,
            mtu: port.mtu,
            rd_atomic: 1,
        };
        let to = |qp: &Qp, psn| RemoteQp {
            qpn: qp.qpn(),
            psn,
            gid: gid.gid,
            lid: port.lid,
            mtu: port.mtu,
        };
        a.connect(&local, 100, &to(&b, 200))?;
        b.connect(&local, 200, &to(&a, 100))?;
        Ok(Raw {
            a,
            _b: b,
            cq,
            src,
            lkey,
            dst,
            rkey,
            len,
            outstanding: 0,
            ok: 0,
            failed: None,
            flushed: 0,
            _md: md,
        })
    }

    /// Polls, then posts while fewer than 8 are in flight and nothing
    /// failed.
    pub fn turn(&mut self) {
        // SAFETY: ibv_wc is plain C data: all zeroes is valid.
        let mut wcs: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        if let Ok(n) = self.cq.poll(&mut wcs) {
            for wc in &wcs[..n] {
                self.outstanding = self.outstanding.saturating_sub(1);
                if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
                    self.ok += 1;
                } else if self.failed.is_none() {
                    self.failed = Some((Instant::now(), wc_status_name(wc.status)));
                } else {
                    self.flushed += 1;
                }
            }
        }
        while self.failed.is_none() && self.outstanding < 8 {
            let mut sge = ibv_sge {
                addr: self.src.addr(),
                length: self.len as u32,
                lkey: self.lkey,
            };
            // SAFETY: plain C data; all zeroes is valid, filled in below.
            let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.wr.rdma = rdma_t {
                remote_addr: self.dst.addr(),
                rkey: self.rkey,
            };
            // SAFETY: the SGE covers `src`, registered and owned by self,
            // which the QP (the first field) does not outlive.
            if let Err(e) = unsafe { self.a.post_send(&mut wr) } {
                self.failed = Some((Instant::now(), format!("post: {e}")));
                break;
            }
            self.outstanding += 1;
        }
    }

    pub fn print(&self, t0: Instant, ok_before: u64) {
        println!(
            "rail_down_vm: raw QP pair on {DOWN_DEV}: {} writes of {} KiB completed after the link went down; first error: {}; {} more flushed",
            self.ok - ok_before,
            self.len >> 10,
            match &self.failed {
                Some((at, what)) => format!("{what} after {:?}", at.saturating_duration_since(t0)),
                None => format!("none within {:?}", t0.elapsed()),
            },
            self.flushed
        );
    }
}

/// tcp between the downed link's address and itself: a stream, then
/// dummy1 down for 10 s, a new connection tried meanwhile, then dummy1 up.
pub fn tcp_on_the_downed_address() -> Result<(), Failed> {
    let addr = "10.77.1.1";
    let listener = TcpListener::bind((addr, 0))?;
    let to = listener.local_addr()?;
    let mut tx = TcpStream::connect(to)?;
    let (mut rx, _) = listener.accept()?;
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || -> (u64, Option<(Instant, String)>) {
            let buf = vec![7u8; 64 << 10];
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                match tx.write(&buf) {
                    Ok(n) => sent += n as u64,
                    Err(e) => return (sent, Some((Instant::now(), e.to_string()))),
                }
            }
            (sent, None)
        })
    };
    let reader = {
        let got = got.clone();
        rx.set_read_timeout(Some(Duration::from_millis(200)))?;
        let stop = stop.clone();
        std::thread::spawn(move || -> Option<(Instant, String)> {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match rx.read(&mut buf) {
                    Ok(0) => return Some((Instant::now(), "end of stream".into())),
                    Ok(n) => {
                        got.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if stop.load(Ordering::Relaxed) {
                            return None;
                        }
                    }
                    Err(e) => return Some((Instant::now(), e.to_string())),
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let before = got.load(Ordering::Relaxed);
    let t0 = Instant::now();
    // Phase 1: the link down; phase 2: the address removed.
    let phases = [
        (
            format!("ip link set {DOWN_LINK} down"),
            format!("ip link set {DOWN_LINK} up"),
        ),
        (
            format!("ip addr del {addr}/24 dev {DOWN_LINK}"),
            format!("ip addr add {addr}/24 dev {DOWN_LINK}"),
        ),
    ];
    for (down, up) in &phases {
        let t = Instant::now();
        let at_start = got.load(Ordering::Relaxed);
        sh(down)?;
        let mut samples = Vec::new();
        let mut fresh = None;
        while t.elapsed() < Duration::from_secs(6) {
            std::thread::sleep(Duration::from_millis(500));
            samples.push((t.elapsed(), got.load(Ordering::Relaxed)));
            if fresh.is_none() && t.elapsed() > Duration::from_secs(1) {
                let c = Instant::now();
                let r = TcpStream::connect_timeout(&to, Duration::from_secs(2));
                fresh = Some((
                    c.elapsed(),
                    r.map(|_| "connected".to_string())
                        .unwrap_or_else(|e| e.to_string()),
                ));
            }
        }
        let routes = Command::new("sh")
            .arg("-c")
            .arg(format!("ip -4 route show table local | grep {addr}"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        sh(up)?;
        let at_up = got.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(2));
        let after_up = got.load(Ordering::Relaxed);
        println!(
            "rail_down_vm: tcp {to}, `{down}`: bytes received since, by time: {}",
            samples
                .iter()
                .map(|(at, n)| format!("+{:.1}s {}", at.as_secs_f64(), n - at_start))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some((took, what)) = &fresh {
            println!("rail_down_vm: tcp: a new connect to {to} meanwhile: {what} after {took:?}");
        }
        println!("rail_down_vm: tcp: the local route of {addr} meanwhile: {routes:?}");
        println!(
            "rail_down_vm: tcp: {} bytes received in the 2 s after `{up}`",
            after_up - at_up
        );
    }
    stop.store(true, Ordering::Relaxed);
    let reader_end = reader.join().map_err(|_| "the reader panicked")?;
    let (sent, writer_end) = writer.join().map_err(|_| "the writer panicked")?;
    println!(
        "rail_down_vm: tcp: {before} bytes in the second before; writer sent {sent}, ended {:?}; reader ended {:?}",
        writer_end.map(|(at, e)| format!("{e} at +{:?}", at.saturating_duration_since(t0))),
        reader_end.map(|(at, e)| format!("{e} at +{:?}", at.saturating_duration_since(t0))),
    );
    wait_active(DOWN_DEV, Duration::from_secs(20))?;
    check(before > 0, || {
        "the tcp stream moved nothing before the link went down".into()
    })
}

/// `rdma link delete rxe1` while this process has rxe1 open and streams
/// puts on it; then the device closed, the delete waited for, rxe1 added
/// again.
pub fn rdma_link_delete_with_the_device_open() -> Result<(), Failed> {
    let mut rc = Rc::open_on(DOWN_DEV)?;
    let mut s = pair_stream_on(&mut rc, "rxe1 (in process)")?;
    let mut tl = Timeline::new(DOWN_DEV)?;
    drive(
        &mut [&mut rc],
        &mut [&mut s],
        Duration::from_secs(1),
        |_| false,
    );
    let before = s.ok;
    let t0 = Instant::now();
    let mut del = Command::new("rdma")
        .args(["link", "delete", DOWN_DEV])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut deleted = None;
    let mut check_err = None;
    drive(
        &mut [&mut rc],
        &mut [&mut s],
        DEADLINE + Duration::from_secs(2),
        |st| {
            tl.look(t0);
            if deleted.is_none() {
                if let Ok(Some(status)) = del.try_wait() {
                    deleted = Some((t0.elapsed(), status));
                }
            }
            if check_err.is_none() {
                if let Err(e) = st[0].ep.check() {
                    check_err = Some((t0.elapsed(), e.to_string()));
                }
            }
            false
        },
    );
    tl.print();
    println!(
        "rail_down_vm: rdma link delete {DOWN_DEV} with the device open: {} puts after it started, {} failed (first: {:?}); check(): {:?}; sysfs: {}; the delete {}",
        s.ok - before,
        s.errors,
        s.failed.as_ref().map(|f| (f.0.saturating_duration_since(t0), f.1.to_string())),
        check_err,
        port_state(DOWN_DEV),
        match &deleted {
            Some((at, st)) => format!("ended ({st}) after {at:?}"),
            None => format!("still waits after {:?}", t0.elapsed()),
        }
    );
    let made_progress = s.ok > before || s.errors > 0 || check_err.is_some();
    // Close everything of rxe1 in this process: the delete may wait for it.
    let t1 = Instant::now();
    drop(s);
    drop(rc);
    drop(tl);
    let mut waited = None;
    if deleted.is_none() {
        while t1.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(status)) = del.try_wait() {
                waited = Some((t1.elapsed(), status));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match &waited {
            Some((at, st)) => println!(
                "rail_down_vm: the delete ended ({st}) {at:?} after this process closed {DOWN_DEV}"
            ),
            None => {
                let _ = del.kill();
                println!("rail_down_vm: the delete did not end within 20 s of this process closing {DOWN_DEV}");
            }
        }
    }
    let _ = del.wait();
    let gone = !std::path::Path::new(&format!("/sys/class/infiniband/{DOWN_DEV}")).exists();
    if gone {
        sh(&format!(
            "rdma link add {DOWN_DEV} type rxe netdev {DOWN_LINK}"
        ))?;
    }
    let took = wait_active(DOWN_DEV, Duration::from_secs(20))?;
    println!("rail_down_vm: {DOWN_DEV} added again, ACTIVE after {took:?}");
    check(deleted.is_some() || waited.is_some(), || {
        format!("rdma link delete {DOWN_DEV} never ended, even with the device closed")
    })?;
    check(gone, || {
        format!("{DOWN_DEV} was still there after rdma link delete ended")
    })?;
    check(made_progress, || {
        "while the delete ran, the endpoint neither moved data nor failed".into()
    })
}
