//! Runs every conformance case over every transport the registry finds, and
//! names each known transport that is absent with the reason it is absent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};
use test_suite::{all_cases, not_applicable, Pair};
use uct_core::registry::KNOWN_TRANSPORTS;
use uct_core::{Access, MemoryType, Registry, Resource};
// Built-in transports register themselves when linked.
use tl_tcp as _;

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    not_applicable: usize,
}

/// Whether the MD's rkeys are software keys with a secret.
fn has_soft_rkey(r: &Resource) -> bool {
    r.md.alloc(64, MemoryType::Host, Access::all())
        .and_then(|m| r.md.pack_rkey(&m))
        .ok()
        .and_then(|e| {
            uct_core::rkey::decode_payload::<uct_core::region_table::SoftRkey>(&e.payload).ok()
        })
        .is_some()
}

fn main() {
    uct_core::logging::init();
    let args = Arguments::from_args();
    let reg: &'static Registry = Registry::global();
    let tally: Arc<Mutex<BTreeMap<String, Tally>>> = Arc::default();

    // One device per transport is enough for conformance.
    let mut resources: Vec<Resource> = Vec::new();
    for r in reg.resources() {
        if !resources.iter().any(|x| x.tl.transport == r.tl.transport) {
            resources.push(r);
        }
    }

    println!("conformance: transports found: {}", {
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
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    });
    let mut trials = Vec::new();
    let mut skipped = Vec::new();
    for (tl, _) in KNOWN_TRANSPORTS {
        if !resources.iter().any(|r| r.tl.transport == *tl) {
            let reason = reg.explain_absent(tl);
            println!("conformance: SKIPPED transport {tl}: {reason}");
            skipped.push(tl.to_string());
            trials.push(Trial::test(format!("{tl}::all_cases"), || Ok(())).with_ignored_flag(true));
        }
    }

    for r in &resources {
        let tl = r.tl.transport.clone();
        let caps = match r.component.open_iface(&r.md, &r.tl, &Default::default()) {
            Ok(i) => i.attrs().caps,
            Err(e) => {
                println!("conformance: transport {tl} is listed but its iface does not open: {e}");
                tally.lock().unwrap().entry(tl.clone()).or_default().failed += 1;
                trials.push(Trial::test(format!("{tl}::open_iface"), move || {
                    Err(Failed::from(format!("open iface: {e}")))
                }));
                continue;
            }
        };
        let soft = has_soft_rkey(r);
        for case in all_cases() {
            let name = format!("{tl}::{}", case.name);
            if let Some(why) = not_applicable(&case, caps, soft) {
                println!("conformance: {name} not applicable: {why}");
                tally
                    .lock()
                    .unwrap()
                    .entry(tl.clone())
                    .or_default()
                    .not_applicable += 1;
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            let r = r.clone();
            let tally = tally.clone();
            let tl = tl.clone();
            trials.push(Trial::test(name, move || {
                let res = Pair::new(reg, &r).and_then(|mut p| (case.run)(&mut p));
                let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                let e = t.entry(tl).or_default();
                match res {
                    Ok(()) => {
                        e.passed += 1;
                        Ok(())
                    }
                    Err(msg) => {
                        e.failed += 1;
                        Err(Failed::from(msg))
                    }
                }
            }));
        }
    }

    let conclusion = libtest_mimic::run(&args, trials);
    for (tl, t) in tally.lock().unwrap().iter() {
        println!(
            "conformance: transport {tl}: {} passed, {} failed, {} not applicable",
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
