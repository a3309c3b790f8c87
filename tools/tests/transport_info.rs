//! transport-info as a user runs it.

use std::process::{Command, Output};

use test_suite::modules::{build_c_module, example_module_dir, scratch_dir};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_transport-info"));
    cmd.args(args);
    // Start from a clean UCT_* environment.
    for (k, _) in std::env::vars() {
        if k.starts_with("UCT_") {
            cmd.env_remove(k);
        }
    }
    let dir = example_module_dir().expect("libuct_example.so is built with the tests");
    cmd.env("UCT_MODULE_DIR", dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run transport-info")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn all_shows_self_and_the_loaded_example_module() {
    let o = run(&["-a"], &[]);
    assert!(o.status.success());
    let s = stdout(&o);
    assert!(s.contains("# Memory domain: self"), "{s}");
    assert!(s.contains("#      Transport: self"), "{s}");
    assert!(s.contains("put_zcopy:"), "{s}");
    assert!(
        s.contains("atomics: add, fetch-add, swap, compare-swap (32-bit, 64-bit)"),
        "{s}"
    );
    let line = s
        .lines()
        .find(|l| l.starts_with("# module example"))
        .unwrap_or_else(|| panic!("no example module line in:\n{s}"));
    assert!(
        line.contains("loaded") && line.contains("libuct_example.so"),
        "{line}"
    );
    assert!(s.contains("#      Transport: loop"), "{s}");
}

#[test]
fn excluded_module_is_listed_as_not_loaded() {
    let s = stdout(&run(&["-a"], &[("UCT_MODULES", "^example")]));
    let line = s
        .lines()
        .find(|l| l.starts_with("# module example"))
        .expect("module line");
    assert!(line.contains("not loaded"), "{line}");
    assert!(
        s.contains("reason: excluded by UCT_MODULES=^example"),
        "{s}"
    );
    assert!(!s.contains("Transport: loop"), "{s}");
}

#[test]
fn wrong_fingerprint_module_is_listed_as_refused() {
    let dir = scratch_dir("ti-fingerprint");
    build_c_module("wrong_fingerprint.c", &dir.join("libuct_oldabi.so"), &[]).unwrap();
    let example = example_module_dir().unwrap();
    let path = format!("{}:{}", dir.display(), example.display());
    let o = run(&["-a"], &[("UCT_MODULE_DIR", &path)]);
    assert!(o.status.success());
    let s = stdout(&o);
    let line = s
        .lines()
        .find(|l| l.starts_with("# module oldabi"))
        .expect("oldabi line");
    assert!(line.contains("refused"), "{line}");
    assert!(s.contains("reason: wrong ABI fingerprint"), "{s}");
    // The good module and the built-ins are unaffected.
    assert!(s
        .lines()
        .any(|l| l.starts_with("# module example") && l.contains("loaded")));
}

#[test]
fn config_lists_every_variable_with_its_value() {
    let o = run(&["-c"], &[("UCT_TLS", "^tcp")]);
    let s = stdout(&o);
    for var in [
        "UCT_TLS=^tcp",
        "UCT_MODULES=all",
        "UCT_LOG_LEVEL=warn",
        "UCT_NET_DEVICES=all",
        "UCT_BOOTSTRAP_TIMEOUT=30s",
    ] {
        assert!(s.lines().any(|l| l == var), "{var} missing from:\n{s}");
    }
    assert!(s.lines().any(|l| l.starts_with("UCT_MODULE_DIR=")));
    let full = stdout(&run(&["-c", "-f"], &[]));
    assert!(full.contains("# Transports to use"), "{full}");
    assert!(full.contains("# default: all; owner: core"), "{full}");
}

#[test]
fn misspelt_variable_warns_with_the_closest_name() {
    let o = run(&["-d"], &[("UCT_TSL", "x")]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("UCT_TSL") && err.contains("did you mean UCT_TLS?"),
        "stderr: {err}"
    );
}

#[test]
fn tls_allow_list_filters_transports() {
    let s = stdout(&run(&["-d"], &[("UCT_TLS", "^self")]));
    assert!(!s.contains("Transport: self"), "{s}");
    assert!(s.contains("Transport: loop"), "{s}");
    assert!(s.contains("self: excluded by UCT_TLS=^self"), "{s}");
}

#[test]
fn transport_filter_and_unknown_transport() {
    let s = stdout(&run(&["-d", "-t", "loop"], &[]));
    assert!(
        s.contains("Transport: loop") && !s.contains("Transport: self"),
        "{s}"
    );
    let o = run(&["-t", "nope"], &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("transport nope is not available"));
}

