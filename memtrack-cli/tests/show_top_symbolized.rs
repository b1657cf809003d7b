//! `memtrack show --top` names the frames of a real program after it exited: the C fixture with
//! a known call chain (memtrack-test-support's `fixtures::c_chain`, main → chain_outer →
//! chain_middle → chain_inner → malloc) is built and run; the return addresses it printed,
//! turned into file offsets through its own /proc/self/maps, make the stack of a recording of
//! its 6 allocations of 4,321 bytes, and `show --top` must print each frame's function and
//! the line its source marks `LINE:NAME`. Copied elsewhere, the binary is gone from the
//! recorded path: the frames fall back to `chain+0xOFFSET` and the output says why.
//!
//! `harness = false` (memtrack-test-support's runner): without a C compiler the test is
//! reported as ignored with what is missing.

mod common;

use common::{memtrack, s, text};
use memtrack::{
    artifact::Backend, artifact::Metadata, encode::Encoder, encode::EncoderOptions, event::Event,
    event::EventKind, stack::Frame, stack::Module, stack::ModuleId, stack::Stack, stack::StackId,
};
use memtrack_test_support::fixtures::{self, line_of};
use memtrack_test_support::{Need, requires};

fn symbolized_after_exit() {
    let dir = tempfile::tempdir().unwrap();
    // Without a build id: the recorded module then has none either (memtrack reads build ids
    // when it records; this test writes the recording itself), and the symbolizer compares
    // the two.
    let exe = fixtures::c_chain(dir.path(), "chain", true, &["-Wl,--build-id=none"]);
    let printed = fixtures::run_printed(&exe, &["--print".as_ref()]);
    let frames: Vec<Frame> = ["ret_chain_middle", "ret_chain_outer", "ret_main"]
        .iter()
        .map(|name| {
            let (path, offset) = printed.file_offset(printed.addr(name));
            assert_eq!(path, exe);
            Frame {
                module: ModuleId(1),
                offset,
            }
        })
        .collect();
    let artifact = dir.path().join("chain.memtrack");
    let meta = Metadata::now(1, Backend::Ebpf);
    let f = std::fs::File::create(&artifact).unwrap();
    let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
    enc.define_module(
        ModuleId(1),
        Module {
            path: s(&exe).to_string(),
            build_id: None,
        },
    )
    .unwrap();
    enc.define_stack(
        StackId(1),
        Stack {
            frames,
            truncated: false,
        },
    )
    .unwrap();
    for i in 0..6u64 {
        let addr = 0x1000 + i * 0x2000;
        enc.push(
            Event::new(10 * i, 1, 1, EventKind::Malloc { addr, size: 4321 }).with_stack(StackId(1)),
        )
        .unwrap();
        enc.push(Event::new(10 * i + 5, 1, 1, EventKind::Free { addr }))
            .unwrap();
    }
    enc.finish(0).unwrap();

    let out = memtrack(&["show", s(&artifact), "--top", "1", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &v["top_sites"]["rows"][0];
    assert_eq!(
        (row["blocks"].as_u64(), row["bytes"].as_u64()),
        (Some(6), Some(6 * 4321))
    );
    let got: Vec<(String, String, u64)> = row["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let file = f["file"].as_str().unwrap_or_default();
            (
                f["function"].as_str().unwrap_or_default().to_string(),
                file.rsplit('/').next().unwrap().to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let want: Vec<(String, String, u64)> = ["chain_middle", "chain_outer", "main"]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                "chain.c".to_string(),
                line_of("chain.c", n) as u64,
            )
        })
        .collect();
    assert_eq!(got, want, "{row:#}");
    assert!(v["top_sites"].get("unsymbolized").is_none(), "{v:#}");
    // The text: one line per frame, `function (file:line)`.
    let out = memtrack(&["show", s(&artifact), "--top", "1"]);
    let t = text(&out);
    for n in ["chain_middle", "chain_outer", "main"] {
        let end = format!("chain.c:{})", line_of("chain.c", n));
        assert!(
            t.lines()
                .any(|l| l.starts_with(&format!("        {n} (")) && l.ends_with(&end)),
            "{n} … {end} in\n{t}"
        );
    }

    // The binary gone from its path: offsets, and why.
    std::fs::rename(&exe, dir.path().join("elsewhere")).unwrap();
    let out = memtrack(&["show", s(&artifact), "--top", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    let (_, middle) = printed.file_offset(printed.addr("ret_chain_middle"));
    assert!(t.contains(&format!("        chain+{middle:#x}\n")), "{t}");
    assert!(
        t.contains(&format!(
            "not named     {}: cannot read the file",
            exe.display()
        )),
        "{t}"
    );
}

fn main() {
    memtrack_test_support::run(vec![requires(
        "symbolized_after_exit",
        &[Need::Tool("cc")],
        symbolized_after_exit,
    )]);
}
