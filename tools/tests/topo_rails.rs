//! Rails nearest the memory, end to end through transfer-bench: with
//! UCT_SYSFS_ROOT at a tree that puts tcp's second device nearer host
//! memory than its first, `--rails 2` takes them in that order; a
//! malformed or dangling UCT_NIC_AFFINITY, or a missing UCT_SYSFS_ROOT,
//! fails the build by name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bench(root: Option<&Path>, affinity: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_transfer-bench"));
    c.env_remove("UCT_TLS")
        .env_remove("UCT_NET_DEVICES")
        .env_remove("UCT_TRANSFER_RAILS")
        .env_remove("UCT_TRANSFER_STRIPE_MIN")
        .env_remove("UCT_SYSFS_ROOT")
        .env_remove("UCT_NIC_AFFINITY");
    if let Some(r) = root {
        c.env("UCT_SYSFS_ROOT", r);
    }
    if let Some(a) = affinity {
        c.env("UCT_NIC_AFFINITY", a);
    }
    c.args(args).output().expect("run transfer-bench")
}

const TWO_RAILS: [&str; 9] = [
    "-t",
    "tcp",
    "--rails",
    "2",
    "-s",
    "1M",
    "--validate",
    "-n",
    "4",
];

/// The devices tcp lists here, in its order.
fn tcp_devices() -> Vec<String> {
    uct_transfer::Transport::probe()
        .into_iter()
        .filter(|p| p.transport == "tcp" && p.usable)
        .filter_map(|p| p.device)
        .collect()
}

struct Tree(PathBuf);

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tree where `far` sits four links below its host bridge and `near`
/// one: for host memory, `near` ranks first.
fn tree(far: &str, near: &str) -> Tree {
    let dir = std::env::temp_dir().join(format!("uct-topo-rails-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layout = format!(
        "net {far} 0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0 numa=0 speed=16.0 width=16\n\
         net {near} 0000:00:02.0 numa=0 speed=16.0 width=16\n"
    );
    uct_topo::fixture::build(&layout, &dir).unwrap();
    Tree(dir)
}

fn rail_devices(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("rail "))
        .filter_map(|l| Some(l.split_once('(')?.1.split_once(')')?.0.to_string()))
        .collect()
}

#[test]
fn rails_follow_the_topology_order() {
    let devs = tcp_devices();
    if devs.len() < 2 {
        println!(
            "skipped rails_follow_the_topology_order: tcp lists {} device(s) here ({}); it needs two",
            devs.len(),
            devs.join(", ")
        );
        return;
    }
    let (first, second) = (devs[0].clone(), devs[1].clone());
    // The tree puts the transport's first device far, its second near.
    let t = tree(&first, &second);
    let out = bench(Some(&t.0), None, &TWO_RAILS);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rail_devices(&out), [second.clone(), first.clone()]);
    // The affinity rule puts the far one first again.
    let out = bench(Some(&t.0), Some(&format!("host={first}")), &TWO_RAILS);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rail_devices(&out), [first, second]);
}

#[test]
fn bad_affinity_or_root_fails_the_build_by_name() {
    let refused = |root: Option<&Path>, affinity: Option<&str>, words: &[&str]| {
        let out = bench(root, affinity, &TWO_RAILS);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{affinity:?}: ran\n{err}");
        for w in words {
            assert!(err.contains(w), "{affinity:?}: {err:?} does not say {w:?}");
        }
    };
    refused(None, Some("gaudi9=eth0"), &["UCT_NIC_AFFINITY", "gaudi9"]);
    refused(None, Some("host=nosuchnic0"), &["nosuchnic0"]);
    refused(None, Some("host"), &["malformed"]);
    refused(
        Some(Path::new("/nonexistent/uct-topo")),
        None,
        &["UCT_SYSFS_ROOT=/nonexistent/uct-topo"],
    );
}
