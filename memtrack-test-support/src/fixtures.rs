//! The fixtures with known call chains (tests/fixtures: `stacks.rs`, `chain.c`,
//! `dlopen_lib.c`, `cxx_chain.cc`) and the pthread lock-wait fixture (`pthread_locks.c`),
//! built into a test's directory, and what they print.
//!
//! Each fixture brackets its known allocations by the marker allocations [`MARK_BEGIN`] and
//! [`MARK_END`], and with `--print` prints the addresses it recorded on the way (`NAME
//! 0xADDRESS`) and its own `/proc/self/maps`: [`Printed`] parses that and turns an address into
//! the (file, file offset) a recorded stack frame holds. A comment `LINE:NAME` in a fixture's
//! source marks the line an address named NAME belongs to ([`line_of`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Need, run_ok};

/// Size of the allocation a fixture makes (and frees) before its known allocations.
pub const MARK_BEGIN: u64 = 0xbe01;
/// Size of the allocation a fixture makes (and frees) after its known allocations.
pub const MARK_END: u64 = 0xbe02;

/// One allocating call site of a fixture: `count` blocks of `bytes` each, made through
/// `chain` (innermost first: the function that calls the allocator, then its callers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// Blocks allocated (each freed before the next is made).
    pub count: u64,
    /// Bytes of each block.
    pub bytes: u64,
    /// The functions on the way, innermost first, as a symbolizer names them (Rust paths
    /// without hash, C names).
    pub chain: &'static [&'static str],
}

/// `stacks.rs`: through a generic fn (`Vec::<u64>::with_capacity(100)`).
pub const RUST_GENERIC: Site = Site {
    count: 7,
    bytes: 800,
    chain: &["stacks::generic_path", "stacks::main"],
};
/// `stacks.rs`: through the `#[inline(always)]` `inline_helper` (an inlined frame of
/// `inline_path`).
pub const RUST_INLINE: Site = Site {
    count: 5,
    bytes: 3000,
    chain: &[
        "stacks::inline_helper",
        "stacks::inline_path",
        "stacks::main",
    ],
};
/// `stacks.rs`: through the C function `ffi_alloc` (stacks_ffi.c), which calls `malloc`.
pub const RUST_FFI: Site = Site {
    count: 4,
    bytes: 1234,
    chain: &["ffi_alloc", "stacks::ffi_path", "stacks::main"],
};
/// `chain.c`: main → chain_outer → chain_middle → chain_inner → malloc.
pub const C_CHAIN: Site = Site {
    count: 6,
    bytes: 4321,
    chain: &["chain_inner", "chain_middle", "chain_outer", "main"],
};
/// `dlopen_lib.c`, dlopened by `chain.c`: dl_alloc → dl_inner → malloc.
pub const DL_ALLOC: Site = Site {
    count: 3,
    bytes: 5555,
    chain: &["dl_inner", "dl_alloc", "main"],
};
/// `cxx_chain.cc`: `fixture::Pool<int>::make(unsigned long)` → `operator new[]`, 333 ints.
pub const CXX_MAKE: Site = Site {
    count: 2,
    bytes: 333 * 4,
    chain: &["fixture::Pool<int>::make(unsigned long)", "main"],
};

/// What building the fixtures needs.
pub const NEEDS: &[Need] = &[
    Need::Tool("cc"),
    Need::Tool("c++"),
    Need::Tool("ar"),
    Need::Tool("rustc"),
];

/// tests/fixtures of the workspace.
pub fn dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    // Canonical: the path is what the fixtures' debug information names their sources by.
    dir.canonicalize().unwrap_or(dir)
}

/// The source file `name` in tests/fixtures.
pub fn source(name: &str) -> PathBuf {
    dir().join(name)
}

