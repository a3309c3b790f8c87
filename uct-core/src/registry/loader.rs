//! Finding and loading `libuct_<name>.so` modules.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use super::ModuleStatus;
use crate::component::Component;
use crate::module_abi::{
    self, AbiFn, InitFn, ModuleHost, ABI_SYMBOL, INIT_SYMBOL, MODULE_ABI_VERSION, MODULE_MAGIC,
};

const PREFIX: &str = "libuct_";
const SUFFIX: &str = ".so";

/// The module folders in search order: `dirs` from `UCT_MODULE_DIR`, the
/// executable's folder, then `<exe>/../lib/uct`.
pub fn search_path(configured: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = configured.to_vec();
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        out.push(exe_dir.join("../lib/uct"));
        out.insert(configured.len(), exe_dir);
    }
    out
}

/// The C ABI's own library (`libuct_rs.so`, capi/): it shares the module
/// prefix but is the framework, not a module, and sits beside the modules.
const NOT_MODULES: &[&str] = &["rs"];

/// Module name of a file called `libuct_<name>.so`.
pub fn module_name(file: &Path) -> Option<String> {
    let f = file.file_name()?.to_str()?;
    let name = f.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    (!name.is_empty() && !NOT_MODULES.contains(&name)).then(|| name.to_string())
}

/// Every module file in the search path; the first file of a name wins.
pub fn discover(dirs: &[PathBuf]) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        for path in files {
            let Some(name) = module_name(&path) else {
                continue;
            };
            if let Some((_, first)) = found.iter().find(|(n, _)| *n == name) {
                log::debug!(
                    "module {name}: {} is shadowed by {}",
                    path.display(),
                    first.display()
                );
                continue;
            }
            found.push((name, path));
        }
    }
    found
}

/// Loads one module: open it, check its ABI descriptor, then call its init.
/// The library stays loaded for the life of the process: the components it
/// returned point into its code.
pub fn load(name: &str, path: &Path) -> (ModuleStatus, Vec<Arc<dyn Component>>) {
    // SAFETY: opening a library runs its initialisers; a module file is
    // trusted code the user placed in the module path, as in UCX.
    let lib = match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) } {
        Ok(l) => l,
        Err(e) => {
            return (
                ModuleStatus::Failed(format!(
                    "the loader could not open it: {e}; install the libraries it needs (ldd {}) or exclude it with UCT_MODULES=^{name}",
                    path.display()
                )),
                vec![],
            )
        }
    };
    if let Err(reason) = check_abi(&lib) {
        return (ModuleStatus::Refused(reason), vec![]);
    }
    // SAFETY: the fingerprint matched, so the symbol has the Rust signature
    // `InitFn` from an identical build of uct-core and rustc.
    let init: InitFn = match unsafe { lib.get::<InitFn>(INIT_SYMBOL) } {
        Ok(f) => *f,
        Err(e) => {
            return (
                ModuleStatus::Refused(format!(
                "it has no uct_module_init symbol ({e}); declare it with uct_core::declare_module!"
            )),
                vec![],
            )
        }
    };
    let host = ModuleHost::current();
    let components = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| init(&host))) {
        Ok(exports) => exports.components,
        Err(_) => {
            return (
                ModuleStatus::Failed("its init function panicked; see the log above".into()),
                vec![],
            )
        }
    };
    // Deliberately never unloaded: trait objects from the module live on.
    std::mem::forget(lib);
    let names = components.iter().map(|c| c.name().to_string()).collect();
    (ModuleStatus::Loaded(names), components)
}

fn check_abi(lib: &Library) -> Result<(), String> {
    // SAFETY: `uct_module_abi` is declared with a C signature and no
    // arguments by every module ABI version.
    let abi_fn: AbiFn = match unsafe { lib.get::<AbiFn>(ABI_SYMBOL) } {
        Ok(f) => *f,
        Err(_) => {
            return Err(
                "it exports no uct_module_abi symbol: not a uct-rs module; remove it from the module path"
                    .into(),
            )
        }
    };
    let desc = abi_fn();
    if desc.is_null() {
        return Err("its uct_module_abi returned null".into());
    }
    // SAFETY: a module returns a pointer to a static descriptor whose first
    // field, in every ABI version, is the u64 magic.
    let magic = unsafe { std::ptr::read_unaligned(desc as *const u64) };
    if magic != MODULE_MAGIC {
        return Err(format!(
            "its ABI descriptor has magic {magic:#x}, not {MODULE_MAGIC:#x}: not a uct-rs module"
        ));
    }
    // SAFETY: the magic says this is a `ModuleAbi` of some version; the
    // version field is in the same place in all of them.
    let d = unsafe { &*desc };
    if d.abi_version != MODULE_ABI_VERSION {
        return Err(format!(
            "module ABI version {} does not match the host's {MODULE_ABI_VERSION}; rebuild the module with this uct-rs",
            d.abi_version
        ));
    }
    if d.fingerprint.is_null() {
        return Err("its ABI fingerprint is missing".into());
    }
    // SAFETY: version 1 defines `fingerprint` as a nul-terminated string.
    let fp = unsafe { CStr::from_ptr(d.fingerprint) }.to_string_lossy();
    let ours = module_abi::fingerprint();
    if fp != ours {
        return Err(format!(
            "wrong ABI fingerprint: the module was built for \"{fp}\", this program is \"{ours}\"; rebuild the module with the same compiler and uct-rs source"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_come_from_libuct_files_but_not_the_c_abi() {
        assert_eq!(
            module_name(Path::new("/x/libuct_ib.so")).as_deref(),
            Some("ib")
        );
        assert_eq!(module_name(Path::new("/x/libuct_rs.so")), None);
        assert_eq!(module_name(Path::new("/x/libuct_.so")), None);
        assert_eq!(module_name(Path::new("/x/libfoo.so")), None);
    }
}
