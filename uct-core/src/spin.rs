//! One turn of a busy wait: a PAUSE between polls where the CPU makes it
//! cheap, none where it is dear.
//!
//! A PAUSE eases a loop of loads that another CPU's store ends (the
//! pipeline is not flushed when the store lands; docs/perf-notes.md,
//! "Waiting loops without PAUSE"). It costs about 30 ns on the machines
//! here. An emulator may make it dear: QEMU's TCG leaves the translated
//! code for its CPU loop at each one, 330 to 1,700 ns in the rc testbed,
//! longer than a wait loop's poll (docs/perf-rc-notes.md, "PAUSE under
//! the emulator"). Its cost is measured once per process, and a PAUSE
//! that costs more than [`CHEAP_PAUSE_NS`] is left out.

use std::sync::OnceLock;
use std::time::Instant;

/// A PAUSE at most this long is kept. Real CPUs take 10 to 70 ns (140
/// cycles on recent Intel cores at 2 GHz); TCG takes 330 ns or more.
pub const CHEAP_PAUSE_NS: u64 = 200;

/// PAUSEs timed together in one sample: few enough that a hypervisor's
/// pause-loop exiting (a window of some 4,096 cycles) rarely triggers,
/// enough that the clock's own cost is small beside them.
const BATCH: u32 = 32;

/// Samples taken; the least counts (a preemption only lengthens one).
const SAMPLES: u32 = 5;

/// A busy-wait turn found nothing: PAUSE when it is cheap here.
#[inline]
pub fn relax() {
    if pause_is_cheap() {
        std::hint::spin_loop();
    }
}

/// Whether a PAUSE costs at most [`CHEAP_PAUSE_NS`] on this CPU, measured
/// on the first call.
#[inline]
pub fn pause_is_cheap() -> bool {
    static CHEAP: OnceLock<bool> = OnceLock::new();
    *CHEAP.get_or_init(|| pause_ns() <= CHEAP_PAUSE_NS)
}

/// The time of one PAUSE in ns: the least of [`SAMPLES`] batches, the
/// clock's own reads included.
pub fn pause_ns() -> u64 {
    let mut best = u64::MAX;
    for _ in 0..SAMPLES {
        let start = Instant::now();
        for _ in 0..BATCH {
            std::hint::spin_loop();
        }
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        best = best.min(ns / u64::from(BATCH));
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measurement_is_stable_within_a_process() {
        // The first call decides; later calls say the same.
        let first = pause_is_cheap();
        for _ in 0..100 {
            relax();
            assert_eq!(pause_is_cheap(), first);
        }
    }

    #[test]
    fn a_pause_takes_less_than_a_millisecond() {
        // A sanity bound, not a performance assertion: a figure this large
        // would mean the clock or the loop is broken.
        assert!(pause_ns() < 1_000_000);
    }
}