/// The line (from 1) of `source(file)` that holds the comment `LINE:name`.
pub fn line_of(file: &str, name: &str) -> u32 {
    let text = std::fs::read_to_string(source(file)).expect("read a fixture's source");
    let tag = format!("LINE:{name}");
    let mut found = text.lines().enumerate().filter(|(_, l)| {
        l.split_once(&tag)
            .is_some_and(|(_, rest)| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    });
    let (i, _) = found.next().unwrap_or_else(|| panic!("no {tag} in {file}"));
    assert!(found.next().is_none(), "two {tag} in {file}");
    i as u32 + 1
}

fn cc(compiler: &str, args: &[&std::ffi::OsStr]) {
    let mut cmd = Command::new(compiler);
    cmd.args(args);
    run_ok(&mut cmd);
}

/// `stacks.rs` built into `dir/out` with frame pointers (`-C force-frame-pointers=yes`), full
/// debug info, `-C opt-level=2`, and stacks_ffi.c (`-O2 -fno-omit-frame-pointer -g`) linked in.
pub fn rust_stacks(dir: &Path, out: &str) -> PathBuf {
    let obj = dir.join(format!("{out}-ffi.o"));
    cc(
        "cc",
        &[
            "-O2".as_ref(),
            "-g".as_ref(),
            "-fno-omit-frame-pointer".as_ref(),
            "-c".as_ref(),
            source("stacks_ffi.c").as_os_str(),
            "-o".as_ref(),
            obj.as_os_str(),
        ],
    );
    let lib = dir.join(format!("lib{out}_ffi.a"));
    run_ok(Command::new("ar").arg("rcs").arg(&lib).arg(&obj));
    let exe = dir.join(out);
    run_ok(
        Command::new("rustc")
            .args(["--edition", "2021", "-C", "force-frame-pointers=yes"])
            .args(["-C", "debuginfo=2", "-C", "opt-level=2"])
            .arg(source("stacks.rs"))
            .arg("-L")
            .arg(dir)
            .arg("-l")
            .arg(format!("static={out}_ffi"))
            .arg("-o")
            .arg(&exe),
    );
    exe
}

/// `chain.c` built into `dir/out` with `-O2 -g` and, if `frame_pointers`,
/// `-fno-omit-frame-pointer` (else `-fomit-frame-pointer`), plus `extra` arguments.
pub fn c_chain(dir: &Path, out: &str, frame_pointers: bool, extra: &[&str]) -> PathBuf {
    let exe = dir.join(out);
    let fp = if frame_pointers {
        "-fno-omit-frame-pointer"
    } else {
        "-fomit-frame-pointer"
    };
    let src = source("chain.c");
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["-O2".as_ref(), "-g".as_ref(), fp.as_ref(), src.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.extend(["-o".as_ref(), exe.as_os_str()]);
    cc("cc", &args);
    exe
}

/// `pthread_locks.c` (threads contending on pthread locks, measuring their own waits) built
/// into `dir/out` as distributions build C: `-O2 -fomit-frame-pointer`, no debug information.
pub fn pthread_locks(dir: &Path, out: &str) -> PathBuf {
    let exe = dir.join(out);
    let src = source("pthread_locks.c");
    cc(
        "cc",
        &[
            "-O2".as_ref(),
            "-fomit-frame-pointer".as_ref(),
            "-pthread".as_ref(),
            src.as_os_str(),
            "-o".as_ref(),
            exe.as_os_str(),
        ],
    );
    exe
}

/// `dlopen_lib.c` built into the shared object `dir/out` (`-O2 -g -fno-omit-frame-pointer`).
pub fn dlopen_lib(dir: &Path, out: &str) -> PathBuf {
    let so = dir.join(out);
    cc(
        "cc",
        &[
            "-O2".as_ref(),
            "-g".as_ref(),
            "-fno-omit-frame-pointer".as_ref(),
            "-fPIC".as_ref(),
            "-shared".as_ref(),
            source("dlopen_lib.c").as_os_str(),
            "-o".as_ref(),
            so.as_os_str(),
        ],
    );
    so
}

/// `cxx_chain.cc` built into `dir/out` (`-O2 -g -fno-omit-frame-pointer`).
pub fn cxx_chain(dir: &Path, out: &str) -> PathBuf {
    let exe = dir.join(out);
    cc(
        "c++",
        &[
            "-O2".as_ref(),
            "-g".as_ref(),
            "-fno-omit-frame-pointer".as_ref(),
            source("cxx_chain.cc").as_os_str(),
            "-o".as_ref(),
            exe.as_os_str(),
        ],
    );
    exe
}

/// One file-backed line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// Whether it is mapped executable.
    pub exec: bool,
    /// The file.
    pub path: PathBuf,
}

/// What a fixture printed with `--print`: its named addresses and its mappings.
#[derive(Clone, Debug, Default)]
pub struct Printed {
    /// `NAME` → address.
    pub addrs: BTreeMap<String, u64>,
    /// Its file-backed mappings.
    pub maps: Vec<Mapping>,
}

impl Printed {
    /// Parses a fixture's `--print` output.
    pub fn parse(stdout: &str) -> Printed {
        let mut out = Printed::default();
        let mut lines = stdout.lines();
        for line in lines.by_ref() {
            if line == "maps" {
                break;
            }
            let (name, addr) = line.split_once(' ').expect("NAME 0xADDRESS");
            let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16)
                .unwrap_or_else(|e| panic!("{line:?}: {e}"));
            out.addrs.insert(name.to_string(), addr);
        }
        for line in lines {
            // start-end perms offset dev inode path
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[5].starts_with('/') {
                continue;
            }
            let (start, end) = f[0].split_once('-').expect("start-end");
            let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
            out.maps.push(Mapping {
                start: hex(start),
                end: hex(end),
                file_offset: hex(f[2]),
                exec: f[1].contains('x'),
                path: PathBuf::from(f[5..].join(" ")),
            });
        }
        out
    }

    /// The address printed as `name`.
    pub fn addr(&self, name: &str) -> u64 {
        *self
            .addrs
            .get(name)
            .unwrap_or_else(|| panic!("the fixture printed no {name}: {:?}", self.addrs))
    }

    /// The file and file offset of `addr` (an executable mapping's), as a recorded frame
    /// holds them: `addr − start + file offset`.
    pub fn file_offset(&self, addr: u64) -> (PathBuf, u64) {
        let m = self
            .maps
            .iter()
            .find(|m| m.exec && (m.start..m.end).contains(&addr))
            .unwrap_or_else(|| panic!("{addr:#x} is in no executable mapping: {:#?}", self.maps));
        (m.path.clone(), addr - m.start + m.file_offset)
    }
}

