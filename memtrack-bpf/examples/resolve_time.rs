//! Time to resolve the probe sites of each allocator library (open the file, read its symbol
//! tables, map symbols to file offsets, choose each placement): what a cold session pays per
//! mapped library before it can attach.
//!
//! ```text
//! cargo run --release -p memtrack-bpf --example resolve_time [ROUNDS] [FILE...]
//! ```
//! Without files: this system's libc, libstdc++, libjemalloc and libmimalloc (those installed)
//! and this executable (a Rust binary with a large `.symtab`). Rounds alternate over the files;
//! the median per file is printed, in µs. The page cache is warm after the first round.

use std::path::PathBuf;
use std::time::Instant;

use memtrack_bpf::probe_sites;

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(51, |a| a.parse().expect("ROUNDS"));
    let mut files: Vec<PathBuf> = args.map(PathBuf::from).collect();
    if files.is_empty() {
        let dir = PathBuf::from("/usr/lib/x86_64-linux-gnu");
        files = [
            "libc.so.6",
            "libstdc++.so.6",
            "libjemalloc.so.2",
            "libmimalloc.so.2",
        ]
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| p.exists())
        .collect();
        files.push(std::env::current_exe().expect("current_exe"));
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); files.len()];
    let mut counts = vec![0; files.len()];
    for _ in 0..rounds {
        for (i, f) in files.iter().enumerate() {
            let t = Instant::now();
            let sites = probe_sites(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            times[i].push(t.elapsed().as_secs_f64() * 1e6);
            counts[i] = sites.len();
        }
    }
    println!("probe_sites per file, median of {rounds} rounds (µs)");
    for ((f, mut t), n) in files.iter().zip(times).zip(counts) {
        t.sort_by(f64::total_cmp);
        let size = std::fs::metadata(f).map_or(0, |m| m.len());
        println!(
            "  {:<45} {:>9.1} µs  ({n} sites, {:.1} MB)",
            f.display(),
            t[t.len() / 2],
            size as f64 / 1e6
        );
    }
}
