//! The parts of a recording of calls that calls of other names interrupted, and their joining:
//! each part is a finished artifact not yet in place; when the recording finishes, the parts
//! become one artifact (the name's), as if the recording had paused between them.
//!
//! ```text
//!   a(); a(); b(); a();   ─▶ a: part 1 (2 calls) set aside │ b: open
//!                            b: part 1 (1 call) set aside  │ a: open again (part 2)
//!   finish ─▶ a.memtrack = part 1 + part 2 (3 calls), b.memtrack = part 1: one summary line each
//! ```
//! Joining re-encodes the parts' events in order into one file: module and stack tables become
//! one (identical definitions one id), each stack id of a part's events maps to the joined
//! table's, and the trailer's figures are the parts' summed. The writer's analysis runs again
//! over the joined events, so the totals, the peak and each call's figures are the same
//! computation as for a recording that never paused for another name.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use super::{Out, session_lock_waits};
use crate::artifact::{Final, FormatError, Output, ProcessInfo, Reader};
use crate::backend::Recorded;
use crate::encode::{EncodeError, Encoder, EncoderOptions};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::report::Report;
use crate::stack::{Module, ModuleId, Stack, StackId};

/// A finished part of a recording of calls, set aside until the recording finishes.
pub(crate) struct Part {
    pub(super) artifact: PartArtifact,
    /// Its report (its own calls, events and counts).
    pub(super) report: Report,
    pub(super) quiet: bool,
    pub(super) lock_waits: bool,
}

/// Where a part's finished artifact is: its temporary file beside the name's artifact (removed
/// when the part is dropped), or in memory (an in-memory session).
pub(crate) enum PartArtifact {
    File(Output),
    Memory(Arc<Mutex<Vec<u8>>>),
}

impl Part {
    /// Its artifact, read back whole; an error if it is not (it was finished by its session),
    /// or if it went to a device or a FIFO (one of `parts`).
    fn reader(&self, name: &str, parts: usize) -> Result<Reader> {
        let reader = match &self.artifact {
            PartArtifact::File(output) => {
                let Some(path) = output.partial_path() else {
                    return Err(Error::PartsWrittenInPlace {
                        name: name.to_string(),
                        path: output.path().to_path_buf(),
                        parts,
                    });
                };
                Reader::open(path)?
            }
            // Read once, by the join that consumes the part: the bytes are taken, not copied.
            PartArtifact::Memory(m) => Reader::from_bytes(std::mem::take(
                &mut *m.lock().unwrap_or_else(|e| e.into_inner()),
            ))?,
        };
        if reader.final_metadata().is_none() {
            return Err(FormatError::CorruptTrailer {
                path: reader.path().to_path_buf(),
                offset: reader.file_bytes(),
                problem: format!(
                    "{name}: a part of its recording of calls has no trailer, though its \
                     session finished it"
                ),
            }
            .into());
        }
        Ok(reader)
    }
}

/// The joined tables: each distinct module and stack once, with its id in the joined artifact.
#[derive(Default)]
struct Tables {
    modules: HashMap<Module, ModuleId>,
    stacks: HashMap<Stack, StackId>,
}

/// One part's ids mapped to the joined tables'.
#[derive(Default)]
struct PartIds {
    modules: HashMap<ModuleId, ModuleId>,
    stacks: HashMap<StackId, StackId>,
}

/// Joins the parts of `name`'s recording, in order, into one artifact (put in place at the
/// first part's target; or kept in memory, for in-memory sessions), and returns its report:
/// the joined analysis, the parts' counts summed, their calls as its iterations. Prints the
/// summary line unless the recording is quiet. If they cannot be joined, the parts' files are
/// kept, and the error names them.
pub(super) fn join(name: &str, parts: Vec<Part>) -> Result<Report> {
    let joined = join_parts(name, &parts);
    // Parts written in place have no files to keep.
    if matches!(joined, Ok(_) | Err(Error::PartsWrittenInPlace { .. })) {
        return joined;
    }
    let kept: Vec<_> = parts
        .into_iter()
        .filter_map(|p| match p.artifact {
            PartArtifact::File(output) => Some(output.keep()),
            PartArtifact::Memory(_) => None,
        })
        .collect();
    joined.map_err(|e| {
        if kept.is_empty() {
            return e;
        }
        Error::PartsNotJoined {
            name: name.to_string(),
            kept,
            source: Box::new(e),
        }
    })
}

