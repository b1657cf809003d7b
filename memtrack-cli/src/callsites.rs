//! The call sites of a recording as every picture and export of them needs them: each site's
//! numbers ([`memtrack::analysis::Site`]), its stack symbolized once by [`memtrack::symbolize::Symbolizer`], and
//! each frame's name and module class. `memtrack flamegraph` and every `memtrack export`
//! format are renderings of one [`CallSites`].
//!
//! Here, in the presentation layer, rather than in the library: only the command's renderers
//! use it (a [`memtrack::Report`] user has [`memtrack::analysis::Sites`] and [`memtrack::symbolize::Symbolizer`]),
//! and the library would otherwise need the renderers' choices (frame names, classes) in its
//! API.

use std::path::Path;

use memtrack::{
    analysis::Site, analysis::SiteAnalyzer, analysis::SiteOrder, analysis::Sites, artifact::Reader,
    human, stack::Stack, stack::StackId, symbolize::SymFrame, symbolize::Symbolizer,
};
use std::collections::HashMap;

/// `--metric`: what a site weighs in a flame graph or a weighted export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Metric {
    /// Bytes allocated.
    Bytes,
    /// Allocations (blocks).
    Allocations,
    /// Bytes live when the heap peaked.
    Peak,
    /// Bytes still live at the end.
    Leaked,
}

impl Metric {
    /// The order of [`memtrack::analysis::Sites`] of the same meaning.
    pub fn order(self) -> SiteOrder {
        match self {
            Metric::Bytes => SiteOrder::Bytes,
            Metric::Allocations => SiteOrder::Allocations,
            Metric::Peak => SiteOrder::Peak,
            Metric::Leaked => SiteOrder::Leaked,
        }
    }

    /// A site's weight.
    pub fn weight(self, s: &Site) -> u64 {
        self.order().key(s)
    }

    /// What the weight counts, for titles and tooltips.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Bytes => "bytes allocated",
            Metric::Allocations => "allocations",
            Metric::Peak => "bytes live at the peak",
            Metric::Leaked => "bytes live at the end (leaked)",
        }
    }

    /// The unit of the weight.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Allocations => "allocations",
            _ => "bytes",
        }
    }
}

/// Whose code a frame is, for colouring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// The program's own code (its executable, not Rust's standard library).
    User,
    /// Rust's standard library (std, core, alloc) and the compiler's runtime symbols.
    Std,
    /// The C library and the dynamic loader.
    Libc,
    /// Any other shared library, and frames outside any file.
    Other,
}

/// One recorded return address, symbolized.
#[derive(Clone, Debug)]
pub struct Location {
    /// The module's path as recorded; `None` outside any file.
    pub module: Option<String>,
    /// The recorded offset in the module (the absolute address outside any file).
    pub offset: u64,
    /// Its frames: functions inlined there first (innermost), the function it is in last; a
    /// single fallback frame (`module+0xOFFSET`) when it could not be named.
    pub frames: Vec<SymFrame>,
    /// Whose code it is.
    pub class: Class,
}

/// A site with its symbolized stack.
#[derive(Clone, Debug)]
pub struct CallSite {
    /// Its numbers.
    pub site: Site,
    /// Its stack, innermost first; empty for the site of the allocations without a stack.
    pub locations: Vec<Location>,
    /// The stack was cut at the recorder's depth cap.
    pub truncated: bool,
}

/// The name of the frame that stands for the allocations without a stack.
pub const NO_STACK: &str = "[no stack]";

/// The root frame of a stack cut at the recorder's depth cap.
pub const TRUNCATED: &str = "[truncated]";

impl CallSite {
    /// The frames' names, root (outermost) first, each inlined function a frame of its own:
    /// the function's name, or the fallback `module+0xOFFSET`; [`NO_STACK`] for the site
    /// without a stack, [`TRUNCATED`] first for a stack cut at the depth cap. With the class
    /// of each.
    pub fn names(&self) -> Vec<(String, Class)> {
        if self.locations.is_empty() {
            return vec![(NO_STACK.to_string(), Class::Other)];
        }
        // A stack cut at the depth cap misses its outermost frames: its root says so rather
        // than passing for a caller.
        let cut = self
            .truncated
            .then(|| (TRUNCATED.to_string(), Class::Other));
        cut.into_iter()
            .chain(
                self.locations
                    .iter()
                    .rev()
                    .flat_map(|l| l.frames.iter().rev().map(move |f| (frame_name(f), l.class))),
            )
            .collect()
    }
}

/// A frame's name in a flame graph or folded stack: the function without file and line (the
/// lines of one function are one frame), or the fallback `module+0xOFFSET`.
pub fn frame_name(f: &SymFrame) -> String {
    match &f.function {
        Some(func) => func.clone(),
        None => f.to_string(),
    }
}

/// Every call site of a recording, symbolized, with the recording's totals.
pub struct CallSites {
    /// The benchmark's name (the file's stem if the recording has none).
    pub name: String,
    /// The command that was recorded, as one string.
    pub command: String,
    /// The recorded process id.
    pub pid: u32,
    /// The peak and its instant.
    pub sites: Sites,
    /// Every site, by increasing stack id.
    pub call_sites: Vec<CallSite>,
    /// The first and the last event's timestamps (ns, CLOCK_MONOTONIC).
    pub first_ts: u64,
    /// See `first_ts`.
    pub last_ts: u64,
    /// The symbolizer, for the stacks of other events (frees) an export adds.
    pub symbolizer: Symbolizer,
}

