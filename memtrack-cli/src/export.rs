//! `memtrack export FILE --format dhat|pprof|folded|firefox -o OUT`: the call sites in the
//! formats of the tools people already open. Each is a rendering of one
//! [`CallSites`] (pprof's is in [`crate::pprof`]). Every format keeps each stack whole, the
//! allocator's own frames included (the flame graph and `show --top` hide those).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fxprof_processed_profile as fx;
use memtrack::{
    analysis::SiteOrder, artifact::Output, artifact::Reader, event::EventKind, human,
    stack::StackId,
};
use serde_json::json;

use crate::callsites::{CallSites, Class, NO_STACK, locations, site_order};

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Valgrind DHAT's JSON (heap mode), for DHAT's viewer `dh_view.html`.
    Dhat,
    /// A gzipped pprof `profile.proto` with Go heap profiles' four sample types.
    Pprof,
    /// Folded stacks, `root;…;leaf weight` per line, weighted by `--metric`.
    Folded,
    /// The Firefox Profiler's processed format: allocations and frees over time.
    Firefox,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The artifact.
    file: PathBuf,
    /// The format.
    #[arg(long, value_enum)]
    format: Format,
    /// Output file.
    #[arg(short, long)]
    output: PathBuf,
    /// What a site weighs in the folded stacks (the other formats carry every number).
    #[arg(long, value_parser = site_order(), default_value = "bytes")]
    metric: SiteOrder,
    /// With `--format folded`: the lock waits (a recording made with `record --locks`)
    /// instead of the allocations, weighted by the microseconds waited (the stacks
    /// `flamegraph --locks` draws).
    #[arg(long, conflicts_with = "metric")]
    locks: bool,
    /// With `--locks`: the classes of lock waits written (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',', requires = "locks")]
    class: Vec<crate::locks::LockClass>,
}

/// Writes the call sites, or with `--locks` the lock waits, in the format asked for.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    match (args.locks, args.format) {
        (true, Format::Folded) => {
            run_locks(&args.file, &args.output, crate::lock_classes(&args.class))
        }
        (true, _) => Err(crate::error::Error::Usage(
            "--locks exports the lock waits as folded stacks only: use --format folded \
             (the other formats are of the allocations)"
                .into(),
        )),
        (false, _) => run_sites(&args.file, args.format, &args.output, args.metric),
    }
}

/// Reads `file` and writes it in `format` to `output`.
fn run_sites(
    file: &Path,
    format: Format,
    output: &Path,
    metric: SiteOrder,
) -> crate::error::Result<ExitCode> {
    let reader = Reader::open(file)?;
    let out = Output::create(output)?;
    let mut cs = CallSites::read(&reader, file, "reading call sites")?;
    let io = |what: &str, e: std::io::Error| memtrack::Error::Io {
        what: format!("{what} {}", out.path().display()),
        source: e,
    };
    let mut w = std::io::BufWriter::new(out.writer()?);
    match format {
        Format::Dhat => {
            serde_json::to_writer(&mut w, &dhat(&cs)).map_err(|e| io("writing", e.into()))?
        }
        Format::Pprof => crate::pprof::write(&cs, &mut w).map_err(|e| io("writing", e))?,
        Format::Folded => {
            write_lines(&mut w, &cs.folded(metric, false)).map_err(|e| io("writing", e))?
        }
        Format::Firefox => {
            if let Some(warning) = firefox_memory_warning(reader.event_count()) {
                eprintln!("memtrack: warning: {warning}");
            }
            let profile = firefox(&reader, &mut cs)?;
            serde_json::to_writer(&mut w, &profile).map_err(|e| io("writing", e.into()))?;
        }
    }
    w.flush().map_err(|e| io("writing", e))?;
    drop(w);
    let written = out.commit()?;
    eprintln!(
        "memtrack: wrote {} ({} call sites)",
        written.display(),
        human::count(cs.call_sites.len() as u64)
    );
    Ok(ExitCode::SUCCESS)
}

