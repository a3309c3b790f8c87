//! `transport-info --topo`: the PCIe matrix of accelerators (rows) and NICs
//! (columns) in the style of `nvidia-smi topo -m`, each device's NUMA node,
//! the NIC order per accelerator, and a legend.

use serde_json::{json, Value};
use uct_topo::{PathType, Topology, AFFINITY_VAR, ROOT_VAR};

/// The text report.
pub fn text(t: &Topology) -> String {
    let mut out = String::new();
    let from = if t.root_from_env() {
        ROOT_VAR.to_string()
    } else {
        t.root().join("sys").display().to_string()
    };
    out.push_str(&format!("# PCIe topology (read from {from})\n#\n"));
    let accels = t.accelerators();
    let nics = t.nics();
    if accels.is_empty() {
        out.push_str("# no accelerator PCI device (habanalabs or accel class device, NVIDIA GPU): no matrix to show\n");
    }
    if nics.is_empty() {
        out.push_str("# no NIC PCI device (infiniband or net class device with a PCI parent)\n");
    }
    if !accels.is_empty() && !nics.is_empty() {
        out.push_str(&matrix(t));
    }
    if !nics.is_empty() {
        out.push_str("#\n# NICs\n");
        let w = nics.iter().map(|n| n.name.len()).max().unwrap_or(0);
        for n in nics {
            let also = if n.netdevs.is_empty() {
                String::new()
            } else {
                format!("  ({})", n.netdevs.join(", "))
            };
            out.push_str(&format!(
                "#   {:w$}  {}  NUMA {}  link {}{also}\n",
                n.name,
                n.pci.bus_id,
                numa(n.pci.numa_node),
                link(&n.pci.link),
            ));
        }
    }
    if !nics.is_empty() {
        out.push_str("#\n# NICs nearest first");
        if let Some(a) = t.affinity() {
            let rules: Vec<&str> = a.rules().iter().map(|r| r.text.as_str()).collect();
            out.push_str(&format!(" ({AFFINITY_VAR}: {})", rules.join(";")));
        }
        out.push('\n');
        let mut memories: Vec<String> = accels.iter().map(|a| a.name.clone()).collect();
        memories.extend(t.numa_nodes().map(|n| format!("numa:{n}")));
        if t.numa_nodes().next().is_none() {
            memories.push("host".into());
        }
        let w = memories.iter().map(|m| m.len()).max().unwrap_or(0);
        for m in &memories {
            let names = match t.nics_for(m) {
                Ok(v) => v
                    .iter()
                    .map(|c| format!("{}({})", c.name, c.path))
                    .collect::<Vec<_>>()
                    .join(" "),
                Err(e) => e.to_string(),
            };
            out.push_str(&format!("#   {m:w$}  {names}\n"));
        }
    }
    if !t.without_pci().is_empty() {
        let v: Vec<String> = t
            .without_pci()
            .iter()
            .map(|d| {
                if d.reason == "no PCI device" {
                    format!("{} ({})", d.name, d.class)
                } else {
                    format!("{} ({}: {})", d.name, d.class, d.reason)
                }
            })
            .collect();
        out.push_str(&format!("#\n# No PCI device: {}\n", v.join(", ")));
    }
    for n in t.notes() {
        out.push_str(&format!("# note: {n}\n"));
    }
    if !nics.is_empty() {
        out.push_str("#\n# Legend:\n");
        for p in PathType::ALL {
            out.push_str(&format!("#   {:4} = {}\n", p.as_str(), p.meaning()));
        }
    }
    out
}

fn matrix(t: &Topology) -> String {
    let accels = t.accelerators();
    let nics = t.nics();
    let first = accels.iter().map(|a| a.name.len()).max().unwrap_or(0) + 2;
    let col = nics.iter().map(|n| n.name.len()).max().unwrap_or(0).max(4) + 2;
    let mut out = format!("{:first$}", "");
    for n in nics {
        out.push_str(&format!("{:col$}", n.name));
    }
    out.push_str("NUMA  PCI\n");
    for a in accels {
        out.push_str(&format!("{:first$}", a.name));
        for n in nics {
            let p = t
                .path(&a.name, &n.name)
                .map(|p| p.kind.to_string())
                .unwrap_or_else(|_| "?".into());
            out.push_str(&format!("{p:col$}"));
        }
        out.push_str(&format!("{:6}{}\n", numa(a.pci.numa_node), a.pci.bus_id));
    }
    out
}

fn numa(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "-".into())
}

fn link(l: &uct_topo::Link) -> String {
    match (l.speed_gts, l.width, l.bandwidth_mbps()) {
        (Some(s), Some(w), Some(bw)) => format!("{s} GT/s x{w} ({} Gb/s)", bw / 1000),
        _ => "unknown".into(),
    }
}

/// The same as JSON.
pub fn json(t: &Topology) -> Value {
    let loc = |p: &uct_topo::PciLocation| {
        json!({
            "pci": p.bus_id,
            "numa_node": p.numa_node,
            "link_speed_gts": p.link.speed_gts,
            "link_width": p.link.width,
            "bandwidth_mbps": p.link.bandwidth_mbps(),
        })
    };
    let accelerators: Vec<Value> = t
        .accelerators()
        .iter()
        .map(|a| {
            let nics: Vec<Value> = t
                .nics_for(&a.name)
                .unwrap_or_default()
                .into_iter()
                .map(|c| {
                    json!({"name": c.name, "path": c.path.to_string(), "hops": c.hops,
                           "bandwidth_mbps": c.bandwidth_mbps})
                })
                .collect();
            json!({"name": a.name, "location": loc(&a.pci), "nics_nearest_first": nics})
        })
        .collect();
    let nics: Vec<Value> = t
        .nics()
        .iter()
        .map(|n| json!({"name": n.name, "netdevs": n.netdevs, "location": loc(&n.pci)}))
        .collect();
    let no_pci: Vec<Value> = t
        .without_pci()
        .iter()
        .map(|d| json!({"name": d.name, "class": d.class, "reason": d.reason}))
        .collect();
    json!({
        "accelerators": accelerators,
        "nics": nics,
        "no_pci_device": no_pci,
        "notes": t.notes(),
    })
}
