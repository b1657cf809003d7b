//! `memtrack record -- COMMAND`: runs a command with its allocations, frees and mappings
//! recorded by the eBPF tracker.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::{artifact::Output, human};

use crate::error::Error;
use crate::{processes, writing};

#[derive(clap::Args)]
pub(crate) struct Args {
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
    /// syscall of every process on the machine while recording (see the guide's record page).
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
}

/// `--ringbuf-mib`: a power of two from 1 to 1024, in MiB (the unit the user typed).
fn ringbuf_mib(s: &str) -> Result<u64, Error> {
    match s.parse::<u64>() {
        Ok(n) if n.is_power_of_two() && n <= 1024 => Ok(n),
        _ => Err(Error::Usage(format!(
            "expected a power of two from 1 to 1024 (MiB), got {s:?}"
        ))),
    }
}

/// `--stack-depth`: 0 to 127 frames (the kernel's `perf_event_max_stack`).
fn stack_depth(s: &str) -> Result<u32, Error> {
    match s.parse::<u32>() {
        Ok(n) if n <= 127 => Ok(n),
        _ => Err(Error::Usage(format!(
            "expected a number of frames from 0 (no stacks) to 127, got {s:?}"
        ))),
    }
}

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

/// Records `args.command` into `args.output` and exits with the command's exit code; see
/// [`Codes::Record`](crate::error::Codes::Record) for memtrack's own failures.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    if is_the_program(&args.output, &args.command) {
        return Err(Error::Usage(format!(
            "-o {} is the program being recorded: choose another output file",
            args.output.display()
        )));
    }
    let opts = memtrack::tracker::TrackerOptions::new()
        .ringbuf_bytes(args.ringbuf_mib.saturating_mul(1 << 20))
        .syscalls(!args.no_syscalls)
        .raw_syscalls(args.raw_syscalls)
        .stack_depth(args.stack_depth);
    warn_if_setuid(&args);
    let mut child = memtrack::tracker::CommandOptions::new()
        .follow(!args.no_follow)
        .lock_waits(args.locks);
    if let Some(u) = args.user {
        child = child.user(u);
    }
    // A temporary file beside `output`, renamed over it only once the recording is complete:
    // a bad option, a command that cannot start or an interrupted run leave an existing
    // artifact as it was. A memtrack killed meanwhile leaves the frames it wrote in
    // `<output>.XXXXXX.partial`.
    let file = Output::create(&args.output)?;
    let out = memtrack::tracker::record_command_with(&args.command, file.writer()?, &opts, &child)
        .map_err(|e| writing(e, file.path()))?;
    let written = file.commit()?;
    summarize(&out, &written, args.ringbuf_mib);
    // What this kernel's older ways cost, if it lacks a feature (the tracker ran, so the
    // probes had the privileges they need).
    for note in memtrack::tracker::Kernel::get().notes(args.locks) {
        eprintln!("memtrack: {note}");
    }
    report_processes(&out);
    Ok(ExitCode::from(u8::try_from(out.exit_code).unwrap_or(1)))
}

/// Warns that a setuid or setgid program gains nothing when the command does not run as root.
fn warn_if_setuid(args: &Args) {
    // SAFETY: geteuid has no preconditions.
    let runs_as_root = unsafe { libc::geteuid() } == 0 && args.user.is_none();
    if let Some(p) = find_program(&args.command)
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
}

/// The totals line on stderr, then notes on short stacks, blocks discarded at exec and lost
/// events.
fn summarize(out: &memtrack::tracker::RecordOutcome, written: &Path, ringbuf_mib: u64) {
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
            "memtrack: warning: {}: the {ringbuf_mib} MiB ring buffer was too small and the \
             totals are incomplete; rerun with a larger --ringbuf-mib",
            crate::whole::lost(out.recorded.lost_events)
        );
    }
}

/// Which processes were covered: always when following (the tree may be one process), and
/// whenever some were not.
fn report_processes(out: &memtrack::tracker::RecordOutcome) {
    let table = processes::table(
        &out.processes,
        out.recorded.unfollowed_processes,
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
        + out.recorded.unfollowed_processes;
    if uncovered > 0 {
        eprintln!(
            "memtrack: warning: {} not covered: the totals are not the whole command's, and the file is refused as a baseline (verify and compare fail)",
            human::plural(uncovered, "process was", "processes were")
        );
    }
}
