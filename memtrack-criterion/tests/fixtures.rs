//! memtrack-criterion on real criterion suites: `tests/fixtures/suite05` (criterion 0.5) and
//! `suite08` (the same benchmarks on criterion 0.8), built by cargo as a user builds them and run.
//!
//! The figures memory mode records are checked against an independent count: suite05 built
//! in timing mode with its feature `count`, whose own global allocator counts what each routine
//! allocates (criterion's `--test` runs each routine once) and prints it.
//!
//! Each configuration is built once per run of this binary, into one target directory under the
//! workspace's (`CARGO_TARGET_TMPDIR`), where later runs find it built; the lock files are the
//! fixtures' own (`--locked`, and `--offline` when they resolve without the network).
//! `tests/fixtures/instr` is instructions mode's: benchmarks whose instruction counts are known
//! without memtrack, run under callgrind.
//! `harness = false` (memtrack-test-support's runner): the eBPF test is reported as ignored
//! where the tracker cannot load.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use memtrack::artifact::{Backend, Reader};
use memtrack::instructions::run::{Callgrind, Measurement, measure};
use memtrack::instructions::{MAX_GATED_SPREAD, Toolchain};
use memtrack_test_support::{Need, TRACKER, Trial, requires, run, test, text};

/// A build of a fixture suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Build {
    /// suite05 in timing mode, with the counting allocator (feature `count`).
    Counting,
    /// suite05 in memory mode with the allocator recorder (`memtrack_bench="alloc"`).
    Memory05,
    /// suite08 likewise (the same flags as `Memory05`: the memtrack crates are built once).
    Memory08,
    /// The `instr` suite in instructions mode (`memtrack_bench="instructions"`).
    Instructions,
}

impl Build {
    fn suite(self) -> &'static str {
        match self {
            Build::Counting | Build::Memory05 => "suite05",
            Build::Memory08 => "suite08",
            Build::Instructions => "instr",
        }
    }

    fn rustflags(self) -> &'static str {
        match self {
            Build::Counting => "-C force-frame-pointers=yes",
            Build::Memory05 | Build::Memory08 => {
                "--cfg memtrack_bench=\"alloc\" -C force-frame-pointers=yes"
            }
            Build::Instructions => "--cfg memtrack_bench=\"instructions\"",
        }
    }
}

/// The ids of the fixture's benchmarks, in the order they run (`custom` is refused).
const IDS: &[&str] = &[
    "vec/1024",
    "format",
    "sum/100",
    "large_drop",
    "custom",
    "parse/json/16",
    "parse/json/1024",
    "batched/by_value",
    "batched/by_ref",
    "batched/5000",
    "strings",
];

const REFUSAL: &str = "memtrack: custom: iter_custom is refused in memory mode: its routine runs \
     and times the iterations itself, so memtrack cannot tell their allocations from its own (use \
     iter or iter_batched)";

fn fixture(suite: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(suite)
}

fn cargo(dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(dir);
    // Flags are the build's own (RUSTFLAGS, set per build), not those of the test's build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The host's target triple (`rustc -vV`).
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let out = memtrack_test_support::run_ok(Command::new(rustc).arg("-vV"));
        let text = String::from_utf8(out.stdout).unwrap();
        let host = text.lines().find_map(|l| l.strip_prefix("host: "));
        host.expect("rustc -vV names the host").to_string()
    })
}

/// What a build produced: its benchmark executable and the packages it compiled.
#[derive(Debug, Clone)]
struct Built {
    exe: PathBuf,
    packages: BTreeSet<String>,
}

