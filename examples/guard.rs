//! The programmatic API: start a session, run code, read the [`memtrack::Report`].
//!
//! Run (needs root, or CAP_BPF + CAP_PERFMON): `cargo run --release --example guard`

fn main() -> Result<(), memtrack::Error> {
    let session = memtrack::SessionBuilder::new("guard_example")
        .quiet(true)
        .start()?;

    // The measured code: 1,000 boxed 1 KiB buffers, half of them kept.
    let mut kept = Vec::with_capacity(500);
    for i in 0..1_000 {
        let buf = vec![i as u8; 1024].into_boxed_slice();
        if i % 2 == 0 {
            kept.push(buf);
        }
    }

    let report = session.finish()?;
    let t = &report.totals();
    println!("allocations      {}", t.allocations);
    println!("bytes allocated  {}", t.bytes_allocated);
    println!("peak live bytes  {}", t.peak_live_bytes);
    println!(
        "live at end      {} blocks, {} bytes",
        t.live_blocks_at_end, t.live_bytes_at_end
    );
    println!("lost events      {}", report.lost_events());
    for (tid, th) in &t.per_thread {
        println!("thread {tid}: {} allocations", th.allocations);
    }
    println!("artifact         {}", report.where_written());
    drop(kept);
    Ok(())
}
