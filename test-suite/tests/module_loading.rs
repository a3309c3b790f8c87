//! The registry's module loader: a good module loads and its transport
//! works; broken ones are recorded with their reason and nothing else
//! fails.

use std::path::Path;

use test_suite::modules::{build_c_module, example_module_dir, scratch_dir};
use uct_core::config::AllowList;
use uct_core::registry::{ModuleStatus, Origin, RegistryOptions};
use uct_core::Registry;

fn registry_for(dir: &Path, modules: AllowList) -> Registry {
    Registry::with_options(RegistryOptions {
        module_dirs: vec![dir.to_path_buf()],
        default_dirs: false,
        modules,
    })
}

fn status_of<'a>(reg: &'a Registry, name: &str) -> &'a ModuleStatus {
    &reg.modules()
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("module {name} not listed: {:?}", reg.modules()))
        .status
}

#[test]
fn example_module_loads_and_its_transport_opens() {
    let dir = example_module_dir().expect("libuct_example.so is built with the tests");
    let reg = registry_for(&dir, AllowList::all());
    assert_eq!(
        status_of(&reg, "example"),
        &ModuleStatus::Loaded(vec!["example".into()])
    );
    let info = reg
        .components()
        .iter()
        .find(|c| c.component.name() == "example")
        .expect("example component");
    assert!(matches!(&info.origin, Origin::Module { name, .. } if name == "example"));
    let iface = reg
        .open_iface("loop", None, &Default::default())
        .expect("open loop");
    assert_eq!(iface.transport(), "loop");
    // Built-ins are there as well.
    assert!(reg.component("self").is_some());
}

#[test]
fn excluded_module_is_listed_as_not_loaded() {
    let dir = example_module_dir().expect("libuct_example.so is built with the tests");
    let reg = registry_for(&dir, AllowList::parse("^example"));
    match status_of(&reg, "example") {
        ModuleStatus::Excluded(r) => assert!(r.contains("UCT_MODULES"), "{r}"),
        other => panic!("expected excluded, got {other}"),
    }
    assert!(reg.component("example").is_none());
    assert!(reg
        .explain_absent("loop")
        .contains("excluded by UCT_MODULES"));
}

#[test]
fn wrong_fingerprint_is_refused_with_both_fingerprints() {
    let dir = scratch_dir("fingerprint");
    build_c_module("wrong_fingerprint.c", &dir.join("libuct_oldabi.so"), &[]).unwrap();
    let reg = registry_for(&dir, AllowList::all());
    match status_of(&reg, "oldabi") {
        ModuleStatus::Refused(r) => {
            assert!(r.contains("wrong ABI fingerprint"), "{r}");
            assert!(r.contains("rustc 1.0.0"), "{r}");
            assert!(r.contains(uct_core::module_abi::fingerprint()), "{r}");
        }
        other => panic!("expected refused, got {other}"),
    }
    assert!(reg.component("self").is_some(), "built-ins still work");
}

#[test]
fn missing_shared_library_dependency_is_named() {
    let dir = scratch_dir("missingdep");
    let ghost = dir.join("libuctghost.so");
    build_c_module("ghost.c", &ghost, &[]).unwrap();
    let module = dir.join("libuct_needsghost.so");
    let libdir = format!("-L{}", dir.display());
    build_c_module("needs_missing_lib.c", &module, &[&libdir, "-luctghost"]).unwrap();
    std::fs::remove_file(&ghost).unwrap();
    let reg = registry_for(&dir, AllowList::all());
    match status_of(&reg, "needsghost") {
        ModuleStatus::Failed(r) => {
            assert!(
                r.contains("libuctghost.so"),
                "reason does not name the library: {r}"
            );
            assert!(r.contains("ldd"), "reason does not say what to do: {r}");
        }
        other => panic!("expected failed, got {other}"),
    }
}

#[test]
fn missing_file_and_non_modules_are_reported() {
    let dir = scratch_dir("broken");
    // A module file that is not there (dangling link).
    std::os::unix::fs::symlink(dir.join("gone.so"), dir.join("libuct_gone.so")).unwrap();
    // A file that is not a shared library.
    std::fs::write(dir.join("libuct_text.so"), b"this is not an ELF file").unwrap();
    // A shared library without the ABI symbol.
    build_c_module("not_a_module.c", &dir.join("libuct_plain.so"), &[]).unwrap();
    let reg = registry_for(&dir, AllowList::all());
    match status_of(&reg, "gone") {
        ModuleStatus::Failed(r) => assert!(r.contains("No such file"), "{r}"),
        other => panic!("expected failed, got {other}"),
    }
    assert!(matches!(status_of(&reg, "text"), ModuleStatus::Failed(_)));
    match status_of(&reg, "plain") {
        ModuleStatus::Refused(r) => assert!(r.contains("no uct_module_abi"), "{r}"),
        other => panic!("expected refused, got {other}"),
    }
    // A folder that does not exist is simply empty.
    let reg = registry_for(&dir.join("nowhere"), AllowList::all());
    assert!(reg.modules().is_empty());
    assert!(reg.component("self").is_some());
}

#[test]
fn module_logs_reach_the_host_logger() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    struct Counter;
    impl log::Log for Counter {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, r: &log::Record) {
            if r.args().to_string().contains("example module initialised") {
                SEEN.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn flush(&self) {}
    }
    // This test binary's own logger: the module must log through it.
    let _ = log::set_logger(&Counter);
    log::set_max_level(log::LevelFilter::Info);
    let dir = example_module_dir().expect("libuct_example.so is built with the tests");
    let _reg = registry_for(&dir, AllowList::all());
    assert!(
        SEEN.load(Ordering::SeqCst) >= 1,
        "the module's log line did not reach the host"
    );
}