fn join_parts(name: &str, parts: &[Part]) -> Result<Report> {
    let first = parts.first().expect("a recording has a part");
    let (quiet, lock_waits) = (first.quiet, first.lock_waits);
    let target = first.report.path.clone();
    let readers = parts
        .iter()
        .map(|p| p.reader(name, parts.len()))
        .collect::<Result<Vec<_>>>()?;
    let (output, out, memory) = match &target {
        Some(path) => {
            let output = Output::create(path)?;
            let file = output.writer()?;
            (Some(output), Out::File(file), None)
        }
        None => {
            let memory = Arc::new(Mutex::new(Vec::new()));
            (None, Out::Memory(Arc::clone(&memory)), Some(memory))
        }
    };
    let (written, stacks) = reencode(&readers, out)?;
    if let Some(output) = output {
        output.commit()?;
    }
    let reports: Vec<&Report> = parts.iter().map(|p| &p.report).collect();
    let sum = |f: fn(&Recorded) -> u64| reports.iter().map(|r| f(&r.recorded)).sum::<u64>();
    let recorded = Recorded {
        written,
        lost_events: sum(|r| r.lost_events),
        out_of_scope: sum(|r| r.out_of_scope),
        unfollowed_processes: sum(|r| r.unfollowed_processes),
        stacks,
        short_stacks: sum(|r| r.short_stacks),
        short_stacks_in_libc: sum(|r| r.short_stacks_in_libc),
        truncated_stacks: sum(|r| r.truncated_stacks),
        stack_collisions: sum(|r| r.stack_collisions),
        stacks_not_remembered: sum(|r| r.stacks_not_remembered),
    };
    let report = Report {
        name: name.to_string(),
        lock_waits: lock_waits.then(|| session_lock_waits(target.as_deref(), memory.as_deref())),
        path: target,
        duration: reports.iter().map(|r| r.duration).sum(),
        backend: first.report.backend,
        scope: first.report.scope,
        iterations: Some(reports.iter().filter_map(|r| r.iterations).sum()),
        recorded,
    };
    if !quiet {
        report.announce();
    }
    Ok(report)
}

/// Re-encodes every part's events, in order, into `out`, with one module and stack table;
/// returns what was written and the number of distinct stacks.
fn reencode(readers: &[Reader], out: Out) -> Result<(crate::encode::Written, u64)> {
    let finals: Vec<&Final> = readers.iter().filter_map(Reader::final_metadata).collect();
    let mut enc = Encoder::new(out, readers[0].metadata(), EncoderOptions::new())?;
    let mut tables = Tables::default();
    let mut events: Vec<Event> = Vec::new();
    for reader in readers {
        let mut ids = PartIds::default();
        for frame in 0..reader.frames().len() {
            define_frame(&mut enc, &mut tables, &mut ids, reader, frame)?;
            reader.decode_frame(frame, &mut events)?;
            for ev in &mut events {
                if ev.stack.is_none() {
                    continue;
                }
                let Some(&joined) = ids.stacks.get(&ev.stack) else {
                    return Err(FormatError::UndefinedStack {
                        path: reader.path().to_path_buf(),
                        stack: ev.stack.0,
                    }
                    .into());
                };
                ev.stack = joined;
            }
            enc.extend(events.drain(..))?;
        }
    }
    let sum = |f: fn(&Final) -> u64| finals.iter().map(|f2| f(f2)).sum::<u64>();
    if let Some(last) = finals.last() {
        enc.set_end_time(last.end_monotonic_ns);
    }
    let iterations = finals.iter().filter_map(|f| f.iterations).sum();
    enc.set_iterations(iterations);
    enc.set_short_stacks(sum(|f| f.short_stacks), sum(|f| f.short_stacks_in_libc));
    let mut processes: Vec<ProcessInfo> = Vec::new();
    for p in finals.iter().flat_map(|f| &f.processes) {
        if !processes.iter().any(|q| q.pid == p.pid) {
            processes.push(p.clone());
        }
    }
    enc.set_processes(processes, sum(|f| f.unfollowed_processes));
    let written = enc.finish(sum(|f| f.lost_events))?;
    Ok((written, tables.stacks.len() as u64))
}

