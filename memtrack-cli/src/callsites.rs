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
    stack::Stack, stack::StackId, symbolize::SymFrame, symbolize::Symbolizer,
};
use std::collections::HashMap;

/// `--metric` and `--by`: a [`SiteOrder`] by its name, each value with its help line.
pub fn site_order() -> impl clap::builder::TypedValueParser<Value = SiteOrder> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = SiteOrder::ALL.map(|o| PossibleValue::new(o.name()).help(o.label_cap()));
    PossibleValuesParser::new(values).try_map(|s| s.parse::<SiteOrder>())
}

/// What a site weighs in a picture or an export, by the [`SiteOrder`] it is ranked by.
pub trait Weight {
    /// A site's weight.
    fn weight(self, s: &Site) -> u64;
    /// What the weight counts, for titles and tooltips.
    fn label(self) -> &'static str;
    /// The same, capitalized, for `--help`.
    fn label_cap(self) -> &'static str;
    /// The unit of the weight.
    fn unit(self) -> &'static str;
}

impl Weight for SiteOrder {
    fn weight(self, s: &Site) -> u64 {
        self.key(s)
    }

    fn label(self) -> &'static str {
        match self {
            SiteOrder::Allocations => "allocations",
            SiteOrder::Peak => "bytes live at the peak",
            SiteOrder::Leaked => "bytes live at the end (leaked)",
            _ => "bytes allocated",
        }
    }

    fn label_cap(self) -> &'static str {
        match self {
            SiteOrder::Allocations => "Allocations (blocks)",
            SiteOrder::Peak => "Bytes live when the heap peaked",
            SiteOrder::Leaked => "Bytes still live at the end",
            _ => "Bytes allocated",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            SiteOrder::Allocations => "allocations",
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
    /// of each. With `trim`, without the allocator's own innermost frames
    /// ([`allocator_frames`]).
    pub fn names(&self, trim: bool) -> Vec<(String, Class)> {
        if self.locations.is_empty() {
            return vec![(NO_STACK.to_string(), Class::Other)];
        }
        // A stack cut at the depth cap misses its outermost frames: its root says so rather
        // than passing for a caller.
        let cut = self
            .truncated
            .then(|| (TRUNCATED.to_string(), Class::Other));
        let frames: Vec<(String, Class)> = self
            .locations
            .iter()
            .rev()
            .flat_map(|l| l.frames.iter().rev().map(move |f| (frame_name(f), l.class)))
            .collect();
        let keep = frames.len() - if trim { self.allocator_frames() } else { 0 };
        cut.into_iter()
            .chain(frames.into_iter().take(keep))
            .collect()
    }

    /// How many of the innermost frames are the allocator's own (see [`allocator_frames`]).
    pub fn allocator_frames(&self) -> usize {
        allocator_frames(
            self.locations
                .iter()
                .map(|l| (l.frames.as_slice(), l.class)),
        )
    }
}

/// How many of a stack's innermost frames are the allocator's own, the frames that
/// `--trim-allocator` hides: the longest unbroken run of [`is_allocator_frame`]s from the
/// innermost frame out, never the whole stack (its outermost frame stays). A function inlined
/// into an allocator function is the allocator's too (the frames of one return address are
/// the functions inlined there, innermost first, and the function the address is in). `stack`
/// is innermost first: each recorded return address's frames, with its class.
///
/// The run stops at the first frame that is not the allocator's, so a frame of the program's
/// own code (or of a library that is not an allocator) is never hidden, nor anything outside
/// it.
pub fn allocator_frames<'a>(stack: impl IntoIterator<Item = (&'a [SymFrame], Class)>) -> usize {
    let mut run = 0;
    let mut total = 0;
    let mut broken = false;
    for (frames, class) in stack {
        total += frames.len();
        if broken {
            continue;
        }
        let container = frames.last().is_some_and(|f| is_allocator_frame(f, class));
        for f in frames {
            if container || is_allocator_frame(f, class) {
                run += 1;
            } else {
                broken = true;
                break;
            }
        }
    }
    run.min(total.saturating_sub(1))
}

