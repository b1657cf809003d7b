//! The fixtures with known call chains (memtrack-test-support's `fixtures`) allocate what their
//! declared sites say, counted by the eBPF tracker: the stack tests compare per-site numbers
//! with those declarations, so the declarations themselves are checked here, stacks aside.
//!
//! `rust_fixture_stacks_in_order` checks the eBPF tracker's stacks of the Rust fixture (each
//! site's counts and bytes exact, its stack the expected functions in order,
//! the `#[inline(always)]` helper an inlined frame, the C function called by FFI a frame of
//! its own), as memtrack-cli/tests/alloc_stacks.rs does for the allocator recorder.
//!
//! `harness = false` (memtrack-test-support's runner): each test needs CAP_BPF + CAP_PERFMON
//! and the compilers, and without them is reported as ignored with what is missing.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use memtrack::{
    analysis::Sites, artifact::Reader, event::Event, event::EventKind, stack::StackId,
    symbolize::Symbolizer, tracker::TrackerOptions, tracker::record_command,
};
use memtrack_test_support::fixtures::{self, MARK_BEGIN, MARK_END, Site};
use memtrack_test_support::{Need, TRACKER, Trial, requires};
use object::{Object, ObjectSection, ObjectSymbol};

const NEEDS: &[Need] = &[
    TRACKER,
    Need::Tool("cc"),
    Need::Tool("c++"),
    Need::Tool("ar"),
    Need::Tool("rustc"),
];

/// The size of an allocating event.
fn alloc_size(kind: &EventKind) -> Option<u64> {
    match *kind {
        EventKind::Malloc { size, .. }
        | EventKind::Calloc { size, .. }
        | EventKind::AlignedAlloc { size, .. } => Some(size),
        EventKind::Realloc { size, new_addr, .. } if new_addr != 0 => Some(size),
        _ => None,
    }
}

/// Records `cmd` and returns the main thread's heap events strictly between the markers.
fn between_markers(dir: &Path, cmd: &[OsString]) -> Vec<EventKind> {
    let (_, events) = record_between_markers(dir, cmd);
    events.into_iter().map(|e| e.kind).collect()
}

/// Records `cmd` into `dir/run.memtrack`: the recording's reader, and the main thread's heap
/// events strictly between the markers.
fn record_between_markers(dir: &Path, cmd: &[OsString]) -> (Reader, Vec<Event>) {
    let path = dir.join("run.memtrack");
    let file = std::fs::File::create(&path).unwrap();
    let out = record_command(cmd, file, &TrackerOptions::new()).expect("record");
    assert_eq!(out.exit_code, 0, "{cmd:?}");
    assert_eq!(out.recorded.lost_events, 0);
    let reader = Reader::open(&path).unwrap();
    let events: Vec<Event> = reader.events().collect::<Result<_, _>>().unwrap();
    let main: Vec<Event> = events
        .into_iter()
        .filter(|e| e.tid == out.pid)
        .filter(|e| {
            !matches!(
                e.kind,
                EventKind::Mmap { .. }
                    | EventKind::Munmap { .. }
                    | EventKind::Mremap { .. }
                    | EventKind::Brk { .. }
            )
        })
        .collect();
    let pos = |size| {
        main.iter()
            .position(|e| alloc_size(&e.kind) == Some(size))
            .unwrap_or_else(|| panic!("marker {size:#x} missing"))
    };
    let (b, e) = (pos(MARK_BEGIN), pos(MARK_END));
    // Skip the begin marker's free; stop before the end marker's allocation.
    let between = main[b + 2..e].to_vec();
    (reader, between)
}

/// Allocation count per size in `kinds`, and the number of frees.
fn tally(kinds: &[EventKind]) -> (BTreeMap<u64, u64>, u64) {
    let mut sizes = BTreeMap::new();
    let mut frees = 0;
    for k in kinds {
        if let Some(size) = alloc_size(k) {
            *sizes.entry(size).or_insert(0) += 1;
        } else if matches!(k, EventKind::Free { .. }) {
            frees += 1;
        }
    }
    (sizes, frees)
}

fn declared(sites: &[Site]) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for s in sites {
        *out.entry(s.bytes).or_insert(0) += s.count;
    }
    out
}

fn rust_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::rust_stacks(dir.path(), "stacks");
    for f in [
        "_ZN6stacks12generic_path17h",
        "_ZN6stacks11inline_path17h",
        "_ZN6stacks8ffi_path17h",
        "ffi_alloc",
    ] {
        assert!(sets_frame_pointer(&exe, f), "{f} has no frame pointer");
    }
    let got = between_markers(dir.path(), &[exe.into()]);
    let sites = [
        fixtures::RUST_GENERIC,
        fixtures::RUST_INLINE,
        fixtures::RUST_FFI,
    ];
    let (sizes, frees) = tally(&got);
    assert_eq!(sizes, declared(&sites), "{got:?}");
    assert_eq!(frees, sites.iter().map(|s| s.count).sum::<u64>(), "{got:?}");
}

