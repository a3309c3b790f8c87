//! What a transfer-bench run measures, how many iterations each size gets,
//! and what the two sides of a two-process run must agree on.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uct_transfer::MemoryType;

/// Who drives the Transports' progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProgressMode {
    /// The measuring thread calls `progress()` (the default: on a host with
    /// few cores a progress thread per Transport fights the measuring one).
    Manual,
    /// Each Transport's own progress thread.
    Thread,
}

impl ProgressMode {
    pub fn parse(s: &str) -> Result<ProgressMode, String> {
        match s {
            "manual" => Ok(ProgressMode::Manual),
            "thread" => Ok(ProgressMode::Thread),
            _ => Err(format!("unknown progress mode '{s}'; use manual or thread")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ProgressMode::Manual => "manual",
            ProgressMode::Thread => "thread",
        }
    }
}

/// Everything both sides of a two-process run must agree on (the client's
/// iteration counts travel with each phase).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchParams {
    /// What `--version` prints: both sides must speak the same protocol.
    pub version: String,
    pub transport: String,
    pub device: Option<String>,
    /// `host` or `gaudi`.
    pub mem: String,
    pub sizes: Vec<usize>,
    pub validate: bool,
    /// `-O`: notified writes in flight (1: one at a time, the seed's
    /// loop). The client's choice; the server takes it.
    pub outstanding: usize,
    /// `--rails`: rails of each Transport (both sides must have as many).
    #[serde(default = "one_rail")]
    pub rails: usize,
}

fn one_rail() -> usize {
    1
}

/// Most sizes in one run, as perftest.
pub const MAX_SIZES: usize = 64;

/// The largest size asked: each side allocates a buffer of it.
pub const MAX_SIZE: usize = 1 << 34;

/// Most iterations of one phase (a sanity bound on peer input too).
pub const MAX_ITERS: u64 = 100_000_000;

/// Most notified writes in flight (`-O`).
pub const MAX_OUTSTANDING: usize = 4096;

/// With `--validate` and `-O N` each side keeps N slots of the largest
/// size (a write's slot is reused only once the receiver checked it): at
/// most this many bytes.
pub const MAX_VALIDATE_BUFFER: usize = 1 << 30;

impl BenchParams {
    /// The memory type asked.
    pub fn mem_type(&self) -> Result<MemoryType, String> {
        MemoryType::parse(&self.mem).map_err(|e| e.to_string())
    }

