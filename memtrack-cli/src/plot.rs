//! `memtrack plot FILE -o heap.svg`: live heap bytes over time as a step line on a scale of its
//! own, the peak marked and labelled with its exact value, where each recorded call (a
//! session's `IterationStart`) begins marked by a tick on the panel's top edge; below it, when the recording
//! saw mappings, mapped bytes on a panel and scale of their own (they are often many times the
//! heap, which would flatten it on a shared axis).
//!
//! The events are folded into a [`Timeline`] with one column per pixel of the image width
//! (min and max kept per column), so the SVG has a few points per pixel however long the
//! recording is, and the peak is never lost. It is one pass over the events, as `memtrack show`
//! makes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use memtrack::{
    analysis::Analyzer, analysis::Column, analysis::Extremes, analysis::Timeline, artifact::Output,
    artifact::Reader, event::EventKind, human, totals::Totals,
};
use plotters::backend::SVGBackend;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Colour of the mapped-bytes series (the heap is blue).
const MAPPED: RGBColor = RGBColor(230, 120, 0);

/// Colour of the lines where a recorded call begins.
const CALL: RGBColor = RGBColor(150, 150, 150);
/// How far down the heap panel a call's tick reaches from its top edge (a fraction of it).
const CALL_TICK: f64 = 0.04;

/// The share of the image's height the heap's panel takes when mapped bytes are drawn below.
const HEAP_SHARE: f64 = 0.7;

/// Pixels kept free above the heap's peak for the legend and the peak's label.
const HEADROOM_PX: f64 = 90.0;

/// The image size, pixels.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The artifact.
    file: PathBuf,
    /// Output SVG file.
    #[arg(short, long, default_value = "heap.svg")]
    output: PathBuf,
    /// Image width in pixels (also the number of time columns the events are folded into).
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(200..=16384))]
    width: u32,
    /// Image height in pixels.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u32).range(150..=16384))]
    height: u32,
}

/// Reads `args.file` and writes the chart to `args.output`.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    let (file, output) = (args.file.as_path(), args.output.as_path());
    let size = Size {
        width: args.width,
        height: args.height,
    };
    let reader = Reader::open(file)?;
    // Refused targets (a directory, another user's link) fail before the work.
    let out = Output::create(output)?;
    super::warn_if_recovered(&reader);
    super::whole::warn_lost(&reader, file, "the curve");
    let (Some(first), Some(last)) = (reader.frames().first(), reader.frames().last()) else {
        return Err(crate::error::Error::NoEvents {
            file: file.to_path_buf(),
            verb: "plot",
        });
    };
    let mut timeline = Timeline::new(first.first_ts, last.last_ts, size.width.max(1) as usize)?;
    let mut calls = Calls::new(&timeline);
    let mut a = Analyzer::new();
    let bar = super::progress::events_bar(&reader, "plotting");
    reader.for_each_frame(|_, evs| {
        for e in evs {
            timeline.update(&mut a, e);
            if matches!(e.kind, EventKind::IterationStart) {
                calls.push(e.ts);
            }
        }
        bar.inc(evs.len() as u64);
        Ok(())
    })?;
    bar.finish_and_clear();
    let totals = a.totals();
    let name = reader.metadata().name.clone().unwrap_or_else(|| {
        file.file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    });
    let mut svg = String::new();
    let plot = Plot {
        timeline: &timeline,
        totals: &totals,
        calls: &calls,
        name: &name,
    };
    plot.draw(&mut svg, size).map_err(|e| memtrack::Error::Io {
        what: format!("drawing {}", output.display()),
        source: std::io::Error::other(e),
    })?;
    out.writer()?
        .write_all(svg.as_bytes())
        .map_err(|e| memtrack::Error::Io {
            what: format!("writing {}", out.path().display()),
            source: e,
        })?;
    let written = out.commit()?;
    eprintln!(
        "memtrack: wrote {} ({} events, peak {} live heap bytes)",
        written.display(),
        human::count(totals.events),
        human::count(totals.peak_live_bytes)
    );
    Ok(ExitCode::SUCCESS)
}

