//! Cost of memtrack's probes on every allocator entry point, against the bare-uprobe floor at
//! the same site.
//!
//! ```text
//! sudo cargo run --release -p memtrack-bpf --example entry_points [CALLS] [ROUNDS] [GROUP,...]
//! ```
//! Groups: `glibc`, `libstdc++`, `jemalloc`, `mimalloc` (each installed one; jemalloc and
//! mimalloc run in a child process with the library in `LD_PRELOAD`, as users run them: they
//! cannot be `dlopen`ed, their TLS is initial-exec). For each entry point, a loop of CALLS
//! calls (its free, or its allocation, made alongside) runs with only that entry point's site
//! attached, in four configurations:
//!
//! - `untracked`: no probe;
//! - `floor@0`: `mt_nop` (a BPF program that returns at once) at the function's first
//!   instruction, entry and (if memtrack uses one there) return probe: the kernel's cost
//!   without placement;
//! - `floor`: `mt_nop` at the site memtrack places it ([`memtrack_bpf::place_probe`]);
//! - `bpf`: memtrack's programs at that site, recording on, a thread draining the ring buffer
//!   (a run that drops an event fails).
//!
//! - `nostack`: the same with call stacks off (`stack_depth` 0).
//!
//! ns per loop iteration, median of ROUNDS rounds, the configurations interleaved with their
//! order alternating round by round. `bpf/floor` is the ratio of the two totals in the same
//! run (a uprobe's absolute cost moves 2× between days); `placement` is what placement buys,
//! `floor@0/floor`. `how` says whether the kernel emulates the probed instruction or must
//! single-step it out of line.
//!
//! The kernel's own account of memtrack's programs (BPF run-time statistics, enabled for the
//! process's life with `BPF_ENABLE_STATS`): `entry` and `ret` are ns per run of `mt_entry`
//! and `mt_ret` in the `bpf` configuration (`-` where the site has no return probe), and
//! `ns-st` the same total per loop iteration without stacks; `drain` the CPU time of the thread
//! draining the ring buffer per record it handed on (`bpf` configuration, stacks on; its
//! callback does nothing with a record, so this is libbpf's consume and the wakeups). The statistics add two clock
//! reads to every program run (the nop's too), which the ratios share.

use std::ffi::{CStr, CString, c_int, c_void};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use libbpf_rs::{Link, MapCore, MapFlags, Object, UprobeMultiOpts};
use memtrack_bpf::{
    Elf, MAP_STATS, PROG_ENTRY, PROG_NOP, PROG_RET, PlacementRule, ProbeSite, RawStats,
    probe_sites_in,
};

const LIB: &str = "/usr/lib/x86_64-linux-gnu";

type P = *mut c_void;

/// What one loop iteration does; the function pointers are resolved before timing.
#[derive(Clone, Copy)]
enum Op {
    /// `p = alloc(16); free(p)`.
    Alloc(unsafe extern "C" fn(usize) -> P, unsafe extern "C" fn(P)),
    /// `p = alloc(1, 16) / alloc(16, 64); free(p)`: calloc-like and (size, align)/(align,
    /// size) pairs, with the two arguments given.
    Alloc2(
        unsafe extern "C" fn(usize, usize) -> P,
        usize,
        usize,
        unsafe extern "C" fn(P),
    ),
    /// `posix_memalign(&p, 64, 64); free(p)`.
    PosixMemalign(
        unsafe extern "C" fn(*mut P, usize, usize) -> c_int,
        unsafe extern "C" fn(P),
    ),
    /// `p = realloc(p, 16 or 32)`, alternating; `p` freed after the loop.
    Realloc(unsafe extern "C" fn(P, usize) -> P, unsafe extern "C" fn(P)),
    /// `p = reallocarray(p, 1 or 2, 16)`, alternating.
    Reallocarray(
        unsafe extern "C" fn(P, usize, usize) -> P,
        unsafe extern "C" fn(P),
    ),
    /// `p = alloc(16, arg); free2(p, a, b)`: nothrow new, sized or aligned delete, jemalloc's
    /// `mallocx` and `sdallocx`, … (the extra arguments as given; an `int` argument is passed
    /// in a 64-bit register, of which the callee reads the low half, and a callee with fewer
    /// parameters ignores the extra registers: the x86-64 SysV calling convention).
    AllocFree3(
        unsafe extern "C" fn(usize, usize) -> P,
        usize,
        unsafe extern "C" fn(P, usize, usize),
        usize,
        usize,
    ),
    /// `p = rallocx(p, 16 or 32, 0)`, alternating, from a `malloc(16)` (rallocx needs a block).
    Rallocx(
        unsafe extern "C" fn(P, usize, c_int) -> P,
        unsafe extern "C" fn(usize) -> P,
        unsafe extern "C" fn(P),
    ),
}