    /// The checks every side makes, before anything is allocated.
    pub fn check(&self) -> Result<(), String> {
        if self.sizes.is_empty() || self.sizes.len() > MAX_SIZES {
            return Err(format!(
                "{} sizes asked; a run has 1 to {MAX_SIZES} sizes",
                self.sizes.len()
            ));
        }
        if let Some(s) = self.sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
            return Err(format!(
                "size {s} asked; use sizes from 1 byte to {}",
                crate::text::size(MAX_SIZE as u64)
            ));
        }
        if self.rails == 0 || self.rails > uct_transfer::MAX_RAILS {
            return Err(format!(
                "--rails {} asked; use 1 to {}",
                self.rails,
                uct_transfer::MAX_RAILS
            ));
        }
        if self.outstanding == 0 || self.outstanding > MAX_OUTSTANDING {
            return Err(format!(
                "-O {} asked; use 1 to {MAX_OUTSTANDING} writes in flight",
                self.outstanding
            ));
        }
        let mem_type = self.mem_type()?;
        if !matches!(mem_type, MemoryType::Host | MemoryType::Gaudi) {
            return Err(format!(
                "-m {} is not measured here; use -m host or -m gaudi",
                self.mem
            ));
        }
        if self.validate && !mem_type.is_host_accessible() {
            return Err(format!(
                "--validate reads the received bytes with the CPU, which cannot read {mem_type} memory; run -m {mem_type} without --validate, or validate with -m host"
            ));
        }
        let max = self.sizes.iter().copied().max().unwrap_or(1);
        if self.slots() > 1 && max.saturating_mul(self.slots()) > MAX_VALIDATE_BUFFER {
            return Err(format!(
                "--validate with -O {} keeps {} slots of the largest size ({}) on each side, more than {}; validate smaller sizes or fewer writes in flight",
                self.outstanding,
                self.slots(),
                crate::text::size(max as u64),
                crate::text::size(MAX_VALIDATE_BUFFER as u64)
            ));
        }
        Ok(())
    }

    /// How many writes' places each buffer has: one, where every write
    /// goes (as perftest's put_bw), or with `--validate` one per write in
    /// flight, so that no write overwrites bytes not yet checked.
    pub fn slots(&self) -> usize {
        if self.validate {
            self.outstanding.max(1)
        } else {
            1
        }
    }

    /// The length of each side's buffer: the largest size, times
    /// [`slots`](Self::slots).
    pub fn buffer_len(&self) -> usize {
        let max = self.sizes.iter().copied().max().unwrap_or(1).max(1);
        max.saturating_mul(self.slots())
    }

    /// Why the server (`self`) cannot run what the client proposes.
    pub fn mismatch(&self, client: &BenchParams) -> Option<String> {
        let mut diffs = Vec::new();
        if self.version != client.version {
            diffs.push(format!(
                "version: client {}, server {}",
                client.version, self.version
            ));
        }
        if self.transport != client.transport {
            diffs.push(format!(
                "transport (-t): client {}, server {}",
                client.transport, self.transport
            ));
        }
        if let (Some(c), Some(s)) = (&client.device, &self.device) {
            if c != s {
                diffs.push(format!("device (-d): client {c}, server {s}"));
            }
        }
        if self.rails != client.rails {
            diffs.push(format!(
                "rails (--rails): client {}, server {}",
                client.rails, self.rails
            ));
        }
        if self.mem != client.mem {
            diffs.push(format!(
                "memory type (-m): client {}, server {}",
                client.mem, self.mem
            ));
        }
        if self.sizes != client.sizes {
            diffs.push(format!(
                "sizes (-s): client {}, server {}",
                sizes_text(&client.sizes),
                sizes_text(&self.sizes)
            ));
        }
        (!diffs.is_empty()).then(|| {
            format!(
                "{}; start both sides with the same -t, -d, --rails, -m and -s",
                diffs.join("; ")
            )
        })
    }
}

fn sizes_text(sizes: &[usize]) -> String {
    let all: Vec<String> = sizes.iter().map(|&s| crate::text::size(s as u64)).collect();
    all.join(",")
}

/// How many iterations a size gets.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// `-n`: forced.
    pub iters: Option<u64>,
    /// `-w`: forced.
    pub warmup: Option<u64>,
    /// `--min-time`: how long the measured loop of a size should last.
    pub min_time: Duration,
    pub validate: bool,
    /// `-O`: writes in flight.
    pub outstanding: usize,
}

/// Fewest measured iterations when they are chosen.
const MIN_ITERS: u64 = 10;

/// With --validate every iteration is filled and checked by the CPU:
/// perftest's count, so that a sweep stays short.
const VALIDATE_ITERS: u64 = 200;

impl Plan {
    /// Warm-up iterations: as given, or enough to move about 32 MiB (at
    /// least 2, at most 2,000, and at least two windows of `-O` writes),
    /// which brings the pages in and lets the measured count be estimated.
    pub fn warmup_for(&self, size: usize) -> u64 {
        self.warmup.unwrap_or_else(|| {
            ((32u64 << 20) / size.max(1) as u64)
                .clamp(2, 2_000)
                .max(2 * self.outstanding as u64)
        })
    }

