//! Which transports a Transport opens, which one connect() picks, and what
//! is usable here at all.

use std::sync::Arc;

use uct_core::{Iface, MemoryDomain, MemoryType, Registry, Resource};
use uct_topo::{TopoError, Topology};

use crate::error::{Result, TransferError};
use crate::url::Offer;

/// The order `auto` prefers transports in: within one process `self`;
/// on one host shared memory; then a NIC (rc), then sockets; cma last, as
/// it cannot notify. Both sides of a connection use this order, so both
/// pick the same transport.
pub const AUTO_ORDER: [&str; 5] = ["self", "posix", "rc", "tcp", "cma"];

/// A transport on a device that a Transport will open.
pub(crate) struct Candidate {
    pub resource: Resource,
}

/// What [`Transport::probe`](crate::Transport::probe) finds for one
/// transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The transport.
    pub transport: String,
    /// Its device, where it has one here.
    pub device: Option<String>,
    /// Whether it can be used.
    pub usable: bool,
    /// Why not, in transport-info's words.
    pub reason: Option<String>,
}

/// Every transport the registry knows: one line per usable device, or one
/// with the reason it is absent.
pub(crate) fn probe(registry: &Registry) -> Vec<Probe> {
    let resources = registry.resources();
    let mut out = Vec::new();
    for name in registry.transport_names() {
        let found: Vec<&Resource> = resources
            .iter()
            .filter(|r| r.tl.transport == name)
            .collect();
        if found.is_empty() {
            out.push(Probe {
                reason: Some(registry.explain_absent(&name)),
                transport: name.clone(),
                device: None,
                usable: false,
            });
        }
        for r in found {
            out.push(Probe {
                transport: name.clone(),
                device: Some(r.tl.device.clone()),
                usable: true,
                reason: None,
            });
        }
    }
    out
}

/// Whether `md` may carry `mem_type` memory, as far as its attributes say
/// (a refusal at registration still names the details).
fn carries(md: &Arc<dyn MemoryDomain>, mem_type: MemoryType) -> bool {
    let a = md.attrs();
    mem_type.is_host_accessible()
        || a.reg_mem_types.contains(&mem_type)
        || a.alloc_mem_types.contains(&mem_type)
        || a.flags.contains(uct_core::MdFlags::REG_DMABUF)
}

/// The transports to open, in the order connect() prefers them.
pub(crate) fn candidates(
    registry: &Registry,
    transport: &str,
    device: Option<&str>,
    mem_types: &[MemoryType],
) -> Result<Vec<Candidate>> {
    if transport != "auto" {
        // A transport named: its device, whatever memory it will be asked
        // to register (a refusal comes at registration, with its reason).
        let resource = registry
            .find_resource(transport, device)
            .map_err(|e| TransferError::NoTransport(e.to_string()))?;
        return Ok(vec![Candidate { resource }]);
    }
    let resources = registry.resources();
    let mut out = Vec::new();
    let mut why_not = Vec::new();
    for name in AUTO_ORDER {
        let Some(r) = resources
            .iter()
            .find(|r| r.tl.transport == name && device.is_none_or(|d| d == r.tl.device))
        else {
            continue;
        };
        match mem_types.iter().find(|&&t| !carries(&r.md, t)) {
            Some(&t) => why_not.push(r.md.refusal(t).unwrap_or_else(|| {
                let a = r.md.attrs();
                let mut moves = a.reg_mem_types.clone();
                for m in a.alloc_mem_types {
                    if !moves.contains(&m) {
                        moves.push(m);
                    }
                }
                uct_core::memory::cannot_move(name, &moves, t)
            })),
            None => out.push(Candidate {
                resource: r.clone(),
            }),
        }
    }
    if out.is_empty() {
        let absent: Vec<String> = AUTO_ORDER
            .iter()
            .filter(|n| !resources.iter().any(|r| r.tl.transport == **n))
            .map(|n| format!("{n}: {}", registry.explain_absent(n)))
            .collect();
        why_not.extend(absent);
        return Err(TransferError::NoTransport(format!(
            "none reaches {} memory{}: {}",
            mem_types
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(" and "),
            device
                .map(|d| format!(" on device {d}"))
                .unwrap_or_default(),
            why_not.join("; ")
        )));
    }
    Ok(out)
}

