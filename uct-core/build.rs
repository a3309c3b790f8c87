//! Records what the module ABI fingerprint needs: the exact compiler, the
//! target, the profile and a hash of uct-core's own source (so that a module
//! built from another revision of uct-core is refused, not misread).
use std::path::Path;
use std::process::Command;

fn hash_path(path: &Path, h: &mut u64) {
    if let Ok(rd) = std::fs::read_dir(path) {
        let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            hash_path(&p, h);
        }
    } else if let Ok(bytes) = std::fs::read(path) {
        // FNV-1a over name and contents.
        let name = path.file_name().unwrap_or_default().as_encoded_bytes();
        for b in name.iter().chain(&bytes) {
            *h ^= *b as u64;
            *h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
}

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(&rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "rustc-unknown".into());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown-target".into());
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    hash_path(Path::new("src"), &mut h);
    hash_path(Path::new("Cargo.toml"), &mut h);
    println!("cargo:rustc-env=UCT_RUSTC_VERSION={version}");
    println!("cargo:rustc-env=UCT_TARGET={target}");
    println!("cargo:rustc-env=UCT_PROFILE={profile}");
    println!("cargo:rustc-env=UCT_SOURCE_HASH={h:016x}");
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
}
