//! The ABI between the host and a loadable module (`libuct_<name>.so`).
//!
//! A module exports two symbols. `uct_module_abi` (C ABI) returns a
//! [`ModuleAbi`] descriptor: magic, ABI version and a fingerprint of the
//! compiler, target, profile and uct-core source. The host checks it before
//! calling anything else. Only when it matches exactly is `uct_module_init`
//! (Rust ABI) called: passing trait objects across the boundary is sound
//! only between identical builds of the same compiler and uct-core, which
//! is what the fingerprint guarantees. Both sides use the system allocator.
//!
//! Use [`declare_module!`](crate::declare_module) to export both.

use std::ffi::c_char;
use std::sync::Arc;

use crate::component::Component;

/// `b"UCTMOD\0\x01"` as a little-endian u64.
pub const MODULE_MAGIC: u64 = u64::from_le_bytes(*b"UCTMOD\0\x01");
/// Layout version of [`ModuleAbi`]; bump when it changes.
pub const MODULE_ABI_VERSION: u32 = 1;
/// Name of the C-ABI descriptor symbol.
pub const ABI_SYMBOL: &[u8] = b"uct_module_abi";
/// Name of the Rust-ABI init symbol.
pub const INIT_SYMBOL: &[u8] = b"uct_module_init";

/// What this build of uct-core requires of a module, nul-terminated.
pub const FINGERPRINT: &str = concat!(
    "uct-core ",
    env!("CARGO_PKG_VERSION"),
    "+src.",
    env!("UCT_SOURCE_HASH"),
    "; ",
    env!("UCT_RUSTC_VERSION"),
    "; ",
    env!("UCT_TARGET"),
    "; ",
    env!("UCT_PROFILE"),
    "\0"
);

/// The descriptor a module returns from `uct_module_abi`. Its layout never
/// changes within one `abi_version`.
#[repr(C)]
pub struct ModuleAbi {
    /// [`MODULE_MAGIC`]: says this is a uct-rs module descriptor.
    pub magic: u64,
    /// [`MODULE_ABI_VERSION`] of the build that made the module.
    pub abi_version: u32,
    /// Nul-terminated fingerprint string.
    pub fingerprint: *const c_char,
}

// SAFETY: the only pointer in the descriptor is `fingerprint`, which points
// at a `'static` string that is never written, so sharing it cannot race.
unsafe impl Sync for ModuleAbi {}

/// The descriptor of this build.
pub static CURRENT_ABI: ModuleAbi = ModuleAbi {
    magic: MODULE_MAGIC,
    abi_version: MODULE_ABI_VERSION,
    fingerprint: FINGERPRINT.as_ptr() as *const c_char,
};

/// The fingerprint of this build, without the terminating nul.
pub fn fingerprint() -> &'static str {
    FINGERPRINT.trim_end_matches('\0')
}

/// What the host hands a module at init: its logging entry points, so the
/// module's records go to whatever logger the host has, now or later.
pub struct ModuleHost {
    /// The host's current logger.
    pub logger: fn() -> &'static dyn log::Log,
    /// The host's current maximum log level.
    pub max_level: fn() -> log::LevelFilter,
}

impl ModuleHost {
    /// The host's logging entry points.
    pub fn current() -> Self {
        ModuleHost {
            logger: log::logger,
            max_level: log::max_level,
        }
    }

    /// Module side: sends this copy of `log`'s records to the host logger.
    pub fn install_logger(&self) {
        let fwd = HOST_LOG.get_or_init(|| HostLog {
            logger: self.logger,
            max_level: self.max_level,
        });
        // Fails only if the module already set one; keep that one.
        let _ = log::set_logger(fwd);
        // The host's level is checked per record; let every record reach it.
        log::set_max_level(log::LevelFilter::Trace);
    }
}

/// The module's logger: forwards to the host's current logger and level.
struct HostLog {
    logger: fn() -> &'static dyn log::Log,
    max_level: fn() -> log::LevelFilter,
}

static HOST_LOG: std::sync::OnceLock<HostLog> = std::sync::OnceLock::new();

impl log::Log for HostLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= (self.max_level)() && (self.logger)().enabled(m)
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= (self.max_level)() {
            (self.logger)().log(r);
        }
    }

    fn flush(&self) {
        (self.logger)().flush();
    }
}

/// What a module's init returns.
pub struct ModuleExports {
    /// The components the module provides.
    pub components: Vec<Arc<dyn Component>>,
}

/// Signature of `uct_module_abi`.
pub type AbiFn = extern "C" fn() -> *const ModuleAbi;
/// Signature of `uct_module_init`.
pub type InitFn = fn(&ModuleHost) -> ModuleExports;

/// Exports a loadable module: `declare_module!(init_fn)`, where `init_fn`
/// returns the module's components as `Vec<Arc<dyn Component>>`.
#[macro_export]
macro_rules! declare_module {
    ($init:path) => {
        #[no_mangle]
        pub extern "C" fn uct_module_abi() -> *const $crate::module_abi::ModuleAbi {
            &$crate::module_abi::CURRENT_ABI
        }

        #[no_mangle]
        pub fn uct_module_init(
            host: &$crate::module_abi::ModuleHost,
        ) -> $crate::module_abi::ModuleExports {
            host.install_logger();
            $crate::module_abi::ModuleExports {
                components: $init(),
            }
        }
    };
}
