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

pub fn build(b: &BuildInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# uct-rs version {}", b.version);
    let _ = writeln!(s, "# build profile: {}", b.profile);
    let _ = writeln!(s, "# module ABI fingerprint: {}", b.module_abi_fingerprint);
    let features = if b.features.is_empty() {
        "none".to_string()
    } else {
        b.features.join(", ")
    };
    let _ = writeln!(s, "# features: {features}");
    s
}

pub fn components(list: &[ComponentReport]) -> String {
    let mut s = String::from("#\n# Components\n#\n");
    for c in list {
        let _ = writeln!(s, "# {:>10}: {} [{}]", c.name, c.description, c.origin);
        let _ = writeln!(
            s,
            "# {:>10}  transports: {}; memory domains: {}",
            "",
            if c.transports.is_empty() {
                "none".into()
            } else {
                c.transports.join(", ")
            },
            if c.memory_domains.is_empty() {
                "none".into()
            } else {
                c.memory_domains.join(", ")
            }
        );
        if let Some(e) = &c.error {
            let _ = writeln!(s, "# {:>10}  error: {e}", "");
        }
    }
    s
}

pub fn modules(m: &ModulesReport) -> String {
    let mut s = String::from("#\n# Loadable modules\n#\n");
    let _ = writeln!(s, "# search path: {}", m.search_path.join(":"));
    if m.modules.is_empty() {
        s.push_str("# (no libuct_*.so module files found)\n");
    }
    for r in &m.modules {
        let _ = writeln!(s, "# module {:<10} {:<11} {}", r.name, r.status, r.path);
        if !r.components.is_empty() {
            let _ = writeln!(
                s,
                "#        {:<10} components: {}",
                "",
                r.components.join(", ")
            );
        }
        if let Some(reason) = &r.reason {
            let _ = writeln!(s, "#        {:<10} reason: {reason}", "");
        }
    }
    s
}

fn limits_lines(s: &mut String, op: &str, caps: &[String], l: &LimitsReport) {
    for (class, max) in [("short", l.max_short), ("bcopy", l.max_bcopy)] {
        if caps.iter().any(|c| c == &format!("{op}_{class}")) {
            let _ = writeln!(
                s,
                "#  {:>20}: <= {}",
                format!("{op}_{class}"),
                size(max as u64)
            );
        }
    }
    if caps.iter().any(|c| c == &format!("{op}_zcopy")) {
        let _ = writeln!(
            s,
            "#  {:>20}: {} - {}, up to {} iov",
            format!("{op}_zcopy"),
            size(l.min_zcopy as u64),
            size(l.max_zcopy as u64),
            l.max_iov
        );
    }
}

fn transport(s: &mut String, t: &TransportReport) {
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "#      Transport: {}", t.transport);
    let _ = writeln!(s, "#         Device: {}", t.device);
    let _ = writeln!(s, "#           Type: {}", t.device_type);
    let _ = writeln!(
        s,
        "#  System device: {}",
        t.system_device.as_deref().unwrap_or("<unknown>")
    );
    if let Some(e) = &t.error {
        let _ = writeln!(s, "#   < failed to open interface: {e} >");
        return;
    }
    let Some(a) = &t.attrs else { return };
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "#      capabilities:");
    let _ = writeln!(s, "#  {:>20}: {:.2} MB/sec", "bandwidth", a.bandwidth_mbps);
    let _ = writeln!(s, "#  {:>20}: {:.0} nsec", "latency", a.latency_ns);
    let _ = writeln!(s, "#  {:>20}: {:.0} nsec", "overhead", a.overhead_ns);
    limits_lines(s, "put", &a.capabilities, &a.put);
    limits_lines(s, "get", &a.capabilities, &a.get);
    limits_lines(s, "am", &a.capabilities, &a.am);
    if !a.capabilities.iter().any(|c| c.starts_with("am_")) {
        let _ = writeln!(
            s,
            "#  {:>20}: none (this transport has no active messages)",
            "active messages"
        );
    }
    if a.capabilities.iter().any(|c| c == "am_zcopy") {
        let _ = writeln!(
            s,
            "#  {:>20}: <= {}",
            "am header",
            size(a.max_am_header as u64)
        );
    }
    let atomics: Vec<&str> = [("atomic32", "32-bit"), ("atomic64", "64-bit")]
        .into_iter()
        .filter(|(f, _)| a.capabilities.iter().any(|c| c == f))
        .map(|(_, n)| n)
        .collect();
    if atomics.is_empty() {
        let _ = writeln!(s, "#  {:>20}: none", "atomics");
    } else {
        let swap = if a.capabilities.iter().any(|c| c == "atomic_swap") {
            "swap, "
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "#  {:>20}: add, fetch-add, {swap}compare-swap ({})",
            "atomics",
            atomics.join(", ")
        );
    }
    let conn = caps_line(&a.capabilities, "connect_to_");
    let _ = writeln!(
        s,
        "#  {:>20}: to {}",
        "connection",
        if conn.is_empty() {
            "none".into()
        } else {
            conn.replace(", ", ", to ")
        }
    );
    let mut other: Vec<&str> = Vec::new();
    for f in ["flush", "fence", "errhandle_peer_failure"] {
        if a.capabilities.iter().any(|c| c == f) {
            other.push(f);
        }
    }
    let _ = writeln!(s, "#  {:>20}: {}", "other", other.join(", "));
    let _ = writeln!(
        s,
        "#  {:>20}: {}",
        "memory types",
        a.memory_types.join(", ")
    );
    let _ = writeln!(
        s,
        "#  {:>20}: {} bytes",
        "device address", a.device_addr_len
    );
    let _ = writeln!(s, "#  {:>20}: {} bytes", "iface address", a.iface_addr_len);
    if a.ep_addr_len > 0 {
        let _ = writeln!(s, "#  {:>20}: {} bytes", "ep address", a.ep_addr_len);
    }
}

