//! `memtrack flamegraph FILE -o flame.svg [--metric …]`: the call sites as an interactive flame
//! graph (inferno: flamegraph.pl's SVG with its search, zoom and tooltips), one box per frame
//! weighted by the metric, coloured by whose code it is. `memtrack flamegraph --diff BASE HEAD`:
//! inferno's differential flame graph of how HEAD differs from BASE. `memtrack flamegraph FILE
//! --locks`: the lock waits' contended call sites, as wide as the time waited there.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use inferno::flamegraph::{self, Options, color::Color, color::PaletteMap};
use memtrack::{Completeness, Output, Reader, human};

use crate::callsites::{CallSite, CallSites, Class, Metric, NO_STACK, TRUNCATED, frame_name};
use crate::locks::LockClass;

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
    let ((), written) = write_svg(out, output, |svg| render(&cs, metric, svg))?;
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
    let subtitle = format!(
        "{} call sites; colours: the program (orange), Rust std (tan), libc and ld.so (blue), \
         other libraries (green)",
        human::count(cs.call_sites.len() as u64)
    );
    let title = format!("{}: {}", cs.name, metric.label());
    let empty = format!("no call site has any {}", metric.label());
    let lines = cs.folded(metric);
    draw(
        &title,
        &subtitle,
        metric.unit(),
        &lines,
        palette,
        &empty,
        svg,
    )
}

/// A flame graph of folded stacks `lines` (`root;…;leaf weight`, sorted) as SVG, titled
/// `title` over `subtitle`, weights in `unit`, frames coloured by `palette` (inferno's `hot`
/// for the frames it does not name). No lines give an image, titled as any other, that says
/// `empty` (inferno refuses an input without stacks).
fn draw(
    title: &str,
    subtitle: &str,
    unit: &str,
    lines: &[String],
    mut palette: PaletteMap,
    empty: &str,
    svg: &mut Vec<u8>,
) -> std::io::Result<()> {
    if lines.is_empty() {
        return empty_svg(title, empty, svg);
    }
    let mut opt = Options::default();
    opt.title = title.to_string();
    opt.subtitle = Some(subtitle.to_string());
    opt.count_name = unit.to_string();
    opt.palette_map = Some(&mut palette);
    flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), svg)
}

/// Reads the lock waits of `file` and writes the flame graph of its contended call sites of
/// `classes` to `output`: each site's stack above the lock call, root first, a frame naming
/// the lock's class on top, as wide as the time waited there (µs); the frames coloured by
/// whose code they are, as the call sites' flame graph does, the class frames red. Refused
/// as `memtrack locks` refuses a recording (without context switches, with lost events).
pub fn run_locks(file: &Path, output: &Path, classes: &[LockClass]) -> memtrack::Result<ExitCode> {
    let (waits, name) = crate::locks::read_with_name(file)?;
    let out = Output::create(output)?;
    let lines = crate::locks::folded(&waits, classes);
    let mut palette = PaletteMap::default();
    for s in &waits.sites {
        for f in &s.frames {
            palette.insert(f.replace(';', ","), colour(function_class(f)));
        }
        palette.insert(
            crate::locks::class_frame(s.class),
            Color {
                r: 220,
                g: 50,
                b: 50,
            },
        );
    }
    let names: Vec<&str> = classes.iter().map(|c| c.class().name()).collect();
    let title = format!("{name}: lock waits ({})", names.join(", "));
    let total = crate::locks::total_ns(&waits, classes);
    let subtitle = format!(
        "{} µs waited at {} over a {} ms window; each stack is the code that wanted the lock, \
         its class on top",
        human::count((total + 500) / 1_000),
        human::plural(
            lines.len() as u64,
            "contended call site",
            "contended call sites"
        ),
        human::count(waits.window_ns / 1_000_000)
    );
    let empty = "no thread waited for a lock of these classes";
    let ((), written) = write_svg(out, output, |svg| {
        draw(&title, &subtitle, "µs", &lines, palette, empty, svg)
    })?;
    eprintln!(
        "memtrack: wrote {} ({} contended call sites)",
        written.display(),
        human::count(lines.len() as u64)
    );
    Ok(ExitCode::SUCCESS)
}

