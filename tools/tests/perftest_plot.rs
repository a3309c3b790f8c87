//! perftest's pictures and progress line (issue 17): `--plot` draws an SVG
//! that rsvg-convert renders to a PNG with a chart in it (not blank), and
//! with stderr piped there is no progress line. Without rsvg-convert
//! (Debian's librsvg2-bin, installed by scripts/setup) the rendering test
//! is reported skipped, by name, with the reason.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

fn perftest(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_perftest"))
        .args(args)
        .env_remove("UCT_TLS")
        .output()
        .expect("run perftest")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uct-perftest-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir.join(name)
}

/// Pixels that are not white, and distinct colours, of an RGB(A) PNG.
fn ink(png_path: &Path) -> Result<(usize, usize, usize), Failed> {
    let file = std::fs::File::open(png_path).map_err(|e| format!("open the PNG: {e}"))?;
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .map_err(|e| format!("not a PNG: {e}"))?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut buf)
        .map_err(|e| format!("cannot decode the PNG: {e}"))?;
    let channels = info.color_type.samples();
    if channels < 3 {
        return Err(format!("unexpected PNG colour type {:?}", info.color_type).into());
    }
    let mut colours = HashSet::new();
    let mut inked = 0;
    let pixels = buf[..info.buffer_size()].chunks(channels);
    let total = pixels.len();
    for px in pixels {
        // Transparent pixels count as background.
        let opaque = channels < 4 || px[3] > 0;
        let rgb = (px[0], px[1], px[2]);
        if opaque && rgb != (255, 255, 255) {
            inked += 1;
        }
        colours.insert(rgb);
    }
    Ok((inked, colours.len(), total))
}

fn plot_renders_to_a_png_that_is_not_blank() -> Result<(), Failed> {
    let svg = scratch("sweep.svg");
    let svg_s = svg.to_str().ok_or("a UTF-8 temp path")?;
    let out = perftest(&[
        "-t", "posix", "-s", "8:64k", "-n", "200", "-f", "--plot", svg_s,
    ]);
    if !out.status.success() {
        return Err(format!("perftest failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let png_path = svg.with_extension("png");
    let rendered = Command::new("rsvg-convert")
        .arg("-o")
        .arg(&png_path)
        .arg(&svg)
        .output()
        .map_err(|e| format!("run rsvg-convert: {e}"))?;
    if !rendered.status.success() {
        return Err(format!(
            "rsvg-convert refused the SVG: {}",
            String::from_utf8_lossy(&rendered.stderr)
        )
        .into());
    }
    let (inked, colours, total) = ink(&png_path)?;
    let _ = std::fs::remove_file(&svg);
    let _ = std::fs::remove_file(&png_path);
    // Axes, grid, labels and the curve: a blank or near-blank image has a
    // handful of colours and almost no ink.
    if inked * 100 < total || colours < 8 {
        return Err(format!(
            "the plot looks blank: {inked} of {total} pixels inked, {colours} colours"
        )
        .into());
    }
    Ok(())
}

fn no_progress_line_when_stderr_is_piped() -> Result<(), Failed> {
    // Output captures stderr through a pipe.
    let out = perftest(&["-t", "self", "-s", "8:4k", "-n", "200"]);
    if !out.status.success() {
        return Err(format!("perftest failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains('\r') || err.contains("[1/") || err.contains("left)") {
        return Err(format!("a progress line went to a pipe: {err:?}").into());
    }
    Ok(())
}

fn plot_on_a_server_is_refused() -> Result<(), Failed> {
    let out = perftest(&["--listen", "-t", "self", "--plot", "/tmp/never.svg"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("--plot") {
        return Err(format!("expected exit 2 naming --plot, got {:?}: {err}", out.status).into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let rsvg = Command::new("rsvg-convert").arg("--version").output();
    let render = match rsvg {
        Ok(o) if o.status.success() => Trial::test(
            "plot_renders_to_a_png_that_is_not_blank",
            plot_renders_to_a_png_that_is_not_blank,
        ),
        _ => {
            let why =
                "rsvg-convert is not installed (apt-get install librsvg2-bin; scripts/setup does)";
            println!("perftest_plot: SKIPPED plot_renders_to_a_png_that_is_not_blank: {why}");
            Trial::ignorable_test("plot_renders_to_a_png_that_is_not_blank", move || {
                Ok(Completion::ignored_with(why))
            })
        }
    };
    let trials = vec![
        render,
        Trial::test(
            "no_progress_line_when_stderr_is_piped",
            no_progress_line_when_stderr_is_piped,
        ),
        Trial::test("plot_on_a_server_is_refused", plot_on_a_server_is_refused),
    ];
    libtest_mimic::run(&args, trials).exit();
}
