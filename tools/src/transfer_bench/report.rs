//! Results of transfer-bench as a table after the seed's
//! BM_RdmaTransport_Write (Google Benchmark's layout), CSV or JSON.

use serde::Serialize;

use super::run::Measurement;

/// One size's result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub size: usize,
    pub iterations: u64,
    /// Microseconds per notified write, from its post to the receiver's
    /// notification.
    pub real_time_us: f64,
    /// Process CPU microseconds per notified write.
    pub cpu_time_us: f64,
    pub bytes_per_second: f64,
}

impl Row {
    pub fn new(m: &Measurement) -> Row {
        let iters = m.iters.max(1) as f64;
        let real = m.real.as_secs_f64() / iters;
        Row {
            size: m.size,
            iterations: m.iters,
            real_time_us: real * 1e6,
            cpu_time_us: m.cpu.as_secs_f64() / iters * 1e6,
            bytes_per_second: if real > 0.0 {
                m.size as f64 / real
            } else {
                0.0
            },
        }
    }
}

/// What the run was, printed before the results.
#[derive(Debug, Clone, Serialize)]
pub struct Header {
    pub tool: &'static str,
    pub version: &'static str,
    pub transport: String,
    pub device: Option<String>,
    pub mem_type: String,
    pub progress: &'static str,
    /// "one process" or "two processes".
    pub mode: &'static str,
    pub validate: bool,
    /// `-O`: notified writes in flight.
    pub outstanding: usize,
    /// How real_time_us is measured in this mode.
    pub real_time: &'static str,
}

/// The JSON document: the header, then the results, then what each rail
/// of the measuring side carried.
#[derive(Serialize)]
pub struct Document<'a> {
    pub header: &'a Header,
    pub results: &'a [Row],
    #[serde(skip_serializing_if = "<[RailRow]>::is_empty")]
    pub rails: &'a [RailRow],
}

/// What one rail carried over the run (warm-ups included).
#[derive(Debug, Clone, Serialize)]
pub struct RailRow {
    pub rail: usize,
    pub device: String,
    pub in_service: bool,
    pub failure: Option<String>,
    pub writes: u64,
    pub bytes_written: u64,
    pub reissued: u64,
}

impl RailRow {
    pub fn of(r: &uct_transfer::RailStats) -> RailRow {
        RailRow {
            rail: r.rail,
            device: r.device.clone(),
            in_service: r.in_service,
            failure: r.failure.clone(),
            writes: r.writes,
            bytes_written: r.bytes_written,
            reissued: r.reissued,
        }
    }
}

/// A rail's line under the table: `rail 0 (lo): 12 writes, 48.0 MiB (50%), in service`.
pub fn rail_line(r: &RailRow, total: u64) -> String {
    let share = if total > 0 {
        format!(" ({:.0}%)", r.bytes_written as f64 * 100.0 / total as f64)
    } else {
        String::new()
    };
    let state = match (&r.failure, r.in_service) {
        (_, true) => "in service".to_string(),
        (Some(why), false) => format!("out of service: {why}"),
        (None, false) => "out of service".to_string(),
    };
    let reissued = if r.reissued > 0 {
        format!(", {} stripes reissued here", r.reissued)
    } else {
        String::new()
    };
    format!(
        "rail {} ({}): {} writes, {}{share}{reissued}, {state}",
        r.rail,
        r.device,
        r.writes,
        crate::text::size(r.bytes_written),
    )
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Google Benchmark prints three significant digits.
fn time(us: f64) -> String {
    if us >= 100.0 {
        format!("{us:.0}")
    } else if us >= 10.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

/// Bytes per second in Google Benchmark's binary units: `288.978M/s`.
pub fn rate(bps: f64) -> String {
    let mut v = bps;
    let mut unit = "";
    for u in ["k", "M", "G", "T"] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    let digits = if v >= 100.0 {
        3
    } else if v >= 10.0 {
        4
    } else {
        5
    };
    format!("{v:.digits$}{unit}/s")
}

pub fn table_header(h: &Header) -> String {
    format!(
        "# transfer-bench {}: notified writes over {}{}, {} memory, {} progress, {}, {}{}\n# real time: {}\n{RULE}\n{:<46}{:>13}{:>15}{:>13}\n{RULE}",
        h.version,
        h.transport,
        h.device.as_deref().map(|d| format!("/{d}")).unwrap_or_default(),
        h.mem_type,
        h.progress,
        h.mode,
        if h.outstanding > 1 {
            format!("{} in flight", h.outstanding)
        } else {
            "one at a time".to_string()
        },
        if h.validate { ", validating every byte" } else { "" },
        h.real_time,
        "Benchmark",
        "Time",
        "CPU",
        "Iterations"
    )
}

pub fn table_row(r: &Row) -> String {
    format!(
        "{:<46}{:>10} us{:>12} us{:>13} bytes_per_second={}",
        format!("BM_Transfer_Write/{}/real_time", r.size),
        time(r.real_time_us),
        time(r.cpu_time_us),
        r.iterations,
        rate(r.bytes_per_second)
    )
}

pub const CSV_HEADER: &str = "size,iterations,real_time_us,cpu_time_us,bytes_per_second";

pub fn csv_row(r: &Row) -> String {
    format!(
        "{},{},{:.4},{:.4},{:.1}",
        r.size, r.iterations, r.real_time_us, r.cpu_time_us, r.bytes_per_second
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rows_read_like_the_seed() {
        let m = Measurement {
            size: 8192,
            iters: 1000,
            real: Duration::from_micros(27_000),
            cpu: Duration::from_micros(9_010),
        };
        let row = Row::new(&m);
        assert!((row.real_time_us - 27.0).abs() < 1e-9);
        let line = table_row(&row);
        assert!(
            line.starts_with("BM_Transfer_Write/8192/real_time"),
            "{line}"
        );
        assert!(
            line.contains("27.0 us") && line.contains("9.01 us"),
            "{line}"
        );
        assert!(line.ends_with("bytes_per_second=289.352M/s"), "{line}");
        assert_eq!(rate(45.0305 * (1u64 << 30) as f64), "45.0305G/s");
        assert_eq!(csv_row(&row).split(',').count(), 5);
    }
}
