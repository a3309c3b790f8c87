//! Finding the accelerators and NICs of a sysfs tree.

use std::collections::BTreeSet;

use crate::sysfs::{natural, PciLocation, Sysfs};

/// NVIDIA's PCI vendor id.
const NVIDIA: u32 = 0x10de;

/// An accelerator with a PCI device.
#[derive(Debug, Clone, PartialEq)]
pub struct Accelerator {
    /// Its name: `gaudiN` (habanalabs `hlN`), `accelN` (the accel class),
    /// `cudaN` (NVIDIA GPUs in PCI bus id order, as CUDA's PCI order
    /// numbers them).
    pub name: String,
    /// Where it sits.
    pub pci: PciLocation,
}

/// A NIC with a PCI device.
#[derive(Debug, Clone, PartialEq)]
pub struct Nic {
    /// Its name: the RDMA device (`mlx5_0`) if it has one, else the network
    /// interface (`eth0`).
    pub name: String,
    /// The network interfaces on the same PCI function (`ibp26s0`, `eth2`):
    /// other names it answers to.
    pub netdevs: Vec<String>,
    /// Where it sits.
    pub pci: PciLocation,
}

impl Nic {
    /// Whether `name` is this NIC's name or one of its interfaces.
    pub fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.netdevs.iter().any(|n| n == name)
    }
}

/// A device of interest that has no PCI device (rxe, lo, dummy, a tap):
/// reported, never an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoPciDevice {
    /// Its name.
    pub name: String,
    /// Its sysfs class: `infiniband`, `net`, `accel` or `habanalabs`.
    pub class: String,
    /// Why it has no PCI device: none, or its link could not be followed.
    pub reason: String,
}

/// What a sysfs tree holds.
pub(crate) struct Found {
    pub accelerators: Vec<Accelerator>,
    pub nics: Vec<Nic>,
    pub no_pci: Vec<NoPciDevice>,
    pub numa_nodes: BTreeSet<u32>,
}

pub(crate) fn find(fs: &mut Sysfs) -> Found {
    let mut found = Found {
        accelerators: Vec::new(),
        nics: Vec::new(),
        no_pci: Vec::new(),
        numa_nodes: BTreeSet::new(),
    };
    accelerators(fs, &mut found);
    nics(fs, &mut found);
    for n in fs.list("devices/system/node") {
        if let Some(i) = n.strip_prefix("node").and_then(|i| i.parse().ok()) {
            found.numa_nodes.insert(i);
        }
    }
    let located = found
        .accelerators
        .iter()
        .map(|a| &a.pci)
        .chain(found.nics.iter().map(|n| &n.pci));
    for p in located {
        if let Some(n) = p.numa_node {
            found.numa_nodes.insert(n);
        }
    }
    found
}

/// The PCI device behind `class/<class>/<name>/device`, or the reason
/// there is none (recorded in `found.no_pci`).
fn located(fs: &mut Sysfs, found: &mut Found, class: &str, name: &str) -> Option<PciLocation> {
    let reason = match fs.pci_of(&format!("class/{class}/{name}/device")) {
        Ok(Some(p)) => return Some(p),
        Ok(None) => "no PCI device".to_string(),
        Err(e) => e,
    };
    found.no_pci.push(NoPciDevice {
        name: name.to_string(),
        class: class.to_string(),
        reason,
    });
    None
}

fn accelerators(fs: &mut Sysfs, found: &mut Found) {
    for hl in fs.list("class/habanalabs") {
        // hl0, hl1; hl_controlD0 and the like are the same device again.
        let Some(index) = hl.strip_prefix("hl").filter(|i| i.parse::<u32>().is_ok()) else {
            continue;
        };
        if let Some(pci) = located(fs, found, "habanalabs", &hl) {
            found.accelerators.push(Accelerator {
                name: format!("gaudi{index}"),
                pci,
            });
        }
    }
    for accel in fs.list("class/accel") {
        if !accel.starts_with("accel") {
            continue;
        }
        if let Some(pci) = located(fs, found, "accel", &accel) {
            // A Gaudi on a new kernel shows in both classes: one name.
            if !found
                .accelerators
                .iter()
                .any(|a| a.pci.bus_id == pci.bus_id)
            {
                found.accelerators.push(Accelerator { name: accel, pci });
            }
        }
    }
    let mut gpus = Vec::new();
    for bus_id in fs.list("bus/pci/devices") {
        let Some((vendor, class)) = fs.ids(&bus_id) else {
            continue;
        };
        // 0x0302xx: 3D controller; 0x0300xx: VGA controller.
        let display = matches!(class >> 8, 0x0302 | 0x0300);
        if vendor == NVIDIA && display {
            if let Ok(Some(pci)) = fs.pci_of(&format!("bus/pci/devices/{bus_id}")) {
                gpus.push(pci);
            }
        }
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    for (i, pci) in gpus.into_iter().enumerate() {
        found.accelerators.push(Accelerator {
            name: format!("cuda{i}"),
            pci,
        });
    }
}

fn nics(fs: &mut Sysfs, found: &mut Found) {
    for ib in fs.list("class/infiniband") {
        if let Some(pci) = located(fs, found, "infiniband", &ib) {
            found.nics.push(Nic {
                name: ib,
                netdevs: Vec::new(),
                pci,
            });
        }
    }
    for net in fs.list("class/net") {
        if let Some(pci) = located(fs, found, "net", &net) {
            match found.nics.iter_mut().find(|n| n.pci.bus_id == pci.bus_id) {
                Some(nic) => nic.netdevs.push(net),
                None => found.nics.push(Nic {
                    name: net,
                    netdevs: Vec::new(),
                    pci,
                }),
            }
        }
    }
    found.nics.sort_by_key(|n| natural(&n.name));
}
