//! `memtrack plot`: the SVG parses, holds both series downsampled to the width, each on a
//! panel and scale of its own (the heap's above), marks the peak with the exact
//! `peak_live_bytes` of `memtrack show` on a ground of its own inside the image, and marks
//! where each recorded call begins with a tick on the heap panel's top edge that cannot be read
//! as the heap (another colour, far from zero).

mod common;

use std::path::Path;

use common::{memtrack, s, synth, text, write};
use memtrack::{event::Event, event::EventKind};

const HEAP: &str = "#0000FF";
const MAPPED: &str = "#E67800";
const CALL: &str = "#969696";

struct Svg {
    /// Points of the data polyline of each colour (the legend's 2-point swatches excluded);
    /// `mapped` empty when there is none.
    heap: Vec<(i64, i64)>,
    mapped: Vec<(i64, i64)>,
    /// The ticks marking where a call begins, each as (x, top y, bottom y).
    calls: Vec<(i64, i64, i64)>,
    /// Centre of the peak marker.
    marker: (i64, i64),
    /// The peak label's text, its anchor (x, y) and its ground (x, y, width, height).
    label: String,
    label_at: (i64, i64),
    ground: (i64, i64, i64, i64),
    /// Every text of the image, concatenated.
    texts: String,
}

fn polylines(doc: &roxmltree::Document<'_>, colour: &str) -> Vec<Vec<(i64, i64)>> {
    doc.descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(colour))
        .map(|n| {
            n.attribute("points")
                .unwrap()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

fn attr(n: roxmltree::Node<'_, '_>, a: &str) -> i64 {
    n.attribute(a).unwrap().parse().unwrap()
}

fn parse(path: &Path) -> Svg {
    let src = std::fs::read_to_string(path).expect("svg written");
    let doc = roxmltree::Document::parse(&src).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let series = |colour: &str| -> Vec<(i64, i64)> {
        let lines: Vec<Vec<(i64, i64)>> = polylines(&doc, colour)
            .into_iter()
            .filter(|pts| pts.len() > 2)
            .collect();
        assert!(lines.len() <= 1, "one {colour} data series");
        lines.into_iter().next().unwrap_or_default()
    };
    // A call's tick is 4 % of its panel (about 20 px); the legend's swatch is 12 px, and
    // thinner.
    let calls = polylines(&doc, CALL)
        .into_iter()
        .filter(|pts| pts.len() == 2 && pts[0].0 == pts[1].0 && (pts[0].1 - pts[1].1).abs() > 12)
        .map(|pts| (pts[0].0, pts[0].1.min(pts[1].1), pts[0].1.max(pts[1].1)))
        .collect();
    let circles: Vec<(i64, i64)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle"))
        .map(|n| (attr(n, "cx"), attr(n, "cy")))
        .collect();
    assert_eq!(circles.len(), 1, "one peak marker");
    let labels: Vec<roxmltree::Node<'_, '_>> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter(|n| n.text().is_some_and(|t| t.trim().starts_with("peak ")))
        .collect();
    assert_eq!(labels.len(), 1, "one peak label");
    let label = labels[0];
    // The label's white ground: the translucent rectangle drawn just before the marker.
    let grounds: Vec<(i64, i64, i64, i64)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some("#FFFFFF"))
        .filter(|n| n.attribute("opacity") == Some("0.85"))
        .map(|n| {
            (
                attr(n, "x"),
                attr(n, "y"),
                attr(n, "width"),
                attr(n, "height"),
            )
        })
        .filter(|&(x, y, w, h)| {
            let (lx, ly) = (attr(label, "x"), attr(label, "y"));
            x <= lx + 10 && lx <= x + w && y <= ly && ly <= y + h + 8
        })
        .collect();
    assert_eq!(grounds.len(), 1, "one ground under the label: {grounds:?}");
    let texts: String = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(
        texts.contains("live heap bytes"),
        "legend names the heap series"
    );
    Svg {
        heap: series(HEAP),
        mapped: series(MAPPED),
        calls,
        marker: circles[0],
        label: label.text().unwrap().trim().to_string(),
        label_at: (attr(label, "x"), attr(label, "y")),
        ground: grounds[0],
        texts,
    }
}

/// The number in "peak 1,234 B (…) at … ms".
fn label_bytes(label: &str) -> u64 {
    let n = label
        .strip_prefix("peak ")
        .and_then(|r| r.split(" B").next())
        .unwrap_or_else(|| panic!("label {label:?}"));
    n.replace(',', "").parse().expect("a byte count")
}

fn show_peak(path: &Path) -> u64 {
    let out = memtrack(&["show", "--json", s(path)]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["peak_live_bytes"].as_u64().unwrap()
}

#[test]
fn synth_plot_marks_shows_peak_and_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let art = synth(&dir.path().join("t.memtrack"), 200_000, 5);
    let svg = dir.path().join("heap.svg");
    let out = memtrack(&["plot", s(&art), "-o", s(&svg), "--width", "800"]);
    assert!(out.status.success(), "{}", text(&out));
    let p = parse(&svg);
    assert_eq!(label_bytes(&p.label), show_peak(&art));
    // 200,000 events folded into 800 columns: at most 4 points a column, plus the tail.
    assert!(p.heap.len() <= 4 * 800 + 1, "{} points", p.heap.len());
    assert!(p.mapped.len() <= 4 * 800 + 1, "{} points", p.mapped.len());
    // The marker sits on the highest point of the heap line (y grows downwards): the
    // downsampling kept the peak.
    let top = p.heap.iter().map(|&(_, y)| y).min().unwrap();
    assert_eq!(p.marker.1, top);
}

#[test]
fn a_one_nanosecond_spike_in_ten_seconds_survives() {
    let dir = tempfile::tempdir().unwrap();
    let ms = 1_000_000u64;
    let mut evs = vec![Event::new(
        0,
        7,
        7,
        EventKind::Malloc {
            addr: 0x1000,
            size: 1000,
        },
    )];
    // Background: a 100-byte block made and freed every 10 ms for 10 s.
    for i in 1..1000u64 {
        evs.push(Event::new(
            i * 10 * ms,
            7,
            7,
            EventKind::Malloc {
                addr: 0x2000,
                size: 100,
            },
        ));
        evs.push(Event::new(
            i * 10 * ms + 5 * ms,
            7,
            7,
            EventKind::Free { addr: 0x2000 },
        ));
        if i == 100 {
            evs.push(Event::new(
                i * 10 * ms + 1,
                7,
                8,
                EventKind::Mmap {
                    addr: 0x7000_0000,
                    size: 3 * 4096,
                },
            ));
        }
        if i == 500 {
            // Between the free at +5 ms and the next malloc: only the first block is live.
            evs.push(Event::new(
                i * 10 * ms + 6 * ms,
                7,
                8,
                EventKind::Malloc {
                    addr: 0x9000,
                    size: 1 << 20,
                },
            ));
            evs.push(Event::new(
                i * 10 * ms + 6 * ms + 1,
                7,
                8,
                EventKind::Free { addr: 0x9000 },
            ));
        }
    }
    evs.push(Event::new(
        10_000 * ms,
        7,
        7,
        EventKind::Free { addr: 0x1000 },
    ));
    let art = write(&dir.path().join("spike.memtrack"), Some("spike"), &evs, 0);
    let svg = dir.path().join("spike.svg");
    let out = memtrack(&["plot", s(&art), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let p = parse(&svg);
    assert_eq!(label_bytes(&p.label), 1000 + (1 << 20));
    assert_eq!(show_peak(&art), 1000 + (1 << 20));
    assert!(p.label.contains("at 5006.000 ms"), "{}", p.label);
    let top = p.heap.iter().map(|&(_, y)| y).min().unwrap();
    assert_eq!(p.marker.1, top);
    // The mapped series rises once (3 pages from 1 s on) and stays.
    let ys: std::collections::BTreeSet<i64> = p.mapped.iter().map(|&(_, y)| y).collect();
    assert_eq!(ys.len(), 2, "mapped bytes take two values: 0 and 12 KiB");
}

#[test]
fn an_empty_artifact_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let art = write(&dir.path().join("empty.memtrack"), None, &[], 0);
    let out = memtrack(&["plot", s(&art), "-o", s(&dir.path().join("e.svg"))]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no events"), "{}", text(&out));
}

/// A block of 1 MiB in 100 MiB of mappings: the heap's line spans most of its own panel (on
/// one axis it would be a line at the bottom), mapped bytes are drawn below it on theirs, and
/// the peak's label stays inside the image.
#[test]
fn the_heap_has_a_scale_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let ms = 1_000_000u64;
    let block = EventKind::Malloc {
        addr: 0x1000,
        size: 1 << 20,
    };
    let map = EventKind::Mmap {
        addr: 0x7000_0000,
        size: 100 << 20,
    };
    let evs = [
        Event::new(ms, 7, 7, EventKind::Brk { addr: 0x5000 }),
        Event::new(2 * ms, 7, 7, map),
        Event::new(3 * ms, 7, 7, block),
        Event::new(8 * ms, 7, 7, EventKind::Free { addr: 0x1000 }),
        Event::new(10 * ms, 7, 7, EventKind::Brk { addr: 0x5000 }),
    ];
    let art = write(&dir.path().join("mapped.memtrack"), Some("mapped"), &evs, 0);
    let svg = dir.path().join("mapped.svg");
    let out = memtrack(&["plot", s(&art), "-o", s(&svg), "--height", "600"]);
    assert!(out.status.success(), "{}", text(&out));
    let p = parse(&svg);
    assert_eq!(label_bytes(&p.label), 1 << 20);
    let ys = |pts: &[(i64, i64)]| {
        let y = pts.iter().map(|&(_, y)| y);
        (y.clone().min().unwrap(), y.max().unwrap())
    };
    let (heap_top, heap_bottom) = ys(&p.heap);
    assert!(
        heap_bottom - heap_top > 600 / 3,
        "the heap's line spans {} px of 600",
        heap_bottom - heap_top
    );
    let (mapped_top, _) = ys(&p.mapped);
    assert!(
        mapped_top > heap_bottom,
        "the mapped panel (from y {mapped_top}) is below the heap's (to y {heap_bottom})"
    );
    assert!(
        p.texts.contains("mapped bytes"),
        "the mapped panel is named"
    );
    assert_eq!(p.marker.1, heap_top);
    let (x, y, w, h) = p.ground;
    assert!(
        x >= 0 && y >= 0 && x + w <= 1200 && y + h <= 600,
        "{:?}",
        p.ground
    );
    assert!(y + h <= p.marker.1, "the label is above the peak's dot");
    assert!(
        x <= p.label_at.0 && p.label_at.0 <= x + w,
        "the label's anchor {:?} is on its ground {:?}",
        p.label_at,
        p.ground
    );
}

/// `n` calls, the `k`-th beginning at `start(k)` ns and allocating `(k + 1) × 1,000` bytes
/// (freed before it ends), each bracketed by IterationStart and IterationEnd.
fn calls(n: u64, start: impl Fn(u64) -> u64) -> Vec<Event> {
    let mut evs = Vec::new();
    for k in 0..n {
        let t = start(k);
        let addr = 0x1000 + k * 0x10000;
        evs.push(Event::new(t, 7, 7, EventKind::IterationStart));
        evs.push(Event::new(
            t + 100_000,
            7,
            7,
            EventKind::Malloc {
                addr,
                size: (k + 1) * 1000,
            },
        ));
        evs.push(Event::new(t + 900_000, 7, 7, EventKind::Free { addr }));
        evs.push(Event::new(t + 1_000_000, 7, 7, EventKind::IterationEnd));
    }
    evs
}

/// Five calls 2 ms apart: a tick where each begins, hanging from the top of the heap's panel
/// and nowhere near its zero, not in the heap's colour, at x in proportion to its time, and
/// the legend counts them.
#[test]
fn each_call_is_marked_where_it_begins() {
    let dir = tempfile::tempdir().unwrap();
    let evs = calls(5, |k| 1_000_000 + k * 2_000_000);
    let art = write(&dir.path().join("calls.memtrack"), Some("calls"), &evs, 0);
    let svg = dir.path().join("calls.svg");
    let out = memtrack(&["plot", s(&art), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let p = parse(&svg);
    assert_eq!(label_bytes(&p.label), 5000);
    assert!(p.mapped.is_empty(), "no mapped panel without mappings");
    assert!(p.texts.contains("a call begins (5 calls)"), "{}", p.texts);
    let mut xs: Vec<i64> = p.calls.iter().map(|c| c.0).collect();
    xs.sort();
    assert_eq!(xs.len(), 5, "{:?}", p.calls);
    // The first call begins at the first event: where the heap's line starts.
    assert_eq!(xs[0], p.heap[0].0);
    for (k, x) in xs.iter().enumerate() {
        let want = xs[0] as f64 + (xs[4] - xs[0]) as f64 * k as f64 / 4.0;
        assert!(
            (*x as f64 - want).abs() <= 1.0,
            "call {k} at x {x}, not {want}"
        );
    }
    let (top, bottom) = (
        p.heap.iter().map(|&(_, y)| y).min().unwrap(),
        p.heap.iter().map(|&(_, y)| y).max().unwrap(),
    );
    for &(x, y0, y1) in &p.calls {
        assert!(
            y0 < top && y1 - y0 <= 30 && bottom - y1 > 10 * (y1 - y0),
            "the tick at x {x} spans {y0}..{y1}, the heap {top}..{bottom}"
        );
    }
    let src = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&src).unwrap();
    let heap_verticals = polylines(&doc, HEAP)
        .into_iter()
        .filter(|pts| pts.len() == 2 && pts[0].0 == pts[1].0)
        .count();
    assert_eq!(
        heap_verticals, 0,
        "no line in the heap's colour but its series and swatch"
    );
}

/// Calls closer together than a pixel's column share one line, and the legend still counts
/// each; a recording without calls has neither.
#[test]
fn calls_in_one_column_share_a_line() {
    let dir = tempfile::tempdir().unwrap();
    // 10 calls: the first 9 in the first 9 µs of a 1 s recording (one column is 833 µs at
    // 1,200 px), the last at its end.
    let mut evs = calls(9, |k| 1_000_000 + k * 1_000);
    evs.sort_by_key(|e| e.ts);
    evs.extend(calls(1, |_| 1_000_000_000));
    let art = write(&dir.path().join("close.memtrack"), Some("close"), &evs, 0);
    let svg = dir.path().join("close.svg");
    let out = memtrack(&["plot", s(&art), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let p = parse(&svg);
    assert!(p.texts.contains("a call begins (10 calls)"), "{}", p.texts);
    assert_eq!(p.calls.len(), 2, "{:?}", p.calls);

    let plain = write(
        &dir.path().join("plain.memtrack"),
        Some("plain"),
        &common::alloc_free_pairs(10, 64),
        0,
    );
    let out = memtrack(&["plot", s(&plain), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let p = parse(&svg);
    assert!(p.calls.is_empty() && !p.texts.contains("a call begins"));
}