/// Whose code a frame is, by its function's name only (lock waits' frames are names).
fn function_class(f: &str) -> Class {
    let f = f.trim_start_matches('<');
    if ["std::", "core::", "alloc::", "__rust"]
        .iter()
        .any(|p| f.starts_with(p))
    {
        Class::Std
    } else if [
        "start_thread",
        "clone3",
        "__clone",
        "__libc_start",
        "_start",
    ]
    .iter()
    .any(|p| f.starts_with(p))
    {
        Class::Libc
    } else {
        Class::User
    }
}

/// An SVG titled `title` that says `why` it has no frames.
fn empty_svg(title: &str, why: &str, svg: &mut Vec<u8>) -> std::io::Result<()> {
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
         text-anchor=\"middle\">{}</text><text x=\"600\" y=\"48\" \
         text-anchor=\"middle\">{}</text></svg>\n",
        esc(title),
        esc(why)
    )
}

/// Reads `base` and `head` (their events on two threads) and writes the differential flame graph of how
/// `head` differs from `base` to `output`. Refuses, before writing anything, an input that
/// cannot stand for its program: incomplete, with lost events or processes not covered, or
/// without call stacks.
pub fn run_diff(
    base: &Path,
    head: &Path,
    output: &Path,
    metric: Metric,
) -> memtrack::Result<ExitCode> {
    // Both refused or read before the output is created: a refusal leaves nothing behind.
    let (rb, rh) = (open_whole(base)?, open_whole(head)?);
    let (sb, sh) = std::thread::scope(|s| {
        let sb = s.spawn(|| CallSites::analyse(&rb, base, "reading BASE's call sites"));
        let sh = CallSites::analyse(&rh, head, "reading HEAD's call sites");
        (
            sb.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            sh,
        )
    });
    let b = CallSites::symbolized(&rb, base, sb?)?;
    let h = CallSites::symbolized(&rh, head, sh?)?;
    let out = Output::create(output)?;
    let (changed, written) = write_svg(out, output, |svg| render_diff(&b, &h, metric, svg))?;
    eprintln!(
        "memtrack: wrote {} ({} of {} stacks changed, by {})",
        written.display(),
        human::count(changed.0 as u64),
        human::count(changed.1 as u64),
        metric.label()
    );
    Ok(ExitCode::SUCCESS)
}

/// `file` opened, if the recording is whole: the same refusals as `memtrack compare`'s (a
/// partial picture would show missing allocations as shrinking). A recording without stacks
/// is refused by [`CallSites::analyse`].
fn open_whole(file: &Path) -> memtrack::Result<Reader> {
    let refuse = |why: String| {
        memtrack::Error::InvalidOption(format!("{}: {why}, so it cannot be diffed", file.display()))
    };
    let reader = Reader::open(file)?;
    if let Completeness::Recovered { reason } = reader.completeness() {
        return Err(refuse(format!("the artifact is incomplete ({reason})")));
    }
    let fin = reader
        .final_metadata()
        .ok_or_else(|| refuse("the artifact has no trailer".into()))?;
    if fin.lost_events > 0 {
        return Err(refuse(format!(
            "{} events were lost while recording (the ring buffer overflowed); record it again \
             with a larger --ringbuf-mib",
            human::count(fin.lost_events)
        )));
    }
    if let Some(why) = super::processes::not_whole(fin) {
        return Err(refuse(format!(
            "{why}; record it again following every process (without --no-follow)"
        )));
    }
    Ok(reader)
}

/// Draws an SVG with `draw` and writes it to `out` (the file `output` names), finished only
/// when whole: what `draw` answered, and the path written.
fn write_svg<T>(
    out: Output,
    output: &Path,
    draw: impl FnOnce(&mut Vec<u8>) -> std::io::Result<T>,
) -> memtrack::Result<(T, PathBuf)> {
    let mut svg = Vec::new();
    let answer = draw(&mut svg).map_err(|e| memtrack::Error::Io {
        what: format!("drawing {}", output.display()),
        source: e,
    })?;
    out.writer()?
        .write_all(&svg)
        .map_err(|e| memtrack::Error::Io {
            what: format!("writing {}", out.path().display()),
            source: e,
        })?;
    Ok((answer, out.commit()?))
}

/// The frames' names of `cs`'s sites in a differential flame graph, root first: a named frame
/// is its function and its source file's base name (`chain_inner (chain.c)`), or the function
/// and the whole path where two files of one base name hold functions of one name; a frame
/// that could not be named keeps its fallback (`module+0xOFFSET`), which matches only the same
/// offset. Function and file, never line or address: code that moved between the builds still
/// matches.
struct DiffNames {
    /// (function, file) → its frame's name.
    names: HashMap<(String, Option<String>), String>,
}

