//! The transfer API over rc: two Transports in one process on the RDMA
//! device (rxe0, Soft-RoCE, inside scripts/rxe-vm), and the ping-pong
//! example in two processes.
//!
//! Each notified write fits one zcopy here, so each notification must be
//! the immediate of one RDMA WRITE WITH IMMEDIATE: the writer counts it
//! sent by immediate, the receiver received by immediate (its handler runs
//! only for IBV_WC_RECV_RDMA_WITH_IMM completions), and neither side counts
//! a notification message.
//!
//! rxe cannot import DMA-buf, so Gaudi memory (md-gaudi over the hl-thunk
//! simulator, a TEST DOUBLE) must be refused at registration with md-ib's
//! DMA-buf message, by the library and by the example.
//!
//! Inside the VM (`RXE_VM_DEVICE` set), or where `UCT_TEST_EXPECT` names rc,
//! rc is expected: if it is absent every test fails with the reason.
//! Elsewhere every test is reported as skipped, by name, with the reason.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{fill_of, len_of, within};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use uct_transfer::{
    Access, Memory, MemoryType, Progress, RemoteBuffer, Stats, TransferError, Transport,
};

/// The NICs md-ib names as able to import DMA-buf.
const DMABUF_NICS: [&str; 4] = ["mlx5", "efa", "irdma", "bnxt_re"];

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// The first usable rc device, or why there is none.
fn rc_device() -> Result<String, String> {
    let probes = Transport::probe();
    if let Some(dev) = probes
        .iter()
        .find(|p| p.transport == "rc" && p.usable)
        .and_then(|p| p.device.clone())
    {
        return Ok(dev);
    }
    Err(probes
        .into_iter()
        .find(|p| p.transport == "rc")
        .and_then(|p| p.reason)
        .unwrap_or_else(|| uct_core::Registry::global().explain_absent("rc")))
}

/// Whether this run expects rc: inside scripts/rxe-vm (which sets
/// `RXE_VM_DEVICE`), or where `UCT_TEST_EXPECT` names rc.
fn rc_expected() -> bool {
    match std::env::var("UCT_TEST_EXPECT") {
        Ok(names) => names.split(',').any(|n| n.trim() == "rc"),
        Err(_) => std::env::var_os("RXE_VM_DEVICE").is_some(),
    }
}

fn transport(dev: &str, progress: Progress, mem: MemoryType) -> Result<Transport, Failed> {
    Ok(Transport::builder()
        .transport("rc")
        .device(dev)
        .memory_types(&[mem])
        .progress(progress)
        .build()?)
}

/// Two Transports over rc on `dev`, bound and connected to each other.
fn pair(dev: &str, progress: Progress, mem: MemoryType) -> Result<(Transport, Transport), Failed> {
    let a = transport(dev, progress, mem)?;
    let b = transport(dev, progress, mem)?;
    let (ua, ub) = (a.bind()?, b.bind()?);
    a.connect(&ub)?;
    b.connect(&ua)?;
    check(a.connected() && b.connected(), || "not connected".into())?;
    check(a.transport_name().as_deref() == Some("rc"), || {
        format!("connected over {:?}, not rc", a.transport_name())
    })?;
    Ok((a, b))
}

/// (by immediate, by message) of the notifications a Transport sent.
fn sent(s: Stats) -> (u64, u64) {
    (
        s.notifications_sent_by_immediate,
        s.notifications_sent_by_message,
    )
}

/// (by immediate, by message) of the notifications a Transport received.
fn received(s: Stats) -> (u64, u64) {
    (
        s.notifications_received_by_immediate,
        s.notifications_received_by_message,
    )
}

