//! `memtrack show FILE`: what an artifact holds, as one [`ShowReport`] built from it and two
//! renderers of that report, [`text`] for people and [`json`] for scripts (its field names are
//! the JSON keys the guide lists: docs/src/reference/json.md).
//!
//! A new section (per process, say) is a field of the report, `Option` and skipped in JSON when
//! absent if it is optional, plus its lines in [`text`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::render::{self, Align, Cell, Column, Table};
use memtrack::{
    analysis::Analyzer, analysis::Site, analysis::SiteAnalyzer, analysis::SiteOrder,
    analysis::SizeClass, analysis::SizeHistogram, artifact::Backend, artifact::Metadata,
    artifact::Reader, event::KindTag, human, stack::Stack, symbolize::ModuleStatus,
    symbolize::SymFrame, totals::KindCounts, totals::Totals,
};
use serde::Serialize;

use crate::callsites::{allocator_frames, classify};
use crate::{processes, progress, tables};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The artifact.
    file: PathBuf,
    /// Machine-readable JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Add the per-thread table (`per_thread` in JSON). Frees count in the freeing thread.
    #[arg(long)]
    threads: bool,
    /// Add the N top call sites, DHAT-style, each with its stack (`top_sites` in JSON):
    /// allocations and bytes, blocks live at the heap's peak and at the end.
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// What `--top` ranks sites by: bytes allocated, allocations, bytes live at the peak,
    /// or bytes still live at the end (leaked).
    #[arg(long, value_parser = crate::callsites::site_order(), default_value = "bytes", requires = "top")]
    by: SiteOrder,
    /// With `--top`: hide the allocator's own frames at the top of each stack (the default).
    #[arg(long, overrides_with = "no_trim_allocator", requires = "top",
          long_help = crate::callsites::TRIM_HELP)]
    trim_allocator: bool,
    /// With `--top`: keep every frame, the allocator's own included.
    #[arg(long, overrides_with = "trim_allocator", requires = "top")]
    no_trim_allocator: bool,
}

