//! transfer-bench --rails: 4 MiB writes over two tcp rails validated, with
//! each rail's counts printed (table and JSON), in one process and in two;
//! a rail count the two sides disagree on, and bad rail options, refused
//! by name.
//!
//! The rails are `lo` twice (--devices lo,lo), which every host has
//! (`--rails 2` on the devices tcp lists is transfer's tests/rails.rs,
//! skipped by name where tcp lists one).

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_transfer-bench"));
    c.env_remove("UCT_TLS")
        .env_remove("UCT_NET_DEVICES")
        .env_remove("UCT_TRANSFER_RAILS")
        .env_remove("UCT_TRANSFER_STRIPE_MIN");
    c
}

fn run(args: &[&str]) -> Output {
    bench().args(args).output().expect("run transfer-bench")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// The `rail N (...)` lines of a table run: (device, writes, in service).
fn rail_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("rail "))
        .map(str::to_string)
        .collect()
}

#[test]
fn two_rails_validate_and_count_per_rail() {
    let out = run(&[
        "-t",
        "tcp",
        "--devices",
        "lo,lo",
        "-s",
        "4M",
        "--validate",
        "-n",
        "20",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines = rail_lines(&stdout);
    assert_eq!(lines.len(), 2, "{stdout}");
    for (i, l) in lines.iter().enumerate() {
        assert!(l.starts_with(&format!("rail {i} (lo): ")), "{l}");
        assert!(l.ends_with("in service"), "{l}");
        // Every 4 MiB write is striped: each rail carried a stripe of each.
        assert!(!l.contains(": 0 writes"), "{l}");
        assert!(l.contains("(50%)"), "equal rails carry half each: {l}");
    }
    assert!(stdout.contains("over tcp"), "{stdout}");
}

#[test]
fn two_rails_in_json() {
    let out = run(&[
        "-t",
        "tcp",
        "--devices",
        "lo,lo",
        "-s",
        "1M,4M",
        "--validate",
        "-n",
        "10",
        "--stripe-min",
        "1M",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["header"]["device"], "lo+lo");
    let rails = doc["rails"].as_array().expect("a rails array");
    assert_eq!(rails.len(), 2);
    let total: u64 = rails
        .iter()
        .map(|r| r["bytes_written"].as_u64().unwrap())
        .sum();
    for r in rails {
        assert_eq!(r["in_service"], true);
        assert!(r["writes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["failure"].is_null());
    }
    assert!(total > 0);
    // One rail: no rails array.
    let out = run(&[
        "-t", "tcp", "-d", "lo", "-s", "64k", "-n", "5", "--format", "json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc.get("rails").is_none(), "{doc}");
}

#[test]
fn two_processes_with_two_rails() {
    let port = free_port();
    let server = bench()
        .args([
            "--listen",
            "-p",
            &port,
            "-t",
            "tcp",
            "--devices",
            "lo,lo",
            "-s",
            "4M",
            "--validate",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The sender retries the bootstrap connect until the receiver listens.
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let out = run(&[
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "tcp",
        "--devices",
        "lo,lo",
        "-s",
        "4M",
        "--validate",
        "-n",
        "20",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines = rail_lines(&stdout);
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines.iter().all(|l| !l.contains(": 0 writes")), "{stdout}");
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{}", text(&served.stderr));
    assert!(start.elapsed() < Duration::from_secs(120));
}

#[test]
fn a_rail_count_mismatch_and_bad_rail_options_are_refused() {
    let port = free_port();
    let mut server = bench()
        .args([
            "--listen", "-p", &port, "-t", "tcp", "-d", "lo", "-s", "64k",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = run(&[
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "tcp",
        "--devices",
        "lo,lo",
        "-s",
        "64k",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("rails (--rails): client 2, server 1"), "{err}");
    let _ = server.kill();
    let _ = server.wait();
    for (args, words) in [
        (&["-t", "tcp", "--rails", "0", "-s", "4k"][..], "--rails 0"),
        (
            &[
                "-t",
                "tcp",
                "--rails",
                "3",
                "--devices",
                "lo,lo",
                "-s",
                "4k",
            ][..],
            "--rails 3 with --devices naming 2",
        ),
        (
            &["-t", "posix", "--rails", "2", "-s", "4k"][..],
            "2 rails of posix",
        ),
        (
            &[
                "-t",
                "tcp",
                "--devices",
                "lo,lo",
                "--stripe-min",
                "lots",
                "-s",
                "4k",
            ][..],
            "--stripe-min lots",
        ),
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(words), "{args:?}: {err}");
    }
}
