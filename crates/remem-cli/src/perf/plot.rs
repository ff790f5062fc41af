//! SVG plots of `remem perf` results against message size (`--plot FILE`).
//!
//! The title names the test and, below it, the run's parameters (raw provider or async
//! API, QP type, devices, QPs, iterations or duration, …). The x axis is the message size
//! on a log2 scale, labelled `2`, `64`, `1K`, `64K`, `8M`. Bandwidth rows give two panels:
//! average and peak bandwidth in the table's unit (MiB/s = perftest's MB/sec, 2^20 bytes
//! per second, or Gb/s with `--report_gbits`), then the message rate (Mpps) on a log
//! scale, so that the rate of 8 MiB messages is as visible as that of 2-byte ones.
//! Latency rows give one panel: the median (`t_typical`), the mean and the 99th
//! percentile, in µs on a log scale, so that the microseconds of small messages show
//! beside the milliseconds of large ones. Values that are not finite or are negative are left out (and
//! values that are not above 0 on the log scale), rows with size 0 are left out, and
//! absurdly large values are clamped, so no input makes plotting panic.

use super::report::{self, BwRow, LatRow, Row};
use plotters::coord::combinators::IntoLogRange;
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::prelude::*;
use std::io;
use std::path::Path;

/// Width of the drawing, pixels.
const WIDTH: u32 = 960;
/// Height of one panel, pixels.
const PANEL_HEIGHT: u32 = 380;
/// Height of the title strip above the panels, pixels.
const TITLE_HEIGHT: u32 = 80;
/// At most this many labelled ticks on the size axis.
const MAX_X_LABELS: usize = 12;
/// The third line colour (a darker green than plotters' `GREEN`).
const DARK_GREEN: RGBColor = RGBColor(0, 150, 0);
/// Values above this are drawn at this height (keeps the axis arithmetic finite).
const Y_CLAMP: f64 = 1e12;
/// The y axis spans at least this much, so all-zero or tiny data still gets an axis.
const Y_MIN_SPAN: f64 = 1e-6;

/// One line on a panel.
struct Series {
    label: &'static str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// One chart: a caption, the y-axis description and its lines.
struct Panel {
    caption: &'static str,
    legend: SeriesLabelPosition,
    y_desc: &'static str,
    /// A log-scale y axis.
    log_y: bool,
    series: Vec<Series>,
}

/// The title of a drawing.
#[derive(Debug, Clone)]
pub struct Title {
    /// The test (`write_bw`, …), the title's first line.
    pub test: String,
    /// The run's parameters, the second line.
    pub params: String,
}

/// Writes an SVG drawing of `rows` against message size to `path`, titled with `title`.
///
/// Bandwidth rows are drawn as average and peak bandwidth (MiB/s, or Gb/s when `gbits`)
/// with the message rate (Mpps, log scale) in a second panel; latency rows as median,
/// mean and 99th percentile latency (µs, log scale). A slice holding both kinds gets all three
/// panels.
///
/// # Errors
///
/// [`io::ErrorKind::InvalidInput`] when `rows` is empty or has no row with a message size
/// above 0; any error from drawing or from writing the file.
pub fn plot(path: &Path, title: &Title, rows: &[Row], gbits: bool) -> io::Result<()> {
    let svg = render(title, rows, gbits)?;
    std::fs::write(path, svg)
}

/// The panels of `rows` and the smallest and largest message size.
fn panels(rows: &[Row], gbits: bool) -> io::Result<(Vec<Panel>, u64, u64)> {
    if rows.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "nothing to plot: no result rows",
        ));
    }
    let bw: Vec<&BwRow> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Bw(b) if b.size > 0 => Some(b),
            _ => None,
        })
        .collect();
    let lat: Vec<&LatRow> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Lat(l) if l.size > 0 => Some(l),
            _ => None,
        })
        .collect();
    let sizes: Vec<u64> = bw
        .iter()
        .map(|b| b.size)
        .chain(lat.iter().map(|l| l.size))
        .collect();
    let (Some(&min_size), Some(&max_size)) = (sizes.iter().min(), sizes.iter().max()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "nothing to plot: no row has a message size above 0",
        ));
    };

    let mut panels = Vec::new();
    if !bw.is_empty() {
        // The table's unit and numbers (report::table_bw), so that the two agree.
        let y_desc = if gbits {
            "bandwidth (Gb/s = 10^9 bit/s)"
        } else {
            "bandwidth (MiB/s = 2^20 B/s, perftest's MB/sec)"
        };
        panels.push(Panel {
            caption: "bandwidth",
            legend: SeriesLabelPosition::UpperLeft,
            y_desc,
            log_y: false,
            series: vec![
                series(
                    "average",
                    BLUE,
                    bw.iter()
                        .map(|b| (b.size, report::table_bw(b.avg_bps, gbits))),
                ),
                series(
                    "peak",
                    RED,
                    bw.iter()
                        .map(|b| (b.size, report::table_bw(b.peak_bps, gbits))),
                ),
            ],
        });
        panels.push(Panel {
            caption: "message rate",
            legend: SeriesLabelPosition::UpperRight,
            y_desc: "message rate (Mpps, log scale)",
            log_y: true,
            series: vec![series(
                "average",
                DARK_GREEN,
                bw.iter().map(|b| (b.size, b.msg_rate / 1e6)),
            )],
        });
    }
    if !lat.is_empty() {
        panels.push(Panel {
            caption: "latency",
            legend: SeriesLabelPosition::UpperLeft,
            y_desc: "latency (µs, log scale)",
            // Log scale: 2 µs at 2 bytes must show beside milliseconds at 8 MiB.
            log_y: true,
            series: vec![
                series(
                    "typical (median)",
                    BLUE,
                    lat.iter().map(|l| (l.size, l.typical)),
                ),
                series("average", DARK_GREEN, lat.iter().map(|l| (l.size, l.avg))),
                series("p99", RED, lat.iter().map(|l| (l.size, l.p99))),
            ],
        });
    }

    Ok((panels, min_size, max_size))
}

