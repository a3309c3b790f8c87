//! Small trees built in a temporary folder: naming, tie-breaks, software
//! devices, and missing or garbled sysfs files (never a panic).

use std::fs;

use uct_topo::{fixture, Affinity, PathType, TopoError, Topology};

mod common;
use common::Tree;

/// Discovery of the tree, which must succeed.
fn discover(t: &Tree) -> Topology {
    Topology::from_root(t.root(), None).unwrap()
}

/// Writes a sysfs file of the tree.
fn write(t: &Tree, rel: &str, content: &str) {
    fs::write(t.sys(rel), content).unwrap();
}

const GAUDI: &str = "
nodes 0 1
hl    hl0    0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0 numa=0 speed=16.0 width=16
hl    hl1    0000:80:01.0/0000:81:00.0 numa=1 speed=16.0 width=16
ib    mlx5_0 0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0 numa=0 speed=16.0 width=16
ib    mlx5_1 0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0 numa=0 speed=16.0 width=8
ib    mlx5_2 0000:00:02.0/0000:06:00.0 numa=0 speed=16.0 width=16
ib    mlx5_3 0000:40:01.0/0000:41:00.0 numa=0 speed=16.0 width=16
ib    mlx5_4 0000:80:01.0/0000:81:00.1 numa=1 speed=16.0 width=16
net   eth0   0000:c0:01.0/0000:c1:00.0 numa=1 speed=8.0 width=4
soft  rxe0   infiniband
soft  dummy0 net
";

#[test]
fn every_path_type_and_the_bandwidth_tie_break() {
    let t = Tree::new("gaudi", GAUDI);
    let topo = discover(&t);
    let names: Vec<&str> = topo
        .accelerators()
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(names, ["gaudi0", "gaudi1"]);
    let got: Vec<(String, PathType, u32)> = topo
        .nics_for("gaudi0")
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.path, c.hops))
        .collect();
    let want = [
        // Same switch: the x16 NIC before the x8 one.
        ("mlx5_0", PathType::Pix, 4),
        ("mlx5_1", PathType::Pix, 4),
        // Another root port of the same host bridge.
        ("mlx5_2", PathType::Phb, 6),
        // Another host bridge on node 0.
        ("mlx5_3", PathType::Node, 7),
        // Node 1: tied on type and hops, the faster link first.
        ("mlx5_4", PathType::Sys, 7),
        ("eth0", PathType::Sys, 7),
    ];
    let want: Vec<(String, PathType, u32)> = want
        .iter()
        .map(|(n, p, h)| (n.to_string(), *p, *h))
        .collect();
    assert_eq!(got, want);
    let bw = topo.nics_for("gaudi0").unwrap();
    assert!(bw[0].bandwidth_mbps > bw[1].bandwidth_mbps);
    assert_eq!(bw[4].bandwidth_mbps, Some(252_061));
    assert_eq!(bw[5].bandwidth_mbps, Some(31_507));
    // A function of the same device as gaudi1.
    assert_eq!(topo.path("gaudi1", "mlx5_4").unwrap().kind, PathType::Pix);
    // Two switches: nested below one.
    let pxb = Tree::new(
        "pxb",
        "hl hl0 0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0\n\
         ib mlx5_0 0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:06:00.0",
    );
    assert_eq!(
        discover(&pxb).path("gaudi0", "mlx5_0").unwrap().kind,
        PathType::Pxb
    );
}

#[test]
fn software_devices_have_no_pci_device_and_are_no_error() {
    let t = Tree::new("soft", GAUDI);
    let topo = discover(&t);
    let soft: Vec<(&str, &str)> = topo
        .without_pci()
        .iter()
        .map(|d| (d.name.as_str(), d.class.as_str()))
        .collect();
    assert_eq!(soft, [("rxe0", "infiniband"), ("dummy0", "net")]);
    assert!(topo.nic("rxe0").is_none());
    let rules = Affinity::parse("gaudi0=rxe0").unwrap();
    match topo.with_affinity(Some(rules)) {
        Err(TopoError::AffinityUnknownNic { nic, .. }) => assert_eq!(nic, "rxe0"),
        other => panic!("expected rxe0 refused, got {other:?}"),
    }
}

#[test]
fn accel_class_names_and_one_name_per_device() {
    let t = Tree::new(
        "accel",
        "hl hl0 0000:00:01.0/0000:01:00.0\naccel accel0 0000:00:01.0/0000:01:00.0\naccel accel1 0000:00:02.0/0000:02:00.0\ngpu - 0000:00:03.0/0000:03:00.0",
    );
    let topo = discover(&t);
    let names: Vec<&str> = topo
        .accelerators()
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(names, ["gaudi0", "accel1", "cuda0"]);
    assert!(topo.nics_for("accel0").is_err());
    assert!(topo.nics_for("0000:01:00.0").is_ok());
    assert!(topo.nics_for("0000:03:00.0").is_ok());
}

