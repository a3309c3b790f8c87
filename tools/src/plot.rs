//! Charts of measurements as SVG (plotters' SVG backend: no fonts or
//! bitmaps needed): perftest's sweep (`perftest --plot`), and both tools'
//! curves per transport for `scripts/compare-ucx` (`perf-plot`).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// One curve: a name for the legend and (size in bytes, value) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(u64, f64)>,
    /// Drawn thin, with hollow markers: the tool compared with.
    pub reference: bool,
    /// Series of one group share a colour (a test, measured by both tools).
    pub group: usize,
}

/// One panel: a title, the y axis's label, its curves.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot draw {path}: {why}; check that its folder exists and is writable")]
    Draw { path: String, why: String },
    #[error("nothing to plot: {0}")]
    Empty(String),
}

/// Colours by series index, told apart also in grey print (markers differ).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Size labels for the x axis: 8, 1K, 64K, 4M.
fn size_label(bytes: &u64) -> String {
    crate::text::size(*bytes)
}

/// Writes `panels` as a grid of `columns` charts into the SVG `path`,
/// under `title`.
pub fn draw(path: &Path, title: &str, panels: &[Panel], columns: usize) -> Result<(), PlotError> {
    let drawable: Vec<&Panel> = panels
        .iter()
        .filter(|p| p.series.iter().any(|s| !s.points.is_empty()))
        .collect();
    if drawable.is_empty() {
        return Err(PlotError::Empty(format!(
            "no panel of {title:?} has a point"
        )));
    }
    let columns = columns.clamp(1, drawable.len());
    let rows = drawable.len().div_ceil(columns);
    let (w, h) = (560 * columns as u32, 40 + 380 * rows as u32);
    let fail = |why: String| PlotError::Draw {
        path: path.display().to_string(),
        why,
    };
    let root = SVGBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| fail(e.to_string()))?;
    let areas = root.split_evenly((rows, columns));
    for (panel, area) in drawable.iter().zip(areas.iter()) {
        draw_panel(area, panel).map_err(fail)?;
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

fn draw_panel(area: &DrawingArea<SVGBackend, Shift>, panel: &Panel) -> Result<(), String> {
    let points = panel.series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (u64::MAX, 1u64, f64::MAX, 0f64);
    for &(x, y) in points {
        x_min = x_min.min(x.max(1));
        x_max = x_max.max(x);
        if y > 0.0 && y.is_finite() {
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
    }
    if y_max <= 0.0 {
        (y_min, y_max) = (1.0, 10.0);
    }
    // One point: a range around it, so that the axes have a span.
    let x_range = (x_min.max(1) / 2).max(1)..(x_max.saturating_mul(2)).max(2);
    let y_range = (y_min / 2.0)..(y_max * 2.0);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.log_scale().base(2.0), y_range.log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(panel.y_label.as_str())
        .x_label_formatter(&size_label)
        .y_label_formatter(&|v| short_number(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    for series in &panel.series {
        let colour = COLOURS[series.group % COLOURS.len()];
        let width = if series.reference { 1 } else { 3 };
        let pts: Vec<(u64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| x > 0 && y > 0.0 && y.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(width)))
            .map_err(|e| e.to_string())?
            .label(series.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
            });
        let reference = series.reference;
        chart
            .draw_series(pts.into_iter().map(move |p| {
                let style = if reference {
                    colour.stroke_width(1)
                } else {
                    colour.filled()
                };
                Circle::new(p, 3, style)
            }))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// 0.05, 3.2, 850, 12K, 4.5M: axis labels that fit.
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}K", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel(points: Vec<(u64, f64)>) -> Panel {
        Panel {
            title: "put_bw".into(),
            y_label: "MiB/s".into(),
            series: vec![Series {
                name: "ours".into(),
                points,
                reference: false,
                group: 0,
            }],
        }
    }

    #[test]
    fn a_sweep_and_a_single_point_are_drawn() {
        let dir = std::env::temp_dir().join(format!("uct-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sweep = dir.join("sweep.svg");
        draw(
            &sweep,
            "t",
            &[panel(vec![(8, 1.0), (1024, 100.0), (1 << 20, 5000.0)])],
            1,
        )
        .unwrap();
        let svg = std::fs::read_to_string(&sweep).unwrap();
        assert!(svg.contains("<svg") && svg.contains("polyline"), "{svg}");
        let one = dir.join("one.svg");
        draw(&one, "t", &[panel(vec![(4096, 42.0)])], 1).unwrap();
        assert!(std::fs::read_to_string(&one).unwrap().contains("<circle"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nothing_to_plot_is_an_error_not_an_empty_file() {
        let path = std::env::temp_dir().join("uct-plot-never.svg");
        let e = draw(&path, "t", &[panel(vec![])], 1).unwrap_err();
        assert!(matches!(e, PlotError::Empty(_)), "{e}");
    }

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(short_number(0.05), "0.050");
        assert_eq!(short_number(3.25), "3.2");
        assert_eq!(short_number(850.0), "850");
        assert_eq!(short_number(12_345.0), "12K");
        assert_eq!(short_number(4_500_000.0), "4.5M");
    }
}