/// Where the recorded calls begin: per column of the timeline that holds a call's start, the
/// first such instant (ns after the timeline's start), and how many calls began in all.
struct Calls {
    first_ts: u64,
    /// Columns per nanosecond, as the timeline's.
    scale: f64,
    starts: Vec<u64>,
    last_column: Option<u64>,
    count: u64,
}

impl Calls {
    fn new(t: &Timeline) -> Calls {
        Calls {
            first_ts: t.first_ts(),
            scale: t.width() as f64 / t.span_ns() as f64,
            starts: Vec::new(),
            last_column: None,
            count: 0,
        }
    }

    /// A call began at `ts`: marked unless one already marks its column.
    fn push(&mut self, ts: u64) {
        self.count += 1;
        let ns = ts.saturating_sub(self.first_ts);
        let column = (ns as f64 * self.scale) as u64;
        if self.last_column != Some(column) {
            self.last_column = Some(column);
            self.starts.push(ns);
        }
    }
}

/// The step line of one series, in (ms, units of `unit` bytes): per column a vertical stroke
/// through the value on entry, min, max and the last value, held until the next column and to
/// `end_ms`.
fn step_points(
    cols: &[Column],
    series: impl Fn(&Column) -> Extremes,
    end_ms: f64,
    unit: f64,
) -> Vec<(f64, f64)> {
    let mut pts = Vec::with_capacity(cols.len() * 4 + 1);
    for c in cols {
        let x = c.start_ns as f64 / 1e6;
        let s = series(c);
        for v in [s.enter, s.min, s.max, s.last] {
            pts.push((x, v as f64 / unit));
        }
    }
    if let Some(&(_, y)) = pts.last() {
        pts.push((end_ms, y));
    }
    pts
}

type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The binary unit an axis up to `max` bytes is drawn in (its ticks then fall on whole KiB,
/// MiB…): its size in bytes and its name.
fn unit(max: f64) -> (f64, &'static str) {
    let mut u = (1.0, "B");
    for next in [(1024.0, "KiB"), (1048576.0, "MiB"), (1073741824.0, "GiB")] {
        if max >= 2.0 * next.0 {
            u = next;
        }
    }
    u
}

/// A tick's label: `v` units of `name`, without a needless fraction.
fn tick(v: f64, name: &str) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0} {name}")
    } else {
        format!("{v:.1} {name}")
    }
}

/// What the chart shows.
struct Plot<'a> {
    timeline: &'a Timeline,
    totals: &'a Totals,
    calls: &'a Calls,
    name: &'a str,
}

