//! perftest and dmabuf-demo over rc, where an RDMA device is present (inside
//! scripts/rxe-vm, Soft-RoCE). Inside the VM (`RXE_VM_DEVICE=rxe0`), or
//! where `UCT_TEST_EXPECT` names rc, rc is expected: if it is absent (no
//! device, the ib module not loaded) every test fails with the reason.
//! Elsewhere every test is reported as skipped (ignored, whatever the
//! flags), by name, with the reason. Gaudi memory comes from the hl-thunk
//! simulator (a TEST DOUBLE); rxe cannot import DMA-buf, so the Gaudi runs
//! must fail at registration with the message that says so. A perftest
//! server killed with SIGKILL mid-run must make its client exit 1 within
//! UCT_RC_PEER_TIMEOUT + 1 s, naming the dead peer (issue 12).

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

mod children;
use children::{drain, exit_within, lines_of, wait_for_line, Reaped};

fn sim() -> String {
    hlthunk_sim::library_path()
        .expect("libhlthunk_sim.so is built with the tests")
        .display()
        .to_string()
}

fn cmd(bin: &str) -> Command {
    let mut c = Command::new(bin);
    c.env_remove("UCT_TLS").env("UCT_GAUDI_HLTHUNK_LIB", sim());
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn perftest(args: &[&str]) -> Output {
    cmd(env!("CARGO_BIN_EXE_perftest"))
        .args(args)
        .output()
        .expect("run perftest")
}

/// Why rc cannot run here, if it cannot.
fn rc_absent() -> Option<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_transport-info"))
        .args(["-t", "rc"])
        .env_remove("UCT_TLS")
        .output()
        .ok()?;
    (!o.status.success()).then(|| text(&o.stderr).trim().to_string())
}

/// Whether this run expects rc: inside scripts/rxe-vm (which sets
/// `RXE_VM_DEVICE`), or where `UCT_TEST_EXPECT` names rc.
fn rc_expected() -> bool {
    match std::env::var("UCT_TEST_EXPECT") {
        Ok(names) => names.split(',').any(|n| n.trim() == "rc"),
        Err(_) => std::env::var_os("RXE_VM_DEVICE").is_some(),
    }
}

fn check(cond: bool, what: String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn perftest_gaudi_fails_with_the_dmabuf_message() -> Result<(), Failed> {
    let o = perftest(&[
        "-t", "rc", "-m", "gaudi", "--test", "put_bw", "-s", "64k", "-n", "10",
    ]);
    let err = text(&o.stderr);
    check(!o.status.success(), format!("it must fail on rxe:\n{err}"))?;
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    check(lines.len() == 1, format!("one message, got:\n{err}"))?;
    check(
        lines[0].contains("cannot import DMA-buf")
            && ["mlx5", "efa", "irdma", "bnxt_re"]
                .iter()
                .all(|n| lines[0].contains(n)),
        format!("the DMA-buf message naming NICs that can: {err}"),
    )?;
    check(
        o.stdout.is_empty(),
        format!("no table: {}", text(&o.stdout)),
    )
}

fn perftest_host_validate(
    test: &'static str,
    sizes: &'static str,
    extra: &'static [&'static str],
) -> Result<(), Failed> {
    let mut args = vec![
        "-t",
        "rc",
        "-m",
        "host",
        "--test",
        test,
        "-s",
        sizes,
        "-n",
        "30",
        "--validate",
    ];
    args.extend_from_slice(extra);
    let o = perftest(&args);
    let out = text(&o.stdout);
    check(
        o.status.success(),
        format!("perftest {args:?}:\n{out}{}", text(&o.stderr)),
    )?;
    let rows = out
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('|'))
        .count();
    let want = sizes.split(',').count();
    check(rows == want, format!("{want} sizes:\n{out}"))
}

fn demo(args: &[&str]) -> Command {
    let mut c = cmd(env!("CARGO_BIN_EXE_dmabuf-demo"));
    c.args(args);
    c
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
        .to_string()
}

