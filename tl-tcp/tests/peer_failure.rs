//! Peer failure over tcp: a peer process killed in the middle of a stream
//! of puts, and a peer that accepts but never answers. Pending operations
//! must fail with an error within UCT_TCP_PEER_TIMEOUT; other endpoints
//! keep working; nothing hangs.
//!
//! The killed peer is this test binary started again with
//! `UCT_TCP_TEST_ROLE=server`: it opens a tcp iface on lo, prints its
//! addresses and an rkey on stdout, and serves until killed.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{loopback_ip, open as open_lo, own_rkey, serve_region, to_iface, unhex, Peer};
use libtest_mimic::{Arguments, Failed, Trial};
use uct_core::{Access, Completion, EpParams, Iface, Iov, MemoryType, Registry, Status, UctError};

const TIMEOUT_MS: u64 = 1500;

/// The child: serve puts until killed.
fn serve() -> ! {
    let mut iface = open_lo();
    let _mem = serve_region(iface.as_ref(), 1 << 20);
    loop {
        iface.progress();
    }
}

/// Progresses until `comp` completes or `limit` passes; returns how long
/// it took and the result.
fn wait(
    iface: &mut dyn Iface,
    comp: &Completion,
    limit: Duration,
) -> (Duration, Option<Result<(), UctError>>) {
    let t0 = Instant::now();
    while !comp.is_complete() {
        iface.progress();
        if t0.elapsed() > limit {
            return (t0.elapsed(), None);
        }
    }
    (t0.elapsed(), Some(comp.result()))
}

/// What tcp reports for a dead peer: EndpointFailed (a reset, or a closed
/// link), Canceled (operations pending on a connection that closed), Io
/// (a socket error) or Timeout (UCT_TCP_PEER_TIMEOUT).
fn peer_error(what: &str, e: &UctError) -> Result<(), String> {
    if matches!(
        e,
        UctError::EndpointFailed(_)
            | UctError::Canceled(_)
            | UctError::Io { .. }
            | UctError::Timeout(_)
    ) {
        Ok(())
    } else {
        Err(format!("{what} failed with {e:?}, not a peer error"))
    }
}

