//! dmabuf-demo as a user runs it, over tcp on loopback (rc runs in the VM:
//! tests/rc_vm.rs): both sides verify every phase and exit 0; failures are
//! one line and exit 1.

use std::process::{Command, Output, Stdio};

fn demo(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dmabuf-demo"));
    c.args(args).env_remove("UCT_TLS");
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

fn pair(server: &[&str], client: &[&str]) -> (Output, Output) {
    let s = demo(server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let c = demo(client).output().expect("run the client");
    (s.wait_with_output().expect("server exit"), c)
}

#[test]
fn server_and_client_verify_every_phase_over_tcp() {
    let p = port();
    let common = ["-t", "tcp", "-d", "lo", "-p", &p, "-s", "128k", "-n", "4"];
    let mut sv = vec!["server"];
    sv.extend(common);
    let mut cl = vec!["client", "127.0.0.1"];
    cl.extend(common);
    let (s, c) = pair(&sv, &cl);
    let out = text(&c.stdout);
    assert!(
        s.status.success() && c.status.success(),
        "client:\n{out}{}\nserver:\n{}{}",
        text(&c.stderr),
        text(&s.stdout),
        text(&s.stderr)
    );
    for line in [
        "send/recv:  4 round trips",
        "rdma write: 4 x 131072 bytes verified by read-back and by the server",
        "rdma read:  4 x 131072 bytes verified",
        "ALL PHASES VERIFIED",
    ] {
        assert!(out.contains(line), "{line} in:\n{out}");
    }
}

#[test]
fn mismatched_sizes_are_refused_by_the_server() {
    let p = port();
    let (s, c) = pair(
        &["server", "-t", "tcp", "-d", "lo", "-p", &p, "-s", "64k"],
        &[
            "client",
            "127.0.0.1",
            "-t",
            "tcp",
            "-d",
            "lo",
            "-p",
            &p,
            "-s",
            "1M",
        ],
    );
    assert_eq!(c.status.code(), Some(1));
    assert_eq!(s.status.code(), Some(1));
    let e = text(&c.stderr);
    assert!(e.contains("refused") && e.contains("same -s and -n"), "{e}");
}

#[test]
fn no_server_is_a_timeout_that_names_the_address() {
    let p = port();
    let o = demo(&[
        "client",
        "127.0.0.1",
        "-t",
        "tcp",
        "-d",
        "lo",
        "-p",
        &p,
        "--timeout",
        "1",
    ])
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(
        e.contains("timed out") && e.contains(&format!("127.0.0.1:{p}")),
        "{e}"
    );
}

#[test]
fn gaudi_memory_on_tcp_says_a_dmabuf_nic_is_needed() {
    let sim = hlthunk_sim::library_path().expect("simulator built");
    let o = demo(&[
        "server",
        "-t",
        "tcp",
        "-d",
        "lo",
        "-p",
        &port(),
        "-m",
        "gaudi",
    ])
    .env("UCT_GAUDI_HLTHUNK_LIB", sim)
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(e.contains("RDMA NIC with DMA-buf support"), "{e}");
    assert_eq!(e.lines().count(), 1, "one line: {e}");
}

#[test]
fn help_explains_roles_and_options() {
    let o = demo(&["--help"]).output().unwrap();
    let h = text(&o.stdout);
    assert!(o.status.success());
    for w in ["server", "client", "Exit status"] {
        assert!(h.contains(w), "{w} in:\n{h}");
    }
    let o = demo(&["client", "--help"]).output().unwrap();
    let h = text(&o.stdout);
    for w in [
        "--device",
        "--ib-port",
        "--gid-index",
        "--size",
        "--iters",
        "--mem",
    ] {
        assert!(h.contains(w), "{w} in:\n{h}");
    }
}
