//! Feeds arbitrary bytes to the artifact reader: it must return an error or events (and call
//! stacks), never panic, hang or allocate without bound. Seeds: fuzz/seeds/reader (`memtrack
//! synth` outputs, with and without `--stacks`, some cut short) and tests/fuzz-regressions; CI
//! runs it for 60 s with `.ci/fuzz`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = memtrack::artifact::Reader::from_bytes(data.to_vec()) else {
        return;
    };
    let mut analyzer = memtrack::analysis::Analyzer::new();
    for ev in reader.events() {
        match ev {
            Ok(ev) => analyzer.update(&ev),
            Err(_) => break,
        }
    }
    let _ = analyzer.totals();
    // The definitions blocks (modules and stacks) of format 1.5, frame by frame and as a table.
    for i in 0..reader.frames().len() {
        let _ = reader.frame_definitions(i);
    }
    if let Ok(table) = reader.stacks() {
        std::hint::black_box(table.stacks().count() + table.modules().count());
    }
    let _ = reader.for_each_frame(|_, evs| {
        std::hint::black_box(evs);
        Ok(())
    });
});
