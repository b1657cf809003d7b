//! `memtrack bench --measure time --base REF` on a real criterion suite: examples/downstream
//! (on memtrack-criterion, in timing mode criterion itself) copied into a git repository whose
//! commits change nothing a benchmark runs, make `render` do its work ten times, add a
//! benchmark, and break the build. Each test checks a commit out and compares it with its
//! parent. Criterion's warm-up and measurement are kept to hundredths of a second: the
//! verdicts asserted here are the ones the rule guarantees whatever the noise (a tenfold
//! slowdown is far beyond any range this machine's load makes; a no-op is never called
//! regressed unless every head run is slower than every base run, beyond the threshold). The
//! tests run one after another: they share the repository's checkout and target directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

mod common;

use memtrack_test_support::{run_sequential, test};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The tests' directory under the workspace's target directory.
fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memtrack-bench-time")
}

fn git(dir: &Path, args: &[&str]) -> Output {
    common::git(dir, &tmp(), args)
}

/// The commits of the fixture repository, by what each changes from its parent.
struct Project {
    dir: PathBuf,
    /// A comment added after the code: nothing a benchmark runs changes.
    noop: String,
    /// `render` joins the tokens ten times.
    slow: String,
    /// A benchmark `render_twice` added.
    added: String,
    /// `render` no longer compiles (a child of `added`).
    broken: String,
}

fn project() -> &'static Project {
    static P: OnceLock<Project> = OnceLock::new();
    P.get_or_init(|| make_project(&tmp().join("project")))
}

fn make_project(dir: &Path) -> Project {
    common::copy_downstream(dir);
    common::init_repo(dir, &tmp(), "base");
    // At the end: no line of the code moves, so neither do the panic locations compiled in.
    common::edit(
        dir,
        "src/lib.rs",
        (
            "    tokens.join(\" \")\n}\n",
            "    tokens.join(\" \")\n}\n\n// A note.\n",
        ),
    );
    let noop = common::commit_all(dir, &tmp(), "a comment");
    common::edit(
        dir,
        "src/lib.rs",
        (
            "tokens.join(\" \")",
            "(0..10).map(|_| std::hint::black_box(tokens).join(\" \")).last().unwrap()",
        ),
    );
    let slow = common::commit_all(dir, &tmp(), "render joins ten times");
    common::edit(
        dir,
        "benches/tokenize.rs",
        (
            "criterion_group!(benches, bench_tokenize, bench_render);",
            "fn bench_render_twice(c: &mut Criterion) {\n    let tokens = \
             downstream::tokenize(&source());\n    c.bench_function(\"render_twice\", |b| \
             b.iter(|| (downstream::render(black_box(&tokens)), \
             downstream::render(black_box(&tokens)))));\n}\n\n\
             criterion_group!(benches, bench_tokenize, bench_render, bench_render_twice);",
        ),
    );
    let added = common::commit_all(dir, &tmp(), "a second render benchmark");
    common::edit(dir, "src/lib.rs", ("// A note.", "fn broken( {"));
    let broken = common::commit_all(dir, &tmp(), "render broken");
    Project {
        dir: dir.to_path_buf(),
        noop,
        slow,
        added,
        broken,
    }
}

/// Criterion's settings of every run here: tiny, so that a run takes a tenth of a second.
const QUICK: [&str; 6] = [
    "--warm-up-time",
    "0.01",
    "--measurement-time",
    "0.02",
    "--sample-size",
    "10",
];

/// `memtrack bench --measure time --format json --out OUT ARGS -- <cheap cargo args> [-- FILTER]`
/// with `commit` checked out.
fn bench(p: &Project, commit: &str, out: &Path, args: &[&str], filter: Option<&str>) -> Output {
    bench_as(p, commit, out, "json", args, filter)
}