pub fn devices(mds: &[MdReport]) -> String {
    let mut s = String::new();
    for m in mds {
        let _ = writeln!(s, "#");
        let _ = writeln!(s, "# Memory domain: {}", m.memory_domain);
        let _ = writeln!(s, "#     Component: {}", m.component);
        if let Some(d) = &m.description {
            let _ = writeln!(s, "#        Device: {d}");
        }
        let _ = writeln!(s, "#  {:>20}: {}", "flags", m.flags.join(", "));
        if !m.alloc_mem_types.is_empty() {
            let _ = writeln!(
                s,
                "#  {:>20}: {} (max {})",
                "allocate",
                m.alloc_mem_types.join(", "),
                size(m.max_alloc)
            );
        }
        if !m.reg_mem_types.is_empty() {
            let _ = writeln!(
                s,
                "#  {:>20}: {}, cost: {:.0} nsec + {:.3} nsec/byte",
                "register",
                m.reg_mem_types.join(", "),
                m.reg_cost_ns,
                m.reg_cost_ns_per_byte
            );
        }
        if !m.export_mem_types.is_empty() {
            let _ = writeln!(
                s,
                "#  {:>20}: {}",
                "dma-buf export",
                m.export_mem_types.join(", ")
            );
        }
        if !m.detect_mem_types.is_empty() {
            let _ = writeln!(s, "#  {:>20}: {}", "detect", m.detect_mem_types.join(", "));
        }
        let _ = writeln!(s, "#  {:>20}: {} bytes", "remote key", m.rkey_packed_size);
        if let Some(d) = &m.system_device {
            let _ = writeln!(s, "#  {:>20}: {d}", "system device");
        }
        if m.transports.is_empty() {
            let _ = writeln!(
                s,
                "#  {:>20}: none of its own (a NIC with DMA-buf import carries this memory)",
                "transports"
            );
        }
        for t in &m.transports {
            transport(&mut s, t);
        }
    }
    s
}

pub fn absent_mds(list: &[AbsentMdReport]) -> String {
    let mut s = String::new();
    if list.is_empty() {
        return s;
    }
    s.push_str("#\n# Memory domains not available\n#\n");
    for a in list {
        let _ = writeln!(s, "# {:>8}: {}", a.component, a.reason);
    }
    s
}

pub fn absent(list: &[AbsentReport]) -> String {
    let mut s = String::new();
    if list.is_empty() {
        return s;
    }
    s.push_str("#\n# Transports not available\n#\n");
    for a in list {
        let _ = writeln!(s, "# {:>8}: {}", a.transport, a.reason);
    }
    s
}

pub fn config(vars: &[ConfigReport], full: bool) -> String {
    let mut s = String::new();
    for v in vars {
        if full {
            let _ = writeln!(s, "#");
            for line in v.doc.split('\n') {
                let _ = writeln!(s, "# {line}");
            }
            let _ = writeln!(s, "#");
            let _ = writeln!(
                s,
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
        let _ = writeln!(s, "{}={}", v.name, v.value);
    }
    s
}