impl Plot<'_> {
    /// The chart as SVG into `svg`: the heap's panel, and mapped bytes' below it when the
    /// recording saw any.
    fn draw(&self, svg: &mut String, size: Size) -> DrawResult {
        let root = SVGBackend::with_string(svg, (size.width, size.height)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = format!("{}: live heap over time", self.name);
        let area = root.titled(&title, ("sans-serif", 20))?;
        let cols: Vec<Column> = self.timeline.columns().copied().collect();
        let end_ms = self.timeline.span_ns() as f64 / 1e6;
        if self.totals.mapped_bytes_peak == 0 {
            self.heap_panel(&area, &cols, end_ms, true)?;
        } else {
            let split = (f64::from(area.dim_in_pixel().1) * HEAP_SHARE) as i32;
            let (top, bottom) = area.split_vertically(split);
            self.heap_panel(&top, &cols, end_ms, false)?;
            mapped_panel(&bottom, &cols, end_ms, self.totals.mapped_bytes_peak)?;
        }
        root.present()?;
        Ok(())
    }

    /// Live heap bytes on a scale of their own (0 to above the peak, room left above it for
    /// the legend and the peak's label), the calls' starts, the peak marked; the time axis
    /// named if `last` (no panel below).
    fn heap_panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, plotters::coord::Shift>,
        cols: &[Column],
        end_ms: f64,
        last: bool,
    ) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let peak = self.totals.peak_live_bytes;
        let x_labels = 40;
        let plot_px = f64::from(area.dim_in_pixel().1) - f64::from(x_labels) - 24.0;
        let headroom = (HEADROOM_PX / plot_px.max(1.0)).clamp(0.1, 0.5);
        let (unit, name) = unit((peak as f64).max(1.0));
        let top = (peak as f64 / (1.0 - headroom)).max(1.0) / unit;
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(x_labels)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..end_ms, 0f64..top)?;
        let mut mesh = chart.configure_mesh();
        let ticks = |v: &f64| tick(*v, name);
        mesh.y_desc("live heap bytes").y_label_formatter(&ticks);
        if last {
            mesh.x_desc("time (ms from the first event)");
        }
        mesh.draw()?;
        if self.calls.count > 0 {
            let label = format!(
                "a call begins ({})",
                human::plural(self.calls.count, "call", "calls")
            );
            // A tick hanging from the panel's top edge, in a colour of its own: a full-height
            // line would read as the heap dropping to zero where a call begins.
            let tick_bottom = top * (1.0 - CALL_TICK);
            chart
                .draw_series(self.calls.starts.iter().map(|&ns| {
                    let x = ns as f64 / 1e6;
                    PathElement::new(vec![(x, tick_bottom), (x, top)], CALL.stroke_width(2))
                }))?
                .label(label)
                .legend(|(x, y)| PathElement::new(vec![(x + 10, y - 6), (x + 10, y + 6)], CALL));
        }
        let heap = step_points(cols, |c| c.heap, end_ms, unit);
        chart
            .draw_series(LineSeries::new(heap, BLUE.stroke_width(1)))?
            .label("live heap bytes")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        self.peak_marker(&mut chart, end_ms, unit)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    }

    /// A dot where the peak was first reached and its exact value beside it, on a white
    /// ground, towards the middle of the chart so that it stays inside it (`unit`: the bytes
    /// of the chart's unit).
    fn peak_marker<DB: DrawingBackend>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
        end_ms: f64,
        unit: f64,
    ) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let peak = self.totals.peak_live_bytes;
        let peak_ms = self.totals.peak_ts.saturating_sub(self.timeline.first_ts()) as f64 / 1e6;
        let label = format!(
            "peak {} B ({}) at {:.3} ms",
            human::count(peak),
            human::bytes(peak),
            peak_ms
        );
        // No font metrics without a font backend: a sans-serif character of 14 px is about
        // 6.5 px wide.
        let width = (label.chars().count() as f64 * 6.5) as i32 + 8;
        let (anchor, dx, left) = if peak_ms > end_ms / 2.0 {
            (HPos::Right, -8, -8 - width + 4)
        } else {
            (HPos::Left, 8, 4)
        };
        let style =
            TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(anchor, VPos::Bottom));
        chart.draw_series([EmptyElement::at((peak_ms, peak as f64 / unit))
            + Rectangle::new([(left, -24), (left + width, -4)], WHITE.mix(0.85).filled())
            + Circle::new((0, 0), 4, BLUE.filled())
            + Text::new(label, (dx, -6), style)])?;
        Ok(())
    }
}

/// Mapped bytes (page-rounded) on a scale of their own, below the heap's panel, with the time
/// axis.
fn mapped_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    cols: &[Column],
    end_ms: f64,
    peak: u64,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (unit, name) = unit(peak as f64);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..end_ms, 0f64..(peak as f64 * 1.1).max(1.0) / unit)?;
    chart
        .configure_mesh()
        .x_desc("time (ms from the first event)")
        .y_desc("mapped bytes")
        .y_labels(4)
        .y_label_formatter(&|v| tick(*v, name))
        .draw()?;
    let mapped = step_points(cols, |c| c.mapped, end_ms, unit);
    chart.draw_series(LineSeries::new(mapped, MAPPED.stroke_width(1)))?;
    Ok(())
}