impl DiffNames {
    fn new<'a>(sides: impl IntoIterator<Item = &'a CallSites>) -> DiffNames {
        let mut files: HashMap<(String, Option<String>), Vec<String>> = HashMap::new();
        for cs in sides {
            for c in &cs.call_sites {
                for l in &c.locations {
                    for f in &l.frames {
                        if let Some(func) = &f.function {
                            let base = f.file.as_deref().map(basename);
                            let paths = files
                                .entry((func.clone(), base.map(str::to_string)))
                                .or_default();
                            if let Some(file) = &f.file
                                && !paths.contains(file)
                            {
                                paths.push(file.clone());
                            }
                        }
                    }
                }
            }
        }
        let mut names = HashMap::new();
        for ((func, base), paths) in files {
            match base {
                None => {
                    names.insert((func.clone(), None), func);
                }
                Some(base) => {
                    let ambiguous = paths.len() > 1;
                    for p in paths {
                        let name = match ambiguous {
                            true => format!("{func} ({p})"),
                            false => format!("{func} ({base})"),
                        };
                        names.insert((func.clone(), Some(p)), name);
                    }
                }
            }
        }
        DiffNames { names }
    }

    /// `c`'s folded path, root first, `;` separated.
    fn path(&self, c: &CallSite) -> String {
        if c.locations.is_empty() {
            return NO_STACK.to_string();
        }
        let mut parts: Vec<String> = Vec::new();
        if c.truncated {
            parts.push(TRUNCATED.to_string());
        }
        for l in c.locations.iter().rev() {
            for f in l.frames.iter().rev() {
                let name = match &f.function {
                    Some(func) => self
                        .names
                        .get(&(func.clone(), f.file.clone()))
                        .cloned()
                        .unwrap_or_else(|| func.clone()),
                    None => frame_name(f),
                };
                parts.push(name.replace(';', ",").replace('\n', " "));
            }
        }
        parts.join(";")
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The differential flame graph of `head` against `base` by `metric`, as SVG: inferno's
/// differential mode (flamegraph.pl's `stack base head` lines), frames as wide as HEAD's
/// weight, the frame where a stack allocates red if it grew, blue if it shrank, white if
/// unchanged (a stack only BASE has weighs nothing in HEAD: it is counted in the subtitle).
/// Returns how many stacks changed, of how many.
pub fn render_diff(
    base: &CallSites,
    head: &CallSites,
    metric: Metric,
    svg: &mut Vec<u8>,
) -> std::io::Result<(usize, usize)> {
    let names = DiffNames::new([base, head]);
    let mut merged: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (side, cs) in [base, head].into_iter().enumerate() {
        for c in &cs.call_sites {
            let w = metric.weight(&c.site);
            if w == 0 {
                continue;
            }
            let e = merged.entry(names.path(c)).or_default();
            match side {
                0 => e.0 += w,
                _ => e.1 += w,
            }
        }
    }
    let changed = merged.values().filter(|(b, h)| b != h).count();
    let vanished = merged.values().filter(|(_, h)| *h == 0).count();
    let (total_b, total_h) = merged
        .values()
        .fold((0u64, 0u64), |(tb, th), (b, h)| (tb + b, th + h));
    let title = format!(
        "{} → {}: {} (differential)",
        base.name,
        head.name,
        metric.label()
    );
    if total_h == 0 {
        empty_svg(
            &title,
            &format!("no call site has any {}", metric.label()),
            svg,
        )?;
        return Ok((changed, merged.len()));
    }
    let lines: Vec<String> = merged
        .iter()
        .map(|(path, (b, h))| format!("{path} {b} {h}"))
        .collect();
    let mut opt = Options::default();
    opt.title = title;
    opt.subtitle = Some(format!(
        "{} {} → {} {}; red: the stack allocates more, blue: less, white: the same; widths \
         are the head's; {} of {} stacks changed, {} only in the base (not drawn)",
        human::count(total_b),
        metric.unit(),
        human::count(total_h),
        metric.unit(),
        human::count(changed as u64),
        human::count(merged.len() as u64),
        human::count(vanished as u64)
    ));
    opt.count_name = metric.unit().to_string();
    flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), svg)?;
    Ok((changed, merged.len()))
}
