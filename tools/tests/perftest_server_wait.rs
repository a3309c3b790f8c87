//! How a perftest server waits. Through a one-sided test (put_bw here) on
//! a transport whose puts need no progress of the target (posix), it
//! sleeps in poll(2) and leaves its CPU to the client; started with
//! `--server-spin` it progresses in a busy loop, as ucx_perftest's does.
//! Each server's CPU time comes from its own rusage.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// Reaps `child` (killing it after `limit`), returning its exit status and
/// the CPU time it used, user and system.
fn reap(child: &mut Child, limit: Duration) -> (i32, Duration) {
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
            return (status, tv(usage.ru_utime) + tv(usage.ru_stime));
        }
        assert!(r == 0, "wait4 failed: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A server with `server_flags` and a posix put_bw client of 8 B against
/// it: the server's CPU time and the client's wall time.
fn run(server_flags: &[&str]) -> (Duration, Duration) {
    let port = free_port().to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["--listen", "-t", "posix", "-p", &port])
        .args(server_flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let client = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["127.0.0.1", "-p", &port, "-t", "posix", "--test", "put_bw"])
        .args(["-s", "8", "-n", "30000000", "-f"])
        .output()
        .expect("run the client");
    let wall = started.elapsed();
    let (status, cpu) = reap(&mut server, Duration::from_secs(60));
    assert!(
        client.status.success(),
        "client: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert_eq!(status, 0, "the server {server_flags:?} failed");
    (cpu, wall)
}

#[test]
fn a_server_sleeps_through_a_one_sided_test_unless_told_to_spin() {
    let (asleep, wall) = run(&[]);
    let (spinning, spin_wall) = run(&["--server-spin"]);
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
