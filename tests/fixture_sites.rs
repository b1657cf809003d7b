//! The fixtures with known call chains (memtrack-test-support's `fixtures`) allocate what their
//! declared sites say, counted by the eBPF tracker: the stack tests compare per-site numbers
//! with those declarations, so the declarations themselves are checked here, stacks aside.
//!
//! `harness = false` (memtrack-test-support's runner): each test needs CAP_BPF + CAP_PERFMON
//! and the compilers, and without them is reported as ignored with what is missing.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use memtrack::{Event, EventKind, Reader, TrackerOptions, record_command};
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
    let path = dir.join("run.memtrack");
    let file = std::fs::File::create(&path).unwrap();
    let out = record_command(cmd, file, &TrackerOptions::new()).expect("record");
    assert_eq!(out.exit_code, 0, "{cmd:?}");
    assert_eq!(out.recorded.lost_events, 0);
    let events: Vec<Event> = Reader::open(&path)
        .unwrap()
        .events()
        .collect::<Result<_, _>>()
        .unwrap();
    let main: Vec<EventKind> = events
        .iter()
        .filter(|e| e.tid == out.pid)
        .map(|e| e.kind)
        .filter(|k| {
            !matches!(
                k,
                EventKind::Mmap { .. }
                    | EventKind::Munmap { .. }
                    | EventKind::Mremap { .. }
                    | EventKind::Brk { .. }
            )
        })
        .collect();
    let pos = |size| {
        main.iter()
            .position(|k| alloc_size(k) == Some(size))
            .unwrap_or_else(|| panic!("marker {size:#x} missing"))
    };
    let (b, e) = (pos(MARK_BEGIN), pos(MARK_END));
    // Skip the begin marker's free; stop before the end marker's allocation.
    main[b + 2..e].to_vec()
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
