//! Path types between two PCI devices, as NCCL and `nvidia-smi topo -m`
//! name them, worked out from their ancestor chains.

use std::fmt;

use crate::sysfs::PciLocation;

/// How far apart two devices are on the PCIe fabric, nearest first (the
/// order is the ranking order).
///
/// ```
/// use uct_topo::PathType;
/// assert_eq!(PathType::Pix.to_string(), "PIX");
/// assert!(PathType::Pix < PathType::Sys);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// The same PCIe switch (at most one bridge between them), or the same
    /// device.
    Pix,
    /// Several PCIe switches, without crossing a host bridge.
    Pxb,
    /// Through the same PCIe host bridge (the CPU's root complex).
    Phb,
    /// Across host bridges (or PCI domains) within one NUMA node.
    Node,
    /// Across the socket interconnect: different NUMA nodes, or no node in
    /// common known.
    Sys,
}

impl PathType {
    /// Every path type, nearest first.
    pub const ALL: [PathType; 5] = [
        PathType::Pix,
        PathType::Pxb,
        PathType::Phb,
        PathType::Node,
        PathType::Sys,
    ];

    /// The short name: PIX, PXB, PHB, NODE or SYS.
    pub fn as_str(self) -> &'static str {
        match self {
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Node => "NODE",
            PathType::Sys => "SYS",
        }
    }

    /// One line saying what the type means (the legend of `--topo`).
    pub fn meaning(self) -> &'static str {
        match self {
            PathType::Pix => "the same PCIe switch (at most one bridge between them)",
            PathType::Pxb => "several PCIe switches, not crossing a host bridge",
            PathType::Phb => "through a PCIe host bridge (the CPU's root complex)",
            PathType::Node => "across host bridges or PCI domains within one NUMA node",
            PathType::Sys => "across the socket interconnect (different NUMA nodes)",
        }
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The path between two PCI devices: its type and the PCIe links crossed
/// (each side's links up to the common ancestor; across roots, up to each
/// root plus one between them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// Its type.
    pub kind: PathType,
    /// PCIe links crossed: the tie-break within one type.
    pub hops: u32,
}

/// Classifies the path between `a` and `b` from their ancestor chains (a
/// root `pciDDDD:BB` then every bridge down to the device itself).
pub(crate) fn between(a: &PciLocation, b: &PciLocation) -> Path {
    let (ca, cb) = (&a.chain, &b.chain);
    let common = ca.iter().zip(cb.iter()).take_while(|(x, y)| x == y).count();
    let below = |c: &Vec<String>| (c.len() - common) as u32;
    if common == 0 {
        // Different host bridges or PCI domains: up to each root, one hop
        // between the roots. The NUMA node decides NODE or SYS; both
        // unknown (a machine without NUMA) counts as the same node.
        let hops = (ca.len() as u32).saturating_sub(1) + (cb.len() as u32).saturating_sub(1) + 1;
        let kind = if a.numa_node == b.numa_node {
            PathType::Node
        } else {
            PathType::Sys
        };
        return Path { kind, hops };
    }
    let (da, db) = (below(ca), below(cb));
    if common == 1 {
        // Only the root in common: through the host bridge.
        return Path {
            kind: PathType::Phb,
            hops: da + db,
        };
    }
    // The deepest common ancestor is a bridge. Each side crossing at most
    // one more bridge (a switch's downstream port) means one switch.
    let kind = if da <= 2 && db <= 2 {
        PathType::Pix
    } else {
        PathType::Pxb
    };
    Path {
        kind,
        hops: da + db,
    }
}