impl CallSites {
    /// Reads `file`'s events once (the site analysis) and symbolizes the stacks of its sites.
    /// Refuses a recording without call stacks, saying how to record them, and warns of lost
    /// events (the sites then miss them).
    pub fn read(reader: &Reader, file: &Path, what: &str) -> memtrack::Result<CallSites> {
        let sites = Self::analyse(reader, file, what)?;
        Self::symbolized(reader, file, sites)
    }

    /// [`CallSites::read`]'s first half, which needs no symbolizer (and so can run on another
    /// thread): the site analysis of `file`'s events, refused without call stacks.
    pub fn analyse(reader: &Reader, file: &Path, what: &str) -> memtrack::Result<Sites> {
        super::warn_if_recovered(reader);
        if let Some(f) = reader.final_metadata()
            && f.lost_events > 0
        {
            eprintln!(
                "memtrack: warning: {}: {} events were lost while recording; the call sites \
                 miss them",
                file.display(),
                human::count(f.lost_events)
            );
        }
        let bar = super::progress::events_bar(reader, what);
        let a = SiteAnalyzer::read(reader, |evs| bar.inc(evs.len() as u64))?;
        bar.finish_and_clear();
        let sites = a.sites();
        if !sites.has_stacks() {
            return Err(memtrack::Error::InvalidOption(format!(
                "{}: {}",
                file.display(),
                super::show::no_stacks_note(reader)
            )));
        }
        Ok(sites)
    }

    /// [`CallSites::read`]'s second half: `sites` (of `file`, read by `reader`) with their
    /// stacks symbolized.
    pub fn symbolized(reader: &Reader, file: &Path, sites: Sites) -> memtrack::Result<CallSites> {
        let table = reader.stacks()?;
        let mut symbolizer = super::symbolizer(&[reader]);
        let (stacks, named) = symbolizer.symbolize_sites(reader, &sites)?;
        let call_sites = sites
            .sites
            .iter()
            .zip(&stacks)
            .zip(named)
            .map(|((site, stack), frames)| CallSite {
                site: *site,
                truncated: stack.truncated,
                locations: locations(stack, frames, |id| table.module(id).map(|m| &m.path)),
            })
            .collect();
        let meta = reader.metadata();
        let name = meta.name.clone().unwrap_or_else(|| {
            file.file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        });
        let (first_ts, last_ts) = match (reader.frames().first(), reader.frames().last()) {
            (Some(f), Some(l)) => (f.first_ts, l.last_ts),
            _ => (0, 0),
        };
        Ok(CallSites {
            name,
            command: meta.command.join(" "),
            pid: meta.pid,
            sites,
            call_sites,
            first_ts,
            last_ts,
            symbolizer,
        })
    }

    /// The site of `stack`, if it allocated.
    pub fn site(&self, stack: StackId) -> Option<&CallSite> {
        self.call_sites
            .binary_search_by_key(&stack, |c| c.site.stack)
            .ok()
            .map(|i| &self.call_sites[i])
    }

    /// The folded stacks (`root;…;leaf weight`) of the sites of non-zero weight, the lines of
    /// sites whose frames read the same merged, sorted (inferno's input, flamegraph.pl's
    /// format). A `;` in a name (Rust's `[T; N]`) is written `,` so that it does not split it.
    pub fn folded(&self, metric: Metric) -> Vec<String> {
        let mut merged: HashMap<String, u64> = HashMap::new();
        for c in &self.call_sites {
            let w = metric.weight(&c.site);
            if w == 0 {
                continue;
            }
            let path: Vec<String> = c
                .names()
                .into_iter()
                .map(|(n, _)| n.replace(';', ",").replace('\n', " "))
                .collect();
            *merged.entry(path.join(";")).or_default() += w;
        }
        let mut lines: Vec<String> = merged
            .into_iter()
            .map(|(path, w)| format!("{path} {w}"))
            .collect();
        lines.sort();
        lines
    }
}

/// A recorded stack's locations from its symbolized frames.
pub fn locations<'m>(
    stack: &Stack,
    frames: Vec<Vec<SymFrame>>,
    path: impl Fn(memtrack::stack::ModuleId) -> Option<&'m String>,
) -> Vec<Location> {
    stack
        .frames
        .iter()
        .zip(frames)
        .map(|(recorded, frames)| {
            let module = path(recorded.module).cloned();
            let class = classify(module.as_deref(), &frames);
            Location {
                module,
                offset: recorded.offset,
                frames,
                class,
            }
        })
        .collect()
}

/// Whose code a location is: by its module's file (the C library, the loader, another shared
/// library) and, in an executable, by its function or source path (Rust's std is compiled
/// into the program, its sources under `/rustc/<hash>/library/`).
fn classify(module: Option<&str>, frames: &[SymFrame]) -> Class {
    let Some(path) = module else {
        return Class::Other;
    };
    let base = path.rsplit('/').next().unwrap_or(path);
    if [
        "libc.so",
        "libc-",
        "ld-linux",
        "ld-",
        "libm.so",
        "libpthread",
        "libdl",
    ]
    .iter()
    .any(|p| base.starts_with(p))
    {
        return Class::Libc;
    }
    let std_frame = |f: &SymFrame| {
        f.file
            .as_deref()
            .is_some_and(|file| file.contains("/rustc/") || file.contains("/library/std/"))
            || f.function.as_deref().is_some_and(|func| {
                let func = func.trim_start_matches('<');
                ["std::", "core::", "alloc::", "__rust", "__rdl", "__rg_"]
                    .iter()
                    .any(|p| func.starts_with(p))
            })
    };
    // The function the address is in (the last frame) decides: std code inlined into the
    // user's function is still the user's call.
    if frames.last().is_some_and(std_frame) {
        return Class::Std;
    }
    if base.contains(".so") {
        return Class::Other;
    }
    Class::User
}
