//! Rails over tcp: two connections (two rails) per Transport, in one
//! process and in two. 4 MiB writes striped over both, validated byte by
//! byte, with the bytes counted on each rail; a rail killed in the middle
//! of a run (its sockets shut down from outside the transport, as a reset
//! link does) -> every write still lands, validated, with one warning that
//! names the rail; restore_rail brings it back; bad keys, URLs and
//! settings refused by name.
//!
//! The rails are `lo` twice (every host has it): two connections over one
//! link, which fail alone. Run with RAILS_TEST_CHILD set, this binary is the
//! receiving peer of the two-process tests.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use uct_transfer::{Memory, MemoryType, RemoteBuffer, TransferError, Transport};

/// The size of each write.
const SIZE: usize = 4 << 20;
/// Writes per run.
const WRITES: usize = 12;
/// The bound on every wait.
const LIMIT: Duration = Duration::from_secs(120);

/// Warnings logged in this process, kept for the tests that count them.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = r.args().to_string();
            eprintln!("[{}] {line}", r.level());
            WARNINGS.lock().unwrap().push(line);
        }
    }
    fn flush(&self) {}
}

fn rail_warnings(rail: usize) -> Vec<String> {
    let needle = format!("rail {rail} (");
    WARNINGS
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.contains(&needle) && w.contains("out of service"))
        .cloned()
        .collect()
}

/// A Transport of two tcp rails on `lo`.
fn two_rails() -> Transport {
    Transport::builder()
        .transport("tcp")
        .devices(&["lo", "lo"])
        .build()
        .expect("two tcp rails on lo")
}

fn connect(a: &Transport, b: &Transport) {
    let (ua, ub) = (a.bind().unwrap(), b.bind().unwrap());
    a.connect(&ub).unwrap();
    b.connect(&ua).unwrap();
}

/// The byte at `at` of write `i`: changes every 64 bytes and per write, so
/// that a stripe landing in the wrong place or a stale one shows.
fn byte_of(i: usize, at: usize) -> u8 {
    ((at / 64) as u8).wrapping_mul(7) ^ (i as u8).wrapping_mul(31) ^ 0x5a
}

fn fill(src: &Memory, i: usize) -> Result<(), Failed> {
    let data: Vec<u8> = (0..SIZE).map(|at| byte_of(i, at)).collect();
    src.write_bytes(i * SIZE, &data)?;
    Ok(())
}

fn validate(dst: &Memory, i: usize) -> Result<(), String> {
    let mut got = vec![0u8; SIZE];
    dst.read_bytes(i * SIZE, &mut got)
        .map_err(|e| e.to_string())?;
    match (0..SIZE).find(|&at| got[at] != byte_of(i, at)) {
        None => Ok(()),
        Some(at) => Err(format!(
            "write {i}: byte {at} is {:#x}, not {:#x}",
            got[at],
            byte_of(i, at)
        )),
    }
}

/// The listening port of every tcp offer of `url`, in rail order.
fn ports(url: &str) -> Vec<u16> {
    let body = url.split('#').next().unwrap_or_default();
    body.split('/')
        .filter(|o| o.starts_with("tcp:"))
        .filter_map(|o| {
            let hex = o.split(':').nth(3)?;
            let b = |i: usize| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok();
            Some(u16::from_le_bytes([b(1)?, b(2)?]))
        })
        .collect()
}

/// The port of a socket address that getsockname/getpeername filled.
fn port_of(fd: i32, peer: bool) -> Option<u16> {
    // SAFETY: a zeroed sockaddr_storage is a valid out-buffer.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut _ as *mut libc::sockaddr;
    // SAFETY: `p` and `len` describe `ss`, which outlives the call.
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if rc != 0 || ss.ss_family as i32 != libc::AF_INET {
        return None;
    }
    // SAFETY: the family is AF_INET, so `ss` holds a sockaddr_in.
    let sin = unsafe { &*(p as *const libc::sockaddr_in) };
    Some(u16::from_be(sin.sin_port))
}