#[test]
fn json_is_parseable_and_complete() {
    let o = run(&["-a", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(v["version"], uct_core::VERSION);
    let mds = v["memory_domains"].as_array().unwrap();
    assert!(mds.iter().any(|m| m["memory_domain"] == "self"));
    let mods = v["modules"]["modules"].as_array().unwrap();
    assert!(mods
        .iter()
        .any(|m| m["name"] == "example" && m["status"] == "loaded"));
    assert!(v["config"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "UCT_TLS"));
}

#[test]
fn version_build_and_usage() {
    assert!(stdout(&run(&["-v"], &[])).contains(uct_core::VERSION));
    assert!(stdout(&run(&["-b"], &[])).contains("module ABI fingerprint"));
    let o = run(&[], &[]);
    assert_eq!(o.status.code(), Some(2));
    let help = stdout(&run(&["--help"], &[]));
    for flag in ["-d", "-a", "-c", "-f", "-t", "-b", "--json", "-v"] {
        assert!(help.contains(flag), "--help does not explain {flag}");
    }
}

#[test]
fn invalid_value_names_the_variable_and_what_is_expected() {
    let o = run(&["-c"], &[("UCT_BOOTSTRAP_TIMEOUT", "soon")]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("UCT_BOOTSTRAP_TIMEOUT=soon") && err.contains("a duration"),
        "{err}"
    );
}

/// The folder holding libuct_ib.so built by cargo for these tests.
fn ib_module_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    for d in [deps.clone(), deps.parent().unwrap().to_path_buf()] {
        if d.join("libuct_ib.so").exists() {
            return d;
        }
    }
    panic!("libuct_ib.so is not built beside {}", deps.display());
}

#[test]
fn ib_module_loads_on_a_host_without_rdma_devices() {
    let dir = ib_module_dir();
    let o = run(&["-a"], &[("UCT_MODULE_DIR", dir.to_str().unwrap())]);
    assert!(o.status.success());
    let s = stdout(&o);
    let line = s
        .lines()
        .find(|l| l.starts_with("# module ib"))
        .expect("ib module line");
    assert!(
        line.contains("loaded") && line.contains("libuct_ib.so"),
        "{line}"
    );
    if std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        assert!(s.contains("rc: component ib found no device"), "{s}");
    }
}

#[test]
fn ib_module_without_libibverbs_is_listed_with_the_loader_reason() {
    // Shadow libibverbs.so.1 in the library search path with a file that is
    // not a library: the loader refuses the module and says why.
    let dir = ib_module_dir();
    let shadow = test_suite::modules::scratch_dir("no-ibverbs");
    std::fs::write(shadow.join("libibverbs.so.1"), b"").unwrap();
    let o = run(
        &["-a"],
        &[
            ("UCT_MODULE_DIR", dir.to_str().unwrap()),
            ("LD_LIBRARY_PATH", shadow.to_str().unwrap()),
        ],
    );
    assert!(
        o.status.success(),
        "transport-info itself must not need libibverbs"
    );
    let s = stdout(&o);
    let line = s
        .lines()
        .find(|l| l.starts_with("# module ib"))
        .expect("ib module line");
    assert!(line.contains("failed"), "{line}");
    assert!(
        s.contains("libibverbs.so.1"),
        "the reason does not name the library:\n{s}"
    );
    // Everything else still works.
    assert!(
        s.contains("Transport: self")
            && s.contains("Transport: posix")
            && s.contains("Transport: tcp"),
        "{s}"
    );
}

#[test]
fn simulated_gaudi_devices_are_listed_with_dram_size_and_dmabuf_export() {
    let sim = hlthunk_sim::library_path().expect("libhlthunk_sim.so is built with the tests");
    let o = run(&["-d"], &[("UCT_GAUDI_HLTHUNK_LIB", sim.to_str().unwrap())]);
    assert!(o.status.success());
    let s = stdout(&o);
    for dev in ["gaudi0", "gaudi1"] {
        let block: String = s
            .split("# Memory domain: ")
            .find(|b| b.starts_with(&format!("{dev}\n")))
            .unwrap_or_else(|| panic!("no {dev} block in:\n{s}"))
            .to_string();
        assert!(block.contains("16 GiB DRAM"), "{block}");
        assert!(block.contains("SIMULATED"), "{block}");
        assert!(block.contains("allocate: gaudi (max 16G)"), "{block}");
        assert!(block.contains("dma-buf export: gaudi"), "{block}");
        assert!(
            block.contains("flags: alloc, export_dmabuf, detect"),
            "{block}"
        );
    }
}

#[test]
fn without_hl_thunk_gaudi_is_listed_as_absent_with_the_reason() {
    let o = run(
        &["-d"],
        &[("UCT_GAUDI_HLTHUNK_LIB", "/nonexistent/libhl-thunk.so")],
    );
    assert!(o.status.success());
    let s = stdout(&o);
    assert!(!s.contains("# Memory domain: gaudi0"), "{s}");
    let line = s
        .lines()
        .find(|l| l.trim_start_matches('#').trim_start().starts_with("gaudi:"))
        .unwrap_or_else(|| panic!("no gaudi absence line in:\n{s}"));
    assert!(line.contains("UCT_GAUDI_HLTHUNK_LIB"), "{line}");
}
