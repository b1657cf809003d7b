//! `memtrack plot FILE -o heap.svg`: live heap bytes over time as a step line, the peak marked
//! and labelled with its exact value, mapped bytes as a second series.
//!
//! The events are folded into a [`Timeline`] with one column per pixel of the image width
//! (min and max kept per column), so the SVG has a few points per pixel however long the
//! recording is, and the peak is never lost. It is one pass over the events, as `memtrack show`
//! makes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use memtrack::{
    analysis::Analyzer, analysis::Column, analysis::Extremes, analysis::Timeline, analysis::Totals,
    artifact::Output, artifact::Reader, human,
};
use plotters::backend::SVGBackend;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Colour of the mapped-bytes series (the heap is blue).
const MAPPED: RGBColor = RGBColor(230, 120, 0);

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
pub(crate) fn run(args: Args) -> memtrack::Result<ExitCode> {
    let (file, output) = (args.file.as_path(), args.output.as_path());
    let size = Size {
        width: args.width,
        height: args.height,
    };
    let reader = Reader::open(file)?;
    // Refused targets (a directory, another user's link) fail before the work.
    let out = Output::create(output)?;
    super::warn_if_recovered(&reader);
    if let Some(f) = reader.final_metadata()
        && f.lost_events > 0
    {
        eprintln!(
            "memtrack: warning: {}: {} events were lost while recording; the curve misses them",
            file.display(),
            human::count(f.lost_events)
        );
    }
    let (Some(first), Some(last)) = (reader.frames().first(), reader.frames().last()) else {
        return Err(memtrack::Error::InvalidOption(format!(
            "{}: the artifact has no events: there is nothing to plot",
            file.display()
        )));
    };
    let mut timeline = Timeline::new(first.first_ts, last.last_ts, size.width.max(1) as usize)?;
    let mut a = Analyzer::new();
    let bar = super::progress::events_bar(&reader, "plotting");
    reader.for_each_frame(|_, evs| {
        for e in evs {
            timeline.update(&mut a, e);
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
    draw(&timeline, &totals, first.first_ts, &name, &mut svg, size).map_err(|e| {
        memtrack::Error::Io {
            what: format!("drawing {}", output.display()),
            source: std::io::Error::other(e),
        }
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

/// The step line of one series, in (ms, bytes): per column a vertical stroke through the
/// value on entry, min, max and the last value, held until the next column and to `end_ms`.
fn step_points(
    cols: &[Column],
    series: impl Fn(&Column) -> Extremes,
    end_ms: f64,
) -> Vec<(f64, f64)> {
    let mut pts = Vec::with_capacity(cols.len() * 4 + 1);
    for c in cols {
        let x = c.start_ns as f64 / 1e6;
        let s = series(c);
        for v in [s.enter, s.min, s.max, s.last] {
            pts.push((x, v as f64));
        }
    }
    if let Some(&(_, y)) = pts.last() {
        pts.push((end_ms, y));
    }
    pts
}

fn draw(
    timeline: &Timeline,
    totals: &Totals,
    first_ts: u64,
    name: &str,
    svg: &mut String,
    size: Size,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cols: Vec<Column> = timeline.columns().copied().collect();
    let end_ms = timeline.span_ns() as f64 / 1e6;
    let heap = step_points(&cols, |c| c.heap, end_ms);
    let mapped = step_points(&cols, |c| c.mapped, end_ms);
    let peak = totals.peak_live_bytes;
    let top = (peak.max(totals.mapped_bytes_peak) as f64 * 1.12).max(1.0);

    let root = SVGBackend::with_string(svg, (size.width, size.height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{name}: live heap over time"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..end_ms, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("time (ms from the first event)")
        .y_desc("bytes")
        .y_label_formatter(&|v| human::bytes(*v as u64))
        .draw()?;
    chart
        .draw_series(LineSeries::new(heap, BLUE.stroke_width(1)))?
        .label("live heap bytes")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(mapped, MAPPED.stroke_width(1)))?
        .label("mapped bytes (page-rounded)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MAPPED));

    // The peak: a dot where it was first reached and its exact value.
    let peak_ms = totals.peak_ts.saturating_sub(first_ts) as f64 / 1e6;
    let (anchor, dx) = if peak_ms > end_ms / 2.0 {
        (HPos::Right, -8)
    } else {
        (HPos::Left, 8)
    };
    let label = format!(
        "peak {} B ({}) at {:.3} ms",
        human::count(peak),
        human::bytes(peak),
        peak_ms
    );
    let style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(anchor, VPos::Bottom));
    chart.draw_series([EmptyElement::at((peak_ms, peak as f64))
        + Circle::new((0, 0), 4, BLUE.filled())
        + Text::new(label, (dx, -6), style)])?;

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
