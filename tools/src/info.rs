//! What `transport-info` reports, collected from the registry into plain
//! structures that print as text or JSON.

use serde::Serialize;
use uct_core::config::ValueSource;
use uct_core::iface::SizeLimits;
use uct_core::registry::{ModuleStatus, Origin};
use uct_core::{IfaceParams, MemoryType, Registry};

#[derive(Debug, Serialize)]
pub struct BuildInfo {
    pub version: &'static str,
    pub module_abi_fingerprint: &'static str,
    pub profile: &'static str,
    pub features: Vec<&'static str>,
}

pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: uct_core::VERSION,
        module_abi_fingerprint: uct_core::module_abi::fingerprint(),
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        features: vec![],
    }
}

#[derive(Debug, Serialize)]
pub struct ComponentReport {
    pub name: String,
    pub description: String,
    /// `builtin`, or the module file it came from.
    pub origin: String,
    pub transports: Vec<String>,
    pub memory_domains: Vec<String>,
    pub error: Option<String>,
}

pub fn components(reg: &Registry) -> Vec<ComponentReport> {
    reg.components()
        .iter()
        .map(|c| {
            let (memory_domains, error) = match c.component.md_names() {
                Ok(m) => (m, None),
                Err(e) => (vec![], Some(e.to_string())),
            };
            ComponentReport {
                name: c.component.name().to_string(),
                description: c.component.description().to_string(),
                origin: match &c.origin {
                    Origin::Builtin => "builtin".into(),
                    Origin::Module { name, path } => {
                        format!("module {name} ({})", path.display())
                    }
                },
                transports: c.component.transport_names(),
                memory_domains,
                error,
            }
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct ModuleReport {
    pub name: String,
    pub path: String,
    pub status: &'static str,
    pub components: Vec<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ModulesReport {
    pub search_path: Vec<String>,
    pub modules: Vec<ModuleReport>,
}

pub fn modules(reg: &Registry) -> ModulesReport {
    ModulesReport {
        search_path: reg
            .search_path()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        modules: reg
            .modules()
            .iter()
            .map(|m| ModuleReport {
                name: m.name.clone(),
                path: m.path.display().to_string(),
                status: m.status.label(),
                components: match &m.status {
                    ModuleStatus::Loaded(c) => c.clone(),
                    _ => vec![],
                },
                reason: m.status.reason().map(str::to_string),
            })
            .collect(),
    }
}

#[derive(Debug, Serialize)]
pub struct LimitsReport {
    pub max_short: usize,
    pub max_bcopy: usize,
    pub min_zcopy: usize,
    pub max_zcopy: usize,
    pub max_iov: usize,
}

impl From<SizeLimits> for LimitsReport {
    fn from(limits: SizeLimits) -> Self {
        LimitsReport {
            max_short: limits.max_short,
            max_bcopy: limits.max_bcopy,
            min_zcopy: limits.min_zcopy,
            max_zcopy: limits.max_zcopy,
            max_iov: limits.max_iov,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct IfaceReport {
    pub capabilities: Vec<String>,
    pub put: LimitsReport,
    pub get: LimitsReport,
    pub am: LimitsReport,
    pub max_am_header: usize,
    pub memory_types: Vec<String>,
    pub latency_ns: f64,
    pub bandwidth_mbps: f64,
    pub overhead_ns: f64,
    pub device_addr_len: usize,
    pub iface_addr_len: usize,
    pub ep_addr_len: usize,
}

#[derive(Debug, Serialize)]
pub struct TransportReport {
    pub transport: String,
    pub device: String,
    pub device_type: &'static str,
    pub system_device: Option<String>,
    pub attrs: Option<IfaceReport>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct MdReport {
    pub component: String,
    pub memory_domain: String,
    pub description: Option<String>,
    pub flags: Vec<String>,
    pub alloc_mem_types: Vec<String>,
    pub reg_mem_types: Vec<String>,
    pub export_mem_types: Vec<String>,
    pub detect_mem_types: Vec<String>,
    pub max_alloc: u64,
    pub rkey_packed_size: usize,
    pub reg_cost_ns: f64,
    pub reg_cost_ns_per_byte: f64,
    pub system_device: Option<String>,
    pub transports: Vec<TransportReport>,
}

fn names(types: &[MemoryType]) -> Vec<String> {
    types.iter().map(|t| t.name().to_string()).collect()
}

fn flag_names<F: bitflags::Flags>(f: F) -> Vec<String> {
    f.iter_names()
        .map(|(n, _)| n.to_ascii_lowercase())
        .collect()
}

/// Every MD with its transports; `only` keeps those of one transport.
pub fn devices(reg: &Registry, only: Option<&str>) -> Vec<MdReport> {
    let mut out: Vec<MdReport> = Vec::new();
    for resource in reg.resources() {
        if only.is_some_and(|t| t != resource.tl.transport) {
            continue;
        }
        let (attrs, error) =
            match resource
                .component
                .open_iface(&resource.md, &resource.tl, &IfaceParams::default())
            {
                Ok(iface) => {
                    let iface_attrs = iface.attrs().clone();
                    (
                        Some(IfaceReport {
                            capabilities: flag_names(iface_attrs.caps),
                            put: iface_attrs.put.into(),
                            get: iface_attrs.get.into(),
                            am: iface_attrs.am.into(),
                            max_am_header: iface_attrs.max_am_header,
                            memory_types: names(&iface_attrs.mem_types),
                            latency_ns: iface_attrs.latency_ns,
                            bandwidth_mbps: iface_attrs.bandwidth_bps / 1e6,
                            overhead_ns: iface_attrs.overhead_ns,
                            device_addr_len: iface_attrs.device_addr_len,
                            iface_addr_len: iface_attrs.iface_addr_len,
                            ep_addr_len: iface_attrs.ep_addr_len,
                        }),
                        None,
                    )
                }
                Err(e) => (None, Some(e.to_string())),
            };
        let tr = TransportReport {
            transport: resource.tl.transport.clone(),
            device: resource.tl.device.clone(),
            device_type: resource.tl.device_type.name(),
            system_device: resource.tl.system_device.clone(),
            attrs,
            error,
        };
        if let Some(m) = out.iter_mut().find(|m| {
            m.component == resource.component.name() && m.memory_domain == resource.md.name()
        }) {
            m.transports.push(tr);
            continue;
        }
        out.push(md_report(
            resource.component.name(),
            resource.md.as_ref(),
            vec![tr],
        ));
    }
    if only.is_none() {
        // Memory domains without transports (device memory such as Gaudi).
        for (c, md) in reg.memory_domains() {
            if !out
                .iter()
                .any(|m| m.component == c.name() && m.memory_domain == md.name())
            {
                out.push(md_report(c.name(), md.as_ref(), vec![]));
            }
        }
    }
    out
}

fn md_report(
    component: &str,
    md: &dyn uct_core::MemoryDomain,
    transports: Vec<TransportReport>,
) -> MdReport {
    let attrs = md.attrs();
    MdReport {
        component: component.to_string(),
        memory_domain: md.name().to_string(),
        description: md.description(),
        flags: flag_names(attrs.flags),
        alloc_mem_types: names(&attrs.alloc_mem_types),
        reg_mem_types: names(&attrs.reg_mem_types),
        export_mem_types: names(&attrs.export_mem_types),
        detect_mem_types: names(&attrs.detect_mem_types),
        max_alloc: attrs.max_alloc,
        rkey_packed_size: attrs.rkey_packed_size,
        reg_cost_ns: attrs.reg_cost.overhead_ns,
        reg_cost_ns_per_byte: attrs.reg_cost.per_byte_ns,
        system_device: attrs.system_device,
        transports,
    }
}

/// Components whose memory domains are absent, with the reason: those
/// without transports (gaudi without hl-thunk), and those that found no
/// memory domain at all (cuda without the CUDA driver, whose cuda_copy is
/// then listed among the absent transports too).
#[derive(Debug, Serialize)]
pub struct AbsentMdReport {
    pub component: String,
    pub reason: String,
}

pub fn absent_mds(reg: &Registry) -> Vec<AbsentMdReport> {
    let _ = reg.memory_domains();
    reg.md_errors()
        .into_iter()
        .filter(|(c, _)| {
            reg.component(c)
                .is_some_and(|comp| comp.transport_names().is_empty() || comp.md_names().is_err())
        })
        .map(|(component, reason)| AbsentMdReport { component, reason })
        .collect()
}

/// Transports that are known but absent, with the reason.
#[derive(Debug, Serialize)]
pub struct AbsentReport {
    pub transport: String,
    pub reason: String,
}

pub fn absent(reg: &Registry) -> Vec<AbsentReport> {
    let present: Vec<String> = reg
        .resources()
        .into_iter()
        .map(|r| r.tl.transport)
        .collect();
    reg.transport_names()
        .into_iter()
        .filter(|t| !present.contains(t))
        .map(|t| AbsentReport {
            reason: reg.explain_absent(&t),
            transport: t,
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct ConfigReport {
    pub name: &'static str,
    pub value: String,
    pub default: &'static str,
    pub from_environment: bool,
    pub owner: String,
    pub doc: &'static str,
}

pub fn config(reg: &Registry) -> Vec<ConfigReport> {
    reg.config()
        .entries()
        .map(|e| ConfigReport {
            name: e.var.name,
            value: e.value.clone(),
            default: e.var.default,
            from_environment: e.source == ValueSource::Environment,
            owner: e.owner.clone(),
            doc: e.var.doc,
        })
        .collect()
}

/// Capability names in the order `ucx_info` prints them.
pub fn caps_line(caps: &[String], prefix: &str) -> String {
    caps.iter()
        .filter(|c| c.starts_with(prefix))
        .map(|c| c.trim_start_matches(prefix).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
