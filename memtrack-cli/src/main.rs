//! The `memtrack` command-line tool. Run `memtrack --help`.
//!
//! One module per command: its clap `Args` and its `run`. This file holds the command enum
//! and the helpers several commands share.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use error::{Codes, Error};
use memtrack::{analysis::Analyzer, artifact::Completeness, artifact::Reader, totals::Totals};

mod bench;
mod callsites;
mod compare;
mod error;
mod export;
mod flamegraph;
mod locks;
mod plot;
mod pprof;
mod processes;
mod progress;
mod record;
mod show;
mod synth;
mod tables;
mod verify;
mod whole;

#[derive(Parser)]
#[command(
    name = "memtrack",
    version,
    about = "Exact memory profiling of Rust benchmarks: record, compare, gate in CI, draw"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Each command's first paragraph is its one line in `memtrack --help`; the whole text is its
// own `--help`.
#[derive(Subcommand)]
enum Cmd {
    /// Print a recording's totals, sizes, threads and top call sites.
    ///
    /// Metadata, totals (per iteration when the recording knows its iterations), size classes,
    /// processes; with --threads the per-thread table, with --top N the call sites that
    /// allocated most, each with its stack.
    Show(show::Args),
    /// Check that a recording is sound and whole.
    ///
    /// Decodes every frame and checks checksums, counts and the trailer: exit 0 only if all is
    /// sound and the recording is whole (no lost events, no process left uncovered), else exit
    /// 1 naming the first problem.
    Verify(verify::Args),
    /// Compare recordings per benchmark; exit 1 when one grew past the threshold.
    ///
    /// Compares allocations, bytes and peak between two artifacts or two directories of
    /// `*.memtrack` artifacts (matched by benchmark name), per iteration when they know their
    /// iterations, with the call sites behind each regression when both have call stacks.
    /// Exit 0: no metric grew past the threshold; 1: a regression; 2: bad usage or an input
    /// refused (corrupt, not finished, lost events, processes not covered).
    Compare(compare::Args),
    /// Run a memtrack-criterion suite in memory mode; with --base REF, compare it with REF.
    ///
    /// Builds the suite with `--cfg memtrack_bench` in a target directory of its own, runs it
    /// (`-- <cargo bench args>`) and prints each benchmark's allocations, bytes, peak and live
    /// blocks per iteration. With `--base REF`: runs it at REF too, in a git worktree, and
    /// compares as `compare` does (exit 1 on a regression, 2 if a build, a run or an input
    /// failed). With `--measure time --base REF`: criterion's own timings of both sides, run
    /// in alternating order (base, head, head, base), a change called only beyond the
    /// threshold with the two sides' ranges apart (exit 1 on it only with `--gate time`). With
    /// `--measure all --base REF`: time, instructions and memory of both sides, one triage
    /// table with a class per benchmark (more allocation, more work, layout or noise, faster,
    /// unchanged) and what grew under each regression.
    Bench(bench::Args),
    /// Draw live heap bytes over time as an SVG.
    ///
    /// Live heap bytes over time on a scale of their own, the peak marked with `show`'s number
    /// and where each recorded call begins; mapped bytes on a panel and scale of their own
    /// below, when the recording has any.
    Plot(plot::Args),
    /// Draw the call sites as a flame graph SVG (--diff: what changed; --locks: lock waits).
    ///
    /// An interactive SVG (search, zoom, tooltips), each frame as wide as its share of the
    /// metric, coloured by whose code it is (the program, Rust std, libc and ld.so, other
    /// libraries), the allocator's own frames at the top of each stack hidden
    /// (--no-trim-allocator keeps them). Needs a recording with call stacks. With `--diff BASE
    /// HEAD`: a differential flame graph of HEAD (growth red, shrink blue, no change white),
    /// frames matched by function and source file; exit 2 if an input is refused (no call
    /// stacks, incomplete, lost events, processes not covered). With `--locks`: the lock waits
    /// of a recording made with `record --locks` instead, each contended call site (the code
    /// that wanted the lock) as wide as the time waited there.
    Flamegraph(flamegraph::Args),
    /// Write the call sites for DHAT's viewer, pprof, folded stacks or the Firefox Profiler.
    ///
    /// Valgrind DHAT's JSON (dh_view.html), pprof's gzipped profile.proto (Go heap profile
    /// sample types), folded stacks (flamegraph.pl, inferno, speedscope) or the Firefox
    /// Profiler's processed format (allocations over time). Needs a recording with call
    /// stacks.
    Export(export::Args),
    /// Write a seeded model recording, to try the tools without privileges.
    ///
    /// An artifact from a seeded model of a multi-threaded program's allocations: the same
    /// seed gives the same recording.
    Synth(synth::Args),
    /// Run a command and record its allocations, and those of the processes it starts.
    ///
    /// Records every allocation, free and mapping with the eBPF tracker (needs root, or
    /// CAP_BPF + CAP_PERFMON). Exits with the command's exit code (128+N if signal N ended
    /// it); 127 if the command is not found, 126 if it cannot be executed, 2 for bad usage,
    /// 125 if memtrack itself failed. The command never gets memtrack's capabilities, and when
    /// it does not run as root a setuid program it starts gains no privileges (no_new_privs).
    Record(record::Args),
    /// Print lock waits per thread and the contended call sites (`record --locks`).
    ///
    /// Per thread, the time off the CPU by why (mutex, rwlock, condvar, glibc lock, other
    /// futex, I/O, sleep, other, preempted) and on it, then the call sites that waited longest
    /// for a lock (`flamegraph --locks` draws them, `export --format folded --locks` writes
    /// them). Also reads sessions made with `SessionBuilder::lock_waits`. A recording that
    /// lost events is refused.
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
        e.report();
        return ExitCode::from(e.exit_code(Codes::Plain));
    }
    let cli = Cli::parse();
    let codes = match &cli.cmd {
        Cmd::Compare(_) | Cmd::Bench(_) => Codes::Gate,
        Cmd::Flamegraph(a) if a.diff.is_some() => Codes::Gate,
        Cmd::Record(_) => Codes::Record,
        _ => Codes::Plain,
    };
    let res = match cli.cmd {
        Cmd::Show(a) => show::run(a),
        Cmd::Verify(a) => verify::run(a),
        Cmd::Compare(a) => compare::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Plot(a) => plot::run(a),
        Cmd::Flamegraph(a) => flamegraph::run(a),
        Cmd::Export(a) => export::run(a),
        Cmd::Synth(a) => synth::run(a),
        Cmd::Record(a) => record::run(a),
        Cmd::Locks { file, json, top } => locks::run(&file, json, top),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            e.report();
            ExitCode::from(e.exit_code(codes))
        }
    }
}