/// Reads the lock waits of `file` and writes the folded stacks of its contended call sites of
/// `classes` to `output` (see [`crate::locks::folded`]), refused as `memtrack locks` refuses a
/// recording.
fn run_locks(
    file: &Path,
    output: &Path,
    classes: &[crate::locks::LockClass],
) -> crate::error::Result<ExitCode> {
    let waits = crate::locks::read(file)?;
    let out = Output::create(output)?;
    let lines = crate::locks::folded(&waits, classes);
    let mut w = std::io::BufWriter::new(out.writer()?);
    write_lines(&mut w, &lines).map_err(|e| memtrack::Error::Io {
        what: format!("writing {}", out.path().display()),
        source: e,
    })?;
    drop(w);
    let written = out.commit()?;
    eprintln!(
        "memtrack: wrote {} ({} contended call sites, µs waited)",
        written.display(),
        human::count(lines.len() as u64)
    );
    Ok(ExitCode::SUCCESS)
}

/// Folded stacks, one per line, flushed.
fn write_lines(w: &mut impl Write, lines: &[String]) -> std::io::Result<()> {
    for line in lines {
        writeln!(w, "{line}")?;
    }
    w.flush()
}

/// Valgrind DHAT's JSON, `dhatFileVersion` 2, heap mode, block lifetimes but no access counts
/// (`bklt` true, `bkacc` false: memtrack does not see reads and writes), times in µs from the
/// first event. The fields as valgrind's dh_main.c writes them and dh_view.js reads them: per
/// program point `tb`/`tbk` total bytes/blocks, `tl` their lifetimes summed, `mb`/`mbk` the
/// most live at once, `gb`/`gbk` live at the global peak, `eb`/`ebk` live at the end, `fs` its
/// frames (indices into `ftbl`, innermost first, `ftbl[0]` is `"[root]"`).
pub fn dhat(cs: &CallSites) -> serde_json::Value {
    let mut ftbl: Vec<String> = vec!["[root]".to_string()];
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut frame = |s: String| {
        *index.entry(s.clone()).or_insert_with(|| {
            ftbl.push(s);
            ftbl.len() - 1
        })
    };
    let us = |ns: u128| (ns / 1000) as u64;
    let fss: Vec<Vec<usize>> = cs
        .call_sites
        .iter()
        .map(|c| {
            if c.locations.is_empty() {
                return vec![frame(NO_STACK.to_string())];
            }
            c.locations
                .iter()
                .flat_map(|l| l.frames.iter().map(move |f| (l.offset, f)))
                .map(|(off, f)| match f.is_resolved() {
                    true => frame(format!("{off:#x}: {f}")),
                    false => frame(f.to_string()),
                })
                .collect()
        })
        .collect();
    // DHAT's program points have distinct frames (its viewer refuses a repeated one), but two
    // recorded stacks can read the same (the same frames, one cut at the depth cap): those
    // get their stack id as an outermost frame rather than numbers merged (a sum of their
    // maxima would not be the maximum of their sum).
    let mut seen: HashMap<&[usize], u32> = HashMap::new();
    for fs in &fss {
        *seen.entry(fs).or_default() += 1;
    }
    let repeated: Vec<bool> = fss.iter().map(|fs| seen[fs.as_slice()] > 1).collect();
    let pps: Vec<serde_json::Value> = cs
        .call_sites
        .iter()
        .zip(fss.clone())
        .zip(repeated)
        .map(|((c, mut fs), repeated)| {
            if repeated {
                fs.push(frame(format!("[recorded stack {}]", c.site.stack.0)));
            }
            let s = &c.site;
            json!({
                "tb": s.bytes, "tbk": s.blocks, "tl": us(s.lifetimes_ns),
                "mb": s.max_bytes, "mbk": s.max_blocks,
                "gb": s.bytes_at_peak, "gbk": s.blocks_at_peak,
                "eb": s.bytes_at_end, "ebk": s.blocks_at_end,
                "fs": fs,
            })
        })
        .collect();
    let since = |ts: u64| us(u128::from(ts.saturating_sub(cs.first_ts)));
    json!({
        "dhatFileVersion": 2,
        "mode": "heap",
        "verb": "Allocated",
        "bklt": true,
        "bkacc": false,
        "tu": "µs",
        "Mtu": "s",
        "tuth": 10,
        "cmd": if cs.command.is_empty() { cs.name.clone() } else { cs.command.clone() },
        "pid": cs.pid,
        "te": since(cs.last_ts),
        "tg": since(cs.sites.peak_ts.max(cs.first_ts)),
        "pps": pps,
        "ftbl": ftbl,
    })
}

