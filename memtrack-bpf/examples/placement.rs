//! Where memtrack's entry probes go in each allocator entry point of some ELF files, and
//! whether the kernel emulates the probed instruction (cheap) or must single-step it (a trap
//! and a second exception: ~10 µs per hit, against under a microsecond emulated).
//!
//! ```text
//! cargo run --release -p memtrack-bpf --example placement [FILE...]
//! ```
//! Without arguments: this system's libc and libstdc++ (and any jemalloc or mimalloc found
//! beside them). Needs no privileges: it only reads the files.

use std::path::PathBuf;

use memtrack_bpf::{PlacementRule, probe_sites};

fn default_files() -> Vec<PathBuf> {
    let dir = PathBuf::from("/usr/lib/x86_64-linux-gnu");
    [
        "libc.so.6",
        "libstdc++.so.6",
        "libjemalloc.so.2",
        "libmimalloc.so.2",
    ]
    .iter()
    .map(|f| dir.join(f))
    .filter(|p| p.exists())
    .collect()
}

fn main() {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let files = if args.is_empty() {
        default_files()
    } else {
        args
    };
    for file in files {
        let sites = match probe_sites(&file) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                continue;
            }
        };
        println!("{} ({} sites)", file.display(), sites.len());
        println!(
            "  {:<34} {:>7} {:>6}  {:<13} return probe",
            "symbol", "offset", "+skip", "probed insn"
        );
        for s in sites {
            let how = match s.placement.rule {
                PlacementRule::Emulated => "emulated",
                PlacementRule::Fallback => "single-step",
                PlacementRule::BranchTarget => "single-step*",
            };
            println!(
                "  {:<34} {:>#7x} {:>6}  {:<13} {}",
                s.symbol,
                s.symbol_offset,
                s.placement.offset,
                how,
                if s.ret { "yes" } else { "no" }
            );
        }
    }
    println!(
        "single-step*: an emulated instruction was reachable but a branch in the function may \
         target it, so the probe stays at offset 0"
    );
}
