//! `memtrack::symbolize::Symbolizer` on real binaries: the fixtures with known call chains
//! (memtrack-test-support's `fixtures`), built here, run, and symbolized after they exited.
//!
//! The offsets come from what the running fixture printed (addresses it took, turned into file
//! offsets through its own /proc/self/maps) or from the binary's symbol table read with the
//! `object` crate, never from the symbolizer under test; the expected lines are those the
//! fixtures' sources mark `LINE:NAME`.
//!
//! `harness = false` (memtrack-test-support's runner): each test needs the C, C++ and Rust
//! compilers for the fixtures, and without them is reported as ignored with what is missing.

use std::path::Path;

use memtrack::{
    stack::Frame, stack::Module, stack::ModuleId, stack::Stack, symbolize::ModuleStatus,
    symbolize::SymFrame, symbolize::Symbolizer,
};
use memtrack_test_support::fixtures::{self, Printed, line_of};
use memtrack_test_support::{Need, Trial, requires, run_ok};
use object::{Object, ObjectSegment, ObjectSymbol};

const NEEDS: &[Need] = &[
    Need::Tool("cc"),
    Need::Tool("c++"),
    Need::Tool("ar"),
    Need::Tool("rustc"),
    Need::Tool("strip"),
];

/// The module of `path` with the build id its ELF note holds (read with `object`).
fn module(path: &Path) -> Module {
    let data = std::fs::read(path).expect("read the binary");
    let file = object::File::parse(&*data).expect("an ELF file");
    Module {
        path: path.to_str().expect("UTF-8 path").to_string(),
        build_id: file.build_id().expect("notes").map(<[u8]>::to_vec),
    }
}

/// The file offset of the symbol `name` (exact, mangled) of `path`, plus `delta` bytes, from
/// its symbol table and load segments.
fn symbol_offset(path: &Path, name: &str, delta: u64) -> u64 {
    let data = std::fs::read(path).expect("read the binary");
    let file = object::File::parse(&*data).expect("an ELF file");
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name} in {}", path.display()));
    let vaddr = sym.address() + delta;
    let seg = file
        .segments()
        .find(|s| (s.address()..s.address() + s.size()).contains(&vaddr))
        .expect("a segment holds the symbol");
    vaddr - seg.address() + seg.file_range().0
}

/// The mangled names of `path`'s symbols for which `pick` holds.
fn symbols(path: &Path, pick: impl Fn(&str) -> bool) -> Vec<String> {
    let data = std::fs::read(path).expect("read the binary");
    let file = object::File::parse(&*data).expect("an ELF file");
    file.symbols()
        .filter_map(|s| s.name().ok().filter(|n| pick(n)).map(str::to_string))
        .collect()
}

/// The frames of the return address printed as `name` by a fixture: a one-frame stack in the
/// printed mapping's module, symbolized as a recorded stack is.
fn return_address(sym: &mut Symbolizer, printed: &Printed, name: &str) -> Vec<SymFrame> {
    let (path, offset) = printed.file_offset(printed.addr(name));
    let m = module(&path);
    let stack = Stack {
        frames: vec![Frame {
            module: ModuleId(1),
            offset,
        }],
        truncated: false,
    };
    let mut out = sym.symbolize_stacks(&[&stack], |id| (id == ModuleId(1)).then_some(&m));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len(), 1);
    out.remove(0).remove(0)
}

/// Asserts `f` is `function` (not inlined) at `file`'s line marked `LINE:tag`.
#[track_caller]
fn assert_at(f: &SymFrame, function: &str, file: &str, tag: &str, inlined: bool) {
    assert_eq!(f.function.as_deref(), Some(function), "{f:?}");
    let path = f
        .file
        .as_deref()
        .unwrap_or_else(|| panic!("no file: {f:?}"));
    assert!(
        Path::new(path).ends_with(file),
        "{path} is not {file}: {f:?}"
    );
    assert_eq!(f.line, Some(line_of(file, tag)), "{f:?}");
    assert_eq!(f.inlined, inlined, "{f:?}");
}