/// Memory the Firefox profile takes per event while it is built (fxprof-processed-profile
/// keeps every sample until the profile is serialized whole): measured with
/// `/usr/bin/time -v` on `synth` artifacts, against `--format folded` of the same file.
const FIREFOX_BYTES_PER_EVENT: u64 = 40;

/// Above this, exporting to the Firefox format says how much memory it will take.
const FIREFOX_WARN_BYTES: u64 = 256 << 20;

/// The warning for a Firefox export of `events` events, when its profile will take more than
/// [`FIREFOX_WARN_BYTES`] of memory.
fn firefox_memory_warning(events: u64) -> Option<String> {
    let bytes = events.saturating_mul(FIREFOX_BYTES_PER_EVENT);
    (bytes > FIREFOX_WARN_BYTES).then(|| {
        format!(
            "the Firefox profile of {} events is built in memory before it is written: about {} \
             (pprof, dhat and folded hold one entry per call site)",
            human::count(events),
            human::bytes(bytes)
        )
    })
}

/// The Firefox Profiler's processed profile: per process, every allocation as an allocation
/// sample (its time, stack, address and size) and every free as one of negative size at the
/// same address, so that the profiler's "retained memory" view shows what is live; all on one
/// thread per process, as the profiler keeps them. A second
/// pass over the events; the frees' stacks (when recorded) are symbolized as they come.
pub fn firefox(reader: &Reader, cs: &mut CallSites) -> crate::error::Result<fx::Profile> {
    let t0 = cs.first_ts;
    let (mut p, cats) = fx_profile(reader, cs);
    let ts = |t: u64| fx::Timestamp::from_nanos_since_reference(t.saturating_sub(t0));
    let mut processes: HashMap<u32, fx::ThreadHandle> = HashMap::new();
    let mut stacks: HashMap<(fx::ThreadHandle, StackId), Option<fx::StackHandle>> = HashMap::new();
    // Per process: live block address -> size, for the frees' sizes.
    let mut heaps: HashMap<u32, HashMap<u64, u64>> = HashMap::new();
    let table = reader.stacks()?;
    // In order on this thread: the symbolizer (blazesym's caches) is not Send.
    let mut evs = Vec::new();
    for frame in 0..reader.frames().len() {
        evs.clear();
        reader.decode_frame(frame, &mut evs)?;
        for e in &evs {
            // One thread per process carries its allocation samples: the profiler keeps them
            // on a process's first thread whichever thread allocated (its retained-memory
            // view pairs a free with its allocation there), and a sample's stack must be of
            // the thread that holds it (fxprof-processed-profile 0.8 keeps the index as is).
            let thread = *processes.entry(e.pid).or_insert_with(|| {
                let name = format!("{} ({})", cs.name, e.pid);
                let h = p.add_process(&name, e.pid, ts(e.ts));
                let t = p.add_thread(h, e.pid, ts(e.ts), true);
                p.set_thread_name(t, &format!("allocations of process {}", e.pid));
                t
            });
            let heap = heaps.entry(e.pid).or_default();
            if matches!(e.kind, EventKind::Exec) {
                // The image's blocks are gone: freed, for the retained-memory view.
                for (addr, size) in heap.drain() {
                    p.add_allocation_sample(thread, ts(e.ts), None, addr, -(size as i64));
                }
                continue;
            }
            let h = e.kind.heap();
            if h.freed.is_none() && h.allocated.is_none() {
                continue;
            }
            let stack = match stacks.get(&(thread, e.stack)) {
                Some(s) => *s,
                None => {
                    let recorded = match e.stack.is_none() {
                        true => None,
                        false => Some(reader.stack(e.stack)?),
                    };
                    let s = fx_stack(&mut p, thread, &cats, cs, recorded, e.stack, table);
                    stacks.insert((thread, e.stack), s);
                    s
                }
            };
            if let Some(addr) = h.freed
                && let Some(size) = heap.remove(&addr)
            {
                p.add_allocation_sample(thread, ts(e.ts), stack, addr, -(size as i64));
            }
            if let Some((addr, size)) = h.allocated {
                if let Some(old) = heap.insert(addr, size) {
                    // A block at an address already live: its free was not seen.
                    p.add_allocation_sample(thread, ts(e.ts), None, addr, -(old as i64));
                }
                p.add_allocation_sample(thread, ts(e.ts), stack, addr, size as i64);
            }
        }
    }
    Ok(p)
}

