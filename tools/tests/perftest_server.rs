//! A perftest server facing a client that asks for too much (issue 12,
//! finding 9): a fake client speaks the bootstrap protocol and proposes
//! sizes, iteration counts and layouts beyond the server's limits. The
//! server must refuse, saying why, before it allocates anything, and exit
//! with status 1: no panic, no abort, no memory to speak of.
//!
//! And how a server waits: through a one-sided test (put_bw here) on a
//! transport whose puts need no progress of the target (posix), it sleeps
//! in poll(2) and leaves its CPU to the client; started with
//! `--server-spin` it progresses in a busy loop, as ucx_perftest's does.
//! Each server's CPU time comes from its own rusage.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tools::perf::params::{Params, TestKind};
use tools::perf::session::Hello;
use uct_core::bootstrap::BootstrapChannel;

/// The most a refusing server may have resident at its peak: a perftest
/// process with one tcp iface, far below any buffer it was asked for.
const RSS_LIMIT_KIB: i64 = 128 << 10;
/// How soon the refusal must come.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// What the server runs: tcp over loopback, put_bw, host memory.
fn server_params() -> Params {
    Params {
        transport: "tcp".into(),
        device: Some("lo".into()),
        mem_send: "host".into(),
        mem_recv: "host".into(),
        test: TestKind::PutBw,
        layout: None,
        sizes: vec![8],
        iters: Some(10),
        warmup: None,
        outstanding: 32,
        validate: false,
        stage_validation: false,
        percentile: 99.0,
        inject_corruption: None,
    }
}

/// How the server process ended, its peak resident memory and the CPU
/// time it used (user and system).
struct Ended {
    code: Option<i32>,
    signal: Option<i32>,
    max_rss_kib: i64,
    cpu: Duration,
}

/// Reaps `child` within `limit` (killing it after), with its own rusage.
fn reap(child: &mut Child, limit: Duration) -> Ended {
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of that plain struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 writes only the status and the rusage we pass; the
        // pid is our own child, not yet reaped.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            let tv = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            return Ended {
                code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
                signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
                max_rss_kib: usage.ru_maxrss,
                cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
            };
        }
        assert!(r == 0, "wait4 failed: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts a tcp server, proposes `params` as a client would, and returns
/// the server's answer (with how long it took) and how the server ended.
fn propose(params: Params) -> (Result<Hello, String>, Duration, Ended) {
    propose_after(params, |_| {})
}

/// [`propose`], after `before` has had the server's port to itself.
fn propose_after(
    params: Params,
    before: impl FnOnce(u16),
) -> (Result<Hello, String>, Duration, Ended) {
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["--listen", "-t", "tcp", "-d", "lo", "-p", &port.to_string()])
        .env_remove("UCT_TLS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let mut err = BufReader::new(server.stderr.take().expect("server stderr"));
    let mut line = String::new();
    while !line.contains("waiting for a client") {
        line.clear();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("the server ended before listening");
        }
    }
    before(port);
    let mut ch = BootstrapChannel::connect(("127.0.0.1", port), Duration::from_secs(10))
        .expect("connect to the server");
    let asked = Instant::now();
    ch.send_msg(&Hello::Params(Box::new(params)))
        .expect("send the parameters");
    let answer = ch.recv_msg::<Hello>().map_err(|e| e.to_string());
    let took = asked.elapsed();
    drop(ch);
    // Whatever the server does next, the client is gone; it must end.
    let ended = reap(&mut server, Duration::from_secs(10));
    (answer, took, ended)
}

/// Proposes `params` and checks that the server refused in time with a
/// reason that contains `because`, without memory, and exited with 1.
fn refused(case: &str, params: Params, because: &str) {
    let (answer, took, ended) = propose(params);
    match answer {
        Ok(Hello::Refuse(why)) => assert!(
            why.contains(because),
            "{case}: refused, but the reason does not say '{because}': {why}"
        ),
        other => panic!("{case}: the server did not refuse: {other:?}"),
    }
    assert!(took < ANSWER_WITHIN, "{case}: the refusal took {took:?}");
    assert_eq!(
        (ended.code, ended.signal),
        (Some(1), None),
        "{case}: the server must exit with status 1 (not a panic, not a signal)"
    );
    assert!(
        ended.max_rss_kib < RSS_LIMIT_KIB,
        "{case}: the server's peak RSS was {} KiB, more than {RSS_LIMIT_KIB} KiB",
        ended.max_rss_kib
    );
}