/// The test hook: shuts down every connected socket of this process whose
/// own or peer port is one of `listen` (the ifaces of one rail), as a
/// reset link would. Returns how many.
fn kill_rail(listen: &[u16]) -> usize {
    let mut killed = 0;
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(remote) = port_of(fd, true) else {
            continue;
        };
        let local = port_of(fd, false).unwrap_or(0);
        if listen.contains(&remote) || listen.contains(&local) {
            // SAFETY: shutdown on a socket fd of this process; the
            // transport owning it sees a reset connection.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            killed += 1;
        }
    }
    killed
}

fn block<F: std::future::Future>(t: &Transport, what: &str, f: F) -> Result<F::Output, Failed> {
    t.wait_within(f, LIMIT)
        .map_err(|e| Failed::from(format!("{what}: {e}")))
}

/// Writes WRITES x 4 MiB from `writer` to `remote` (tagged i, four in
/// flight), calling `midway` once half are posted.
fn write_run(
    writer: &Transport,
    src: &Memory,
    remote: &RemoteBuffer,
    mut midway: impl FnMut(),
) -> Result<(), Failed> {
    let mut flying = std::collections::VecDeque::new();
    for i in 0..WRITES {
        if i == WRITES / 2 {
            midway();
        }
        let view = src.view(i * SIZE, SIZE)?;
        let to = remote.slice(i * SIZE, SIZE)?;
        flying.push_back((i, writer.write_tagged(&view, &to, i as u32)));
        if flying.len() >= 4 {
            let (i, f) = flying.pop_front().unwrap();
            block(writer, &format!("write {i}"), f)??;
        }
    }
    for (i, f) in flying {
        block(writer, &format!("write {i}"), f)??;
    }
    Ok(())
}

/// Waits for the WRITES notifications in order and validates each write.
fn receive_run(receiver: &Transport, dst: &Memory) -> Result<(), String> {
    for i in 0..WRITES {
        let n = receiver
            .wait_within(receiver.wait_for_write(), LIMIT)
            .map_err(|e| format!("notification {i}: {e}"))?
            .map_err(|e| format!("notification {i}: {e}"))?;
        if (n.tag, n.len) != (i as u32, SIZE) {
            return Err(format!(
                "notification {i} is tag {} of {} bytes, not tag {i} of {SIZE}",
                n.tag, n.len
            ));
        }
        validate(dst, i)?;
    }
    Ok(())
}

fn one_process(kill: bool) -> Result<(), Failed> {
    let (writer, receiver) = (two_rails(), two_rails());
    connect(&writer, &receiver);
    let src = Memory::alloc(&writer, MemoryType::Host, WRITES * SIZE)?;
    let dst = Memory::alloc(&receiver, MemoryType::Host, WRITES * SIZE)?;
    for i in 0..WRITES {
        fill(&src, i)?;
    }
    let remote = RemoteBuffer::parse(&dst.remote_key())?;
    assert_eq!(remote.rails(), 2);
    let listen1 = [ports(&writer.bind()?)[1], ports(&receiver.bind()?)[1]];
    let before = rail_warnings(1).len();
    let recv = std::thread::scope(|s| {
        let got = s.spawn(|| receive_run(&receiver, &dst));
        let wrote = write_run(&writer, &src, &remote, || {
            if kill {
                let n = kill_rail(&listen1);
                eprintln!("rails: shut down {n} sockets of rail 1");
            }
        });
        (wrote, got.join())
    });
    recv.0?;
    recv.1.map_err(|_| "the receiver panicked")??;
    let rails = writer.rails();
    eprintln!("rails: {rails:?}");
    let total: u64 = rails.iter().map(|r| r.bytes_written).sum();
    if total != (WRITES * SIZE) as u64 {
        return Err(format!("the rails carried {total} bytes, not {}", WRITES * SIZE).into());
    }
    if !kill {
        for r in &rails {
            if r.bytes_written == 0 || !r.in_service {
                return Err(format!("rail {} carried nothing: {r:?}", r.rail).into());
            }
        }
        return Ok(());
    }
    let r1 = &rails[1];
    if r1.in_service || r1.failure.is_none() {
        return Err(
            format!("rail 1 is still in service after its sockets were shut: {r1:?}").into(),
        );
    }
    // One warning per Transport that lost the rail: the writer's, and the
    // receiver's if it noticed already.
    let warned = rail_warnings(1).len() - before;
    if !(1..=2).contains(&warned) {
        return Err(format!("{warned} warnings name rail 1, not one per side").into());
    }
    // Re-added by an explicit call only; then it carries again.
    writer.restore_rail(1)?;
    let carried = writer.rails()[1].bytes_written;
    let view = src.view(0, SIZE)?;
    let to = remote.slice(0, SIZE)?;
    block(
        &writer,
        "a write after restore_rail",
        writer.write(&view, &to, false),
    )??;
    let after = &writer.rails()[1];
    if !after.in_service || after.bytes_written <= carried {
        return Err(format!("rail 1 does not carry after restore_rail(1): {after:?}").into());
    }
    validate(&dst, 0)?;
    Ok(())
}

