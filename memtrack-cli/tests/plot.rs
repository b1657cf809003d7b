//! `memtrack plot`: the SVG parses, holds both series downsampled to the width, and marks the
//! peak with the exact `peak_live_bytes` of `memtrack show`.

mod common;

use std::path::Path;

use common::{memtrack, s, synth, text, write};
use memtrack::{event::Event, event::EventKind};

const HEAP: &str = "#0000FF";
const MAPPED: &str = "#E67800";

struct Svg {
    /// Points of the data polyline of each colour (the legend's 2-point swatches excluded).
    heap: Vec<(i64, i64)>,
    mapped: Vec<(i64, i64)>,
    /// Centre of the peak marker.
    marker: (i64, i64),
    /// The peak label's text.
    label: String,
}

fn parse(path: &Path) -> Svg {
    let src = std::fs::read_to_string(path).expect("svg written");
    let doc = roxmltree::Document::parse(&src).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let series = |colour: &str| -> Vec<(i64, i64)> {
        let lines: Vec<Vec<(i64, i64)>> = doc
            .descendants()
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
            .filter(|pts: &Vec<(i64, i64)>| pts.len() > 2)
            .collect();
        assert_eq!(lines.len(), 1, "one {colour} data series");
        lines.into_iter().next().unwrap()
    };
    let circles: Vec<(i64, i64)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle"))
        .map(|n| {
            (
                n.attribute("cx").unwrap().parse().unwrap(),
                n.attribute("cy").unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(circles.len(), 1, "one peak marker");
    let labels: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .filter(|t| t.starts_with("peak "))
        .collect();
    assert_eq!(labels.len(), 1, "one peak label");
    let texts: String = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(
        texts.contains("live heap bytes"),
        "legend names the heap series"
    );
    assert!(
        texts.contains("mapped bytes"),
        "legend names the mapped series"
    );
    Svg {
        heap: series(HEAP),
        mapped: series(MAPPED),
        marker: circles[0],
        label: labels[0].clone(),
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
