//! Probe links being closed in the background still probe their sites until the kernel's grace
//! period ends, while the next recording's links probe the same sites: the program records a
//! hit only through the links whose number the switch names ([`RawSwitch::links`]), so every
//! call is recorded once, never twice. Unnumbered links (cookie 0: a followed process's) are
//! always recorded: the last case shows that two of them record every `free` twice.
//!
//! Needs root (CAP_BPF + CAP_PERFMON); reported as ignored with why otherwise.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use libbpf_rs::{Link, MapCore, Object, RingBufferBuilder, UprobeMultiOpts};
use memtrack_bpf::{
    COOKIE_LINKS_SHIFT, MAP_EVENTS, PROG_ENTRY, PROG_RET, RawEvent, RawStack, kind, probe_sites,
};
use memtrack_test_support::{TRACKER, requires, run};

#[path = "../examples/harness/mod.rs"]
mod harness;

type P = *mut std::ffi::c_void;

/// A size no one else allocates while the test runs.
const SIZE: usize = 4321;
const CALLS: u64 = 50;

/// The file that defines `malloc` in this process (libc).
fn libc_file() -> PathBuf {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let p = harness::sym("malloc").expect("malloc");
    // SAFETY: the address of a function of this process.
    assert!(unsafe { libc::dladdr(p, &mut info) } != 0);
    // SAFETY: dladdr set dli_fname to a NUL-terminated path.
    PathBuf::from(
        unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_str()
            .unwrap(),
    )
}

/// memtrack's entry and return links on `malloc` and `free` of `file`, numbered `number`.
fn links(obj: &Object, file: &Path, number: u32) -> Vec<Link> {
    let sites: Vec<_> = probe_sites(file)
        .unwrap()
        .into_iter()
        .filter(|s| s.symbol == "malloc" || s.symbol == "free")
        .collect();
    assert_eq!(sites.len(), 2, "{sites:?}");
    let numbered = u64::from(number) << COOKIE_LINKS_SHIFT;
    let pid = std::process::id() as i32;
    let prog = |name: &str| obj.progs_mut().find(|p| p.name() == name).unwrap();
    let opts = |ret: bool| UprobeMultiOpts {
        offsets: sites
            .iter()
            .filter(|s| !ret || s.ret)
            .map(|s| s.offset as usize)
            .collect(),
        cookies: sites
            .iter()
            .filter(|s| !ret || s.ret)
            .map(|s| s.cookie() | numbered)
            .collect(),
        retprobe: ret,
        ..Default::default()
    };
    vec![
        prog(PROG_ENTRY)
            .attach_uprobe_multi_with_opts(pid, file, "", opts(false))
            .unwrap(),
        prog(PROG_RET)
            .attach_uprobe_multi_with_opts(pid, file, "", opts(true))
            .unwrap(),
    ]
}

/// (mallocs of SIZE, frees) this thread recorded while making CALLS malloc(SIZE)+free pairs
/// with two sets of links attached, numbered `old` and `new`, the switch naming `current`.
fn recorded(old: u32, new: u32, current: u32) -> (u64, u64) {
    let obj = harness::load(Some(1 << 20));
    let file = libc_file();
    let _old = links(&obj, &file, old);
    let _new = links(&obj, &file, new);
    let malloc: unsafe extern "C" fn(usize) -> P = harness::f("malloc");
    let free: unsafe extern "C" fn(P) = harness::f("free");
    let mut blocks = Vec::with_capacity(CALLS as usize);
    harness::switch_numbered(&obj, true, 1, current);
    for _ in 0..CALLS {
        // SAFETY: libc's malloc; the block is freed below.
        blocks.push(std::hint::black_box(unsafe { malloc(SIZE) }));
    }
    for &b in &blocks {
        // SAFETY: each block once, from malloc above.
        unsafe { free(b) };
    }
    harness::switch_numbered(&obj, false, 1, current);
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let mine: Vec<u64> = blocks.iter().map(|&b| b as u64).collect();
    let (mallocs, frees) = (Cell::new(0), Cell::new(0));
    let events = obj.maps().find(|m| m.name() == MAP_EVENTS).unwrap();
    let mut b = RingBufferBuilder::new();
    b.add(&events, |bytes| {
        if RawStack::is_stack(bytes) {
            return 0;
        }
        let e = RawEvent::from_bytes(bytes).expect("a RawEvent");
        if e.tid == me && mine.contains(&e.addr) {
            if e.kind == kind::FREE {
                frees.set(frees.get() + 1);
            } else if e.size == SIZE as u64 {
                mallocs.set(mallocs.get() + 1);
            }
        }
        0
    })
    .unwrap();
    b.build().unwrap().consume().unwrap();
    (mallocs.get(), frees.get())
}

fn only_the_newest_links_record() {
    assert_eq!(recorded(1, 2, 2), (CALLS, CALLS));
}

fn the_old_links_record_until_the_switch_names_the_new() {
    assert_eq!(recorded(1, 2, 1), (CALLS, CALLS));
}

fn numbers_wrap_from_255_to_1() {
    assert_eq!(recorded(255, 1, 1), (CALLS, CALLS));
}

/// Entry-only sites (`free`) are recorded once per link; a malloc's second entry finds its
/// call already entered at the same stack pointer and its second return finds it finished.
fn unnumbered_links_would_record_every_free_twice() {
    assert_eq!(recorded(0, 0, 7), (CALLS, 2 * CALLS));
}

fn main() {
    run(vec![
        requires(
            "only_the_newest_links_record",
            &[TRACKER],
            only_the_newest_links_record,
        ),
        requires(
            "the_old_links_record_until_the_switch_names_the_new",
            &[TRACKER],
            the_old_links_record_until_the_switch_names_the_new,
        ),
        requires(
            "numbers_wrap_from_255_to_1",
            &[TRACKER],
            numbers_wrap_from_255_to_1,
        ),
        requires(
            "unnumbered_links_would_record_every_free_twice",
            &[TRACKER],
            unnumbered_links_would_record_every_free_twice,
        ),
    ]);
}