/// The receiving peer: prints its URL and key, reads the writer's URL,
/// receives and validates WRITES writes, says how it went.
fn child() -> Result<(), String> {
    let t = two_rails();
    let dst = Memory::alloc(&t, MemoryType::Host, WRITES * SIZE).map_err(|e| e.to_string())?;
    println!("url: {}", t.bind().map_err(|e| e.to_string())?);
    println!("key: {}", dst.remote_key());
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let url = line.trim().strip_prefix("url: ").ok_or("no url line")?;
    t.connect(url).map_err(|e| e.to_string())?;
    receive_run(&t, &dst)?;
    println!("ok: {WRITES} writes validated");
    // Until the writer is done with us.
    let _ = std::io::stdin().read_line(&mut line);
    Ok(())
}

fn two_process(kill: bool) -> Result<(), Failed> {
    let mut peer = Command::new(std::env::current_exe()?)
        .env("RAILS_TEST_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = peer.stdin.take().ok_or("no stdin")?;
    let mut lines = BufReader::new(peer.stdout.take().ok_or("no stdout")?).lines();
    let mut expect = |prefix: &str| -> Result<String, Failed> {
        let l = lines.next().ok_or("the peer ended")??;
        l.strip_prefix(prefix)
            .map(str::to_string)
            .ok_or_else(|| format!("the peer said {l:?}, not {prefix}...").into())
    };
    let url = expect("url: ")?;
    let key = expect("key: ")?;
    let writer = two_rails();
    writeln!(stdin, "url: {}", writer.bind()?)?;
    writer.connect(&url)?;
    let src = Memory::alloc(&writer, MemoryType::Host, WRITES * SIZE)?;
    for i in 0..WRITES {
        fill(&src, i)?;
    }
    let remote = RemoteBuffer::parse(&key)?;
    let listen1 = [ports(&writer.bind()?)[1], ports(&url)[1]];
    let before = rail_warnings(1).len();
    write_run(&writer, &src, &remote, || {
        if kill {
            let n = kill_rail(&listen1);
            eprintln!("rails: shut down {n} sockets of rail 1");
        }
    })?;
    let verdict = expect("ok: ");
    // Counted before the peer goes (which takes every rail with it).
    let rails = writer.rails();
    let warned = rail_warnings(1);
    let _ = writeln!(stdin, "done");
    let _ = peer.wait();
    verdict?;
    eprintln!("rails: {rails:?}");
    if kill {
        let warned = &warned[before..];
        if warned.len() != 1 || !warned[0].contains("lo") {
            return Err(format!("warnings naming rail 1: {warned:?}, not one").into());
        }
        if rails[1].in_service {
            return Err("rail 1 in service after its sockets were shut".into());
        }
    } else if rails.iter().any(|r| r.bytes_written == 0) {
        return Err(format!("a rail carried nothing: {rails:?}").into());
    }
    Ok(())
}

fn bad_keys_urls_and_settings() -> Result<(), Failed> {
    let refused = |r: Result<Transport, TransferError>, what: &str, words: &[&str]| match r {
        Ok(_) => Err(Failed::from(format!("{what}: built"))),
        Err(e) => {
            let m = e.to_string();
            match words.iter().find(|w| !m.contains(*w)) {
                Some(w) => Err(format!("{what}: {m:?} does not say {w:?}").into()),
                None => Ok(()),
            }
        }
    };
    for tl in ["posix", "self"] {
        refused(
            Transport::builder().transport(tl).rails(2).build(),
            &format!("rails(2) on {tl}"),
            &["2 rails", tl, "devices"],
        )?;
    }
    refused(
        Transport::builder().rails(2).build(),
        "rails(2) of auto",
        &["auto", "name it"],
    )?;
    refused(
        Transport::builder().transport("tcp").rails(0).build(),
        "rails(0)",
        &["0 rails"],
    )?;
    refused(
        Transport::builder()
            .transport("tcp")
            .rails(3)
            .devices(&["lo", "lo"])
            .build(),
        "rails(3) with two devices",
        &["rails(3)", "2 devices"],
    )?;
    refused(
        Transport::builder()
            .transport("tcp")
            .devices(&["lo", "nosuchdev0"])
            .build(),
        "a device that does not exist",
        &["nosuchdev0"],
    )?;
    // A one-rail side and a two-rail side: refused by name, both ways.
    let (one, two) = (
        Transport::builder().transport("tcp").device("lo").build()?,
        two_rails(),
    );
    let (u1, u2) = (one.bind()?, two.bind()?);
    for (t, url, what) in [
        (&one, &u2, "one rail to two"),
        (&two, &u1, "two rails to one"),
    ] {
        let m = t
            .connect(url)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string());
        if !m.contains("rail") {
            return Err(format!("{what}: connect said {m:?}").into());
        }
    }
    // A key of another rail count: the write is refused by name.
    let (a, b) = (two_rails(), two_rails());
    connect(&a, &b);
    let src = Memory::alloc(&a, MemoryType::Host, 4096)?;
    let single = Memory::alloc(&one, MemoryType::Host, 4096)?;
    let r = RemoteBuffer::parse(&single.remote_key())?;
    match block(
        &a,
        "a write to a one-rail key",
        a.write(&src.whole(), &r, false),
    )? {
        Err(TransferError::BadKey { why }) if why.contains("1 rail(s)") => {}
        other => return Err(format!("a one-rail key on two rails: {other:?}").into()),
    }
    // An old (version 1) key is named as such.
    let key = single.remote_key();
    let body = key
        .split('#')
        .next()
        .unwrap_or_default()
        .replacen(":v2:", ":v1:", 1);
    let v1 = with_check(&body);
    match RemoteBuffer::parse(&v1) {
        Err(TransferError::BadKey { why }) if why.contains("version 1") => {}
        other => return Err(format!("a version 1 key: {other:?}").into()),
    }
    // A rail's bundle cut short: named with its rail.
    let two_key = Memory::alloc(&b, MemoryType::Host, 4096)?.remote_key();
    let body = two_key.split('#').next().unwrap_or_default();
    let cut = with_check(&body[..body.len() - 2]);
    match RemoteBuffer::parse(&cut) {
        Err(TransferError::BadKey { why }) if why.contains("rail 1") => {}
        other => return Err(format!("a cut rail bundle: {other:?}").into()),
    }
    // restore_rail of a rail in service, and of one that does not exist.
    for (i, words) in [(0, "in service"), (5, "no rail 5")] {
        let m = a
            .restore_rail(i)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string());
        if !m.contains(words) {
            return Err(format!("restore_rail({i}): {m:?}").into());
        }
    }
    Ok(())
}

