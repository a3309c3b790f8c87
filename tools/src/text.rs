//! Plain-text rendering of `transport-info` reports, in the spirit of
//! `ucx_info`: one `#`-prefixed block per memory domain and transport.

use std::fmt::Write;

use crate::info::{
    caps_line, AbsentMdReport, AbsentReport, BuildInfo, ComponentReport, ConfigReport,
    LimitsReport, MdReport, ModulesReport, TransportReport,
};

/// `4096` -> `4K`, `1<<30` -> `1G`; very large limits print as unlimited.
pub fn size(n: u64) -> String {
    if n >= (1u64 << 62) {
        return "unlimited".into();
    }
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    if n >= 10 << 10 {
        return format!("{:.1}K", n as f64 / 1024.0);
    }
    n.to_string()
}

pub fn build(info: &BuildInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# uct-rs version {}", info.version);
    let _ = writeln!(out, "# build profile: {}", info.profile);
    let _ = writeln!(
        out,
        "# module ABI fingerprint: {}",
        info.module_abi_fingerprint
    );
    let features = if info.features.is_empty() {
        "none".to_string()
    } else {
        info.features.join(", ")
    };
    let _ = writeln!(out, "# features: {features}");
    out
}

pub fn components(list: &[ComponentReport]) -> String {
    let mut out = String::from("#\n# Components\n#\n");
    for component in list {
        let _ = writeln!(
            out,
            "# {:>10}: {} [{}]",
            component.name, component.description, component.origin
        );
        let _ = writeln!(
            out,
            "# {:>10}  transports: {}; memory domains: {}",
            "",
            if component.transports.is_empty() {
                "none".into()
            } else {
                component.transports.join(", ")
            },
            if component.memory_domains.is_empty() {
                "none".into()
            } else {
                component.memory_domains.join(", ")
            }
        );
        if let Some(e) = &component.error {
            let _ = writeln!(out, "# {:>10}  error: {e}", "");
        }
    }
    out
}

pub fn modules(report: &ModulesReport) -> String {
    let mut out = String::from("#\n# Loadable modules\n#\n");
    let _ = writeln!(out, "# search path: {}", report.search_path.join(":"));
    if report.modules.is_empty() {
        out.push_str("# (no libuct_*.so module files found)\n");
    }
    for module in &report.modules {
        let _ = writeln!(
            out,
            "# module {:<10} {:<11} {}",
            module.name, module.status, module.path
        );
        if !module.components.is_empty() {
            let _ = writeln!(
                out,
                "#        {:<10} components: {}",
                "",
                module.components.join(", ")
            );
        }
        if let Some(reason) = &module.reason {
            let _ = writeln!(out, "#        {:<10} reason: {reason}", "");
        }
    }
    out
}

fn limits_lines(out: &mut String, op: &str, caps: &[String], limits: &LimitsReport) {
    for (class, max) in [("short", limits.max_short), ("bcopy", limits.max_bcopy)] {
        if caps.iter().any(|c| c == &format!("{op}_{class}")) {
            let _ = writeln!(
                out,
                "#  {:>20}: <= {}",
                format!("{op}_{class}"),
                size(max as u64)
            );
        }
    }
    if caps.iter().any(|c| c == &format!("{op}_zcopy")) {
        let _ = writeln!(
            out,
            "#  {:>20}: {} - {}, up to {} iov",
            format!("{op}_zcopy"),
            size(limits.min_zcopy as u64),
            size(limits.max_zcopy as u64),
            limits.max_iov
        );
    }
}

