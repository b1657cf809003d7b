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
use memtrack::{
    analysis::SiteOrder, artifact::Output, artifact::Reader, human, symbolize::KeyFrame,
    symbolize::KeyedSites, symbolize::SiteComparison, symbolize::SiteKey,
};

use crate::callsites::{CallSites, Class, NO_STACK, TRUNCATED, Weight, site_order};
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

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The artifact.
    #[arg(required_unless_present = "diff", conflicts_with = "diff")]
    file: Option<PathBuf>,
    /// Draw how HEAD differs from BASE instead: two artifacts with call stacks.
    #[arg(long, num_args = 2, value_names = ["BASE", "HEAD"])]
    pub(crate) diff: Option<Vec<PathBuf>>,
    /// Output SVG file.
    #[arg(short, long, default_value = "flame.svg")]
    output: PathBuf,
    /// What a site weighs: bytes allocated, allocations, bytes live at the peak, or
    /// bytes still live at the end.
    #[arg(long, value_parser = site_order(), default_value = "bytes")]
    metric: SiteOrder,
    /// Draw the lock waits (a recording made with `record --locks`) instead of the
    /// allocations: each contended call site's stack above the lock call, its lock's
    /// class on top, weighted by the microseconds waited there.
    #[arg(long, conflicts_with_all = ["diff", "metric"])]
    locks: bool,
    /// With `--locks`: the classes of lock waits drawn (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',', requires = "locks")]
    class: Vec<LockClass>,
    /// Hide the allocator's own frames at the top of each stack (the default).
    #[arg(long, overrides_with = "no_trim_allocator", conflicts_with_all = ["diff", "locks"],
          long_help = crate::callsites::TRIM_HELP)]
    trim_allocator: bool,
    /// Keep every frame, the allocator's own included.
    #[arg(long, overrides_with = "trim_allocator", conflicts_with_all = ["diff", "locks"])]
    no_trim_allocator: bool,
}

/// Draws what `args` asks for: the call sites, the lock waits or a differential flame graph.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    match (args.diff.as_deref(), args.file) {
        (Some([base, head]), _) => run_diff(base, head, &args.output, args.metric),
        (_, Some(file)) if args.locks => {
            run_locks(&file, &args.output, crate::lock_classes(&args.class))
        }
        (_, Some(file)) => run_sites(&file, &args.output, args.metric, !args.no_trim_allocator),
        _ => unreachable!("clap requires FILE or --diff BASE HEAD"),
    }
}

/// Reads `file` and writes its flame graph to `output`, with `trim` without the allocator's
/// own frames.
fn run_sites(
    file: &Path,
    output: &Path,
    metric: SiteOrder,
    trim: bool,
) -> crate::error::Result<ExitCode> {
    let reader = Reader::open(file)?;
    let out = Output::create(output)?;
    let cs = CallSites::read(&reader, file, "reading call sites")?;
    let ((), written) = write_svg(out, output, |svg| render(&cs, metric, trim, svg))?;
    eprintln!(
        "memtrack: wrote {} ({} call sites, by {})",
        written.display(),
        human::count(cs.call_sites.len() as u64),
        metric.label()
    );
    Ok(ExitCode::SUCCESS)
}

