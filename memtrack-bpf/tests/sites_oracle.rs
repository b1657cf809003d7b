//! The probe sites of the system's allocator libraries checked against an independent oracle:
//! binutils' `readelf -W --syms --dyn-syms` (function symbols) and `readelf -W -l` (the PT_LOAD
//! segments that map a symbol's address to its file offset), parsed here.
//!
//! For each of libc, libstdc++, libjemalloc and libmimalloc that is installed: every site's
//! symbol is a defined function symbol that readelf places at the site's `symbol_offset`, and
//! every function readelf lists under a probed name has a site at its offset (one per
//! address: aliases share one).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;

use memtrack_bpf::{PROBES, probe_sites};

const LIBS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
];

fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("readelf (binutils) must be installed for this test");
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

#[test]
fn sites_agree_with_readelf() {
    let probed: HashSet<&str> = PROBES
        .iter()
        .flat_map(|t| t.iter().map(|s| s.symbol))
        .collect();
    let mut checked = 0;
    for lib in LIBS.map(Path::new) {
        if !lib.exists() {
            eprintln!("{} not installed: not checked", lib.display());
            continue;
        }
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
        eprintln!(
            "{}: {} sites, {} probed names confirmed by readelf",
            lib.display(),
            sites.len(),
            expected.len()
        );
        checked += 1;
    }
    assert!(checked > 0, "none of {LIBS:?} is installed");
}