impl Op {
    fn run(self, n: u64) {
        // SAFETY: every function is the allocator entry point its symbol names, called with
        // arguments of its C signature; every block is freed by the same allocator.
        unsafe {
            match self {
                Op::Alloc(a, f) => {
                    for _ in 0..n {
                        f(black_box(a(16)));
                    }
                }
                Op::Alloc2(a, x, y, f) => {
                    for _ in 0..n {
                        f(black_box(a(x, y)));
                    }
                }
                Op::PosixMemalign(a, f) => {
                    for _ in 0..n {
                        let mut p: P = std::ptr::null_mut();
                        assert_eq!(a(&mut p, 64, 64), 0);
                        f(black_box(p));
                    }
                }
                Op::Realloc(r, f) => {
                    let mut p = std::ptr::null_mut();
                    for i in 0..n {
                        p = black_box(r(p, 16 << (i & 1)));
                    }
                    f(p);
                }
                Op::Reallocarray(r, f) => {
                    let mut p = std::ptr::null_mut();
                    for i in 0..n {
                        p = black_box(r(p, 1 + (i & 1) as usize, 16));
                    }
                    f(p);
                }
                Op::AllocFree3(a, arg, f, x, y) => {
                    for _ in 0..n {
                        f(black_box(a(16, arg)), x, y);
                    }
                }
                Op::Rallocx(r, m, f) => {
                    let mut p = m(16);
                    for i in 0..n {
                        p = black_box(r(p, 16 << (i & 1), 0));
                        assert!(!p.is_null(), "rallocx failed");
                    }
                    f(p);
                }
            }
        }
    }
}

mod harness;

/// The file that defines the function at `p`, and its address in that file.
fn defining_file(p: *mut c_void) -> (PathBuf, u64) {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is a function of this process.
    assert!(unsafe { libc::dladdr(p, &mut info) } != 0, "dladdr");
    // SAFETY: dladdr set dli_fname to a NUL-terminated path.
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    (
        PathBuf::from(file.to_str().unwrap()),
        p as u64 - info.dli_fbase as u64,
    )
}

/// One benchmarked entry point: its label, the symbol whose site is probed, the loop.
struct Case {
    label: &'static str,
    probed: &'static str,
    op: Op,
}

fn cases(group: &str) -> Vec<Case> {
    let c = |label, probed, op| Case { label, probed, op };
    match group {
        "glibc" | "jemalloc" | "mimalloc" => {
            let free: unsafe extern "C" fn(P) = harness::f("free");
            let mut v = vec![
                c("malloc", "malloc", Op::Alloc(harness::f("malloc"), free)),
                c("free", "free", Op::Alloc(harness::f("malloc"), free)),
                c(
                    "calloc",
                    "calloc",
                    Op::Alloc2(harness::f("calloc"), 1, 16, free),
                ),
                c(
                    "realloc",
                    "realloc",
                    Op::Realloc(harness::f("realloc"), free),
                ),
                c(
                    "aligned_alloc",
                    "aligned_alloc",
                    Op::Alloc2(harness::f("aligned_alloc"), 64, 64, free),
                ),
                c(
                    "posix_memalign",
                    "posix_memalign",
                    Op::PosixMemalign(harness::f("posix_memalign"), free),
                ),
            ];
            if group != "jemalloc" {
                v.push(c(
                    "reallocarray",
                    "reallocarray",
                    Op::Reallocarray(harness::f("reallocarray"), free),
                ));
            }
            if group == "jemalloc" {
                let dallocx: unsafe extern "C" fn(P, usize, usize) = harness::f("dallocx");
                let sdallocx: unsafe extern "C" fn(P, usize, usize) = harness::f("sdallocx");
                v.extend([
                    c(
                        "mallocx",
                        "mallocx",
                        Op::Alloc2(harness::f("mallocx"), 16, 0, free),
                    ),
                    c(
                        "rallocx",
                        "rallocx",
                        Op::Rallocx(harness::f("rallocx"), harness::f("malloc"), free),
                    ),
                    c(
                        "dallocx",
                        "dallocx",
                        Op::AllocFree3(harness::f("mallocx"), 0, dallocx, 0, 0),
                    ),
                    c(
                        "sdallocx",
                        "sdallocx",
                        Op::AllocFree3(harness::f("mallocx"), 0, sdallocx, 16, 0),
                    ),
                ]);
            }
            if group == "mimalloc" {
                let mi_free: unsafe extern "C" fn(P) = harness::f("mi_free");
                v.extend([
                    c(
                        "mi_malloc",
                        "mi_malloc",
                        Op::Alloc(harness::f("mi_malloc"), mi_free),
                    ),
                    c(
                        "mi_free",
                        "mi_free",
                        Op::Alloc(harness::f("mi_malloc"), mi_free),
                    ),
                    c(
                        "mi_zalloc",
                        "mi_zalloc",
                        Op::Alloc(harness::f("mi_zalloc"), mi_free),
                    ),
                    c(
                        "mi_calloc",
                        "mi_calloc",
                        Op::Alloc2(harness::f("mi_calloc"), 1, 16, mi_free),
                    ),
                    c(
                        "mi_realloc",
                        "mi_realloc",
                        Op::Realloc(harness::f("mi_realloc"), mi_free),
                    ),
                    c(
                        "mi_malloc_aligned",
                        "mi_malloc_aligned",
                        Op::Alloc2(harness::f("mi_malloc_aligned"), 16, 64, mi_free),
                    ),
                    c("mi_new", "mi_new", Op::Alloc(harness::f("mi_new"), mi_free)),
                ]);
            }
            if group != "glibc" {
                v.extend(cxx_cases());
            }
            v
        }
        "libstdc++" => cxx_cases(),
        _ => panic!("unknown group {group}"),
    }
}