/// Builds `build` (once per process: later calls get the first's result) with `cargo bench
/// --no-run`; panics with cargo's messages if it fails or if the crates of this repository
/// warn.
fn built(build: Build) -> Built {
    static BUILT: Mutex<BTreeMap<Build, Built>> = Mutex::new(BTreeMap::new());
    // Held while building: cargo would serialize the builds on the target directory anyway.
    let mut cache = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = cache.get(&build) {
        return b.clone();
    }
    let dir = fixture(build.suite());
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memtrack-criterion-fixtures");
    let offline = cargo(&dir)
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut cmd = cargo(&dir);
    cmd.args(["bench", "--no-run", "--locked", "--message-format=json"])
        .arg("--target-dir")
        .arg(&target)
        // What these tests check does not depend on optimization, and unoptimized the three
        // builds take less than half the CPU time.
        .args(["--config", "profile.bench.opt-level=0"])
        // With an explicit target, RUSTFLAGS apply to the target's crates only: the builds
        // share their build scripts and proc macros.
        .args(["--target", host()])
        .env("RUSTFLAGS", build.rustflags());
    if offline {
        cmd.arg("--offline");
    }
    if build == Build::Counting {
        cmd.args(["--features", "count"]);
    }
    if build == Build::Instructions {
        // Counts of optimized code: the fixture's crate, where the harness's generic loop is
        // compiled too, is optimized.
        cmd.args(["--config", "profile.bench.package.instr.opt-level=3"]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut exe = None;
    let mut packages = BTreeSet::new();
    let mut warnings = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(m) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let package = m["package_id"].as_str().unwrap_or_default();
        match m["reason"].as_str() {
            Some("compiler-artifact") => {
                packages.insert(m["target"]["name"].as_str().unwrap_or_default().to_string());
                if m["target"]["kind"] == serde_json::json!(["bench"]) {
                    exe = m["executable"].as_str().map(PathBuf::from);
                }
            }
            // This repository's crates and the fixture are path packages: their warnings show.
            Some("compiler-message") if package.starts_with("path+") => {
                if let Some(rendered) = m["message"]["rendered"].as_str() {
                    warnings.push(rendered.to_string());
                }
            }
            _ => {}
        }
    }
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        warnings.join("")
    );
    assert!(
        warnings.is_empty(),
        "{build:?}: the build warns:\n{}",
        warnings.join("")
    );
    let built = Built {
        exe: exe.unwrap_or_else(|| panic!("{build:?}: cargo named no bench executable")),
        packages,
    };
    cache.insert(build, built.clone());
    built
}

/// Runs the benchmark binary of `build` with `args`, writing its artifacts into `dir`, with
/// `env` on top of an environment without memtrack's variables.
fn bench(build: Build, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(built(build).exe);
    cmd.args(args).env("MEMTRACK_DIR", dir);
    for var in [
        "MEMTRACK_BACKEND",
        "MEMTRACK_WARMUP",
        "MEMTRACK_ITERATIONS",
        "MEMTRACK_BENCHMARKS",
        "MEMTRACK_SUMMARY",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Allocations and bytes of one call of each routine, by benchmark id: what the counting build
/// prints (`count <id> <allocations> <bytes>`) when criterion runs each benchmark once.
fn counted() -> &'static BTreeMap<String, (u64, u64)> {
    static COUNTS: OnceLock<BTreeMap<String, (u64, u64)>> = OnceLock::new();
    COUNTS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = bench(Build::Counting, dir.path(), &["--bench", "--test"], &[]);
        assert!(out.status.success(), "{}", text(&out));
        let mut counts = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(rest) = line.strip_prefix("count ") {
                let f: Vec<&str> = rest.split(' ').collect();
                let n = |s: &str| s.parse::<u64>().unwrap();
                assert!(
                    counts
                        .insert(f[0].to_string(), (n(f[1]), n(f[2])))
                        .is_none(),
                    "{line}: counted twice"
                );
            }
        }
        let expected: BTreeSet<&str> = IDS.iter().copied().filter(|&i| i != "custom").collect();
        assert_eq!(
            counts.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            expected
        );
        counts
    })
}

/// What criterion's `--list` prints for the fixture: `<id>: benchmark` lines, a blank line
/// after each group (`Criterion::bench_function` makes a group of one).
fn listing() -> String {
    let groups: &[&[&str]] = &[
        &["vec/1024"],
        &["format"],
        &["sum/100"],
        &["large_drop"],
        &["custom"],
        &["parse/json/16", "parse/json/1024"],
        &["batched/by_value", "batched/by_ref", "batched/5000"],
        &["strings"],
    ];
    groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|id| format!("{id}: benchmark\n"))
                .collect::<String>()
                + "\n"
        })
        .collect()
}