/// Defines frame `frame`'s modules and stacks in the joined tables, mapping the part's ids.
fn define_frame(
    enc: &mut Encoder<Out>,
    tables: &mut Tables,
    ids: &mut PartIds,
    reader: &Reader,
    frame: usize,
) -> Result<()> {
    let defs = reader.frame_definitions(frame)?;
    for (id, module) in defs.modules {
        let joined = intern(&mut tables.modules, module, ModuleId, |id, m| {
            enc.define_module(id, m)
        })?;
        ids.modules.insert(id, joined);
    }
    for (id, mut stack) in defs.stacks {
        for f in stack
            .frames
            .iter_mut()
            .filter(|f| f.module != ModuleId::UNKNOWN)
        {
            let Some(&joined) = ids.modules.get(&f.module) else {
                return Err(FormatError::CorruptFrame {
                    path: reader.path().to_path_buf(),
                    frame: frame as u64,
                    offset: reader.frames()[frame].offset,
                    problem: format!(
                        "stack {} has a frame in module {}, which no frame defines",
                        id.0, f.module.0
                    ),
                }
                .into());
            };
            f.module = joined;
        }
        let joined = intern(&mut tables.stacks, stack, StackId, |id, s| {
            enc.define_stack(id, s)
        })?;
        ids.stacks.insert(id, joined);
    }
    Ok(())
}

