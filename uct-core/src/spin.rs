//! One turn of a busy wait: the CPU's spin hint (PAUSE on x86) between
//! polls where it is cheap, none where it is dear.
//!
//! A PAUSE eases a loop of loads that another CPU's store ends, likely by
//! sparing the pipeline flush when the store lands (docs/perf-notes.md,
//! "Waiting loops without PAUSE"). It took 27 to 31 ns on the machines
//! here. An emulator may make it dear: QEMU's TCG leaves the translated
//! code for its CPU loop at each one, 320 ns and more in the rc testbed,
//! which lengthened a wait loop's turn from 0.86 to 1.23 us
//! (docs/perf-rc-notes.md, "PAUSE under the emulator").
//!
//! So its cost is measured once per process, and the hint is left out
//! where one costs over [`CHEAP_PAUSE_NS`]. `UCT_SPIN_PAUSE` (auto, yes
//! or no) overrides the measurement; `UCT_LOG_LEVEL=debug` shows the
//! decision. A clock too coarse to see a batch reads as 0 ns: the hint
//! is kept, as before this module.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::config::parse_bool;

/// A hint at most this long is kept: three times what it costs on the
/// host here (27 to 31 ns), under the least TCG took (about 320 ns).
pub const CHEAP_PAUSE_NS: u64 = 200;

/// Hints timed together in one sample: enough that the hint, not the
/// clock's two reads (about 2 us under TCG in the testbed), makes the
/// sample. A hypervisor's pause-loop exiting may then trigger; its exits
/// are real costs of a long spin too.
const BATCH: u32 = 256;

/// Samples of each kind, after one untimed of each (an emulator
/// translates code on its first run); the least counts (a preemption
/// only lengthens the one it hits).
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
    static USE: OnceLock<bool> = OnceLock::new();
    *USE.get_or_init(decide)
}

/// What `UCT_SPIN_PAUSE` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    Auto,
    Always,
    Never,
}

/// `UCT_SPIN_PAUSE`'s value, or the text that is none of auto, yes, no.
fn parse_setting(value: Option<&str>) -> Result<Setting, String> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(Setting::Auto),
        Some(v) => match parse_bool(v) {
            Some(true) => Ok(Setting::Always),
            Some(false) => Ok(Setting::Never),
            None => Err(v.to_string()),
        },
    }
}

fn decide() -> bool {
    let value = std::env::var("UCT_SPIN_PAUSE").ok();
    let setting = parse_setting(value.as_deref()).unwrap_or_else(|bad| {
        log::warn!(
            "UCT_SPIN_PAUSE={bad} is not auto, yes or no; measuring the spin hint as with auto"
        );
        Setting::Auto
    });
    match setting {
        Setting::Always => true,
        Setting::Never => false,
        Setting::Auto => {
            let ns = pause_ns();
            let keep = cheap(ns);
            log::debug!(
                "busy waits: the spin hint takes {ns} ns here, so it is {} (kept up to {CHEAP_PAUSE_NS} ns; UCT_SPIN_PAUSE=yes or no overrides)",
                if keep { "kept" } else { "left out" }
            );
            keep
        }
    }
}

/// Whether a hint of `ns` ns is cheap enough to keep.
fn cheap(ns: u64) -> bool {
    ns <= CHEAP_PAUSE_NS
}

/// One sample: `hints` spin hints between two clock reads, in a loop as
/// a wait runs them. Unrolled, 32 hints in a row took 72 to 91 ns each
/// under TCG, where the same hints in a loop took 330 and more.
fn sample(hints: u32) -> Duration {
    let start = Instant::now();
    let mut done = 0u32;
    while done < black_box(hints) {
        std::hint::spin_loop();
        done = black_box(done + 1);
    }
    start.elapsed()
}

/// The time of one spin hint in ns: the least batch of [`BATCH`] hints,
/// less the least empty batch (the clock's own reads).
pub fn pause_ns() -> u64 {
    sample(0);
    sample(BATCH);
    let empty: Vec<Duration> = (0..SAMPLES).map(|_| sample(0)).collect();
    let full: Vec<Duration> = (0..SAMPLES).map(|_| sample(BATCH)).collect();
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
        // 32 hints of 30 ns, a 50 ns clock, and one sample hit by a 1 ms
        // preemption: 30 ns a hint, kept.
        let full = ns(&[1_010, 1_000_050, 1_030, 1_020, 1_015]);
        let empty = ns(&[50, 60, 55, 900_000, 52]);
        assert_eq!(per_hint_ns(&full, &empty, 32), 30);
        assert!(cheap(per_hint_ns(&full, &empty, 32)));
    }

    #[test]
    fn the_clock_s_own_cost_is_taken_off() {
        // A slow clock (1 us a pair of reads) and 150 ns hints: without
        // the subtraction that would read 181 ns, with it 150.
        let full = ns(&[1_000 + 32 * 150]);
        let empty = ns(&[1_000]);
        assert_eq!(per_hint_ns(&full, &empty, 32), 150);
    }

    #[test]
    fn tcg_s_cost_is_left_out_and_the_bound_is_kept() {
        // The least TCG took in the rc testbed: 330 ns a hint.
        assert_eq!(per_hint_ns(&ns(&[32 * 330]), &ns(&[0]), 32), 330);
        assert!(!cheap(330));
        assert!(cheap(CHEAP_PAUSE_NS));
        assert!(!cheap(CHEAP_PAUSE_NS + 1));
    }

    #[test]
    fn a_clock_that_sees_nothing_keeps_the_hint() {
        // A coarse clock: both batches read 0, or the empty one longer.
        assert_eq!(per_hint_ns(&ns(&[0]), &ns(&[0]), 32), 0);
        assert_eq!(per_hint_ns(&ns(&[100]), &ns(&[4_000]), 32), 0);
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
    fn the_setting_reads_auto_yes_and_no_and_refuses_the_rest() {
        assert_eq!(parse_setting(None), Ok(Setting::Auto));
        assert_eq!(parse_setting(Some("")), Ok(Setting::Auto));
        assert_eq!(parse_setting(Some("auto")), Ok(Setting::Auto));
        for yes in ["y", "yes", "1", "on"] {
            assert_eq!(parse_setting(Some(yes)), Ok(Setting::Always), "{yes}");
        }
        for no in ["n", "no", "0", "off"] {
            assert_eq!(parse_setting(Some(no)), Ok(Setting::Never), "{no}");
        }
        assert_eq!(parse_setting(Some("sometimes")), Err("sometimes".into()));
    }
}