/// [`bench`] in `format`.
fn bench_as(
    p: &Project,
    commit: &str,
    out: &Path,
    format: &str,
    args: &[&str],
    filter: Option<&str>,
) -> Output {
    git(&p.dir, &["checkout", "-q", "--detach", commit]);
    let mut cmd = common::bench_command(&p.dir, &tmp().join("target"));
    cmd.args(["--measure", "time", "--format", format, "--out"])
        .arg(out)
        .args(QUICK)
        .args(args)
        .arg("--")
        .args(common::cheap_cargo_args(&p.dir));
    if let Some(f) = filter {
        cmd.args(["--", f]);
    }
    // No debug info: the two timing builds are most of these tests' time.
    cmd.env("CARGO_PROFILE_DEV_DEBUG", "0");
    cmd.output().expect("run memtrack bench")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\nstderr: {}", text(&out.stdout), text(&out.stderr)))
}

/// The rows' verdicts by benchmark.
fn verdicts(v: &serde_json::Value) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["metric"], "time", "{r}");
            (
                r["benchmark"].as_str().unwrap().to_string(),
                r["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// The run log, one JSON object a line.
fn log(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("time/runs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Checks from the log that each benchmark's runs came in one block, in rounds of base, head,
/// head, base, numbered in order, and that the report's runs are the log's figures.
fn check_order(out: &Path, report: &serde_json::Value, rounds: usize) {
    let runs = log(out);
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(runs.len(), rows.len() * 4 * rounds, "{runs:?}");
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r["seq"], i + 1, "{r}");
    }
    for (block, row) in runs.chunks(4 * rounds).zip(rows) {
        let sides: Vec<&str> = block.iter().map(|r| r["side"].as_str().unwrap()).collect();
        assert_eq!(
            sides,
            ["base", "head", "head", "base"].repeat(rounds),
            "{block:?}"
        );
        for (j, r) in block.iter().enumerate() {
            assert_eq!(r["benchmark"], row["benchmark"], "{r}");
            assert_eq!(r["round"], j / 4 + 1, "{r}");
        }
        // Each run starts after the one before it ended.
        for w in block.windows(2) {
            let end = w[0]["started_unix_ms"].as_u64().unwrap() + w[0]["wall_ms"].as_u64().unwrap();
            assert!(
                w[1]["started_unix_ms"].as_u64().unwrap() + 1 >= end,
                "{w:?}"
            );
        }
        for side in ["base", "head"] {
            let logged: Vec<&serde_json::Value> = block
                .iter()
                .filter(|r| r["side"] == side)
                .map(|r| &r["median_ns"])
                .collect();
            let reported: Vec<&serde_json::Value> = row[format!("{side}_runs")]
                .as_array()
                .unwrap()
                .iter()
                .collect();
            assert_eq!(logged, reported, "{side}: {row}");
        }
    }
}

/// A commit that changes nothing the benchmarks run, five times over: every row within noise,
/// exit 0 even with `--gate time`, the order read back from the log. Five rounds (ten runs a
/// side): runs that differ by chance alone all fall on one side one time in 184,756. A 10 %
/// threshold: the two builds are not the same bytes (each is built in its own directory, and
/// the base from a fresh worktree), and a few percent of layout is a real change of time,
/// which the rule may call when the machine is quiet enough for the ranges to part.
fn a_noop_is_within_noise_and_runs_alternate() {
    let p = project();
    let out = tmp().join("noop");
    for _ in 0..5 {
        let o = bench(
            p,
            &p.noop,
            &out,
            &[
                "--base",
                "HEAD~1",
                "--gate",
                "time",
                "--rounds",
                "5",
                "--threshold",
                "10%",
            ],
            None,
        );
        let v = json(&o);
        assert_eq!(o.status.code(), Some(0), "{v}\n{}", text(&o.stderr));
        assert_eq!(
            verdicts(&v),
            [
                ("render".to_string(), "within_noise".to_string()),
                ("tokenize".to_string(), "within_noise".to_string())
            ],
            "{v}"
        );
        assert_eq!(
            (v["rounds"].as_u64(), v["regressions"].as_u64()),
            (Some(5), Some(0))
        );
        check_order(&out, &v, 5);
    }
}

/// `render` made tenfold slower: regressed, beyond the threshold and with its ranges apart;
/// exit 1 with `--gate time`, 0 without (criterion's filter after the second `--`).
fn a_slower_benchmark_regresses_and_gates_when_asked() {
    let p = project();
    let out = tmp().join("slow");
    let o = bench(
        p,
        &p.slow,
        &out,
        &["--base", "HEAD~1", "--gate", "time"],
        None,
    );
    let v = json(&o);
    assert_eq!(o.status.code(), Some(1), "{v}\n{}", text(&o.stderr));
    let render = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["benchmark"] == "render")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(render["verdict"], "regressed", "{render}");
    assert!(
        render["head_min"].as_f64() > render["base_max"].as_f64(),
        "{render}"
    );
    assert!(render["change_percent"].as_f64().unwrap() > 3.0, "{render}");
    // Not asserted of tokenize: its code is the same, but the build around it is not, and a
    // change of layout is a real change of time, which this rule may call.
    let regressed = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "regressed")
        .count();
    assert_eq!(v["regressions"], regressed, "{v}");
    check_order(&out, &v, 3);

    let o = bench(
        p,
        &p.slow,
        &out,
        &["--base", "HEAD~1", "--rounds", "2"],
        Some("render"),
    );
    let v = json(&o);
    assert_eq!(o.status.code(), Some(0), "{v}\n{}", text(&o.stderr));
    assert_eq!(
        verdicts(&v),
        [("render".to_string(), "regressed".to_string())],
        "{v}"
    );
    check_order(&out, &v, 2);
}