fn killed_peer() -> Result<(), Failed> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(common::ROLE, "server")
        .env("UCT_TCP_PEER_TIMEOUT", format!("{TIMEOUT_MS}ms"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 5 || f[0] != "READY" {
        let _ = child.kill();
        return Err(format!("child said: {line:?}").into());
    }
    let reg = Registry::global();
    let mut tx = open_lo();
    let rkey = reg.unpack_rkey(&unhex(f[3]), "tcp")?;
    let base = u64::from_str_radix(f[4], 16)?;
    let mut ep = tx.create_ep(EpParams::ToIface {
        device_addr: unhex(f[1]),
        iface_addr: unhex(f[2]),
    })?;
    let local = tx.md().alloc(64 << 10, MemoryType::Host, Access::all())?;

    // A healthy stream first: every put completes, without an error.
    let comp = Completion::new();
    for i in 0..64u64 {
        let iov = [Iov::whole(&local)];
        while ep.put_zcopy(&iov, base + (i % 16) * (64 << 10), &rkey, Some(&comp))?
            == Status::NoResource
        {
            tx.progress();
        }
    }
    let flush = Completion::new();
    let _ = ep.flush(Some(&flush))?;
    let (_, r) = wait(tx.as_mut(), &flush, Duration::from_secs(20));
    r.ok_or("flush to the live peer did not complete")??;
    if !comp.is_complete() {
        return Err("puts to the live peer still pending after the flush".into());
    }
    comp.result()
        .map_err(|e| format!("a put to the live peer failed: {e}"))?;

    // Kill it in the middle of the next stream, with puts still queued
    // (posted until the send queue is full, without progress); each put
    // has its own completion.
    let mut comps = Vec::new();
    for i in 0..1000u64 {
        let iov = [Iov::whole(&local)];
        let comp = Completion::new();
        match ep.put_zcopy(&iov, base + (i % 16) * (64 << 10), &rkey, Some(&comp))? {
            Status::NoResource => break,
            Status::InProgress | Status::Done => comps.push((i, comp)),
        }
    }
    // Most runs have puts still queued here; when the peer drained them
    // all as fast as they came, the checks below still hold.
    let queued = comps.iter().filter(|(_, comp)| !comp.is_complete()).count();
    println!("peer_failure: {queued} puts queued when the peer was killed");
    child.kill()?;
    child.wait()?;
    for i in 1000..1016u64 {
        let iov = [Iov::whole(&local)];
        let comp = Completion::new();
        match ep.put_zcopy(&iov, base + (i % 16) * (64 << 10), &rkey, Some(&comp)) {
            Ok(_) => comps.push((i, comp)),
            Err(e) => peer_error(&format!("put {i}, posted after the kill"), &e)?,
        }
    }
    let flush = Completion::new();
    let posted = ep.flush(Some(&flush));
    let limit = Duration::from_millis(TIMEOUT_MS * 4);
    match posted {
        Err(e) => {
            peer_error("the flush after the kill", &e)?;
            println!("peer_failure: flush after kill refused at once: {e}");
        }
        Ok(_) => {
            let (took, r) = wait(tx.as_mut(), &flush, limit);
            let r = r.ok_or(format!(
                "pending flush still pending {limit:?} after the peer died"
            ))?;
            let e = r.err().ok_or("flush to a killed peer succeeded")?;
            peer_error("the flush after the kill", &e)?;
            println!("peer_failure: pending flush failed after {took:?}: {e}");
        }
    }
    // The endpoint has reported the peer dead: a put still pending then
    // must not succeed later. Every put completes, one way or another,
    // with success (it was on the wire before) or a peer error.
    let pending: Vec<u64> = comps
        .iter()
        .filter(|(_, comp)| !comp.is_complete())
        .map(|(i, _)| *i)
        .collect();
    for (i, comp) in &comps {
        let (_, r) = wait(tx.as_mut(), comp, limit);
        match r.ok_or(format!(
            "put {i} still pending {limit:?} after the peer died"
        ))? {
            Ok(()) if pending.contains(i) => {
                return Err(format!(
                    "put {i} was pending when the flush reported the peer dead, then succeeded"
                )
                .into())
            }
            Ok(()) => {}
            Err(e) => peer_error(&format!("put {i}"), &e)?,
        }
    }

    // Later operations fail at once, with an error.
    let e = ep
        .am_bcopy(1, b"x")
        .err()
        .ok_or("an AM to a dead peer was accepted")?;
    if !matches!(e, UctError::EndpointFailed(_)) {
        return Err(format!("expected EndpointFailed, got {e}").into());
    }

    // Another endpoint on the same iface still works.
    let mut rx = open_lo();
    let mem = rx.md().alloc(4096, MemoryType::Host, Access::all())?;
    let rk = own_rkey(rx.as_ref(), &mem)?;
    let mut ep2 = tx.create_ep(to_iface(rx.as_ref()))?;
    let _ = ep2.put_bcopy(b"alive", mem.addr(), &rk)?;
    let f2 = Completion::new();
    let _ = ep2.flush(Some(&f2))?;
    let t0 = Instant::now();
    while !f2.is_complete() {
        tx.progress();
        rx.progress();
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("the second endpoint did not complete".into());
        }
    }
    f2.result()?;
    let mut got = [0u8; 5];
    mem.read(0, &mut got)?;
    if &got != b"alive" {
        return Err("the second endpoint's put did not land".into());
    }
    Ok(())
}

