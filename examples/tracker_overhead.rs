//! ns per malloc+free pair recorded in-process by memtrack's tracker (probes, ring buffer,
//! poller and encoder all running), against the same loop untracked.
//!
//! ```text
//! sudo cargo run --release --example tracker_overhead [PAIRS] [RUNS]
//! ```
//! The uprobe floor at the same sites is measured by
//! `cargo run --release -p memtrack-bpf --example overhead`.

use std::hint::black_box;
use std::time::Instant;

use memtrack::{Backend, EncoderOptions, Metadata, Tracker, TrackerOptions};

fn pairs_ns(pairs: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..pairs {
        // The System allocator: one malloc(16) and one free per iteration.
        drop(black_box(Box::new([0u8; 16])));
    }
    t.elapsed().as_nanos() as f64 / pairs as f64
}

fn median(pairs: u64, runs: usize) -> f64 {
    let mut v: Vec<f64> = (0..runs).map(|_| pairs_ns(pairs)).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), memtrack::Error> {
    let args: Vec<String> = std::env::args().collect();
    let pairs: u64 = args.get(1).map_or(1_000_000, |a| a.parse().expect("PAIRS"));
    let runs: usize = args.get(2).map_or(5, |a| a.parse().expect("RUNS"));
    let untracked = median(pairs, runs);
    let tracker = Tracker::global(&TrackerOptions::new())?;
    let path = std::env::temp_dir().join("tracker_overhead.memtrack");
    let file =
        std::fs::File::create(&path).map_err(|e| memtrack::Error::InvalidOption(e.to_string()))?;
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("tracker_overhead");
    let rec = tracker.start(file, &meta, EncoderOptions::new(), 1)?;
    let tracked = median(pairs, runs);
    let recorded = rec.stop()?;
    println!("{pairs} pairs, median of {runs} runs, ns per malloc+free pair");
    println!("untracked {untracked:>9.1}");
    println!("tracked   {tracked:>9.1}");
    println!(
        "recorded {} events ({} allocations), {} lost, artifact {} bytes",
        recorded.written.events,
        recorded.written.totals.allocations,
        recorded.lost_events,
        recorded.written.bytes
    );
    Ok(())
}
