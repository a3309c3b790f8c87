//! `transport-info --topo`: with UCT_SYSFS_ROOT at each fixture tree its
//! output is the one checked in beside the fixture
//! (topo/fixtures/<name>/transport-info-topo.txt; `UCT_RS_BLESS=1`
//! rewrites them), and on this host it prints a matrix or says there is no
//! accelerator PCI device.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../topo/fixtures")
}

fn run(root: Option<&Path>, affinity: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_transport-info"));
    c.args(args)
        .env_remove("UCT_NIC_AFFINITY")
        .env_remove("UCT_SYSFS_ROOT");
    if let Some(r) = root {
        c.env("UCT_SYSFS_ROOT", r);
    }
    if let Some(a) = affinity {
        c.env("UCT_NIC_AFFINITY", a);
    }
    c.output().expect("transport-info runs")
}

fn stdout_ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "transport-info failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("UTF-8 output")
}

/// Compares `got` with the checked-in `file`, or rewrites it under bless.
fn check(file: &Path, got: &str) {
    if std::env::var_os("UCT_RS_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(file, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{}: {e}; create it with UCT_RS_BLESS=1", file.display()));
    assert_eq!(
        got,
        want,
        "transport-info --topo differs from {} (UCT_RS_BLESS=1 rewrites it if the change is meant)",
        file.display()
    );
}

#[test]
fn each_fixture_prints_its_checked_in_matrix() {
    for name in ["dgx-a800", "dgx-a100-4nic", "gb200"] {
        let dir = fixtures().join(name);
        let got = stdout_ok(&run(Some(&dir), None, &["--topo"]));
        assert!(got.contains("\ncuda0  "), "{name}: no matrix row:\n{got}");
        check(&dir.join("transport-info-topo.txt"), &got);
    }
}

#[test]
fn affinity_shows_in_the_order_and_a_bad_rule_fails_at_start() {
    let dir = fixtures().join("gb200");
    let got = stdout_ok(&run(Some(&dir), Some("cuda1=mlx5_1"), &["--topo"]));
    assert!(got.contains("(UCT_NIC_AFFINITY: cuda1=mlx5_1)"), "{got}");
    let row = got.lines().find(|l| l.starts_with("#   cuda1 ")).unwrap();
    assert!(row.contains("cuda1   mlx5_1(NODE) mlx5_0(NODE)"), "{row}");

    let o = run(Some(&dir), Some("cuda1=mlx5_1;gaudi0=mlx5_0"), &["--topo"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("names device gaudi0"), "{err}");
    let o = run(Some(&dir), Some("cuda1:mlx5_1"), &["--topo"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("malformed"));
}

#[test]
fn json_lists_the_nearest_nics() {
    let dir = fixtures().join("dgx-a100-4nic");
    let got = stdout_ok(&run(Some(&dir), None, &["--topo", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&got).unwrap();
    let first = &v["topology"]["accelerators"][6]["nics_nearest_first"][0];
    assert_eq!(first["name"], "mlx5_2");
    assert_eq!(first["path"], "PXB");
}

#[test]
fn a_missing_root_is_an_error_that_says_what_to_do() {
    let o = run(Some(Path::new("/nonexistent/uct-topo")), None, &["--topo"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("UCT_SYSFS_ROOT=/nonexistent/uct-topo"));
}

/// This host: a matrix when it has an accelerator and a NIC on PCI,
/// otherwise the line that says which is missing.
#[test]
fn this_host_prints_a_matrix_or_says_what_is_missing() {
    let got = stdout_ok(&run(None, None, &["--topo"]));
    let matrix = got.lines().any(|l| l.ends_with("NUMA  PCI"));
    let none = got.contains("# no accelerator PCI device") || got.contains("# no NIC PCI device");
    assert!(
        matrix != none,
        "expected a matrix or a no-device line:\n{got}"
    );
    assert!(
        got.starts_with("# PCIe topology (read from /sys)\n"),
        "{got}"
    );
    println!("{got}");
}
