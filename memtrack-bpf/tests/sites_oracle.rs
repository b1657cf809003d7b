//! The probe sites of the system's allocator libraries checked against an independent oracle:
//! binutils' `readelf -W --syms --dyn-syms` (function symbols) and `readelf -W -l` (the PT_LOAD
//! segments that map a symbol's address to its file offset), parsed here.
//!
//! For each of libc, libstdc++, libjemalloc and libmimalloc (one test each): every site's
//! symbol is a defined function symbol that readelf places at the site's `symbol_offset`, and
//! every function readelf lists under a probed name has a site at its offset (one per
//! address: aliases share one).
//!
//! `harness = false` (memtrack-test-support's runner): a library that is not installed is
//! reported as ignored with how to install it (a failure under MEMTRACK_REQUIRE_PRIVILEGED, as
//! CI runs), never as passed.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;

use memtrack_bpf::{Entry, PROBES, probe_sites};
use memtrack_test_support::{Need, requires, run};

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// (test name suffix, library, how to install it).
const LIBS: [(&str, &str, &str); 4] = [
    ("libc", LIBC, "a Debian-style x86-64 glibc (libc6)"),
    (
        "libstdcxx",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "apt-get install libstdc++6",
    ),
    (
        "jemalloc",
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "apt-get install libjemalloc-dev (.ci/setup does)",
    ),
    (
        "mimalloc",
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
        "apt-get install libmimalloc-dev (.ci/setup does)",
    ),
];

fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf {args:?} {}", file.display());
    String::from_utf8(out.stdout).expect("readelf prints UTF-8")
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("hex {s:?}"))
}

/// (vaddr, file offset, file size) of each LOAD line of `readelf -W -l`.
fn loads(file: &Path) -> Vec<(u64, u64, u64)> {
    readelf(&["-W", "-l"], file)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Type Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align
            (f.first() == Some(&"LOAD")).then(|| (hex(f[2]), hex(f[1]), hex(f[4])))
        })
        .collect()
}

/// name (version stripped) → file offsets of the defined FUNC symbols of that name.
fn functions(file: &Path) -> HashMap<String, HashSet<u64>> {
    let loads = loads(file);
    let mut out: HashMap<String, HashSet<u64>> = HashMap::new();
    for l in readelf(&["-W", "--syms", "--dyn-syms"], file).lines() {
        // Num: Value Size Type Bind Vis Ndx Name
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 8 || !f[0].ends_with(':') || f[3] != "FUNC" || f[6] == "UND" {
            continue;
        }
        let vaddr = hex(f[1]);
        if vaddr == 0 {
            continue;
        }
        let name = f[7].split('@').next().unwrap().to_owned();
        let off = loads
            .iter()
            .find_map(|&(v, o, sz)| (vaddr >= v && vaddr - v < sz).then(|| o + vaddr - v))
            .unwrap_or_else(|| panic!("{name} at {vaddr:#x} is in no LOAD segment"));
        out.entry(name).or_default().insert(off);
    }
    out
}

/// Every site of `lib` is a function readelf places at its offset, and every function readelf
/// lists under a probed name has a site (one per address: aliases share one).
fn sites_agree_with_readelf(lib: &Path) {
    let probed: HashSet<&str> = PROBES
        .iter()
        .flat_map(|t| t.iter().map(|s| s.symbol))
        .collect();
    let oracle = functions(lib);
    let sites = probe_sites(lib).unwrap();
    assert!(!sites.is_empty(), "{}: no sites", lib.display());
    for s in &sites {
        let offs = oracle.get(&s.symbol).unwrap_or_else(|| {
            panic!(
                "{}: {} is not a function to readelf",
                lib.display(),
                s.symbol
            )
        });
        assert!(
            offs.contains(&s.symbol_offset),
            "{}: {} at {:#x}, readelf says {offs:x?}",
            lib.display(),
            s.symbol,
            s.symbol_offset
        );
        assert_eq!(s.offset, s.symbol_offset + s.placement.offset, "{s:?}");
    }
    let site_offsets: HashSet<u64> = sites.iter().map(|s| s.symbol_offset).collect();
    assert_eq!(
        site_offsets.len(),
        sites.len(),
        "{}: two sites at one offset",
        lib.display()
    );
    let mut expected: Vec<(&str, u64)> = oracle
        .iter()
        .filter(|(n, _)| probed.contains(n.as_str()))
        .flat_map(|(n, offs)| offs.iter().map(move |&o| (n.as_str(), o)))
        .collect();
    expected.sort();
    for (name, off) in &expected {
        assert!(
            site_offsets.contains(off),
            "{}: readelf has {name} at {off:#x}, no site there",
            lib.display()
        );
    }
}

/// The system's glibc: every malloc-family entry point is found once, `free` is probed at
/// +3 and `malloc` at +0, and `aligned_alloc`/`memalign` (one function) get one site.
fn system_glibc() {
    let sites = probe_sites(Path::new(LIBC)).unwrap();
    let get = |n: &str| sites.iter().find(|s| s.symbol == n);
    let free = get("free").expect("free");
    assert_eq!(free.offset - free.symbol_offset, 3, "{free:?}");
    let malloc = get("malloc").expect("malloc");
    assert_eq!(malloc.offset, malloc.symbol_offset);
    assert!(malloc.ret);
    let aligned = get("aligned_alloc").or(get("memalign")).expect("memalign");
    assert!(
        get("aligned_alloc").is_none() || get("memalign").is_none(),
        "alias probed twice"
    );
    assert_eq!(aligned.entry, Entry::Memalign);
    for n in [
        "calloc",
        "realloc",
        "reallocarray",
        "posix_memalign",
        "valloc",
        "pvalloc",
    ] {
        assert!(get(n).is_some(), "{n} missing");
    }
    let offsets: HashSet<_> = sites.iter().map(|s| s.symbol_offset).collect();
    assert_eq!(offsets.len(), sites.len());
    // The syscall wrappers: one site each (mmap = mmap64 = __mmap), with a return probe.
    let sys: Vec<Entry> = sites
        .iter()
        .filter(|s| s.entry.is_syscall())
        .inspect(|s| assert!(s.ret, "{s:?}"))
        .map(|s| s.entry)
        .collect();
    let mut sorted = sys.clone();
    sorted.sort_by_key(|e| e.cookie());
    assert_eq!(
        sorted,
        [Entry::Mmap, Entry::Munmap, Entry::Mremap, Entry::Brk],
        "{sys:?}"
    );
}

fn main() {
    const READELF: Need = Need::Tool("readelf");
    let mut trials = vec![requires(
        "system_glibc",
        &[Need::File(LIBC, "a Debian-style x86-64 glibc (libc6)")],
        system_glibc,
    )];
    for (name, lib, install) in LIBS {
        let needs: &'static [Need] = Box::leak(Box::new([READELF, Need::File(lib, install)]));
        trials.push(requires(
            &format!("sites_agree_with_readelf_{name}"),
            needs,
            move || sites_agree_with_readelf(Path::new(lib)),
        ));
    }
    run(trials);
}
