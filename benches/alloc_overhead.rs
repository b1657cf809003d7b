//! Marginal cost of the allocator backend per event, on an allocation-heavy workload: a
//! 64-slot ring of blocks of varying sizes (8..1032 bytes), N = 2,000,000 alloc+free pairs.
//! Three configurations side by side, interleaved 7 times, medians:
//! untracked (`System` directly), `memtrack::Allocator` with no session, and with a session
//! recording (the allocator backend). Targets: ≤ 1 ns/event with no session, ≤ 20 ns/event
//! recording.
//!
//! Run: `cargo bench --bench alloc_overhead` (no privileges needed).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use memtrack::{Allocator, BackendChoice, SessionBuilder};

#[global_allocator]
static GLOBAL: Allocator = Allocator::system();

const N: usize = 2_000_000;

/// `n` alloc+free pairs through `a`: 2n events. Returns ns per pair.
fn workload(a: &dyn GlobalAlloc, n: usize) -> f64 {
    let mut ring: [(*mut u8, Layout); 64] = [(std::ptr::null_mut(), Layout::new::<u8>()); 64];
    let mut x: u32 = 12345;
    let t = Instant::now();
    for i in 0..n {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let size = 8 + (x >> 22) as usize; // 8..1032
        let slot = &mut ring[i % 64];
        if !slot.0.is_null() {
            // SAFETY: allocated below with this layout by the same allocator.
            unsafe { a.dealloc(slot.0, slot.1) };
        }
        let layout = Layout::from_size_align(size, 8).expect("layout");
        // SAFETY: non-zero size.
        *slot = (unsafe { a.alloc(layout) }, layout);
        black_box(slot.0);
    }
    let elapsed = t.elapsed().as_nanos() as f64;
    for (p, l) in ring {
        if !p.is_null() {
            // SAFETY: as above.
            unsafe { a.dealloc(p, l) };
        }
    }
    elapsed / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let wrapper = Allocator::system();
    let dir = tempfile::tempdir().expect("tempdir");
    // Sized up front: the vectors must not grow while a session records.
    let (mut untracked, mut idle, mut recording) = (
        Vec::with_capacity(7),
        Vec::with_capacity(7),
        Vec::with_capacity(7),
    );
    for _ in 0..7 {
        untracked.push(workload(&System, N));
        idle.push(workload(&wrapper, N));
        let s = SessionBuilder::new("alloc_overhead")
            .backend(BackendChoice::Alloc)
            .output_dir(dir.path())
            .quiet(true)
            .start()
            .expect("allocator backend session");
        recording.push(workload(&wrapper, N));
        let r = s.finish().expect("finish");
        assert_eq!(r.totals.allocations, N as u64, "every allocation recorded");
    }
    // The cost on the measured thread alone: bursts that fit the thread's ring, so the
    // producer never waits for the collector and encoder.
    const BURST: usize = 2_000;
    let (mut b_untracked, mut b_recording) = (Vec::with_capacity(200), Vec::with_capacity(200));
    let s = SessionBuilder::new("alloc_overhead_burst")
        .backend(BackendChoice::Alloc)
        .output_dir(dir.path())
        .quiet(true)
        .start()
        .expect("allocator backend session");
    for _ in 0..200 {
        b_untracked.push(workload(&System, BURST));
        b_recording.push(workload(&wrapper, BURST));
        // Let the collector drain the ring between bursts.
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    s.finish().expect("finish");
    let (bu, br) = (median(b_untracked), median(b_recording));
    let (u, i, r) = (median(untracked), median(idle), median(recording));
    println!(
        "alloc_overhead: N = {N} alloc+free pairs (2 events each), medians of 7 interleaved runs"
    );
    println!("  untracked (System)            {u:8.2} ns/pair");
    println!(
        "  Allocator, no session         {i:8.2} ns/pair   marginal {:+.2} ns/event",
        (i - u) / 2.0
    );
    println!(
        "  Allocator, session recording  {r:8.2} ns/pair   marginal {:+.2} ns/event",
        (r - u) / 2.0
    );
    println!(
        "  bursts of {BURST} pairs that fit the thread's ring (the cost on the measured thread): \
         untracked {bu:.2}, recording {br:.2} ns/pair, marginal {:+.2} ns/event (medians of 200)",
        (br - bu) / 2.0
    );
}