/// A profile of no samples yet, its time reckoned from `cs`'s first event, with one
/// category per class of frame.
fn fx_profile(
    reader: &Reader,
    cs: &CallSites,
) -> (fx::Profile, HashMap<Class, fx::CategoryPairHandle>) {
    let meta = reader.metadata();
    // The wall-clock time of the first event: the recording's start plus the monotonic time
    // since.
    let start_ns = meta
        .start_unix_ns
        .saturating_add(cs.first_ts.saturating_sub(meta.start_monotonic_ns));
    let mut p = fx::Profile::new(
        &cs.name,
        fx::ReferenceTimestamp::from_millis_since_unix_epoch(start_ns as f64 / 1e6),
        fx::SamplingInterval::from_millis(1),
    );
    p.set_symbolicated(true);
    let cats = [
        (Class::User, "The program", fx::CategoryColor::Orange),
        (Class::Std, "Rust std", fx::CategoryColor::Yellow),
        (Class::Libc, "libc and ld.so", fx::CategoryColor::Blue),
        (Class::Other, "Other libraries", fx::CategoryColor::Green),
    ]
    .into_iter()
    .map(|(c, name, colour)| (c, p.add_category(name, colour).into()))
    .collect();
    (p, cats)
}

/// The profile's stack of `id` on `thread`: the site's symbolized frames if it allocated,
/// else symbolized now; `[no stack]` for an event without one.
fn fx_stack(
    p: &mut fx::Profile,
    thread: fx::ThreadHandle,
    cats: &HashMap<Class, fx::CategoryPairHandle>,
    cs: &mut CallSites,
    recorded: Option<&memtrack::stack::Stack>,
    id: StackId,
    table: &memtrack::artifact::StackTable,
) -> Option<fx::StackHandle> {
    let names: Vec<(String, Class)> = match (cs.site(id), recorded) {
        (Some(site), _) => site.names(false),
        (None, Some(stack)) => {
            let frames = cs
                .symbolizer
                .symbolize_stacks(&[stack], |m| table.module(m))
                .pop()
                .unwrap_or_default();
            let site = crate::callsites::CallSite {
                site: memtrack::analysis::Site::default(),
                locations: locations(stack, frames, |m| table.module(m).map(|m| &m.path)),
                truncated: stack.truncated,
            };
            site.names(false)
        }
        (None, None) => vec![(NO_STACK.to_string(), Class::Other)],
    };
    let frames: Vec<fx::FrameInfo> = names
        .into_iter()
        .map(|(name, class)| fx::FrameInfo {
            frame: fx::Frame::Label(p.intern_string(&name)),
            category_pair: cats[&class],
            flags: fx::FrameFlags::empty(),
        })
        .collect();
    p.intern_stack_frames(thread, frames.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large Firefox export says, before it starts, how much memory it will take.
    #[test]
    fn a_large_firefox_export_warns_with_its_size() {
        assert_eq!(firefox_memory_warning(1_000_000), None);
        assert_eq!(
            firefox_memory_warning(8_000_000).as_deref(),
            Some(
                "the Firefox profile of 8,000,000 events is built in memory before it is \
                 written: about 305.2 MiB (pprof, dhat and folded hold one entry per call site)"
            )
        );
    }
}
