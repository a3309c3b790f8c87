//! The one error enum of the topology layer.

use std::path::PathBuf;

/// What went wrong finding the topology or applying `UCT_NIC_AFFINITY`.
/// Each message names what failed and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// `UCT_SYSFS_ROOT` names a folder that is not there.
    #[error("UCT_SYSFS_ROOT={} is not a folder ({reason}): point it at a folder that holds a sys/ tree like /sys (topo/fixtures/* are examples), or unset it to read /sys", root.display())]
    Root {
        /// The root asked for.
        root: PathBuf,
        /// Why it cannot be read.
        reason: String,
    },
    /// `nics_for` was asked about a device the topology does not have.
    #[error("no accelerator or memory named {name} in the PCIe topology; known: {known} (an accelerator name, its PCI bus id, host or numa:N; `transport-info --topo` lists them)")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// What would have been accepted.
        known: String,
    },
    /// A rule of `UCT_NIC_AFFINITY` does not parse.
    #[error("UCT_NIC_AFFINITY rule {rule:?} is malformed: {reason}; write DEVICE=NIC[,NIC...] rules separated by ';', e.g. gaudi0=mlx5_0,mlx5_1;gaudi1=mlx5_2")]
    AffinitySyntax {
        /// The rule as written.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A rule of `UCT_NIC_AFFINITY` names a device (left side) that is not here.
    #[error("UCT_NIC_AFFINITY rule {rule:?} names device {device}, which this host does not have; known: {known}. Fix or remove the rule: it is never skipped silently")]
    AffinityUnknownDevice {
        /// The rule as written.
        rule: String,
        /// The device named.
        device: String,
        /// What would have been accepted.
        known: String,
    },
    /// A rule of `UCT_NIC_AFFINITY` names a NIC (right side) that is not here.
    #[error("UCT_NIC_AFFINITY rule {rule:?} names NIC {nic}, which this host does not have (or which has no PCI device); known NICs: {known}. Fix or remove the rule: it is never skipped silently")]
    AffinityUnknownNic {
        /// The rule as written.
        rule: String,
        /// The NIC named.
        nic: String,
        /// What would have been accepted.
        known: String,
    },
    /// A rule of `UCT_NIC_AFFINITY` names one device or NIC twice, by two
    /// of its names.
    #[error("UCT_NIC_AFFINITY rule {rule:?}: {what}; name each device in one rule and each NIC once per rule")]
    AffinityDuplicate {
        /// The rule as written.
        rule: String,
        /// What it repeats.
        what: String,
    },
}

/// `a, b, c`, or `none` for an empty list.
pub(crate) fn list<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    let v: Vec<String> = names.into_iter().map(|s| s.as_ref().to_string()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