fn rust_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::rust_stacks(dir.path(), "stacks");
    let printed = fixtures::run_printed(&exe, &["--print".as_ref()]);
    let m = module(&exe);
    assert!(m.build_id.is_some(), "rustc links a build id");
    let mut sym = Symbolizer::new();

    // An address inside the generic fn: one frame, the function (the legacy mangling of a
    // monomorphized fn names no type parameters).
    let (path, off) = printed.file_offset(printed.addr("generic_path"));
    assert_eq!(path, exe);
    let frames = sym.symbolize(&m, &[off]).remove(0);
    assert_eq!(frames.len(), 1, "{frames:#?}");
    assert_at(
        &frames[0],
        "stacks::generic_path",
        "stacks.rs",
        "generic_path",
        false,
    );
    assert_eq!(frames[0].offset, off);
    assert_eq!(frames[0].module, "stacks");

    // An address in the #[inline(always)] helper: the helper, marked inlined, at its own line,
    // then the function it was inlined into, at the line of the call.
    let (_, off) = printed.file_offset(printed.addr("inline_helper"));
    let frames = sym.symbolize(&m, &[off]).remove(0);
    assert_eq!(frames.len(), 2, "{frames:#?}");
    assert_at(
        &frames[0],
        "stacks::inline_helper",
        "stacks.rs",
        "inline_helper",
        true,
    );
    assert_at(
        &frames[1],
        "stacks::inline_path",
        "stacks.rs",
        "inline_path",
        false,
    );
    assert!(
        frames[0].to_string().ends_with(" [inlined]"),
        "{}",
        frames[0]
    );

    // The return address into the Rust caller of the C function: the call's line.
    let frames = return_address(&mut sym, &printed, "ret_ffi_path");
    assert_at(
        &frames[0],
        "stacks::ffi_path",
        "stacks.rs",
        "ffi_path",
        false,
    );

    // Both Rust manglings in one binary: user code legacy (`_ZN…17h<hash>E`), std v0 (`_R…`).
    let legacy = symbols(&exe, |n| {
        n.starts_with("_ZN6stacks12generic_path17h") && n.ends_with('E')
    });
    assert_eq!(legacy.len(), 1, "{legacy:?}");
    let v0 = symbols(&exe, |n| {
        n.starts_with("_R") && n.ends_with("3std2rt19lang_start_internal")
    });
    assert_eq!(v0.len(), 1, "std's lang_start_internal, v0-mangled: {v0:?}");
    let offs = [
        symbol_offset(&exe, &legacy[0], 1),
        symbol_offset(&exe, &v0[0], 1),
        symbol_offset(&exe, "ffi_alloc", 1),
    ];
    let names: Vec<Option<String>> = sym
        .symbolize(&m, &offs)
        .into_iter()
        .map(|f| f.last().unwrap().function.clone())
        .collect();
    assert_eq!(
        names,
        [
            Some("stacks::generic_path".to_string()),
            Some("std::rt::lang_start_internal".to_string()),
            Some("ffi_alloc".to_string()),
        ]
    );
}

fn c_chain_and_dlopened_library_after_exit() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &["-ldl"]);
    let so = fixtures::dlopen_lib(dir.path(), "libdlfixture.so");
    let printed = fixtures::run_printed(&exe, &["--print".as_ref(), so.as_os_str()]);
    // The process has exited: only the files remain.
    let mut sym = Symbolizer::new();
    for (name, function, tag) in [
        ("ret_chain_middle", "chain_middle", "chain_middle"),
        ("ret_chain_outer", "chain_outer", "chain_outer"),
        ("ret_main", "main", "main"),
    ] {
        let frames = return_address(&mut sym, &printed, name);
        assert_eq!(frames.len(), 1, "{frames:#?}");
        assert_at(&frames[0], function, "chain.c", tag, false);
    }
    let (path, _) = printed.file_offset(printed.addr("ret_dl_alloc"));
    assert_eq!(path, so, "the return address is in the dlopened library");
    let frames = return_address(&mut sym, &printed, "ret_dl_alloc");
    assert_eq!(frames.len(), 1, "{frames:#?}");
    assert_at(&frames[0], "dl_alloc", "dlopen_lib.c", "dl_alloc", false);
    assert_eq!(frames[0].module, "libdlfixture.so");
}

fn cxx_names_are_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::cxx_chain(dir.path(), "cxx_chain");
    run_ok(&mut std::process::Command::new(&exe));
    let off = symbol_offset(&exe, "_ZN7fixture4PoolIiE4makeEm", 1);
    let frames = Symbolizer::new().symbolize(&module(&exe), &[off]).remove(0);
    let last = frames.last().unwrap();
    assert_eq!(
        last.function.as_deref(),
        Some(fixtures::CXX_MAKE.chain[0]),
        "{frames:#?}"
    );
    assert!(
        last.file
            .as_deref()
            .is_some_and(|f| f.ends_with("cxx_chain.cc")),
        "{frames:#?}"
    );
}

fn stripped_copy_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let printed = fixtures::run_printed(&exe, &["--print".as_ref()]);
    let (_, off) = printed.file_offset(printed.addr("ret_chain_middle"));
    let stripped = dir.path().join("chain-stripped");
    run_ok(
        std::process::Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&exe),
    );
    let (full, bare) = (module(&exe), module(&stripped));
    assert_eq!(full.build_id, bare.build_id, "strip keeps the build id");
    let mut sym = Symbolizer::new();
    let stack = Stack {
        frames: vec![Frame {
            module: ModuleId(1),
            offset: off,
        }],
        truncated: false,
    };
    let named = sym.symbolize_stacks(&[&stack], |_| Some(&full));
    assert_eq!(named[0][0][0].function.as_deref(), Some("chain_middle"));
    let frames = sym.symbolize_stacks(&[&stack], |_| Some(&bare));
    assert_eq!(frames[0][0], vec![SymFrame::fallback(&bare, off)]);
    assert_eq!(
        frames[0][0][0].to_string(),
        format!("chain-stripped+{off:#x}")
    );
    assert_eq!(sym.status(&bare), &ModuleStatus::Usable);
}

