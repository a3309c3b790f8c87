//! Runs every conformance case over every transport the registry finds, in
//! one process and across two (the target in a child process connected
//! through the bootstrap channel), and names each known transport that is
//! absent with the reason it is absent.
//!
//! Coverage is declared, not discovered: the transports a run expects (on a
//! host: self, posix, cma, tcp and the example module's loop; inside
//! scripts/rxe-vm also rc) must be present, and a missing one fails the run
//! with the registry's reason. `UCT_TEST_EXPECT=self,posix` narrows (or
//! names) the expected set explicitly; the summary then says what it left
//! out. A filter that names one transport (`rc::`, as scripts/test runs
//! inside the VM) expects that transport and leaves the others out of the
//! run and the tally. Only an absent transport that is not expected is a
//! skip. Not-applicable cases and skips are reported as ignored whatever
//! the flags (`--include-ignored` included), never as passed, and the
//! closing tally is checked against what the harness ran.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use test_suite::pair::Mode;
use test_suite::{all_cases, not_applicable, Pair};
use uct_core::{Access, Caps, DeviceType, MemoryType, Registry, Resource};

/// The transports this suite looks for, whatever the registry holds: a
/// transport whose component is missing altogether is still named, with
/// the registry's reason.
const EXPECTED_TRANSPORTS: &[&str] = &["self", "posix", "cma", "tcp", "rc", "loop"];

/// The transports every host run expects: built in (self, posix, cma, tcp)
/// or from the example module the workspace builds (loop).
const HOST_TRANSPORTS: &[&str] = &["self", "posix", "cma", "tcp", "loop"];

/// Coverage names `UCT_TEST_EXPECT` may hold that this suite does not use
/// (the simulator's memory domains, checked by the Gaudi tests and the
/// shell suites).
const OTHER_COVERAGE: &[&str] = &["gaudi0", "gaudi1"];

/// What each expected transport must advertise at least: a transport that
/// stops advertising a capability would otherwise turn its cases into "not
/// applicable" and stay green. rc's atomics and inline puts depend on the
/// device and are not required.
fn required_caps(transport: &str) -> Option<Caps> {
    let common = Caps::PUT_BCOPY
        | Caps::PUT_ZCOPY
        | Caps::GET_BCOPY
        | Caps::GET_ZCOPY
        | Caps::FLUSH
        | Caps::FENCE;
    let cpu_atomics = Caps::ATOMIC32 | Caps::ATOMIC64 | Caps::ATOMIC_SWAP;
    Some(match transport {
        "self" => {
            common
                | Caps::PUT_SHORT
                | Caps::GET_SHORT
                | Caps::AM
                | cpu_atomics
                | Caps::PUT_IMM
                | Caps::PASSIVE_TARGET
        }
        "loop" => common | Caps::PUT_SHORT | Caps::GET_SHORT | Caps::AM | cpu_atomics,
        "posix" => {
            common
                | Caps::PUT_SHORT
                | Caps::GET_SHORT
                | Caps::AM
                | cpu_atomics
                | Caps::ERRHANDLE_PEER_FAILURE
                | Caps::PASSIVE_TARGET
        }
        "cma" => {
            common
                | Caps::PUT_SHORT
                | Caps::GET_SHORT
                | Caps::ERRHANDLE_PEER_FAILURE
                | Caps::PASSIVE_TARGET
        }
        "tcp" => {
            common
                | Caps::PUT_SHORT
                | Caps::AM
                | cpu_atomics
                | Caps::CONNECT_TO_EP
                | Caps::ERRHANDLE_PEER_FAILURE
                | Caps::PUT_IMM
        }
        "rc" => {
            common
                | Caps::AM
                | Caps::CONNECT_TO_EP
                | Caps::ERRHANDLE_PEER_FAILURE
                | Caps::PASSIVE_TARGET
        }
        _ => return None,
    })
}

/// Set by scripts/rxe-vm inside the VM to the RDMA device it brought up
/// (rxe0): rc is then expected.
const RXE_VM_DEVICE: &str = "RXE_VM_DEVICE";

/// The expected coverage of this run.
struct Expected {
    /// Transports that must be present.
    transports: Vec<String>,
    /// What `UCT_TEST_EXPECT` left out of the default set, with its value.
    left_out: Option<(String, Vec<String>)>,
    /// Names in `UCT_TEST_EXPECT` that no transport or known memory domain has.
    unknown: Vec<String>,
    /// `UCT_TEST_EXPECT` is set but names nothing.
    empty: bool,
}

