//! ns per malloc+free pair recorded in-process by memtrack's tracker (probes, ring buffer,
//! poller and encoder all running), against the same loop untracked.
//!
//! ```text
//! sudo cargo run --release --example tracker_overhead [PAIRS] [RUNS]
//! ```
//! The tracker is loaded first; then every run times the untracked loop and a recording of the
//! same loop, in alternating order (ABBA), after a warm-up of both. A tracked run is timed from
//! the first pair to the end of `Recording::stop` (drain, last frames, trailer), minus the
//! median time an empty recording's `stop` takes. A run that lost an event fails. Medians.
//! The uprobe floor at the same sites is measured by
//! `cargo run --release -p memtrack-bpf --example overhead`.

use std::hint::black_box;
use std::time::Instant;

use memtrack::{
    Recorded, artifact::Backend, artifact::Metadata, encode::EncoderOptions, tracker::Tracker,
    tracker::TrackerOptions,
};

/// A failed file, a tracker error or a run that lost events, each with its message.
type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

fn pairs(n: u64) {
    for _ in 0..n {
        // The System allocator: one malloc(16) and one free per iteration.
        drop(black_box(Box::new([0u8; 16])));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Records `n` pairs; ns from the first pair to the end of `stop`.
fn tracked(tracker: &Tracker, n: u64) -> Result<(f64, Recorded)> {
    let path = std::env::temp_dir().join("tracker_overhead.memtrack");
    let file =
        std::fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("tracker_overhead");
    let rec = tracker.start(file, &meta, EncoderOptions::new(), 1)?;
    let t = Instant::now();
    pairs(n);
    let recorded = rec.stop()?;
    let ns = t.elapsed().as_nanos() as f64;
    if recorded.lost_events > 0 {
        return Err(format!(
            "a run lost {} events: its time would be wrong (raise the ring buffer)",
            recorded.lost_events
        )
        .into());
    }
    Ok((ns, recorded))
}

fn untracked(n: u64) -> f64 {
    let t = Instant::now();
    pairs(n);
    t.elapsed().as_nanos() as f64
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).map_or(1_000_000, |a| a.parse().expect("PAIRS"));
    let runs: usize = args.get(2).map_or(5, |a| a.parse().expect("RUNS"));
    let tracker = Tracker::global(&TrackerOptions::new())?;
    // Warm-up of both sides.
    untracked(n / 10);
    tracked(tracker, n / 10)?;
    let (mut u, mut t, mut empty) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for run in 0..runs {
        let mut one_tracked = || -> Result<()> {
            let (ns, rec) = tracked(tracker, n)?;
            t.push(ns);
            last = Some(rec);
            empty.push(tracked(tracker, 0)?.0);
            Ok(())
        };
        if run % 2 == 0 {
            u.push(untracked(n));
            one_tracked()?;
        } else {
            one_tracked()?;
            u.push(untracked(n));
        }
    }
    let (u, t, e) = (median(u), median(t), median(empty));
    let per = |x: f64| x / n as f64;
    println!("{n} pairs, medians of {runs} interleaved runs, ns per malloc+free pair");
    println!("untracked {:>9.1}", per(u));
    println!(
        "tracked   {:>9.1}   (to the end of stop, minus an empty recording's {:.2} ms)",
        per(t - e),
        e / 1e6
    );
    if let Some(r) = last {
        println!(
            "last run: {} events ({} allocations), {} lost, artifact {} bytes",
            r.written.events, r.written.totals.allocations, r.lost_events, r.written.bytes
        );
    }
    Ok(())
}