/// The flame graph of `cs` by `metric`, as SVG; with `trim`, each stack without the
/// allocator's own frames ([`crate::callsites::allocator_frames`]). A recording whose sites
/// all weigh 0 by the metric (nothing leaked) gives an image, titled as any other, that says
/// so.
pub fn render(
    cs: &CallSites,
    metric: SiteOrder,
    trim: bool,
    svg: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut palette = PaletteMap::default();
    for c in &cs.call_sites {
        for (name, class) in c.names(trim) {
            palette.insert(name.replace(';', ","), colour(class));
        }
    }
    let trimmed = trim && cs.call_sites.iter().any(|c| c.allocator_frames() > 0);
    let subtitle = format!(
        "{} call sites{}; colours: the program (orange), Rust std (tan), libc and ld.so \
         (blue), other libraries (green)",
        human::count(cs.call_sites.len() as u64),
        if trimmed {
            ", allocator frames hidden (--no-trim-allocator)"
        } else {
            ""
        }
    );
    let title = format!("{}: {}", cs.name, metric.label());
    let empty = format!("no call site has any {}", metric.label());
    let lines = cs.folded(metric, trim);
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
fn run_locks(file: &Path, output: &Path, classes: &[LockClass]) -> crate::error::Result<ExitCode> {
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
fn run_diff(
    base: &Path,
    head: &Path,
    output: &Path,
    metric: SiteOrder,
) -> crate::error::Result<ExitCode> {
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
    let (sb, sh) = (sb?, sh?);
    // The one matching rule of attribution (`memtrack compare`) and of this picture.
    let keyed = SiteComparison::new(&mut super::symbolizer(&[&rb, &rh]), &rb, &sb, &rh, &sh)?;
    let b = DiffSide::new(&rb, base, &keyed.base)?;
    let h = DiffSide::new(&rh, head, &keyed.head)?;
    let out = Output::create(output)?;
    let (changed, written) =
        write_svg(out, output, |svg| render_diff(&keyed, &b, &h, metric, svg))?;
    eprintln!(
        "memtrack: wrote {} ({} of {} stacks changed, by {})",
        written.display(),
        human::count(changed.0 as u64),
        human::count(changed.1 as u64),
        metric.label()
    );
    Ok(ExitCode::SUCCESS)
}

/// `file` opened, if the recording is whole ([`whole::check`](super::whole::check), as
/// `memtrack compare` requires). A recording without stacks is refused by
/// [`CallSites::analyse`].
fn open_whole(file: &Path) -> crate::error::Result<Reader> {
    let reader = Reader::open(file)?;
    super::whole::require(&reader, file, "diffed")?;
    Ok(reader)
}

/// Draws an SVG with `draw` and writes it to `out` (the file `output` names), finished only
/// when whole: what `draw` answered, and the path written.
fn write_svg<T>(
    out: Output,
    output: &Path,
    draw: impl FnOnce(&mut Vec<u8>) -> std::io::Result<T>,
) -> crate::error::Result<(T, PathBuf)> {
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

/// The frames' names of the keyed sites of a differential flame graph. Sites of the two
/// recordings match as [`memtrack::symbolize::site_keys`] matches them (compare's attribution too): by
/// [`KeyFrame`], a named frame by its function and source file, never line or address (code
/// that moved between the builds still matches); an unnamed frame by module, build id and
/// offset, and not at all without a build id. A frame is named as its key displays
/// (`chain_inner (chain.c)`, `libx.so+0x1234`), in a longer form where two different keys
/// would display alike (the whole source path, the build id), and an unmatched frame with the
/// recording it is of (`libx.so+0x1234 (unmatched) in the head`): inferno merges frames by
/// name, and must never merge two keys.
struct DiffNames {
    names: HashMap<KeyFrame, String>,
}

impl DiffNames {
    fn new(keyed: &SiteComparison) -> DiffNames {
        let mut shown: HashMap<String, Vec<&KeyFrame>> = HashMap::new();
        for (key, _) in keyed.base.sites.iter().chain(&keyed.head.sites) {
            for f in &key.0 {
                let same = shown.entry(f.to_string()).or_default();
                if !same.contains(&f) {
                    same.push(f);
                }
            }
        }
        let mut names = HashMap::new();
        for (short, frames) in shown {
            let ambiguous = frames.len() > 1;
            for f in frames {
                let name = match f {
                    // Never the same frame as another recording's: say whose it is.
                    KeyFrame::Unmatched { recording: 0, .. } => format!("{short} in the base"),
                    KeyFrame::Unmatched { .. } => format!("{short} in the head"),
                    _ if !ambiguous => short.clone(),
                    KeyFrame::Function {
                        function,
                        file: Some(file),
                    } => format!("{function} ({file})"),
                    KeyFrame::Offset {
                        module,
                        build_id,
                        offset,
                    } => format!("{module}+{offset:#x} (build id {build_id})"),
                    _ => short.clone(),
                };
                names.insert(f.clone(), name.replace(';', ",").replace('\n', " "));
            }
        }
        DiffNames { names }
    }

    /// A site's folded path, root first, `;` separated; `truncated` roots it at
    /// [`TRUNCATED`].
    fn path(&self, key: &SiteKey, truncated: bool) -> String {
        if key.0.is_empty() {
            return NO_STACK.to_string();
        }
        let cut = truncated.then_some(TRUNCATED);
        cut.into_iter()
            .chain(key.0.iter().rev().map(|f| self.names[f].as_str()))
            .collect::<Vec<_>>()
            .join(";")
    }
}

/// One side of a differential flame graph: its name and its sites, keyed, each with whether
/// its stack was cut at the depth cap.
pub struct DiffSide<'a> {
    /// The benchmark's name.
    pub name: String,
    /// The keyed sites ([`SiteComparison`]'s side).
    pub sites: &'a KeyedSites,
    /// Per site of `sites`, whether its stack was cut at the depth cap.
    pub truncated: Vec<bool>,
}

impl<'a> DiffSide<'a> {
    fn new(reader: &Reader, file: &Path, sites: &'a KeyedSites) -> crate::error::Result<Self> {
        let truncated = sites
            .sites
            .iter()
            .map(|(_, s)| Ok(!s.stack.is_none() && reader.stack(s.stack)?.truncated))
            .collect::<memtrack::Result<_>>()?;
        let name = reader.metadata().name.clone().unwrap_or_else(|| {
            file.file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        });
        Ok(DiffSide {
            name,
            sites,
            truncated,
        })
    }
}

/// The differential flame graph of `head` against `base` by `metric`, as SVG: inferno's
/// differential mode (flamegraph.pl's `stack base head` lines), frames as wide as HEAD's
/// weight, the frame where a stack allocates red if it grew, blue if it shrank, white if
/// unchanged (a stack only BASE has weighs nothing in HEAD: it is counted in the subtitle).
/// Returns how many stacks changed, of how many.
pub fn render_diff(
    keyed: &SiteComparison,
    base: &DiffSide<'_>,
    head: &DiffSide<'_>,
    metric: SiteOrder,
    svg: &mut Vec<u8>,
) -> std::io::Result<(usize, usize)> {
    let names = DiffNames::new(keyed);
    let mut merged: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (side, d) in [base, head].into_iter().enumerate() {
        for ((key, site), truncated) in d.sites.sites.iter().zip(&d.truncated) {
            let w = metric.weight(site);
            if w == 0 {
                continue;
            }
            let e = merged.entry(names.path(key, *truncated)).or_default();
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
        // Nothing to draw at the head's widths; what the base had is still said.
        let why = match vanished {
            0 => format!("no call site has any {}", metric.label()),
            n => format!(
                "the head has no {}; the base had {} {} at {}, only in the base (not drawn)",
                metric.label(),
                human::count(total_b),
                metric.unit(),
                human::plural(n as u64, "stack", "stacks")
            ),
        };
        empty_svg(&title, &why, svg)?;
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
