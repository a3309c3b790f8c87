//! One turn of a busy wait: the CPU's spin hint (PAUSE on x86) between
//! polls where it is cheap, none where it is dear.
//!
//! A PAUSE eases a loop of loads that another CPU's store ends, likely by
//! sparing the pipeline flush when the store lands (docs/perf-notes.md,
//! "Waiting loops without PAUSE"). It took 24 to 31 ns on the machines
//! here. An emulator may make it dear: QEMU's TCG leaves the translated
//! code for its CPU loop at each one, 122 ns and more in the rc testbed
//! (320 and more on an earlier machine, where it lengthened a wait
//! loop's turn from 0.86 to 1.23 us; docs/perf-rc-notes.md, "PAUSE
//! under the emulator" and "This machine"). Hosts whose PAUSE takes
//! longer than the bound (Intel's of about 140 cycles at a low clock)
//! were not measured: they lose the hint.
//!
//! So its cost is measured once per process, and the hint is left out
//! where one costs over [`CHEAP_PAUSE_NS`]. `UCT_SPIN_PAUSE` (auto, yes
//! or no) overrides the measurement; `UCT_LOG_LEVEL=debug` shows the
//! decision. A clock too coarse to see a batch reads as 0 ns: the hint
//! is kept, as before this module.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::config::{parse_auto_bool, AutoBool};

/// A hint at most this long is kept: 2.6 to 3.3 times what it costs on
/// the hosts here (24 to 31 ns), two thirds of the least TCG took (122
/// ns, this check in perftest in the rc testbed on the AMD EPYC host of
/// 2026-11-29; 320 on an earlier machine). 200, the bound before, let
/// that testbed's readings (122 to 251 ns) fall on both sides: 5 of 8
/// processes kept the hint.
pub const CHEAP_PAUSE_NS: u64 = 80;

/// Hints timed together in one sample: enough that the hint, not the
/// clock's two reads (2 to 15 us a pair under TCG in the testbed), makes
/// the sample under an emulator; few enough (under a microsecond on the
/// host) that a hypervisor's pause-loop exiting, which watches for long
/// runs of back-to-back hints, rarely triggers. The waits themselves
/// space their hints with a progress call.
const BATCH: u32 = 32;

/// Samples of each kind, after one untimed of each (an emulator
/// translates code on its first run). A form without that warm-up, the
/// hints unrolled, read 72 to 91 ns a hint under TCG, where PAUSEs in a
/// loop took 320 ns and more on that machine (scripts/exp-pause.c);
/// which of the two misled it was not measured.
/// The least counts (a preemption only lengthens the one it hits).
const SAMPLES: usize = 5;

/// A busy-wait turn found nothing: the spin hint, where it is cheap.
#[inline]
pub fn relax() {
    if use_pause() {
        std::hint::spin_loop();
    }
}

/// Whether [`relax`] gives the spin hint in this process: decided on the
/// first call (waits call it before their loop, so that the measurement
/// falls outside what they time).
#[inline]
pub fn use_pause() -> bool {
    match USE.get() {
        Some(&v) => v,
        None => first_use(),
    }
}

static USE: OnceLock<bool> = OnceLock::new();

/// Decides, stores and logs. Two threads may both measure; the first to
/// store decides, and only it logs. Logged after storing: a logger that
/// waits on a transport calls back in here.
#[cold]
#[inline(never)]
fn first_use() -> bool {
    let value = std::env::var("UCT_SPIN_PAUSE").ok();
    let (v, notes) = decide(value.as_deref(), pause_ns);
    match USE.set(v) {
        Ok(()) => {
            for note in &notes {
                note.log();
            }
            v
        }
        Err(_) => *USE.get().unwrap_or(&v),
    }
}

/// What the decision has to say, logged once it is made.
#[derive(Debug, PartialEq, Eq)]
enum Note {
    Measured { ns: u64, keep: bool },
    Bad(String),
}

impl Note {
    fn log(&self) {
        match self {
            Note::Measured { ns, keep } => log::debug!(
                "busy waits: the spin hint takes {ns} ns here, so it is {} (kept up to {CHEAP_PAUSE_NS} ns; UCT_SPIN_PAUSE=yes or no overrides)",
                if *keep { "kept" } else { "left out" }
            ),
            Note::Bad(v) => log::warn!(
                "UCT_SPIN_PAUSE={v} is not auto or a yes/no word (y, yes, 1, true, on; n, no, 0, false, off); the spin hint is measured as with auto"
            ),
        }
    }
}

/// The decision for `UCT_SPIN_PAUSE`'s `value`, measuring with `measure`
/// only when it asks for auto (or is not understood), and what to log.
fn decide(value: Option<&str>, measure: impl FnOnce() -> u64) -> (bool, Vec<Note>) {
    let mut notes = Vec::new();
    let setting = match value.map(|v| (v, parse_auto_bool(v))) {
        None => AutoBool::Auto,
        Some((_, Some(s))) => s,
        Some((v, None)) => {
            notes.push(Note::Bad(v.to_string()));
            AutoBool::Auto
        }
    };
    let v = match setting {
        AutoBool::Yes => true,
        AutoBool::No => false,
        AutoBool::Auto => {
            let ns = measure();
            let keep = cheap(ns);
            notes.push(Note::Measured { ns, keep });
            keep
        }
    };
    (v, notes)
}

/// Whether a hint of `ns` ns is cheap enough to keep.
fn cheap(ns: u64) -> bool {
    ns <= CHEAP_PAUSE_NS
}

/// One sample: `hints` calls of `hint` between two clock reads, in a loop
/// as a wait runs them.
fn sample(hints: u32, mut hint: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut done = 0u32;
    while done < black_box(hints) {
        hint();
        done = black_box(done + 1);
    }
    start.elapsed()
}