/// The path from host memory on NUMA node `node` (None: any node) to the
/// device at `b`: through the host bridge on its node, across the socket
/// interconnect otherwise.
pub(crate) fn from_host(node: Option<u32>, b: &PciLocation) -> Path {
    let depth = (b.chain.len() as u32).saturating_sub(1);
    let same = match (node, b.numa_node) {
        (Some(n), Some(m)) => n == m,
        _ => true,
    };
    if same {
        Path {
            kind: PathType::Phb,
            hops: depth,
        }
    } else {
        Path {
            kind: PathType::Sys,
            hops: depth + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::Link;

    fn loc(chain: &str, numa: Option<u32>) -> PciLocation {
        let chain: Vec<String> = chain.split('/').map(String::from).collect();
        PciLocation {
            bus_id: chain.last().cloned().unwrap_or_default(),
            chain,
            numa_node: numa,
            link: Link::default(),
        }
    }

    #[test]
    fn same_switch_is_pix() {
        let gpu = loc(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            Some(0),
        );
        let nic = loc(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
            Some(0),
        );
        assert_eq!(
            between(&gpu, &nic),
            Path {
                kind: PathType::Pix,
                hops: 4
            }
        );
    }

    #[test]
    fn functions_of_one_device_are_pix() {
        let a = loc("pci0000:00/0000:00:01.0/0000:01:00.0", Some(0));
        let b = loc("pci0000:00/0000:00:01.0/0000:01:00.1", Some(0));
        assert_eq!(
            between(&a, &b),
            Path {
                kind: PathType::Pix,
                hops: 2
            }
        );
        assert_eq!(
            between(&a, &a),
            Path {
                kind: PathType::Pix,
                hops: 0
            }
        );
    }

    #[test]
    fn nested_switches_are_pxb() {
        let gpu = loc(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0",
            Some(0),
        );
        let nic = loc(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:06:00.0",
            Some(0),
        );
        assert_eq!(
            between(&gpu, &nic),
            Path {
                kind: PathType::Pxb,
                hops: 6
            }
        );
    }

    #[test]
    fn different_root_ports_are_phb() {
        let a = loc("pci0000:00/0000:00:01.0/0000:01:00.0", Some(0));
        let b = loc("pci0000:00/0000:00:02.0/0000:02:00.0", Some(0));
        assert_eq!(
            between(&a, &b),
            Path {
                kind: PathType::Phb,
                hops: 4
            }
        );
    }

    #[test]
    fn different_host_bridges_same_node_is_node_else_sys() {
        let a = loc("pci0000:00/0000:00:01.0/0000:01:00.0", Some(0));
        let b = loc("pci0000:40/0000:40:01.0/0000:41:00.0", Some(0));
        let c = loc("pci0000:80/0000:80:01.0/0000:81:00.0", Some(1));
        assert_eq!(
            between(&a, &b),
            Path {
                kind: PathType::Node,
                hops: 5
            }
        );
        assert_eq!(
            between(&a, &c),
            Path {
                kind: PathType::Sys,
                hops: 5
            }
        );
        // Unknown on one side: no node in common is known.
        let d = loc("pci0000:c0/0000:c0:01.0", None);
        assert_eq!(between(&a, &d).kind, PathType::Sys);
        // Unknown on both (a machine without NUMA): one node.
        let e = loc("pci0000:c0/0000:c0:02.0", None);
        assert_eq!(between(&d, &e).kind, PathType::Phb);
        let f = loc("pci0001:00/0001:00:02.0", None);
        assert_eq!(between(&d, &f).kind, PathType::Node);
    }

    #[test]
    fn separate_domains_are_node_or_sys_by_numa() {
        // GB200-like: the accelerator in its own domain.
        let gpu = loc("pci0008:00/0008:00:00.0/0008:01:00.0", Some(0));
        let near = loc("pci0000:00/0000:00:00.0/0000:01:00.0", Some(0));
        let far = loc("pci0010:00/0010:00:00.0/0010:01:00.0", Some(1));
        assert_eq!(between(&gpu, &near).kind, PathType::Node);
        assert_eq!(between(&gpu, &far).kind, PathType::Sys);
    }

    #[test]
    fn host_memory_is_phb_on_its_node_and_sys_elsewhere() {
        let nic = loc("pci0000:00/0000:00:01.0/0000:01:00.0", Some(1));
        assert_eq!(
            from_host(Some(1), &nic),
            Path {
                kind: PathType::Phb,
                hops: 2
            }
        );
        assert_eq!(
            from_host(Some(0), &nic),
            Path {
                kind: PathType::Sys,
                hops: 3
            }
        );
        assert_eq!(from_host(None, &nic).kind, PathType::Phb);
    }

    #[test]
    fn every_path_type_prints_its_short_name() {
        let names: Vec<String> = PathType::ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(names, ["PIX", "PXB", "PHB", "NODE", "SYS"]);
    }
}
