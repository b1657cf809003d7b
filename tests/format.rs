//! Round trips, framing, recovery and corruption detection of the artifact format.

use memtrack::{
    Backend, Completeness, Encoder, EncoderOptions, Event, EventKind, FormatError as Error,
    Metadata, Reader, Synth, SynthOptions, VERSION_MINOR,
};
use proptest::prelude::*;

fn meta() -> Metadata {
    // Fixed metadata, so two encodings of the same events can be compared byte for byte.
    let mut m = Metadata::now(7, Backend::Other).with_name("test");
    m.start_unix_ns = 1;
    m.start_monotonic_ns = 2;
    m
}

fn encode_with(events: &[Event], opts: EncoderOptions) -> Vec<u8> {
    let mut enc = Encoder::new(Vec::new(), &meta(), opts).expect("encoder");
    enc.set_end_time(99);
    enc.extend(events.iter().copied()).expect("push");
    enc.finish_into(0).expect("finish").0
}

fn encode(events: &[Event], frame_events: usize) -> Vec<u8> {
    encode_with(
        events,
        EncoderOptions::new().workers(2).frame_events(frame_events),
    )
}

fn decode(bytes: Vec<u8>) -> Vec<Event> {
    let r = Reader::from_bytes(bytes).expect("open");
    assert_eq!(r.completeness(), &Completeness::Complete);
    r.events().collect::<Result<_, _>>().expect("decode")
}

fn synth(n: usize) -> Vec<Event> {
    Synth::new(SynthOptions {
        seed: 3,
        threads: 3,
    })
    .take(n)
    .collect()
}

#[test]
fn round_trip_is_exact_and_reencoding_is_byte_identical() {
    let events = synth(50_000);
    let bytes = encode(&events, 4096);
    let back = decode(bytes.clone());
    assert_eq!(back, events);
    assert_eq!(encode(&back, 4096), bytes);
}

#[test]
fn order_is_preserved_across_frames_and_windows() {
    // Tiny frames and a window of 2 frames: thousands of frames pass through the pool.
    let events: Vec<Event> = (0..20_011u64)
        .map(|i| Event::new(i, 1, (i % 5) as u32, EventKind::Free { addr: i * 16 }))
        .collect();
    for (workers, frame) in [(1, 7), (2, 7), (3, 64), (2, 1)] {
        let opts = EncoderOptions::new()
            .workers(workers)
            .frame_events(frame)
            .window(2);
        let r = Reader::from_bytes(encode_with(&events, opts)).expect("open");
        assert_eq!(r.frames().len(), 20_011usize.div_ceil(frame));
        let back: Vec<Event> = r.events().collect::<Result<_, _>>().expect("decode");
        assert_eq!(back, events, "workers {workers}, frame {frame}");
        // The parallel decoder hands frames over in order too.
        let mut par = Vec::new();
        r.for_each_frame(|i, evs| {
            assert_eq!(r.frames()[i].events as usize, evs.len());
            par.extend_from_slice(evs);
            Ok(())
        })
        .expect("parallel decode");
        assert_eq!(par, events);
    }
}

#[test]
fn empty_stream_and_single_event() {
    let r = Reader::from_bytes(encode(&[], 16)).expect("open");
    assert_eq!((r.frames().len(), r.event_count()), (0, 0));
    assert_eq!(r.events().count(), 0);
    let fin = r.final_metadata().expect("trailer");
    assert_eq!(fin.totals.events, 0);

    let one = [Event::new(5, 1, 2, EventKind::Brk { addr: 0x1000 })];
    assert_eq!(decode(encode(&one, 16)), one);
}

#[test]
fn frame_boundaries() {
    let events = synth(1000);
    for frame in [1, 2, 99, 100, 101, 999, 1000, 1001] {
        for n in [frame - 1, frame, frame + 1, 2 * frame, 2 * frame + 1] {
            let n = n.min(events.len());
            let bytes = encode(&events[..n], frame);
            let r = Reader::from_bytes(bytes.clone()).expect("open");
            assert_eq!(r.frames().len(), n.div_ceil(frame));
            assert_eq!(decode(bytes), &events[..n]);
        }
    }
}

#[test]
fn totals_in_the_trailer_match_an_independent_count() {
    let events = synth(30_000);
    let r = Reader::from_bytes(encode(&events, 1000)).expect("open");
    let t = &r.final_metadata().expect("trailer").totals;
    let allocs = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::Malloc { .. }
                    | EventKind::Calloc { .. }
                    | EventKind::Realloc { .. }
                    | EventKind::AlignedAlloc { .. }
            )
        })
        .count() as u64;
    let bytes: u64 = events
        .iter()
        .map(|e| match e.kind {
            EventKind::Malloc { size, .. }
            | EventKind::Calloc { size, .. }
            | EventKind::Realloc { size, .. }
            | EventKind::AlignedAlloc { size, .. } => size,
            _ => 0,
        })
        .sum();
    assert_eq!(
        (t.events, t.allocations, t.bytes_allocated),
        (30_000, allocs, bytes)
    );
    let per_thread: u64 = t.per_thread.values().map(|p| p.allocations).sum();
    assert_eq!(per_thread, allocs);
}

/// Where each frame starts and ends, from an intact file.
fn frame_spans(bytes: &[u8]) -> Vec<(u64, u64)> {
    let r = Reader::from_bytes(bytes.to_vec()).expect("open");
    r.frames()
        .iter()
        .map(|f| (f.offset, f.offset + 40 + f.payload_len as u64))
        .collect()
}

