//! uct-attacker: runs one attack of the adversary library
//! (`test_suite::adversary::all()`) against a victim.
//!
//! `uct-attacker --attack NAME --target LINE` prints `outcome: <Outcome>`
//! and exits 0 when the attack was refused or its connection closed, 1 on a
//! breach, and 2 when the attack could not be run (its reason on stderr and
//! on stdout as `setup-error: <reason>`).

use std::process::ExitCode;

use test_suite::adversary::{all, Outcome, Target};

fn main() -> ExitCode {
    uct_builtins::link();
    uct_core::logging::init();
    match run() {
        Ok(outcome) => {
            println!("outcome: {outcome}");
            match outcome {
                Outcome::Breach(_) => ExitCode::from(1),
                Outcome::Refused(_) | Outcome::Closed => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            println!("setup-error: {e}");
            eprintln!("uct-attacker: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<Outcome, String> {
    let mut name = None;
    let mut line = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--attack" => name = args.next(),
            "--target" => line = args.next(),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let (Some(name), Some(line)) = (name, line) else {
        return Err(USAGE.into());
    };
    let target = Target::from_line(&line)?;
    let attacks = all();
    let attack = attacks.iter().find(|a| a.name == name).ok_or_else(|| {
        let known: Vec<_> = attacks.iter().map(|a| a.name).collect();
        format!("no attack named {name:?}; known: {}", known.join(", "))
    })?;
    if attack.transport != target.transport {
        return Err(format!(
            "{name} attacks {}, but the target runs {}",
            attack.transport, target.transport
        ));
    }
    (attack.run)(&target).map_err(|e| format!("{name}: {e}"))
}

const USAGE: &str = "usage: uct-attacker --attack NAME --target 'target transport=... ...'";
