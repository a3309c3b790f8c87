//! transfer-bench as a user runs it: JSON with bytes per second over posix
//! and tcp, validation that passes and that catches a corrupted write, two
//! processes over tcp, a mismatch refused, Gaudi memory refused at
//! registration, and a dead receiver that ends the run with an error; and
//! the same with a window of writes in flight (`-O N`), in one process and
//! in two.

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_transfer-bench"));
    c.env_remove("UCT_TLS").env_remove("UCT_NET_DEVICES");
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

/// The JSON document of a successful run, with its results checked: one
/// per size, each with bytes per second and times above zero.
fn results(output: &Output, sizes: &[u64]) -> serde_json::Value {
    assert!(output.status.success(), "{}", text(&output.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&output.stdout)));
    let rows = doc["results"].as_array().expect("a results array");
    assert_eq!(rows.len(), sizes.len(), "{doc}");
    for (row, &size) in rows.iter().zip(sizes) {
        assert_eq!(row["size"].as_u64(), Some(size), "{row}");
        assert!(row["iterations"].as_u64().unwrap() >= 1, "{row}");
        for field in ["bytes_per_second", "real_time_us", "cpu_time_us"] {
            assert!(row[field].as_f64().unwrap() > 0.0, "{field}: {row}");
        }
    }
    doc
}

#[test]
fn posix_and_tcp_print_json_with_bytes_per_second() {
    for tl in ["posix", "tcp"] {
        let output = run(&["-t", tl, "-s", "1M", "--format", "json"]);
        let doc = results(&output, &[1 << 20]);
        assert_eq!(doc["header"]["transport"], tl, "{doc}");
        assert_eq!(doc["header"]["mode"], "one process", "{doc}");
    }
}

#[test]
fn validation_passes_in_one_process_with_either_progress() {
    for tl in ["posix", "tcp"] {
        for progress in ["manual", "thread"] {
            let output = run(&[
                "-t",
                tl,
                "-s",
                "8k,1M",
                "-n",
                "30",
                "--validate",
                "--progress",
                progress,
                "--format",
                "json",
            ]);
            let doc = results(&output, &[8192, 1 << 20]);
            assert_eq!(doc["header"]["validate"], true);
            assert_eq!(doc["header"]["progress"], progress);
        }
    }
}