/// Draws the SVG document into a string.
fn render(title: &Title, rows: &[Row], gbits: bool) -> io::Result<String> {
    let (panels, min_size, max_size) = panels(rows, gbits)?;
    let x_axis = SizeAxis::new(min_size, max_size);
    // At most three panels: the cast cannot truncate.
    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let (top, body) = root.split_vertically(TITLE_HEIGHT);
        let center = |size: u32| {
            ("sans-serif", size).into_font().color(&BLACK).pos(
                plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Center,
                    plotters::style::text_anchor::VPos::Top,
                ),
            )
        };
        let mid = (WIDTH / 2) as i32;
        top.draw(&Text::new(
            format!("remem perf: {}", title.test),
            (mid, 8),
            center(28),
        ))
        .map_err(draw_error)?;
        top.draw(&Text::new(title.params.clone(), (mid, 48), center(15)))
            .map_err(draw_error)?;
        let areas = body.split_evenly((panels.len(), 1));
        for (area, panel) in areas.iter().zip(&panels) {
            draw_panel(area, panel, &x_axis)?;
        }
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// Collects one line's points: x = log2(size); values that are not finite or are negative
/// are left out, values above [`Y_CLAMP`] are clamped.
fn series(
    label: &'static str,
    color: RGBColor,
    values: impl Iterator<Item = (u64, f64)>,
) -> Series {
    let points = values
        .filter(|&(size, y)| size > 0 && y.is_finite() && y >= 0.0)
        .map(|(size, y)| (log2(size), y.min(Y_CLAMP)))
        .collect();
    Series {
        label,
        color,
        points,
    }
}

/// log2 of a size above 0, as a float (exact for powers of two).
fn log2(size: u64) -> f64 {
    // A u64 converts to the nearest f64; its log2 is at most 64.
    (size as f64).log2()
}

