//! Bad input found while measuring (issue 17): each refused with a line
//! that says what to use, before anything runs.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn perftest(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(args)
        .env_remove("UCT_TLS")
        .output()
        .expect("run perftest")
}

fn refused(args: &[&str], needle: &str) {
    let out = perftest(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in: {err}"
    );
    assert!(out.stdout.is_empty(), "{args:?} measured something");
}

#[test]
fn zero_iterations_are_refused() {
    refused(
        &["-t", "self", "-s", "8", "-n", "0"],
        "-n must be at least 1",
    );
}

#[test]
fn server_spin_given_to_a_client_is_refused() {
    refused(
        &["127.0.0.1", "-t", "posix", "--server-spin"],
        "give it to the server (--listen)",
    );
}

#[test]
fn a_zero_window_is_refused() {
    refused(
        &["-t", "self", "-s", "8", "-O", "0"],
        "-O must be at least 1",
    );
}

#[test]
fn a_large_latency_test_with_the_default_n_runs_a_bounded_time() {
    // 64 MiB round trips: 4 would move 256 MiB; the floor is 10. With the
    // old default (20,000 round trips, 2.5 TiB) this ran for hours.
    let started = Instant::now();
    let out = perftest(&[
        "-t", "self", "--test", "put_lat", "-s", "64M", "--format", "csv", "-f",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().last().expect("a result row");
    // test,transport,layout,size,iterations,...
    let iters: u64 = row
        .split(',')
        .nth(4)
        .and_then(|n| n.parse().ok())
        .expect("iterations");
    assert_eq!(iters, 10, "{row}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn an_explicit_n_is_honoured_for_a_large_latency_test() {
    let out = perftest(&[
        "-t", "self", "--test", "put_lat", "-s", "64M", "-n", "12", "--format", "csv", "-f",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().last().expect("a result row");
    let iters: u64 = row
        .split(',')
        .nth(4)
        .and_then(|n| n.parse().ok())
        .expect("iterations");
    assert_eq!(iters, 12, "{row}");
}