/// C++ `operator new`/`delete` (of libstdc++, or of the preloaded allocator when it defines
/// them).
fn cxx_cases() -> Vec<Case> {
    let c = |label, probed, op| Case { label, probed, op };
    let new: unsafe extern "C" fn(usize) -> P = harness::f("_Znwm");
    let del: unsafe extern "C" fn(P) = harness::f("_ZdlPv");
    let new_al: unsafe extern "C" fn(usize, usize) -> P = harness::f("_ZnwmSt11align_val_t");
    let del_al: unsafe extern "C" fn(P, usize, usize) = harness::f("_ZdlPvSt11align_val_t");
    // The nothrow_t argument is an ignored reference: any valid address.
    static NOTHROW: u8 = 0;
    let nothrow = &NOTHROW as *const u8 as usize;
    vec![
        c("new", "_Znwm", Op::Alloc(new, del)),
        c("delete", "_ZdlPv", Op::Alloc(new, del)),
        c(
            "new nothrow",
            "_ZnwmRKSt9nothrow_t",
            Op::AllocFree3(
                harness::f("_ZnwmRKSt9nothrow_t"),
                nothrow,
                harness::f("_ZdlPvm"),
                16,
                0,
            ),
        ),
        c(
            "delete sized",
            "_ZdlPvm",
            Op::AllocFree3(
                harness::f("_ZnwmRKSt9nothrow_t"),
                nothrow,
                harness::f("_ZdlPvm"),
                16,
                0,
            ),
        ),
        c(
            "new aligned",
            "_ZnwmSt11align_val_t",
            Op::AllocFree3(new_al, 64, del_al, 64, 0),
        ),
        c(
            "delete aligned",
            "_ZdlPvSt11align_val_t",
            Op::AllocFree3(new_al, 64, del_al, 64, 0),
        ),
        c(
            "delete sized aligned",
            "_ZdlPvmSt11align_val_t",
            Op::AllocFree3(new_al, 64, harness::f("_ZdlPvmSt11align_val_t"), 16, 64),
        ),
    ]
}