/// The message-size axis: its range in log2 units and where the labelled ticks go.
#[derive(Clone)]
struct SizeAxis {
    range: std::ops::Range<f64>,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl SizeAxis {
    /// The axis for sizes `min..=max` (both above 0).
    fn new(min: u64, max: u64) -> Self {
        let lo = log2(min).floor();
        let hi = log2(max).ceil();
        let (lo, hi) = if hi - lo < 1.0 {
            (lo - 1.0, hi + 1.0)
        } else {
            (lo, hi)
        };
        // lo and hi lie in -1..=65: the casts are exact.
        let (lo_i, hi_i) = (lo as i32, hi as i32);
        let count = usize::try_from(hi_i - lo_i + 1).unwrap_or(1);
        let step = count.div_ceil(MAX_X_LABELS).max(1);
        let light: Vec<f64> = (lo_i..=hi_i).map(f64::from).collect();
        let bold = light.iter().copied().step_by(step).collect();
        Self {
            range: (lo - 0.3)..(hi + 0.3),
            bold,
            light,
        }
    }
}

impl Ranged for SizeAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let frac = (value - self.range.start) / span;
        let pixel = f64::from(limit.0) + frac * (f64::from(limit.1) - f64::from(limit.0));
        // Saturating (and 0 for NaN): never a panic.
        pixel.round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

impl ValueFormatter<f64> for SizeAxis {
    fn format(value: &f64) -> String {
        size_label(*value)
    }
}

/// Labels a log2 tick with the size it stands for: `2`, `64`, `1K`, `64K`, `8M`.
fn size_label(exp: f64) -> String {
    if !exp.is_finite() {
        return String::new();
    }
    let e = exp.round();
    if !(0.0..=70.0).contains(&e) {
        return String::new();
    }
    // 0 ≤ e ≤ 70 after the check: exact as u32, and 2^e fits in a u128.
    let e = e as u32;
    let unit = [
        (60, "E"),
        (50, "P"),
        (40, "T"),
        (30, "G"),
        (20, "M"),
        (10, "K"),
    ]
    .into_iter()
    .find(|&(shift, _)| e >= shift);
    match unit {
        Some((shift, suffix)) => format!("{}{suffix}", 1u128 << (e - shift)),
        None => (1u128 << e).to_string(),
    }
}

/// A panel's y axis: linear from 0, or logarithmic around the positive values.
#[derive(Debug, Clone, Copy, PartialEq)]
struct YAxis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl YAxis {
    fn of(panel: &Panel) -> YAxis {
        let ys = || {
            panel
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|&(_, y)| y))
        };
        if panel.log_y {
            let min = ys().filter(|&y| y > 0.0).fold(f64::INFINITY, f64::min);
            let max = ys().filter(|&y| y > 0.0).fold(0.0, f64::max);
            if min.is_finite() && max > 0.0 {
                // Room around the extremes; at least a decade.
                let lo = min / 2.0;
                return YAxis {
                    lo,
                    hi: (max * 2.0).max(lo * 10.0),
                    log: true,
                };
            }
        }
        let y_max = ys().fold(0.0f64, f64::max);
        YAxis {
            lo: 0.0,
            hi: (y_max * 1.1).max(Y_MIN_SPAN),
            log: false,
        }
    }

    /// Where `y` sits on the axis, from 0 (bottom) to 1 (top).
    #[cfg(test)]
    fn fraction(&self, y: f64) -> f64 {
        if self.log {
            (y.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (y - self.lo) / (self.hi - self.lo)
        }
    }
}

/// Draws one panel into `area`.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    x_axis: &SizeAxis,
) -> io::Result<()> {
    let y = YAxis::of(panel);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(panel.caption, ("sans-serif", 21))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(80);
    if y.log {
        let chart = builder
            .build_cartesian_2d(x_axis.clone(), (y.lo..y.hi).log_scale())
            .map_err(draw_error)?;
        draw_series_into(chart, panel, true)
    } else {
        let chart = builder
            .build_cartesian_2d(x_axis.clone(), y.lo..y.hi)
            .map_err(draw_error)?;
        draw_series_into(chart, panel, false)
    }
}

