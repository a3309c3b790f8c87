//! uct-victim: the process under attack in the adversary suite
//! (`test_suite::adversary`).
//!
//! `uct-victim --transport T` opens an iface of T (tcp on the loopback),
//! registers a read-write region, a read-only region and a third region
//! whose rkey it packs and then deregisters, binds a unix control socket in
//! a private temporary folder, prints the target line on stdout, then
//! serves: it progresses its iface, counts active messages on id 1, and
//! answers control requests (`adversary::control`). When its stdin closes
//! it prints `am_received=N` and `peak_rss_kib=N` (VmHWM) and exits 0.
//!
//! Nothing a peer sends may crash it: every transport error is an `err`
//! answer. Exit status 2 is a failure to set up, with the reason on stderr.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use test_suite::adversary::common::{self, named, OpError};
use test_suite::adversary::control::unword;
use test_suite::adversary::{RegionInfo, Target};
use uct_core::{
    Access, Caps, Endpoint, EpParams, Iface, MdFlags, MemHandle, MemoryDomain, MemoryType,
    Registry, RkeyBundle, UctError,
};

/// The read-write region: the well-behaved peer uses its first half.
const RW_LEN: usize = 1 << 20;
/// The read-only and the stale regions.
const SMALL_LEN: usize = 64 << 10;
/// The most a `get` or `put` request may move: our limit, checked before
/// anything is allocated for it.
const MAX_RMA: usize = 1 << 20;
/// The longest request line read (an rkey bundle is at most 64 KiB, twice
/// that in hex).
const MAX_LINE: u64 = 256 << 10;
/// How long a control client may take to send its line.
const LINE_DEADLINE: Duration = Duration::from_secs(2);
/// Turns without work before the loop starts sleeping between turns: the
/// suite's three processes share two cores.
const IDLE_TURNS: u32 = 1000;

fn main() -> ExitCode {
    uct_builtins::link();
    uct_core::logging::init();
    let mut args = std::env::args().skip(1);
    let transport = match (args.next().as_deref(), args.next()) {
        (Some("--transport"), Some(t)) => t,
        _ => {
            eprintln!("usage: uct-victim --transport tcp|posix|cma");
            return ExitCode::from(2);
        }
    };
    let mut victim = match Victim::new(&transport) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("uct-victim: cannot set up {transport}: {e}");
            return ExitCode::from(2);
        }
    };
    let result = victim.serve();
    let _ = std::fs::remove_dir_all(&victim.dir);
    if let Err(e) = result {
        eprintln!("uct-victim: {e}");
        return ExitCode::from(2);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "am_received={}",
        victim.am_received.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "peak_rss_kib={}", peak_rss_kib().unwrap_or(0));
    let _ = out.flush();
    ExitCode::SUCCESS
}

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A region of the victim: its handle, and the host buffer under it when
/// the MD registers rather than allocates. Buffers are leaked, never freed:
/// a region's memory must outlive every clone of its handle a transport
/// may still hold.
fn region(
    md: &Arc<dyn MemoryDomain>,
    len: usize,
    access: Access,
) -> Result<(MemHandle, RegionInfo), UctError> {
    let attrs = md.attrs();
    let mem = if attrs.flags.contains(MdFlags::ALLOC)
        && attrs.alloc_mem_types.contains(&MemoryType::Host)
    {
        md.alloc(len, MemoryType::Host, access)?
    } else {
        let buf: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
        // SAFETY: the buffer is leaked: it stays valid and unused by
        // anything else for the rest of the process, after every handle.
        unsafe { md.register(buf.as_mut_ptr(), len, access)? }
    };
    let rkey = RkeyBundle::single(md.pack_rkey(&mem)?).pack()?;
    let info = RegionInfo {
        addr: mem.addr(),
        len,
        rkey,
    };
    Ok((mem, info))
}

