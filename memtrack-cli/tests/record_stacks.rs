//! The call stacks `record` captures, against the real kernel and
//! real programs built here: each frame is checked against the fixture's own symbol table
//! (memtrack-bpf's ELF reader), not against memtrack's symbolizer.
//!
//! `harness = false` (memtrack-test-support's runner): every test needs CAP_BPF + CAP_PERFMON
//! and a C compiler, and without them is reported as ignored with what is missing, never as
//! passed. Each test records its own commands, so they may run in parallel.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use memtrack::{
    artifact::Final, artifact::Reader, event::Event, event::EventKind, stack::Frame,
    stack::ModuleId, stack::Stack, stack::StackId, tracker::CommandOptions, tracker::RecordOutcome,
    tracker::TrackerOptions, tracker::record_command_with,
};
use memtrack_bpf::Elf;
use memtrack_test_support::fixtures::{self, C_CHAIN, DL_ALLOC};
use memtrack_test_support::{Need, TRACKER, requires, run, run_ok};

const NEEDS: &[Need] = &[TRACKER, Need::Tool("cc")];

struct Run {
    out: RecordOutcome,
    events: Vec<Event>,
    fin: Final,
    stacks: Vec<(StackId, Stack)>,
    /// Module id → (path, build id).
    modules: Vec<(ModuleId, String, Option<Vec<u8>>)>,
}

impl Run {
    fn stack(&self, id: StackId) -> &Stack {
        &self
            .stacks
            .iter()
            .find(|(i, _)| *i == id)
            .unwrap_or_else(|| panic!("stack {id:?} is not defined"))
            .1
    }

    fn module(&self, id: ModuleId) -> (&str, Option<&[u8]>) {
        let m = self
            .modules
            .iter()
            .find(|m| m.0 == id)
            .unwrap_or_else(|| panic!("module {id:?} is not defined"));
        (&m.1, m.2.as_deref())
    }

    /// The heap allocations of exactly `size` bytes.
    fn allocs_of(&self, size: u64) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { size: s, .. } if s == size))
            .collect()
    }

    /// The one stack of every allocation of `size` bytes (there are `count`).
    fn site(&self, size: u64, count: usize) -> (StackId, &Stack) {
        let evs = self.allocs_of(size);
        assert_eq!(evs.len(), count, "allocations of {size} bytes");
        let id = evs[0].stack;
        assert!(!id.is_none(), "an allocation of {size} bytes has no stack");
        assert!(
            evs.iter().all(|e| e.stack == id),
            "the allocations of {size} bytes have several stacks"
        );
        (id, self.stack(id))
    }

    /// (file, function) of each frame of `stack`, from the files' own symbol tables.
    fn functions(&self, stack: &Stack) -> Vec<(String, String)> {
        stack
            .frames
            .iter()
            .map(|f| {
                if f.module == ModuleId::UNKNOWN {
                    return ("?".into(), format!("{:#x}", f.offset));
                }
                let (path, _) = self.module(f.module);
                (path.to_owned(), function_at(Path::new(path), f.offset))
            })
            .collect()
    }

    /// Heap allocations whose stack stops early, counted from the artifact alone.
    fn short_stacks(&self) -> u64 {
        self.short_stacks_where(|_| true)
    }

    /// Of those, the ones whose call site is in glibc or its loader, from the artifact alone.
    fn short_stacks_in_libc(&self) -> u64 {
        self.short_stacks_where(|s| {
            s.frames[0].module != ModuleId::UNKNOWN && {
                let path = self.module(s.frames[0].module).0;
                path.ends_with("/libc.so.6") || path.ends_with("/ld-linux-x86-64.so.2")
            }
        })
    }

    fn short_stacks_where(&self, keep: impl Fn(&Stack) -> bool) -> u64 {
        self.events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    EventKind::Malloc { .. }
                        | EventKind::Calloc { .. }
                        | EventKind::Realloc { .. }
                        | EventKind::AlignedAlloc { .. }
                ) && !e.stack.is_none()
                    && {
                        let s = self.stack(e.stack);
                        (s.frames.len() <= 1
                            || s.frames.iter().any(|f| f.module == ModuleId::UNKNOWN))
                            && keep(s)
                    }
            })
            .count() as u64
    }
}

/// The function of `path` whose code holds file offset `offset` (a return address: after the
/// call instruction, inside the calling function).
fn function_at(path: &Path, offset: u64) -> String {
    let elf = Elf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    elf.functions()
        .filter(|f| f.size > 0)
        .find(|f| {
            elf.file_offset(f.vaddr)
                .is_some_and(|o| (o..o + f.size).contains(&offset))
        })
        .map_or_else(|| format!("{offset:#x}"), |f| f.name.to_owned())
}