/// Draws the mesh, the lines and the legend of `panel` into `chart`; on a log axis only
/// the points above 0.
fn draw_series_into<'a, DB, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<SizeAxis, Y>>,
    panel: &Panel,
    positive_only: bool,
) -> io::Result<()>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(panel.y_desc)
        .x_labels(MAX_X_LABELS)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(BLACK.mix(0.08))
        .draw()
        .map_err(draw_error)?;
    for s in &panel.series {
        let color = s.color;
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(_, y)| !positive_only || y > 0.0)
            .collect();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(draw_error)?
            .label(s.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(draw_error)?;
    }
    chart
        .configure_series_labels()
        .position(panel.legend.clone())
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// A drawing error as an I/O error.
fn draw_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("plotting failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A path in the temp directory no other test (or process) uses.
    fn temp_path(name: &str) -> std::path::PathBuf {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        std::env::temp_dir().join(format!(
            "remem-plot-{}-{n}-{nanos}-{name}.svg",
            std::process::id()
        ))
    }

    fn title(test: &str) -> Title {
        Title {
            test: test.into(),
            params: "raw provider · RC · soft@127.0.0.2:4791 → soft@127.0.0.1:4791 · 1 QP".into(),
        }
    }

    /// Plots to a temp file and returns what was written (the file is removed).
    fn plot_to_string(name: &str, test: &str, rows: &[Row], gbits: bool) -> String {
        let path = temp_path(name);
        plot(&path, &title(test), rows, gbits).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read the plot back");
        let _ = std::fs::remove_file(&path);
        svg
    }

    /// Checks that `doc` is well-formed XML with one root element, `svg`: tags nest and
    /// close, attribute values are quoted, and text holds no raw `<` or stray `&`.
    fn check_well_formed(doc: &str) -> Result<(), String> {
        let mut stack: Vec<&str> = Vec::new();
        let mut roots = Vec::new();
        let mut rest = doc.trim_start();
        if let Some(decl) = rest.strip_prefix("<?") {
            let end = decl.find("?>").ok_or("unclosed XML declaration")?;
            rest = &decl[end + 2..];
        }
        while !rest.is_empty() {
            let Some(open) = rest.find('<') else {
                check_text(rest)?;
                break;
            };
            check_text(&rest[..open])?;
            rest = &rest[open..];
            if let Some(comment) = rest.strip_prefix("<!--") {
                let end = comment.find("-->").ok_or("unclosed comment")?;
                rest = &comment[end + 3..];
                continue;
            }
            // Find the tag's closing '>' outside quoted attribute values.
            let mut quote = None;
            let mut end = None;
            for (i, c) in rest.char_indices().skip(1) {
                match (quote, c) {
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), '<') => return Err("'<' in an attribute value".into()),
                    (Some(_), _) => {}
                    (None, '"' | '\'') => quote = Some(c),
                    (None, '<') => return Err("'<' inside a tag".into()),
                    (None, '>') => {
                        end = Some(i);
                        break;
                    }
                    (None, _) => {}
                }
            }
            let end = end.ok_or("unclosed tag")?;
            let tag = &rest[1..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                let name = name.trim();
                match stack.pop() {
                    Some(open) if open == name => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let self_closing = tag.ends_with('/');
            let name = tag
                .trim_end_matches('/')
                .split_whitespace()
                .next()
                .ok_or("empty tag")?;
            if name.is_empty() || name.starts_with('!') || name.starts_with('?') {
                return Err(format!("unexpected markup <{tag}>"));
            }
            if stack.is_empty() {
                roots.push(name);
            }
            if !self_closing {
                stack.push(name);
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed elements {stack:?}"));
        }
        if roots != ["svg"] {
            return Err(format!("root elements {roots:?}, want one <svg>"));
        }
        Ok(())
    }

    /// Text between tags: every `&` starts an entity.
    fn check_text(text: &str) -> Result<(), String> {
        for (i, _) in text.match_indices('&') {
            let entity = &text[i + 1..];
            let end = entity.find(';').ok_or("'&' without ';'")?;
            let name = &entity[..end];
            let ok = matches!(name, "lt" | "gt" | "amp" | "quot" | "apos")
                || name.strip_prefix('#').is_some_and(|n| {
                    !n.is_empty()
                        && (n.chars().all(|c| c.is_ascii_digit())
                            || n.strip_prefix('x').is_some_and(|h| {
                                !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit())
                            }))
                });
            if !ok {
                return Err(format!("bad entity &{name};"));
            }
        }
        Ok(())
    }

    fn bw(size: u64, avg_mbps: f64) -> Row {
        Row::Bw(BwRow {
            size,
            iterations: 5000,
            peak_bps: avg_mbps * 1.2e6,
            avg_bps: avg_mbps * 1e6,
            msg_rate: avg_mbps * 1e6 / size as f64,
        })
    }

    fn lat(size: u64, typical: f64) -> Row {
        Row::Lat(LatRow {
            size,
            iterations: 1000,
            min: typical * 0.8,
            max: typical * 5.0,
            typical,
            avg: typical * 1.1,
            stdev: typical * 0.2,
            p99: typical * 2.0,
            p999: typical * 3.0,
        })
    }

    #[test]
    fn bandwidth_rows_plot_as_svg() {
        let rows: Vec<Row> = (1..=23).map(|e| bw(1 << e, 10.0 * f64::from(e))).collect();
        let svg = plot_to_string("bw", "write_bw", &rows, false);
        check_well_formed(&svg).unwrap();
        for want in [
            "remem perf: write_bw",
            "soft@127.0.0.2:4791 → soft@127.0.0.1:4791",
            "message size (bytes)",
            "bandwidth (MiB/s = 2^20 B/s, perftest&apos;s MB/sec)",
            "message rate (Mpps, log scale)",
            "average",
            "peak",
            "\n2\n</text>",
            "\n8M\n</text>",
        ] {
            assert!(svg.contains(want), "{want:?} missing from the plot");
        }
        assert!(!svg.contains("latency (µs"));
    }

    #[test]
    fn gbits_changes_the_bandwidth_unit() {
        let rows = [bw(64, 100.0), bw(1024, 900.0), bw(65536, 3000.0)];
        let svg = plot_to_string("gbits", "read_bw", &rows, true);
        check_well_formed(&svg).unwrap();
        assert!(svg.contains("bandwidth (Gb/s = 10^9 bit/s)"));
        assert!(!svg.contains("MiB/s"));
        for want in ["\n64\n</text>", "\n1K\n</text>", "\n64K\n</text>"] {
            assert!(svg.contains(want), "{want:?} missing from the plot");
        }
    }

    #[test]
    fn latency_rows_plot_as_svg() {
        let rows = [
            lat(2, 4.0),
            lat(64, 4.5),
            lat(4096, 9.0),
            lat(1 << 20, 300.0),
        ];
        let svg = plot_to_string("lat", "write_lat", &rows, false);
        check_well_formed(&svg).unwrap();
        for want in [
            "remem perf: write_lat",
            "message size (bytes)",
            "latency (µs, log scale)",
            "typical (median)",
            "p99",
        ] {
            assert!(svg.contains(want), "{want:?} missing from the plot");
        }
        assert!(!svg.contains("bandwidth"));
    }

    #[test]
    fn empty_rows_are_invalid_input() {
        let path = temp_path("empty");
        let err = plot(&path, &title("write_bw"), &[], false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(!path.exists(), "no file is written for nothing");
        let err = plot(&path, &title("write_bw"), &[bw(0, 1.0), lat(0, 1.0)], false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn odd_values_neither_panic_nor_break_the_svg() {
        let odd = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -1.0,
            f64::MAX,
            f64::MIN_POSITIVE,
        ];
        for (i, &v) in odd.iter().enumerate() {
            let rows = [
                Row::Bw(BwRow {
                    size: 1 << i,
                    iterations: 0,
                    peak_bps: v,
                    avg_bps: v,
                    msg_rate: v,
                }),
                Row::Lat(LatRow {
                    size: u64::MAX,
                    iterations: 0,
                    min: v,
                    max: v,
                    typical: v,
                    avg: v,
                    stdev: v,
                    p99: v,
                    p999: v,
                }),
                bw(1, v),
            ];
            let odd = Title {
                test: "odd <&> \"test\"".into(),
                params: "<params & more>".into(),
            };
            let svg = render(&odd, &rows, i % 2 == 0).unwrap();
            check_well_formed(&svg).unwrap_or_else(|e| panic!("value {v}: {e}"));
        }
        // One size only, all zero.
        let svg = render(&title("one"), &[bw(8, 0.0)], false).unwrap();
        check_well_formed(&svg).unwrap();
        assert!(svg.contains("\n8\n</text>"));
    }

    /// The plot draws the numbers the table prints (and `--json` names), in its unit.
    #[test]
    fn bandwidth_panel_values_are_the_tables() {
        let row = BwRow {
            size: 65536,
            iterations: 5000,
            peak_bps: 1.9e9,
            avg_bps: 1.7e9,
            msg_rate: 1.7e9 / 65536.0,
        };
        for gbits in [false, true] {
            let (panels, _, _) = panels(&[Row::Bw(row)], gbits).unwrap();
            let table = report::format_row(&Row::Bw(row), gbits);
            let cols: Vec<f64> = table
                .split_whitespace()
                .map(|c| c.parse().unwrap())
                .collect();
            let y = |label: &str| {
                panels[0]
                    .series
                    .iter()
                    .find(|s| s.label == label)
                    .unwrap()
                    .points[0]
                    .1
            };
            assert_eq!(format!("{:.2}", y("peak")), format!("{:.2}", cols[2]));
            assert_eq!(format!("{:.2}", y("average")), format!("{:.2}", cols[3]));
            assert_eq!(
                format!("{:.6}", panels[1].series[0].points[0].1),
                format!("{:.6}", cols[4])
            );
        }
    }

    /// The message rate of every size stands clear of the axis: from 2 bytes (millions of
    /// messages a second) to 8 MiB (hundreds), each point at least a twentieth of the
    /// panel above its bottom (on a linear axis the 8 MiB point sat at 0.0001).
    /// Latency from 2 µs (2 bytes) to milliseconds (8 MiB): on a linear axis the small
    /// sizes would lie flat on the bottom; on the log axis every point stands clear of it.
    #[test]
    fn every_latency_is_visible() {
        let rows: Vec<Row> = (1..=23)
            .map(|e| lat(1u64 << e, 2.0 + (1u64 << e) as f64 / 2500.0))
            .collect();
        let (panels, _, _) = panels(&rows, false).unwrap();
        let latency = &panels[0];
        assert!(latency.log_y);
        let axis = YAxis::of(latency);
        for series in &latency.series {
            for &(x, y) in &series.points {
                let f = axis.fraction(y);
                assert!(
                    (0.05..=1.0).contains(&f),
                    "{}: size 2^{x}: {y} µs at {f} of the axis",
                    series.label
                );
            }
        }
        let svg = render(&title("write_lat"), &rows, false).unwrap();
        check_well_formed(&svg).unwrap();
        assert!(svg.contains("latency (µs, log scale)"));
    }

    #[test]
    fn every_message_rate_is_visible() {
        // A link of 2 GB/s at large sizes, 2 Mpps at small ones.
        let rows: Vec<Row> = (1..=23)
            .map(|e| {
                let size = 1u64 << e;
                let rate = (2e9 / size as f64).min(2e6);
                Row::Bw(BwRow {
                    size,
                    iterations: 1000,
                    peak_bps: rate * size as f64,
                    avg_bps: rate * size as f64,
                    msg_rate: rate,
                })
            })
            .collect();
        let (panels, _, _) = panels(&rows, false).unwrap();
        let rate = &panels[1];
        assert!(rate.log_y);
        let axis = YAxis::of(rate);
        for &(x, y) in &rate.series[0].points {
            let f = axis.fraction(y);
            assert!(
                (0.05..=1.0).contains(&f),
                "size 2^{x}: {y} Mpps at {f} of the axis"
            );
        }
        let svg = render(&title("write_bw"), &rows, false).unwrap();
        check_well_formed(&svg).unwrap();
    }

    #[test]
    fn the_title_carries_the_parameters() {
        let t = Title {
            test: "send_bw".into(),
            params: "raw provider · UD, bidirectional · soft@a → soft@b · 4 QPs · 100 \
                     iterations per size"
                .into(),
        };
        let svg = render(&t, &[bw(2, 1.0), bw(4, 2.0)], false).unwrap();
        check_well_formed(&svg).unwrap();
        for want in [
            "remem perf: send_bw",
            "UD, bidirectional",
            "4 QPs",
            "100 iterations",
        ] {
            assert!(svg.contains(want), "{want:?} missing from the title");
        }
    }

    #[test]
    fn size_labels() {
        let cases = [
            (0.0, "1"),
            (1.0, "2"),
            (6.0, "64"),
            (10.0, "1K"),
            (16.0, "64K"),
            (23.0, "8M"),
            (30.0, "1G"),
            (64.0, "16E"),
        ];
        for (e, want) in cases {
            assert_eq!(size_label(e), want);
        }
        assert_eq!(size_label(f64::NAN), "");
        assert_eq!(size_label(-3.0), "");
        assert_eq!(size_label(1e9), "");
    }

    #[test]
    fn size_axis_labels_at_most_max_ticks() {
        let axis = SizeAxis::new(1, u64::MAX);
        assert!(axis.bold.len() <= MAX_X_LABELS);
        assert_eq!(axis.light.len(), 65);
        let axis = SizeAxis::new(64, 64);
        assert_eq!(axis.bold, [5.0, 6.0, 7.0]);
        let axis = SizeAxis::new(2, 1 << 23);
        assert_eq!(axis.bold.len(), 12);
        assert_eq!(axis.bold.first(), Some(&1.0));
        assert_eq!(axis.bold.last(), Some(&23.0));
    }
}
