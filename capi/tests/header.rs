//! include/uct_rs.h is generated from the crate by cbindgen and checked
//! in; this test fails when it is stale, and rewrites it with
//! UCT_RS_BLESS=1.

use std::path::Path;

#[test]
fn the_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("capi/cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen cannot generate the header: {e}"));
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("cbindgen writes UTF-8");
    let path = dir.join("include/uct_rs.h");
    if std::env::var_os("UCT_RS_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "the header is stale: run UCT_RS_BLESS=1 cargo test -p uct-capi --test header{}",
        first_difference(&checked_in, &fresh)
    );
}

/// Where the two texts first differ, for the failure message.
fn first_difference(old: &str, new: &str) -> String {
    let line = old
        .lines()
        .zip(new.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| old.lines().count().min(new.lines().count()));
    format!(
        "\n(first difference at line {}: checked in {:?}, generated {:?})",
        line + 1,
        old.lines().nth(line).unwrap_or("<end>"),
        new.lines().nth(line).unwrap_or("<end>")
    )
}
