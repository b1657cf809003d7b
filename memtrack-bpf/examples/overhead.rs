//! Cost of a malloc+free pair (ns) under memtrack's probes, against the uprobe floor.
//!
//! ```text
//! sudo cargo run --release -p memtrack-bpf --example overhead [PAIRS] [RUNS]
//! ```
//! Configurations (the median of RUNS runs of PAIRS `malloc(16)`+`free` each):
//! - `untracked`: no probes;
//! - `floor`: a BPF program that returns at once (`mt_nop`), at the same sites (entry and
//!   return probes, placed by `place_probe`, attached as uprobe_multi links like memtrack's): the kernel's uprobe cost, which no tracker avoids;
//! - `floor@0`: the same at each function's first instruction (no placement);
//! - `bpf`: memtrack's real programs (stacks of up to 64 frames, the default), recording on,
//!   a thread draining the ring buffer;
//! - the same three with each pair made 20 frames deep (`harness::chain`: a frame-pointer
//!   chain, so each allocation's stack is 20 frames and more): `floor, 20 deep`, `bpf, no
//!   stacks` (stack depth 0) and `bpf, 20-frame stacks` (depth 20: the walk reads 21 frames,
//!   the last to tell a cut stack);
//! - `other process`: an untracked child process running the same loop while `bpf` probes
//!   are attached for this process only (pid-scoped).

use std::hint::black_box;
use std::time::Instant;

use libbpf_rs::{Link, Object, UprobeMultiOpts};
use memtrack_bpf::{PROG_ENTRY, PROG_NOP, PROG_RET, probe_sites};

mod harness;

fn pairs_ns(pairs: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..pairs {
        // SAFETY: malloc/free of a block that is not used otherwise.
        unsafe {
            let p = libc::malloc(16);
            black_box(p);
            libc::free(p);
        }
    }
    t.elapsed().as_nanos() as f64 / pairs as f64
}

/// [`pairs_ns`] with each malloc made 20 frames down a frame-pointer chain (the malloc call
/// and 19 recursive calls), so that its stack is 20 frames before the caller's.
fn deep_pairs_ns(pairs: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..pairs {
        // SAFETY: malloc through the chain, freed at once.
        unsafe { libc::free(black_box(harness::chain::mt_chain(19, 16))) }
    }
    t.elapsed().as_nanos() as f64 / pairs as f64
}

fn median(pairs: u64, runs: usize) -> f64 {
    let mut v: Vec<f64> = (0..runs).map(|_| pairs_ns(pairs)).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Attaches `mt_nop` (if `nop`) or the real programs to libc's sites for this process, the
/// way memtrack does (uprobe_multi, one link per program).
fn attach(obj: &Object, nop: bool, placed: bool) -> Vec<Link> {
    let libc = harness::libc_path();
    let pid = std::process::id() as i32;
    let sites = probe_sites(&libc).unwrap();
    let off =
        |s: &memtrack_bpf::ProbeSite| if placed { s.offset } else { s.symbol_offset } as usize;
    let prog = |name: &str| obj.progs_mut().find(|p| p.name() == name).unwrap();
    let entry = UprobeMultiOpts {
        offsets: sites.iter().map(off).collect(),
        cookies: sites.iter().map(|s| s.cookie()).collect(),
        ..Default::default()
    };
    let ret = UprobeMultiOpts {
        offsets: sites.iter().filter(|s| s.ret).map(off).collect(),
        retprobe: true,
        ..Default::default()
    };
    let (e, r) = if nop {
        (PROG_NOP, PROG_NOP)
    } else {
        (PROG_ENTRY, PROG_RET)
    };
    vec![
        prog(e)
            .attach_uprobe_multi_with_opts(pid, &libc, "", entry)
            .unwrap(),
        prog(r)
            .attach_uprobe_multi_with_opts(pid, &libc, "", ret)
            .unwrap(),
    ]
}

fn child_ns(pairs: u64, runs: usize) -> f64 {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--child", &pairs.to_string(), &runs.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Runs `f` with memtrack's real programs attached, recording on, and a thread draining the
/// ring buffer.
fn with_bpf<T>(obj: &Object, f: impl FnOnce() -> T) -> T {
    let links = attach(obj, false, true);
    let out = harness::recording(obj, 1, f);
    drop(links);
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        println!(
            "{:.1}",
            median(args[2].parse().unwrap(), args[3].parse().unwrap())
        );
        return;
    }
    let pairs: u64 = args.get(1).map_or(1_000_000, |a| a.parse().unwrap());
    let runs: usize = args.get(2).map_or(5, |a| a.parse().unwrap());
    println!("{pairs} malloc(16)+free pairs, median of {runs} interleaved runs, ns per pair");
    let obj = harness::load(None);
    let no_stacks = harness::load_with(None, 0);
    let stacks20 = harness::load_with(None, 20);
    // The VM's timing drifts: the configurations alternate run by run.
    let (mut untracked, mut floor, mut floor0, mut bpf) = (vec![], vec![], vec![], vec![]);
    let (mut deep_untracked, mut deep_floor, mut deep_off, mut deep_on) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        deep_untracked.push(deep_pairs_ns(pairs));
        let links = attach(&obj, true, true);
        deep_floor.push(deep_pairs_ns(pairs));
        drop(links);
        deep_off.push(with_bpf(&no_stacks, || deep_pairs_ns(pairs)));
        deep_on.push(with_bpf(&stacks20, || deep_pairs_ns(pairs)));
        untracked.push(pairs_ns(pairs));
        let links = attach(&obj, true, true);
        floor.push(pairs_ns(pairs));
        drop(links);
        let links = attach(&obj, true, false);
        floor0.push(pairs_ns(pairs));
        drop(links);
        bpf.push(with_bpf(&obj, || pairs_ns(pairs)));
    }
    let other_untracked = child_ns(pairs, runs);
    let other = with_bpf(&obj, || child_ns(pairs, runs));
    let (floor, bpf) = (harness::median(floor), harness::median(bpf));
    println!(
        "untracked               {:>9.1}",
        harness::median(untracked)
    );
    println!("floor (mt_nop, placed)  {floor:>9.1}");
    println!("floor@0 (mt_nop, +0)    {:>9.1}", harness::median(floor0));
    println!(
        "bpf (memtrack programs) {bpf:>9.1}   = {:.2}x the floor",
        bpf / floor
    );
    println!(
        "other process           {other:>9.1}   (untracked child; {other_untracked:.1} with no probes)"
    );
    let (deep_floor, deep_off, deep_on) = (
        harness::median(deep_floor),
        harness::median(deep_off),
        harness::median(deep_on),
    );
    println!(
        "20 deep, untracked      {:>9.1}",
        harness::median(deep_untracked)
    );
    println!("20 deep, floor          {deep_floor:>9.1}");
    println!(
        "bpf, no stacks          {deep_off:>9.1}   = {:.2}x the floor",
        deep_off / deep_floor
    );
    println!(
        "bpf, 20-frame stacks    {deep_on:>9.1}   = {:.2}x no stacks, {:.2}x the floor",
        deep_on / deep_off,
        deep_on / deep_floor
    );
}
