//! Results: per-size numbers from the measurements, and their printing as
//! a table, CSV or JSON.

use serde::Serialize;

use super::params::TestKind;
use super::run::Measurement;

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub test: &'static str,
    pub transport: String,
    pub layout: &'static str,
    pub size: usize,
    pub iterations: u64,
    /// Microseconds.
    pub latency_p50_us: f64,
    pub latency_avg_us: f64,
    pub latency_pct_us: f64,
    pub percentile: f64,
    /// Mebibytes (2^20 bytes) per second.
    pub bandwidth_mib_s: f64,
    /// Gigabits (10^9 bits) per second.
    pub bandwidth_gbit_s: f64,
    /// Operations per second.
    pub msg_rate: f64,
}

fn pct(sorted: &[f64], percent: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((percent / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

impl Row {
    pub fn new(
        test: TestKind,
        transport: &str,
        layout: &'static str,
        measurement: &Measurement,
        percentile: f64,
    ) -> Row {
        let mut sorted = measurement.samples.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let avg = if sorted.is_empty() {
            0.0
        } else {
            sorted.iter().sum::<f64>() / sorted.len() as f64
        };
        let secs = measurement.total.as_secs_f64().max(1e-12);
        // Ping-pong tests move one message each way per iteration; the
        // bandwidth is that of one direction, as ucx_perftest reports it.
        let bytes = measurement.size as f64 * measurement.iters as f64;
        let (bw, rate) = if test.is_latency() && avg > 0.0 {
            (measurement.size as f64 / (avg * 1e-9), 1e9 / avg)
        } else {
            (bytes / secs, measurement.iters as f64 / secs)
        };
        Row {
            test: test.name(),
            transport: transport.to_string(),
            layout,
            size: measurement.size,
            iterations: measurement.iters,
            latency_p50_us: pct(&sorted, 50.0) / 1000.0,
            latency_avg_us: avg / 1000.0,
            latency_pct_us: pct(&sorted, percentile) / 1000.0,
            percentile,
            bandwidth_mib_s: bw / (1u64 << 20) as f64,
            bandwidth_gbit_s: bw * 8.0 / 1e9,
            msg_rate: rate,
        }
    }
}

/// The table header, two lines.
pub fn table_header(percentile: f64, latency_test: bool) -> String {
    let what = if latency_test {
        "latency (us)"
    } else {
        "overhead per op (us)"
    };
    format!(
        "# {:>10} {:>10} {:>7} | {:^32} | {:^22} | {:>12}\n# {:>10} {:>10} {:>7} | {:>10} {:>10} {:>10} | {:>10} {:>11} | {:>12}",
        "", "", "", what, "bandwidth", "msg rate",
        "size", "iters", "layout", "p50", "avg", format!("p{percentile}"), "MiB/s", "Gb/s", "ops/s"
    )
}

pub fn table_row(row: &Row) -> String {
    format!(
        "  {:>10} {:>10} {:>7} | {:>10.3} {:>10.3} {:>10.3} | {:>10.2} {:>11.3} | {:>12.0}",
        crate::text::size(row.size as u64),
        row.iterations,
        row.layout,
        row.latency_p50_us,
        row.latency_avg_us,
        row.latency_pct_us,
        row.bandwidth_mib_s,
        row.bandwidth_gbit_s,
        row.msg_rate
    )
}

pub fn csv_header() -> &'static str {
    "test,transport,layout,size,iterations,latency_p50_us,latency_avg_us,latency_pct_us,percentile,bandwidth_mib_s,bandwidth_gbit_s,msg_rate"
}

pub fn csv_row(row: &Row) -> String {
    format!(
        "{},{},{},{},{},{:.4},{:.4},{:.4},{},{:.3},{:.4},{:.1}",
        row.test,
        row.transport,
        row.layout,
        row.size,
        row.iterations,
        row.latency_p50_us,
        row.latency_avg_us,
        row.latency_pct_us,
        row.percentile,
        row.bandwidth_mib_s,
        row.bandwidth_gbit_s,
        row.msg_rate
    )
}