/// The artifact file name of benchmark `id` (memtrack's: `/` is escaped as `%2F`; the ids
/// here hold no other character it escapes).
fn file_of(id: &str) -> String {
    format!("{}.memtrack", id.replace('/', "%2F"))
}

/// The artifact file of benchmark `id` in `dir`.
fn artifact(dir: &Path, id: &str) -> PathBuf {
    dir.join(file_of(id))
}

/// The files in `dir` (none if it does not exist).
fn files(dir: &Path) -> BTreeSet<String> {
    match std::fs::read_dir(dir) {
        Err(_) => BTreeSet::new(),
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
    }
}

/// A full memory-mode run of `build` into `dir` with `env`, and the checks every such run
/// passes: it fails (status 1) because of `custom` alone, saying why on one line; each other
/// benchmark wrote one artifact, recorded by `backend`, of `iterations` iterations, whose
/// allocations and bytes are `iterations` times the independent count; the table says the
/// same per iteration. Returns the run's output.
fn check_run(
    build: Build,
    dir: &Path,
    env: &[(&str, &str)],
    iterations: u64,
    backend: Backend,
) -> Output {
    let counts = counted();
    let out = bench(build, dir, &["--bench"], env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.lines().any(|l| l == REFUSAL),
        "no refusal of iter_custom:\n{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l == "memtrack: 1 of 11 benchmarks failed: custom"),
        "{stderr}"
    );
    let expected: BTreeSet<String> = counts.keys().map(|id| file_of(id)).collect();
    assert_eq!(files(dir), expected, "one artifact per benchmark, no other");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for (id, &(allocations, bytes)) in counts {
        let reader = Reader::open(artifact(dir, id)).unwrap();
        assert_eq!(reader.metadata().backend, backend, "{id}");
        assert_eq!(reader.metadata().name.as_deref(), Some(id.as_str()));
        let fin = reader.final_metadata().expect("a finished artifact");
        assert_eq!(fin.iterations, Some(iterations), "{id}");
        assert_eq!(fin.lost_events, 0, "{id}");
        assert_eq!(
            (fin.totals.allocations, fin.totals.bytes_allocated),
            (iterations * allocations, iterations * bytes),
            "{id}: recorded allocations and bytes over {iterations} iterations, against \
             {allocations} allocations and {bytes} bytes counted per call"
        );
        // Its row: the id, the iterations, then the allocations per iteration.
        let row = stdout
            .lines()
            .find(|l| l.split("  ").next() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no row for {id}:\n{stdout}"));
        let cells: Vec<&str> = row.split("  ").filter(|c| !c.is_empty()).collect();
        assert_eq!(cells[1].trim(), iterations.to_string(), "{row}");
        assert_eq!(cells[2].trim(), format!("{allocations}.00/iter"), "{row}");
    }
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("custom ") && l.ends_with("failed")),
        "{stdout}"
    );
    out
}

