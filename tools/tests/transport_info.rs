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

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn all_shows_self_and_the_loaded_example_module() {
    let output = run(&["-a"], &[]);
    assert!(output.status.success());
    let printed = stdout(&output);
    assert!(printed.contains("# Memory domain: self"), "{printed}");
    assert!(printed.contains("#      Transport: self"), "{printed}");
    assert!(printed.contains("put_zcopy:"), "{printed}");
    assert!(
        printed.contains("atomics: add, fetch-add, swap, compare-swap (32-bit, 64-bit)"),
        "{printed}"
    );
    let line = printed
        .lines()
        .find(|l| l.starts_with("# module example"))
        .unwrap_or_else(|| panic!("no example module line in:\n{printed}"));
    assert!(
        line.contains("loaded") && line.contains("libuct_example.so"),
        "{line}"
    );
    assert!(printed.contains("#      Transport: loop"), "{printed}");
}

#[test]
fn excluded_module_is_listed_as_not_loaded() {
    let printed = stdout(&run(&["-a"], &[("UCT_MODULES", "^example")]));
    let line = printed
        .lines()
        .find(|l| l.starts_with("# module example"))
        .expect("module line");
    assert!(line.contains("not loaded"), "{line}");
    assert!(
        printed.contains("reason: excluded by UCT_MODULES=^example"),
        "{printed}"
    );
    assert!(!printed.contains("Transport: loop"), "{printed}");
}

#[test]
fn wrong_fingerprint_module_is_listed_as_refused() {
    let dir = scratch_dir("ti-fingerprint");
    build_c_module("wrong_fingerprint.c", &dir.join("libuct_oldabi.so"), &[]).unwrap();
    let example = example_module_dir().unwrap();
    let path = format!("{}:{}", dir.display(), example.display());
    let output = run(&["-a"], &[("UCT_MODULE_DIR", &path)]);
    assert!(output.status.success());
    let printed = stdout(&output);
    let line = printed
        .lines()
        .find(|l| l.starts_with("# module oldabi"))
        .expect("oldabi line");
    assert!(line.contains("refused"), "{line}");
    assert!(
        printed.contains("reason: wrong ABI fingerprint"),
        "{printed}"
    );
    // The good module and the built-ins are unaffected.
    assert!(printed
        .lines()
        .any(|l| l.starts_with("# module example") && l.contains("loaded")));
}

#[test]
fn config_lists_every_variable_with_its_value() {
    let output = run(&["-c"], &[("UCT_TLS", "^tcp")]);
    let printed = stdout(&output);
    for var in [
        "UCT_TLS=^tcp",
        "UCT_MODULES=all",
        "UCT_LOG_LEVEL=warn",
        "UCT_NET_DEVICES=all",
        "UCT_BOOTSTRAP_TIMEOUT=30s",
    ] {
        assert!(
            printed.lines().any(|l| l == var),
            "{var} missing from:\n{printed}"
        );
    }
    assert!(printed.lines().any(|l| l.starts_with("UCT_MODULE_DIR=")));
    let full = stdout(&run(&["-c", "-f"], &[]));
    assert!(full.contains("# Transports to use"), "{full}");
    assert!(full.contains("# default: all; owner: core"), "{full}");
}

#[test]
fn misspelt_variable_warns_with_the_closest_name() {
    let output = run(&["-d"], &[("UCT_TSL", "x")]);
    assert!(output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("UCT_TSL") && err.contains("did you mean UCT_TLS?"),
        "stderr: {err}"
    );
}

#[test]
fn tls_allow_list_filters_transports() {
    let printed = stdout(&run(&["-d"], &[("UCT_TLS", "^self")]));
    assert!(!printed.contains("Transport: self"), "{printed}");
    assert!(printed.contains("Transport: loop"), "{printed}");
    assert!(
        printed.contains("self: excluded by UCT_TLS=^self"),
        "{printed}"
    );
}

#[test]
fn transport_filter_and_unknown_transport() {
    let printed = stdout(&run(&["-d", "-t", "loop"], &[]));
    assert!(
        printed.contains("Transport: loop") && !printed.contains("Transport: self"),
        "{printed}"
    );
    let output = run(&["-t", "nope"], &[]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("transport nope is not available"));
}

