//! The listing: what this process finds, for a C program to print what
//! `transport-info -a` prints: the build, the transports probed with the
//! reason for those not usable, components, modules with their status,
//! memory domains and transports with their capabilities.

use std::ffi::c_char;
use std::sync::{Arc, LazyLock};

use crate::error::{call, CapiError};
use crate::ffi::Out;
use crate::handle::{Kind, Table};
use crate::snapshot::{opt_p, p, Component, Listing, Module};
use crate::status::Status;

/// A listing (opaque): a snapshot of what the registry found.
pub struct UctRsListing {
    _opaque: [u8; 0],
}

/// What `uct_rs_listing_count` counts: one of the `UCT_RS_LIST_*` values.
pub type UctRsListKind = u32;
/// The transports probed (`uct_rs_listing_probe`).
pub const UCT_RS_LIST_PROBE: UctRsListKind = 0;
/// The components (`uct_rs_listing_component`).
pub const UCT_RS_LIST_COMPONENTS: UctRsListKind = 1;
/// The module files found (`uct_rs_listing_module`).
pub const UCT_RS_LIST_MODULES: UctRsListKind = 2;
/// The memory domains (`uct_rs_listing_memory_domain`).
pub const UCT_RS_LIST_MEMORY_DOMAINS: UctRsListKind = 3;
/// The transports, with devices and capabilities
/// (`uct_rs_listing_transport`).
pub const UCT_RS_LIST_TRANSPORTS: UctRsListKind = 4;

/// The build. Strings belong to the listing (see `uct_rs_listing_create`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsBuildInfo {
    /// The uct-rs version.
    pub version: *const c_char,
    /// The fingerprint a loadable module must match.
    pub module_abi_fingerprint: *const c_char,
    /// `"debug"` or `"release"`.
    pub profile: *const c_char,
    /// The folders searched for modules, separated by `:`.
    pub module_search_path: *const c_char,
}

/// A transport probed: usable on a device, or not, with the reason.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsProbeEntry {
    /// The transport's name.
    pub transport: *const c_char,
    /// Its device, or NULL where it is not usable.
    pub device: *const c_char,
    /// Whether it can be used.
    pub usable: bool,
    /// Why not, or NULL.
    pub reason: *const c_char,
}

/// A component: a plugin, built in or from a module.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsComponentEntry {
    /// Its name.
    pub name: *const c_char,
    /// What it is.
    pub description: *const c_char,
    /// `"builtin"`, or `"module NAME (PATH)"`.
    pub origin: *const c_char,
    /// The transports it provides, separated by `,`.
    pub transports: *const c_char,
    /// Its memory domains, separated by `,`.
    pub memory_domains: *const c_char,
    /// Why it lists no memory domain, or NULL.
    pub error: *const c_char,
}

/// A module file found in the search path.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsModuleEntry {
    /// Its name (`ib` for `libuct_ib.so`).
    pub name: *const c_char,
    /// The file.
    pub path: *const c_char,
    /// `"loaded"`, `"not loaded"` (excluded by configuration), `"refused"`
    /// (another build) or `"failed"`.
    pub status: *const c_char,
    /// The components it provided, separated by `,` (empty unless loaded).
    pub components: *const c_char,
    /// Why it is not loaded, or NULL.
    pub reason: *const c_char,
}

/// A memory domain, or a component's that is absent (then `usable` is
/// false, `name` NULL and `reason` says why).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsMemoryDomainEntry {
    /// The component it belongs to.
    pub component: *const c_char,
    /// Its name, or NULL where absent.
    pub name: *const c_char,
    /// What it is (the NIC, the device), or NULL.
    pub description: *const c_char,
    /// Its capabilities (`alloc`, `reg`, `reg_dmabuf`, ...), separated by `,`.
    pub flags: *const c_char,
    /// Memory types it allocates, separated by `,`.
    pub alloc_memory_types: *const c_char,
    /// Memory types it registers, separated by `,`.
    pub register_memory_types: *const c_char,
    /// Memory types it detects, separated by `,`.
    pub detect_memory_types: *const c_char,
    /// The largest allocation, in bytes.
    pub max_alloc: u64,
    /// Bytes of a packed remote key.
    pub rkey_size: usize,
    /// Whether it is there.
    pub usable: bool,
    /// Why not, or NULL.
    pub reason: *const c_char,
}

