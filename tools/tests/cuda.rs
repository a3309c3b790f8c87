//! The tools where there is no GPU (CI, and most machines here), with the
//! cuda module (libuct_cuda.so) beside them: the cuda memory domains are
//! listed as not available with the loader's reason, and perftest refuses
//! cuda_copy with that reason and exit status 2. The driver is made absent
//! on purpose (`UCT_CUDA_LIB` names a file that does not exist), so these
//! hold on a machine with a GPU too. What needs a GPU is in tl-cuda's
//! tests/gpu.rs, skipped by name without one.

use std::path::PathBuf;
use std::process::{Command, Output};

const NO_DRIVER: &str = "/nonexistent/libcuda.so.1";

/// The folder of the cuda module: the tools' deps/ folder, where every
/// build of tl-cuda (a dev-dependency of the tools, built, not linked)
/// writes it; the copy beside the tools is made only when the workspace or
/// tl-cuda itself was built, so it can be older. Beside the tools when
/// deps/ has none.
fn module_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_transport-info"))
        .parent()
        .expect("the tools' folder")
        .to_path_buf();
    let found = [dir.join("deps"), dir.clone()]
        .into_iter()
        .find(|d| d.join("libuct_cuda.so").exists());
    found.unwrap_or_else(|| {
        panic!(
            "libuct_cuda.so is in neither {} nor its deps/: build the workspace, or `cargo build -p tl-cuda`",
            dir.display()
        )
    })
}

fn run(bin: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("UCT_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("UCT_MODULE_DIR", module_dir())
        .env("UCT_CUDA_LIB", NO_DRIVER)
        .output()
        .expect("run the tool")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn transport_info_lists_cuda_as_not_available_with_the_loaders_reason() {
    let out = run(env!("CARGO_BIN_EXE_transport-info"), &["-a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let module = printed
        .lines()
        .find(|l| l.starts_with("# module cuda "))
        .unwrap_or_else(|| panic!("no cuda module line in:\n{printed}"));
    assert!(
        module.contains("loaded") && module.contains("libuct_cuda.so"),
        "{module}"
    );
    let absent_mds = printed
        .split("# Memory domains not available")
        .nth(1)
        .unwrap_or_else(|| panic!("no section of absent memory domains in:\n{printed}"));
    let line = absent_mds
        .lines()
        .find(|l| l.trim_start_matches('#').trim_start().starts_with("cuda:"))
        .unwrap_or_else(|| panic!("cuda is not among the absent memory domains:\n{printed}"));
    for want in ["cannot load", NO_DRIVER, "No such file", "UCT_CUDA_LIB"] {
        assert!(line.contains(want), "no '{want}' in: {line}");
    }
    let transport = printed
        .lines()
        .find(|l| {
            l.trim_start_matches('#')
                .trim_start()
                .starts_with("cuda_copy:")
        })
        .unwrap_or_else(|| panic!("cuda_copy is not among the absent transports:\n{printed}"));
    assert!(transport.contains(NO_DRIVER), "{transport}");
    assert!(!printed.contains("# Memory domain: cuda0"), "{printed}");
}

#[test]
fn transport_info_json_has_the_same_reason() {
    let out = run(env!("CARGO_BIN_EXE_transport-info"), &["-a", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let absent = v["absent_memory_domains"]
        .as_array()
        .expect("absent_memory_domains");
    let cuda = absent
        .iter()
        .find(|a| a["component"] == "cuda")
        .unwrap_or_else(|| panic!("no cuda entry in {absent:?}"));
    assert!(
        cuda["reason"]
            .as_str()
            .is_some_and(|r| r.contains(NO_DRIVER)),
        "{cuda}"
    );
}

#[test]
fn perftest_refuses_cuda_copy_with_the_reason_and_exit_2() {
    for mem in ["host,cuda", "cuda,host"] {
        let out = run(
            env!("CARGO_BIN_EXE_perftest"),
            &["-t", "cuda_copy", "-m", mem],
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "-m {mem}: {err}");
        assert!(
            err.contains("cuda_copy") && err.contains("cannot load") && err.contains(NO_DRIVER),
            "-m {mem}: {err}"
        );
        assert!(text(&out.stdout).is_empty(), "nothing measured");
    }
}

#[test]
fn perftest_refuses_cuda_memory_a_transport_cannot_move() {
    let out = run(
        env!("CARGO_BIN_EXE_perftest"),
        &["-t", "tcp", "-m", "host,cuda"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("tcp cannot use cuda memory"), "{err}");
}

#[test]
fn dmabuf_demo_takes_cuda_memory_and_names_what_is_missing() {
    let out = run(
        env!("CARGO_BIN_EXE_dmabuf-demo"),
        &["server", "-t", "tcp", "-m", "cuda", "-p", "0"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        !err.contains("not supported here"),
        "-m cuda is refused: {err}"
    );
    assert!(
        err.contains("cuda memory") && err.contains(NO_DRIVER),
        "{err}"
    );
}
