//! PCIe topology from sysfs: which NICs are nearest a piece of memory.
//!
//! [`Topology::discover`] reads `/sys` (or the tree `UCT_SYSFS_ROOT`
//! points at: a folder holding `sys/`, as `topo/fixtures/*` do), finds the
//! accelerators and NICs that sit on PCI devices, and classifies every
//! accelerator–NIC pair as NCCL does ([`PathType`]: PIX, PXB, PHB, NODE,
//! SYS). [`Topology::nics_for`] ranks the NICs for an accelerator's memory
//! or for host memory: by path type, then PCIe hops, then link bandwidth.
//! `UCT_NIC_AFFINITY` ([`Affinity`]) overrides the ranking; a rule naming
//! a device that is not here fails discovery.
//!
//! ```
//! let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dgx-a800");
//! let topo = uct_topo::Topology::from_root(root, None).unwrap();
//! let best = &topo.nics_for("cuda0").unwrap()[0];
//! assert_eq!((best.name.as_str(), best.path.to_string().as_str()), ("mlx5_2", "PIX"));
//! ```

mod affinity;
mod discover;
mod error;
pub mod fixture;
mod path;
mod sysfs;

use std::collections::BTreeSet;
use std::path::{Path as FsPath, PathBuf};

pub use affinity::{Affinity, Rule, AFFINITY_VAR};
pub use discover::{Accelerator, Nic, NoPciDevice};
pub use error::TopoError;
pub use path::{Path, PathType};
pub use sysfs::{Link, PciLocation};

use affinity::shown;
use error::list;

/// The environment variable that points discovery at another sysfs tree.
pub const ROOT_VAR: &str = "UCT_SYSFS_ROOT";

/// One NIC for a piece of memory, as [`Topology::nics_for`] ranks them.
///
/// ```
/// let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/gb200");
/// let topo = uct_topo::Topology::from_root(root, None).unwrap();
/// let c = &topo.nics_for("cuda2").unwrap()[0];
/// assert_eq!((c.name.as_str(), c.path.as_str(), c.hops), ("mlx5_2", "NODE", 5));
/// assert_eq!(c.bandwidth_mbps, Some(504_123)); // 32 GT/s x16, 128b/130b
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicChoice {
    /// The NIC's name (`mlx5_0`, or a network interface such as `eth0`).
    pub name: String,
    /// The path type between the memory and the NIC.
    pub path: PathType,
    /// PCIe links between them: the tie-break within one path type.
    pub hops: u32,
    /// The NIC's PCIe link bandwidth in Mb/s (speed x width, less the line
    /// code); None where sysfs does not say.
    pub bandwidth_mbps: Option<u64>,
}

/// The memory a ranking is for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Memory<'a> {
    Device(&'a Accelerator),
    Host(Option<u32>),
}

/// The accelerators and NICs of this host (or of a fixture tree) and the
/// PCIe paths between them.
///
/// ```
/// let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/gb200");
/// let topo = uct_topo::Topology::from_root(root, None).unwrap();
/// assert_eq!(topo.accelerators().len(), 4);
/// assert_eq!(topo.path("cuda0", "mlx5_0").unwrap().kind.to_string(), "NODE");
/// ```
#[derive(Debug, Clone)]
pub struct Topology {
    root: PathBuf,
    from_env: bool,
    accelerators: Vec<Accelerator>,
    nics: Vec<Nic>,
    no_pci: Vec<NoPciDevice>,
    numa_nodes: BTreeSet<u32>,
    notes: Vec<String>,
    affinity: Option<Affinity>,
}

impl Topology {
    /// Reads the topology from `/`, or from `UCT_SYSFS_ROOT` when set, with
    /// `UCT_NIC_AFFINITY` applied. A malformed affinity rule, or one that
    /// names a device or NIC that is not here, is an error.
    ///
    /// ```
    /// // On any host: a topology, possibly without accelerators or NICs.
    /// match uct_topo::Topology::discover() {
    ///     Ok(t) => println!("{} accelerators, {} NICs", t.accelerators().len(), t.nics().len()),
    ///     Err(e) => eprintln!("{e}"), // a bad UCT_NIC_AFFINITY or UCT_SYSFS_ROOT
    /// }
    /// ```
    pub fn discover() -> Result<Topology, TopoError> {
        let affinity = Affinity::from_env()?;
        match std::env::var_os(ROOT_VAR).filter(|v| !v.is_empty()) {
            Some(root) => {
                let mut t = Topology::from_root(root, affinity)?;
                t.from_env = true;
                Ok(t)
            }
            None => Topology::from_root("/", affinity),
        }
    }