/// Runs `exe` with `args` (it must succeed) and parses what it printed.
pub fn run_printed(exe: &Path, args: &[&std::ffi::OsStr]) -> Printed {
    let out = run_ok(Command::new(exe).args(args));
    Printed::parse(&String::from_utf8(out.stdout).expect("UTF-8 output"))
}

/// `alloc_stacks.rs` (the allocator recorder's call-stack fixture) built into `dir/out` with
/// frame pointers, debug info and `-C opt-level=2`, against the memtrack library of the test
/// that calls this: the newest `libmemtrack-*.rlib` beside the test binary that links (each
/// is tried, newest first: the directory keeps builds of other feature sets and versions).
pub fn rust_alloc_stacks(dir: &Path, out: &str) -> PathBuf {
    let exe_dir = std::env::current_exe()
        .expect("the test binary's path")
        .parent()
        .expect("its directory")
        .to_path_buf();
    let mut rlibs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&exe_dir)
        .expect("the test binary's directory")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let name = p.file_name()?.to_str()?;
            (name.starts_with("libmemtrack-") && name.ends_with(".rlib"))
                .then(|| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))?
        })
        .collect();
    rlibs.sort_by_key(|r| std::cmp::Reverse(r.0));
    let exe = dir.join(out);
    let mut errors = String::new();
    for (_, rlib) in &rlibs {
        let o = Command::new("rustc")
            .args(["--edition", "2024", "-C", "force-frame-pointers=yes"])
            .args(["-C", "debuginfo=2", "-C", "opt-level=2"])
            .arg("--extern")
            .arg(format!("memtrack={}", rlib.display()))
            .arg("-L")
            .arg(format!("dependency={}", exe_dir.display()))
            .arg(source("alloc_stacks.rs"))
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("running rustc");
        if o.status.success() {
            return exe;
        }
        errors.push_str(&format!(
            "{}: {}\n",
            rlib.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    panic!(
        "alloc_stacks.rs does not build against any memtrack library in {}:\n{errors}",
        exe_dir.display()
    );
}