fn record(dir: &Path, cmd: &[&OsString], opts: &TrackerOptions) -> Run {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("run-{n}.memtrack"));
    let file = std::fs::File::create(&path).unwrap();
    let cmd: Vec<OsString> = cmd.iter().map(|&s| s.clone()).collect();
    let out = record_command_with(&cmd, file, opts, &CommandOptions::new()).expect("record");
    assert_eq!(out.exit_code, 0, "{cmd:?} failed");
    assert_eq!(out.recorded.lost_events, 0, "events lost");
    let reader = Reader::open(&path).unwrap();
    let events: Vec<Event> = reader.events().collect::<Result<_, _>>().unwrap();
    let fin = reader.final_metadata().unwrap().clone();
    let table = reader.stacks().unwrap();
    let stacks = table.stacks().map(|(i, s)| (i, s.clone())).collect();
    let modules = table
        .modules()
        .map(|(i, m)| (i, m.path.clone(), m.build_id.clone()))
        .collect();
    Run {
        out,
        events,
        fin,
        stacks,
        modules,
    }
}

fn os(p: impl AsRef<std::ffi::OsStr>) -> OsString {
    p.as_ref().to_owned()
}

fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

/// The C fixture's known chain, innermost first, each frame in the executable.
fn assert_chain(run: &Run, exe: &Path) {
    let (_, stack) = run.site(C_CHAIN.bytes, C_CHAIN.count as usize);
    assert!(!stack.truncated);
    let got = run.functions(stack);
    let exe = canonical(exe);
    let want: Vec<(String, String)> = C_CHAIN
        .chain
        .iter()
        .map(|f| (exe.clone(), (*f).to_owned()))
        .collect();
    assert_eq!(got[..want.len()], want[..], "frames {got:?}");
}

fn c_stacks_are_the_call_chain_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let run = record(dir.path(), &[&os(&exe)], &TrackerOptions::new());
    assert_chain(&run, &exe);
    // The module is the executable, with its build id.
    let (id, stack) = run.site(C_CHAIN.bytes, C_CHAIN.count as usize);
    assert!(!id.is_none());
    let (path, build_id) = run.module(stack.frames[0].module);
    assert_eq!(path, canonical(&exe));
    let elf = Elf::open(&exe).unwrap();
    assert_eq!(build_id, elf.build_id());
    assert!(build_id.is_some(), "cc links with a build id");
    // The short stacks the trailer counts are those of the artifact (glibc's own allocations,
    // made inside a library built without frame pointers), not the fixture's.
    assert_eq!(run.fin.short_stacks, run.short_stacks());
    assert_eq!(run.out.recorded.short_stacks, run.fin.short_stacks);
}

fn c_without_frame_pointers_is_reported_short() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain-nofp", false, &[]);
    let run = record(dir.path(), &[&os(&exe)], &TrackerOptions::new());
    let (_, stack) = run.site(C_CHAIN.bytes, C_CHAIN.count as usize);
    // The call site is right, the chain above it is gone.
    assert_eq!(
        run.functions(stack)[0],
        (canonical(&exe), "chain_inner".to_owned())
    );
    assert!(
        stack.frames.len() <= 1 || stack.frames.iter().any(|f| f.module == ModuleId::UNKNOWN),
        "{stack:?}"
    );
    // Where a chain left the code it ends, with the marker, not with the data words the walk
    // read (this process runs no JIT code: every frame outside a file is where a chain broke).
    for (id, s) in &run.stacks {
        if let Some(i) = s.frames.iter().position(|f| f.module == ModuleId::UNKNOWN) {
            assert_eq!(&s.frames[i..], [Frame::BROKEN], "stack {id:?}: {s:?}");
        }
    }
    assert!(run.fin.short_stacks >= C_CHAIN.count);
    assert_eq!(run.fin.short_stacks, run.short_stacks());
    assert_eq!(run.out.recorded.short_stacks, run.fin.short_stacks);
    assert_eq!(run.fin.short_stacks_in_libc, run.short_stacks_in_libc());
    assert!(run.fin.short_stacks - run.fin.short_stacks_in_libc >= C_CHAIN.count);
    // `show` says how many, and the fix.
    let exe_cli = env!("CARGO_BIN_EXE_memtrack");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "memtrack"))
        .collect();
    files.sort();
    let show = run_ok(Command::new(exe_cli).arg("show").arg(&files[0]));
    let text = String::from_utf8(show.stdout).unwrap();
    let n = memtrack::human::count(run.fin.short_stacks - run.fin.short_stacks_in_libc);
    let all = memtrack::human::count(run.fin.totals.allocations);
    assert!(
        text.contains(&format!("call stacks   {n} of {all} allocations ("))
            && text.contains("RUSTFLAGS=\"-C force-frame-pointers=yes\"")
            && text.contains("-fno-omit-frame-pointer"),
        "{text}"
    );
}

