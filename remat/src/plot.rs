//! A small line chart as a PNG (for the sweep's overhead against budget
//! ratio): white background, axes with a grid, tick labels in a 3×5 pixel
//! font drawn at 2× scale, one coloured polyline with square markers per
//! series, and a legend. Encoded by `plan::png::encode_rgb`, so no image or
//! plotting crate is needed. Pure functions; no shared state.

use lake::plan::png::encode_rgb;

/// One line: its name (for the legend) and its `(x, y)` points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: &'static str,
    /// Points, drawn in x order.
    pub points: Vec<(f64, f64)>,
}

/// Colours of the series, in order (DTR red, DTE green, Coop blue).
const COLOURS: [[u8; 3]; 4] = [
    [214, 39, 40],
    [44, 160, 44],
    [31, 119, 180],
    [148, 103, 189],
];
const GRID: [u8; 3] = [225, 225, 225];
const INK: [u8; 3] = [0, 0, 0];
/// Pixels per font dot.
const SCALE: usize = 2;
/// Margins: left, right, top, bottom.
const MARGIN: (usize, usize, usize, usize) = (60, 20, 20, 50);

/// 3×5 glyphs, one row a string of three cells ('#' is ink).
fn glyph(c: char) -> [&'static str; 5] {
    match c {
        '0' => ["###", "#.#", "#.#", "#.#", "###"],
        '1' => [".#.", "##.", ".#.", ".#.", "###"],
        '2' => ["###", "..#", "###", "#..", "###"],
        '3' => ["###", "..#", "###", "..#", "###"],
        '4' => ["#.#", "#.#", "###", "..#", "..#"],
        '5' => ["###", "#..", "###", "..#", "###"],
        '6' => ["###", "#..", "###", "#.#", "###"],
        '7' => ["###", "..#", "..#", "..#", "..#"],
        '8' => ["###", "#.#", "###", "#.#", "###"],
        '9' => ["###", "#.#", "###", "..#", "###"],
        '.' => ["...", "...", "...", "...", ".#."],
        '%' => ["#.#", "..#", ".#.", "#..", "#.#"],
        'A' => [".#.", "#.#", "###", "#.#", "#.#"],
        'B' => ["##.", "#.#", "##.", "#.#", "##."],
        'C' => ["###", "#..", "#..", "#..", "###"],
        'D' => ["##.", "#.#", "#.#", "#.#", "##."],
        'E' => ["###", "#..", "##.", "#..", "###"],
        'G' => ["###", "#..", "#.#", "#.#", "###"],
        'H' => ["#.#", "#.#", "###", "#.#", "#.#"],
        'I' => ["###", ".#.", ".#.", ".#.", "###"],
        'O' => ["###", "#.#", "#.#", "#.#", "###"],
        'P' => ["###", "#.#", "###", "#..", "#.."],
        'R' => ["##.", "#.#", "##.", "#.#", "#.#"],
        'T' => ["###", ".#.", ".#.", ".#.", ".#."],
        'U' => ["#.#", "#.#", "#.#", "#.#", "###"],
        'V' => ["#.#", "#.#", "#.#", "#.#", ".#."],
        _ => ["...", "...", "...", "...", "..."],
    }
}

/// An RGB canvas, row 0 at the top.
struct Canvas {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            rgb: vec![255; width * height * 3],
        }
    }

    fn dot(&mut self, x: i64, y: i64, colour: [u8; 3]) {
        if (0..self.width as i64).contains(&x) && (0..self.height as i64).contains(&y) {
            let at = (y as usize * self.width + x as usize) * 3;
            self.rgb[at..at + 3].copy_from_slice(&colour);
        }
    }

    fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, colour: [u8; 3]) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.dot(xx, yy, colour);
            }
        }
    }

    /// A line two pixels thick (Bresenham).
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), colour: [u8; 3]) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.rect(x, y, 2, 2, colour);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text with its top-left corner at `(x, y)`; upper case, digits, `.%`.
    fn text(&mut self, x: i64, y: i64, text: &str, colour: [u8; 3]) {
        let s = SCALE as i64;
        for (k, c) in text.chars().enumerate() {
            for (row, cells) in glyph(c.to_ascii_uppercase()).iter().enumerate() {
                for (col, cell) in cells.chars().enumerate() {
                    if cell == '#' {
                        let gx = x + (k as i64 * 4 + col as i64) * s;
                        self.rect(gx, y + row as i64 * s, s, s, colour);
                    }
                }
            }
        }
    }
}