/// `--trim-allocator`'s long help: what counts as the allocator's.
pub const TRIM_HELP: &str = "Hide the allocator's own frames at the top of each stack (the \
    default; --no-trim-allocator keeps them). These are the innermost frames, in an unbroken \
    run, that are: malloc, calloc, realloc, free and their kin (__libc_malloc, je_malloc, \
    mi_malloc, operator new) in a shared library; a method of a Rust global allocator (an impl \
    GlobalAlloc: memtrack::Allocator's, or the program's own); Rust's __rust_alloc, __rdl_* and \
    __rg_* shims; alloc::alloc::*, alloc::raw_vec::* and hashbrown::raw::* (a collection's \
    buffer growth: finish_grow, grow_one, reserve_rehash), core::alloc::* and std's System \
    allocator; a function \
    inlined into one of those. The run stops at the first other frame (the Vec::push or \
    String::with_capacity the program called, or its own function), which becomes the top of \
    the stack; the stack's outermost frame always stays. The numbers do not change, only where \
    the stacks end. Exports (memtrack export) keep every frame.";

/// The C allocator's entry points: a frame of one of these, in a shared library, is the
/// allocator's (`__libc_malloc`, `je_malloc`, `mi_malloc` are the same functions prefixed).
const C_ALLOCATOR: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "cfree",
    "memalign",
    "aligned_alloc",
    "posix_memalign",
    "valloc",
    "pvalloc",
    "operator new",
    "operator new[]",
    "operator delete",
    "operator delete[]",
];

/// Prefixes of the C allocator's entry points' other names.
const C_ALLOCATOR_PREFIXES: &[&str] =
    &["", "__libc_", "__GI___libc_", "__GI_", "je_", "mi_", "tc_"];

/// Rust's allocation machinery, by the function's path (demangled, a leading `<` removed):
/// the global allocator's shims, `alloc::alloc`'s functions, the growth of `RawVec` (the
/// buffer of `Vec`, `String`, `VecDeque`) and of hashbrown's `RawTable` (`HashMap`'s and
/// `HashSet`'s), `std::alloc::System`, and memtrack's own recording allocator.
const RUST_ALLOCATOR: &[&str] = &[
    "__rust_alloc",
    "__rust_realloc",
    "__rust_dealloc",
    "__rustc::",
    "__rdl_",
    "__rg_",
    "alloc::alloc::",
    "alloc::raw_vec::",
    "hashbrown::raw::",
    "core::alloc::",
    "std::alloc::",
    "std::sys::alloc::",
    "std::sys::pal::unix::alloc::",
    "memtrack::Allocator",
    "memtrack::allocator::",
];

/// The source files of Rust's allocation machinery, for the frames a symbolizer names
/// without their path (an inlined `alloc`, `grow_one`): under Rust's `library/` folder, and
/// hashbrown's `RawTable` (std's copy is `/rust/deps/hashbrown-<version>/src/raw/`).
const RUST_ALLOCATOR_FILES: &[&str] = &[
    "library/alloc/src/alloc.rs",
    "library/alloc/src/raw_vec.rs",
    "library/alloc/src/raw_vec/",
    "library/core/src/alloc/",
    "library/std/src/alloc.rs",
    "library/std/src/sys/alloc/",
    "library/std/src/sys/pal/unix/alloc.rs",
];

/// A file of hashbrown's `RawTable`: under a `hashbrown-<version>/src/raw/` folder.
fn hashbrown_raw(file: &str) -> bool {
    file.split_once("/hashbrown-").is_some_and(|(_, rest)| {
        rest.split_once('/')
            .is_some_and(|(_, p)| p.starts_with("src/raw/"))
    })
}

/// Whether `f` (in a location of `class`) is a frame of the allocator: a C allocator entry
/// point ([`C_ALLOCATOR`], maybe prefixed) outside the program's own executable (a program
/// that defines `malloc` keeps its frames), a method of a Rust global allocator (an `impl
/// GlobalAlloc`, the program's own included: it is the allocator), or Rust's allocation
/// machinery ([`RUST_ALLOCATOR`] by path, [`RUST_ALLOCATOR_FILES`] by source file). A frame
/// that could not be named is not.
pub fn is_allocator_frame(f: &SymFrame, class: Class) -> bool {
    f.function
        .as_deref()
        .is_some_and(|function| is_allocator_function(function, f.file.as_deref(), class))
}

