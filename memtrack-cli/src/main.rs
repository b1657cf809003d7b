//! The `memtrack` command-line tool. Run `memtrack --help`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use memtrack::{
    analysis::Analyzer, analysis::Totals, artifact::Backend, artifact::Completeness,
    artifact::Metadata, artifact::Output, artifact::Reader, encode::Encoder,
    encode::EncoderOptions, human, synth::Synth, synth::SynthOptions,
};

mod callsites;
mod compare;
mod export;
mod flamegraph;
mod locks;
mod plot;
mod pprof;
mod processes;
mod progress;
mod show;
mod tables;

#[derive(Parser)]
#[command(
    name = "memtrack",
    version,
    about = "Exact memory profiling: record, inspect, verify, compare, plot"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// `show --by`: the orders of `memtrack::analysis::SiteOrder`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum By {
    Bytes,
    Allocations,
    Peak,
    Leaked,
}

impl By {
    fn order(self) -> memtrack::analysis::SiteOrder {
        match self {
            By::Bytes => memtrack::analysis::SiteOrder::Bytes,
            By::Allocations => memtrack::analysis::SiteOrder::Allocations,
            By::Peak => memtrack::analysis::SiteOrder::Peak,
            By::Leaked => memtrack::analysis::SiteOrder::Leaked,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Print an artifact's metadata and totals.
    Show {
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
        #[arg(long, value_enum, default_value_t = By::Bytes, requires = "top")]
        by: By,
    },
    /// Decode every frame and check checksums, counts and the trailer: exit 0 only if all is
    /// sound and the recording is whole (no lost events), else exit 1 naming the first
    /// problem.
    Verify {
        /// The artifact.
        file: PathBuf,
        /// Check the file's structure only (frames, checksums, counts, trailer): a recording
        /// that lost events passes, with a note of how many.
        #[arg(long)]
        structure_only: bool,
    },
    /// Compare benchmarks' allocations, bytes and peak between two artifacts or two directories
    /// of `*.memtrack` artifacts (matched by benchmark name). Exit 0: no metric grew past the
    /// threshold; 1: a regression; 2: bad usage or an input refused (corrupt, incomplete, or
    /// with lost events).
    Compare {
        /// The baseline: an artifact or a directory of them.
        base: PathBuf,
        /// The candidate: an artifact or a directory of them.
        head: PathBuf,
        /// Growth allowed before a metric counts as regressed, with its % sign (`3%`, `0.5%`;
        /// a bare number is refused). Growth from 0 is always a regression; any shrinking is an
        /// improvement.
        #[arg(long, default_value = "3%", value_parser = |s: &str| s.parse::<memtrack::analysis::Threshold>())]
        threshold: memtrack::analysis::Threshold,
        /// Which metric to gate on.
        #[arg(long, value_enum, default_value_t = compare::MetricArg::All)]
        metric: compare::MetricArg,
        /// Output format (markdown is ready for a CI job summary).
        #[arg(long, value_enum, default_value_t = compare::Format::Table)]
        format: compare::Format,
    },
    /// Draw live heap bytes (and mapped bytes) over time as an SVG, the peak marked.
    Plot {
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
    },
    /// Draw the call sites as an interactive flame graph (SVG: search, zoom, tooltips), each
    /// frame as wide as its share of the metric, coloured by whose code it is (the program,
    /// Rust std, libc and ld.so, other libraries). Needs a recording with call stacks. With
    /// `--diff BASE HEAD`: a differential flame graph of HEAD (growth red, shrink blue, no
    /// change white), frames matched by function and source file; exit 2 if an input is
    /// refused (no call stacks, incomplete, lost events, processes not covered). With
    /// `--locks`: the lock waits of a recording made with `record --locks` instead, each
    /// contended call site (the code that wanted the lock) as wide as the time waited there.
    Flamegraph {
        /// The artifact.
        #[arg(required_unless_present = "diff", conflicts_with = "diff")]
        file: Option<PathBuf>,
        /// Draw how HEAD differs from BASE instead: two artifacts with call stacks.
        #[arg(long, num_args = 2, value_names = ["BASE", "HEAD"])]
        diff: Option<Vec<PathBuf>>,
        /// Output SVG file.
        #[arg(short, long, default_value = "flame.svg")]
        output: PathBuf,
        /// What a site weighs: bytes allocated, allocations, bytes live at the peak, or
        /// bytes still live at the end.
        #[arg(long, value_enum, default_value_t = callsites::Metric::Bytes)]
        metric: callsites::Metric,
        /// Draw the lock waits (a recording made with `record --locks`) instead of the
        /// allocations: each contended call site's stack above the lock call, its lock's
        /// class on top, weighted by the microseconds waited there.
        #[arg(long, conflicts_with_all = ["diff", "metric"])]
        locks: bool,
        /// With `--locks`: the classes of lock waits drawn (comma-separated; default all).
        #[arg(long, value_enum, value_delimiter = ',', requires = "locks")]
        class: Vec<locks::LockClass>,
    },
    /// Write the call sites in another tool's format: Valgrind DHAT's JSON (dh_view.html),
    /// pprof's gzipped profile.proto (Go heap profile sample types), folded stacks
    /// (flamegraph.pl, inferno, speedscope) or the Firefox Profiler's processed format
    /// (allocations over time). Needs a recording with call stacks.
    Export {
        /// The artifact.
        file: PathBuf,
        /// The format.
        #[arg(long, value_enum)]
        format: export::Format,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// What a site weighs in the folded stacks (the other formats carry every number).
        #[arg(long, value_enum, default_value_t = callsites::Metric::Bytes)]
        metric: callsites::Metric,
        /// With `--format folded`: the lock waits (a recording made with `record --locks`)
        /// instead of the allocations, weighted by the microseconds waited (the stacks
        /// `flamegraph --locks` draws).
        #[arg(long, conflicts_with = "metric")]
        locks: bool,
        /// With `--locks`: the classes of lock waits written (comma-separated; default all).
        #[arg(long, value_enum, value_delimiter = ',', requires = "locks")]
        class: Vec<locks::LockClass>,
    },
    /// Write an artifact from a seeded model of a multi-threaded program (no privileges needed).
    Synth {
        /// Number of events.
        #[arg(long)]
        events: u64,
        /// Seed of the model: the same seed gives the same trace.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Number of threads in the model.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
        threads: u32,
        /// Allocations carry call stacks (300 call sites, Zipf-like counts, 10–40 frames with
        /// shared prefixes), each stack defined where the trace first uses it.
        #[arg(long)]
        stacks: bool,
        /// Compression threads (default: available cores − 2, at least 1).
        #[arg(long)]
        workers: Option<usize>,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Run a command with every allocation, free and mapping recorded by the eBPF tracker
    /// (needs root, or CAP_BPF + CAP_PERFMON). Exits with the command's exit code (128+N if
    /// signal N ended it); 127 if the command is not found, 126 if it cannot be executed, 2 for
    /// bad usage, 125 if memtrack itself failed. The command
    /// never gets memtrack's capabilities, and when it does not run as root a setuid program it
    /// starts gains no privileges (no_new_privs).
    Record {
        /// Output file (replaced only when the recording is complete).
        #[arg(short, long, default_value = "memtrack.out")]
        output: PathBuf,
        /// Run the command as this user (name or uid): its uid, gid and groups, HOME, USER and
        /// LOGNAME. Needs root; without it the command runs as memtrack's user (root under
        /// sudo).
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// Ring buffer size in MiB (a power of two from 1 to 1024); raise it if events are
        /// lost. Resident memory is about twice this (the pages are mapped twice).
        #[arg(long, default_value_t = memtrack::tracker::DEFAULT_RINGBUF_BYTES >> 20, value_parser = ringbuf_mib)]
        ringbuf_mib: u64,
        /// Do not record mmap/munmap/mremap/brk at all. By default they are recorded through
        /// libc's wrappers, for the command only (no cost to other processes).
        #[arg(long)]
        no_syscalls: bool,
        /// Record mmap/munmap/mremap/brk as raw syscalls, also those that bypass libc (the
        /// dynamic loader's mappings, syscall(2), static programs). Its tracepoint slows every
        /// syscall of every process on the machine while recording (see the README).
        #[arg(long, conflicts_with = "no_syscalls")]
        raw_syscalls: bool,
        /// Record the command's own process only. By default every process it starts (fork,
        /// posix_spawn, exec) is followed with ptrace and recorded from its first instruction;
        /// with this flag no ptrace is used and the processes it starts are counted as not
        /// followed (the recording is then not whole if it started any).
        #[arg(long)]
        no_follow: bool,
        /// Frames kept of each allocation's call stack (0 to 127; 0 records no stacks). Stacks
        /// are walked by frame pointers: build the code with them (Rust:
        /// RUSTFLAGS="-C force-frame-pointers=yes"; C/C++: -fno-omit-frame-pointer) or its
        /// stacks stop early (the summary says how many).
        #[arg(long, value_name = "N", default_value_t = memtrack::tracker::DEFAULT_STACK_DEPTH, value_parser = stack_depth)]
        stack_depth: u32,
        /// Also record lock waits: every context switch of the command's threads, with the
        /// stack each left the CPU in (read them with `memtrack locks FILE`). Its tracepoint
        /// runs for every context switch on the machine while recording.
        #[arg(long)]
        locks: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Lock waits of a recording made with `record --locks` (or `SessionBuilder::lock_waits`):
    /// per thread, the time off the CPU by why (mutex, rwlock, condvar, glibc lock, other
    /// futex, I/O, sleep, other, preempted) and on it, then the call sites that waited longest
    /// for a lock (`flamegraph --locks` draws them, `export --format folded --locks` writes
    /// them). A recording that lost events is refused.
    Locks {
        /// The artifact.
        file: PathBuf,
        /// Machine-readable JSON on stdout instead of the tables.
        #[arg(long)]
        json: bool,
        /// How many contended call sites to show.
        #[arg(long, value_name = "N", default_value_t = 10)]
        top: usize,
    },
}

fn main() -> ExitCode {
    if let Err(e) = refuse_setuid() {
        eprintln!("memtrack: error: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    // compare's own exit codes: 1 is a regression, so its errors exit 2; record's are the
    // command's, so its own are set apart (see `record_error_code`).
    let kind = match cli.cmd {
        Cmd::Compare { .. } | Cmd::Flamegraph { diff: Some(_), .. } => Some(2),
        Cmd::Record { .. } => None,
        _ => Some(1),
    };
    let res = match cli.cmd {
        Cmd::Show {
            file,
            json,
            threads,
            top,
            by,
        } => show(&file, json, threads, top.map(|n| (n, by.order()))),
        Cmd::Verify {
            file,
            structure_only,
        } => verify(&file, structure_only),
        Cmd::Compare {
            base,
            head,
            threshold,
            metric,
            format,
        } => compare::run(&base, &head, threshold, metric, format),
        Cmd::Plot {
            file,
            output,
            width,
            height,
        } => plot::run(&file, &output, plot::Size { width, height }),
        Cmd::Flamegraph {
            file,
            diff,
            output,
            metric,
            locks,
            class,
        } => match (diff.as_deref(), file) {
            (Some([base, head]), _) => flamegraph::run_diff(base, head, &output, metric),
            (_, Some(file)) if locks => flamegraph::run_locks(&file, &output, lock_classes(&class)),
            (_, Some(file)) => flamegraph::run(&file, &output, metric),
            _ => unreachable!("clap requires FILE or --diff BASE HEAD"),
        },
        Cmd::Export {
            file,
            format,
            output,
            metric,
            locks,
            class,
        } => match (locks, format) {
            (true, export::Format::Folded) => {
                export::run_locks(&file, &output, lock_classes(&class))
            }
            (true, _) => Err(memtrack::Error::InvalidOption(
                "--locks exports the lock waits as folded stacks only: use --format folded \
                 (the other formats are of the allocations)"
                    .into(),
            )),
            (false, _) => export::run(&file, format, &output, metric),
        },
        Cmd::Synth {
            events,
            seed,
            threads,
            stacks,
            workers,
            output,
        } => synth(events, seed, threads, stacks, workers, &output),
        Cmd::Record {
            output,
            user,
            ringbuf_mib,
            no_syscalls,
            raw_syscalls,
            no_follow,
            stack_depth,
            locks,
            command,
        } => record(
            &output,
            user,
            ringbuf_mib,
            (!no_syscalls, raw_syscalls),
            (!no_follow, locks),
            stack_depth,
            &command,
        ),
        Cmd::Locks { file, json, top } => locks::run(&file, json, top),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("memtrack: error: {e}");
            ExitCode::from(kind.unwrap_or_else(|| record_error_code(&e)))
        }
    }
}

/// `--class`'s classes, all of them when none is given.
fn lock_classes(class: &[locks::LockClass]) -> &[locks::LockClass] {
    match class {
        [] => &locks::LockClass::ALL,
        some => some,
    }
}

/// `record`'s exit code for its own failures, apart from any code the command can exit with
/// (as `timeout` and `env` do): 127 the command was not found, 126 it cannot be executed, 2 bad
/// usage (an option's value), 125 memtrack failed (privileges, the output file, the tracker).
fn record_error_code(e: &memtrack::Error) -> u8 {
    use memtrack::tracker::TrackerError as T;
    match e {
        memtrack::Error::InvalidOption(_)
        | memtrack::Error::Tracker(T::InvalidOption(_) | T::UnknownUser { .. }) => 2,
        // Reported as invalid options until they got variants of their own: the same code.
        memtrack::Error::Tracker(
            T::ObjectMismatch(_)
            | T::PollerDied
            | T::Internal(_)
            | T::Encode(memtrack::encode::EncodeError::InvalidOption(_)),
        ) => 2,
        memtrack::Error::Tracker(T::CommandNotFound { .. }) => 127,
        memtrack::Error::Tracker(T::NotExecutable { .. }) => 126,
        memtrack::Error::Tracker(T::Spawn { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            127
        }
        memtrack::Error::Tracker(T::Spawn { .. }) => 126,
        _ => 125,
    }
}

/// `--ringbuf-mib`: a power of two from 1 to 1024, in MiB (the unit the user typed).
fn ringbuf_mib(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n.is_power_of_two() && n <= 1024 => Ok(n),
        _ => Err(format!(
            "expected a power of two from 1 to 1024 (MiB), got {s:?}"
        )),
    }
}

/// `--stack-depth`: 0 to 127 frames (the kernel's `perf_event_max_stack`).
fn stack_depth(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n <= 127 => Ok(n),
        _ => Err(format!(
            "expected a number of frames from 0 (no stacks) to 127, got {s:?}"
        )),
    }
}

/// Refuses to run with a real and an effective identity that differ (memtrack installed
/// setuid or setgid): every user could then write any file and run any command as its owner.
fn refuse_setuid() -> Result<(), String> {
    // SAFETY: these four calls have no preconditions.
    let (ruid, euid, rgid, egid) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    if ruid == euid && rgid == egid {
        return Ok(());
    }
    Err(format!(
        "memtrack runs setuid or setgid here (real uid {ruid}, effective uid {euid}; real gid \
         {rgid}, effective gid {egid}), which would let any user write any file and run any \
         command as its owner: remove the bit (`chmod u-s,g-s`) and use sudo, or file \
         capabilities (see the README's Security section)"
    ))
}

/// Writes `text` to standard output and flushes it. A closed pipe (`| head`) ends memtrack
/// quietly by SIGPIPE, as it does other Unix tools; any other failure (`> /dev/full`) is an
/// error.
pub(crate) fn out(text: &str) -> memtrack::Result<()> {
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            // SAFETY: restoring SIGPIPE's default action (Rust's runtime ignores it) and
            // raising it ends the process the way a write to a closed pipe ends `cat`.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
            Err(memtrack::Error::Io {
                what: "writing to standard output".into(),
                source: e,
            })
        }
        Err(e) => Err(memtrack::Error::Io {
            what: "writing to standard output".into(),
            source: e,
        }),
    }
}

/// `e` with the output file named, for errors of an encoder writing to `path`.
fn writing(e: impl Into<memtrack::Error>, path: &Path) -> memtrack::Error {
    use memtrack::{
        Error as E, artifact::FormatError as F, encode::EncodeError as En,
        tracker::TrackerError as T,
    };
    match e.into() {
        E::Encode(En::Format(F::Io { what, source }))
        | E::Tracker(T::Encode(En::Format(F::Io { what, source }))) => E::Io {
            what: format!("{what} to {}", path.display()),
            source,
        },
        e => e,
    }
}

/// Decodes every frame (in parallel, in order) and computes the totals, with a progress bar
/// labelled `what` on a terminal.
fn analyse(reader: &Reader, what: &str) -> memtrack::Result<Totals> {
    let mut a = Analyzer::new();
    let bar = progress::events_bar(reader, what);
    reader.for_each_frame(|_, evs| {
        a.update_all(evs);
        bar.inc(evs.len() as u64);
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok(a.totals())
}

/// Whether the totals stored in `reader`'s trailer are those of its decoded events. A format
/// 1.0 trailer predates `peak_live_blocks`: there is nothing to check that one against.
fn stored_totals_agree(reader: &Reader, decoded: &Totals) -> bool {
    let Some(fin) = reader.final_metadata() else {
        return false;
    };
    let mut stored = fin.totals.clone();
    let minor = reader.version().1;
    if minor == 0 {
        stored.peak_live_blocks = decoded.peak_live_blocks;
    }
    if minor < 2 {
        // Before 1.2 the allocator's own frees counted as (unmatched) frees: the frees of
        // known blocks, and all the rest, are the same numbers.
        let mut d = decoded.clone();
        let internal = d.allocator_internal_frees;
        d.allocator_internal_frees = 0;
        d.frees += internal;
        d.unmatched_frees += internal;
        for (tid, th) in &mut d.per_thread {
            if let Some(s) = stored.per_thread.get(tid) {
                th.frees = s.frees;
            }
        }
        return stored == d;
    }
    stored == *decoded
}

fn warn_if_recovered(reader: &Reader) -> bool {
    match reader.completeness() {
        Completeness::Complete => false,
        Completeness::Recovered { reason } => {
            eprintln!(
                "memtrack: warning: {}: {reason}. The numbers below cover the recovered frames only.",
                reader.path().display()
            );
            true
        }
    }
}

fn show(
    path: &Path,
    json: bool,
    threads: bool,
    top: Option<(usize, memtrack::analysis::SiteOrder)>,
) -> memtrack::Result<ExitCode> {
    let reader = Reader::open(path)?;
    let recovered = warn_if_recovered(&reader);
    let report = show::ShowReport::read(&reader, path, !recovered, threads, top)?;
    out(&if json {
        show::json(&report)
    } else {
        show::text(&report)
    })?;
    Ok(ExitCode::SUCCESS)
}

fn verify(path: &Path, structure_only: bool) -> memtrack::Result<ExitCode> {
    let fail = |msg: String| {
        out(&format!("FAILED {}: {msg}\n", path.display()))?;
        Ok(ExitCode::FAILURE)
    };
    let reader = match Reader::open(path) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    if let Completeness::Recovered { reason } = reader.completeness() {
        return fail(reason.clone());
    }
    let totals = match analyse(&reader, "verifying") {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    if !stored_totals_agree(&reader, &totals) {
        return fail(
            "the totals stored in the trailer differ from the totals of the decoded events".into(),
        );
    }
    // A lossy recording is structurally sound but not whole: its numbers are not the
    // program's.
    let lost = reader.final_metadata().map_or(0, |f| f.lost_events);
    if lost > 0 && !structure_only {
        return fail(format!(
            "{} lost while recording (the ring buffer was full): the file is sound but the \
             recording is not whole; record again with a larger --ringbuf-mib, or pass \
             --structure-only to check the file's structure alone",
            human::plural(lost, "event was", "events were")
        ));
    }
    let uncovered = reader.final_metadata().and_then(processes::not_whole);
    if let Some(why) = &uncovered
        && !structure_only
    {
        return fail(format!(
            "{why}: the file is sound but the recording is not whole; pass --structure-only \
             to check the file's structure alone"
        ));
    }
    out(&format!(
        "OK {}: {} frames, {} events, checksums, counts, index and totals sound{}\n",
        path.display(),
        human::count(reader.frames().len() as u64),
        human::count(totals.events),
        if lost > 0 {
            format!(
                " (structure only: {} lost, the recording is not whole)",
                human::plural(lost, "event", "events")
            )
        } else if let Some(why) = uncovered {
            format!(" (structure only: {why}, the recording is not whole)")
        } else {
            String::new()
        }
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn synth(
    events: u64,
    seed: u64,
    threads: u32,
    stacks: bool,
    workers: Option<usize>,
    output: &Path,
) -> memtrack::Result<ExitCode> {
    let opts = SynthOptions { seed, threads };
    let model = if stacks {
        Synth::with_stacks(opts)
    } else {
        Synth::new(opts)
    };
    let meta = Metadata::now(model.pid(), Backend::Synth)
        .with_name(format!("synth seed={seed} threads={threads}"))
        .with_command(std::env::args().collect());
    let mut opts = EncoderOptions::new();
    if let Some(w) = workers {
        opts = opts.workers(w);
    }
    // A temporary file renamed over `output` when finished (see `Output`): an existing
    // artifact is only ever replaced by a complete one.
    let out = Output::create(output)?;
    let w = Encoder::new(out.writer()?, &meta, opts)
        .and_then(|mut enc| {
            for (id, m) in model.modules() {
                enc.define_module(*id, m.clone())?;
            }
            // Each stack defined just before the first event that names it, as a recorder does.
            let table = model.stacks().to_vec();
            let mut defined = vec![false; table.len() + 1];
            for ev in model.take(events as usize) {
                let id = ev.stack.0 as usize;
                if id != 0 && !defined[id] {
                    defined[id] = true;
                    let (sid, stack) = &table[id - 1];
                    enc.define_stack(*sid, stack.clone())?;
                }
                enc.push(ev)?;
            }
            enc.finish(0)
        })
        .map_err(|e| writing(e, out.path()))?;
    let written = out.commit()?;
    eprintln!(
        "memtrack: wrote {} events in {} frames to {} ({}, {:.2} bytes/event)",
        human::count(w.events),
        w.frames,
        written.display(),
        human::bytes(w.bytes),
        w.bytes as f64 / w.events.max(1) as f64
    );
    Ok(ExitCode::SUCCESS)
}

// ---- `memtrack record` (tracker) ----

/// The program `command` runs, as `execvp` finds it.
fn find_program(command: &[std::ffi::OsString]) -> Option<PathBuf> {
    let program = Path::new(command.first()?);
    if program.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Whether `output` and the program `command` runs are the same file (`-o ./prog -- ./prog`).
fn is_the_program(output: &Path, command: &[std::ffi::OsString]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(out), Some(program)) = (std::fs::metadata(output), find_program(command)) else {
        return false;
    };
    std::fs::metadata(program).is_ok_and(|m| (m.dev(), m.ino()) == (out.dev(), out.ino()))
}

fn record(
    output: &Path,
    user: Option<String>,
    ringbuf_mib: u64,
    (syscalls, raw_syscalls): (bool, bool),
    (follow, lock_waits): (bool, bool),
    stack_depth: u32,
    command: &[std::ffi::OsString],
) -> memtrack::Result<ExitCode> {
    if is_the_program(output, command) {
        return Err(memtrack::Error::InvalidOption(format!(
            "-o {} is the program being recorded: choose another output file",
            output.display()
        )));
    }
    let opts = memtrack::tracker::TrackerOptions::new()
        .ringbuf_bytes(ringbuf_mib.saturating_mul(1 << 20))
        .syscalls(syscalls)
        .raw_syscalls(raw_syscalls)
        .stack_depth(stack_depth);
    // SAFETY: geteuid has no preconditions.
    let runs_as_root = unsafe { libc::geteuid() } == 0 && user.is_none();
    if let Some(p) = find_program(command)
        && !runs_as_root
        && std::fs::metadata(&p).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & (libc::S_ISUID | libc::S_ISGID) != 0
        })
    {
        eprintln!(
            "memtrack: warning: {} is setuid or setgid: the recorded command runs with \
             no_new_privs and gains no privileges from it (memtrack never lets a command it \
             records gain privileges); `sudo memtrack record` without --user runs it as root",
            p.display()
        );
    }
    let mut child = memtrack::tracker::CommandOptions::new()
        .follow(follow)
        .lock_waits(lock_waits);
    if let Some(u) = user {
        child = child.user(u);
    }
    // A temporary file beside `output`, renamed over it only once the recording is complete:
    // a bad option, a command that cannot start or an interrupted run leave an existing
    // artifact as it was. A memtrack killed meanwhile leaves the frames it wrote in
    // `<output>.XXXXXX.partial`.
    let file = Output::create(output)?;
    let out = memtrack::tracker::record_command_with(command, file.writer()?, &opts, &child)
        .map_err(|e| writing(e, file.path()))?;
    let written = file.commit()?;
    let t = &out.recorded.written.totals;
    eprintln!(
        "memtrack: {}, {} allocated in total; peak live heap {}; still live at the end: {} \
         ({}); {} lost -> {}",
        human::plural(t.allocations, "allocation", "allocations"),
        human::bytes(t.bytes_allocated),
        human::bytes(t.peak_live_bytes),
        human::plural(t.live_blocks_at_end, "block", "blocks"),
        human::bytes(t.live_bytes_at_end),
        human::plural(out.recorded.lost_events, "event", "events"),
        written.display()
    );
    if let Some(note) = human::short_stacks_note(
        out.recorded.short_stacks,
        out.recorded.short_stacks_in_libc,
        t.allocations,
    ) {
        eprintln!("memtrack: {note}");
    }
    if t.blocks_discarded_at_exec > 0 {
        eprintln!(
            "memtrack: {} ({}) were still live when the program replaced its image (exec): \
             counted as discarded at exec, not as live at the end",
            human::plural(t.blocks_discarded_at_exec, "block", "blocks"),
            human::bytes(t.bytes_discarded_at_exec)
        );
    }
    if out.recorded.lost_events > 0 {
        eprintln!(
            "memtrack: warning: {} events were lost because the {ringbuf_mib} MiB ring buffer \
             was full: the totals are incomplete; rerun with a larger --ringbuf-mib",
            human::count(out.recorded.lost_events)
        );
    }
    // Which processes were covered: always when following (the tree may be one process),
    // and whenever some were not.
    let table = processes::table(
        &out.processes,
        out.unfollowed_processes,
        &out.recorded.written.per_process,
    );
    if !out.processes.is_empty() {
        eprintln!(
            "memtrack: {} recorded, each from its first instruction:",
            human::plural(out.processes.len() as u64, "process", "processes")
        );
    }
    eprint!("{table}");
    let uncovered = out
        .processes
        .iter()
        .filter(|p| p.uncovered.is_some())
        .count() as u64
        + out.unfollowed_processes;
    if uncovered > 0 {
        eprintln!(
            "memtrack: warning: {} not covered: the totals are not the whole command's, and the file is refused as a baseline (verify and compare fail)",
            human::plural(uncovered, "process was", "processes were")
        );
    }
    Ok(ExitCode::from(u8::try_from(out.exit_code).unwrap_or(1)))
}