/// A transport: on a device with its capabilities, or absent with the
/// reason (then `device` and the capabilities are NULL, the numbers 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UctRsTransportEntry {
    /// The transport's name.
    pub transport: *const c_char,
    /// Its device, or NULL where absent.
    pub device: *const c_char,
    /// The kind of device (`"network"`, `"shared memory"`, ...), or NULL.
    pub device_type: *const c_char,
    /// The component that provides it, or NULL where absent.
    pub component: *const c_char,
    /// The memory domain it runs over, or NULL where absent.
    pub memory_domain: *const c_char,
    /// Whether it can be used (an iface opened).
    pub usable: bool,
    /// Why not, or NULL.
    pub reason: *const c_char,
    /// Its capabilities (`put_zcopy`, `am_bcopy`, ...), separated by `,`,
    /// or NULL.
    pub capabilities: *const c_char,
    /// Memory types it can touch, separated by `,`, or NULL.
    pub memory_types: *const c_char,
    /// The largest zero-copy put, in bytes.
    pub max_put_zcopy: usize,
    /// Latency estimate, in nanoseconds.
    pub latency_ns: f64,
    /// Bandwidth estimate, in MB/s.
    pub bandwidth_mbps: f64,
}

/// Entry `index` of `list` (called `what` in messages).
fn nth<'a, T>(list: &'a [T], index: usize, what: &str) -> Result<&'a T, CapiError> {
    list.get(index).ok_or_else(|| {
        CapiError::OutOfRange(format!(
            "index {index} is past the {} {what} of this listing; ask uct_rs_listing_count first",
            list.len()
        ))
    })
}

pub(crate) static LISTINGS: LazyLock<Table<Listing>> = LazyLock::new(|| Table::new(Kind::Listing));

/// Takes a listing of what this process finds (built-in components,
/// modules loaded from `UCT_MODULE_DIR` and the default folders, the
/// transports probed). Opening each transport's iface takes a moment.
///
/// Ownership: `*listing` is the caller's, to free with
/// `uct_rs_listing_free`. Every string an entry points to belongs to the
/// listing and stays valid until it is freed. Thread-safe.
///
/// # Safety
/// `listing` is NULL (refused) or points to a writable `uct_rs_listing *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_create(listing: *mut *mut UctRsListing) -> Status {
    call("uct_rs_listing_create", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(listing, "listing") }?;
        let l = Listing::take(crate::global::registry()?);
        out.set(LISTINGS.insert(Arc::new(l))?);
        Ok(Status::UCT_RS_OK)
    })
}

/// How many entries list `what` (`UCT_RS_LIST_*`) has.
///
/// Ownership: the caller owns `*count`. Thread-safe.
///
/// # Safety
/// `count` is NULL (refused) or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_count(
    listing: *mut UctRsListing,
    what: UctRsListKind,
    count: *mut usize,
) -> Status {
    call("uct_rs_listing_count", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(count, "count") }?;
        out.set(LISTINGS.get(listing, "listing")?.count(what)?);
        Ok(Status::UCT_RS_OK)
    })
}

