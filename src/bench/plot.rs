//! PNG figures of a run, in the style of the paper's figures: time against
//! size, time against threads, fragmentation and utilization against size,
//! one line per allocator, log scales.
//!
//! Text needs a TrueType font; the first of [`FONT_PATHS`] that exists is
//! used (or `GPUMALLOC_FONT`). Without one, plotting reports an error and
//! the CSV/JSON files are unaffected: run `gpumalloc plot DIR` on a machine
//! that has one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

use super::report::{Record, Results};

/// Where fonts are looked for.
pub const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn load_font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let candidates: Vec<PathBuf> = std::env::var_os("GPUMALLOC_FONT")
                .map(PathBuf::from)
                .into_iter()
                .chain(FONT_PATHS.iter().map(PathBuf::from))
                .collect();
            let path = candidates.iter().find(|p| p.exists()).ok_or_else(|| {
                format!("no TrueType font found (tried {FONT_PATHS:?}; set GPUMALLOC_FONT)")
            })?;
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{}: not a usable font", path.display()))
        })
        .clone()
}

/// One figure: a metric of one test against size or threads.
struct Figure<'a> {
    title: String,
    x_label: &'static str,
    y_label: String,
    /// allocator → (x, y) points.
    lines: BTreeMap<&'a str, Vec<(f64, f64)>>,
}

/// Draws every figure of `results` into `dir`; returns the files written.
pub fn plot_all(results: &Results, dir: &Path) -> Result<Vec<PathBuf>, String> {
    load_font()?;
    let mut figures: BTreeMap<(String, String, String), Figure> = BTreeMap::new();
    for r in results.records.iter().filter(|r| r.valid && r.samples > 0) {
        let (x, x_label, key) = axis(r);
        let fig = figures
            .entry((r.test.clone(), r.metric.clone(), key.clone()))
            .or_insert_with(|| Figure {
                title: format!(
                    "{} {} {} — {}",
                    r.test, key, r.metric, results.info.device_name
                ),
                x_label,
                y_label: r.metric.clone(),
                lines: BTreeMap::new(),
            });
        fig.lines
            .entry(&r.allocator)
            .or_default()
            .push((x, r.median));
    }
    let mut written = Vec::new();
    for ((test, metric, key), fig) in figures {
        let name = format!(
            "{test}-{metric}{}.png",
            if key.is_empty() {
                String::new()
            } else {
                format!("-{}", key.replace(' ', ""))
            }
        );
        let path = dir.join(name);
        draw(&fig, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The x value of a record and the series key that separates figures.
fn axis(r: &Record) -> (f64, &'static str, String) {
    if r.test == "scaling" {
        (
            r.threads as f64,
            "threads",
            format!("size {}", r.size_label),
        )
    } else if r.size == 0 {
        // Mixed sizes sit at the right of size plots, at 2x the largest.
        (r.threads as f64, "threads", r.size_label.clone())
    } else {
        (r.size as f64, "bytes per allocation", String::new())
    }
}

fn draw(fig: &Figure, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let points = fig.lines.values().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        if y > 0.0 {
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x0 > x1 || y0 > y1 {
        return Ok(());
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 / 1.5..x1 * 1.5).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(fig.x_label)
        .y_desc(&fig.y_label)
        .label_style(("sans-serif", 14))
        .draw()?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (name, pts)) in fig.lines.iter().enumerate() {
        let mut pts = pts.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts.retain(|p| p.1 > 0.0);
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}