/// The check strings carry (FNV-1a 64), to forge keys with a valid one.
fn with_check(body: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{body}#{h:016x}")
}

/// Small and large writes mixed: notifications in order, each write whole.
fn mixed_sizes_in_order() -> Result<(), Failed> {
    let build = || {
        Transport::builder()
            .transport("tcp")
            .devices(&["lo", "lo"])
            .stripe_min(64 * 1024)
            .build()
    };
    let (a, b) = (build()?, build()?);
    connect(&a, &b);
    let len = |i: usize| {
        if i.is_multiple_of(2) {
            1000 + i
        } else {
            (1 << 20) + 64 * i + 3
        }
    };
    let n = 16;
    let src = Memory::alloc(&a, MemoryType::Host, n << 21)?;
    let dst = Memory::alloc(&b, MemoryType::Host, n << 21)?;
    let remote = RemoteBuffer::parse(&dst.remote_key())?;
    let mut futs = Vec::new();
    for i in 0..n {
        let data: Vec<u8> = (0..len(i)).map(|at| byte_of(i, at)).collect();
        src.write_bytes(i << 21, &data)?;
        let v = src.view(i << 21, len(i))?;
        futs.push(a.write_tagged(&v, &remote.slice(i << 21, len(i))?, i as u32));
    }
    for i in 0..n {
        let note = block(&b, "a notification", b.wait_for_write())??;
        if (note.tag, note.len) != (i as u32, len(i)) {
            return Err(format!("notification {i}: {note:?}").into());
        }
        let mut got = vec![0u8; len(i)];
        dst.read_bytes(i << 21, &mut got)?;
        if (0..len(i)).any(|at| got[at] != byte_of(i, at)) {
            return Err(format!("write {i} notified before all its bytes landed").into());
        }
    }
    for f in futs {
        block(&a, "a write", f)??;
    }
    let rails = a.rails();
    if rails.iter().any(|r| r.writes == 0) {
        return Err(format!("a rail carried nothing: {rails:?}").into());
    }
    // A read striped back.
    let back = Memory::alloc(&a, MemoryType::Host, 2 << 20)?;
    block(
        &a,
        "a read",
        a.read(&back.view(0, len(1))?, &remote.slice(1 << 21, len(1))?),
    )??;
    let mut got = vec![0u8; len(1)];
    back.read_bytes(0, &mut got)?;
    if (0..len(1)).any(|at| got[at] != byte_of(1, at)) {
        return Err("a striped read brought wrong bytes".into());
    }
    Ok(())
}