/// The default expectation, narrowed or replaced by `UCT_TEST_EXPECT`, or
/// by a filter that names one transport.
fn expected(reg: &Registry, only: Option<&str>) -> Expected {
    let mut default: Vec<String> = HOST_TRANSPORTS.iter().map(|t| t.to_string()).collect();
    if std::env::var_os(RXE_VM_DEVICE).is_some() {
        default.push("rc".into());
    }
    let (mut transports, left_out, unknown) = match std::env::var("UCT_TEST_EXPECT") {
        Err(_) => (default, None, Vec::new()),
        Ok(value) => {
            let named: Vec<String> = value
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect();
            let known_transport = |n: &str| {
                EXPECTED_TRANSPORTS.contains(&n) || reg.transport_names().iter().any(|t| t == n)
            };
            let unknown = named
                .iter()
                .filter(|n| !known_transport(n) && !OTHER_COVERAGE.contains(&n.as_str()))
                .cloned()
                .collect();
            let left: Vec<String> = default
                .iter()
                .filter(|d| !named.contains(d))
                .cloned()
                .collect();
            let transports: Vec<String> = named
                .iter()
                .filter(|n| known_transport(n))
                .cloned()
                .collect();
            (transports, Some((value, left)), unknown)
        }
    };
    let empty = std::env::var("UCT_TEST_EXPECT")
        .is_ok_and(|value| value.split(',').all(|name| name.trim().is_empty()));
    if let Some(tl) = only {
        transports = vec![tl.to_string()];
    }
    Expected {
        transports,
        left_out,
        unknown,
        empty,
    }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    not_applicable: usize,
    /// Absent and not expected.
    skipped: usize,
    /// Absent though expected (each also counts as failed).
    missing: usize,
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

/// A trial that is counted, when the harness runs it, as not applicable or
/// skipped: ignored with its reason, whatever the flags.
fn not_run(name: String, tally: &Tallies, key: String, why: String, skip: bool) -> Trial {
    let tally = tally.clone();
    Trial::ignorable_test(name, move || {
        record(&tally, &key, |t| {
            if skip {
                t.skipped += 1
            } else {
                t.not_applicable += 1
            }
        });
        Ok(Completion::ignored_with(why))
    })
}

/// A trial that fails, counted as failed when the harness runs it.
fn failing(name: String, tally: &Tallies, key: String, why: String, missing: bool) -> Trial {
    let tally = tally.clone();
    Trial::test(name, move || {
        record(&tally, &key, |t| {
            t.failed += 1;
            if missing {
                t.missing += 1
            }
        });
        Err(Failed::from(why))
    })
}

/// The message a panic carried.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn main() {
    uct_builtins::link();
    // A child started by a two-process case serves its target here.
    test_suite::target::run_agent_if_asked();
    uct_core::logging::init();
    let args = Arguments::from_args();
    let reg: &'static Registry = Registry::global();
    // A filter such as `rc::` names one transport: that transport is
    // expected, and the others are out of the tally, not just out of the run.
    let only: Option<String> = args
        .filter
        .as_deref()
        .and_then(|f| f.split_once("::"))
        .map(|(tl, _)| tl.to_string())
        .filter(|tl| {
            EXPECTED_TRANSPORTS.contains(&tl.as_str()) || reg.transport_names().contains(tl)
        });
    let wanted = |tl: &str| only.as_deref().is_none_or(|o| o == tl);
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

    let expect = expected(reg, only.as_deref());
    let mut trials = Vec::new();
    if !expect.unknown.is_empty() {
        let why = format!(
            "UCT_TEST_EXPECT names {}, which no transport here has and which is no known memory domain ({})",
            expect.unknown.join(", "),
            OTHER_COVERAGE.join(", ")
        );
        println!("conformance: {why}");
        trials.push(failing(
            "expect::UCT_TEST_EXPECT".into(),
            &tally,
            "UCT_TEST_EXPECT".into(),
            why,
            false,
        ));
    }
    if expect.empty {
        let why = "UCT_TEST_EXPECT is set but names nothing, which would expect no transport at all; unset it for the default set, or name the transports this run needs".to_string();
        println!("conformance: {why}");
        trials.push(failing(
            "expect::UCT_TEST_EXPECT".into(),
            &tally,
            "UCT_TEST_EXPECT".into(),
            why,
            false,
        ));
    }
    // Checked again after the run whatever the filters: a filter or --skip
    // must not hide a missing expected transport.
    let mut coverage_errors: Vec<String> = Vec::new();
    if expect.empty || !expect.unknown.is_empty() {
        coverage_errors.push("UCT_TEST_EXPECT is empty or names unknown transports".into());
    }
    let mut looked_for: Vec<String> = EXPECTED_TRANSPORTS.iter().map(|t| t.to_string()).collect();
    for t in reg
        .transport_names()
        .into_iter()
        .chain(expect.transports.clone())
    {
        if !looked_for.contains(&t) {
            looked_for.push(t);
        }
    }
    for tl in &looked_for {
        let tl = tl.as_str();
        if !wanted(tl) || resources.iter().any(|r| r.tl.transport == *tl) {
            continue;
        }
        let reason = reg.explain_absent(tl);
        if expect.transports.iter().any(|e| e == tl) {
            println!("conformance: MISSING transport {tl}, which this run expects: {reason}");
            coverage_errors.push(format!("transport {tl} is expected and missing: {reason}"));
            trials.push(failing(
                format!("{tl}::present"),
                &tally,
                tl.to_string(),
                format!("transport {tl} is expected and missing: {reason}"),
                true,
            ));
        } else {
            println!("conformance: SKIPPED transport {tl}: {reason}");
            trials.push(not_run(
                format!("{tl}::all_cases"),
                &tally,
                tl.to_string(),
                format!("transport {tl} is absent and not expected: {reason}"),
                true,
            ));
        }
    }

    for resource in resources
        .iter()
        .filter(|resource| wanted(&resource.tl.transport))
    {
        let tl = resource.tl.transport.clone();
        let attrs =
            match resource
                .component
                .open_iface(&resource.md, &resource.tl, &Default::default())
            {
                Ok(i) => i.attrs().clone(),
                Err(e) => {
                    println!(
                        "conformance: transport {tl} is listed but its iface does not open: {e}"
                    );
                    trials.push(failing(
                        format!("{tl}::open_iface"),
                        &tally,
                        tl.clone(),
                        format!("open iface: {e}"),
                        false,
                    ));
                    continue;
                }
            };
        if let Some(required) = required_caps(&tl).filter(|_| expect.transports.contains(&tl)) {
            let lacking = required - attrs.caps;
            if !lacking.is_empty() {
                let names: Vec<&str> = lacking.iter_names().map(|(name, _)| name).collect();
                let why = format!(
                    "transport {tl} no longer advertises {}, which this suite expects of it: its cases would turn into \"not applicable\"",
                    names.join(", ")
                );
                println!("conformance: {why}");
                coverage_errors.push(why.clone());
                trials.push(failing(
                    format!("{tl}::capabilities"),
                    &tally,
                    tl.clone(),
                    why,
                    false,
                ));
            }
        }
        let soft = has_soft_rkey(resource);
        for mode in [Mode::InProcess, Mode::TwoProcesses] {
            let key = format!("{tl} ({})", mode.name());
            // self, and cuda_copy (copies between host and GPU memory of
            // its own process), reach no other process.
            if mode == Mode::TwoProcesses
                && matches!(
                    resource.tl.device_type,
                    DeviceType::SelfLoop | DeviceType::Accelerator
                )
            {
                println!(
                    "conformance: {tl}::{}: not applicable: {tl} reaches its own process only",
                    mode.name()
                );
                continue;
            }
            for case in all_cases() {
                let name = format!("{tl}::{}::{}", mode.name(), case.name);
                if let Some(why) = not_applicable(&case, &attrs, soft, mode) {
                    println!("conformance: {name} not applicable: {why}");
                    trials.push(not_run(name, &tally, key.clone(), why, false));
                    continue;
                }
                let resource = resource.clone();
                let tally = tally.clone();
                let key = key.clone();
                trials.push(Trial::test(name, move || {
                    // A panicking case is a failed case, in the tally too.
                    let res = catch_unwind(AssertUnwindSafe(|| {
                        Pair::new(reg, &resource, mode).and_then(|mut pair| (case.run)(&mut pair))
                    }))
                    .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
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
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for (key, t) in tally.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        passed += t.passed;
        failed += t.failed;
        ignored += t.not_applicable + t.skipped;
        if t.missing > 0 {
            println!(
                "conformance: transport {key}: MISSING, expected ({})",
                reg.explain_absent(key)
            );
        } else if t.skipped > 0 {
            println!(
                "conformance: transport {key}: skipped, absent and not expected ({})",
                reg.explain_absent(key)
            );
        } else if key == "UCT_TEST_EXPECT" {
            println!("conformance: UCT_TEST_EXPECT: failed (names unknown transports)");
        } else {
            println!(
                "conformance: transport {key}: {} passed, {} failed, {} not applicable",
                t.passed, t.failed, t.not_applicable
            );
        }
    }
    if let Some((value, left)) = &expect.left_out {
        println!(
            "conformance: UCT_TEST_EXPECT={value} narrows the expected transports; left out: {}",
            if left.is_empty() {
                "none".to_string()
            } else {
                left.join(", ")
            }
        );
    }
    println!("conformance: {passed} passed, {failed} failed, {ignored} not applicable or skipped");
    // The tally must be exactly what the harness ran.
    let ran = (
        conclusion.num_passed as usize,
        conclusion.num_failed as usize,
        conclusion.num_ignored as usize,
    );
    if !coverage_errors.is_empty() && !args.list {
        for error in &coverage_errors {
            println!("conformance: FAILED: {error}");
        }
        std::process::exit(101);
    }
    if ran != (passed, failed, ignored) {
        println!(
            "conformance: FAILED: the tally ({passed} passed, {failed} failed, {ignored} ignored) is not what ran ({} passed, {} failed, {} ignored)",
            ran.0, ran.1, ran.2
        );
        std::process::exit(101);
    }
    conclusion.exit();
}