/// The build: version, module ABI fingerprint, profile, module search
/// path.
///
/// Ownership: the strings belong to the listing, valid until
/// `uct_rs_listing_free`. Thread-safe.
///
/// # Safety
/// `info` is NULL (refused) or points to a writable `uct_rs_build_info`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_build(
    listing: *mut UctRsListing,
    info: *mut UctRsBuildInfo,
) -> Status {
    call("uct_rs_listing_build", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(info, "info") }?;
        let l = LISTINGS.get(listing, "listing")?;
        let [v, f, pr, sp] = &l.build.0;
        out.set(UctRsBuildInfo {
            version: p(v),
            module_abi_fingerprint: p(f),
            profile: p(pr),
            module_search_path: p(sp),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Entry `index` of the transports probed: `uct_rs_supported`'s details.
///
/// Ownership: the strings belong to the listing, valid until
/// `uct_rs_listing_free`. Thread-safe.
///
/// # Safety
/// `entry` is NULL (refused) or points to a writable `uct_rs_probe_entry`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_probe(
    listing: *mut UctRsListing,
    index: usize,
    entry: *mut UctRsProbeEntry,
) -> Status {
    call("uct_rs_listing_probe", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(entry, "entry") }?;
        let l = LISTINGS.get(listing, "listing")?;
        let e = nth(&l.probe, index, "transports probed")?;
        out.set(UctRsProbeEntry {
            transport: p(&e.transport),
            device: opt_p(&e.device),
            usable: e.usable,
            reason: opt_p(&e.reason),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Entry `index` of the components.
///
/// Ownership: the strings belong to the listing, valid until
/// `uct_rs_listing_free`. Thread-safe.
///
/// # Safety
/// `entry` is NULL (refused) or points to a writable
/// `uct_rs_component_entry`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_component(
    listing: *mut UctRsListing,
    index: usize,
    entry: *mut UctRsComponentEntry,
) -> Status {
    call("uct_rs_listing_component", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(entry, "entry") }?;
        let l = LISTINGS.get(listing, "listing")?;
        let Component([n, d, o, t, m], err) = nth(&l.components, index, "components")?;
        out.set(UctRsComponentEntry {
            name: p(n),
            description: p(d),
            origin: p(o),
            transports: p(t),
            memory_domains: p(m),
            error: opt_p(err),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Entry `index` of the module files found.
///
/// Ownership: the strings belong to the listing, valid until
/// `uct_rs_listing_free`. Thread-safe.
///
/// # Safety
/// `entry` is NULL (refused) or points to a writable `uct_rs_module_entry`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_module(
    listing: *mut UctRsListing,
    index: usize,
    entry: *mut UctRsModuleEntry,
) -> Status {
    call("uct_rs_listing_module", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(entry, "entry") }?;
        let l = LISTINGS.get(listing, "listing")?;
        let Module([n, path, s, comps], reason) = nth(&l.modules, index, "modules")?;
        out.set(UctRsModuleEntry {
            name: p(n),
            path: p(path),
            status: p(s),
            components: p(comps),
            reason: opt_p(reason),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Entry `index` of the memory domains.
///
/// Ownership: the strings belong to the listing, valid until
/// `uct_rs_listing_free`. Thread-safe.
///
/// # Safety
/// `entry` is NULL (refused) or points to a writable
/// `uct_rs_memory_domain_entry`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_memory_domain(
    listing: *mut UctRsListing,
    index: usize,
    entry: *mut UctRsMemoryDomainEntry,
) -> Status {
    call("uct_rs_listing_memory_domain", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(entry, "entry") }?;
        let l = LISTINGS.get(listing, "listing")?;
        let m = nth(&l.mds, index, "memory domains")?;
        let [flags, alloc, reg, detect] = &m.types;
        out.set(UctRsMemoryDomainEntry {
            component: p(&m.component),
            name: opt_p(&m.name),
            description: opt_p(&m.description),
            flags: p(flags),
            alloc_memory_types: p(alloc),
            register_memory_types: p(reg),
            detect_memory_types: p(detect),
            max_alloc: m.max_alloc,
            rkey_size: m.rkey_size,
            usable: m.reason.is_none(),
            reason: opt_p(&m.reason),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Entry `index` of the transports: present ones with their device and
/// capabilities, then absent ones with the reason.
///
/// Ownership: the strings belong to the listing, valid until
/// `uct_rs_listing_free`. Thread-safe.
///
/// # Safety
/// `entry` is NULL (refused) or points to a writable
/// `uct_rs_transport_entry`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_listing_transport(
    listing: *mut UctRsListing,
    index: usize,
    entry: *mut UctRsTransportEntry,
) -> Status {
    call("uct_rs_listing_transport", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(entry, "entry") }?;
        let l = LISTINGS.get(listing, "listing")?;
        let t = nth(&l.tls, index, "transports")?;
        let null = std::ptr::null();
        let [dev, kind, comp, md] = t
            .present
            .as_ref()
            .map_or([null; 4], |s| s.each_ref().map(p));
        let [caps, types] = t.caps.as_ref().map_or([null; 2], |s| s.each_ref().map(p));
        out.set(UctRsTransportEntry {
            transport: p(&t.transport),
            device: dev,
            device_type: kind,
            component: comp,
            memory_domain: md,
            usable: t.reason.is_none(),
            reason: opt_p(&t.reason),
            capabilities: caps,
            memory_types: types,
            max_put_zcopy: t.max_put_zcopy,
            latency_ns: t.latency_ns,
            bandwidth_mbps: t.bandwidth_mbps,
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Frees the listing and every string its entries pointed to.
///
/// Ownership: the handle and those strings are invalid afterwards.
/// Thread-safe, but no thread may still read the strings.
#[no_mangle]
pub extern "C" fn uct_rs_listing_free(listing: *mut UctRsListing) -> Status {
    call("uct_rs_listing_free", || {
        LISTINGS.remove(listing, "listing")?;
        Ok(Status::UCT_RS_OK)
    })
}