struct Victim {
    iface: Box<dyn Iface>,
    /// The endpoint of the last `connect` request.
    ep: Option<Box<dyn Endpoint>>,
    /// Kept registered for the life of the process.
    _regions: Vec<MemHandle>,
    listener: UnixListener,
    /// The private folder holding the control socket.
    dir: PathBuf,
    target: Target,
    am_received: Arc<AtomicU64>,
    stdin_closed: Arc<AtomicBool>,
}

impl Victim {
    fn new(transport: &str) -> Result<Victim, String> {
        let mut iface = common::open_iface(transport).map_err(|e| named(&e))?;
        let md = iface.md().clone();
        let (rw_mem, rw) = region(&md, RW_LEN, Access::all_rights()).map_err(|e| named(&e))?;
        let (ro_mem, ro) =
            region(&md, SMALL_LEN, Access::remote_read_only()).map_err(|e| named(&e))?;
        // Packed, then deregistered here: its rkey is stale from now on.
        let (stale_mem, stale) =
            region(&md, SMALL_LEN, Access::all_rights()).map_err(|e| named(&e))?;
        drop(stale_mem);

        let am_received = Arc::new(AtomicU64::new(0));
        let count = am_received.clone();
        // cma moves memory only: it has no active messages to count.
        if iface.attrs().caps.contains(Caps::AM) {
            iface
                .set_am_handler(
                    1,
                    Box::new(move |_| {
                        count.fetch_add(1, Ordering::Relaxed);
                    }),
                )
                .map_err(|e| named(&e))?;
        }

        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("uct-victim-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("create the control folder {}: {e}", dir.display()))?;
        let path = dir.join("control.sock");
        let listener = UnixListener::bind(&path)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("bind the control socket {}: {e}", path.display()))?;

        let target = Target {
            transport: transport.into(),
            pid: std::process::id(),
            device_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
            rw,
            ro,
            stale,
            control: path.display().to_string(),
        };
        Ok(Victim {
            iface,
            ep: None,
            _regions: vec![rw_mem, ro_mem],
            listener,
            dir,
            target,
            am_received,
            stdin_closed: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Prints the target line, then serves until stdin closes.
    fn serve(&mut self) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", self.target.to_line())
            .and_then(|()| out.flush())
            .map_err(|e| format!("print the target line: {e}"))?;
        drop(out);

        let closed = self.stdin_closed.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            closed.store(true, Ordering::Relaxed);
        });

        let mut idle = 0u32;
        let mut turn = 0u32;
        while !self.stdin_closed.load(Ordering::Relaxed) {
            let mut worked = self.iface.progress() > 0;
            turn = turn.wrapping_add(1);
            // accept() is a system call: when idle, or every 64th busy turn.
            if !worked || turn.is_multiple_of(64) {
                match self.listener.accept() {
                    Ok((stream, _)) => {
                        self.request(stream);
                        worked = true;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => log::warn!("uct-victim: control accept: {e}"),
                }
            }
            if worked {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle > IDLE_TURNS {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
        Ok(())
    }

    /// Serves one control connection: one line in, one line out. A client
    /// that sends nothing within [`LINE_DEADLINE`] gets an error.
    fn request(&mut self, stream: UnixStream) {
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(LINE_DEADLINE)))
            .and_then(|()| stream.set_write_timeout(Some(LINE_DEADLINE)));
        let mut line = String::new();
        let read =
            setup.and_then(|()| BufReader::new((&stream).take(MAX_LINE)).read_line(&mut line));
        let answer = match read {
            Ok(_) if line.ends_with('\n') => self.answer(line.trim()),
            Ok(_) => Err(UctError::InvalidParam(format!(
                "control request without a newline within {MAX_LINE} bytes"
            ))),
            Err(e) => Err(UctError::io("control: read the request", e)),
        };
        let text = match answer {
            Ok(detail) => format!("ok {detail}\n"),
            Err(e) => format!("err {}\n", named(&e)),
        };
        if let Err(e) = (&stream).write_all(text.as_bytes()) {
            log::warn!("uct-victim: control: answer: {e}");
        }
    }

    fn answer(&mut self, line: &str) -> Result<String, UctError> {
        let mut words = line.split_whitespace();
        let request = words.next().unwrap_or("");
        let mut arg = |what: &str| {
            words.next().ok_or_else(|| {
                UctError::InvalidParam(format!("control request {request:?} lacks its {what}"))
            })
        };
        match request {
            "ping" => Ok("pong".into()),
            "connect" => {
                let device_addr = hex_arg(arg("device address")?)?;
                let iface_addr = hex_arg(arg("iface address")?)?;
                self.connect(device_addr, iface_addr)
            }
            "get" | "put" => {
                let rkey = hex_arg(arg("rkey")?)?;
                let addr_text = arg("remote address")?;
                let addr = u64::from_str_radix(addr_text, 16).map_err(|_| {
                    UctError::InvalidParam(format!("remote address {addr_text:?} is not hex"))
                })?;
                let len_text = arg("length")?;
                let len = len_text
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n <= MAX_RMA)
                    .ok_or_else(|| {
                        UctError::InvalidParam(format!(
                            "length {len_text:?} is not a number up to {MAX_RMA}"
                        ))
                    })?;
                self.rma(request == "put", &rkey, addr, len)
            }
            other => Err(UctError::InvalidParam(format!(
                "unknown control request {other:?}; known: ping, connect, get, put"
            ))),
        }
    }

    /// Connects to the given iface (replacing the last endpoint) and sends
    /// one AM (id 1, header 0, 8 bytes), flushed; a transport without
    /// active messages (cma) flushes only.
    fn connect(&mut self, device_addr: Vec<u8>, iface_addr: Vec<u8>) -> Result<String, UctError> {
        self.ep = None;
        let mut ep = self.iface.create_ep(EpParams::ToIface {
            device_addr,
            iface_addr,
        })?;
        let detail = if self.iface.attrs().caps.contains(Caps::AM) {
            common::am(self.iface.as_mut(), ep.as_mut(), 1, 0, &[0x5a; 8]).map_err(op_error)?;
            "connected, sent one active message on id 1"
        } else {
            common::flush(self.iface.as_mut(), ep.as_mut()).map_err(op_error)?;
            "connected, flushed (no active messages on this transport)"
        };
        self.ep = Some(ep);
        Ok(detail.into())
    }

    /// A get (answers the bytes in hex, at most 64 of them) or a put of
    /// 0xAA bytes through the last `connect`'s endpoint.
    fn rma(&mut self, put: bool, rkey: &[u8], addr: u64, len: usize) -> Result<String, UctError> {
        let rkey = Registry::global().unpack_rkey(rkey, self.iface.md().name())?;
        let ep = self.ep.as_mut().ok_or_else(|| {
            UctError::InvalidParam("no endpoint: send a connect request first".into())
        })?;
        if put {
            common::put(
                self.iface.as_mut(),
                ep.as_mut(),
                &vec![0xAA; len],
                addr,
                &rkey,
            )
            .map_err(op_error)?;
            Ok(format!("wrote {len} bytes"))
        } else {
            let bytes = common::get(self.iface.as_mut(), ep.as_mut(), len, addr, &rkey)
                .map_err(op_error)?;
            Ok(format!(
                "read {len} bytes: {}",
                test_suite::adversary::hex(&bytes[..len.min(64)])
            ))
        }
    }
}

fn hex_arg(s: &str) -> Result<Vec<u8>, UctError> {
    unword(s).ok_or_else(|| UctError::InvalidParam(format!("{s:.40?} is not hex (or - for none)")))
}

/// A request whose wait ran out is a Timeout answer.
fn op_error(e: OpError) -> UctError {
    match e {
        OpError::Uct(e) => e,
        OpError::Deadline(what) => UctError::Timeout(OpError::Deadline(what).to_string()),
    }
}