#[test]
fn validation_catches_a_corrupted_write() {
    let output = run(&[
        "-t",
        "posix",
        "-s",
        "8k",
        "-n",
        "20",
        "-w",
        "5",
        "--validate",
        "--inject-corruption",
        "12",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let err = text(&output.stderr);
    assert!(
        err.contains("validation FAILED at size 8192, iteration 12"),
        "{err}"
    );
}

fn listen(args: &[&str], stderr: Stdio) -> Child {
    let child = bench()
        .arg("--listen")
        .args(args)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    // The receiver binds its port before it prints; give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    child
}

/// Runs the sender with `args` against `server`, which corrupts write
/// `iter`: the run fails, naming it.
fn corruption_caught(args: &[&str], server: &mut Child, iter: u32) {
    let output = run(args);
    let _ = exit_within(server, Duration::from_secs(30));
    assert_eq!(output.status.code(), Some(1));
    let err = text(&output.stderr);
    assert!(
        err.contains(&format!(
            "validation FAILED at size 65536, iteration {iter}"
        )),
        "{err}"
    );
}

/// Waits for `child` up to `limit`; kills it past that.
fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn two_processes_over_tcp_with_validation() {
    let port = free_port();
    let common = ["-t", "tcp", "-d", "lo", "-p", &port, "-s", "8k,1M"];
    let mut server = listen(&common, Stdio::piped());
    let mut args = vec!["127.0.0.1"];
    args.extend(common);
    args.extend(["-n", "50", "--validate", "--format", "json"]);
    let output = run(&args);
    let st = exit_within(&mut server, Duration::from_secs(30));
    let doc = results(&output, &[8192, 1 << 20]);
    assert!(st.is_some_and(|s| s.success()), "the receiver failed");
    assert_eq!(doc["header"]["mode"], "two processes", "{doc}");
}

#[test]
fn a_corrupted_write_is_caught_by_the_other_process() {
    let port = free_port();
    let common = ["-t", "tcp", "-d", "lo", "-p", &port, "-s", "64k"];
    let mut server = listen(&common, Stdio::null());
    let mut args = vec!["127.0.0.1"];
    args.extend(common);
    args.extend([
        "-n",
        "20",
        "-w",
        "5",
        "--validate",
        "--min-time",
        "0.05",
        "--inject-corruption",
        "12",
    ]);
    corruption_caught(&args, &mut server, 12);
}

#[test]
fn a_mismatch_is_refused_on_both_sides() {
    let port = free_port();
    let mut server = listen(
        &["-t", "tcp", "-d", "lo", "-p", &port, "-s", "8k"],
        Stdio::piped(),
    );
    let output = run(&[
        "127.0.0.1",
        "-t",
        "posix",
        "-p",
        &port,
        "-s",
        "16k",
        "-n",
        "10",
    ]);
    let st = exit_within(&mut server, Duration::from_secs(30)).expect("the receiver exits");
    assert!(!output.status.success());
    let err = text(&output.stderr);
    assert!(err.contains("the peer refused the run"), "{err}");
    assert!(
        err.contains("transport (-t): client posix, server tcp"),
        "{err}"
    );
    assert!(err.contains("sizes (-s): client 16K, server 8K"), "{err}");
    assert!(err.contains("start both sides with the same"), "{err}");
    assert!(!st.success());
}

#[test]
fn gaudi_memory_on_posix_is_refused_at_registration() {
    let sim = hlthunk_sim::library_path().expect("simulator built");
    let output = bench()
        .args(["-t", "posix", "-m", "gaudi", "-s", "8k"])
        .env("UCT_GAUDI_HLTHUNK_LIB", sim)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    let err = text(&output.stderr);
    assert!(
        err.contains("posix cannot use gaudi memory")
            && err.contains("needs an RDMA NIC with DMA-buf support"),
        "{err}"
    );
}

#[test]
fn a_receiver_killed_mid_run_ends_the_run_with_an_error() {
    let port = free_port();
    let common = ["-t", "tcp", "-d", "lo", "-p", &port, "-s", "64k"];
    let mut server = listen(&common, Stdio::null());
    let mut client = bench()
        .arg("127.0.0.1")
        .args(common)
        .args(["-n", "100000000", "--timeout", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    server.kill().unwrap();
    server.wait().unwrap();
    let st = exit_within(&mut client, Duration::from_secs(40)).expect("the sender ends");
    assert!(!st.success());
    let mut err = String::new();
    std::io::Read::read_to_string(client.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("transfer-bench:"), "{err}");
}

#[test]
fn a_window_of_writes_in_one_process() {
    for tl in ["posix", "tcp"] {
        let output = run(&[
            "-t", tl, "-s", "8k,1M", "-O", "8", "-n", "200", "--format", "json",
        ]);
        let doc = results(&output, &[8192, 1 << 20]);
        assert_eq!(doc["header"]["outstanding"], 8, "{doc}");
        assert_eq!(doc["header"]["mode"], "one process", "{doc}");
        assert!(
            doc["header"]["real_time"]
                .as_str()
                .unwrap()
                .contains("elapsed time / writes"),
            "{doc}"
        );
        for row in doc["results"].as_array().unwrap() {
            assert_eq!(row["iterations"], 200, "{row}");
        }
    }
}

#[test]
fn a_validated_window_in_one_process_with_either_progress() {
    for tl in ["posix", "tcp"] {
        for progress in ["manual", "thread"] {
            let output = run(&[
                "-t",
                tl,
                "-s",
                "8k,256k",
                "-O",
                "16",
                "-n",
                "100",
                "--validate",
                "--progress",
                progress,
                "--format",
                "json",
            ]);
            let doc = results(&output, &[8192, 256 << 10]);
            assert_eq!(doc["header"]["validate"], true);
            assert_eq!(doc["header"]["outstanding"], 16);
        }
    }
}

#[test]
fn a_validated_window_catches_a_corrupted_write_in_one_process() {
    let output = run(&[
        "-t",
        "tcp",
        "-s",
        "8k",
        "-O",
        "8",
        "-n",
        "40",
        "-w",
        "5",
        "--validate",
        "--inject-corruption",
        "21",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let err = text(&output.stderr);
    assert!(
        err.contains("validation FAILED at size 8192, iteration 21"),
        "{err}"
    );
}

#[test]
fn a_window_of_writes_in_two_processes() {
    // posix without validation (every write to one slot), tcp with (a slot
    // per write in flight, each answered once checked).
    for (tl, validate) in [("posix", false), ("tcp", true)] {
        let port = free_port();
        let common = ["-t", tl, "-p", &port, "-s", "8k,1M"];
        let mut server = listen(&common, Stdio::piped());
        let mut args = vec!["127.0.0.1"];
        args.extend(common);
        args.extend(["-O", "32", "-n", "100", "--format", "json"]);
        if validate {
            args.push("--validate");
        }
        let output = run(&args);
        let st = exit_within(&mut server, Duration::from_secs(30));
        let doc = results(&output, &[8192, 1 << 20]);
        assert!(st.is_some_and(|s| s.success()), "the {tl} receiver failed");
        assert_eq!(doc["header"]["mode"], "two processes", "{doc}");
        assert_eq!(doc["header"]["outstanding"], 32, "{doc}");
        assert_eq!(doc["header"]["validate"], validate, "{doc}");
    }
}

#[test]
fn a_validated_window_catches_a_corrupted_write_in_the_other_process() {
    let port = free_port();
    let common = ["-t", "tcp", "-d", "lo", "-p", &port, "-s", "64k"];
    let mut server = listen(&common, Stdio::null());
    let mut args = vec!["127.0.0.1"];
    args.extend(common);
    args.extend([
        "-O",
        "8",
        "-n",
        "40",
        "-w",
        "5",
        "--validate",
        "--inject-corruption",
        "30",
    ]);
    corruption_caught(&args, &mut server, 30);
}

#[test]
fn a_window_out_of_range_is_refused() {
    let output = run(&["-t", "posix", "-s", "8k", "-O", "0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("-O 0 asked"),
        "{}",
        text(&output.stderr)
    );
    let output = run(&["-t", "posix", "-s", "64M", "-O", "32", "--validate"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("fewer writes in flight"),
        "{}",
        text(&output.stderr)
    );
}