/// The candidates (in preference order) that can reach one of the peer's
/// offers, each with that offer: connect() tries them in turn, as one
/// that looks reachable may still fail to connect (posix to a process in
/// another pid namespace), and the peer, failing the same way, moves on
/// to the same next one.
pub(crate) fn choose<T>(
    cands: &[T],
    offers: &[Offer],
    iface: impl Fn(&T) -> &dyn Iface,
) -> Result<Vec<(usize, Offer)>> {
    let mut unreachable = Vec::new();
    let mut found = Vec::new();
    for (i, c) in cands.iter().enumerate() {
        let ifc = iface(c);
        for o in offers.iter().filter(|o| o.transport == ifc.transport()) {
            if ifc.is_reachable(&o.device_addr, &o.iface_addr) {
                found.push((i, o.clone()));
                break;
            }
            unreachable.push(format!("{} on {}", o.transport, o.device));
        }
    }
    if !found.is_empty() {
        return Ok(found);
    }
    let ours: Vec<String> = cands
        .iter()
        .map(|c| iface(c).transport().to_string())
        .collect();
    if !unreachable.is_empty() {
        return Err(TransferError::PeerUnreachable {
            transport: unreachable.join(", "),
            source: uct_core::UctError::Unreachable(
                "its address cannot be reached from here (it is on another host, or it is gone)"
                    .into(),
            ),
        });
    }
    let offered: Vec<String> = offers.iter().map(|o| o.transport.clone()).collect();
    Err(TransferError::NoCommonTransport {
        offered: offered.join(", "),
        ours: ours.join(", "),
        hint: "build both sides with the same transport (or auto), and check UCT_TLS on both"
            .into(),
    })
}

/// The memory domain that allocates `mem_type` memory here.
pub(crate) fn device_md(
    registry: &Registry,
    mem_type: MemoryType,
) -> Result<Arc<dyn MemoryDomain>> {
    registry
        .allocating_md(mem_type)
        .map_err(|e| TransferError::MemoryType(e.to_string()))
}