/// The seed's ping-pong: a notified write each way, each one WRITE WITH
/// IMMEDIATE, then a read back.
fn ping_pong(dev: &str, progress: Progress) -> Result<(), Failed> {
    let (server, client) = pair(dev, progress, MemoryType::Host)?;
    let drive = if progress == Progress::Manual {
        vec![&server, &client]
    } else {
        vec![]
    };
    let len = 8192;
    let smem = Memory::alloc(&server, MemoryType::Host, len)?;
    let cmem = Memory::alloc(&client, MemoryType::Host, len)?;
    let s_remote = RemoteBuffer::parse(&smem.remote_key())?;
    let c_remote = RemoteBuffer::parse(&cmem.remote_key())?;
    smem.write_bytes(0, &vec![0xab; len])?;
    // ping: server -> client
    let w = server.write_tagged(&smem.whole(), &c_remote, 41);
    let n = within("the client's wait", &drive, client.wait_for_write())?;
    within("the server's write", &drive, w)?;
    check((n.len, n.tag) == (len, 41), || {
        format!("the ping came as {n:?}")
    })?;
    let mut got = vec![0; len];
    cmem.read_bytes(0, &mut got)?;
    check(got.iter().all(|&b| b == 0xab), || "ping data".into())?;
    // pong: client -> server
    cmem.write_bytes(0, &vec![0xcd; len])?;
    let w = client.write_tagged(&cmem.whole(), &s_remote, 42);
    let n = within("the server's wait", &drive, server.wait_for_write())?;
    within("the client's write", &drive, w)?;
    check((n.len, n.tag) == (len, 42), || {
        format!("the pong came as {n:?}")
    })?;
    smem.read_bytes(0, &mut got)?;
    check(got.iter().all(|&b| b == 0xcd), || "pong data".into())?;
    // read back (an RDMA READ)
    let r = client.read(&cmem.view(0, 100)?, &s_remote.slice(0, 100)?);
    within("the client's read", &drive, r)?;
    cmem.read_bytes(0, &mut got[..100])?;
    check(got[..100].iter().all(|&b| b == 0xcd), || "read data".into())?;
    for (who, t) in [("server", &server), ("client", &client)] {
        let s = t.stats();
        check(sent(s) == (1, 0) && received(s) == (1, 0), || {
            format!("{who}: each notification must be one WRITE WITH IMMEDIATE: {s:?}")
        })?;
    }
    check(client.stats().reads == 1, || {
        format!("client: {:?}", client.stats())
    })
}

/// 10,000 notified writes of 1 to 64 bytes into their own slots: as each
/// notification arrives, in order, the last byte of its write is there;
/// each notification is one WRITE WITH IMMEDIATE.
fn ordering(dev: &str) -> Result<(), Failed> {
    const N: usize = 10_000;
    const SLOT: usize = 64;
    let (a, b) = pair(dev, Progress::Thread, MemoryType::Host)?;
    let src = Memory::alloc(&a, MemoryType::Host, N * SLOT)?;
    let dst = Memory::alloc(&b, MemoryType::Host, N * SLOT)?;
    for i in 0..N {
        src.write_bytes(i * SLOT, &[fill_of(i); SLOT])?;
    }
    let remote = RemoteBuffer::parse(&dst.remote_key())?;
    let writer = std::thread::spawn(move || -> Result<Transport, String> {
        let mut futs = Vec::with_capacity(N);
        for i in 0..N {
            let len = len_of(i, SLOT);
            let view = src.view(i * SLOT, len).map_err(|e| e.to_string())?;
            let to = remote.slice(i * SLOT, len).map_err(|e| e.to_string())?;
            futs.push(a.write_tagged(&view, &to, i as u32));
        }
        for (i, f) in futs.into_iter().enumerate() {
            within("a write", &[], f).map_err(|e| format!("write {i}: {e}"))?;
        }
        Ok(a)
    });
    let mut last = [0u8; 1];
    for i in 0..N {
        let n = within("a notification", &[], b.wait_for_write())?;
        check((n.tag, n.len) == (i as u32, len_of(i, SLOT)), || {
            format!("notification {i} was {n:?}")
        })?;
        dst.read_bytes(i * SLOT + n.len - 1, &mut last)?;
        check(last[0] == fill_of(i), || {
            format!("write {i} was stale when its notification came")
        })?;
    }
    let a = writer.join().map_err(|_| "the writer panicked")??;
    let (sa, sb) = (a.stats(), b.stats());
    check(sent(sa) == (N as u64, 0), || {
        format!("the writer must send {N} immediates and no message: {sa:?}")
    })?;
    check(received(sb) == (N as u64, 0), || {
        format!("the receiver must get {N} immediates and no message: {sb:?}")
    })?;
    check(sa.writes == N as u64, || format!("{sa:?}"))
}

/// Checks that `r` is md-ib's DMA-buf refusal for Gaudi memory.
fn is_dmabuf_refusal<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, TransferError>,
) -> Result<(), Failed> {
    let text = match r {
        Err(TransferError::MemoryType(text)) => text,
        other => {
            return Err(format!("{what}: expected TransferError::MemoryType, got {other:?}").into())
        }
    };
    check(
        text.contains("cannot import DMA-buf")
            && text.contains("gaudi")
            && DMABUF_NICS.iter().all(|n| text.contains(n)),
        || format!("{what}: not the DMA-buf refusal naming the NICs that can: {text}"),
    )?;
    eprintln!("rc: {what}: {text}");
    Ok(())
}