fn silent_peer() -> Result<(), Failed> {
    // Accepts, then never reads or answers.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let holder = std::thread::spawn(move || {
        let s = listener.accept();
        std::thread::sleep(Duration::from_millis(TIMEOUT_MS * 3));
        drop(s);
    });
    let mut tx = open_lo();
    let silent = Peer {
        ip: loopback_ip(),
        port,
        // A silent peer has a cookie like any iface; it never checks it.
        cookie: 0x0511_3e47,
    };
    let mut ep = tx.create_ep(silent.ep_params())?;
    let mem = tx.md().alloc(64, MemoryType::Host, Access::all())?;
    let rkey = own_rkey(tx.as_ref(), &mem)?;
    let comp = Completion::new();
    let st = ep.get_bcopy(8, 0x1000, &rkey, &comp)?;
    if st != Status::InProgress {
        return Err(format!("get to a silent peer returned {st:?}").into());
    }
    let (took, r) = wait(tx.as_mut(), &comp, Duration::from_millis(TIMEOUT_MS * 3));
    let r = r.ok_or("the get to a silent peer never failed")?;
    let e = r.err().ok_or("the get to a silent peer succeeded")?;
    if took < Duration::from_millis(TIMEOUT_MS) {
        return Err(
            format!("failed after {took:?}, before the {TIMEOUT_MS} ms timeout: {e}").into(),
        );
    }
    if !e.to_string().contains("UCT_TCP_PEER_TIMEOUT") {
        return Err(format!("the error does not name the timeout: {e}").into());
    }
    println!("peer_failure: silent peer failed after {took:?}: {e}");
    holder.join().map_err(|_| "holder thread panicked")?;
    Ok(())
}

/// A put with immediate data to a target that never connects back to the
/// writer (it takes immediates only from ifaces it connected to): it is
/// not executed, and fails after the writer's peer timeout with an error
/// that names the cause.
fn put_imm_to_a_target_that_never_connects_back() -> Result<(), Failed> {
    let mut tx = open_lo();
    let mut rx = open_lo();
    let mut ep = tx.create_ep(to_iface(rx.as_ref()))?;
    let target = rx.md().alloc(64, MemoryType::Host, Access::all())?;
    let rkey = own_rkey(rx.as_ref(), &target)?;
    let src = tx.md().alloc(64, MemoryType::Host, Access::all())?;
    src.write(0, &[7u8; 64])?;
    let comp = Completion::new();
    let t0 = Instant::now();
    let st = ep.put_zcopy_imm(
        &[Iov::new(&src, 0, 64)],
        target.addr(),
        &rkey,
        1,
        Some(&comp),
    )?;
    if st != Status::InProgress {
        return Err(format!("a put with immediate data returned {st:?}").into());
    }
    while !comp.is_complete() && t0.elapsed() < Duration::from_millis(TIMEOUT_MS * 3) {
        tx.progress();
        rx.progress();
    }
    let took = t0.elapsed();
    let e = match comp.is_complete().then(|| comp.result()) {
        None => return Err(format!("not failed after {took:?}").into()),
        Some(Ok(())) => return Err("completed though the target never connected back".into()),
        Some(Err(e)) => e,
    };
    if took < Duration::from_millis(TIMEOUT_MS) {
        return Err(format!("failed after {took:?}, before the timeout: {e}").into());
    }
    if !e
        .to_string()
        .contains("has not connected back to this writer")
    {
        return Err(format!("the error does not name the cause: {e}").into());
    }
    let mut got = [0u8; 64];
    target.read(0, &mut got)?;
    if got != [0u8; 64] {
        return Err("the put was executed".into());
    }
    println!("peer_failure: put with immediate data failed after {took:?}: {e}");
    Ok(())
}

fn main() {
    if std::env::var(common::ROLE).as_deref() == Ok("server") {
        serve();
    }
    // This process's own tcp ifaces use the short timeout too.
    std::env::set_var("UCT_TCP_PEER_TIMEOUT", format!("{TIMEOUT_MS}ms"));
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test("tcp_peer_killed_mid_stream", killed_peer),
        Trial::test("tcp_silent_peer_times_out", silent_peer),
        Trial::test(
            "tcp_put_imm_to_a_target_that_never_connects_back",
            put_imm_to_a_target_that_never_connects_back,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