fn transport(out: &mut String, tl: &TransportReport) {
    let _ = writeln!(out, "#");
    let _ = writeln!(out, "#      Transport: {}", tl.transport);
    let _ = writeln!(out, "#         Device: {}", tl.device);
    let _ = writeln!(out, "#           Type: {}", tl.device_type);
    let _ = writeln!(
        out,
        "#  System device: {}",
        tl.system_device.as_deref().unwrap_or("<unknown>")
    );
    if let Some(e) = &tl.error {
        let _ = writeln!(out, "#   < failed to open interface: {e} >");
        return;
    }
    let Some(attrs) = &tl.attrs else { return };
    let _ = writeln!(out, "#");
    let _ = writeln!(out, "#      capabilities:");
    let _ = writeln!(
        out,
        "#  {:>20}: {:.2} MB/sec",
        "bandwidth", attrs.bandwidth_mbps
    );
    let _ = writeln!(out, "#  {:>20}: {:.0} nsec", "latency", attrs.latency_ns);
    let _ = writeln!(out, "#  {:>20}: {:.0} nsec", "overhead", attrs.overhead_ns);
    limits_lines(out, "put", &attrs.capabilities, &attrs.put);
    limits_lines(out, "get", &attrs.capabilities, &attrs.get);
    limits_lines(out, "am", &attrs.capabilities, &attrs.am);
    if !attrs.capabilities.iter().any(|c| c.starts_with("am_")) {
        let _ = writeln!(
            out,
            "#  {:>20}: none (this transport has no active messages)",
            "active messages"
        );
    }
    if attrs.capabilities.iter().any(|c| c == "am_zcopy") {
        let _ = writeln!(
            out,
            "#  {:>20}: <= {}",
            "am header",
            size(attrs.max_am_header as u64)
        );
    }
    let atomics: Vec<&str> = [("atomic32", "32-bit"), ("atomic64", "64-bit")]
        .into_iter()
        .filter(|(f, _)| attrs.capabilities.iter().any(|c| c == f))
        .map(|(_, n)| n)
        .collect();
    if atomics.is_empty() {
        let _ = writeln!(out, "#  {:>20}: none", "atomics");
    } else {
        let swap = if attrs.capabilities.iter().any(|c| c == "atomic_swap") {
            "swap, "
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "#  {:>20}: add, fetch-add, {swap}compare-swap ({})",
            "atomics",
            atomics.join(", ")
        );
    }
    let conn = caps_line(&attrs.capabilities, "connect_to_");
    let _ = writeln!(
        out,
        "#  {:>20}: to {}",
        "connection",
        if conn.is_empty() {
            "none".into()
        } else {
            conn.replace(", ", ", to ")
        }
    );
    let mut other: Vec<&str> = Vec::new();
    for f in ["flush", "fence", "errhandle_peer_failure", "passive_target"] {
        if attrs.capabilities.iter().any(|c| c == f) {
            other.push(f);
        }
    }
    let _ = writeln!(out, "#  {:>20}: {}", "other", other.join(", "));
    let _ = writeln!(
        out,
        "#  {:>20}: {}",
        "memory types",
        attrs.memory_types.join(", ")
    );
    let _ = writeln!(
        out,
        "#  {:>20}: {} bytes",
        "device address", attrs.device_addr_len
    );
    let _ = writeln!(
        out,
        "#  {:>20}: {} bytes",
        "iface address", attrs.iface_addr_len
    );
    if attrs.ep_addr_len > 0 {
        let _ = writeln!(out, "#  {:>20}: {} bytes", "ep address", attrs.ep_addr_len);
    }
}

pub fn devices(mds: &[MdReport]) -> String {
    let mut out = String::new();
    for md in mds {
        let _ = writeln!(out, "#");
        let _ = writeln!(out, "# Memory domain: {}", md.memory_domain);
        let _ = writeln!(out, "#     Component: {}", md.component);
        if let Some(d) = &md.description {
            let _ = writeln!(out, "#        Device: {d}");
        }
        let _ = writeln!(out, "#  {:>20}: {}", "flags", md.flags.join(", "));
        if !md.alloc_mem_types.is_empty() {
            let _ = writeln!(
                out,
                "#  {:>20}: {} (max {})",
                "allocate",
                md.alloc_mem_types.join(", "),
                size(md.max_alloc)
            );
        }
        if !md.reg_mem_types.is_empty() {
            let _ = writeln!(
                out,
                "#  {:>20}: {}, cost: {:.0} nsec + {:.3} nsec/byte",
                "register",
                md.reg_mem_types.join(", "),
                md.reg_cost_ns,
                md.reg_cost_ns_per_byte
            );
        }
        if !md.export_mem_types.is_empty() {
            let _ = writeln!(
                out,
                "#  {:>20}: {}",
                "dma-buf export",
                md.export_mem_types.join(", ")
            );
        }
        if !md.detect_mem_types.is_empty() {
            let _ = writeln!(
                out,
                "#  {:>20}: {}",
                "detect",
                md.detect_mem_types.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "#  {:>20}: {} bytes",
            "remote key", md.rkey_packed_size
        );
        if let Some(d) = &md.system_device {
            let _ = writeln!(out, "#  {:>20}: {d}", "system device");
        }
        if md.transports.is_empty() {
            let _ = writeln!(
                out,
                "#  {:>20}: none of its own (a NIC with DMA-buf import carries this memory)",
                "transports"
            );
        }
        for t in &md.transports {
            transport(&mut out, t);
        }
    }
    out
}

pub fn absent_mds(list: &[AbsentMdReport]) -> String {
    let mut out = String::new();
    if list.is_empty() {
        return out;
    }
    out.push_str("#\n# Memory domains not available\n#\n");
    for a in list {
        let _ = writeln!(out, "# {:>8}: {}", a.component, a.reason);
    }
    out
}

pub fn absent(list: &[AbsentReport]) -> String {
    let mut out = String::new();
    if list.is_empty() {
        return out;
    }
    out.push_str("#\n# Transports not available\n#\n");
    for a in list {
        let _ = writeln!(out, "# {:>8}: {}", a.transport, a.reason);
    }
    out
}

pub fn config(vars: &[ConfigReport], full: bool) -> String {
    let mut out = String::new();
    for v in vars {
        if full {
            let _ = writeln!(out, "#");
            for line in v.doc.split('\n') {
                let _ = writeln!(out, "# {line}");
            }
            let _ = writeln!(out, "#");
            let _ = writeln!(
                out,
                "# default: {}; owner: {}{}",
                if v.default.is_empty() {
                    "(empty)"
                } else {
                    v.default
                },
                v.owner,
                if v.from_environment {
                    "; set in the environment"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(out, "{}={}", v.name, v.value);
    }
    out
}
