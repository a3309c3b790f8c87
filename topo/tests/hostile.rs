//! Odd or hostile sysfs trees (UCT_SYSFS_ROOT may point anywhere): a FIFO
//! where an attribute should be, a huge file, bytes that are not UTF-8, a
//! link loop, a device folder linking back to its ancestor. Discovery
//! never hangs, never panics, reads no file whole that is not an
//! attribute, and notes what it skipped.

use std::fs;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use uct_topo::{fixture, Topology};

mod common;
use common::Tree;

const LAYOUT: &str = "
nodes 0 1
gpu   -      0000:00:01.0/0000:01:00.0 numa=0 speed=16.0 width=16
ib    mlx5_0 0000:00:02.0/0000:02:00.0 numa=0 speed=16.0 width=16
ib    mlx5_1 0000:00:03.0/0000:03:00.0 numa=1 speed=16.0 width=16
";

const GPU: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
const MLX0: &str = "devices/pci0000:00/0000:00:02.0/0000:02:00.0";
const MLX1: &str = "devices/pci0000:00/0000:00:03.0/0000:03:00.0";

/// Discovery of `root` on another thread, failing (not hanging) after 20 s.
fn discover_within(root: &Path) -> Topology {
    let (tx, rx) = mpsc::channel();
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(Topology::from_root(&root, None));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("discovery hung (a FIFO read?) or panicked")
        .expect("discovery of an odd tree is not an error")
}

fn mkfifo(p: &Path) {
    let _ = fs::remove_file(p);
    let ok = std::process::Command::new("mkfifo")
        .arg(p)
        .status()
        .expect("mkfifo runs")
        .success();
    assert!(ok, "mkfifo {}", p.display());
}

#[test]
fn a_fifo_where_an_attribute_should_be_is_skipped_not_read() {
    let t = Tree::new("fifo", LAYOUT);
    // Opening a FIFO for reading blocks until a writer comes: never.
    mkfifo(&t.sys(&format!("{MLX0}/numa_node")));
    mkfifo(&t.sys(&format!("{GPU}/vendor")));
    let topo = discover_within(t.root());
    assert_eq!(topo.nic("mlx5_0").unwrap().pci.numa_node, None);
    assert_eq!(topo.nic("mlx5_1").unwrap().pci.numa_node, Some(1));
    // A GPU whose vendor cannot be read is not taken for one.
    assert!(topo.accelerators().is_empty());
    let notes = topo.notes().join("\n");
    assert!(
        notes.contains("numa_node is not a regular file") && notes.contains("vendor"),
        "{notes}"
    );
    // The fixture listing skips it too.
    let (tx, rx) = mpsc::channel();
    let root = t.root().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(fixture::listing(&root));
    });
    let listing = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("listing hung on a FIFO");
    assert!(listing.contains("not a regular file"), "{listing}");
}

#[test]
fn a_huge_or_non_utf8_attribute_is_noted_and_not_read_whole() {
    let t = Tree::new("huge", LAYOUT);
    // 16 MiB of zeros (sparse): no attribute is that large.
    let f = fs::File::create(t.sys(&format!("{MLX0}/current_link_width"))).unwrap();
    f.set_len(16 << 20).unwrap();
    fs::write(t.sys(&format!("{MLX1}/numa_node")), [0xff, 0xfe, b'1']).unwrap();
    let topo = discover_within(t.root());
    let m0 = topo.nic("mlx5_0").unwrap();
    assert_eq!(m0.pci.link.width, None);
    assert_eq!(m0.pci.link.speed_gts, Some(16.0));
    assert_eq!(topo.nic("mlx5_1").unwrap().pci.numa_node, None);
    let notes = topo.notes();
    let total: usize = notes.iter().map(String::len).sum();
    assert!(
        total < 4096,
        "notes of {total} bytes: the file was read whole"
    );
    let all = notes.join("\n");
    assert!(all.contains("current_link_width holds more than"), "{all}");
    assert!(all.contains("numa_node is not UTF-8"), "{all}");
    // Ranking still works.
    assert_eq!(topo.nics_for("cuda0").unwrap().len(), 2);
}

#[test]
fn link_loops_and_a_device_linking_to_its_ancestor_neither_hang_nor_panic() {
    let t = Tree::new("loops", LAYOUT);
    // A device link that points at itself.
    fs::create_dir_all(t.sys("class/net/loop0")).unwrap();
    std::os::unix::fs::symlink("device", t.sys("class/net/loop0/device")).unwrap();
    // Two links pointing at each other.
    fs::create_dir_all(t.sys("class/infiniband/loop1")).unwrap();
    std::os::unix::fs::symlink("other", t.sys("class/infiniband/loop1/device")).unwrap();
    std::os::unix::fs::symlink("device", t.sys("class/infiniband/loop1/other")).unwrap();
    // An attribute that is a link loop.
    let width = t.sys(&format!("{MLX1}/current_link_width"));
    fs::remove_file(&width).unwrap();
    std::os::unix::fs::symlink("current_link_width", &width).unwrap();
    // A folder under a device that links back to the device's root, and a
    // device whose own folder repeats its name below it.
    std::os::unix::fs::symlink("../..", t.sys(&format!("{MLX0}/up"))).unwrap();
    let again = t.sys(&format!("{MLX0}/0000:02:00.0"));
    fs::create_dir_all(&again).unwrap();
    std::os::unix::fs::symlink(
        format!("../../../{MLX0}/0000:02:00.0"),
        t.sys("class/net/eth9/device")
            .parent()
            .map(|p| {
                fs::create_dir_all(p).unwrap();
                p.join("device")
            })
            .unwrap(),
    )
    .unwrap();
    let topo = discover_within(t.root());
    for name in ["loop0", "loop1"] {
        let d = topo
            .without_pci()
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("{name} not reported: {:?}", topo.without_pci()));
        assert!(d.reason.contains("cannot be followed"), "{}", d.reason);
    }
    assert_eq!(topo.nic("mlx5_1").unwrap().pci.link.width, None);
    // eth9 sits on the same PCI function as mlx5_0: one of its names.
    assert!(topo.nic("eth9").is_some_and(|n| n.name == "mlx5_0"));
    assert_eq!(topo.nics_for("host").unwrap().len(), 2);
}
