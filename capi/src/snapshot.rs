//! The snapshot behind a listing: what the registry finds, taken once,
//! with every string C will see kept as a C string.

use std::ffi::{c_char, CString};

use uct_core::registry::Origin;
use uct_core::{IfaceParams, ModuleStatus, Registry};
use uct_transfer::{MemoryType, Transport};

use crate::error::CapiError;
use crate::listing::{
    UctRsListKind, UCT_RS_LIST_COMPONENTS, UCT_RS_LIST_MEMORY_DOMAINS, UCT_RS_LIST_MODULES,
    UCT_RS_LIST_PROBE, UCT_RS_LIST_TRANSPORTS,
};

/// A string for C: a NUL inside is shown, not cut at.
fn c(s: impl Into<String>) -> CString {
    CString::new(s.into().replace('\0', "\\0")).unwrap_or_default()
}

fn opt_c(s: Option<impl Into<String>>) -> Option<CString> {
    s.map(c)
}

pub(crate) fn p(s: &CString) -> *const c_char {
    s.as_ptr()
}

pub(crate) fn opt_p(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
}

fn type_names(types: &[MemoryType]) -> CString {
    c(types.iter().map(|t| t.name()).collect::<Vec<_>>().join(","))
}

pub(crate) struct Build(pub(crate) [CString; 4]);

pub(crate) struct Probe {
    pub(crate) transport: CString,
    pub(crate) device: Option<CString>,
    pub(crate) usable: bool,
    pub(crate) reason: Option<CString>,
}

pub(crate) struct Component(pub(crate) [CString; 5], pub(crate) Option<CString>);

pub(crate) struct Module(pub(crate) [CString; 4], pub(crate) Option<CString>);

pub(crate) struct Md {
    pub(crate) component: CString,
    pub(crate) name: Option<CString>,
    pub(crate) description: Option<CString>,
    pub(crate) types: [CString; 4],
    pub(crate) max_alloc: u64,
    pub(crate) rkey_size: usize,
    pub(crate) reason: Option<CString>,
}

pub(crate) struct Tl {
    pub(crate) transport: CString,
    pub(crate) present: Option<[CString; 4]>,
    pub(crate) reason: Option<CString>,
    pub(crate) caps: Option<[CString; 2]>,
    pub(crate) max_put_zcopy: usize,
    pub(crate) latency_ns: f64,
    pub(crate) bandwidth_mbps: f64,
}

/// A listing, as its table holds it: every string C sees lives here.
pub(crate) struct Listing {
    pub(crate) build: Build,
    pub(crate) probe: Vec<Probe>,
    pub(crate) components: Vec<Component>,
    pub(crate) modules: Vec<Module>,
    pub(crate) mds: Vec<Md>,
    pub(crate) tls: Vec<Tl>,
}