/// The joined table's id of `key`: its id if the table has it, else the next one (ids from
/// 1), which `define` gives the encoder.
fn intern<K: Eq + Hash + Clone, I: Copy>(
    table: &mut HashMap<K, I>,
    key: K,
    id: fn(u32) -> I,
    define: impl FnOnce(I, K) -> std::result::Result<(), EncodeError>,
) -> Result<I> {
    if let Some(&known) = table.get(&key) {
        return Ok(known);
    }
    let next = id(table.len() as u32 + 1);
    table.insert(key.clone(), next);
    define(next, key)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::artifact::{Backend, Metadata};
    use crate::event::EventKind;
    use crate::scope::Scope;
    use crate::stack::Frame;

    fn module(path: &str) -> Module {
        Module {
            path: path.into(),
            build_id: None,
        }
    }

    fn stack(frames: &[(u32, u64)]) -> Stack {
        Stack {
            frames: frames
                .iter()
                .map(|&(m, offset)| Frame {
                    module: ModuleId(m),
                    offset,
                })
                .collect(),
            truncated: false,
        }
    }

    /// A part holding one call (its marks at `ts` and after): the allocations `allocs` (stack
    /// id, size), each freed before the call ends, with the part's own `modules` and `stacks`.
    fn part(
        target: &Path,
        ts: u64,
        modules: &[(u32, &str)],
        stacks: &[(u32, Stack)],
        allocs: &[(u32, u64)],
    ) -> Part {
        let output = Output::create(target).unwrap();
        let meta = Metadata::now(7, Backend::Alloc).with_name("joined");
        let mut enc = Encoder::new(output.writer().unwrap(), &meta, EncoderOptions::new()).unwrap();
        for (id, path) in modules {
            enc.define_module(ModuleId(*id), module(path)).unwrap();
        }
        for (id, s) in stacks {
            enc.define_stack(StackId(*id), s.clone()).unwrap();
        }
        let ev = |t: u64, kind| Event::new(ts + t, 7, 7, kind);
        enc.push(ev(0, EventKind::IterationStart)).unwrap();
        for (i, &(id, size)) in allocs.iter().enumerate() {
            let (t, addr) = (2 * i as u64 + 1, 0x1000 * (i as u64 + 1));
            enc.push(ev(t, EventKind::Malloc { addr, size }).with_stack(StackId(id)))
                .unwrap();
            enc.push(ev(t + 1, EventKind::Free { addr })).unwrap();
        }
        enc.push(ev(99, EventKind::IterationEnd)).unwrap();
        enc.set_iterations(1);
        let written = enc.finish(0).unwrap();
        let mut recorded = Recorded::of_totals(written.totals.clone());
        recorded.written = written;
        let report = Report {
            name: "joined".into(),
            path: Some(output.path().to_path_buf()),
            duration: std::time::Duration::from_millis(1),
            backend: Backend::Alloc,
            scope: Scope::default(),
            iterations: Some(1),
            recorded,
            lock_waits: None,
        };
        Part {
            artifact: PartArtifact::File(output),
            report,
            quiet: true,
            lock_waits: false,
        }
    }

    /// Two parts with their own ids for the same module and the same stack: the joined
    /// artifact has each once, every event's stack is the one it named in its part, and the
    /// figures are both calls'.
    #[test]
    fn parts_join_into_one_artifact_with_one_table() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("joined.memtrack");
        let a = part(
            &target,
            100,
            &[(1, "/bin/app")],
            &[(1, stack(&[(1, 0x10)])), (2, stack(&[(1, 0x20)]))],
            &[(1, 8)],
        );
        let b = part(
            &target,
            300,
            &[(1, "/lib/libx.so"), (2, "/bin/app")],
            &[(1, stack(&[(2, 0x20)])), (2, stack(&[(1, 0x5), (2, 0x10)]))],
            &[(1, 16), (2, 32)],
        );
        let report = join("joined", vec![a, b]).unwrap();
        assert_eq!(report.iterations, Some(2));
        assert_eq!(report.allocations(), 3);
        assert_eq!(report.recorded.stacks, 3);
        let r = Reader::open(&target).unwrap();
        assert_eq!(r.final_metadata().unwrap().iterations, Some(2));
        let spread = r.final_metadata().unwrap().totals.iteration_spread.unwrap();
        assert_eq!((spread.allocations.min, spread.allocations.max), (1, 2));
        let named = |frames: &[Frame]| -> Vec<(String, u64)> {
            frames
                .iter()
                .map(|f| {
                    (
                        r.stacks().unwrap().module(f.module).unwrap().path.clone(),
                        f.offset,
                    )
                })
                .collect()
        };
        let mut sites = Vec::new();
        for ev in r.events() {
            let ev = ev.unwrap();
            if let EventKind::Malloc { size, .. } = ev.kind {
                sites.push((size, named(&r.stack(ev.stack).unwrap().frames)));
            }
        }
        let app = |o| ("/bin/app".to_string(), o);
        assert_eq!(
            sites,
            [
                (8, vec![app(0x10)]),
                (16, vec![app(0x20)]),
                (32, vec![("/lib/libx.so".to_string(), 0x5), app(0x10)]),
            ]
        );
        assert_eq!(r.stacks().unwrap().modules().len(), 2);
        // Only the artifact is left.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A part damaged after it was finished: nothing is put in place, every part's file is
    /// kept, and the error names them.
    #[test]
    fn parts_that_cannot_be_joined_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("joined.memtrack");
        let a = part(&target, 100, &[], &[], &[(0, 8)]);
        let b = part(&target, 300, &[], &[], &[(0, 16)]);
        let PartArtifact::File(out) = &b.artifact else {
            unreachable!()
        };
        let damaged = out.partial_path().unwrap().to_path_buf();
        let len = std::fs::metadata(&damaged).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&damaged)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let err = join("joined", vec![a, b]).err();
        let msg = err.as_ref().map(ToString::to_string).unwrap_or_default();
        let Some(Error::PartsNotJoined { kept, .. }) = err else {
            panic!("a damaged part was joined");
        };
        assert!(
            msg.starts_with("joined: its 2 parts could not be joined"),
            "{msg}"
        );
        assert!(msg.contains("they are kept as"), "{msg}");
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1], damaged);
        assert!(kept.iter().all(|p| p.exists()));
        assert!(!target.exists());
    }
}