/// Timing mode is criterion's own: the build compiles no memtrack crate, and criterion runs
/// the suite (`--test`: each benchmark once, criterion's `Testing`/`Success` lines; `--list`).
fn timing_mode_is_criterion() {
    let b = built(Build::Counting);
    assert!(b.packages.contains("criterion"), "{:?}", b.packages);
    let memtrack: Vec<&String> = b
        .packages
        .iter()
        .filter(|p| p.starts_with("memtrack") && *p != "memtrack_criterion")
        .collect();
    assert!(memtrack.is_empty(), "timing mode compiled {memtrack:?}");
    let dir = tempfile::tempdir().unwrap();
    let out = bench(Build::Counting, dir.path(), &["--bench", "--test"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for id in IDS {
        assert!(
            stdout.contains(&format!("Testing {id}\n")),
            "{id}: not criterion's test output:\n{stdout}"
        );
    }
    assert_eq!(stdout.matches("Success\n").count(), IDS.len(), "{stdout}");
    assert!(!stdout.contains("live at end"), "{stdout}");
    let out = bench(Build::Counting, dir.path(), &["--bench", "--list"], &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), listing());
    assert!(files(dir.path()).is_empty());
}

/// Memory mode (criterion 0.5, the allocator recorder) records exactly what each routine
/// allocates, setups not included, with call stacks; a second run with other iteration counts
/// (`MEMTRACK_ITERATIONS`, `MEMTRACK_WARMUP`) gives the same figures per iteration.
fn memory_mode_records_each_benchmark() {
    let dir = tempfile::tempdir().unwrap();
    check_run(Build::Memory05, dir.path(), &[], 10, Backend::Alloc);
    // The setups made 1 MiB each: per iteration, only the routines' blocks.
    let by_value = Reader::open(artifact(dir.path(), "batched/by_value")).unwrap();
    let t = &by_value.final_metadata().unwrap().totals;
    assert_eq!((t.allocations, t.bytes_allocated), (10, 640));
    let again = tempfile::tempdir().unwrap();
    check_run(
        Build::Memory05,
        again.path(),
        &[("MEMTRACK_ITERATIONS", "3"), ("MEMTRACK_WARMUP", "0")],
        3,
        Backend::Alloc,
    );
    // Call stacks: the vector's block was allocated under `vec_of`.
    let reader = Reader::open(artifact(dir.path(), "vec/1024")).unwrap();
    let sites = memtrack::analysis::Sites::read(&reader).unwrap();
    let mut sym = memtrack::symbolize::Symbolizer::new();
    let (stacks, named) = sym.symbolize_sites(&reader, &sites).unwrap();
    let site = sites.sites.iter().position(|s| s.blocks == 10);
    let site = site.unwrap_or_else(|| panic!("no site of the 10 vectors: {:?}", sites.sites));
    assert!(
        named[site]
            .iter()
            .flatten()
            .any(|f| f.function.as_deref().is_some_and(|n| n.ends_with("vec_of"))),
        "{:?}: {:?}",
        stacks[site],
        named[site]
    );
}

/// Criterion's command line in memory mode: `--list` lists the ids, a filter (a regex) and
/// `--exact` pick benchmarks, as `MEMTRACK_BENCHMARKS` does, criterion's other options are
/// accepted, `--test` runs each
/// benchmark once recording nothing, and an unknown option is refused.
fn memory_mode_reads_criterions_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(Build::Memory05, dir.path(), &["--bench", "--list"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), listing());
    assert!(files(dir.path()).is_empty());

    let args = [
        "json/1",
        "--save-baseline",
        "main",
        "--noplot",
        "-c",
        "never",
    ];
    let out = bench(
        Build::Memory05,
        dir.path(),
        &[&args[..], &["--bench"]].concat(),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        files(dir.path()),
        BTreeSet::from([file_of("parse/json/16"), file_of("parse/json/1024")])
    );

    let exact = tempfile::tempdir().unwrap();
    let args = ["--exact", "parse/json/16", "--bench"];
    let out = bench(Build::Memory05, exact.path(), &args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        files(exact.path()),
        BTreeSet::from([file_of("parse/json/16")])
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "a header and one row:\n{stdout}");
    // As `memtrack bench` runs it (`MEMTRACK_SUMMARY=line`): no table, one line on stderr.
    let line = tempfile::tempdir().unwrap();
    let out = bench(
        Build::Memory05,
        line.path(),
        &args,
        &[("MEMTRACK_SUMMARY", "line")],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "memtrack: 1 benchmark recorded, 10 iterations each after 2 of warm-up; artifacts in {}\n",
            line.path().display()
        )
    );

    // `MEMTRACK_BENCHMARKS` (as `memtrack bench --chain` sets it) with a filter: both choose.
    let chosen = tempfile::tempdir().unwrap();
    let env = [("MEMTRACK_BENCHMARKS", "parse/json/1024\nformat\nno/such\n")];
    let out = bench(Build::Memory05, chosen.path(), &["--bench"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        files(chosen.path()),
        BTreeSet::from([file_of("parse/json/1024"), "format.memtrack".into()])
    );
    let both = tempfile::tempdir().unwrap();
    let out = bench(Build::Memory05, both.path(), &["json", "--bench"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        files(both.path()),
        BTreeSet::from([file_of("parse/json/1024")])
    );

    let test = tempfile::tempdir().unwrap();
    let out = bench(Build::Memory05, test.path(), &["--bench", "--test"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("Success\n").count(), IDS.len(), "{stdout}");
    assert!(files(test.path()).is_empty());

    let out = bench(
        Build::Memory05,
        test.path(),
        &["--bench", "--frobnicate"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "memtrack: unknown option `--frobnicate` (memory mode takes criterion's options)\n"
    );
    let out = bench(
        Build::Memory05,
        test.path(),
        &["--bench"],
        &[("MEMTRACK_ITERATIONS", "0")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "memtrack: MEMTRACK_ITERATIONS=\"0\" is not a whole number of at least 1\n"
    );
    let out = bench(
        Build::Memory05,
        test.path(),
        &["--bench"],
        &[("MEMTRACK_SUMMARY", "loud")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "memtrack: MEMTRACK_SUMMARY=\"loud\" is neither \"table\" nor \"line\"\n"
    );
    assert!(files(test.path()).is_empty());
}

/// The same benchmarks on criterion 0.8 (memtrack-criterion's default), with the allocator
/// recorder.
fn criterion_0_8_suite() {
    let dir = tempfile::tempdir().unwrap();
    check_run(Build::Memory08, dir.path(), &[], 10, Backend::Alloc);
}

/// The criterion 0.8 suite recorded by the eBPF tracker (`MEMTRACK_BACKEND=ebpf`): the same
/// figures (the routines are Rust code; the tracker sees their `malloc` and `realloc`).
fn criterion_0_8_suite_on_the_ebpf_tracker() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("MEMTRACK_BACKEND", "ebpf")];
    check_run(Build::Memory08, dir.path(), &env, 10, Backend::Ebpf);
}

/// The harness's own cost per iteration, at most (crate docs, README "Instructions mode").
const HARNESS_IR: f64 = 20.0;

/// The instr suite run `runs` times under callgrind (10 iterations after 2 of warm-up):
/// each benchmark's measurement, by id.
fn counted_runs(runs: usize) -> BTreeMap<String, Measurement> {
    let exe = built(Build::Instructions).exe;
    let callgrind = Callgrind::find().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let mut all = Vec::new();
    for run in 0..runs {
        let env = [("MEMTRACK_ITERATIONS", "10"), ("MEMTRACK_WARMUP", "2")];
        let dir = scratch.path().join(run.to_string());
        let (counted, status) = callgrind
            .count(&exe, &["--bench".into()], scratch.path(), &env, &dir)
            .unwrap();
        // `panics` and `custom` fail; the others ran and were dumped.
        assert_eq!(status.code(), Some(1));
        all.push(counted);
    }
    let toolchain = Toolchain {
        rustc: String::new(),
        valgrind: String::new(),
        cpu: String::new(),
    };
    measure(&all, &toolchain)
        .into_iter()
        .map(|m| (m.benchmark.clone(), m))
        .collect()
}

/// Instructions mode against counts known without memtrack: `spin(K)` executes `dec; jnz` K
/// times, so Ir per iteration grows by exactly 2 per K; what is counted besides is the
/// harness's loop and the call, at most [`HARNESS_IR`]; `iter_batched`'s setup (100,000
/// spins) is not counted; a single-threaded benchmark counts the same in every run, and one
/// that waits for a thread by spinning varies and is not gated.
fn instructions_mode_counts_known_work() {
    let m = counted_runs(3);
    let ids: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(
        ids,
        ["batched/spin", "empty", "spin/1000", "spin/3000", "threads"],
        "a dump per benchmark that ran, none for the failed ones"
    );
    let ir = |id: &str| m[id].ir_per_iteration;
    assert!(ir("empty") <= HARNESS_IR, "harness floor {}", ir("empty"));
    // Whole counts of the 10 iterations: exact.
    let whole = |per_iteration: f64| (per_iteration * 10.0).round() as i64;
    assert_eq!(whole(ir("spin/3000")) - whole(ir("spin/1000")), 40_000);
    let extra = ir("spin/1000") - 2000.0;
    assert!(
        (0.0..=HARNESS_IR).contains(&extra),
        "spin/1000: {}",
        ir("spin/1000")
    );
    let batched = ir("batched/spin") - 2000.0;
    assert!(
        (0.0..=HARNESS_IR).contains(&batched),
        "setup counted: {}",
        ir("batched/spin")
    );
    for id in ["empty", "spin/1000", "spin/3000", "batched/spin"] {
        assert_eq!(m[id].iterations, 10);
        assert_eq!(m[id].runs.len(), 3);
        assert!(
            m[id].runs.iter().all(|&r| r == m[id].runs[0]),
            "{id}: {:?}",
            m[id].runs
        );
        assert_eq!(m[id].not_gated, None);
    }
    // The function itself, demangled: 2K and its return.
    let spin = |id: &str| {
        let f = m[id].functions.iter().find(|f| f.name == "instr::spin");
        f.unwrap_or_else(|| panic!("{id}: no instr::spin in {:?}", m[id].functions))
            .clone()
    };
    assert_eq!(
        spin("spin/3000").self_ir - spin("spin/1000").self_ir,
        4000.0
    );
    assert!((2000.0..=2004.0).contains(&spin("spin/1000").self_ir));
    assert_eq!(spin("spin/1000").inclusive, spin("spin/1000").self_ir);
    let threads = &m["threads"];
    assert!(
        threads.spread_percent > MAX_GATED_SPREAD && threads.not_gated.is_some(),
        "threads: {:?}",
        threads.runs
    );
}

/// Outside valgrind an instructions-mode binary says how to run it, and exits 2.
fn instructions_mode_outside_valgrind_says_so() {
    let out = Command::new(built(Build::Instructions).exe)
        .arg("--bench")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("run it with `memtrack bench --measure instructions`"),
        "{stderr}"
    );
}

/// Run by hand under callgrind, an instructions-mode binary says who reads its dumps; run as
/// `memtrack bench` runs it (`MEMTRACK_SUMMARY=line`), it says only what it counted.
fn instructions_mode_names_the_reader_when_run_by_hand() {
    let scratch = tempfile::tempdir().unwrap();
    let counted = "memtrack: 1 benchmark counted, 10 iterations each after 2 of warm-up";
    for (summary, expected) in [
        (
            None,
            format!(
                "{counted}, one callgrind dump each (`memtrack bench --measure instructions` \
                 reads them)\n"
            ),
        ),
        (Some("line"), format!("{counted}\n")),
    ] {
        let mut cmd = Command::new("valgrind");
        cmd.args(["--tool=callgrind", "-q"])
            .arg(format!(
                "--callgrind-out-file={}",
                scratch.path().join("callgrind.out.%p").display()
            ))
            .arg(built(Build::Instructions).exe)
            .args(["--bench", "^empty$"])
            .current_dir(scratch.path())
            .env("MEMTRACK_ITERATIONS", "10")
            .env("MEMTRACK_WARMUP", "2")
            .env_remove("MEMTRACK_BENCHMARKS")
            .env_remove("MEMTRACK_SUMMARY");
        if let Some(s) = summary {
            cmd.env("MEMTRACK_SUMMARY", s);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{summary:?}: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            expected,
            "{summary:?}"
        );
    }
}

fn main() {
    let trials: Vec<Trial> = vec![
        test("timing_mode_is_criterion", timing_mode_is_criterion),
        test(
            "memory_mode_records_each_benchmark",
            memory_mode_records_each_benchmark,
        ),
        test(
            "memory_mode_reads_criterions_command_line",
            memory_mode_reads_criterions_command_line,
        ),
        test("criterion_0_8_suite", criterion_0_8_suite),
        requires(
            "criterion_0_8_suite_on_the_ebpf_tracker",
            &[TRACKER],
            criterion_0_8_suite_on_the_ebpf_tracker,
        ),
        requires(
            "instructions_mode_counts_known_work",
            &[Need::Tool("valgrind")],
            instructions_mode_counts_known_work,
        ),
        requires(
            "instructions_mode_names_the_reader_when_run_by_hand",
            &[Need::Tool("valgrind")],
            instructions_mode_names_the_reader_when_run_by_hand,
        ),
        test(
            "instructions_mode_outside_valgrind_says_so",
            instructions_mode_outside_valgrind_says_so,
        ),
    ];
    run(trials)
}
