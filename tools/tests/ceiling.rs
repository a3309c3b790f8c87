//! `uct-stress ceiling`: the machine's own bounds, as JSON, are sane
//! figures (positive, finite, one per measure and size) and bad sizes are
//! refused by name.

use std::process::Command;

fn stress(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uct-stress"))
        .args(args)
        .output()
        .expect("uct-stress runs")
}

#[test]
fn ceiling_json_has_every_measure_with_positive_figures() {
    let out = stress(&["ceiling", "--sizes", "4k", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "uct-stress ceiling failed: {stderr}");
    let rows: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is the JSON array");
    let rows = rows.as_array().expect("an array of ceilings");
    let mut seen = Vec::new();
    for r in rows {
        let what = r["what"].as_str().expect("what");
        let value = r["value"].as_f64().expect("value");
        let batches = r["batches"].as_array().expect("batches");
        assert!(
            value.is_finite() && value > 0.0,
            "{what}: value {value} is not a positive figure"
        );
        assert_eq!(batches.len(), 5, "{what}: every timed batch is reported");
        let size = r["size"].as_u64().expect("size");
        if what != "cacheline_pingpong" && what != "atomic_pingpong" {
            assert_eq!(size, 4096, "{what}: the size asked for");
        }
        seen.push(what.to_string());
    }
    for m in [
        "cacheline_pingpong",
        "atomic_pingpong",
        "memcpy",
        "process_vm_writev",
        "tcp_stream",
        "tcp_pingpong",
    ] {
        assert!(seen.iter().any(|s| s == m), "{m} missing from {seen:?}");
    }
}

#[test]
fn ceiling_refuses_a_bad_size_by_name() {
    for (size, says) in [
        ("0", "at least 1 byte"),
        ("lots", "is not a size"),
        ("2g", "1 GiB"),
    ] {
        let out = stress(&["ceiling", "--sizes", size]);
        assert!(!out.status.success(), "--sizes {size} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "--sizes {size}: {err}");
    }
}