#[test]
fn host_memory_ranks_by_node() {
    let t = Tree::new("host", GAUDI);
    let topo = discover(&t);
    let on1 = topo.nics_for("numa:1").unwrap();
    assert_eq!(
        on1.iter()
            .map(|c| c.name.as_str())
            .take(2)
            .collect::<Vec<_>>(),
        ["mlx5_4", "eth0"]
    );
    assert!(on1[..2].iter().all(|c| c.path == PathType::Phb));
    assert!(on1[2..].iter().all(|c| c.path == PathType::Sys));
    let any = topo.nics_for("host").unwrap();
    assert!(any.iter().all(|c| c.path == PathType::Phb));
    match topo.nics_for("numa:7") {
        Err(TopoError::UnknownDevice { name, known }) => {
            assert_eq!(name, "numa:7");
            assert!(
                known.contains("gaudi0 (0000:03:00.0)") && known.contains("numa:1"),
                "{known}"
            );
        }
        other => panic!("expected numa:7 unknown, got {other:?}"),
    }
}

#[test]
fn missing_and_garbled_files_are_unknown_not_errors() {
    let t = Tree::new("garbled", GAUDI);
    let dev = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0";
    write(&t, &format!("{dev}/numa_node"), "zero\n");
    write(&t, &format!("{dev}/current_link_speed"), "fast\n");
    write(&t, &format!("{dev}/current_link_width"), "\u{0}\u{1}");
    let dev1 = "devices/pci0000:00/0000:00:02.0/0000:06:00.0";
    fs::remove_file(t.sys(dev1).join("numa_node")).unwrap();
    write(&t, &format!("{dev1}/current_link_speed"), "Unknown\n");
    // A dangling device link, and a class entry that is a plain file.
    fs::create_dir_all(t.sys("class/infiniband/mlx5_9")).unwrap();
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:ee/0000:ee:00.0",
        t.sys("class/infiniband/mlx5_9/device"),
    )
    .unwrap();
    fs::write(t.sys("class/net/junk"), "x").unwrap();
    // A GPU whose class file is garbage is not a GPU.
    fs::create_dir_all(t.sys("devices/pci0000:f0/0000:f0:00.0")).unwrap();
    fs::write(t.sys("devices/pci0000:f0/0000:f0:00.0/class"), "display").unwrap();
    fs::write(t.sys("devices/pci0000:f0/0000:f0:00.0/vendor"), "0x10de").unwrap();
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:f0/0000:f0:00.0",
        t.sys("bus/pci/devices/0000:f0:00.0"),
    )
    .unwrap();

    let topo = discover(&t);
    let m0 = topo.nic("mlx5_0").unwrap();
    assert_eq!(m0.pci.numa_node, None);
    assert_eq!(m0.pci.link.bandwidth_mbps(), None);
    let m2 = topo.nic("mlx5_2").unwrap();
    assert_eq!((m2.pci.numa_node, m2.pci.link.speed_gts), (None, None));
    assert_eq!(topo.notes().len(), 3, "{:?}", topo.notes());
    assert!(topo.notes()[0].contains("\"zero\""), "{:?}", topo.notes());
    let dangling = topo
        .without_pci()
        .iter()
        .find(|d| d.name == "mlx5_9")
        .unwrap();
    assert!(
        dangling.reason.contains("cannot be followed"),
        "{}",
        dangling.reason
    );
    assert!(topo.without_pci().iter().any(|d| d.name == "junk"));
    assert_eq!(topo.accelerators().len(), 2);
    // Ranking still works; the unknown node counts as not node 0.
    let r = topo.nics_for("gaudi0").unwrap();
    assert_eq!(r[0].name, "mlx5_1");
    assert_eq!(
        r.iter().find(|c| c.name == "mlx5_0").unwrap().path,
        PathType::Pix
    );
}

#[test]
fn an_empty_or_missing_root_is_handled() {
    let empty = std::env::temp_dir().join(format!("uct-topo-{}-empty", std::process::id()));
    fs::create_dir_all(&empty).unwrap();
    let topo = Topology::from_root(&empty, None).unwrap();
    assert!(topo.accelerators().is_empty() && topo.nics().is_empty());
    assert!(topo.nics_for("host").unwrap().is_empty());
    fs::remove_dir_all(&empty).unwrap();
    match Topology::from_root("/nonexistent/uct-topo", None) {
        Err(e @ TopoError::Root { .. }) => {
            assert!(
                e.to_string()
                    .contains("UCT_SYSFS_ROOT=/nonexistent/uct-topo"),
                "{e}"
            )
        }
        other => panic!("expected a root error, got {other:?}"),
    }
}

#[test]
fn a_bad_layout_line_is_named() {
    let dir = std::env::temp_dir().join(format!("uct-topo-{}-bad", std::process::id()));
    let e = fixture::build("ib mlx5_0 0000:00:01.0 speed", &dir).unwrap_err();
    assert!(
        e.contains("line 1") && e.contains("unknown option speed"),
        "{e}"
    );
    let e = fixture::build("\nswitch x", &dir).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
    let _ = fs::remove_dir_all(&dir);
}