fn lower_names<I: Iterator<Item = (&'static str, T)>, T>(names: I) -> String {
    names
        .map(|(n, _)| n.to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

impl Listing {
    pub(crate) fn take(reg: &Registry) -> Listing {
        let build = Build([
            c(uct_core::VERSION),
            c(uct_core::module_abi::fingerprint()),
            c(if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }),
            c(reg
                .search_path()
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":")),
        ]);
        let probe = Transport::probe()
            .into_iter()
            .map(|p| Probe {
                transport: c(p.transport),
                device: opt_c(p.device),
                usable: p.usable,
                reason: opt_c(p.reason),
            })
            .collect();
        let components = reg
            .components()
            .iter()
            .map(|ci| {
                let comp = &ci.component;
                let (mds, error) = match comp.md_names() {
                    Ok(m) => (m.join(","), None),
                    Err(e) => (String::new(), Some(c(e.to_string()))),
                };
                let origin = match &ci.origin {
                    Origin::Builtin => "builtin".to_string(),
                    Origin::Module { name, path } => format!("module {name} ({})", path.display()),
                };
                Component(
                    [
                        c(comp.name()),
                        c(comp.description()),
                        c(origin),
                        c(comp.transport_names().join(",")),
                        c(mds),
                    ],
                    error,
                )
            })
            .collect();
        let modules = reg
            .modules()
            .iter()
            .map(|m| {
                let comps = match &m.status {
                    ModuleStatus::Loaded(cs) => cs.join(","),
                    _ => String::new(),
                };
                Module(
                    [
                        c(m.name.as_str()),
                        c(m.path.display().to_string()),
                        c(m.status.label()),
                        c(comps),
                    ],
                    opt_c(m.status.reason()),
                )
            })
            .collect();
        let mut mds: Vec<Md> = reg
            .memory_domains()
            .into_iter()
            .map(|(comp, md)| {
                let a = md.attrs();
                Md {
                    component: c(comp.name()),
                    name: Some(c(md.name())),
                    description: opt_c(md.description()),
                    types: [
                        c(lower_names(a.flags.iter_names())),
                        type_names(&a.alloc_mem_types),
                        type_names(&a.reg_mem_types),
                        type_names(&a.detect_mem_types),
                    ],
                    max_alloc: a.max_alloc,
                    rkey_size: a.rkey_packed_size,
                    reason: None,
                }
            })
            .collect();
        // Components whose memory domains are absent, as transport-info
        // lists them: those without transports, and those that found none.
        for (comp, reason) in reg.md_errors() {
            let absent = reg
                .component(&comp)
                .is_some_and(|k| k.transport_names().is_empty() || k.md_names().is_err());
            if absent {
                mds.push(Md {
                    component: c(comp),
                    name: None,
                    description: None,
                    types: [c(""), c(""), c(""), c("")],
                    max_alloc: 0,
                    rkey_size: 0,
                    reason: Some(c(reason)),
                });
            }
        }
        let resources = reg.resources();
        let mut tls: Vec<Tl> = resources
            .iter()
            .map(|r| {
                let present = Some([
                    c(r.tl.device.as_str()),
                    c(r.tl.device_type.name()),
                    c(r.component.name()),
                    c(r.md.name()),
                ]);
                match r
                    .component
                    .open_iface(&r.md, &r.tl, &IfaceParams::default())
                {
                    Ok(iface) => {
                        let a = iface.attrs();
                        Tl {
                            transport: c(r.tl.transport.as_str()),
                            present,
                            reason: None,
                            caps: Some([
                                c(lower_names(a.caps.iter_names())),
                                type_names(&a.mem_types),
                            ]),
                            max_put_zcopy: a.put.max_zcopy,
                            latency_ns: a.latency_ns,
                            bandwidth_mbps: a.bandwidth_bps / 1e6,
                        }
                    }
                    Err(e) => Tl {
                        transport: c(r.tl.transport.as_str()),
                        present,
                        reason: Some(c(format!("its iface does not open: {e}"))),
                        caps: None,
                        max_put_zcopy: 0,
                        latency_ns: 0.0,
                        bandwidth_mbps: 0.0,
                    },
                }
            })
            .collect();
        for name in reg.transport_names() {
            if !resources.iter().any(|r| r.tl.transport == name) {
                tls.push(Tl {
                    reason: Some(c(reg.explain_absent(&name))),
                    transport: c(name),
                    present: None,
                    caps: None,
                    max_put_zcopy: 0,
                    latency_ns: 0.0,
                    bandwidth_mbps: 0.0,
                });
            }
        }
        Listing {
            build,
            probe,
            components,
            modules,
            mds,
            tls,
        }
    }

    pub(crate) fn count(&self, what: UctRsListKind) -> Result<usize, CapiError> {
        Ok(match what {
            UCT_RS_LIST_PROBE => self.probe.len(),
            UCT_RS_LIST_COMPONENTS => self.components.len(),
            UCT_RS_LIST_MODULES => self.modules.len(),
            UCT_RS_LIST_MEMORY_DOMAINS => self.mds.len(),
            UCT_RS_LIST_TRANSPORTS => self.tls.len(),
            other => {
                return Err(CapiError::Argument(format!(
                    "what {other} is not a list; use one of the UCT_RS_LIST_* values"
                )))
            }
        })
    }
}