/// Prints `args.file`'s metadata and totals, as a table or JSON.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    let path = &args.file;
    let top = args.top.map(|n| Top {
        n,
        order: args.by,
        trim: !args.no_trim_allocator,
    });
    let reader = Reader::open(path)?;
    let recovered = crate::warn_if_recovered(&reader);
    let report = ShowReport::read(&reader, path, !recovered, args.threads, top)?;
    crate::out(&if args.json {
        json(&report)
    } else {
        text(&report)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Everything `show` prints about one artifact. Serialized as is by `show --json`.
#[derive(Debug, Serialize)]
pub struct ShowReport {
    /// The artifact, as given on the command line (a name that is not UTF-8 is written
    /// lossily, with U+FFFD).
    #[serde(serialize_with = "lossy_path")]
    pub file: PathBuf,
    /// The artifact's format version, `major.minor`.
    pub format_version: String,
    /// Whether the file was finished (else its frames were recovered without a trailer).
    pub complete: bool,
    /// The metadata the recorder wrote at the start.
    pub metadata: Metadata,
    /// Frames in the file.
    pub frames: usize,
    /// Size of the file in bytes.
    pub file_bytes: u64,
    /// Events the recorder lost; `None` when the file has no trailer to say.
    pub lost_events: Option<u64>,
    /// Heap allocations whose call stack stops early (see `Final::short_stacks`); absent when
    /// there are none or the file has no trailer to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_stacks: Option<u64>,
    /// Of `short_stacks`, those whose call site is in the C library (see
    /// `Final::short_stacks_in_libc`); absent when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_stacks_in_libc: Option<u64>,
    /// Events decoded.
    pub events: u64,
    /// Events by kind.
    pub kinds: KindCounts,
    /// See [`Totals::allocations`].
    pub allocations: u64,
    /// See [`Totals::frees`].
    pub frees: u64,
    /// See [`Totals::unmatched_frees`].
    pub unmatched_frees: u64,
    /// See [`Totals::allocator_internal_frees`].
    pub allocator_internal_frees: u64,
    /// See [`Totals::bytes_allocated`].
    pub bytes_allocated: u64,
    /// See [`Totals::bytes_freed`].
    pub bytes_freed: u64,
    /// See [`Totals::peak_live_bytes`].
    pub peak_live_bytes: u64,
    /// See [`Totals::peak_live_blocks`].
    pub peak_live_blocks: u64,
    /// See [`Totals::live_bytes_at_end`].
    pub live_bytes_at_end: u64,
    /// See [`Totals::live_blocks_at_end`].
    pub live_blocks_at_end: u64,
    /// See [`Totals::blocks_discarded_at_exec`].
    pub blocks_discarded_at_exec: u64,
    /// See [`Totals::bytes_discarded_at_exec`].
    pub bytes_discarded_at_exec: u64,
    /// See [`Totals::mapped_bytes_peak`].
    pub mapped_bytes_peak: u64,
    /// See [`Totals::mapped_bytes_at_end`].
    pub mapped_bytes_at_end: u64,
    /// See [`Totals::threads`].
    pub threads: u64,
    /// Nanoseconds from the first event to the last.
    pub duration_ns: u64,
    /// The non-empty size classes of the allocations.
    pub size_classes: Vec<SizeClass>,
    /// Iterations of the measured routine, when the writer counted them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// Allocations and bytes divided by `iterations`, when there are iterations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_iteration: Option<PerIteration>,
    /// Each marked iteration's figures, their spread (a session that accumulated calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_spread: Option<memtrack::totals::IterationSpread>,
    /// One row per thread, when asked for (`--threads`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_thread: Option<Vec<ThreadRow>>,
    /// Processes the recording did not cover (followed but not covered, or started and not
    /// followed); `None` when the file has no trailer to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncovered_processes: Option<u64>,
    /// Every followed process with its own totals (`record` of a process tree); absent for
    /// in-process sessions and `--no-follow` recordings of one process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<serde_json::Value>,
    /// The top call sites, when asked for (`--top N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_sites: Option<TopSites>,
    /// The text table of the processes (see [`processes::table`]); not in the JSON.
    #[serde(skip)]
    pub process_table: String,
    /// How many processes were followed, for the table's heading.
    #[serde(skip)]
    pub followed: usize,
}

/// The top call sites of a recording (`show --top N --by …`): DHAT's numbers per allocating
/// stack, with the stack.
#[derive(Debug, Serialize)]
pub struct TopSites {
    /// What the rows are ranked by: `bytes`, `allocations`, `peak` or `leaked`.
    pub by: &'static str,
    /// Call sites in the recording (distinct allocating stacks, the no-stack site included).
    pub sites: usize,
    /// Whether the recording has call stacks.
    pub stacks: bool,
    /// Why there are no stacks and how to record them, when there are none (then `rows` is
    /// empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The recording's peak live heap bytes, the whole of which `bytes_at_peak` are shares.
    pub peak_live_bytes: u64,
    /// The sites, ranked.
    pub rows: Vec<SiteRow>,
    /// The modules of the shown stacks whose frames could not be named, and why (missing,
    /// rebuilt since the recording, not ELF): their frames print as `module+0xOFFSET`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsymbolized: Vec<Unsymbolized>,
}

/// A module whose frames could not be symbolized.
#[derive(Debug, Serialize)]
pub struct Unsymbolized {
    /// Its path, as recorded.
    pub module: String,
    /// Why, and what to do.
    pub reason: String,
}

/// One call site: its numbers (the fields of [`Site`]) and its stack.
#[derive(Debug, Serialize)]
pub struct SiteRow {
    /// The numbers.
    #[serde(flatten)]
    pub site: Site,
    /// The stack was cut at the recorder's depth cap.
    pub truncated: bool,
    /// The stack, innermost first (empty for the no-stack site, `stack` 0), without the
    /// allocator's own innermost frames unless `--no-trim-allocator`.
    pub frames: Vec<FrameRow>,
    /// How many of the allocator's own innermost frames `frames` leaves out; absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub allocator_frames_trimmed: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One frame of a site's stack, symbolized: a recorded return address gives one row per
/// function inlined there (`inlined`, innermost first) and one for the function it is in.
#[derive(Debug, Serialize)]
pub struct FrameRow {
    /// The module's path; `None` for an address outside any file (its `offset` is then the
    /// address).
    pub module: Option<String>,
    /// The recorded offset in the module's file (the return address's).
    pub offset: u64,
    /// The function (demangled); `None` when the address could not be named.
    pub function: Option<String>,
    /// The source file of `line`.
    pub file: Option<String>,
    /// The line: of the call, for a return address.
    pub line: Option<u32>,
    /// This function was inlined into the next row's (no call happened).
    pub inlined: bool,
    /// The frame as printed: `function (file:line)`, ` [inlined]` after an inlined one, or
    /// `module_basename+0xoffset` when it could not be named.
    pub location: String,
}

/// What `--top` asks for: the `n` top sites by `order`, with `trim` without the allocator's
/// own frames.
#[derive(Clone, Copy, Debug)]
pub struct Top {
    /// How many sites.
    pub n: usize,
    /// Ranked by.
    pub order: SiteOrder,
    /// Without the allocator's own innermost frames ([`crate::callsites::allocator_frames`]).
    pub trim: bool,
}

/// `--by`'s names.
pub fn order_name(order: SiteOrder) -> &'static str {
    match order {
        SiteOrder::Allocations => "allocations",
        SiteOrder::Peak => "peak",
        SiteOrder::Leaked => "leaked",
        _ => "bytes",
    }
}

/// The top sites `want` asks for, with their stacks from `reader`'s tables.
fn top_sites(reader: &Reader, a: &SiteAnalyzer, want: Top) -> crate::error::Result<TopSites> {
    let sites = a.sites();
    let mut top = TopSites {
        by: order_name(want.order),
        sites: sites.sites.len(),
        stacks: sites.has_stacks(),
        note: None,
        peak_live_bytes: sites.peak_live_bytes,
        rows: Vec::new(),
        unsymbolized: Vec::new(),
    };
    if !top.stacks {
        top.note = Some(no_stacks_note(reader));
        return Ok(top);
    }
    let table = reader.stacks()?;
    let ranked = sites.top(want.order, want.n);
    let none = Stack::default();
    let stacks: Vec<&Stack> = ranked
        .iter()
        .map(|site| match site.stack.is_none() {
            true => Ok(&none),
            false => reader.stack(site.stack),
        })
        .collect::<Result<_, _>>()?;
    // One symbolizer for all the rows: each module is read once, each distinct frame looked
    // up once.
    let mut sym = super::symbolizer(&[reader]);
    let named = sym.symbolize_stacks(&stacks, |id| table.module(id));
    for ((site, stack), frames) in ranked.iter().zip(&stacks).zip(named) {
        let paths: Vec<Option<&String>> = stack
            .frames
            .iter()
            .map(|recorded| table.module(recorded.module).map(|m| &m.path))
            .collect();
        let trimmed =
            match want.trim {
                true => allocator_frames(paths.iter().zip(&frames).map(|(path, syms)| {
                    (syms.as_slice(), classify(path.map(String::as_str), syms))
                })),
                false => 0,
            };
        let frames = paths
            .iter()
            .zip(frames)
            .flat_map(|(path, syms)| syms.into_iter().map(move |f| frame_row(path.cloned(), &f)))
            .skip(trimmed)
            .collect();
        top.rows.push(SiteRow {
            site: **site,
            truncated: stack.truncated,
            frames,
            allocator_frames_trimmed: trimmed,
        });
    }
    let mut shown: Vec<_> = stacks
        .iter()
        .flat_map(|st| st.frames.iter().map(|f| f.module))
        .collect();
    shown.sort();
    shown.dedup();
    for m in shown.into_iter().filter_map(|id| table.module(id)) {
        let status = sym.status(m);
        if *status != ModuleStatus::Usable {
            top.unsymbolized.push(Unsymbolized {
                module: m.path.clone(),
                reason: status.to_string(),
            });
        }
    }
    Ok(top)
}

fn frame_row(module: Option<String>, f: &SymFrame) -> FrameRow {
    FrameRow {
        module,
        offset: f.offset,
        function: f.function.clone(),
        file: f.file.clone(),
        line: f.line,
        inlined: f.inlined,
        location: f.to_string(),
    }
}

/// What `--top` says of a recording without stacks: why, and how to get them.
pub(crate) fn no_stacks_note(reader: &Reader) -> String {
    let why = match reader.metadata().backend {
        Backend::Alloc => {
            "the allocator recorder recorded none (a session with stack_depth(0))".to_string()
        }
        Backend::Synth => "it was made by `memtrack synth` without --stacks".to_string(),
        _ if reader.version() < (1, 5) => format!(
            "it is a format {}.{} file, written before memtrack recorded stacks",
            reader.version().0,
            reader.version().1
        ),
        _ => "its recorder defined none".to_string(),
    };
    format!(
        "no call stacks in this recording: {why}. Both recorders record them by default (a \
         session, `memtrack record -- CMD`), into format 1.5 or later; build the code with \
         frame pointers (RUSTFLAGS=\"-C force-frame-pointers=yes\") so that they are whole"
    )
}

/// The figures of a recording that counted its iterations, divided by them.
#[derive(Debug, Serialize)]
pub struct PerIteration {
    /// Allocations per iteration.
    pub allocations: f64,
    /// Bytes allocated per iteration.
    pub bytes_allocated: f64,
}

/// One thread's row; frees count in the freeing thread, so the rows add up to the totals.
#[derive(Debug, Serialize)]
pub struct ThreadRow {
    /// The thread id.
    pub tid: u32,
    /// Events of the thread.
    pub events: u64,
    /// Allocations the thread made.
    pub allocations: u64,
    /// Bytes the thread allocated.
    pub bytes_allocated: u64,
    /// Frees the thread made.
    pub frees: u64,
    /// Bytes the thread freed.
    pub bytes_freed: u64,
}

impl ShowReport {
    /// Decodes every frame of `reader` (read from `path`; `complete` says whether it was
    /// finished) with a progress bar on a terminal, and gathers the report; `threads` adds the
    /// per-thread rows, `top` the top call sites it asks for.
    pub fn read(
        reader: &Reader,
        path: &Path,
        complete: bool,
        threads: bool,
        top: Option<Top>,
    ) -> crate::error::Result<Self> {
        let pass = Scan::read(reader, top.is_some())?;
        let (a, sites, sizes) = (pass.analyzer(), &pass.sites, &pass.sizes);
        let t = a.totals();
        let iterations = reader.final_metadata().and_then(|f| f.iterations);
        let (major, minor) = reader.version();
        let fin = reader.final_metadata();
        let per_process = a.per_process();
        let top_sites = match (top, sites) {
            (Some(want), Some(s)) => Some(top_sites(reader, s, want)?),
            _ => None,
        };
        Ok(ShowReport {
            file: path.to_path_buf(),
            format_version: format!("{major}.{minor}"),
            complete,
            metadata: reader.metadata().clone(),
            frames: reader.frames().len(),
            file_bytes: reader.file_bytes(),
            lost_events: reader.final_metadata().map(|f| f.lost_events),
            short_stacks: fin.map(|f| f.short_stacks).filter(|&n| n > 0),
            short_stacks_in_libc: fin.map(|f| f.short_stacks_in_libc).filter(|&n| n > 0),
            events: t.events,
            kinds: t.kinds,
            allocations: t.allocations,
            frees: t.frees,
            unmatched_frees: t.unmatched_frees,
            allocator_internal_frees: t.allocator_internal_frees,
            bytes_allocated: t.bytes_allocated,
            bytes_freed: t.bytes_freed,
            peak_live_bytes: t.peak_live_bytes,
            peak_live_blocks: t.peak_live_blocks,
            live_bytes_at_end: t.live_bytes_at_end,
            live_blocks_at_end: t.live_blocks_at_end,
            blocks_discarded_at_exec: t.blocks_discarded_at_exec,
            bytes_discarded_at_exec: t.bytes_discarded_at_exec,
            mapped_bytes_peak: t.mapped_bytes_peak,
            mapped_bytes_at_end: t.mapped_bytes_at_end,
            threads: t.threads,
            duration_ns: t.last_ts.saturating_sub(t.first_ts),
            size_classes: sizes.classes(),
            iterations,
            per_iteration: iterations.map(|n| PerIteration {
                allocations: t.allocations as f64 / n.max(1) as f64,
                bytes_allocated: t.bytes_allocated as f64 / n.max(1) as f64,
            }),
            iteration_spread: t.iteration_spread,
            per_thread: threads.then(|| thread_rows(&t)),
            uncovered_processes: fin.map(|f| f.uncovered_processes()),
            processes: fin
                .filter(|f| !f.processes.is_empty())
                .map(|f| processes::json(&f.processes, &per_process)),
            process_table: fin.map_or_else(String::new, |f| {
                processes::table(&f.processes, f.unfollowed_processes, &per_process)
            }),
            followed: fin.map_or(0, |f| f.processes.len()),
            top_sites,
        })
    }
}

/// The one pass over the events: totals, sizes, and the sites when asked for.
struct Scan {
    /// The totals when sites are not counted.
    totals: Analyzer,
    sites: Option<SiteAnalyzer>,
    sizes: SizeHistogram,
}

impl Scan {
    /// Reads every frame with a progress bar on a terminal.
    fn read(reader: &Reader, with_sites: bool) -> crate::error::Result<Self> {
        // Sizes (and sites, when asked for) are counted beside the totals, in the same pass:
        // `Analyzer` stays lean for others.
        let (mut totals, mut sizes) = (Analyzer::new(), SizeHistogram::new());
        let bar = progress::events_bar(reader, "reading");
        let sites = if with_sites {
            // The site analysis feeds an `Analyzer` of its own: one analysis, not two.
            Some(SiteAnalyzer::read(reader, |evs| {
                sizes.update_all(evs);
                bar.inc(evs.len() as u64);
            })?)
        } else {
            reader.for_each_frame(|_, evs| {
                totals.update_all(evs);
                sizes.update_all(evs);
                bar.inc(evs.len() as u64);
                Ok(())
            })?;
            None
        };
        bar.finish_and_clear();
        Ok(Scan {
            totals,
            sites,
            sizes,
        })
    }

    /// The analyzer that saw the events: the site analysis's own when there is one.
    fn analyzer(&self) -> &Analyzer {
        self.sites
            .as_ref()
            .map_or(&self.totals, SiteAnalyzer::analyzer)
    }
}

fn thread_rows(t: &Totals) -> Vec<ThreadRow> {
    t.per_thread
        .iter()
        .map(|(&tid, th)| ThreadRow {
            tid,
            events: th.events,
            allocations: th.allocations,
            bytes_allocated: th.bytes_allocated,
            frees: th.frees,
            bytes_freed: th.bytes_freed,
        })
        .collect()
}

/// The report as pretty JSON with a final newline.
pub fn json(r: &ShowReport) -> String {
    // Through a `Value`, whose map keeps keys sorted: the order `show --json` has always had.
    let v = serde_json::to_value(r).expect("string keys and a lossy path always serialize");
    serde_json::to_string_pretty(&v).expect("a Value always serializes") + "\n"
}

fn lossy_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// The report for people: a header, one line per figure, the size-class table, and the
/// per-thread table when the report has its rows.
pub fn text(r: &ShowReport) -> String {
    let mut o = String::new();
    header_lines(&mut o, r);
    event_lines(&mut o, r);
    heap_lines(&mut o, r);
    kinds_line(&mut o, r);
    table_sections(&mut o, r);
    o
}

/// The file line and how the recording was made.
fn header_lines(o: &mut String, r: &ShowReport) {
    let _ = writeln!(
        o,
        "{}  (format {}, {}, {}{})",
        r.file.display(),
        r.format_version,
        human::bytes(r.file_bytes),
        human::plural(r.frames as u64, "frame", "frames"),
        if r.complete {
            ""
        } else {
            ", RECOVERED: incomplete"
        }
    );
    let meta = &r.metadata;
    let backend = serde_json::to_value(meta.backend).expect("a unit variant serializes");
    let _ = writeln!(
        o,
        "  recorded      {} by {}, pid {}{}{}",
        backend.as_str().unwrap_or("?"),
        meta.tool,
        meta.pid,
        meta.name
            .as_ref()
            .map(|n| format!(", name {n}"))
            .unwrap_or_default(),
        if meta.command.is_empty() {
            String::new()
        } else {
            format!(", command `{}`", meta.command.join(" "))
        }
    );
}

/// How many events, how whole their stacks are, and the per-iteration figures.
fn event_lines(o: &mut String, r: &ShowReport) {
    let _ = writeln!(
        o,
        "  events        {} over {:.3} ms, from {}, {}",
        human::count(r.events),
        r.duration_ns as f64 / 1e6,
        human::plural(r.threads, "thread", "threads"),
        r.lost_events
            .map_or("lost events unknown (no trailer)".to_string(), |n| {
                format!("{} lost", human::plural(n, "event", "events"))
            })
    );
    if let Some(n) = r.short_stacks {
        let in_libc = r.short_stacks_in_libc.unwrap_or(0);
        let line = human::short_stacks_note(n, in_libc, r.allocations).unwrap_or_else(|| {
            format!(
                "{} of {} allocations have call stacks that stop early{}",
                human::count(n),
                human::count(r.allocations),
                if in_libc > 0 {
                    format!(" ({} made by the C library)", human::count(in_libc))
                } else {
                    String::new()
                }
            )
        });
        let _ = writeln!(o, "  call stacks   {line}");
    }
    if let (Some(n), Some(p)) = (r.iterations, &r.per_iteration) {
        let _ = writeln!(
            o,
            "  per iteration {:.2} allocations, {} allocated (over {}; the totals below \
             cover them all)",
            p.allocations,
            human::bytes_f64(p.bytes_allocated),
            human::plural(n, "iteration", "iterations")
        );
    }
    if let Some(s) = &r.iteration_spread {
        let _ = writeln!(
            o,
            "  per call      {}, median (min–max): {}",
            human::plural(s.iterations, "call", "calls"),
            s.describe()
        );
    }
}

/// Allocations, frees and the live and mapped heap.
fn heap_lines(o: &mut String, r: &ShowReport) {
    let _ = writeln!(
        o,
        "  allocations   {} ({} allocated in total)",
        human::count(r.allocations),
        human::bytes(r.bytes_allocated)
    );
    let _ = writeln!(
        o,
        "  frees         {} ({}){}",
        human::count(r.frees),
        human::bytes(r.bytes_freed),
        if r.unmatched_frees > 0 {
            format!(
                ", {} of blocks no recorded call allocated (before recording, or inside the allocator)",
                human::count(r.unmatched_frees)
            )
        } else {
            String::new()
        }
    );
    if r.allocator_internal_frees > 0 {
        let _ = writeln!(
            o,
            "  not frees     {} by the allocator of blocks already freed (its own cache, e.g. \
             glibc's at thread exit)",
            human::count(r.allocator_internal_frees)
        );
    }
    let _ = writeln!(
        o,
        "  peak live     {} of heap; at most {} live at once",
        human::bytes(r.peak_live_bytes),
        human::plural(r.peak_live_blocks, "block", "blocks")
    );
    let _ = writeln!(
        o,
        "  live at end   {} ({}) allocated while recording and not freed",
        human::plural(r.live_blocks_at_end, "block", "blocks"),
        human::bytes(r.live_bytes_at_end)
    );
    if r.blocks_discarded_at_exec > 0 {
        let _ = writeln!(
            o,
            "  exec ended    {} ({}) still live when their image was replaced (not freed, not \
             live at the end)",
            human::plural(r.blocks_discarded_at_exec, "block", "blocks"),
            human::bytes(r.bytes_discarded_at_exec)
        );
    }
    let _ = writeln!(
        o,
        "  mapped        peak {}, at end {}",
        human::bytes(r.mapped_bytes_peak),
        human::bytes(r.mapped_bytes_at_end)
    );
}

/// The count of each event kind.
fn kinds_line(o: &mut String, r: &ShowReport) {
    // Kinds that are not memory events only when recorded, as in the JSON totals.
    let kinds: Vec<String> = KindTag::ALL
        .iter()
        .filter(|k| k.is_memory() || r.kinds.get(**k) != 0)
        .map(|&k| format!("{} {}", k.name(), human::count(r.kinds.get(k))))
        .collect();
    let _ = writeln!(o, "  kinds         {}", kinds.join(", "));
}

/// The size classes, threads, processes and top sites, each when the report has them.
fn table_sections(o: &mut String, r: &ShowReport) {
    if !r.size_classes.is_empty() {
        let _ = writeln!(o, "  allocations by size class (bytes)");
        o.push_str(&tables::size_classes(
            &r.size_classes,
            r.allocations,
            r.bytes_allocated,
        ));
    }
    if let Some(rows) = &r.per_thread {
        let _ = writeln!(o, "  per thread (frees count in the freeing thread)");
        o.push_str(&tables::threads(rows, r));
    }
    if !r.process_table.is_empty() {
        let _ = writeln!(
            o,
            "  processes     {} followed (each its own heap; the totals above are their sum)",
            r.followed
        );
        o.push_str(&r.process_table);
    }
    if let Some(top) = &r.top_sites {
        sites_text(o, top, r);
    }
}

/// The top sites, DHAT-style: a row of numbers per site, its stack below it.
fn sites_text(o: &mut String, top: &TopSites, r: &ShowReport) {
    if let Some(note) = &top.note {
        let _ = writeln!(o, "  call sites    {note}");
        return;
    }
    let by = match top.by {
        "allocations" => "allocations",
        "peak" => "bytes live at the peak",
        "leaked" => "bytes live at the end",
        _ => "bytes allocated",
    };
    let _ = writeln!(
        o,
        "  top {} of {} by {by} (at peak: live when the heap peaked at {})",
        top.rows.len(),
        human::plural(top.sites as u64, "call site", "call sites"),
        human::bytes(top.peak_live_bytes)
    );
    let mut t = Table::new(vec![
        Column::new("rank", "#", Align::Right),
        Column::new("blocks", "allocations", Align::Right),
        Column::new("bytes", "bytes", Align::Right),
        Column::new("share", "share", Align::Right),
        Column::new("blocks_at_peak", "at peak", Align::Right),
        Column::new("bytes_at_peak", "bytes", Align::Right),
        Column::new("blocks_at_end", "at end", Align::Right),
        Column::new("bytes_at_end", "bytes", Align::Right),
    ]);
    for (i, row) in top.rows.iter().enumerate() {
        let s = &row.site;
        t.push(vec![
            Cell::Text((i + 1).to_string()),
            Cell::Count(Some(s.blocks)),
            Cell::Bytes(s.bytes),
            Cell::Text(tables::percent(s.bytes, r.bytes_allocated)),
            Cell::Count(Some(s.blocks_at_peak)),
            Cell::Bytes(s.bytes_at_peak),
            Cell::Count(Some(s.blocks_at_end)),
            Cell::Bytes(s.bytes_at_end),
        ]);
    }
    let table = render::text(&t);
    let mut lines = table.lines();
    let _ = writeln!(o, "    {}", lines.next().unwrap_or_default());
    for (row, line) in top.rows.iter().zip(lines) {
        let _ = writeln!(o, "    {line}");
        if row.site.stack.is_none() {
            let _ = writeln!(o, "        (no stack recorded)");
            continue;
        }
        for f in &row.frames {
            let _ = writeln!(o, "        {}", f.location);
        }
        if row.truncated {
            let _ = writeln!(o, "        … (cut at the recorder's depth cap)");
        }
    }
    if top.rows.iter().any(|r| r.allocator_frames_trimmed > 0) {
        let _ = writeln!(
            o,
            "  not shown     the allocator's own frames at the top of each stack \
             (--no-trim-allocator shows them)"
        );
    }
    for u in &top.unsymbolized {
        let _ = writeln!(o, "  not named     {}: {}", u.module, u.reason);
    }
}