fn a_million_allocations_from_three_sites_send_three_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("three_sites");
    run_ok(
        Command::new("cc")
            .args(["-O2", "-fno-omit-frame-pointer"])
            .arg(fixtures::source("three_sites.c"))
            .arg("-o")
            .arg(&exe),
    );
    let run = record(dir.path(), &[&os(&exe)], &TrackerOptions::new());
    let a = run.site(111, 333_334).0;
    let b = run.site(222, 333_333).0;
    let c = run.site(333, 333_333).0;
    assert!(a != b && b != c && a != c);
    for (id, f) in [(a, "site_a"), (b, "site_b"), (c, "site_c")] {
        let got = run.functions(run.stack(id));
        assert_eq!(got[0].1, f);
        assert_eq!(got[1].1, "main");
    }
    // Every stack record the program sent during the run, the start-up's included: a few
    // dozen at most, not one per allocation.
    let sent = run.out.recorded.stacks;
    assert!(
        (3..100).contains(&sent),
        "{sent} stack records for 1,000,000 allocations"
    );
    assert!(run.stacks.len() as u64 <= sent);
    assert_eq!(run.out.recorded.stack_collisions, 0);
    assert_eq!(run.out.recorded.stacks_not_remembered, 0);
}

fn a_dlopened_librarys_allocations_have_frames_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let lib = fixtures::dlopen_lib(dir.path(), "libdl_fixture.so");
    let run = record(dir.path(), &[&os(&exe), &os(&lib)], &TrackerOptions::new());
    let (_, stack) = run.site(DL_ALLOC.bytes, DL_ALLOC.count as usize);
    let got = run.functions(stack);
    let (lib, exe) = (canonical(&lib), canonical(&exe));
    assert_eq!(
        got[..3],
        [
            (lib.clone(), "dl_inner".to_owned()),
            (lib, "dl_alloc".to_owned()),
            (exe, "main".to_owned())
        ],
        "{got:?}"
    );
    // The fixture is built with frame pointers: its short stacks are those of the loader's
    // own allocations (dlopen), which the trailer counts apart and no note warns of.
    assert!(
        run.fin.short_stacks > 0,
        "the loader's allocations stop early"
    );
    assert_eq!(run.fin.short_stacks, run.short_stacks());
    assert_eq!(run.fin.short_stacks_in_libc, run.short_stacks_in_libc());
    assert_eq!(run.fin.short_stacks_in_libc, run.fin.short_stacks);
    assert_eq!(
        run.out.recorded.short_stacks_in_libc,
        run.fin.short_stacks_in_libc
    );
    let allocations = run.fin.totals.allocations;
    assert_eq!(
        memtrack::human::short_stacks_note(
            run.fin.short_stacks,
            run.fin.short_stacks_in_libc,
            allocations
        ),
        None
    );
}

fn a_followed_child_uses_its_own_mappings() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    // `; true` makes the shell fork and exec the fixture instead of exec'ing it in place.
    let script = format!("{} ; true", exe.display());
    let run = record(
        dir.path(),
        &[&os("/bin/sh"), &os("-c"), &os(&script)],
        &TrackerOptions::new(),
    );
    let evs = run.allocs_of(C_CHAIN.bytes);
    assert!(
        evs.iter().all(|e| e.pid != run.out.pid),
        "the child's events"
    );
    assert_chain(&run, &exe);
}

fn the_depth_cap_cuts_and_marks_a_stack() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let run = record(
        dir.path(),
        &[&os(&exe)],
        &TrackerOptions::new().stack_depth(2),
    );
    let (_, stack) = run.site(C_CHAIN.bytes, C_CHAIN.count as usize);
    assert_eq!(stack.frames.len(), 2);
    assert!(stack.truncated);
    let got: Vec<String> = run.functions(stack).into_iter().map(|f| f.1).collect();
    assert_eq!(got, ["chain_inner", "chain_middle"]);
    assert!(run.out.recorded.truncated_stacks >= 1);
    // No stacks at all with depth 0.
    let run = record(
        dir.path(),
        &[&os(&exe)],
        &TrackerOptions::new().stack_depth(0),
    );
    assert!(run.events.iter().all(|e| e.stack.is_none()));
    assert_eq!(run.out.recorded.stacks, 0);
}

fn main() {
    run(vec![
        requires(
            "c_stacks_are_the_call_chain_in_order",
            NEEDS,
            c_stacks_are_the_call_chain_in_order,
        ),
        requires(
            "c_without_frame_pointers_is_reported_short",
            NEEDS,
            c_without_frame_pointers_is_reported_short,
        ),
        requires(
            "a_million_allocations_from_three_sites_send_three_stacks",
            NEEDS,
            a_million_allocations_from_three_sites_send_three_stacks,
        ),
        requires(
            "a_dlopened_librarys_allocations_have_frames_in_it",
            NEEDS,
            a_dlopened_librarys_allocations_have_frames_in_it,
        ),
        requires(
            "a_followed_child_uses_its_own_mappings",
            NEEDS,
            a_followed_child_uses_its_own_mappings,
        ),
        requires(
            "the_depth_cap_cuts_and_marks_a_stack",
            NEEDS,
            the_depth_cap_cuts_and_marks_a_stack,
        ),
    ])
}