fn rebuilt_or_missing_module_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let printed = fixtures::run_printed(&exe, &["--print".as_ref()]);
    let recorded = module(&exe);
    let (_, off) = printed.file_offset(printed.addr("ret_chain_middle"));
    // Rebuilt at the same path with other code (and so another build id): where chain_middle
    // was, other code may be now.
    fixtures::c_chain(dir.path(), "chain", true, &["-O0", "-DREBUILT"]);
    let rebuilt = module(&exe);
    assert_ne!(recorded.build_id, rebuilt.build_id);
    let mut sym = Symbolizer::new();
    assert_eq!(
        sym.symbolize(&recorded, &[off - 1]),
        vec![vec![SymFrame::fallback(&recorded, off - 1)]]
    );
    assert!(
        matches!(sym.status(&recorded), ModuleStatus::BuildIdMismatch { recorded: r, found: f }
            if *r == recorded.build_id && *f == rebuilt.build_id),
        "{:?}",
        sym.status(&recorded)
    );
    assert!(
        sym.status(&recorded).to_string().contains("rebuilt"),
        "{}",
        sym.status(&recorded)
    );
    // The rebuilt file with its own build id is symbolized (the check is of the build id, not
    // of the path).
    assert_eq!(sym.status(&rebuilt), &ModuleStatus::Usable);
    // A recorded module whose file is gone.
    let gone = Module {
        path: dir.path().join("gone").to_str().unwrap().to_string(),
        build_id: recorded.build_id.clone(),
    };
    assert_eq!(
        sym.symbolize(&gone, &[off]),
        vec![vec![SymFrame::fallback(&gone, off)]]
    );
    assert!(
        matches!(sym.status(&gone), ModuleStatus::Unreadable(_)),
        "{:?}",
        sym.status(&gone)
    );
    assert_eq!(
        SymFrame::fallback(&gone, off).to_string(),
        format!("gone+{off:#x}")
    );
}

/// A symbol without a size (hand-written assembly without `.size`, as in some stripped
/// libraries) names its first byte only: past it may be the next, unnamed function.
fn sizeless_symbol_names_only_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("sizeless.c");
    std::fs::write(
        &src,
        "__asm__(\".text\\n.globl sizeless\\n.type sizeless, @function\\nsizeless:\\n\
         nop\\nnop\\nnop\\nret\\n\");\nint main(void) { return 0; }\n",
    )
    .unwrap();
    let exe = dir.path().join("sizeless");
    run_ok(
        std::process::Command::new("cc")
            .args(["-O2", "-g"])
            .arg(&src)
            .arg("-o")
            .arg(&exe),
    );
    let m = module(&exe);
    let (at, past) = (
        symbol_offset(&exe, "sizeless", 0),
        symbol_offset(&exe, "sizeless", 2),
    );
    let frames = Symbolizer::new().symbolize(&m, &[at, past]);
    assert_eq!(
        frames[0][0].function.as_deref(),
        Some("sizeless"),
        "{frames:?}"
    );
    assert_eq!(frames[1], vec![SymFrame::fallback(&m, past)]);
}

fn unknown_and_undefined_modules() {
    let stack = Stack {
        frames: vec![
            Frame {
                module: ModuleId::UNKNOWN,
                offset: 0x7fff_1234,
            },
            Frame {
                module: ModuleId(9),
                offset: 0x10,
            },
        ],
        truncated: false,
    };
    let frames = Symbolizer::new().symbolize_stacks(&[&stack], |_| None);
    let text: Vec<String> = frames[0].iter().map(|f| f[0].to_string()).collect();
    assert_eq!(text, ["0x7fff1234", "[module 9]+0x10"]);
}

fn main() {
    let tests: Vec<(&str, fn())> = vec![
        ("rust_fixture", rust_fixture),
        (
            "c_chain_and_dlopened_library_after_exit",
            c_chain_and_dlopened_library_after_exit,
        ),
        ("cxx_names_are_demangled", cxx_names_are_demangled),
        ("stripped_copy_falls_back", stripped_copy_falls_back),
        (
            "sizeless_symbol_names_only_its_start",
            sizeless_symbol_names_only_its_start,
        ),
        (
            "rebuilt_or_missing_module_falls_back",
            rebuilt_or_missing_module_falls_back,
        ),
    ];
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, f)| requires(name, NEEDS, f))
        .collect();
    trials.push(memtrack_test_support::test(
        "unknown_and_undefined_modules",
        unknown_and_undefined_modules,
    ));
    memtrack_test_support::run(trials);
}
