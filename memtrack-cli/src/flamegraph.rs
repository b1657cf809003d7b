//! `memtrack flamegraph FILE -o flame.svg [--metric …]`: the call sites as an interactive flame
//! graph (inferno: flamegraph.pl's SVG with its search, zoom and tooltips), one box per frame
//! weighted by the metric, coloured by whose code it is.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use inferno::flamegraph::{self, Options, color::Color, color::PaletteMap};
use memtrack::{Output, Reader, human};

use crate::callsites::{CallSites, Class, Metric};

/// The colour of each class's frames: warm for the program's own code (where to look first),
/// tan for Rust's std, blue for libc and the loader, green for other libraries.
fn colour(c: Class) -> Color {
    let (r, g, b) = match c {
        Class::User => (235, 110, 60),
        Class::Std => (215, 185, 110),
        Class::Libc => (110, 160, 230),
        Class::Other => (120, 190, 120),
    };
    Color { r, g, b }
}

/// Reads `file` and writes its flame graph to `output`.
pub fn run(file: &Path, output: &Path, metric: Metric) -> memtrack::Result<ExitCode> {
    let reader = Reader::open(file)?;
    let out = Output::create(output)?;
    let cs = CallSites::read(&reader, file, "reading call sites")?;
    let mut svg = Vec::new();
    render(&cs, metric, &mut svg).map_err(|e| memtrack::Error::Io {
        what: format!("drawing {}", output.display()),
        source: e,
    })?;
    out.writer()?
        .write_all(&svg)
        .map_err(|e| memtrack::Error::Io {
            what: format!("writing {}", out.path().display()),
            source: e,
        })?;
    let written = out.commit()?;
    eprintln!(
        "memtrack: wrote {} ({} call sites, by {})",
        written.display(),
        human::count(cs.call_sites.len() as u64),
        metric.label()
    );
    Ok(ExitCode::SUCCESS)
}

/// The flame graph of `cs` by `metric`, as SVG. A recording whose sites all weigh 0 by the
/// metric (nothing leaked) gives an image, titled as any other, that says so.
pub fn render(cs: &CallSites, metric: Metric, svg: &mut Vec<u8>) -> std::io::Result<()> {
    let mut palette = PaletteMap::default();
    for c in &cs.call_sites {
        for (name, class) in c.names() {
            palette.insert(name.replace(';', ","), colour(class));
        }
    }
    let lines = cs.folded(metric);
    let mut opt = Options::default();
    opt.title = format!("{}: {}", cs.name, metric.label());
    opt.subtitle = Some(format!(
        "{} call sites; colours: the program (orange), Rust std (tan), libc and ld.so (blue), \
         other libraries (green)",
        human::count(cs.call_sites.len() as u64)
    ));
    opt.count_name = metric.unit().to_string();
    opt.palette_map = Some(&mut palette);
    if lines.is_empty() {
        // inferno refuses an input without stacks: an image that says so.
        return empty_svg(cs, metric, svg);
    }
    flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), svg)
}

/// An SVG that says no site weighs anything by the metric.
fn empty_svg(cs: &CallSites, metric: Metric, svg: &mut Vec<u8>) -> std::io::Result<()> {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    svg.clear();
    write!(
        svg,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" \
         height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"24\" \
         text-anchor=\"middle\">{}: {}</text><text x=\"600\" y=\"48\" \
         text-anchor=\"middle\">no call site has any {}</text></svg>\n",
        esc(&cs.name),
        esc(metric.label()),
        esc(metric.label())
    )
}