/// Why rails(2) on the devices tcp lists cannot run here, if it cannot.
fn listed_short() -> Option<String> {
    let devices: Vec<String> = Transport::probe()
        .into_iter()
        .filter(|p| p.transport == "tcp" && p.usable)
        .filter_map(|p| p.device)
        .collect();
    (devices.len() < 2).then(|| {
        format!(
            "tcp has {} device(s) here ({}); rails(2) needs two",
            devices.len(),
            devices.join(", ")
        )
    })
}

/// rails(2) with the devices tcp lists here.
fn default_devices() -> Result<(), Failed> {
    let build = || Transport::builder().transport("tcp").rails(2).build();
    let (a, b) = (build()?, build()?);
    connect(&a, &b);
    let src = Memory::alloc(&a, MemoryType::Host, SIZE)?;
    let dst = Memory::alloc(&b, MemoryType::Host, SIZE)?;
    fill_one(&src)?;
    let remote = RemoteBuffer::parse(&dst.remote_key())?;
    block(&a, "a write", a.write(&src.whole(), &remote, false))??;
    validate(&dst, 0)?;
    let rails = a.rails();
    if rails.iter().any(|r| r.bytes_written == 0) || rails[0].device == rails[1].device {
        return Err(format!("rails(2): {rails:?}").into());
    }
    Ok(())
}

fn fill_one(src: &Memory) -> Result<(), Failed> {
    let data: Vec<u8> = (0..SIZE).map(|at| byte_of(0, at)).collect();
    src.write_bytes(0, &data)?;
    Ok(())
}

fn main() {
    let _ = log::set_logger(&Capture);
    log::set_max_level(log::LevelFilter::Warn);
    if std::env::var("RAILS_TEST_CHILD").is_ok() {
        if let Err(e) = child() {
            println!("bad: {e}");
            std::process::exit(1);
        }
        return;
    }
    let mut args = Arguments::from_args();
    // One at a time: the warnings are counted per process, and 2 cores.
    args.test_threads = Some(1);
    let start = Instant::now();
    let mut trials = vec![
        Trial::test("tcp::one_process_two_rails", || one_process(false)),
        Trial::test("tcp::one_process_rail_killed_then_restored", || {
            one_process(true)
        }),
        Trial::test("tcp::two_process_two_rails", || two_process(false)),
        Trial::test("tcp::two_process_rail_killed", || two_process(true)),
        Trial::test("tcp::mixed_sizes_in_order", mixed_sizes_in_order),
        Trial::test(
            "tcp::bad_keys_urls_and_settings",
            bad_keys_urls_and_settings,
        ),
    ];
    let name = "tcp::rails_on_the_listed_devices";
    trials.push(match listed_short() {
        None => Trial::test(name, default_devices),
        Some(why) => {
            println!("rails: SKIPPED {name}: {why}");
            Trial::ignorable_test(name, move || Ok(Completion::ignored_with(why.clone())))
        }
    });
    let c = libtest_mimic::run(&args, trials);
    eprintln!("rails: {:?}", start.elapsed());
    c.exit();
}
