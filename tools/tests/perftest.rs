//! perftest as a user runs it: loopback, client and server, validation that
//! catches a corrupted transfer, and one-line errors for what cannot run.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn perftest(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(args)
        .env_remove("UCT_TLS")
        .output()
        .expect("run perftest")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The result lines of a table (not the header).
fn rows(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.starts_with('#') && l.contains('|'))
        .collect()
}

#[test]
fn loopback_sweep_prints_a_table() {
    let output = perftest(&["-t", "posix", "-s", "8:64k", "-n", "200"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains("MiB/s") && out.contains("Gb/s") && out.contains("p50"),
        "{out}"
    );
    assert_eq!(rows(&out).len(), 14, "8 B to 64 KiB is 14 sizes:\n{out}");
}

#[test]
fn every_test_runs_over_tcp_in_loopback() {
    for test in [
        "put_lat",
        "put_bw",
        "get_lat",
        "get_bw",
        "am_lat",
        "am_bw",
        "add_lat",
        "fadd_lat",
        "cswap_lat",
        "add_mr",
    ] {
        let output = perftest(&[
            "-t", "tcp", "-d", "lo", "--test", test, "-s", "8", "-n", "200", "-f",
        ]);
        assert!(output.status.success(), "{test}: {}", text(&output.stderr));
        assert_eq!(rows(&text(&output.stdout)).len(), 1, "{test}");
    }
}

#[test]
fn client_and_server_in_two_processes() {
    let port = free_port().to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["--listen", "-t", "tcp", "-d", "lo", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let output = perftest(&[
        "127.0.0.1",
        "-t",
        "tcp",
        "-d",
        "lo",
        "-p",
        &port,
        "-s",
        "8,4k",
        "-n",
        "300",
    ]);
    let st = server.wait().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(st.success(), "the server failed");
    assert_eq!(rows(&text(&output.stdout)).len(), 2);
}

#[test]
fn mismatched_sides_are_refused_with_a_reason() {
    let port = free_port().to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["--listen", "-t", "tcp", "-d", "lo", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let output = perftest(&[
        "127.0.0.1",
        "-t",
        "posix",
        "-p",
        &port,
        "-s",
        "8",
        "-n",
        "10",
    ]);
    let _ = server.wait();
    assert!(!output.status.success());
    let err = text(&output.stderr);
    assert!(err.contains("transport: client posix, server tcp"), "{err}");
}

#[test]
fn validation_passes_on_good_transfers() {
    for (transport, test, sizes) in [
        ("posix", "put_bw", "8,4k"),
        ("tcp", "get_bw", "8,4k"),
        ("posix", "am_bw", "8,4k"),
        ("cma", "put_lat", "8,4k"),
        // 13: the sequence word off its 8-byte alignment.
        ("posix", "put_lat", "13,8,4k"),
        ("self", "am_lat", "8,4k"),
        ("posix", "add_lat", "8"),
        ("posix", "fadd_lat", "8"),
        // One-sided tests whose server sleeps (posix and cma need no
        // progress of the target): it must still fill, check and count.
        ("posix", "get_bw", "8,4k"),
        ("cma", "get_bw", "8,4k"),
        ("posix", "add_mr", "8"),
        ("posix", "cswap_lat", "8"),
    ] {
        let output = perftest(&[
            "-t",
            transport,
            "--test",
            test,
            "-s",
            sizes,
            "-n",
            "50",
            "--validate",
            "-f",
        ]);
        assert!(
            output.status.success(),
            "{transport} {test}: {}",
            text(&output.stderr)
        );
    }
}

#[test]
fn validation_reports_a_corrupted_transfer() {
    for (transport, test) in [
        ("posix", "put_bw"),
        ("tcp", "get_bw"),
        // The sleeping server's fills (posix needs no target progress).
        ("posix", "get_bw"),
        ("posix", "am_bw"),
        ("tcp", "put_lat"),
    ] {
        let output = perftest(&[
            "-t",
            transport,
            "--test",
            test,
            "-s",
            "4k",
            "-n",
            "50",
            "--validate",
            "--inject-corruption",
            "17",
        ]);
        assert!(
            !output.status.success(),
            "{transport} {test}: a corrupted transfer passed validation"
        );
        let err = text(&output.stderr);
        assert!(
            err.contains("validation FAILED") && err.contains("iteration 17"),
            "{transport} {test}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

fn one_line_error(args: &[&str], needle: &str) {
    let output = perftest(args);
    assert!(!output.status.success(), "{args:?} succeeded");
    let err = text(&output.stderr);
    assert_eq!(
        err.trim().lines().count(),
        1,
        "{args:?}: not one line: {err}"
    );
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn what_cannot_run_gets_one_line_that_says_what_would() {
    one_line_error(&["-t", "tcp", "-m", "gaudi", "-n", "10"], "DMA-buf");
    one_line_error(&["-t", "nope", "-n", "10"], "transports available here:");
    one_line_error(
        &["-t", "posix", "-D", "short", "-s", "64k", "-n", "10"],
        "use -D short up to 8K, -D bcopy up to 64K, -D zcopy up to 1G",
    );
    one_line_error(
        &["-t", "tcp", "-s", "1G", "-n", "10"],
        "use sizes up to 16M",
    );
    one_line_error(
        &["-t", "cma", "--test", "am_lat", "-n", "10"],
        "no active messages",
    );
    one_line_error(&["-t", "posix", "--test", "bogus"], "use one of put_lat");
    one_line_error(&["-n", "10"], "choose a transport with -t");
}

#[test]
fn csv_and_json_formats() {
    let output = perftest(&["-t", "self", "-s", "8,64", "-n", "100", "--format", "csv"]);
    let out = text(&output.stdout);
    assert!(out.starts_with("test,transport,layout,size"), "{out}");
    assert_eq!(out.lines().count(), 3);
    let output = perftest(&["-t", "self", "-s", "8,64", "-n", "100", "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json.as_array().unwrap().len(), 2);
    assert!(json[0]["bandwidth_mib_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn staged_validation_goes_through_the_transport_and_catches_corruption() {
    for test in ["put_bw", "get_bw"] {
        let output = perftest(&[
            "-t",
            "tcp",
            "--test",
            test,
            "-s",
            "4k,64k",
            "-n",
            "20",
            "--validate",
            "--stage-validation",
        ]);
        assert!(output.status.success(), "{test}: {}", text(&output.stderr));
        assert_eq!(rows(&text(&output.stdout)).len(), 2);
    }
    let output = perftest(&[
        "-t",
        "tcp",
        "--test",
        "put_bw",
        "-s",
        "4k",
        "-n",
        "20",
        "--validate",
        "--stage-validation",
        "--inject-corruption",
        "5",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("validation FAILED"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn gaudi_memory_with_the_simulator_on_tcp_is_still_refused() {
    let sim = hlthunk_sim::library_path().expect("simulator built");
    let output = Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(["-t", "tcp", "-m", "gaudi"])
        .env_remove("UCT_TLS")
        .env("UCT_GAUDI_HLTHUNK_LIB", sim)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert!(
        text(&output.stderr).contains("needs an RDMA NIC with DMA-buf support"),
        "{}",
        text(&output.stderr)
    );
}
