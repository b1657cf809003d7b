//! The call stacks of the allocator recorder (`memtrack::Allocator`):
//! a real program built here with frame pointers (memtrack-test-support's
//! `fixtures::rust_alloc_stacks`, tests/fixtures/alloc_stacks.rs) records two sessions, and
//! their artifacts must hold each site's exact counts and bytes, and stacks that memtrack's
//! symbolizer names as the fixture's call chains, in order. No privileges needed.
//!
//! The C path of `stacks.rs` (a `malloc` from C code called through FFI) is not here: this
//! recorder sees only the Rust global allocator (the eBPF tracker's tests cover it).
//!
//! `harness = false` (memtrack-test-support's runner): without `rustc` on PATH the test is
//! reported as ignored with what is missing.

use std::path::Path;

use memtrack::{
    artifact::Final, artifact::Reader, event::Event, event::EventKind, stack::Module,
    stack::ModuleId, stack::Stack, stack::StackId, symbolize::Symbolizer,
};
use memtrack_test_support::fixtures;
use memtrack_test_support::{Need, requires, run};

const NEEDS: &[Need] = &[Need::Tool("rustc")];

struct Recording {
    events: Vec<Event>,
    fin: Final,
    stacks: Vec<(StackId, Stack)>,
    modules: Vec<(ModuleId, Module)>,
}

fn read(path: &Path) -> Recording {
    let reader = Reader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let events = reader.events().collect::<Result<_, _>>().unwrap();
    let fin = reader.final_metadata().unwrap().clone();
    let table = reader.stacks().unwrap();
    Recording {
        events,
        fin,
        stacks: table.stacks().map(|(i, s)| (i, s.clone())).collect(),
        modules: table.modules().map(|(i, m)| (i, m.clone())).collect(),
    }
}

impl Recording {
    fn stack(&self, id: StackId) -> &Stack {
        &self
            .stacks
            .iter()
            .find(|(i, _)| *i == id)
            .unwrap_or_else(|| panic!("stack {id:?} is not defined"))
            .1
    }

    /// The one stack of the `count` heap allocations of exactly `size` bytes.
    fn site(&self, size: u64, count: usize) -> StackId {
        let evs: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { size: s, .. } if s == size))
            .collect();
        assert_eq!(evs.len(), count, "allocations of {size} bytes");
        let id = evs[0].stack;
        assert!(!id.is_none(), "an allocation of {size} bytes has no stack");
        assert!(
            evs.iter().all(|e| e.stack == id),
            "the allocations of {size} bytes have several stacks"
        );
        id
    }

    /// The functions of stack `id` named by memtrack's symbolizer, innermost first, each with
    /// whether it was inlined into the next.
    fn functions(&self, id: StackId) -> Vec<(String, bool)> {
        let stack = self.stack(id);
        let mut sym = Symbolizer::new();
        let frames = sym.symbolize_stacks(&[stack], |m| {
            self.modules.iter().find(|(i, _)| *i == m).map(|(_, m)| m)
        });
        frames[0]
            .iter()
            .flatten()
            .map(|f| {
                (
                    f.function.clone().unwrap_or_else(|| f.to_string()),
                    f.inlined,
                )
            })
            .collect()
    }

    /// Heap allocations whose stack stops early, counted from the artifact alone.
    fn short_stacks(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { .. }) && !e.stack.is_none())
            .filter(|e| {
                let s = self.stack(e.stack);
                s.frames.len() <= 1 || s.frames.iter().any(|f| f.module == ModuleId::UNKNOWN)
            })
            .count() as u64
    }
}

/// The functions of `got` from the fixture's first one, as `(name, inlined)`, must begin with
/// `want` (a name matches with or without generic arguments).
fn assert_chain(got: &[(String, bool)], want: &[(&str, bool)]) {
    // The frames before are the allocator's own code (memtrack's wrapper, `alloc::alloc`,
    // `Vec::with_capacity`...), each named. Which of them the compiler inlines into the
    // allocating function is its choice, not the recorder's: a change of the wrapper's body
    // once made it call `RawVecInner::try_allocate_in` instead of inlining it.
    let first = got
        .iter()
        .position(|(name, _)| name.starts_with("alloc_stacks::"))
        .unwrap_or_else(|| panic!("no frame of the fixture in {got:#?}"));
    let library = ["memtrack::", "alloc::", "core::", "std::", "__rustc::"];
    assert!(
        got[..first].iter().all(|(name, _)| {
            let name = name.trim_start_matches('<');
            library.iter().any(|l| name.starts_with(l))
        }),
        "a frame before the fixture's that is not the allocator's: {got:#?}"
    );
    let names: Vec<(String, bool)> = got[first..first + want.len().min(got.len() - first)]
        .iter()
        .map(|(n, i)| (n.split("::<").next().unwrap().to_owned(), *i))
        .collect();
    let want: Vec<(String, bool)> = want.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect();
    assert_eq!(names, want, "the chain in {got:#?}");
}

fn run_fixture() -> (tempfile::TempDir, Recording, Recording) {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::rust_alloc_stacks(dir.path(), "alloc_stacks");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = std::process::Command::new(&exe).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let paths = read(&out.join("paths.memtrack"));
    let sites = read(&out.join("sites.memtrack"));
    (dir, paths, sites)
}

fn stacks_are_the_call_chains_with_exact_counts() {
    let (_dir, paths, sites) = run_fixture();
    // The generic fn: 7 × 800 bytes, one stack.
    let generic = paths.site(800, 7);
    assert_chain(
        &paths.functions(generic),
        &[
            ("alloc_stacks::generic_path", false),
            ("alloc_stacks::main", false),
        ],
    );
    // The #[inline(always)] helper: 5 × 3,000 bytes, one stack, the helper an inlined frame.
    let inline = paths.site(3000, 5);
    assert_chain(
        &paths.functions(inline),
        &[
            ("alloc_stacks::inline_helper", true),
            ("alloc_stacks::inline_path", false),
            ("alloc_stacks::main", false),
        ],
    );
    assert_ne!(generic, inline);
    assert!(!paths.stack(generic).truncated);
    // Every allocation of the session is one of these 12, and none stops early (the fixture
    // has frame pointers), as the trailer says.
    assert_eq!(paths.events.len(), 24);
    assert_eq!(paths.stacks.len(), 2);
    assert_eq!(paths.short_stacks(), 0);
    assert_eq!(paths.fin.short_stacks, 0);
    // 1 M allocations from 3 sites: 3 stack records.
    assert_eq!(sites.events.len(), 2_000_000);
    assert_eq!(sites.stacks.len(), 3, "one record per distinct stack");
    for (size, count, site) in [
        (24, 333_334, "alloc_stacks::site_a"),
        (40, 333_333, "alloc_stacks::site_b"),
        (56, 333_333, "alloc_stacks::site_c"),
    ] {
        let id = sites.site(size, count);
        assert_chain(
            &sites.functions(id),
            &[(site, false), ("alloc_stacks::main", false)],
        );
    }
    assert_eq!(sites.fin.short_stacks, 0);
    // Frees carry no stack.
    assert!(
        sites
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Free { .. }))
            .all(|e| e.stack.is_none())
    );
}

fn main() {
    run(vec![requires(
        "stacks_are_the_call_chains_with_exact_counts",
        NEEDS,
        stacks_are_the_call_chains_with_exact_counts,
    )]);
}