/// The time of one spin hint and one turn of its loop in ns: the least
/// batch of `BATCH` (32), less the least empty batch (the clock's own
/// reads). Takes some 10 us on the host, some 0.1 ms under TCG; not
/// cached (use [`use_pause`] for the decision).
pub fn pause_ns() -> u64 {
    let hint = std::hint::spin_loop;
    sample(0, hint);
    sample(BATCH, hint);
    let empty: Vec<Duration> = (0..SAMPLES).map(|_| sample(0, hint)).collect();
    let full: Vec<Duration> = (0..SAMPLES).map(|_| sample(BATCH, hint)).collect();
    per_hint_ns(&full, &empty, BATCH)
}

/// One hint's ns from samples of `batch` hints (`full`) and of none
/// (`empty`): the least of each, their difference over `batch`.
fn per_hint_ns(full: &[Duration], empty: &[Duration], batch: u32) -> u64 {
    let least = |s: &[Duration]| s.iter().min().copied().unwrap_or(Duration::ZERO);
    let ns = least(full).saturating_sub(least(empty)).as_nanos() / u128::from(batch.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&n| Duration::from_nanos(n)).collect()
    }

    #[test]
    fn the_least_samples_decide_so_a_preempted_one_does_not() {
        // BATCH hints of 30 ns, a 50 ns clock, and one sample hit by a
        // 1 ms preemption: 30 ns a hint, kept.
        let b = u64::from(BATCH);
        let full = ns(&[50 + 30 * b, 1_000_000 + 30 * b, 70 + 30 * b, 60 + 30 * b]);
        let empty = ns(&[50, 60, 55, 900_000, 52]);
        assert_eq!(per_hint_ns(&full, &empty, BATCH), 30);
        assert!(cheap(per_hint_ns(&full, &empty, BATCH)));
    }

    #[test]
    fn the_clock_s_own_cost_is_taken_off() {
        // A slow clock (2 us a pair of reads, as under TCG) and 60 ns
        // hints: without the subtraction that would read 122 ns and be
        // left out; with it 60, kept.
        let b = u64::from(BATCH);
        let full = ns(&[2_000 + 60 * b]);
        let empty = ns(&[2_000]);
        assert_eq!(per_hint_ns(&full, &empty, BATCH), 60);
        assert!(cheap(60));
        assert!(!cheap((2_000 + 60 * b) / b));
    }

    #[test]
    fn tcg_s_cost_is_left_out_and_the_bound_is_kept() {
        // About the least TCG took in the rc testbed: 122 ns a hint.
        let b = u64::from(BATCH);
        assert_eq!(
            per_hint_ns(&ns(&[2_000 + 122 * b]), &ns(&[2_000]), BATCH),
            122
        );
        assert!(!cheap(122));
        assert!(cheap(CHEAP_PAUSE_NS));
        assert!(!cheap(CHEAP_PAUSE_NS + 1));
    }

    #[test]
    fn a_clock_that_sees_nothing_keeps_the_hint() {
        // A coarse clock: both batches read 0, or the empty one longer.
        assert_eq!(per_hint_ns(&ns(&[0]), &ns(&[0]), BATCH), 0);
        assert_eq!(per_hint_ns(&ns(&[100]), &ns(&[4_000]), BATCH), 0);
        assert!(cheap(0));
    }

    #[test]
    fn huge_or_missing_samples_do_not_panic() {
        let huge = vec![Duration::MAX];
        assert_eq!(per_hint_ns(&huge, &[], 1), u64::MAX);
        assert!(!cheap(per_hint_ns(&huge, &[], 1)));
        assert_eq!(per_hint_ns(&[], &[], 0), 0);
    }

    #[test]
    fn a_sample_runs_the_hint_as_many_times_as_asked() {
        for n in [0, 1, BATCH] {
            let mut calls = 0u32;
            sample(n, || calls += 1);
            assert_eq!(calls, n);
        }
    }

    #[test]
    fn yes_and_no_skip_the_measurement() {
        let never = || -> u64 { panic!("measured although the setting forced it") };
        for yes in ["y", "yes", "1", "true", "on", " YES "] {
            assert_eq!(decide(Some(yes), never), (true, vec![]), "{yes}");
        }
        for no in ["n", "no", "0", "false", "off", "No"] {
            assert_eq!(decide(Some(no), never), (false, vec![]), "{no}");
        }
    }

    #[test]
    fn auto_measures_and_keeps_only_a_cheap_hint() {
        for auto in [None, Some("auto"), Some(" AUTO "), Some("")] {
            assert_eq!(
                decide(auto, || 27),
                (true, vec![Note::Measured { ns: 27, keep: true }]),
                "{auto:?}"
            );
            assert_eq!(
                decide(auto, || 326),
                (
                    false,
                    vec![Note::Measured {
                        ns: 326,
                        keep: false
                    }]
                ),
                "{auto:?}"
            );
        }
    }

    #[test]
    fn a_value_not_understood_is_named_and_measured_as_auto() {
        // Measured (a cheap hint kept, so not read as "no"), and both the
        // bad value and the measurement are told.
        assert_eq!(
            decide(Some("sometimes"), || 27),
            (
                true,
                vec![
                    Note::Bad("sometimes".into()),
                    Note::Measured { ns: 27, keep: true }
                ]
            )
        );
    }

    #[test]
    fn the_config_table_s_default_reads_as_auto() {
        let var = crate::config::CORE_CONFIG
            .iter()
            .find(|v| v.name == "UCT_SPIN_PAUSE")
            .expect("UCT_SPIN_PAUSE is in the core table");
        assert_eq!(parse_auto_bool(var.default), Some(AutoBool::Auto));
    }
}