/// Attaches `entry` (and `ret` as a return probe when the site has one) at `offset` of
/// `file`, for this process only, as memtrack does (uprobe_multi).
fn attach(obj: &Object, file: &Path, site: &ProbeSite, offset: u64, nop: bool) -> Vec<Link> {
    let pid = std::process::id() as i32;
    let prog = |name: &str| obj.progs_mut().find(|p| p.name() == name).unwrap();
    let (e, r) = if nop {
        (PROG_NOP, PROG_NOP)
    } else {
        (PROG_ENTRY, PROG_RET)
    };
    let mut links = vec![
        prog(e)
            .attach_uprobe_multi_with_opts(
                pid,
                file,
                "",
                UprobeMultiOpts {
                    offsets: vec![offset as usize],
                    cookies: vec![site.cookie()],
                    ..Default::default()
                },
            )
            .unwrap(),
    ];
    if site.ret {
        links.push(
            prog(r)
                .attach_uprobe_multi_with_opts(
                    pid,
                    file,
                    "",
                    UprobeMultiOpts {
                        offsets: vec![offset as usize],
                        cookies: vec![site.cookie()],
                        retprobe: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
        );
    }
    links
}

fn ns_per_call(op: Op, n: u64) -> f64 {
    let t = Instant::now();
    op.run(n);
    t.elapsed().as_nanos() as f64 / n as f64
}

/// `(run_time_ns, run_cnt)` of program `name` (BPF run-time statistics).
fn prog_stats(obj: &Object, name: &str) -> (u64, u64) {
    use std::os::fd::{AsFd, AsRawFd};
    let prog = obj.progs().find(|p| p.name() == name).unwrap();
    // SAFETY: an all-zero bpf_prog_info is valid; the kernel fills it.
    let mut info: libbpf_rs::libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut len = size_of_val(&info) as u32;
    // SAFETY: the program's fd and a buffer of `len` bytes.
    let rc = unsafe {
        libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
            prog.as_fd().as_raw_fd(),
            &mut info,
            &mut len,
        )
    };
    assert_eq!(rc, 0, "bpf_prog_get_info_by_fd({name})");
    (info.run_time_ns, info.run_cnt)
}

/// ns per run of the entry and the return program between two readings (NaN: no run).
fn per_run(before: [(u64, u64); 2], after: [(u64, u64); 2]) -> [f64; 2] {
    [0, 1].map(|i| {
        let runs = after[i].1 - before[i].1;
        (after[i].0 - before[i].0) as f64 / runs as f64
    })
}

fn drops(obj: &Object) -> u64 {
    let stats = obj.maps().find(|m| m.name() == MAP_STATS).unwrap();
    stats
        .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .unwrap_or_default()
        .iter()
        .filter_map(|b| RawStats::from_bytes(b))
        .map(|s| s.drops)
        .sum()
}

/// Runs `op` with memtrack's programs at the site, recording on, the ring buffer drained:
/// ns per call, and ns per run of the entry and the return program (kernel statistics).
fn with_bpf(
    obj: &Object,
    file: &Path,
    site: &ProbeSite,
    op: Op,
    n: u64,
    generation: u32,
) -> (f64, [f64; 3]) {
    let links = attach(obj, file, site, site.offset, false);
    let before = drops(obj);
    let runs = || [prog_stats(obj, PROG_ENTRY), prog_stats(obj, PROG_RET)];
    let at = runs();
    let ns = harness::recording(obj, generation, || ns_per_call(op, n));
    let [e, r] = per_run(at, runs());
    drop(links);
    let lost = drops(obj) - before;
    assert_eq!(lost, 0, "{}: {lost} events dropped", site.symbol);
    let drain = harness::DRAIN_CPU_NS.load(std::sync::atomic::Ordering::Relaxed) as f64
        / harness::DRAIN_RECORDS.load(std::sync::atomic::Ordering::Relaxed) as f64;
    (ns, [e, r, drain])
}

fn run_group(group: &str, n: u64, rounds: usize) {
    if group == "libstdc++" {
        let path = CString::new(format!("{LIB}/libstdc++.so.6")).unwrap();
        // SAFETY: dlopen of a library path; the handle is kept for the process's life.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        assert!(!h.is_null(), "dlopen libstdc++");
    }
    // SAFETY: BPF_ENABLE_STATS takes the statistics type; the fd it returns keeps them on
    // until closed (never: the process's life).
    let stats_fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    assert!(
        stats_fd >= 0,
        "bpf_enable_stats: {}",
        std::io::Error::last_os_error()
    );
    let obj = harness::load(Some(8 << 20));
    let obj_nostack = harness::load_with(Some(8 << 20), 0);
    let mut generation = 0;
    for case in cases(group) {
        let p = harness::sym(case.probed).unwrap();
        let (file, vaddr) = defining_file(p);
        let elf = Elf::open(&file).unwrap();
        let at = elf.file_offset(vaddr).unwrap();
        let sites = probe_sites_in(&elf);
        let Some(site) = sites.iter().find(|s| s.symbol_offset == at) else {
            println!(
                "{group:<9} {:<22} not probed in {}",
                case.label,
                file.display()
            );
            continue;
        };
        let placed = site.offset != site.symbol_offset;
        let (mut un, mut f0, mut fl, mut bpf) = (vec![], vec![], vec![], vec![]);
        let (mut ent, mut ret, mut nost, mut nost_run) = (vec![], vec![], vec![], vec![]);
        let mut drain = vec![];
        case.op.run(n / 10); // warm-up: the allocator's caches, the page faults
        for r in 0..rounds {
            let mut order = [0, 1, 2, 3, 4];
            if r % 2 == 1 {
                order.reverse();
            }
            for c in order {
                match c {
                    0 => un.push(ns_per_call(case.op, n)),
                    1 if placed => {
                        let l = attach(&obj, &file, site, site.symbol_offset, true);
                        f0.push(ns_per_call(case.op, n));
                        drop(l);
                    }
                    2 => {
                        let l = attach(&obj, &file, site, site.offset, true);
                        fl.push(ns_per_call(case.op, n));
                        drop(l);
                    }
                    3 => {
                        generation += 1;
                        let (ns, [e, r, d]) = with_bpf(&obj, &file, site, case.op, n, generation);
                        bpf.push(ns);
                        ent.push(e);
                        ret.push(r);
                        drain.push(d);
                    }
                    4 => {
                        generation += 1;
                        let (ns, [e, r, _]) =
                            with_bpf(&obj_nostack, &file, site, case.op, n, generation);
                        nost.push(ns);
                        nost_run.push(e + if r.is_nan() { 0.0 } else { r });
                    }
                    _ => {}
                }
            }
        }
        let (un, fl, bpf) = (
            harness::median(un),
            harness::median(fl),
            harness::median(bpf),
        );
        let f0 = if placed { harness::median(f0) } else { fl };
        let (ent, nost, nost_run, drain) = (
            harness::median(ent),
            harness::median(nost),
            harness::median(nost_run),
            harness::median(drain),
        );
        let ret = if site.ret {
            format!("{:.0}", harness::median(ret))
        } else {
            "-".into()
        };
        let how = match site.placement.rule {
            PlacementRule::Emulated => "emulated",
            _ => "single-step",
        };
        println!(
            "{group:<9} {:<22} {:<26} {how:<11} {un:>9.1} {f0:>9.1} {fl:>9.1} {bpf:>9.1} {:>6.2}x {:>6.2}x {ent:>6.0} {ret:>6} {nost:>9.1} {:>6.2}x {nost_run:>6.0} {drain:>6.0}",
            case.label,
            format!("{}+{}", site.symbol, site.placement.offset),
            bpf / fl,
            f0 / fl,
            nost / fl,
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--group") {
        run_group(&args[1], args[2].parse().unwrap(), args[3].parse().unwrap());
        return;
    }
    let n: u64 = args.first().map_or(20_000, |a| a.parse().expect("CALLS"));
    let rounds: usize = args.get(1).map_or(3, |a| a.parse().expect("ROUNDS"));
    let groups: Vec<String> = args.get(2).map_or_else(
        || {
            ["glibc", "libstdc++", "jemalloc", "mimalloc"]
                .map(String::from)
                .to_vec()
        },
        |a| a.split(',').map(String::from).collect(),
    );
    println!(
        "{n} calls per run, median of {rounds} interleaved rounds, ns per loop iteration \
         (the entry point and the free or allocation it is paired with; only the named site \
         probed)"
    );
    println!(
        "{:<9} {:<22} {:<26} {:<11} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>6} {:>6} {:>9} {:>7} {:>6} {:>6}",
        "group",
        "entry point",
        "site",
        "how",
        "untracked",
        "floor@0",
        "floor",
        "bpf",
        "bpf/fl",
        "placed",
        "entry",
        "ret",
        "nostack",
        "nost/fl",
        "ns-st",
        "drain"
    );
    for g in groups {
        let preload = match g.as_str() {
            "jemalloc" => Some("libjemalloc.so.2"),
            "mimalloc" => Some("libmimalloc.so.2"),
            _ => None,
        };
        let lib = match g.as_str() {
            "glibc" => "libc.so.6",
            "libstdc++" => "libstdc++.so.6",
            _ => preload.unwrap(),
        };
        if !Path::new(LIB).join(lib).exists() {
            println!("{g:<9} not installed ({LIB}/{lib})");
            continue;
        }
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--group", &g, &n.to_string(), &rounds.to_string()]);
        if let Some(p) = preload {
            cmd.env("LD_PRELOAD", Path::new(LIB).join(p));
        }
        let status = cmd.status().unwrap();
        assert!(status.success(), "group {g}: {status}");
    }
}