#[test]
fn a_64_gib_size_is_refused_before_anything_is_allocated() {
    refused(
        "64 GiB",
        Params {
            sizes: vec![64 << 30],
            ..server_params()
        },
        "--max-size",
    );
}

#[test]
fn a_size_whose_buffer_length_overflows_is_refused() {
    refused(
        "usize::MAX",
        Params {
            sizes: vec![usize::MAX],
            ..server_params()
        },
        "--max-size",
    );
}

#[test]
fn a_size_the_transport_cannot_carry_is_refused_before_allocation() {
    // Under the server's cap, over what tcp carries in one put (16 MiB).
    refused(
        "32 MiB over tcp",
        Params {
            sizes: vec![32 << 20],
            ..server_params()
        },
        "16M",
    );
}

#[test]
fn an_unbounded_iteration_count_is_refused() {
    for (case, params) in [
        (
            "iterations",
            Params {
                iters: Some(u64::MAX),
                ..server_params()
            },
        ),
        (
            "warm-up",
            Params {
                warmup: Some(u64::MAX),
                ..server_params()
            },
        ),
    ] {
        refused(case, params, "iterations");
    }
}

#[test]
fn thousands_of_sizes_are_refused() {
    refused(
        "100000 sizes",
        Params {
            sizes: vec![8; 100_000],
            ..server_params()
        },
        "sizes",
    );
}

#[test]
fn a_connection_that_fails_its_handshake_does_not_end_the_server() {
    let (answer, _, ended) = propose_after(
        Params {
            sizes: vec![64 << 30],
            ..server_params()
        },
        |port| {
            // Not the bootstrap protocol: the server says so and waits on.
            let mut junk = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            let _ = std::io::Write::write_all(&mut junk, b"GET / HTTP/1.0\r\n\r\n");
            let _ = junk.shutdown(std::net::Shutdown::Both);
        },
    );
    assert!(
        matches!(&answer, Ok(Hello::Refuse(why)) if why.contains("--max-size")),
        "the server did not answer the real client after a junk connection: {answer:?}"
    );
    assert_eq!((ended.code, ended.signal), (Some(1), None));
}

/// A server with `server_flags` and a posix put_bw client of 8 B against
/// it: the server's CPU time and the client's wall time.
fn server_cpu_over_a_run(server_flags: &[&str]) -> (Duration, Duration) {
    let port = free_port().to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["--listen", "-t", "posix", "-p", &port])
        .args(server_flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    std::thread::sleep(Duration::from_millis(200));
    // About a second of puts either way (an unoptimised build took 3.7 s
    // for 30M here, an optimised one 0.36 s), against the server's few ms
    // of set-up.
    let puts = if cfg!(debug_assertions) {
        "10000000"
    } else {
        "30000000"
    };
    let started = Instant::now();
    let mut client = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["127.0.0.1", "-p", &port, "-t", "posix", "--test", "put_bw"])
        .args(["-s", "8", "-n", puts, "-f"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    // Read as it comes, so that a chatty client cannot fill the pipe.
    let client_err = client.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
            text
        })
    });
    let client_ended = reap(&mut client, Duration::from_secs(120));
    let wall = started.elapsed();
    let ended = reap(&mut server, Duration::from_secs(60));
    let err = client_err.and_then(|t| t.join().ok()).unwrap_or_default();
    assert_eq!(
        (client_ended.code, client_ended.signal),
        (Some(0), None),
        "the client against a server {server_flags:?} failed (killed after 120 s if it ran on): {err}"
    );
    assert_eq!(ended.code, Some(0), "the server {server_flags:?} failed");
    (ended.cpu, wall)
}

#[test]
fn a_server_sleeps_through_a_one_sided_test_unless_told_to_spin() {
    let (asleep, wall) = server_cpu_over_a_run(&[]);
    let (spinning, spin_wall) = server_cpu_over_a_run(&["--server-spin"]);
    eprintln!(
        "server CPU: {asleep:?} over a client run of {wall:?} by default, \
         {spinning:?} over {spin_wall:?} with --server-spin"
    );
    // Setting up (the iface, the buffers, the connection) takes a few ms.
    assert!(
        asleep < wall / 10,
        "the server used {asleep:?} of CPU over a one-sided run of {wall:?}: it did not sleep"
    );
    // The control: the measure sees a server that does not sleep.
    assert!(
        spinning > Duration::from_millis(50) && spinning > asleep * 3,
        "with --server-spin the server used only {spinning:?} of CPU over {spin_wall:?} \
         (asleep: {asleep:?}): the measure cannot tell them apart"
    );
}
