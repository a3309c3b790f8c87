//! The registry: every component this process can use, built in
//! (`inventory`) or loaded from modules, with the configuration in force.

pub mod loader;

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::component::{BuiltinComponent, Component};
use crate::config::{AllowList, Config, UnknownVar};
use crate::error::{Result, UctError};
use crate::iface::{Iface, IfaceParams, TlResource};
use crate::md::MemoryDomain;
use crate::memory::MemoryType;
use crate::rkey::{RemoteKey, RkeyBundle};

/// Where a component came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into the program.
    Builtin,
    /// Loaded from a module file.
    Module {
        /// Module name.
        name: String,
        /// The file it was loaded from.
        path: PathBuf,
    },
}

/// A component and its origin.
#[derive(Clone)]
pub struct ComponentInfo {
    /// The component.
    pub component: Arc<dyn Component>,
    /// Where it came from.
    pub origin: Origin,
}

/// What happened to a module file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleStatus {
    /// Loaded; the components it provided.
    Loaded(Vec<String>),
    /// Not loaded because configuration excluded it.
    Excluded(String),
    /// Opened, but its ABI descriptor was refused.
    Refused(String),
    /// Could not be opened or initialised.
    Failed(String),
}

impl ModuleStatus {
    /// Whether it loaded.
    pub fn is_loaded(&self) -> bool {
        matches!(self, ModuleStatus::Loaded(_))
    }

    /// One word for listings.
    pub fn label(&self) -> &'static str {
        match self {
            ModuleStatus::Loaded(_) => "loaded",
            ModuleStatus::Excluded(_) => "not loaded",
            ModuleStatus::Refused(_) => "refused",
            ModuleStatus::Failed(_) => "failed",
        }
    }

    /// The reason it is not loaded, if it is not.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ModuleStatus::Loaded(_) => None,
            ModuleStatus::Excluded(r) | ModuleStatus::Refused(r) | ModuleStatus::Failed(r) => {
                Some(r)
            }
        }
    }
}

impl fmt::Display for ModuleStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModuleStatus::Loaded(c) => write!(f, "loaded (components: {})", c.join(", ")),
            other => write!(f, "{}: {}", other.label(), other.reason().unwrap_or("")),
        }
    }
}

/// One module file found in the search path.
#[derive(Debug, Clone)]
pub struct ModuleRecord {
    /// Module name (the `<name>` of `libuct_<name>.so`).
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// What happened to it.
    pub status: ModuleStatus,
}

/// A transport on a device, with its component and open MD.
#[derive(Clone)]
pub struct Resource {
    /// The component that provides it.
    pub component: Arc<dyn Component>,
    /// The open memory domain it runs over.
    pub md: Arc<dyn MemoryDomain>,
    /// Transport and device.
    pub tl: TlResource,
}

/// How to build a registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Folders searched first for modules (from `UCT_MODULE_DIR`).
    pub module_dirs: Vec<PathBuf>,
    /// Search the executable's folder and `<exe>/../lib/uct` too.
    pub default_dirs: bool,
    /// Which modules to load (from `UCT_MODULES`).
    pub modules: AllowList,
}

/// Every component of this process, its modules and its configuration.
pub struct Registry {
    components: Vec<ComponentInfo>,
    modules: Vec<ModuleRecord>,
    search_path: Vec<PathBuf>,
    config: Config,
    unknown: Vec<UnknownVar>,
    tls: AllowList,
    net_devices: AllowList,
    md_errors: std::sync::Mutex<Vec<(String, String)>>,
    config_errors: Vec<crate::config::ConfigError>,
}

