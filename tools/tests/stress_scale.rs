//! `uct-stress scale` as a user runs it: a small run (1 and 64 endpoints)
//! on each transport it measures, its JSON checked field by field.

use std::process::Command;

use serde_json::Value;

const FIELDS: [&str; 8] = [
    "transport",
    "endpoints",
    "setup_us_per_endpoint",
    "rss_kib_per_endpoint",
    "peer_iface_us",
    "peer_iface_rss_kib",
    "idle_progress_ns",
    "msg_rate",
];

fn scale(transport: &str) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_uct-stress"))
        .args([
            "scale",
            "-t",
            transport,
            "--endpoints",
            "1,64",
            "--messages",
            "20000",
            "--progress-calls",
            "20000",
            "--json",
        ])
        .output()
        .expect("run uct-stress");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "uct-stress scale failed: {stderr}");
    let rows: Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    // Each row was also told on stderr as it was measured.
    assert_eq!(stderr.matches("scale: ").count(), 2, "{stderr}");
    rows.as_array().expect("a JSON array").clone()
}

fn number(row: &Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {row}"))
}

fn check(transport: &str) {
    let rows = scale(transport);
    assert_eq!(rows.len(), 2, "one row per count: {rows:?}");
    for (row, endpoints) in rows.iter().zip([1u64, 64]) {
        for field in FIELDS {
            assert!(row.get(field).is_some(), "{field} missing from {row}");
        }
        assert_eq!(row["transport"], transport);
        assert_eq!(row["endpoints"].as_u64(), Some(endpoints));
        let setup = number(row, "setup_us_per_endpoint");
        assert!(setup > 0.0 && setup < 1e6, "setup {setup} us per endpoint");
        let rss = number(row, "rss_kib_per_endpoint");
        assert!((0.0..65536.0).contains(&rss), "{rss} KiB per endpoint");
        let open = number(row, "peer_iface_us");
        assert!(open > 0.0 && open < 1e7, "{open} us to open a peer iface");
        // Under 64 MiB per peer: a posix peer iface maps a 1 MiB ring.
        let peer_rss = number(row, "peer_iface_rss_kib");
        assert!(
            (0.0..65536.0).contains(&peer_rss),
            "{peer_rss} KiB per peer iface"
        );
        let idle = number(row, "idle_progress_ns");
        assert!(idle > 0.0 && idle < 1e6, "idle progress {idle} ns");
        let rate = number(row, "msg_rate");
        assert!(rate > 100.0, "{rate} messages per second");
    }
    // Timings are noisy on a shared 2-core machine: the 2x bar is in
    // docs/scale.md; here only that progress does not scan per endpoint
    // wildly (before the fix, 64 idle endpoints cost 10x one on posix and
    // 25x on tcp).
    let (one, many) = (
        number(&rows[0], "idle_progress_ns"),
        number(&rows[1], "idle_progress_ns"),
    );
    assert!(
        many <= 10.0 * one.max(1.0),
        "{transport}: idle progress {one} ns with 1 endpoint, {many} ns with 64"
    );
}

#[test]
fn self_scale_reports_every_field() {
    check("self");
}

#[test]
fn posix_scale_reports_every_field() {
    check("posix");
}

#[test]
fn tcp_scale_reports_every_field() {
    check("tcp");
}

#[test]
fn zero_endpoints_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_uct-stress"))
        .args(["scale", "-t", "self", "--endpoints", "0"])
        .output()
        .expect("run uct-stress");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("count of 0"), "{stderr}");
}