/// The devices of `transport` a Transport of `rails` rails opens, in rail
/// order: the `devices` named (a device may repeat: two connections over
/// one link), or `first` (Builder::device) then the others nearest the
/// memory first (see [`nearest_order`]; host memory, as the Builder does
/// not pass its memory types here). Fewer devices than rails is refused by
/// name, never made up. A malformed `UCT_NIC_AFFINITY`, or one naming a
/// device that is not here, is refused with the topology's message.
pub(crate) fn rail_candidates(
    registry: &Registry,
    transport: &str,
    first: Option<&str>,
    devices: Option<&[String]>,
    rails: usize,
) -> Result<Vec<Candidate>> {
    if let Some(devices) = devices {
        return devices
            .iter()
            .map(|d| {
                registry
                    .find_resource(transport, Some(d))
                    .map(|resource| Candidate { resource })
                    .map_err(|e| TransferError::NoTransport(e.to_string()))
            })
            .collect();
    }
    let mut found: Vec<Resource> = registry
        .resources()
        .into_iter()
        .filter(|r| r.tl.transport == transport)
        .collect();
    // Read even for one device: a bad UCT_NIC_AFFINITY is refused always.
    let topo = Topology::discover().map_err(|e| TransferError::Config(e.to_string()))?;
    let names: Vec<&str> = found.iter().map(|r| r.tl.device.as_str()).collect();
    let order =
        nearest_order(&names, &topo, HOST).map_err(|e| TransferError::Config(e.to_string()))?;
    let mut slots: Vec<Option<Resource>> = found.into_iter().map(Some).collect();
    found = order.iter().filter_map(|&i| slots[i].take()).collect();
    if let Some(d) = first {
        let at = found.iter().position(|r| r.tl.device == d).ok_or_else(|| {
            TransferError::NoTransport(
                registry
                    .find_resource(transport, Some(d))
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| format!("{transport} has no device {d}")),
            )
        })?;
        let r = found.remove(at);
        found.insert(0, r);
    }
    if found.is_empty() {
        return Err(TransferError::NoTransport(format!(
            "{transport} ({})",
            registry.explain_absent(transport)
        )));
    }
    if found.len() < rails {
        return Err(TransferError::Config(format!(
            "{rails} rails of {transport} need {rails} devices, and {transport} has {} here ({}); ask for fewer rails, or name the devices with Builder::devices (the same device twice makes two connections over one link)",
            found.len(),
            found
                .iter()
                .map(|r| r.tl.device.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    found.truncate(rails);
    Ok(found
        .into_iter()
        .map(|resource| Candidate { resource })
        .collect())
}

/// The topology's name for host memory on no particular node.
const HOST: &str = "host";

/// The order to take `devices` (a transport's devices in registry order:
/// `mlx5_0:1`, `eth0`, `lo`) in for memory on `memory` (`host`, `numa:N`,
/// an accelerator): the devices the topology knows (on a PCI device) as
/// `Topology::nics_for` ranks them, UCT_NIC_AFFINITY applied, then the
/// others (rxe, lo, dummy) in registry order. With fewer than two known
/// devices there is nothing to rank between: the registry order stays.
/// Returns indices into `devices`.
pub(crate) fn nearest_order(
    devices: &[&str],
    topo: &Topology,
    memory: &str,
) -> std::result::Result<Vec<usize>, TopoError> {
    let identity: Vec<usize> = (0..devices.len()).collect();
    // An rc device is `NIC:port`.
    let nic_of = |d: &str| {
        let name = match d.rsplit_once(':') {
            Some((nic, port)) if port.parse::<u32>().is_ok() => nic,
            _ => d,
        };
        topo.nic(name).map(|n| n.name.clone())
    };
    let nics: Vec<Option<String>> = devices.iter().map(|d| nic_of(d)).collect();
    if nics.iter().flatten().count() < 2 {
        return Ok(identity);
    }
    let ranked = topo.nics_for(memory)?;
    let rank = |nic: &Option<String>| {
        nic.as_ref()
            .and_then(|n| ranked.iter().position(|c| &c.name == n))
            .unwrap_or(usize::MAX)
    };
    let mut order = identity;
    // Stable: devices on one NIC, and the unknown ones, keep their order.
    order.sort_by_key(|&i| rank(&nics[i]));
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_topo::Affinity;

    fn topo(name: &str) -> Topology {
        let root = format!("{}/../topo/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        Topology::from_root(root, None).unwrap()
    }

    fn ordered<'a>(devices: &[&'a str], t: &Topology, memory: &str) -> Vec<&'a str> {
        nearest_order(devices, t, memory)
            .unwrap()
            .into_iter()
            .map(|i| devices[i])
            .collect()
    }

    #[test]
    fn known_devices_come_nearest_first_and_the_others_keep_their_order() {
        let t = topo("dgx-a800");
        let devices = ["lo", "mlx5_1:1", "rxe0:1", "mlx5_2:1", "ibp52s0", "dummy0"];
        // cuda0: mlx5_2 PIX, mlx5_4 (ibp52s0) NODE, mlx5_1 SYS.
        assert_eq!(
            ordered(&devices, &t, "cuda0"),
            ["mlx5_2:1", "ibp52s0", "mlx5_1:1", "lo", "rxe0:1", "dummy0"]
        );
        // Host memory on node 1: mlx5_1 first.
        assert_eq!(
            ordered(&devices, &t, "numa:1"),
            ["mlx5_1:1", "mlx5_2:1", "ibp52s0", "lo", "rxe0:1", "dummy0"]
        );
        // Host memory on no particular node: every NIC PHB, equal links: by name.
        assert_eq!(
            ordered(&devices, &t, "host"),
            ["mlx5_1:1", "mlx5_2:1", "ibp52s0", "lo", "rxe0:1", "dummy0"]
        );
    }

    #[test]
    fn affinity_overrides_and_fewer_than_two_known_keep_the_order() {
        let rules = Affinity::parse("cuda0=mlx5_1").unwrap();
        let t = topo("dgx-a800").with_affinity(Some(rules)).unwrap();
        assert_eq!(
            ordered(&["mlx5_2:1", "mlx5_1:1"], &t, "cuda0"),
            ["mlx5_1:1", "mlx5_2:1"]
        );
        // One known device, as on a host whose only PCI NIC is eth0.
        assert_eq!(
            ordered(&["lo", "mlx5_7:1"], &t, "cuda0"),
            ["lo", "mlx5_7:1"]
        );
        assert_eq!(ordered(&["lo", "eth0"], &t, "host"), ["lo", "eth0"]);
        assert!(nearest_order(&["mlx5_1:1", "mlx5_2:1"], &t, "gaudi0").is_err());
    }
}