/// [`is_allocator_frame`] of a frame named `function`, in `file` when known.
pub fn is_allocator_function(function: &str, file: Option<&str>, class: Class) -> bool {
    let path = function.trim_start_matches('<');
    if RUST_ALLOCATOR.iter().any(|p| path.starts_with(p))
        || path.contains(" as core::alloc::global::GlobalAlloc>::")
    {
        return true;
    }
    if file.is_some_and(|file| {
        RUST_ALLOCATOR_FILES.iter().any(|p| file.contains(p)) || hashbrown_raw(file)
    }) {
        return true;
    }
    // C++'s `operator new(unsigned long)`: the name before its parameters.
    let name = function.split('(').next().unwrap_or(function);
    class != Class::User
        && C_ALLOCATOR_PREFIXES.iter().any(|p| {
            name.strip_prefix(p)
                .is_some_and(|rest| C_ALLOCATOR.contains(&rest))
        })
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
    /// The recorded program's executable (see [`executable`]), if a stack has its frames.
    pub executable: Option<String>,
    /// Each module's build id, in hex, by its path as recorded (modules without one absent).
    pub build_ids: HashMap<String, String>,
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
    pub fn read(reader: &Reader, file: &Path, what: &str) -> crate::error::Result<CallSites> {
        let sites = Self::analyse(reader, file, what)?;
        Self::symbolized(reader, file, sites)
    }

    /// [`CallSites::read`]'s first half, which needs no symbolizer (and so can run on another
    /// thread): the site analysis of `file`'s events, refused without call stacks.
    pub fn analyse(reader: &Reader, file: &Path, what: &str) -> crate::error::Result<Sites> {
        super::warn_if_recovered(reader);
        super::whole::warn_lost(reader, file, "the call sites");
        let bar = super::progress::events_bar(reader, what);
        let a = SiteAnalyzer::read(reader, |evs| bar.inc(evs.len() as u64))?;
        bar.finish_and_clear();
        let sites = a.sites();
        // A recording that allocated nothing has no call sites, and none is missing.
        if !sites.sites.is_empty() && !sites.has_stacks() {
            return Err(crate::error::Error::NoStacks {
                file: file.to_path_buf(),
                note: super::show::no_stacks_note(reader),
            });
        }
        Ok(sites)
    }

    /// [`CallSites::read`]'s second half: `sites` (of `file`, read by `reader`) with their
    /// stacks symbolized.
    pub fn symbolized(
        reader: &Reader,
        file: &Path,
        sites: Sites,
    ) -> crate::error::Result<CallSites> {
        let table = reader.stacks()?;
        let mut symbolizer = super::symbolizer(&[reader]);
        let (stacks, named) = symbolizer.symbolize_sites(reader, &sites)?;
        let call_sites: Vec<CallSite> = sites
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
        let executable = executable(reader, &call_sites);
        let build_ids = table
            .modules()
            .filter_map(|(_, m)| {
                let id = m.build_id.as_ref()?;
                Some((
                    m.path.clone(),
                    id.iter().map(|b| format!("{b:02x}")).collect(),
                ))
            })
            .collect();
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
            executable,
            build_ids,
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
    /// With `trim`, without the allocator's own innermost frames (the flame graph's).
    pub fn folded(&self, metric: SiteOrder, trim: bool) -> Vec<String> {
        let mut merged: HashMap<String, u64> = HashMap::new();
        for c in &self.call_sites {
            let w = metric.weight(&c.site);
            if w == 0 {
                continue;
            }
            let path: Vec<String> = c
                .names(trim)
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

/// The recorded program's executable, among the modules of `call_sites`' stacks: the program
/// the recorded process ran (`memtrack record`'s command, its last `execve`'s, in the
/// trailer's processes), else (an in-process session, which records no process) the module
/// that is not a shared library under whose frames the most bytes were allocated, the first
/// seen of equals. `None` if no stack has a frame of such a module.
pub fn executable(reader: &Reader, call_sites: &[CallSite]) -> Option<String> {
    let in_stacks = |path: &str| {
        call_sites.iter().any(|c| {
            c.locations
                .iter()
                .any(|l| l.module.as_deref() == Some(path))
        })
    };
    let pid = reader.metadata().pid;
    let recorded = reader
        .final_metadata()
        .and_then(|f| f.processes.iter().find(|p| p.pid == pid))
        .map(|p| p.exe.as_str());
    if let Some(exe) = recorded.filter(|exe| in_stacks(exe)) {
        return Some(exe.to_string());
    }
    let mut bytes: Vec<(&str, u64)> = Vec::new();
    for c in call_sites {
        let mut seen: Vec<&str> = Vec::new();
        for path in c.locations.iter().filter_map(|l| l.module.as_deref()) {
            if is_shared_library(path) || seen.contains(&path) {
                continue;
            }
            seen.push(path);
            match bytes.iter_mut().find(|(p, _)| *p == path) {
                Some((_, b)) => *b += c.site.bytes,
                None => bytes.push((path, c.site.bytes)),
            }
        }
    }
    // The first of the largest: `max_by_key` keeps the last of equals.
    let most = bytes.iter().map(|(_, b)| *b).max()?;
    bytes
        .iter()
        .find(|(_, b)| *b == most)
        .map(|(p, _)| p.to_string())
}

/// Whether the file at `path` is a shared library or the dynamic loader, by its name
/// (`libx.so`, `libx.so.6`, `ld-linux-x86-64.so.2`).
fn is_shared_library(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.contains(".so") || base.starts_with("ld-")
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
pub fn classify(module: Option<&str>, frames: &[SymFrame]) -> Class {
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

#[cfg(test)]
mod tests {
    use super::*;

    const STD: &str = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";

    fn frame(function: &str, file: &str, inlined: bool) -> SymFrame {
        SymFrame {
            function: Some(function.to_string()),
            file: (!file.is_empty()).then(|| file.to_string()),
            line: Some(1),
            inlined,
            module: "prog".to_string(),
            offset: 0x1000,
        }
    }

    fn unnamed() -> SymFrame {
        SymFrame {
            function: None,
            file: None,
            line: None,
            inlined: false,
            module: "prog".to_string(),
            offset: 0x1234,
        }
    }

    fn trimmed(stack: &[(Vec<SymFrame>, Class)]) -> usize {
        allocator_frames(stack.iter().map(|(f, c)| (f.as_slice(), *c)))
    }

    /// The allocator recorder's stack of `Vec::with_capacity` in a user's function (symbolized
    /// with whole paths): memtrack's wrapper and the global allocator's shim inlined into
    /// RawVec's allocation, then Vec's own functions inlined into the user's.
    #[test]
    fn a_vec_allocation_under_the_allocator_recorder() {
        let stack = vec![
            (
                vec![
                    frame(
                        "memtrack::allocator::walk::Here::now",
                        "/src/memtrack/src/allocator/walk.rs",
                        true,
                    ),
                    frame(
                        "<memtrack::allocator::Allocator<A> as core::alloc::global::GlobalAlloc>::alloc",
                        "/src/memtrack/src/allocator/mod.rs",
                        true,
                    ),
                    frame("__rustc::__rust_alloc", "/src/app/src/main.rs", true),
                    frame(
                        "alloc::alloc::alloc",
                        &format!("{STD}/alloc/src/alloc.rs"),
                        true,
                    ),
                    frame(
                        "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
                        &format!("{STD}/alloc/src/raw_vec/mod.rs"),
                        false,
                    ),
                ],
                Class::Std,
            ),
            (
                vec![
                    frame(
                        "alloc::raw_vec::RawVec<T,A>::with_capacity_in",
                        &format!("{STD}/alloc/src/raw_vec/mod.rs"),
                        true,
                    ),
                    frame(
                        "alloc::vec::Vec<T>::with_capacity",
                        &format!("{STD}/alloc/src/vec/mod.rs"),
                        true,
                    ),
                    frame("app::build", "/src/app/src/main.rs", false),
                ],
                Class::User,
            ),
            (
                vec![frame("app::main", "/src/app/src/main.rs", false)],
                Class::User,
            ),
        ];
        // The 5 frames of the first address and RawVec's, not Vec::with_capacity.
        assert_eq!(trimmed(&stack), 6);
    }

    /// The eBPF tracker's stack starts at malloc's caller; blazesym names inlined std
    /// functions without their path (`alloc`, `grow_one`): those are told by their file.
    #[test]
    fn inlined_frames_named_without_paths_by_their_file() {
        let stack = vec![
            (
                vec![
                    frame("alloc", &format!("{STD}/alloc/src/alloc.rs"), true),
                    frame("allocate", &format!("{STD}/alloc/src/alloc.rs"), true),
                    frame(
                        "do_alloc<alloc::alloc::Global>",
                        "/rust/deps/hashbrown-0.16.1/src/raw/alloc.rs",
                        true,
                    ),
                    frame(
                        "reserve_rehash<(String, usize)>",
                        "/rust/deps/hashbrown-0.16.1/src/raw/mod.rs",
                        false,
                    ),
                ],
                Class::User,
            ),
            (
                vec![
                    frame(
                        "reserve<String, usize>",
                        "/rust/deps/hashbrown-0.16.1/src/map.rs",
                        true,
                    ),
                    frame(
                        "rustc_entry<String, usize>",
                        "/rust/deps/hashbrown-0.16.1/src/rustc_entry.rs",
                        false,
                    ),
                ],
                Class::User,
            ),
            (
                vec![frame("main", "/src/app/src/main.rs", false)],
                Class::User,
            ),
        ];
        assert_eq!(trimmed(&stack), 4);
        // A user's own function of a hashbrown-like name elsewhere stays.
        assert!(!is_allocator_frame(
            &frame("reserve_rehash", "/src/app/src/raw/mod.rs", false),
            Class::User
        ));
    }

    /// C's entry points in a shared library are the allocator's; in the program itself
    /// (one that defines `malloc`) they are its own code.
    #[test]
    fn c_entry_points_only_outside_the_program() {
        for name in [
            "malloc",
            "__libc_malloc",
            "je_realloc",
            "mi_calloc",
            "operator new(unsigned long)",
        ] {
            assert!(
                is_allocator_frame(&frame(name, "", false), Class::Libc),
                "{name}"
            );
            assert!(
                is_allocator_frame(&frame(name, "", false), Class::Other),
                "{name}"
            );
            assert!(
                !is_allocator_frame(&frame(name, "", false), Class::User),
                "{name}"
            );
        }
        for name in ["malloc_trim", "my_malloc", "__strdup", "operator newline"] {
            assert!(
                !is_allocator_frame(&frame(name, "", false), Class::Libc),
                "{name}"
            );
        }
    }

    /// A program's own global allocator is the allocator; its other functions are not.
    #[test]
    fn a_global_allocator_of_the_program() {
        let f = frame(
            "<app::Pool as core::alloc::global::GlobalAlloc>::alloc",
            "/src/app/src/pool.rs",
            false,
        );
        assert!(is_allocator_frame(&f, Class::User));
        let f = frame("app::Pool::refill", "/src/app/src/pool.rs", false);
        assert!(!is_allocator_frame(&f, Class::User));
    }

    /// The run stops at the first other frame, an unnamed frame is not the allocator's, and
    /// a stack that is all allocator keeps its outermost frame.
    #[test]
    fn the_run_is_innermost_unbroken_and_never_all() {
        let malloc = || (vec![frame("malloc", "", false)], Class::Libc);
        let user = || {
            (
                vec![frame("app::f", "/src/app/src/main.rs", false)],
                Class::User,
            )
        };
        assert_eq!(trimmed(&[malloc(), user(), malloc(), user()]), 1);
        assert_eq!(trimmed(&[user(), malloc()]), 0);
        assert_eq!(trimmed(&[(vec![unnamed()], Class::User), malloc()]), 0);
        assert_eq!(trimmed(&[malloc(), malloc(), malloc()]), 2);
        assert_eq!(trimmed(&[malloc()]), 0);
        assert_eq!(trimmed(&[]), 0);
    }

    #[test]
    fn names_drop_the_trimmed_frames_only_when_asked() {
        let site = CallSite {
            site: Site::default(),
            locations: vec![
                Location {
                    module: Some("/lib/libc.so.6".into()),
                    offset: 1,
                    frames: vec![frame("malloc", "", false)],
                    class: Class::Libc,
                },
                Location {
                    module: Some("/bin/app".into()),
                    offset: 2,
                    frames: vec![frame("app::f", "/src/app/src/main.rs", false)],
                    class: Class::User,
                },
            ],
            truncated: true,
        };
        let names =
            |trim| -> Vec<String> { site.names(trim).into_iter().map(|(n, _)| n).collect() };
        assert_eq!(names(false), [TRUNCATED, "app::f", "malloc"]);
        assert_eq!(names(true), [TRUNCATED, "app::f"]);
    }
}