/// The eBPF tracker's stacks of the Rust fixture: each declared site is one stack of exactly
/// its count and bytes in the whole recording (no other allocation shares it), and memtrack's
/// symbolizer names that stack's frames as the site's chain, in order, the
/// `#[inline(always)]` helper as a frame inlined into its caller.
fn rust_fixture_stacks_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::rust_stacks(dir.path(), "stacks");
    let (reader, between) = record_between_markers(dir.path(), &[exe.into()]);
    let sites = Sites::read(&reader).unwrap();
    let table = reader.stacks().unwrap();
    let mut sym = Symbolizer::new();
    let mut seen: Vec<StackId> = Vec::new();
    for (site, inlined) in [
        (fixtures::RUST_GENERIC, &[false, false][..]),
        (fixtures::RUST_INLINE, &[true, false, false][..]),
        (fixtures::RUST_FFI, &[false, false, false][..]),
    ] {
        // Every allocation of the site's size between the markers: one stack.
        let evs: Vec<&Event> = between
            .iter()
            .filter(|e| alloc_size(&e.kind) == Some(site.bytes))
            .collect();
        assert_eq!(evs.len() as u64, site.count, "{site:?}");
        let id = evs[0].stack;
        assert!(!id.is_none(), "{site:?}: no stack");
        assert!(
            evs.iter().all(|e| e.stack == id),
            "{site:?}: several stacks"
        );
        assert!(
            !seen.contains(&id),
            "{site:?} shares a stack with another site"
        );
        seen.push(id);
        // That stack's site, over the whole recording: exactly the declared blocks and bytes.
        let s = sites
            .sites
            .iter()
            .find(|s| s.stack == id)
            .unwrap_or_else(|| panic!("{site:?}: stack {id:?} is no site"));
        assert_eq!(
            (s.blocks, s.bytes),
            (site.count, site.count * site.bytes),
            "{site:?}"
        );
        // Its frames, named, innermost first: the allocator's and std's own code first, then
        // the chain, in order, each marked inlined or not.
        let stack = reader.stack(id).unwrap();
        assert!(!stack.truncated, "{site:?}");
        let named = sym.symbolize_stacks(&[stack], |m| table.module(m));
        let got: Vec<(String, bool)> = named[0]
            .iter()
            .flatten()
            .map(|f| {
                let name = f.function.clone().unwrap_or_else(|| f.to_string());
                (name.split("::<").next().unwrap().to_owned(), f.inlined)
            })
            .collect();
        let first = got
            .iter()
            .position(|(n, _)| n == site.chain[0])
            .unwrap_or_else(|| panic!("{site:?}: no {} in {got:#?}", site.chain[0]));
        assert!(
            got[..first].iter().all(|(n, _)| {
                ["std::", "core::", "alloc::", "__rust", "__rdl", "<alloc::"]
                    .iter()
                    .any(|p| n.starts_with(p))
            }),
            "{site:?}: frames before the chain that are not the allocator's: {got:#?}"
        );
        let want: Vec<(String, bool)> = site
            .chain
            .iter()
            .zip(inlined)
            .map(|(n, i)| ((*n).to_owned(), *i))
            .collect();
        let end = (first + want.len()).min(got.len());
        assert_eq!(got[first..end], want[..], "{site:?}: the chain in {got:#?}");
    }
}

/// Whether the function `name` of `exe` starts by setting up a frame pointer (`push %rbp;
/// mov %rsp,%rbp`, after an `endbr64` if any).
fn sets_frame_pointer(exe: &Path, name: &str) -> bool {
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    // A Rust function by its legacy-mangled prefix (`_ZN6stacks9some_name17h…E`).
    let sym = file
        .symbols()
        .find(|s| {
            s.name()
                .is_ok_and(|n| n == name || (name.ends_with("17h") && n.starts_with(name)))
        })
        .unwrap_or_else(|| panic!("no {name} in {}", exe.display()));
    let section = file
        .section_by_index(sym.section_index().expect("defined"))
        .unwrap();
    let code = &section.data().unwrap()[(sym.address() - section.address()) as usize..];
    let code = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
    code.starts_with(&[0x55, 0x48, 0x89, 0xe5])
}

fn c_chain_with_and_without_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    for fp in [true, false] {
        let exe = fixtures::c_chain(dir.path(), &format!("chain-{fp}"), fp, &[]);
        for f in fixtures::C_CHAIN.chain {
            assert_eq!(sets_frame_pointer(&exe, f), fp, "{f}, frame pointers: {fp}");
        }
        let got = between_markers(dir.path(), &[exe.into()]);
        let (sizes, frees) = tally(&got);
        assert_eq!(sizes, declared(&[fixtures::C_CHAIN]), "{got:?}");
        assert_eq!(frees, fixtures::C_CHAIN.count, "{got:?}");
    }
}

fn c_chain_dlopening_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &["-ldl"]);
    let so = fixtures::dlopen_lib(dir.path(), "libdlfixture.so");
    let got = between_markers(dir.path(), &[exe.into(), so.into()]);
    // dlopen allocates too (its own bookkeeping): the declared sizes only.
    let (sizes, _) = tally(&got);
    for site in [fixtures::C_CHAIN, fixtures::DL_ALLOC] {
        assert_eq!(
            sizes.get(&site.bytes),
            Some(&site.count),
            "{site:?}: {got:?}"
        );
    }
}

fn cxx_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::cxx_chain(dir.path(), "cxx_chain");
    let got = between_markers(dir.path(), &[exe.into()]);
    let (sizes, frees) = tally(&got);
    assert_eq!(sizes, declared(&[fixtures::CXX_MAKE]), "{got:?}");
    assert_eq!(frees, fixtures::CXX_MAKE.count, "{got:?}");
}

fn main() {
    let tests: Vec<(&str, fn())> = vec![
        ("rust_fixture", rust_fixture),
        ("rust_fixture_stacks_in_order", rust_fixture_stacks_in_order),
        (
            "c_chain_with_and_without_frame_pointers",
            c_chain_with_and_without_frame_pointers,
        ),
        (
            "c_chain_dlopening_the_library",
            c_chain_dlopening_the_library,
        ),
        ("cxx_fixture", cxx_fixture),
    ];
    let trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| requires(name, NEEDS, f))
        .collect();
    memtrack_test_support::run(trials);
}
