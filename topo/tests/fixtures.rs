//! The three fixture trees: each checked-in tree is what its layout
//! builds, and each ranks its NICs as its `nvidia-smi topo -m` table says
//! (the table is in the fixture's README.md). `UCT_RS_BLESS=1` rebuilds
//! the trees from their layouts.

use std::path::{Path, PathBuf};

use uct_topo::{fixture, Affinity, PathType, TopoError, Topology};

const FIXTURES: [&str; 3] = ["dgx-a800", "dgx-a100-4nic", "gb200"];

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn topo(name: &str) -> Topology {
    Topology::from_root(dir(name), None).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// NIC names for `device`, best first.
fn order(t: &Topology, device: &str) -> Vec<String> {
    t.nics_for(device)
        .unwrap_or_else(|e| panic!("{device}: {e}"))
        .into_iter()
        .map(|c| c.name)
        .collect()
}

/// The path types of `device` to each NIC, in the table's column order.
fn row(t: &Topology, device: &str, nics: &[&str]) -> Vec<String> {
    nics.iter()
        .map(|n| t.path(device, n).unwrap().kind.to_string())
        .collect()
}

fn split(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn checked_in_trees_are_what_their_layouts_build() {
    let bless = std::env::var_os("UCT_RS_BLESS").is_some_and(|v| v == "1");
    for name in FIXTURES {
        let layout = std::fs::read_to_string(dir(name).join("layout")).unwrap();
        if bless {
            let _ = std::fs::remove_dir_all(dir(name).join("sys"));
            fixture::build(&layout, &dir(name)).unwrap();
        }
        let tmp = std::env::temp_dir().join(format!("uct-topo-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        fixture::build(&layout, &tmp).unwrap();
        let want = fixture::listing(&tmp);
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(
            fixture::listing(&dir(name)),
            want,
            "topo/fixtures/{name}/sys differs from its layout: rebuild it with UCT_RS_BLESS=1 cargo test -p uct-topo --test fixtures -- --test-threads=1"
        );
    }
}

/// NVIDIA/nccl issue 933: GPUi is PIX with one NIC, NODE with the other
/// NICs of its node, SYS with the other node's.
#[test]
fn dgx_a800_matches_its_table() {
    let t = topo("dgx-a800");
    assert_eq!(t.accelerators().len(), 8);
    assert_eq!(t.nics().len(), 9);
    let cols = [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8",
    ];
    let table = [
        "NODE SYS PIX SYS NODE SYS NODE SYS NODE",
        "NODE SYS NODE SYS PIX SYS NODE SYS NODE",
        "NODE SYS NODE SYS NODE SYS PIX SYS NODE",
        "NODE SYS NODE SYS NODE SYS NODE SYS PIX",
        "SYS PIX SYS NODE SYS NODE SYS NODE SYS",
        "SYS NODE SYS PIX SYS NODE SYS NODE SYS",
        "SYS NODE SYS NODE SYS PIX SYS NODE SYS",
        "SYS NODE SYS NODE SYS NODE SYS PIX SYS",
    ];
    for (g, want) in table.iter().enumerate() {
        assert_eq!(row(&t, &format!("cuda{g}"), &cols), split(want), "GPU{g}");
    }
    // Written out from the table: the PIX NIC, then the node's NICs (mlx5_0
    // first: one link up to its root port, the others three), then the
    // other node's, by name.
    let want = [
        "mlx5_2 mlx5_0 mlx5_4 mlx5_6 mlx5_8 mlx5_1 mlx5_3 mlx5_5 mlx5_7",
        "mlx5_4 mlx5_0 mlx5_2 mlx5_6 mlx5_8 mlx5_1 mlx5_3 mlx5_5 mlx5_7",
        "mlx5_6 mlx5_0 mlx5_2 mlx5_4 mlx5_8 mlx5_1 mlx5_3 mlx5_5 mlx5_7",
        "mlx5_8 mlx5_0 mlx5_2 mlx5_4 mlx5_6 mlx5_1 mlx5_3 mlx5_5 mlx5_7",
        "mlx5_1 mlx5_3 mlx5_5 mlx5_7 mlx5_0 mlx5_2 mlx5_4 mlx5_6 mlx5_8",
        "mlx5_3 mlx5_1 mlx5_5 mlx5_7 mlx5_0 mlx5_2 mlx5_4 mlx5_6 mlx5_8",
        "mlx5_5 mlx5_1 mlx5_3 mlx5_7 mlx5_0 mlx5_2 mlx5_4 mlx5_6 mlx5_8",
        "mlx5_7 mlx5_1 mlx5_3 mlx5_5 mlx5_0 mlx5_2 mlx5_4 mlx5_6 mlx5_8",
    ];
    for (g, want) in want.iter().enumerate() {
        assert_eq!(order(&t, &format!("cuda{g}")), split(want), "GPU{g}");
    }
    // The bus id names the same GPU.
    assert_eq!(order(&t, "0000:13:00.0"), order(&t, "cuda0"));
    // Host memory on node 1: that node's NICs through its host bridges.
    let host = t.nics_for("numa:1").unwrap();
    assert_eq!(host[0].path, PathType::Phb);
    assert_eq!(
        host.iter().map(|c| c.name.as_str()).collect::<Vec<_>>()[..4],
        ["mlx5_1", "mlx5_3", "mlx5_5", "mlx5_7"]
    );
    assert!(host[4..].iter().all(|c| c.path == PathType::Sys));
}

/// NVIDIA/nccl issue 1435: each pair of GPUs shares one NIC two switches
/// away (PXB); every other NIC is on another NUMA node (SYS).
#[test]
fn dgx_a100_4nic_matches_its_table() {
    let t = topo("dgx-a100-4nic");
    assert_eq!(t.accelerators().len(), 8);
    assert_eq!(t.nics().len(), 4);
    // The table's columns NIC0, NIC1, NIC2, NIC5 (NIC3 and NIC4 left out).
    let cols = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_5"];
    let table = [
        "SYS PXB SYS SYS",
        "SYS PXB SYS SYS",
        "PXB SYS SYS SYS",
        "PXB SYS SYS SYS",
        "SYS SYS SYS PXB",
        "SYS SYS SYS PXB",
        "SYS SYS PXB SYS",
        "SYS SYS PXB SYS",
    ];
    for (g, want) in table.iter().enumerate() {
        assert_eq!(row(&t, &format!("cuda{g}"), &cols), split(want), "GPU{g}");
    }
    let want = [
        "mlx5_1 mlx5_0 mlx5_2 mlx5_5",
        "mlx5_1 mlx5_0 mlx5_2 mlx5_5",
        "mlx5_0 mlx5_1 mlx5_2 mlx5_5",
        "mlx5_0 mlx5_1 mlx5_2 mlx5_5",
        "mlx5_5 mlx5_0 mlx5_1 mlx5_2",
        "mlx5_5 mlx5_0 mlx5_1 mlx5_2",
        "mlx5_2 mlx5_0 mlx5_1 mlx5_5",
        "mlx5_2 mlx5_0 mlx5_1 mlx5_5",
    ];
    for (g, want) in want.iter().enumerate() {
        assert_eq!(order(&t, &format!("cuda{g}")), split(want), "GPU{g}");
    }
    // Two GPUs, one NIC: both rank it first, with the same hops.
    let (a, b) = (t.nics_for("cuda6").unwrap(), t.nics_for("cuda7").unwrap());
    assert_eq!((a[0].path, a[0].hops), (PathType::Pxb, 6));
    assert_eq!(a[0], b[0]);
}

/// sgl-project/sglang issue 11208: nvidia-smi says SYS for every GPU-NIC
/// pair on GB200 (the GPUs sit in PCI domains of their own); by NUMA node
/// the socket's own NICs come first (NODE), the other socket's after (SYS).
#[test]
fn gb200_ranks_the_sockets_own_nics_first() {
    let t = topo("gb200");
    assert_eq!(t.accelerators().len(), 4);
    assert_eq!(t.nics().len(), 6);
    let cols = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"];
    let near0 = "NODE NODE SYS SYS NODE SYS";
    let near1 = "SYS SYS NODE NODE SYS NODE";
    for (g, want) in [near0, near0, near1, near1].iter().enumerate() {
        assert_eq!(row(&t, &format!("cuda{g}"), &cols), split(want), "GPU{g}");
    }
    let s0 = "mlx5_0 mlx5_1 mlx5_4 mlx5_2 mlx5_3 mlx5_5";
    let s1 = "mlx5_2 mlx5_3 mlx5_5 mlx5_0 mlx5_1 mlx5_4";
    for (g, want) in [s0, s0, s1, s1].iter().enumerate() {
        assert_eq!(order(&t, &format!("cuda{g}")), split(want), "GPU{g}");
    }
    // PCIe cannot tell GPU0's NIC from GPU1's on one socket: the affinity
    // rule pairs them, and the rest stay ranked after.
    let rules = Affinity::parse("cuda0=mlx5_0;cuda1=mlx5_1;0018:01:00.0=ibP3p1s0").unwrap();
    let t = t.with_affinity(Some(rules)).unwrap();
    assert_eq!(
        order(&t, "cuda1"),
        split("mlx5_1 mlx5_0 mlx5_4 mlx5_2 mlx5_3 mlx5_5")
    );
    assert_eq!(order(&t, "cuda2")[0], "mlx5_2");
    assert_eq!(t.ranked("cuda1").unwrap()[0].name, "mlx5_0");
}

#[test]
fn affinity_naming_a_missing_device_fails_by_name() {
    let t = topo("dgx-a800");
    let err = |rules: &str| {
        t.clone()
            .with_affinity(Some(Affinity::parse(rules).unwrap()))
            .unwrap_err()
    };
    match err("cuda0=mlx5_2;gaudi0=mlx5_0") {
        TopoError::AffinityUnknownDevice { device, .. } => assert_eq!(device, "gaudi0"),
        e => panic!("expected an unknown device, got {e}"),
    }
    match err("cuda0=mlx5_2,mlx5_9") {
        TopoError::AffinityUnknownNic { nic, .. } => assert_eq!(nic, "mlx5_9"),
        e => panic!("expected an unknown NIC, got {e}"),
    }
    assert!(err("numa:5=mlx5_0").to_string().contains("numa:5"));
    // A NIC by its interface name is the NIC.
    let t = t
        .with_affinity(Some(Affinity::parse("numa:0=ibp20s0").unwrap()))
        .unwrap();
    assert_eq!(t.nics_for("numa:0").unwrap()[0].name, "mlx5_2");
}

#[test]
fn every_fixture_lists_lo_as_without_pci_device() {
    for name in FIXTURES {
        let t = topo(name);
        let names: Vec<&str> = t.without_pci().iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["lo"], "{name}");
        assert!(t.notes().is_empty(), "{name}: {:?}", t.notes());
    }
}
