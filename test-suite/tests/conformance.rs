//! Runs every conformance case over every transport the registry finds, in
//! one process and across two (the target in a child process connected
//! through the bootstrap channel), and names each known transport that is
//! absent with the reason it is absent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};
use test_suite::pair::Mode;
use test_suite::{all_cases, not_applicable, Pair};
use uct_core::{Access, DeviceType, MemoryType, Registry, Resource};

/// The transports this suite looks for, whatever the registry holds: a
/// transport whose component is missing altogether is still named, with
/// the registry's reason.
const EXPECTED_TRANSPORTS: &[&str] = &["self", "posix", "cma", "tcp", "rc", "loop"];

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    not_applicable: usize,
}

type Tallies = Arc<Mutex<BTreeMap<String, Tally>>>;

/// Whether the MD's rkey payloads begin with a software key (a secret).
fn has_soft_rkey(resource: &Resource) -> bool {
    resource
        .md
        .alloc(64, MemoryType::Host, Access::all())
        .and_then(|mem| resource.md.pack_rkey(&mem))
        .ok()
        .is_some_and(|e| {
            postcard::take_from_bytes::<uct_core::region_table::SoftRkey>(&e.payload).is_ok()
        })
}

fn record(tally: &Tallies, key: &str, f: impl FnOnce(&mut Tally)) {
    f(tally
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key.to_string())
        .or_default());
}

fn main() {
    uct_builtins::link();
    // A child started by a two-process case serves its target here.
    test_suite::target::run_agent_if_asked();
    uct_core::logging::init();
    let args = Arguments::from_args();
    // A filter such as `rc::` names one transport: leave the others out of
    // the tally, not just out of the run.
    let only: Option<String> = args
        .filter
        .as_deref()
        .and_then(|f| f.split_once("::"))
        .map(|(tl, _)| tl.to_string());
    let wanted = |tl: &str| only.as_deref().is_none_or(|o| o == tl);
    let reg: &'static Registry = Registry::global();
    let tally: Tallies = Arc::default();

    // One device per transport is enough for conformance.
    let mut resources: Vec<Resource> = Vec::new();
    for resource in reg.resources() {
        if !resources
            .iter()
            .any(|kept| kept.tl.transport == resource.tl.transport)
        {
            resources.push(resource);
        }
    }
    let names: Vec<String> = resources
        .iter()
        .map(|r| {
            format!(
                "{} ({}/{})",
                r.tl.transport,
                r.component.name(),
                r.tl.device
            )
        })
        .collect();
    println!(
        "conformance: transports found: {}",
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    );

    let mut trials = Vec::new();
    let mut skipped = Vec::new();
    let mut looked_for: Vec<String> = EXPECTED_TRANSPORTS.iter().map(|t| t.to_string()).collect();
    for t in reg.transport_names() {
        if !looked_for.contains(&t) {
            looked_for.push(t);
        }
    }
    for tl in &looked_for {
        let tl = tl.as_str();
        if !wanted(tl) {
            continue;
        }
        if !resources.iter().any(|r| r.tl.transport == *tl) {
            println!(
                "conformance: SKIPPED transport {tl}: {}",
                reg.explain_absent(tl)
            );
            skipped.push(tl.to_string());
            trials.push(Trial::test(format!("{tl}::all_cases"), || Ok(())).with_ignored_flag(true));
        }
    }

    for resource in resources
        .iter()
        .filter(|resource| wanted(&resource.tl.transport))
    {
        let tl = resource.tl.transport.clone();
        let caps =
            match resource
                .component
                .open_iface(&resource.md, &resource.tl, &Default::default())
            {
                Ok(i) => i.attrs().caps,
                Err(e) => {
                    println!(
                        "conformance: transport {tl} is listed but its iface does not open: {e}"
                    );
                    record(&tally, &tl, |t| t.failed += 1);
                    trials.push(Trial::test(format!("{tl}::open_iface"), move || {
                        Err(Failed::from(format!("open iface: {e}")))
                    }));
                    continue;
                }
            };
        let soft = has_soft_rkey(resource);
        for mode in [Mode::InProcess, Mode::TwoProcesses] {
            let key = format!("{tl} ({})", mode.name());
            if mode == Mode::TwoProcesses && resource.tl.device_type == DeviceType::SelfLoop {
                println!(
                    "conformance: {tl}::{}: not applicable: {tl} reaches its own process only",
                    mode.name()
                );
                continue;
            }
            for case in all_cases() {
                let name = format!("{tl}::{}::{}", mode.name(), case.name);
                if let Some(why) = not_applicable(&case, caps, soft, mode) {
                    println!("conformance: {name} not applicable: {why}");
                    record(&tally, &key, |t| t.not_applicable += 1);
                    trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                    continue;
                }
                let resource = resource.clone();
                let tally = tally.clone();
                let key = key.clone();
                trials.push(Trial::test(name, move || {
                    let res =
                        Pair::new(reg, &resource, mode).and_then(|mut pair| (case.run)(&mut pair));
                    record(&tally, &key, |t| {
                        if res.is_ok() {
                            t.passed += 1
                        } else {
                            t.failed += 1
                        }
                    });
                    res.map_err(Failed::from)
                }));
            }
        }
    }

    let conclusion = libtest_mimic::run(&args, trials);
    for (key, t) in tally.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        println!(
            "conformance: transport {key}: {} passed, {} failed, {} not applicable",
            t.passed, t.failed, t.not_applicable
        );
    }
    for tl in &skipped {
        println!(
            "conformance: transport {tl}: skipped ({})",
            reg.explain_absent(tl)
        );
    }
    conclusion.exit();
}