/// `--class`'s classes, all of them when none is given.
pub(crate) fn lock_classes(class: &[locks::LockClass]) -> &[locks::LockClass] {
    match class {
        [] => &locks::LockClass::ALL,
        some => some,
    }
}

/// Refuses to run with a real and an effective identity that differ (memtrack installed
/// setuid or setgid): every user could then write any file and run any command as its owner.
fn refuse_setuid() -> Result<(), Error> {
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
    Err(Error::Setuid {
        ruid,
        euid,
        rgid,
        egid,
    })
}

/// Writes `text` to standard output and flushes it, its control characters but line breaks
/// escaped (names from artifacts reach every human output; JSON has none of its own). A
/// closed pipe (`| head`) ends memtrack quietly by SIGPIPE, as it does other Unix tools; any
/// other failure (`> /dev/full`) is an error.
pub(crate) fn out(text: &str) -> error::Result<()> {
    let text = memtrack::human::terminal(text);
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
            }
            .into())
        }
        Err(e) => Err(memtrack::Error::Io {
            what: "writing to standard output".into(),
            source: e,
        }
        .into()),
    }
}

/// `e` with the output file named, for errors of an encoder writing to `path`.
pub(crate) fn writing(e: impl Into<memtrack::Error>, path: &Path) -> memtrack::Error {
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

/// The directory beside an artifact where `memtrack bench` keeps a copy of each executable it
/// recorded, named by build id, so that the artifact's frames stay named after a rebuild.
pub(crate) const BUILD_IDS: &str = ".build-id";

/// A symbolizer for the artifacts `readers` read, which also looks for their executables in
/// the [`BUILD_IDS`] directory beside each and in the one above it.
pub(crate) fn symbolizer(readers: &[&Reader]) -> memtrack::symbolize::Symbolizer {
    symbolizer_of(readers.iter().map(|r| r.path()))
}

/// [`symbolizer`] for the artifacts at `paths`.
pub(crate) fn symbolizer_of<'p>(
    paths: impl IntoIterator<Item = &'p Path>,
) -> memtrack::symbolize::Symbolizer {
    // Beside the artifact, and above it: `bench --base` and `--chain` keep one store in
    // `--out` for the artifacts of every side and commit in its subdirectories.
    let mut dirs: Vec<PathBuf> = paths
        .into_iter()
        .flat_map(|p| {
            let dir = p.parent().unwrap_or(Path::new("."));
            [Some(dir), dir.parent()].into_iter().flatten()
        })
        .map(|d| d.join(BUILD_IDS))
        .filter(|d| d.is_dir())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs.into_iter().fold(
        memtrack::symbolize::Symbolizer::new(),
        memtrack::symbolize::Symbolizer::with_build_ids,
    )
}

/// Decodes every frame (in parallel, in order) and computes the totals, with a progress bar
/// labelled `what` on a terminal.
pub(crate) fn analyse(reader: &Reader, what: &str) -> error::Result<Totals> {
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
pub(crate) fn stored_totals_agree(reader: &Reader, decoded: &Totals) -> bool {
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

pub(crate) fn warn_if_recovered(reader: &Reader) -> bool {
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