/// Width in pixels of `text` in the chart's font.
fn text_width(text: &str) -> i64 {
    (text.chars().count() * 4 * SCALE) as i64
}

/// A "nice" tick step (1, 2 or 5 × 10^k) for about `count` ticks over `span`.
fn tick_step(span: f64, count: f64) -> f64 {
    let raw = (span / count).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * power)
}

/// The series as a line chart of `width` × `height` pixels, PNG-encoded.
/// The x axis runs over the points' x range, the y axis from 0 to their
/// largest y; y ticks are labelled with a `%` sign. Below the x axis it says
/// "BUDGET RATIO", above the y axis "OVERHEAD"; the legend names each
/// colour.
pub fn line_chart(series: &[Series], width: u32, height: u32) -> Vec<u8> {
    let (w, h) = (width.max(200) as usize, height.max(150) as usize);
    let mut c = Canvas::new(w, h);
    let points = series.iter().flat_map(|s| &s.points);
    let (mut x_lo, mut x_hi, mut y_hi) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in points {
        (x_lo, x_hi, y_hi) = (x_lo.min(x), x_hi.max(x), y_hi.max(y));
    }
    if !x_lo.is_finite() {
        (x_lo, x_hi) = (0.0, 1.0);
    }
    if x_hi - x_lo < 1e-9 {
        (x_lo, x_hi) = (x_lo - 0.05, x_hi + 0.05);
    }
    let y_step = tick_step(y_hi.max(1e-3), 5.0);
    let y_top = (y_hi / y_step).ceil().max(1.0) * y_step;
    let (left, right, top, bottom) = MARGIN;
    let (plot_w, plot_h) = ((w - left - right) as f64, (h - top - bottom) as f64);
    let px = |x: f64| left as i64 + ((x - x_lo) / (x_hi - x_lo) * plot_w).round() as i64;
    let py = |y: f64| (top as f64 + plot_h - y / y_top * plot_h).round() as i64;

    let x_step = tick_step(x_hi - x_lo, 8.0);
    let mut tick = (x_lo / x_step).ceil() * x_step;
    while tick <= x_hi + 1e-9 {
        c.rect(px(tick), top as i64, 1, plot_h as i64, GRID);
        let label = format!("{tick:.2}");
        c.text(px(tick) - text_width(&label) / 2, py(0.0) + 6, &label, INK);
        tick += x_step;
    }
    let mut tick = 0.0;
    while tick <= y_top + 1e-9 {
        c.rect(left as i64, py(tick), plot_w as i64, 1, GRID);
        let label = format!("{}%", trim(tick));
        c.text(
            left as i64 - 6 - text_width(&label),
            py(tick) - 5,
            &label,
            INK,
        );
        tick += y_step;
    }
    c.rect(left as i64, top as i64, 2, plot_h as i64 + 1, INK);
    c.rect(left as i64, py(0.0), plot_w as i64, 2, INK);
    c.text(left as i64 + 8, 4, "OVERHEAD", INK);
    let label = "BUDGET RATIO";
    c.text(
        left as i64 + plot_w as i64 / 2 - text_width(label) / 2,
        h as i64 - 18,
        label,
        INK,
    );

    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut pts = s.points.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in pts.windows(2) {
            c.line(
                (px(pair[0].0), py(pair[0].1)),
                (px(pair[1].0), py(pair[1].1)),
                colour,
            );
        }
        for &(x, y) in &pts {
            c.rect(px(x) - 3, py(y) - 3, 7, 7, colour);
        }
        let ly = top as i64 + 8 + 16 * k as i64;
        let lx = (w - right) as i64 - 20 - text_width(s.name);
        c.rect(lx - 16, ly, 10, 10, colour);
        c.text(lx, ly, s.name, INK);
    }
    encode_rgb(w as u32, h as u32, &c.rgb)
}

/// A tick value without trailing zeros.
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_a_png_of_the_asked_size_with_every_colour() {
        let series = [
            Series {
                name: "DTR",
                points: vec![(0.9, 1.0), (0.7, 20.0)],
            },
            Series {
                name: "Coop",
                points: vec![(0.9, 0.5), (0.6, 12.0)],
            },
        ];
        let png = line_chart(&series, 400, 300);
        assert_eq!(&png[1..4], b"PNG");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().expect("4")), 400);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().expect("4")), 300);
        assert_eq!(tick_step(0.3, 8.0), 0.05);
        assert_eq!(tick_step(23.0, 5.0), 5.0);
        assert_eq!(trim(2.50), "2.5");
    }
}