    /// Reads the topology under `root` (a folder holding `sys/`) with the
    /// affinity rules given, which are checked against what is found.
    ///
    /// ```
    /// use uct_topo::{Affinity, Topology};
    /// let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dgx-a800");
    /// let rules = Affinity::parse("cuda0=mlx5_9").unwrap();
    /// let err = Topology::from_root(root, Some(rules)).unwrap_err();
    /// assert!(err.to_string().contains("mlx5_9"));
    /// ```
    pub fn from_root(
        root: impl AsRef<FsPath>,
        affinity: Option<Affinity>,
    ) -> Result<Topology, TopoError> {
        let root = root.as_ref().to_path_buf();
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(TopoError::Root {
                    root,
                    reason: "it is a file".into(),
                })
            }
            Err(e) => {
                return Err(TopoError::Root {
                    root,
                    reason: e.to_string(),
                })
            }
        }
        let mut fs = sysfs::Sysfs::new(root.clone());
        let found = discover::find(&mut fs);
        let topo = Topology {
            root,
            from_env: false,
            accelerators: found.accelerators,
            nics: found.nics,
            no_pci: found.no_pci,
            numa_nodes: found.numa_nodes,
            notes: fs.notes,
            affinity: None,
        };
        topo.with_affinity(affinity)
    }

    /// The same topology with other affinity rules (None: none), checked
    /// against what is here.
    pub fn with_affinity(mut self, affinity: Option<Affinity>) -> Result<Topology, TopoError> {
        if let Some(a) = &affinity {
            let mut targets: Vec<(Memory<'_>, &Rule)> = Vec::new();
            for rule in a.rules() {
                let Ok(target) = self.memory(&rule.device) else {
                    return Err(TopoError::AffinityUnknownDevice {
                        rule: shown(&rule.text),
                        device: shown(&rule.device),
                        known: self.known_devices(),
                    });
                };
                // cuda0 and its bus id (in either case) are one device: two
                // rules for it would leave which one wins to their order.
                if let Some((_, first)) = targets.iter().find(|(t, _)| *t == target) {
                    return Err(TopoError::AffinityDuplicate {
                        rule: shown(&rule.text),
                        what: format!(
                            "{} is the device of rule {:?} too",
                            rule.device,
                            shown(&first.text)
                        ),
                    });
                }
                targets.push((target, rule));
                let mut nics: Vec<&str> = Vec::new();
                for want in &rule.nics {
                    let Some(nic) = self.nic(want) else {
                        return Err(TopoError::AffinityUnknownNic {
                            rule: shown(&rule.text),
                            nic: shown(want),
                            known: list(self.nics.iter().map(|n| n.name.as_str())),
                        });
                    };
                    // mlx5_0 and its interface ibp12s0 are one NIC.
                    if nics.contains(&nic.name.as_str()) {
                        return Err(TopoError::AffinityDuplicate {
                            rule: shown(&rule.text),
                            what: format!("{want} is NIC {} again", nic.name),
                        });
                    }
                    nics.push(&nic.name);
                }
            }
        }
        self.affinity = affinity;
        Ok(self)
    }

    /// The NICs for memory on `device`, best first: an accelerator's name
    /// (`gaudi0`, `cuda0`, `accel0`) or PCI bus id, `host` (host memory on
    /// no particular node) or `numa:N` (host memory on node N). Ranked by
    /// path type, then hops, then link bandwidth, then name; a
    /// `UCT_NIC_AFFINITY` rule for the device puts its NICs first, in its
    /// order, the others after them as ranked.
    ///
    /// ```
    /// use uct_topo::{PathType, Topology};
    /// let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dgx-a100-4nic");
    /// let topo = Topology::from_root(root, None).unwrap();
    /// let nics = topo.nics_for("cuda6").unwrap();
    /// assert_eq!((nics[0].name.as_str(), nics[0].path), ("mlx5_2", PathType::Pxb));
    /// assert!(topo.nics_for("cuda9").is_err());
    /// ```
    pub fn nics_for(&self, device: &str) -> Result<Vec<NicChoice>, TopoError> {
        let mut ranked = self.ranked(device)?;
        // A rule may name the device by name or by bus id.
        let target = self.memory(device).ok();
        let rule = self.affinity.as_ref().and_then(|a| {
            a.rules()
                .iter()
                .find(|r| self.memory(&r.device).ok() == target)
        });
        if let Some(rule) = rule {
            let mut first = Vec::new();
            for want in &rule.nics {
                if let Some(nic) = self.nic(want) {
                    if let Some(at) = ranked.iter().position(|c| c.name == nic.name) {
                        first.push(ranked.remove(at));
                    }
                }
            }
            first.extend(ranked);
            ranked = first;
        }
        Ok(ranked)
    }

    /// The NICs for memory on `device` by the topology alone, ignoring
    /// `UCT_NIC_AFFINITY`.
    pub fn ranked(&self, device: &str) -> Result<Vec<NicChoice>, TopoError> {
        let memory = self.memory(device)?;
        let mut v: Vec<NicChoice> = self
            .nics
            .iter()
            .map(|nic| {
                let p = match memory {
                    Memory::Device(a) => path::between(&a.pci, &nic.pci),
                    Memory::Host(node) => path::from_host(node, &nic.pci),
                };
                NicChoice {
                    name: nic.name.clone(),
                    path: p.kind,
                    hops: p.hops,
                    bandwidth_mbps: nic.pci.link.bandwidth_mbps(),
                }
            })
            .collect();
        v.sort_by(|a, b| {
            (a.path, a.hops, std::cmp::Reverse(a.bandwidth_mbps))
                .cmp(&(b.path, b.hops, std::cmp::Reverse(b.bandwidth_mbps)))
                .then_with(|| sysfs::natural(&a.name).cmp(&sysfs::natural(&b.name)))
        });
        Ok(v)
    }

    /// The path between an accelerator (or `host` / `numa:N`) and a NIC.
    pub fn path(&self, device: &str, nic: &str) -> Result<Path, TopoError> {
        let memory = self.memory(device)?;
        let nic = self.nic(nic).ok_or_else(|| TopoError::UnknownDevice {
            name: nic.to_string(),
            known: list(self.nics.iter().map(|n| n.name.as_str())),
        })?;
        Ok(match memory {
            Memory::Device(a) => path::between(&a.pci, &nic.pci),
            Memory::Host(node) => path::from_host(node, &nic.pci),
        })
    }

    /// The accelerators with a PCI device, in name order per class.
    pub fn accelerators(&self) -> &[Accelerator] {
        &self.accelerators
    }

    /// The NICs with a PCI device, in name order.
    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    /// The NIC named `name` (or with an interface of that name).
    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.answers_to(name))
    }

    /// Accelerators and NICs that have no PCI device (rxe, lo, dummy).
    pub fn without_pci(&self) -> &[NoPciDevice] {
        &self.no_pci
    }

    /// The NUMA nodes sysfs lists or a device sits on.
    pub fn numa_nodes(&self) -> impl Iterator<Item = u32> + '_ {
        self.numa_nodes.iter().copied()
    }

    /// Files that were there but did not parse, each taken as unknown.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The folder read (holding `sys/`).
    pub fn root(&self) -> &FsPath {
        &self.root
    }

    /// Whether the root came from `UCT_SYSFS_ROOT`.
    pub fn root_from_env(&self) -> bool {
        self.from_env
    }

    /// The affinity rules in force.
    pub fn affinity(&self) -> Option<&Affinity> {
        self.affinity.as_ref()
    }

    fn memory(&self, device: &str) -> Result<Memory<'_>, TopoError> {
        if device == "host" {
            return Ok(Memory::Host(None));
        }
        if let Some(n) = device.strip_prefix("numa:") {
            if let Ok(n) = n.parse::<u32>() {
                if self.numa_nodes.contains(&n) || (self.numa_nodes.is_empty() && n == 0) {
                    return Ok(Memory::Host(Some(n)));
                }
            }
        }
        let wanted = device.to_ascii_lowercase();
        self.accelerators
            .iter()
            .find(|a| a.name == device || a.pci.bus_id == wanted)
            .map(Memory::Device)
            .ok_or_else(|| TopoError::UnknownDevice {
                name: device.to_string(),
                known: self.known_devices(),
            })
    }

    fn known_devices(&self) -> String {
        let mut v: Vec<String> = self
            .accelerators
            .iter()
            .map(|a| format!("{} ({})", a.name, a.pci.bus_id))
            .collect();
        v.push("host".into());
        v.extend(self.numa_nodes.iter().map(|n| format!("numa:{n}")));
        list(v)
    }
}