#[test]
fn truncation_at_every_frame_boundary_and_mid_frame_recovers_complete_frames() {
    let events = synth(5_000);
    let bytes = encode(&events, 500);
    let spans = frame_spans(&bytes);
    let header_end = spans[0].0 as usize;
    let mut cuts: Vec<usize> = Vec::new();
    for &(start, end) in &spans {
        let (s, e) = (start as usize, end as usize);
        cuts.extend([s, s + 1, s + 39, s + 40, (s + e) / 2, e - 1]);
    }
    cuts.extend(spans.last().unwrap().1 as usize..bytes.len());
    for cut in cuts {
        let r = Reader::from_bytes(bytes[..cut].to_vec())
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let Completeness::Recovered { reason } = r.completeness() else {
            panic!("cut at {cut} read as complete");
        };
        assert!(reason.contains("trailer is missing"), "{reason}");
        let whole = spans.iter().filter(|&&(_, e)| e as usize <= cut).count();
        assert_eq!(r.frames().len(), whole, "cut at {cut}");
        let back: Vec<Event> = r
            .events()
            .collect::<Result<_, _>>()
            .expect("recovered frames decode");
        assert_eq!(back, events[..whole * 500], "cut at {cut}");
        assert!(r.final_metadata().is_none());
    }
    // Inside the header: a clear error, never a result.
    for cut in [0, 4, 12, 19, header_end - 1] {
        assert!(
            Reader::from_bytes(bytes[..cut].to_vec()).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn every_flipped_byte_is_detected() {
    let events = synth(3_000);
    let bytes = encode(&events, 1000);
    let spans = frame_spans(&bytes);
    for pos in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[pos] ^= 0x10;
        let outcome = Reader::from_bytes(bad).and_then(|r| {
            let evs = r.events().collect::<Result<Vec<_>, _>>()?;
            Ok((r.completeness().clone(), evs))
        });
        match outcome {
            Err(Error::CorruptFrame { frame, offset, .. }) => {
                let i = spans
                    .iter()
                    .position(|&(s, e)| (s..e).contains(&(pos as u64)))
                    .unwrap_or_else(|| panic!("byte {pos}: frame error outside the frames"));
                assert_eq!((frame, offset), (i as u64, spans[i].0), "byte {pos}");
            }
            Err(Error::CorruptHeader { .. } | Error::NotAnArtifact { .. }) => {
                assert!(pos < spans[0].0 as usize, "byte {pos}");
            }
            Err(Error::UnsupportedVersion { .. }) => assert!((8..12).contains(&pos)),
            Err(Error::CorruptTrailer { .. }) => {
                assert!(pos >= spans.last().unwrap().1 as usize, "byte {pos}")
            }
            Err(e) => panic!("byte {pos}: unexpected error {e}"),
            // Only the end magic may be hit without an error: the file then reads as unfinished.
            Ok((Completeness::Recovered { .. }, evs)) => {
                assert!(pos >= bytes.len() - 8, "byte {pos}");
                assert_eq!(evs, events);
            }
            Ok((Completeness::Complete, _)) => panic!("flipped byte {pos} went unnoticed"),
        }
    }
}

#[test]
fn unknown_major_version_is_refused_with_a_clear_message() {
    let mut bytes = encode(&synth(10), 16);
    bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
    let err = Reader::from_bytes(bytes).err().expect("refused");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::UnsupportedVersion { major: 2, .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("version 2.{VERSION_MINOR} is not supported"))
            && msg.contains("reads format 1.x"),
        "{msg}"
    );
}

#[test]
fn invalid_options_are_errors() {
    for (opts, needle) in [
        (
            EncoderOptions::new().workers(0),
            "workers must be at least 1",
        ),
        (EncoderOptions::new().frame_events(0), "frame_events"),
        (EncoderOptions::new().level(0), "level"),
    ] {
        let err = Encoder::new(Vec::new(), &meta(), opts)
            .err()
            .expect("rejected");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

fn arb_kind() -> impl Strategy<Value = EventKind> {
    let a = any::<u64>();
    prop_oneof![
        (a, a).prop_map(|(addr, size)| EventKind::Malloc { addr, size }),
        (a, a).prop_map(|(addr, size)| EventKind::Calloc { addr, size }),
        (a, a, a).prop_map(|(old_addr, new_addr, size)| {
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            }
        }),
        (a, a, a).prop_map(|(addr, size, align)| EventKind::AlignedAlloc { addr, size, align }),
        a.prop_map(|addr| EventKind::Free { addr }),
        (a, a).prop_map(|(addr, size)| EventKind::Mmap { addr, size }),
        (a, a).prop_map(|(addr, size)| EventKind::Munmap { addr, size }),
        (a, a, a).prop_map(|(old_addr, new_addr, size)| {
            EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            }
        }),
        a.prop_map(|addr| EventKind::Brk { addr }),
        Just(EventKind::Exec),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    (any::<u64>(), any::<u32>(), any::<u32>(), arb_kind())
        .prop_map(|(ts, pid, tid, kind)| Event::new(ts, pid, tid, kind))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn arbitrary_events_round_trip(events in prop::collection::vec(arb_event(), 0..300), frame in 1usize..64) {
        prop_assert_eq!(decode(encode(&events, frame)), events);
    }
}

/// Inputs the fuzzer found crashing the reader once (`fuzz/`): each must now give a clean
/// error or a result.
#[test]
fn fuzz_regressions_read_without_panicking() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("regressions folder") {
        let bytes = std::fs::read(entry.expect("entry").path()).expect("read");
        if let Ok(r) = Reader::from_bytes(bytes) {
            for ev in r.events() {
                if ev.is_err() {
                    break;
                }
            }
        }
        n += 1;
    }
    assert!(n > 0);
}