    /// Measured iterations: as given, or enough to last `min_time` at the
    /// time per iteration the warm-up took (as Google Benchmark's
    /// min_time), between 10 and [`MAX_ITERS`].
    pub fn iters_for(&self, warmup_per_iter: Duration) -> u64 {
        if let Some(n) = self.iters {
            return n.clamp(1, MAX_ITERS);
        }
        let per = warmup_per_iter.as_secs_f64().max(1e-9);
        let n = (self.min_time.as_secs_f64() / per).ceil() as u64;
        let n = n.clamp(MIN_ITERS.max(2 * self.outstanding as u64), MAX_ITERS);
        if self.validate {
            n.min(VALIDATE_ITERS)
        } else {
            n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> BenchParams {
        BenchParams {
            version: "1".into(),
            transport: "tcp".into(),
            device: None,
            mem: "host".into(),
            sizes: vec![8192, 1 << 20],
            validate: false,
            outstanding: 1,
            rails: 1,
        }
    }

    #[test]
    fn a_mismatch_names_every_difference() {
        let server = params();
        assert_eq!(server.mismatch(&params()), None);
        let client = BenchParams {
            transport: "posix".into(),
            mem: "gaudi".into(),
            sizes: vec![8192],
            ..params()
        };
        let why = server.mismatch(&client).unwrap();
        assert!(
            why.contains("transport (-t): client posix, server tcp"),
            "{why}"
        );
        assert!(
            why.contains("memory type (-m): client gaudi, server host"),
            "{why}"
        );
        assert!(why.contains("sizes (-s): client 8K, server 8K,1M"), "{why}");
        // A device named on one side only is no mismatch.
        let client = BenchParams {
            device: Some("lo".into()),
            ..params()
        };
        assert_eq!(server.mismatch(&client), None);
    }

    #[test]
    fn checks_refuse_what_cannot_run() {
        assert!(params().check().is_ok());
        let p = BenchParams {
            sizes: vec![0],
            ..params()
        };
        assert!(p.check().unwrap_err().contains("size 0"));
        let p = BenchParams {
            mem: "gaudi".into(),
            validate: true,
            ..params()
        };
        assert!(p.check().unwrap_err().contains("without --validate"));
        let p = BenchParams {
            mem: "cuda".into(),
            ..params()
        };
        assert!(p.check().is_err());
        let p = BenchParams {
            outstanding: 0,
            ..params()
        };
        assert!(p.check().unwrap_err().contains("-O 0"));
    }

    #[test]
    fn validating_a_window_keeps_a_slot_per_write_in_flight() {
        let p = BenchParams {
            outstanding: 32,
            ..params()
        };
        assert_eq!((p.slots(), p.buffer_len()), (1, 1 << 20));
        let p = BenchParams {
            validate: true,
            ..p
        };
        assert_eq!((p.slots(), p.buffer_len()), (32, 32 << 20));
        assert!(p.check().is_ok());
        let p = BenchParams {
            sizes: vec![64 << 20],
            ..p
        };
        let why = p.check().unwrap_err();
        assert!(
            why.contains("32 slots") && why.contains("fewer writes in flight"),
            "{why}"
        );
    }

    #[test]
    fn iterations_follow_the_time_budget() {
        let plan = Plan {
            iters: None,
            warmup: None,
            min_time: Duration::from_millis(500),
            validate: false,
            outstanding: 1,
        };
        assert_eq!(plan.iters_for(Duration::from_micros(5)), 100_000);
        assert_eq!(plan.iters_for(Duration::from_secs(1)), MIN_ITERS);
        assert_eq!(plan.iters_for(Duration::ZERO), MAX_ITERS);
        assert_eq!(plan.warmup_for(8192), 2_000);
        assert_eq!(plan.warmup_for(256 << 20), 2);
        let forced = Plan {
            iters: Some(7),
            ..plan
        };
        assert_eq!(forced.iters_for(Duration::from_secs(1)), 7);
        let validating = Plan {
            validate: true,
            ..plan
        };
        assert_eq!(
            validating.iters_for(Duration::from_micros(5)),
            VALIDATE_ITERS
        );
        let window = Plan {
            outstanding: 32,
            ..plan
        };
        assert_eq!(window.warmup_for(256 << 20), 64);
        assert_eq!(window.iters_for(Duration::from_secs(1)), 64);
    }
}
