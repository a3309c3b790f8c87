//! dmabuf-demo as a user runs it, over tcp on loopback (rc runs in the VM:
//! tests/rc_vm.rs): both sides verify every phase and exit 0; failures are
//! one line and exit 1.

use std::process::{Command, Output, Stdio};

fn demo(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dmabuf-demo"));
    cmd.args(args).env_remove("UCT_TLS");
    cmd
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
    let server_child = demo(server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let client_out = demo(client).output().expect("run the client");
    (
        server_child.wait_with_output().expect("server exit"),
        client_out,
    )
}

#[test]
fn server_and_client_verify_every_phase_over_tcp() {
    let port = port();
    let common = [
        "-t", "tcp", "-d", "lo", "-p", &port, "-s", "128k", "-n", "4",
    ];
    let mut sv = vec!["server"];
    sv.extend(common);
    let mut cl = vec!["client", "127.0.0.1"];
    cl.extend(common);
    let (server_out, client_out) = pair(&sv, &cl);
    let out = text(&client_out.stdout);
    assert!(
        server_out.status.success() && client_out.status.success(),
        "client:\n{out}{}\nserver:\n{}{}",
        text(&client_out.stderr),
        text(&server_out.stdout),
        text(&server_out.stderr)
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
    let port = port();
    let (server_out, client_out) = pair(
        &["server", "-t", "tcp", "-d", "lo", "-p", &port, "-s", "64k"],
        &[
            "client",
            "127.0.0.1",
            "-t",
            "tcp",
            "-d",
            "lo",
            "-p",
            &port,
            "-s",
            "1M",
        ],
    );
    assert_eq!(client_out.status.code(), Some(1));
    assert_eq!(server_out.status.code(), Some(1));
    let stderr = text(&client_out.stderr);
    assert!(
        stderr.contains("refused") && stderr.contains("same -s and -n"),
        "{stderr}"
    );
}

#[test]
fn no_server_is_a_timeout_that_names_the_address() {
    let port = port();
    let output = demo(&[
        "client",
        "127.0.0.1",
        "-t",
        "tcp",
        "-d",
        "lo",
        "-p",
        &port,
        "--timeout",
        "1",
    ])
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("timed out") && stderr.contains(&format!("127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn gaudi_memory_on_tcp_says_a_dmabuf_nic_is_needed() {
    let sim = hlthunk_sim::library_path().expect("simulator built");
    let output = demo(&[
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
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("RDMA NIC with DMA-buf support"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

#[test]
fn help_explains_roles_and_options() {
    let output = demo(&["--help"]).output().unwrap();
    let help = text(&output.stdout);
    assert!(output.status.success());
    for word in ["server", "client", "Exit status"] {
        assert!(help.contains(word), "{word} in:\n{help}");
    }
    let output = demo(&["client", "--help"]).output().unwrap();
    let help = text(&output.stdout);
    for word in [
        "--device",
        "--ib-port",
        "--gid-index",
        "--size",
        "--iters",
        "--mem",
    ] {
        assert!(help.contains(word), "{word} in:\n{help}");
    }
}
