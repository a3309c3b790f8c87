//! A perftest server killed with SIGKILL mid-run: the client must exit 1
//! within the transport's peer timeout plus 1 s, naming the dead peer and
//! the test that was running (issue 12, finding 9). Over posix, tcp and cma;
//! cma has no active messages, so am_lat runs over posix and tcp only.
//! And the other way round: a client killed mid-run of a one-sided test,
//! where the server sleeps in poll(2), must end the server the same way.
//!
//! The cases run one at a time: each spins two processes on a small
//! machine, and a deadline measured under contention would say nothing.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod children;
use children::{drain, exit_within, lines_of, wait_for_line, Reaped};

/// The peer timeout every case sets, short so that the suite stays fast.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// What the issue allows beyond the peer timeout.
const GRACE: Duration = Duration::from_secs(1);
/// How long the run goes on before the server is killed.
const RUNNING_FOR: Duration = Duration::from_millis(300);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// The variable that sets `transport`'s peer timeout.
fn timeout_var(transport: &str) -> String {
    format!("UCT_{}_PEER_TIMEOUT", transport.to_uppercase())
}

fn perftest(transport: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_perftest"));
    cmd.args(["-t", transport]);
    if transport == "tcp" {
        cmd.args(["-d", "lo"]);
    }
    cmd.args(args)
        .env_remove("UCT_TLS")
        .env(
            timeout_var(transport),
            format!("{}ms", PEER_TIMEOUT.as_millis()),
        )
        .stdin(Stdio::null());
    cmd
}

/// A server and a long client run of `test` of `size` bytes, both going
/// (the client printed its header and ran for [`RUNNING_FOR`]), with
/// their stderr lines and the client's stdout lines.
struct Running {
    server: Reaped,
    server_err: std::sync::mpsc::Receiver<String>,
    client: Reaped,
    client_err: std::sync::mpsc::Receiver<String>,
    /// Kept so that its reader thread keeps the client's stdout open.
    _client_out: std::sync::mpsc::Receiver<String>,
}

fn running(transport: &str, test: &str, size: &str) -> Running {
    let port = free_port().to_string();
    let mut server = perftest(transport, &["--listen", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let server_err = lines_of(server.stderr.take().expect("server stderr"));
    let server = Reaped(server);
    if let Err(seen) = wait_for_line(&server_err, "waiting for a client", Duration::from_secs(10)) {
        panic!("{transport} {test}: the server did not start:\n{seen}");
    }
    let mut client = perftest(
        transport,
        &[
            "127.0.0.1",
            "-p",
            &port,
            "--test",
            test,
            "-s",
            size,
            "-n",
            "100000000",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the client");
    let client_out = lines_of(client.stdout.take().expect("client stdout"));
    let client_err = lines_of(client.stderr.take().expect("client stderr"));
    let mut client = Reaped(client);
    // The header is printed once both sides are connected, before the
    // first phase.
    if let Err(seen) = wait_for_line(&client_out, "# perftest:", Duration::from_secs(10)) {
        drop(client);
        let err = drain(&client_err, Duration::from_secs(2));
        panic!("{transport} {test}: the client did not start the run:\n{seen}{err}");
    }
    std::thread::sleep(RUNNING_FOR);
    assert!(
        client.0.try_wait().expect("poll the client").is_none(),
        "{transport} {test}: the client ended within {RUNNING_FOR:?}"
    );
    Running {
        server,
        server_err,
        client,
        client_err,
        _client_out: client_out,
    }
}

/// Kills `victim` with SIGKILL and waits up to the peer timeout plus
/// [`GRACE`] for `survivor` to exit: its exit status, how long it took,
/// and its stderr. Panics, with that stderr, if it is still running.
fn survivor_of(
    label: &str,
    mut victim: Reaped,
    mut survivor: Reaped,
    survivor_err: &std::sync::mpsc::Receiver<String>,
) -> (std::process::ExitStatus, Duration, String) {
    victim.0.kill().expect("SIGKILL the victim");
    let killed = Instant::now();
    let _ = victim.0.wait();
    let limit = PEER_TIMEOUT + GRACE;
    let status = exit_within(&mut survivor.0, killed, limit).expect("poll the survivor");
    let took = killed.elapsed();
    // The survivor is gone (or killed by Reaped), so its stderr ends.
    drop(survivor);
    let err = drain(survivor_err, Duration::from_secs(2));
    let Some(status) = status else {
        panic!(
            "{label}: still running {took:?} after its peer was killed (limit {limit:?}); stderr so far:\n{err}"
        );
    };
    (status, took, err)
}

/// Starts a server and a long client run of `test`, kills the server with
/// SIGKILL once the run is going, and checks how the client ends.
fn server_killed_mid_run(transport: &str, test: &str) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let size = if test == "put_bw" { "4k" } else { "8" };
    let Running {
        server,
        client,
        client_err,
        ..
    } = running(transport, test, size);
    let server_pid = server.0.id();
    let label = format!("{transport} {test}: the client");
    let (status, took, err) = survivor_of(&label, server, client, &client_err);
    assert_eq!(
        status.code(),
        Some(1),
        "{transport} {test}: exit status {status} after {took:?}; stderr:\n{err}"
    );
    let names_peer = match transport {
        "tcp" => err.contains("127.0.0.1:"),
        _ => err.contains(&format!("process {server_pid}")),
    };
    assert!(
        names_peer,
        "{transport} {test}: the error does not name the dead peer (server pid {server_pid}) after {took:?}:\n{err}"
    );
    assert!(
        err.contains(test),
        "{transport} {test}: the error does not say which test was running:\n{err}"
    );
}

#[test]
fn posix_am_lat() {
    server_killed_mid_run("posix", "am_lat");
}

#[test]
fn posix_put_lat() {
    server_killed_mid_run("posix", "put_lat");
}

#[test]
fn posix_put_bw() {
    server_killed_mid_run("posix", "put_bw");
}

#[test]
fn tcp_am_lat() {
    server_killed_mid_run("tcp", "am_lat");
}

#[test]
fn tcp_put_lat() {
    server_killed_mid_run("tcp", "put_lat");
}

#[test]
fn tcp_put_bw() {
    server_killed_mid_run("tcp", "put_bw");
}

#[test]
fn cma_put_lat() {
    server_killed_mid_run("cma", "put_lat");
}

#[test]
fn cma_put_bw() {
    server_killed_mid_run("cma", "put_bw");
}

/// The other way round, through a one-sided test, where the server sleeps
/// in poll(2) (over posix and cma, which need no target progress): a
/// client killed mid-run must end the server with exit status 1 within
/// the peer timeout plus 1 s, its error naming the dead client.
fn client_killed_mid_run(transport: &str, test: &str) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Running {
        server,
        server_err,
        client,
        ..
    } = running(transport, test, "4k");
    let client_pid = client.0.id();
    let label = format!("{transport} {test}: the server");
    let (status, took, err) = survivor_of(&label, client, server, &server_err);
    assert_eq!(
        status.code(),
        Some(1),
        "{transport} {test}: the server's exit status {status} after {took:?}; stderr:\n{err}"
    );
    assert!(
        err.contains(&format!("process {client_pid}")),
        "{transport} {test}: the server's error does not name the dead client (pid {client_pid}) after {took:?}:\n{err}"
    );
}

#[test]
fn posix_put_bw_client_killed() {
    client_killed_mid_run("posix", "put_bw");
}

#[test]
fn cma_get_bw_client_killed() {
    client_killed_mid_run("cma", "get_bw");
}