impl Registry {
    /// The process-wide registry, built from the environment on first use.
    /// An invalid configuration value is logged and its default used.
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(|| Registry::build_from_env(true))
    }

    /// Builds a registry from `UCT_*` variables; an invalid value is an
    /// error that names it.
    pub fn from_env() -> Result<Registry> {
        Config::from_env(&[])?;
        let reg = Registry::build_from_env(false);
        match reg.config_errors.first() {
            Some(e) => Err(e.clone().into()),
            None => Ok(reg),
        }
    }

    fn build_from_env(lenient: bool) -> Registry {
        let (core, _) = Config::from_env_lenient(&[]);
        let opts = RegistryOptions {
            module_dirs: core.get_paths("UCT_MODULE_DIR").unwrap_or_default(),
            default_dirs: true,
            modules: core
                .get_allow_list("UCT_MODULES")
                .unwrap_or_else(|_| AllowList::all()),
        };
        let reg = Registry::with_options(opts);
        if lenient {
            for e in &reg.config_errors {
                log::error!("{e}; using its default");
            }
        }
        reg
    }

    /// Builds a registry with explicit module settings; the rest of the
    /// configuration still comes from the environment. Invalid values fall
    /// back to their defaults and are kept in
    /// [`config_errors`](Self::config_errors).
    pub fn with_options(opts: RegistryOptions) -> Registry {
        let mut components: Vec<ComponentInfo> = inventory::iter::<BuiltinComponent>
            .into_iter()
            .map(|b| ComponentInfo {
                component: (b.create)(),
                origin: Origin::Builtin,
            })
            .collect();
        components.sort_by(|a, b| a.component.name().cmp(b.component.name()));

        let search_path = if opts.default_dirs {
            loader::search_path(&opts.module_dirs)
        } else {
            opts.module_dirs.clone()
        };
        let mut modules = Vec::new();
        for (name, path) in loader::discover(&search_path) {
            if !opts.modules.allows(&name) {
                modules.push(ModuleRecord {
                    name,
                    path,
                    status: ModuleStatus::Excluded(format!(
                        "excluded by UCT_MODULES={}{}",
                        if opts.modules.is_negated() { "^" } else { "" },
                        opts.modules.names().join(",")
                    )),
                });
                continue;
            }
            let (status, comps) = loader::load(&name, &path);
            match &status {
                ModuleStatus::Loaded(c) => {
                    log::debug!(
                        "module {name} loaded from {}: {}",
                        path.display(),
                        c.join(", ")
                    )
                }
                other => log::info!("module {name} ({}) {other}", path.display()),
            }
            for c in comps {
                if components.iter().any(|e| e.component.name() == c.name()) {
                    log::warn!(
                        "module {name} provides component {} which is already present; ignoring the module's copy",
                        c.name()
                    );
                    continue;
                }
                components.push(ComponentInfo {
                    component: c,
                    origin: Origin::Module {
                        name: name.clone(),
                        path: path.clone(),
                    },
                });
            }
            modules.push(ModuleRecord { name, path, status });
        }

        let tables: Vec<(String, &'static [crate::config::ConfigVar])> = components
            .iter()
            .map(|c| (c.component.name().to_string(), c.component.config_table()))
            .collect();
        let table_refs: Vec<(&str, &'static [crate::config::ConfigVar])> =
            tables.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let (config, config_errors) = Config::from_env_lenient(&table_refs);
        // Variables of modules that are present but not loaded are not
        // reported as unknown: their tables are simply not here.
        let foreign: Vec<String> = modules
            .iter()
            .filter(|m| !m.status.is_loaded())
            .map(|m| format!("UCT_{}_", m.name.to_ascii_uppercase()))
            .collect();
        let unknown = config.unknown_env_vars(&foreign);
        for u in &unknown {
            log::warn!("{u}");
        }
        let tls = config
            .get_allow_list("UCT_TLS")
            .unwrap_or_else(|_| AllowList::all());
        let net_devices = config
            .get_allow_list("UCT_NET_DEVICES")
            .unwrap_or_else(|_| AllowList::all());
        Registry {
            components,
            modules,
            search_path,
            config,
            unknown,
            tls,
            net_devices,
            md_errors: Default::default(),
            config_errors,
        }
    }

    /// Configuration values that were invalid and replaced by defaults.
    pub fn config_errors(&self) -> &[crate::config::ConfigError] {
        &self.config_errors
    }

    /// Every component, built-in first (sorted by name), then those of modules.
    pub fn components(&self) -> &[ComponentInfo] {
        &self.components
    }

    /// The component called `name`.
    pub fn component(&self, name: &str) -> Option<&Arc<dyn Component>> {
        self.components
            .iter()
            .find(|c| c.component.name() == name)
            .map(|c| &c.component)
    }

    /// Every module file found, with what happened to it.
    pub fn modules(&self) -> &[ModuleRecord] {
        &self.modules
    }

    /// Folders searched for modules, in order.
    pub fn search_path(&self) -> &[PathBuf] {
        &self.search_path
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `UCT_*` variables in the environment nobody declared.
    pub fn unknown_vars(&self) -> &[UnknownVar] {
        &self.unknown
    }

    /// Every transport some component of this process provides, whether or
    /// not its devices are present, sorted. Components declare their
    /// transports ([`Component::transport_names`]); the registry has no list
    /// of its own.
    pub fn transport_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .components
            .iter()
            .flat_map(|c| c.component.transport_names())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Whether `UCT_TLS` allows transport `tl`.
    pub fn transport_allowed(&self, tl: &str) -> bool {
        self.tls.allows(tl)
    }

    /// Every transport on every device, as allowed by `UCT_TLS` and
    /// `UCT_NET_DEVICES`. Memory domains that fail to open are skipped and
    /// remembered for [`explain_absent`](Self::explain_absent).
    pub fn resources(&self) -> Vec<Resource> {
        self.resources_filtered(true)
    }

    /// Like [`resources`](Self::resources) with or without `UCT_TLS`.
    pub fn resources_filtered(&self, apply_config: bool) -> Vec<Resource> {
        let mut out = Vec::new();
        for (comp, md) in self.memory_domains() {
            let tls = match comp.tl_resources(&md) {
                Ok(t) => t,
                Err(e) => {
                    self.note_md_error(comp.name(), format!("memory domain {}: {e}", md.name()));
                    continue;
                }
            };
            for tl in tls {
                if apply_config {
                    if !self.tls.allows(&tl.transport) {
                        continue;
                    }
                    if tl.device_type == crate::iface::DeviceType::Network
                        && !self.net_devices.allows(&tl.device)
                    {
                        continue;
                    }
                }
                out.push(Resource {
                    component: comp.clone(),
                    md: md.clone(),
                    tl,
                });
            }
        }
        out
    }

    /// Every memory domain of every component, with or without transports.
    /// Those that fail to open are remembered as in [`resources`](Self::resources).
    pub fn memory_domains(&self) -> Vec<(Arc<dyn Component>, Arc<dyn MemoryDomain>)> {
        let mut out = Vec::new();
        for info in &self.components {
            let comp = &info.component;
            let names = match comp.md_names() {
                Ok(m) => m,
                Err(e) => {
                    self.note_md_error(comp.name(), e.to_string());
                    continue;
                }
            };
            for md_name in names {
                match comp.open_md(&md_name) {
                    Ok(md) => out.push((comp.clone(), md)),
                    Err(e) => {
                        self.note_md_error(comp.name(), format!("memory domain {md_name}: {e}"))
                    }
                }
            }
        }
        out
    }

    /// Opens memory domain `name` of whichever component has it.
    pub fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        self.memory_domains()
            .into_iter()
            .find(|(_, md)| md.name() == name)
            .map(|(_, md)| md)
            .ok_or_else(|| {
                let errs = self.md_errors();
                UctError::NoDevice(format!(
                    "memory domain {name} is not present{}",
                    if errs.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " ({})",
                            errs.iter()
                                .map(|(c, m)| format!("component {c}: {m}"))
                                .collect::<Vec<_>>()
                                .join("; ")
                        )
                    }
                ))
            })
    }

    /// The first memory domain that allocates `mem_type` memory (device
    /// memory comes from its device's MD), or why there is none, with the
    /// reasons components gave for MDs they could not open.
    pub fn allocating_md(&self, mem_type: MemoryType) -> Result<Arc<dyn MemoryDomain>> {
        self.memory_domains()
            .into_iter()
            .map(|(_, m)| m)
            .find(|m| m.attrs().alloc_mem_types.contains(&mem_type))
            .ok_or_else(|| {
                let why: Vec<String> = self
                    .md_errors()
                    .into_iter()
                    .map(|(c, m)| format!("{c}: {m}"))
                    .collect();
                UctError::MemoryTypeUnsupported {
                    mem_type,
                    owner: "this host".into(),
                    hint: format!(
                        "no memory domain here allocates {mem_type} memory{}",
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", why.join("; "))
                        }
                    ),
                }
            })
    }

    /// Why components found no memory domain or could not open one, as
    /// (component, reason), collected so far.
    pub fn md_errors(&self) -> Vec<(String, String)> {
        self.md_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note_md_error(&self, component: &str, msg: String) {
        log::debug!("component {component}: {msg}");
        let mut errs = self.md_errors.lock().unwrap_or_else(|p| p.into_inner());
        if !errs.iter().any(|(c, m)| c == component && *m == msg) {
            errs.push((component.to_string(), msg));
        }
    }

    /// Finds transport `tl`, on `device` or on its first device.
    pub fn find_resource(&self, tl: &str, device: Option<&str>) -> Result<Resource> {
        let all = self.resources();
        all.iter()
            .find(|r| r.tl.transport == tl && device.is_none_or(|d| d == r.tl.device))
            .cloned()
            .ok_or_else(|| match device {
                Some(d) if all.iter().any(|r| r.tl.transport == tl) => UctError::NoDevice(format!(
                    "transport {tl} has no device {d} (it has: {})",
                    all.iter()
                        .filter(|r| r.tl.transport == tl)
                        .map(|r| r.tl.device.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                _ => UctError::NoTransport(format!("{tl} ({})", self.explain_absent(tl))),
            })
    }

    /// Opens an iface of transport `tl`.
    pub fn open_iface(
        &self,
        tl: &str,
        device: Option<&str>,
        params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        let r = self.find_resource(tl, device)?;
        r.component.open_iface(&r.md, &r.tl, params)
    }

    /// Unpacks the entry of memory domain `md` from a packed rkey bundle.
    pub fn unpack_rkey(&self, bytes: &[u8], md: &str) -> Result<RemoteKey> {
        let bundle = RkeyBundle::unpack(bytes)?;
        let entry = bundle.find(md)?;
        let comp = self.component(&entry.component).ok_or_else(|| {
            UctError::BadRkey(format!(
                "it was packed by component {}, which this process does not have",
                entry.component
            ))
        })?;
        comp.unpack_rkey(entry)
    }

    /// Why transport `tl` is not among [`resources`](Self::resources).
    pub fn explain_absent(&self, tl: &str) -> String {
        if !self.tls.allows(tl) {
            return format!(
                "excluded by UCT_TLS={}",
                self.config.get_str("UCT_TLS").unwrap_or("?")
            );
        }
        if let Some(info) = self
            .components
            .iter()
            .find(|c| c.component.transport_names().iter().any(|t| t == tl))
        {
            let name = info.component.name();
            let errs = self.md_errors.lock().unwrap_or_else(|p| p.into_inner());
            let detail: Vec<&str> = errs
                .iter()
                .filter(|(c, _)| c == name)
                .map(|(_, m)| m.as_str())
                .collect();
            return if detail.is_empty() {
                format!(
                    "component {name} found no device for it (or UCT_NET_DEVICES excludes them)"
                )
            } else {
                format!(
                    "component {name} found no usable device: {}",
                    detail.join("; ")
                )
            };
        }
        let not_loaded: Vec<String> = self
            .modules
            .iter()
            .filter(|m| !m.status.is_loaded())
            .map(|m| format!("module {} ({}) {}", m.name, m.path.display(), m.status))
            .collect();
        if not_loaded.is_empty() {
            format!(
                "no component provides it: none built in, and no module in the module path ({}) declares it",
                self.search_path
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            )
        } else {
            format!(
                "no component here provides it; it may be in a module that did not load: {}",
                not_loaded.join("; ")
            )
        }
    }
}