/// Gaudi memory on rxe: refused at registration with the DMA-buf line,
/// whether the Transport allocates it or is handed md-gaudi's allocation,
/// before connect and after.
fn gaudi_refused(dev: &str) -> Result<(), Failed> {
    let t = transport(dev, Progress::Thread, MemoryType::Gaudi)?;
    is_dmabuf_refusal(
        "Memory::alloc before connect",
        Memory::alloc(&t, MemoryType::Gaudi, 1 << 20),
    )?;
    // The simulator's Gaudi memory (TEST DOUBLE), as md-gaudi allocates it.
    let registry = uct_core::Registry::global();
    let gaudi = registry
        .memory_domains()
        .into_iter()
        .map(|(_, md)| md)
        .find(|md| md.attrs().alloc_mem_types.contains(&MemoryType::Gaudi))
        .ok_or_else(|| {
            format!(
                "no memory domain allocates gaudi memory (UCT_GAUDI_HLTHUNK_LIB={:?}): {:?}",
                std::env::var("UCT_GAUDI_HLTHUNK_LIB"),
                registry.md_errors()
            )
        })?;
    let hbm = gaudi.alloc(1 << 20, MemoryType::Gaudi, Access::all())?;
    is_dmabuf_refusal(
        "Memory::register_handle of md-gaudi's memory",
        Memory::register_handle(&t, &hbm, Access::all()),
    )?;
    drop(t);
    let (a, b) = pair(dev, Progress::Thread, MemoryType::Gaudi)?;
    is_dmabuf_refusal(
        "Memory::alloc after connect",
        Memory::alloc(&a, MemoryType::Gaudi, 1 << 20),
    )?;
    is_dmabuf_refusal(
        "Memory::register_handle after connect",
        Memory::register_handle(&b, &hbm, Access::all()),
    )
}

/// transfer/examples/ping_pong, built beside this test binary.
fn example() -> Result<PathBuf, Failed> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples/ping_pong"))
        .ok_or("no folder above this test binary")?;
    check(path.exists(), || {
        format!(
            "{} is not built; build it with `cargo build -p uct-transfer --examples` (scripts/test builds every target)",
            path.display()
        )
    })?;
    Ok(path)
}

/// A child process, killed and reaped when dropped unless taken.
struct Reaped(Option<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn example_cmd(args: &[&str]) -> Result<Command, Failed> {
    let mut c = Command::new(example()?);
    c.args(args).stdin(Stdio::null());
    if std::env::var_os("UCT_MODULE_DIR").is_none() {
        // The example looks for libuct_ib.so beside itself; cargo builds it
        // beside this test binary.
        let exe = std::env::current_exe()?;
        if let Some(deps) = exe.parent() {
            c.env("UCT_MODULE_DIR", deps);
        }
    }
    Ok(c)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits for `child` to exit within `limit` and takes its output; kills it
/// past the limit.
fn output_within(mut child: Reaped, limit: Duration) -> Result<Output, Failed> {
    let start = Instant::now();
    let c = child.0.as_mut().ok_or("no child")?;
    while c.try_wait()?.is_none() {
        if start.elapsed() > limit {
            return Err(format!("it still ran after {limit:?}; killed").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Exited: its pipes end, so reading what is left in them is quick.
    let c = child.0.take().ok_or("no child")?;
    Ok(c.wait_with_output()?)
}

fn free_port() -> Result<String, Failed> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port()
        .to_string())
}

/// The example's ping-pong over rc in two processes: the server prints its
/// URL, the client connects, every byte is checked each round.
fn example_ping_pong() -> Result<(), Failed> {
    const LIMIT: Duration = Duration::from_secs(120);
    let port = free_port()?;
    let common = ["-p", port.as_str(), "-t", "rc", "-s", "65536", "-n", "20"];
    let mut server = example_cmd(&["--listen"])?;
    server
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut server = Reaped(Some(server.spawn()?));
    let stdout = server
        .0
        .as_mut()
        .and_then(|c| c.stdout.take())
        .ok_or("no server stdout")?;
    let (tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let _ = tx.send(line.clone());
            all.push(line);
        }
        all
    });
    let listening = lines
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| "the server printed nothing within 60 s")?;
    check(
        listening.starts_with("server: listening on port") && listening.contains("URL "),
        || format!("the server's first line: {listening}"),
    )?;
    let mut client = example_cmd(&["127.0.0.1"])?;
    client
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let client = output_within(Reaped(Some(client.spawn()?)), LIMIT)?;
    let server = output_within(server, LIMIT)?;
    let sout = reader.join().map_err(|_| "the reader panicked")?.join("\n");
    let (cout, cerr, serr) = (
        text(&client.stdout),
        text(&client.stderr),
        text(&server.stderr),
    );
    check(client.status.success() && server.status.success(), || {
        format!(
            "client {}:\n{cout}{cerr}\nserver {}:\n{sout}\n{serr}",
            client.status, server.status
        )
    })?;
    for (who, out) in [("client", &cout), ("server", &sout)] {
        check(
            out.contains(&format!(
                "{who}: connected over rc, 65536 bytes of host memory"
            )),
            || format!("{who} did not connect over rc:\n{out}"),
        )?;
        check(
            out.contains("20 rounds of 65536 bytes") && out.contains("every byte checked"),
            || format!("{who} did not check its rounds:\n{out}"),
        )?;
    }
    eprintln!("rc: ping_pong example: {}", cout.trim().replace('\n', "; "));
    Ok(())
}

