//! perf-plot: draws `scripts/compare-ucx`'s results (its JSON) as one SVG,
//! both tools' curves on one chart per transport and kind of figure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use serde::Deserialize;
use tools::plot::{draw, Panel, Series};

#[derive(Parser, Debug)]
#[command(
    name = "perf-plot",
    about = "Draw scripts/compare-ucx's JSON as an SVG: per transport, bandwidth, message rate and latency against size, uct-rs (thick) and ucx_perftest (thin)",
    after_help = "Example:\n  perf-plot target/compare-ucx.json -o docs/perf-vs-ucx.svg"
)]
struct Args {
    /// The JSON compare-ucx wrote (--json; default target/compare-ucx.json).
    input: PathBuf,
    /// The SVG to write.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

#[derive(Deserialize)]
struct Compare {
    date: String,
    rows: Vec<CompareRow>,
}

#[derive(Deserialize)]
struct CompareRow {
    transport: String,
    test: String,
    size: u64,
    kind: String,
    ucx: Option<f64>,
    ours: Option<f64>,
}

/// (transport, kind) -> test -> (ucx points, our points)
type Curves = BTreeMap<(String, String), BTreeMap<String, (Vec<(u64, f64)>, Vec<(u64, f64)>)>>;

fn panels(compare: &Compare) -> Vec<Panel> {
    let mut curves = Curves::new();
    for row in &compare.rows {
        let (Some(ucx), Some(ours)) = (row.ucx, row.ours) else {
            continue;
        };
        let test = curves
            .entry((row.transport.clone(), row.kind.clone()))
            .or_default()
            .entry(row.test.clone())
            .or_default();
        test.0.push((row.size, ucx));
        test.1.push((row.size, ours));
    }
    curves
        .into_iter()
        .map(|((transport, kind), tests)| {
            let (what, unit) = match kind.as_str() {
                "lat" => ("latency (p50, one way)", "us"),
                "rate" => ("message rate", "ops/s"),
                _ => ("bandwidth", "MiB/s"),
            };
            let mut series = Vec::new();
            for (group, (test, (ucx, ours))) in tests.into_iter().enumerate() {
                series.push(Series {
                    name: format!("{test} uct-rs"),
                    points: ours,
                    reference: false,
                    group,
                });
                series.push(Series {
                    name: format!("{test} ucx_perftest"),
                    points: ucx,
                    reference: true,
                    group,
                });
            }
            Panel {
                title: format!("{transport}: {what}"),
                y_label: unit.to_string(),
                series,
            }
        })
        .collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let text = match std::fs::read_to_string(&args.input) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "perf-plot: cannot read {}: {e}; run scripts/compare-ucx first",
                args.input.display()
            );
            return ExitCode::from(2);
        }
    };
    let compare: Compare = match serde_json::from_str(&text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "perf-plot: {} is not compare-ucx's JSON: {e}",
                args.input.display()
            );
            return ExitCode::from(2);
        }
    };
    let title = format!("uct-rs perftest against ucx_perftest, {}", compare.date);
    match draw(&args.output, &title, &panels(&compare), 3) {
        Ok(()) => {
            eprintln!("perf-plot: wrote {}", args.output.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("perf-plot: {e}");
            ExitCode::FAILURE
        }
    }
}