fn wait_child(mut c: Child, limit: Duration) -> Result<Output, Failed> {
    let t0 = Instant::now();
    loop {
        if c.try_wait()?.is_some() {
            return Ok(c.wait_with_output()?);
        }
        if t0.elapsed() > limit {
            let _ = c.kill();
            let o = c.wait_with_output()?;
            return Err(format!(
                "timed out after {limit:?}:\n{}{}",
                text(&o.stdout),
                text(&o.stderr)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn demo_host_server_and_client_verify() -> Result<(), Failed> {
    let port = free_port();
    let common = ["-p", port.as_str(), "-s", "256k", "-n", "5"];
    let server = demo(&["server"])
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let client = demo(&["client", "127.0.0.1"]).args(common).output()?;
    let s = wait_child(server, Duration::from_secs(120))?;
    let (cout, sout) = (text(&client.stdout), text(&s.stdout));
    check(
        client.status.success() && s.status.success(),
        format!(
            "client:\n{cout}{}\nserver:\n{sout}{}",
            text(&client.stderr),
            text(&s.stderr)
        ),
    )?;
    for phase in [
        "send/recv:",
        "rdma write:",
        "rdma read:",
        "ALL PHASES VERIFIED",
    ] {
        check(cout.contains(phase), format!("{phase} in:\n{cout}"))?;
    }
    check(
        cout.contains("verified by read-back and by the server"),
        cout.clone(),
    )?;
    check(sout.contains("client says all verified"), sout)
}

fn demo_gaudi_server_fails_cleanly_on_rxe() -> Result<(), Failed> {
    let port = free_port();
    let o = demo(&["server", "-m", "gaudi", "-p", port.as_str()]).output()?;
    let err = text(&o.stderr);
    check(
        o.status.code() == Some(1),
        format!("exit 1, got {:?}: {err}", o.status),
    )?;
    check(
        err.contains("cannot import DMA-buf") && err.contains("mlx5"),
        format!("the DMA-buf message: {err}"),
    )
}

/// The peer timeout of the server-killed runs, short so that they stay
/// quick; the client must exit within it plus [`GRACE`].
const PEER_TIMEOUT: Duration = Duration::from_secs(3);
const GRACE: Duration = Duration::from_secs(1);

fn rc_perftest(args: &[&str]) -> Command {
    let mut c = cmd(env!("CARGO_BIN_EXE_perftest"));
    c.args(["-t", "rc"])
        .args(args)
        .env(
            "UCT_RC_PEER_TIMEOUT",
            format!("{}s", PEER_TIMEOUT.as_secs()),
        )
        .stdin(Stdio::null());
    c
}

/// A perftest server over rc killed with SIGKILL while a long `test` runs:
/// the client exits 1 within the peer timeout plus 1 s, naming the dead
/// peer (its QP) and the test.
fn perftest_server_killed_mid_run(test: &str) -> Result<(), Failed> {
    let port = free_port();
    let mut server = rc_perftest(&["--listen", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let server_err = lines_of(server.stderr.take().ok_or("server stderr")?);
    let mut server = Reaped(server);
    wait_for_line(&server_err, "waiting for a client", Duration::from_secs(60))
        .map_err(|seen| format!("the server did not start:\n{seen}"))?;
    let size = if test == "put_bw" { "4k" } else { "8" };
    let mut client = rc_perftest(&[
        "127.0.0.1",
        "-p",
        &port,
        "--test",
        test,
        "-s",
        size,
        "-n",
        "100000000",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()?;
    let client_out = lines_of(client.stdout.take().ok_or("client stdout")?);
    let client_err = lines_of(client.stderr.take().ok_or("client stderr")?);
    let mut client = Reaped(client);
    if let Err(seen) = wait_for_line(&client_out, "# perftest:", Duration::from_secs(60)) {
        let err: Vec<String> = client_err.try_iter().collect();
        return Err(format!("the client did not start:\n{seen}{}", err.join("\n")).into());
    }
    std::thread::sleep(Duration::from_millis(500));
    check(
        client.0.try_wait()?.is_none(),
        "the client ended before the server was killed".into(),
    )?;
    server.0.kill()?;
    let killed = Instant::now();
    server.0.wait()?;
    let limit = PEER_TIMEOUT + GRACE;
    let status = exit_within(&mut client.0, killed, limit)?;
    let took = killed.elapsed();
    drop(client);
    let err = drain(&client_err, Duration::from_secs(2));
    let Some(status) = status else {
        return Err(format!(
            "{test}: the client still ran {took:?} after the server was killed (limit {limit:?}):\n{err}"
        )
        .into());
    };
    println!("rc_vm: perftest {test}, server killed: client exit {status} after {took:?}: {err}");
    check(
        status.code() == Some(1),
        format!("{test}: exit {status} after {took:?}:\n{err}"),
    )?;
    check(
        err.contains("peer QP 0x"),
        format!("{test}: the error does not name the dead peer's QP:\n{err}"),
    )?;
    check(
        err.contains(test),
        format!("{test}: the error does not say which test ran:\n{err}"),
    )
}

type TestFn = fn() -> Result<(), Failed>;

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: the server-killed runs measure a deadline, which
    // contention on the VM's two CPUs would blur.
    args.test_threads = Some(1);
    let absent = rc_absent();
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "perftest_rc_gaudi_fails_with_the_dmabuf_message",
            perftest_gaudi_fails_with_the_dmabuf_message,
        ),
        ("perftest_rc_host_put_bw_validate", || {
            perftest_host_validate("put_bw", "8,4k,64k", &[])
        }),
        ("perftest_rc_host_get_bw_validate", || {
            perftest_host_validate("get_bw", "8,4k,64k", &[])
        }),
        ("perftest_rc_host_am_bw_validate", || {
            perftest_host_validate("am_bw", "8,4k", &[])
        }),
        ("perftest_rc_host_put_bw_validate_staged", || {
            perftest_host_validate("put_bw", "8,4k,64k", &["--stage-validation"])
        }),
        ("perftest_rc_host_get_bw_validate_staged", || {
            perftest_host_validate("get_bw", "8,4k,64k", &["--stage-validation"])
        }),
        (
            "dmabuf_demo_rc_host_server_and_client_verify",
            demo_host_server_and_client_verify,
        ),
        (
            "dmabuf_demo_rc_gaudi_server_fails_cleanly",
            demo_gaudi_server_fails_cleanly_on_rxe,
        ),
        ("perftest_rc_am_lat_server_killed", || {
            perftest_server_killed_mid_run("am_lat")
        }),
        ("perftest_rc_put_lat_server_killed", || {
            perftest_server_killed_mid_run("put_lat")
        }),
        ("perftest_rc_put_bw_server_killed", || {
            perftest_server_killed_mid_run("put_bw")
        }),
    ];
    let expected = rc_expected();
    let trials = tests
        .into_iter()
        .map(|(name, f)| match absent.clone() {
            None => Trial::test(name, f),
            Some(why) if expected => {
                println!("rc_vm: FAILED {name}: this run expects rc, and it is absent ({why})");
                Trial::test(name, move || {
                    Err(format!("this run expects rc, and it is absent: {why}").into())
                })
            }
            Some(why) => {
                println!("rc_vm: SKIPPED {name}: rc is not available here ({why})");
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