/// A benchmark only the head has is listed, not run; a base that does not build is listed,
/// exit 2 after the report.
fn one_sided_benchmarks_and_builds_are_listed() {
    let p = project();
    let out = tmp().join("listed");
    let o = bench(
        p,
        &p.added,
        &out,
        &["--base", "HEAD~1", "--rounds", "1"],
        Some("render"),
    );
    let v = json(&o);
    assert_eq!(o.status.code(), Some(0), "{v}\n{}", text(&o.stderr));
    assert_eq!(
        v["added"],
        serde_json::json!([{"benchmark": "render_twice"}]),
        "{v}"
    );
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");
    assert_eq!(verdicts(&v).len(), 1, "{v}");
    check_order(&out, &v, 1);

    let o = bench(
        p,
        &p.added,
        &out,
        &["--base", &p.broken, "--rounds", "1"],
        Some("render"),
    );
    let v = json(&o);
    assert_eq!(o.status.code(), Some(2), "{v}\n{}", text(&o.stderr));
    let failed = v["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["side"], "base", "{v}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("cargo"),
        "{v}"
    );
    assert_eq!(
        v["added"],
        serde_json::json!([{"benchmark": "render"}, {"benchmark": "render_twice"}]),
        "{v}"
    );
    assert!(v["rows"].as_array().unwrap().is_empty(), "{v}");
    // The markdown says it too.
    let o = bench_as(
        p,
        &p.added,
        &out,
        "markdown",
        &["--base", &p.broken, "--rounds", "1"],
        Some("render"),
    );
    let md = text(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{md}\n{}", text(&o.stderr));
    assert!(md.contains("- failed (base): \\`"), "{md}");
    assert!(
        md.contains("- only in head (not compared): render\\_twice"),
        "{md}"
    );
}

/// Usage errors: time needs --base, and --gate time needs --measure time.
fn time_needs_a_base() {
    let p = project();
    git(&p.dir, &["checkout", "-q", "--detach", &p.noop]);
    for (args, says) in [
        (&["--measure", "time"][..], "give --base REF"),
        (&["--gate", "time"][..], "add --measure time"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_memtrack"))
            .current_dir(&p.dir)
            .arg("bench")
            .args(args)
            .env("CARGO_TARGET_DIR", tmp().join("target"))
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }
}

fn main() {
    run_sequential(vec![
        test(
            "a_slower_benchmark_regresses_and_gates_when_asked",
            a_slower_benchmark_regresses_and_gates_when_asked,
        ),
        test(
            "a_noop_is_within_noise_and_runs_alternate",
            a_noop_is_within_noise_and_runs_alternate,
        ),
        test(
            "one_sided_benchmarks_and_builds_are_listed",
            one_sided_benchmarks_and_builds_are_listed,
        ),
        test("time_needs_a_base", time_needs_a_base),
    ])
}
