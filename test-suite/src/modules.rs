//! Builds the broken module files the loader tests need, from the C
//! sources in `test-suite/modules/`, with the system C compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Folder of the C sources.
pub fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("modules")
}

/// Compiles `src` (a file in [`sources`]) into `out` as a shared library.
pub fn build_c_module(src: &str, out: &Path, extra: &[&str]) -> Result<(), String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(sources().join(src))
        .args(extra)
        .status()
        .map_err(|e| format!("cannot run the C compiler {cc}: {e}; install gcc"))?;
    if !status.success() {
        return Err(format!("{cc} failed to build {src}"));
    }
    Ok(())
}

/// A fresh empty folder under the target folder.
pub fn scratch_dir(name: &str) -> PathBuf {
    let base = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(std::env::temp_dir)
        .join("uct-test-scratch")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("create scratch folder");
    base
}

/// The folder holding `libuct_example.so` built by cargo for tests.
pub fn example_module_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_path_buf();
    for _ in 0..2 {
        if dir.join("libuct_example.so").exists() {
            return Some(dir);
        }
        if dir.join("deps/libuct_example.so").exists() {
            return Some(dir.join("deps"));
        }
        dir = dir.parent()?.to_path_buf();
    }
    None
}