#[test]
fn json_is_parseable_and_complete() {
    let output = run(&["-a", "--json"], &[]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("valid JSON");
    assert_eq!(json["version"], uct_core::VERSION);
    let mds = json["memory_domains"].as_array().unwrap();
    assert!(mds.iter().any(|m| m["memory_domain"] == "self"));
    let mods = json["modules"]["modules"].as_array().unwrap();
    assert!(mods
        .iter()
        .any(|m| m["name"] == "example" && m["status"] == "loaded"));
    assert!(json["config"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "UCT_TLS"));
}

#[test]
fn version_build_and_usage() {
    assert!(stdout(&run(&["-v"], &[])).contains(uct_core::VERSION));
    assert!(stdout(&run(&["-b"], &[])).contains("module ABI fingerprint"));
    let output = run(&[], &[]);
    assert_eq!(output.status.code(), Some(2));
    let help = stdout(&run(&["--help"], &[]));
    for flag in ["-d", "-a", "-c", "-f", "-t", "-b", "--json", "-v"] {
        assert!(help.contains(flag), "--help does not explain {flag}");
    }
}

#[test]
fn invalid_value_names_the_variable_and_what_is_expected() {
    let output = run(&["-c"], &[("UCT_BOOTSTRAP_TIMEOUT", "soon")]);
    assert_eq!(output.status.code(), Some(1));
    let err = String::from_utf8_lossy(&output.stderr);
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
    let output = run(&["-a"], &[("UCT_MODULE_DIR", dir.to_str().unwrap())]);
    assert!(output.status.success());
    let printed = stdout(&output);
    let line = printed
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
        assert!(
            printed.contains("rc: component ib found no device"),
            "{printed}"
        );
    }
}

#[test]
fn ib_module_without_libibverbs_is_listed_with_the_loader_reason() {
    // Shadow libibverbs.so.1 in the library search path with a file that is
    // not a library: the loader refuses the module and says why.
    let dir = ib_module_dir();
    let shadow = test_suite::modules::scratch_dir("no-ibverbs");
    std::fs::write(shadow.join("libibverbs.so.1"), b"").unwrap();
    let output = run(
        &["-a"],
        &[
            ("UCT_MODULE_DIR", dir.to_str().unwrap()),
            ("LD_LIBRARY_PATH", shadow.to_str().unwrap()),
        ],
    );
    assert!(
        output.status.success(),
        "transport-info itself must not need libibverbs"
    );
    let printed = stdout(&output);
    let line = printed
        .lines()
        .find(|l| l.starts_with("# module ib"))
        .expect("ib module line");
    assert!(line.contains("failed"), "{line}");
    assert!(
        printed.contains("libibverbs.so.1"),
        "the reason does not name the library:\n{printed}"
    );
    // Everything else still works.
    assert!(
        printed.contains("Transport: self")
            && printed.contains("Transport: posix")
            && printed.contains("Transport: tcp"),
        "{printed}"
    );
}

#[test]
fn simulated_gaudi_devices_are_listed_with_dram_size_and_dmabuf_export() {
    let sim = hlthunk_sim::library_path().expect("libhlthunk_sim.so is built with the tests");
    let output = run(&["-d"], &[("UCT_GAUDI_HLTHUNK_LIB", sim.to_str().unwrap())]);
    assert!(output.status.success());
    let printed = stdout(&output);
    for dev in ["gaudi0", "gaudi1"] {
        let block: String = printed
            .split("# Memory domain: ")
            .find(|b| b.starts_with(&format!("{dev}\n")))
            .unwrap_or_else(|| panic!("no {dev} block in:\n{printed}"))
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
    let output = run(
        &["-d"],
        &[("UCT_GAUDI_HLTHUNK_LIB", "/nonexistent/libhl-thunk.so")],
    );
    assert!(output.status.success());
    let printed = stdout(&output);
    assert!(!printed.contains("# Memory domain: gaudi0"), "{printed}");
    let line = printed
        .lines()
        .find(|l| l.trim_start_matches('#').trim_start().starts_with("gaudi:"))
        .unwrap_or_else(|| panic!("no gaudi absence line in:\n{printed}"));
    assert!(line.contains("UCT_GAUDI_HLTHUNK_LIB"), "{line}");
}