/// The example with `-m gaudi` over rc fails at registration, exit 1, with
/// the DMA-buf line, before it listens.
fn example_gaudi_refused() -> Result<(), Failed> {
    let port = free_port()?;
    let mut server = example_cmd(&["--listen", "-p", &port, "-t", "rc", "-m", "gaudi"])?;
    server.stdout(Stdio::piped()).stderr(Stdio::piped());
    let o = output_within(Reaped(Some(server.spawn()?)), Duration::from_secs(60))?;
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    check(o.status.code() == Some(1), || {
        format!("exit 1, got {}:\n{out}{err}", o.status)
    })?;
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    check(lines.len() == 1, || format!("one message, got:\n{err}"))?;
    check(
        lines[0].contains("cannot import DMA-buf")
            && DMABUF_NICS.iter().all(|n| lines[0].contains(n)),
        || format!("the DMA-buf message naming the NICs that can: {err}"),
    )?;
    check(!out.contains("listening"), || {
        format!("it listened before refusing: {out}")
    })
}

type TestFn = Box<dyn FnOnce() -> Result<(), Failed> + Send>;

fn main() {
    // Before the registry reads the environment: Gaudi memory from the
    // hl-thunk simulator (TEST DOUBLE), in this process and the example's.
    if let Some(sim) = hlthunk_sim::library_path() {
        std::env::set_var("UCT_GAUDI_HLTHUNK_LIB", sim);
    }
    let mut args = Arguments::from_args();
    // One at a time: the VM has two CPUs, and every test runs two
    // Transports with a progress thread each (the example two processes).
    args.test_threads = Some(1);
    let device = rc_device();
    if let Ok(dev) = &device {
        println!("rc: running on device {dev}");
    }
    let with = |f: fn(&str) -> Result<(), Failed>| -> TestFn {
        let dev = device.clone().unwrap_or_default();
        Box::new(move || f(&dev))
    };
    let tests: Vec<(&str, TestFn)> = vec![
        ("rc::ping_pong", with(|d| ping_pong(d, Progress::Thread))),
        (
            "rc::ping_pong_manual_progress",
            with(|d| ping_pong(d, Progress::Manual)),
        ),
        (
            "rc::ten_thousand_notified_writes_never_stale",
            with(ordering),
        ),
        (
            "rc::gaudi_memory_refused_at_registration_with_the_dmabuf_line",
            with(gaudi_refused),
        ),
        (
            "rc::ping_pong_example_in_two_processes",
            Box::new(example_ping_pong),
        ),
        (
            "rc::ping_pong_example_gaudi_fails_at_registration",
            Box::new(example_gaudi_refused),
        ),
    ];
    let expected = rc_expected();
    let trials = tests
        .into_iter()
        .map(|(name, f)| match &device {
            Ok(_) => Trial::test(name, f),
            Err(why) if expected => {
                println!("rc: FAILED {name}: this run expects rc, and it is absent ({why})");
                let why = why.clone();
                Trial::test(name, move || {
                    Err(format!("this run expects rc, and it is absent: {why}").into())
                })
            }
            Err(why) => {
                println!("rc: SKIPPED {name}: rc is not available here ({why})");
                let why = why.clone();
                Trial::ignorable_test(name, move || {
                    Ok(Completion::ignored_with(format!(
                        "rc is not available here: {why}"
                    )))
                })
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
