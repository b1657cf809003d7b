//! `memtrack bench` on a real criterion suite: examples/downstream (a user's project on
//! memtrack-criterion), copied into a git repository of two commits, the second giving one
//! routine (`tokenize`) an extra `String` per token. Built by cargo as a user builds it (the
//! dev profile, one target directory under the workspace's `CARGO_TARGET_TMPDIR` for every
//! test, where later runs find the head and the base built) and run through the command.
//!
//! The expected figures are counted here from the benchmark's input, not by memtrack.
//! The allocator recorder (no privileges); the eBPF tracker's memory mode is
//! memtrack-criterion's tests' and CI's `.ci/examples` run of this command. The tests take
//! turns: they share the target directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Bytes a program printed, as text.
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
use memtrack_test_support::{Need, requires, run, test};

/// The input of benches/tokenize.rs, as it spells it.
const LINE: &str = "fn main() { let x_1 = 42; println!(\"{}\", x_1 + 7); } ";
const LINES: usize = 50;

/// The tokens of the input: runs of alphanumerics and `_`.
fn tokens() -> Vec<String> {
    let src = LINE.repeat(LINES);
    let mut out = vec![String::new()];
    for c in src.chars() {
        if c.is_alphanumeric() || c == '_' {
            out.last_mut().unwrap().push(c);
        } else if !out.last().unwrap().is_empty() {
            out.push(String::new());
        }
    }
    out.retain(|t| !t.is_empty());
    out
}

/// The edit of the second commit: each token's `String` copied once more.
const GROW: (&str, &str) = (
    "words().map(str::to_lowercase)",
    "words().map(|t| t.to_lowercase().as_str().to_owned())",
);

/// The repository (built once per process) and the lock the tests take turns with.
fn project() -> (MutexGuard<'static, ()>, &'static Path) {
    static TURN: Mutex<()> = Mutex::new(());
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    (
        turn,
        DIR.get_or_init(|| make_project(&tmp().join("project"))),
    )
}

/// The tests' directory under the workspace's target directory.
fn tmp() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("memtrack-bench")
}

fn git(dir: &Path, args: &[&str]) -> Output {
    common::git(dir, &tmp(), args)
}

/// examples/downstream in a fresh repository at `dir`: a commit as it is, then one with
/// [`GROW`].
fn make_project(dir: &Path) -> PathBuf {
    copy_downstream(dir);
    common::init_repo(dir, &tmp(), "base");
    common::edit(dir, "src/lib.rs", GROW);
    common::commit_all(dir, &tmp(), "tokenize copies each token");
    dir.to_path_buf()
}

/// examples/downstream copied to `dir` ([`common::copy_downstream`]), its input checked to be
/// the one the expected figures are counted from.
fn copy_downstream(dir: &Path) {
    common::copy_downstream(dir);
    let bench = std::fs::read_to_string(dir.join("benches/tokenize.rs")).unwrap();
    assert!(
        bench.contains(&format!("{LINE:?}.repeat({LINES})")),
        "the input changed"
    );
}

/// `memtrack bench ARGS -- CARGO ARGS` in `dir`, the build cheap: the dev profile, the one
/// benchmark target, offline when the lock file resolves without the network.
fn bench(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = common::bench_command(dir, &tmp().join("target"));
    cmd.args(args).arg("--");
    cmd.args(common::cheap_cargo_args(dir))
        .args(["--target", &common::host()]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run memtrack bench")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\nstderr: {}", text(&out.stdout), text(&out.stderr)))
}

/// Per iteration, the head's `tokenize` makes a vector and two `String`s per token, `render`
/// one `String` of the tokens and the spaces between them.
fn expected() -> [(&'static str, f64, f64); 2] {
    let t = tokens();
    let chars: usize = t.iter().map(String::len).sum();
    let n = t.len();
    assert_eq!(n, 8 * LINES);
    [
        ("render", 1.0, (chars + n - 1) as f64),
        ("tokenize", (1 + 2 * n) as f64, (n * 24 + 2 * chars) as f64),
    ]
}

fn check_report(out: &Output) {
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let v = json(out);
    let rows = v["benchmarks"].as_array().unwrap();
    let got: Vec<(&str, f64, f64)> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["iterations"], 10);
            assert_eq!(r["live_blocks_at_end"], 0);
            (
                r["benchmark"].as_str().unwrap(),
                r["allocations_per_iteration"].as_f64().unwrap(),
                r["bytes_allocated_per_iteration"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expected());
}

/// The named functions of a site's `frames` (compare's JSON), innermost first.
fn functions(frames: &serde_json::Value) -> Vec<&str> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["function"].as_str())
        .collect()
}

/// Without --base: one row per benchmark, the figures those the routines make.
fn report_counts_what_each_routine_allocates() {
    let (_turn, dir) = project();
    let out_dir = tmp().join("report");
    let out = bench(
        dir,
        &[
            "--backend",
            "alloc",
            "--format",
            "json",
            "--out",
            out_dir.to_str().unwrap(),
        ],
        &[],
    );
    check_report(&out);
    // A second run clears the first's artifacts and says so; the table has the same figures.
    let out = bench(
        dir,
        &["--backend", "alloc", "--out", out_dir.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!(
        "memtrack: removed 2 artifacts of a previous run from {}",
        out_dir.display()
    )));
    let table = text(&out.stdout);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "benchmark",
            "iterations",
            "allocations",
            "bytes",
            "peak",
            "live",
            "at",
            "end"
        ]
    );
    assert_eq!(lines[1][..3], ["render", "10", "1.00/iter"]);
    assert_eq!(
        lines[2][..3],
        ["tokenize", "10", &format!("{:.2}/iter", expected()[1].1)]
    );
}

/// `--base HEAD~1` on the allocator recorder, JSON out, the artifacts in `out`.
fn base_json_args(out: &Path) -> [&str; 8] {
    [
        "--backend",
        "alloc",
        "--base",
        "HEAD~1",
        "--format",
        "json",
        "--out",
        out.to_str().unwrap(),
    ]
}

/// --base HEAD~1: exactly tokenize regressed, in allocations and bytes, and its attribution
/// names it; exit 1; the markdown appended to $GITHUB_STEP_SUMMARY; the worktree removed.
fn base_finds_and_attributes_the_regression() {
    let (_turn, dir) = project();
    let out_dir = tmp().join("gate");
    let step = tmp().join("step-summary.md");
    std::fs::write(&step, "earlier step\n").unwrap();
    let args = base_json_args(&out_dir);
    let out = bench(dir, &args, &[("GITHUB_STEP_SUMMARY", &step)]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", text(&out.stderr));
    let v = json(&out);
    let verdicts: Vec<(&str, &str, &str)> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["benchmark"].as_str().unwrap(),
                r["metric"].as_str().unwrap(),
                r["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("render", "allocations", "unchanged"),
            ("render", "bytes", "unchanged"),
            ("render", "peak", "unchanged"),
            ("tokenize", "allocations", "regressed"),
            ("tokenize", "bytes", "regressed"),
            // The copy is dropped at once: the peak grows by one token.
            ("tokenize", "peak", "within_threshold"),
        ]
    );
    assert_eq!(v["regressions"], 2);
    let n = tokens().len() as i64;
    let allocations = &v["attribution"][0];
    assert_eq!(
        (
            allocations["benchmark"].as_str(),
            allocations["metric"].as_str()
        ),
        (Some("tokenize"), Some("allocations"))
    );
    assert_eq!(allocations["delta"], 10 * n, "{allocations:#}");
    let top = &allocations["sites"][0];
    assert_eq!(top["delta"], 10 * n, "{allocations:#}");
    let functions = functions(&top["frames"]);
    assert!(
        functions
            .iter()
            .any(|f| f.starts_with("downstream::tokenize")),
        "{functions:?}"
    );
    let summary = std::fs::read_to_string(&step).unwrap();
    assert!(
        summary.starts_with(
            "earlier step\n### memtrack: memory comparison\n\n❌ **1 benchmark regressed (2 figures"
        ),
        "{summary}"
    );
    let worktrees = text(&git(dir, &["worktree", "list"]).stdout);
    assert_eq!(worktrees.lines().count(), 1, "{worktrees}");
}

/// A benchmark that allocates nothing at the base: `first` borrows the first token.
const FIRST_BORROWED: &str = "
/// The first token, borrowed: no allocation.
pub fn first(tokens: &[String]) -> &str {
    tokens.first().map_or(\"\", String::as_str)
}
";

/// The head's `first`: an owned copy of the token, one allocation per call.
const FIRST_OWNED: (&str, &str) = (
    "pub fn first(tokens: &[String]) -> &str {\n    tokens.first().map_or(\"\", String::as_str)",
    "pub fn first(tokens: &[String]) -> String {\n    tokens.first().cloned().unwrap_or_default()",
);

/// The benchmark of `first`, beside the suite's own.
const FIRST_BENCH: (&str, &str) = (
    "criterion_group!(benches, bench_tokenize, bench_render);",
    "fn bench_first(c: &mut Criterion) {
    let tokens = downstream::tokenize(&source());
    c.bench_function(\"first\", |b| b.iter(|| downstream::first(black_box(&tokens))));
}

criterion_group!(benches, bench_tokenize, bench_render, bench_first);",
);

/// --base HEAD~1 where a routine that allocated nothing starts allocating: the regression is
/// attributed to the function that now allocates (every site of the head is new), and no note
/// says call stacks are missing. The other way round, from the same two recordings: an
/// improvement, and the differential flame graph counts the base's site as gone.
fn a_regression_from_nothing_names_the_function() {
    let (_turn, _) = project();
    let dir = &tmp().join("from-nothing");
    let _ = std::fs::remove_dir_all(dir);
    copy_downstream(dir);
    // Another version of the package: the projects share a target directory, where the same
    // package id would name the same binaries, and cargo would find another project's fresh.
    let version = (
        "name = \"downstream\"\nversion = \"0.1.0\"",
        "name = \"downstream\"\nversion = \"0.1.1\"",
    );
    common::edit(dir, "Cargo.toml", version);
    common::edit(dir, "Cargo.lock", version);
    let lib = dir.join("src/lib.rs");
    let body = std::fs::read_to_string(&lib).unwrap();
    std::fs::write(&lib, body + FIRST_BORROWED).unwrap();
    common::edit(dir, "benches/tokenize.rs", FIRST_BENCH);
    common::init_repo(dir, &tmp(), "first borrows");
    common::edit(dir, "src/lib.rs", FIRST_OWNED);
    common::commit_all(dir, &tmp(), "first copies");

    let out_dir = tmp().join("from-nothing-out");
    let args = base_json_args(&out_dir);
    let out = bench(dir, &args, &[]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(!err.contains("no call sites"), "{err}");
    let v = json(&out);
    let first: Vec<(&str, u64, u64, &str)> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["benchmark"] == "first")
        .map(|r| {
            (
                r["metric"].as_str().unwrap(),
                r["base"].as_u64().unwrap(),
                r["head"].as_u64().unwrap(),
                r["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    // Each of the 10 iterations copies the first token, "fn" (2 bytes), and drops it.
    assert_eq!(
        first,
        [
            ("allocations", 0, 10, "regressed"),
            ("bytes", 0, 20, "regressed"),
            ("peak", 0, 2, "regressed"),
        ],
        "{v:#}"
    );
    let attributed = v["attribution"].as_array().unwrap();
    assert_eq!(attributed.len(), 3, "{v:#}");
    for a in attributed {
        assert_eq!(a["benchmark"], "first", "{a:#}");
        let top = &a["sites"][0];
        assert_eq!(top["base"], 0, "{a:#}");
        assert_eq!(top["delta"], top["head"], "{a:#}");
        let functions = functions(&top["frames"]);
        assert!(
            functions.iter().any(|f| f.starts_with("downstream::first")),
            "{functions:?}"
        );
    }

    // The reverse: the base's artifact as the head.
    let (base, head) = (out_dir.join("base"), out_dir.join("head"));
    let cli = || Command::new(env!("CARGO_BIN_EXE_memtrack"));
    let out = cli()
        .args(["compare", "--format", "json"])
        .args([&head, &base])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("no call sites"),
        "{}",
        text(&out.stderr)
    );
    let v = json(&out);
    let first: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["benchmark"] == "first")
        .map(|r| r["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(first, ["improved"; 3], "{v:#}");
    let svg = tmp().join("from-nothing.svg");
    let out = cli()
        .args(["flamegraph", "-o", svg.to_str().unwrap(), "--diff"])
        .args([head.join("first.memtrack"), base.join("first.memtrack")])
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.contains(
            "the head has no bytes allocated; the base had 20 bytes at 1 stack, only in the base"
        ),
        "{drawn}"
    );
}

/// --base outside a repository, and a REF that names no commit: exit 2 before any build.
/// A suite on criterion itself (examples/downstream, its criterion line the crate's own): both
/// measures that need memtrack-criterion refuse it before building anything, saying so and
/// what to change.
fn a_suite_on_criterion_itself_is_refused_before_it_is_built() {
    let dir = tmp().join("on-criterion");
    copy_downstream(&dir);
    let manifest = dir.join("Cargo.toml");
    let body = std::fs::read_to_string(&manifest).unwrap();
    let lines: Vec<&str> = body
        .lines()
        .map(|l| {
            if l.starts_with("criterion = ") {
                "criterion = \"0.8\""
            } else {
                l
            }
        })
        .collect();
    assert_ne!(lines.join("\n") + "\n", body, "no criterion line");
    std::fs::write(&manifest, lines.join("\n") + "\n").unwrap();
    let target = tmp().join("on-criterion-target");
    let _ = std::fs::remove_dir_all(&target);
    for (args, mode) in [
        (&["--backend", "alloc"][..], "memory"),
        (&["--measure", "instructions"][..], "instructions"),
    ] {
        let out = bench(&dir, args, &[("CARGO_TARGET_DIR", &target)]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stderr),
            format!(
                "memtrack: error: the suite (head) is not on memtrack-criterion, so it has no \
                 {mode} mode: point its criterion line at it (`criterion = {{ package = \
                 \"memtrack-criterion\", … }}`)\n"
            )
        );
    }
    // Nothing built: cargo tags every target directory it builds in.
    let tags: Vec<PathBuf> = walk(&target)
        .into_iter()
        .filter(|p| p.ends_with("CACHEDIR.TAG"))
        .collect();
    assert_eq!(tags, Vec::<PathBuf>::new());
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

fn base_is_refused_without_a_commit() {
    let (_turn, dir) = project();
    let out = bench(dir, &["--base", "no-such-ref"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        format!(
            "memtrack: error: --base no-such-ref: no such commit in {}: name a branch, tag or commit\n",
            dir.display()
        )
    );
    // Outside this repository's checkout too.
    let outside = tempfile::tempdir().unwrap();
    let plain = outside.path();
    std::fs::copy(dir.join("Cargo.toml"), plain.join("Cargo.toml")).unwrap();
    let out = bench(plain, &["--base", "HEAD~1"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "memtrack: error: --base needs a git repository, and {} is in none",
            plain.display()
        )),
        "{err}"
    );
}

/// The edit that gives `tokenize`'s vector room for one more `String` (24 bytes).
const GROW_ROOM: (&str, &str) = (
    "Vec::with_capacity(words().count())",
    "Vec::with_capacity(words().count() + 1)",
);

/// The chain's repository: base; a comment; a commit that does not build; [`GROW`] with the
/// build fixed; another comment; [`GROW_ROOM`]. Each commit's id, oldest first.
fn make_chain(dir: &Path) -> Vec<String> {
    let _ = std::fs::remove_dir_all(dir);
    copy_downstream(dir);
    let mut ids = vec![common::init_repo(dir, &tmp(), "base")];
    let comment = (
        "//! The code under test",
        "//! The code under test (unchanged)",
    );
    common::edit(dir, "src/lib.rs", comment);
    ids.push(common::commit_all(dir, &tmp(), "a comment"));
    let broken = ("pub fn render(", "pub fn render(oops");
    common::edit(dir, "src/lib.rs", broken);
    ids.push(common::commit_all(dir, &tmp(), "does not build"));
    common::edit(dir, "src/lib.rs", (broken.1, broken.0));
    common::edit(dir, "src/lib.rs", GROW);
    ids.push(common::commit_all(
        dir,
        &tmp(),
        "tokenize copies each token",
    ));
    common::edit(
        dir,
        "benches/tokenize.rs",
        ("//! The suite", "//! The suite (a comment)"),
    );
    ids.push(common::commit_all(dir, &tmp(), "another comment"));
    common::edit(dir, "src/lib.rs", GROW_ROOM);
    ids.push(common::commit_all(
        dir,
        &tmp(),
        "tokenize makes room for one more",
    ));
    ids
}

/// --chain over six commits: tokenize regressed from the first to the last, in two steps, each
/// named by the commit that made it, with its call sites; the commit that does not build is
/// listed as not measured (the step after it may be its); the commits between run the
/// regressed benchmark only, and rebuild only the suite's crate.
fn chain_names_the_commit_of_each_step() {
    let (_turn, _) = project();
    let dir = tmp().join("chain");
    let ids = make_chain(&dir);
    let out_dir = tmp().join("chain-out");
    // Each run's commits are new (their times differ), and so are their directories.
    let _ = std::fs::remove_dir_all(&out_dir);
    let args = [
        "--backend",
        "alloc",
        "--chain",
        "HEAD~5..HEAD",
        "--format",
        "json",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = bench(&dir, &args, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let v = json(&out);
    assert_eq!(v["regressed"], serde_json::json!(["tokenize"]));
    let states: Vec<&str> = v["commits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "measured", "measured", "failed", "measured", "measured", "measured"
        ]
    );
    let steps = v["steps"].as_array().unwrap();
    let named: Vec<(&str, &str)> = steps
        .iter()
        .map(|s| (s["commit"].as_str().unwrap(), s["after"].as_str().unwrap()))
        .collect();
    assert_eq!(
        named,
        [
            (ids[3].as_str(), ids[1].as_str()),
            (ids[5].as_str(), ids[4].as_str())
        ]
    );
    let n = tokens().len() as i64;
    for (step, metric, delta) in [
        (&steps[0], "allocations", 10 * n),
        (&steps[1], "bytes", 10 * 24),
    ] {
        let rows = step["comparison"]["rows"].as_array().unwrap();
        let changed: Vec<(&str, &str)> = rows
            .iter()
            .filter(|r| r["verdict"] != "unchanged")
            .map(|r| {
                (
                    r["benchmark"].as_str().unwrap(),
                    r["metric"].as_str().unwrap(),
                )
            })
            .collect();
        assert!(changed.contains(&("tokenize", metric)), "{rows:?}");
        let a = step["comparison"]["attribution"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["metric"] == metric)
            .unwrap_or_else(|| panic!("no attribution of {metric}: {step:#}"));
        assert_eq!(a["benchmark"], "tokenize");
        assert_eq!(a["delta"], delta, "{a:#}");
        let functions = functions(&a["sites"][0]["frames"]);
        assert!(
            functions
                .iter()
                .any(|f| f.starts_with("downstream::tokenize")),
            "{functions:?}"
        );
    }
    // The ends ran the whole suite, the commits between the regressed benchmark only.
    for (i, id) in ids.iter().enumerate() {
        let d = out_dir.join(format!("{i:02}-{}", &id[..12]));
        let files = std::fs::read_dir(&d).map_or(0, |r| {
            r.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "memtrack")
            })
            .count()
        });
        let expected = match i {
            2 => 0,
            0 | 5 => 2,
            _ => 1,
        };
        assert_eq!(files, expected, "{}", d.display());
        // No copies of its own: the chain keeps one store, --out's.
        assert!(!d.join(".build-id").exists(), "{}", d.display());
    }
    // The copies of the executables they recorded, named by build id (the steps' call sites
    // above were named from them: the suite was rebuilt since).
    assert!(out_dir.join(".build-id").is_dir());
    // Builds are reused: memtrack-criterion compiles at most once along the chain.
    let compiled = stderr.matches("Compiling memtrack-criterion ").count();
    assert!(
        compiled <= 1,
        "{compiled} builds of memtrack-criterion:\n{stderr}"
    );
    let worktrees = text(&git(&dir, &["worktree", "list"]).stdout);
    assert_eq!(worktrees.lines().count(), 1, "{worktrees}");
}

/// --chain with a range that is not BASE..HEAD along HEAD's history: exit 2, saying why and
/// what to give, before anything is built.
fn chain_refuses_a_bad_range() {
    let (_turn, dir) = project();
    for (range, why) in [
        (
            "HEAD~1...HEAD",
            "`...` is a symmetric difference: give BASE..HEAD, BASE an ancestor of HEAD",
        ),
        (
            "HEAD~1",
            "expected BASE..HEAD (two revisions joined by `..`)",
        ),
        (
            "no-such..HEAD",
            "no commit \"no-such\" here: name a branch, tag or commit",
        ),
        (
            "HEAD..HEAD",
            "the range holds no commit: give BASE older than HEAD",
        ),
    ] {
        // Memory's chain, and time's (which keeps two worktrees): refused alike.
        for measure in ["memory", "time"] {
            let out = bench(dir, &["--measure", measure, "--chain", range], &[]);
            assert_eq!(out.status.code(), Some(2), "{range}: {}", text(&out.stderr));
            assert_eq!(
                text(&out.stderr),
                format!("memtrack: error: --chain {range}: {why}\n")
            );
        }
    }
    // Time gates only when it is measured.
    let out = bench(dir, &["--gate", "time", "--chain", "HEAD~1..HEAD"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "memtrack: error: --gate time gates --measure time: add --measure time\n"
    );
    // A BASE that HEAD reaches only through a merge's second parent: the chain of HEAD's first
    // parents never passes through it.
    let side = tmp().join("side");
    let _ = std::fs::remove_dir_all(&side);
    git(
        tmp().as_path(),
        &["clone", "-q", &dir.display().to_string(), "side"],
    );
    git(&side, &["checkout", "-qb", "side", "HEAD~1"]);
    git(&side, &["commit", "-q", "--allow-empty", "-m", "side"]);
    git(&side, &["checkout", "-q", "main"]);
    git(&side, &["merge", "-q", "--no-ff", "-m", "merge", "side"]);
    let first = text(&git(&side, &["rev-parse", "HEAD~2"]).stdout);
    let out = bench(&side, &["--chain", "side..main"], &[]);
    let _ = std::fs::remove_dir_all(&side);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        format!(
            "memtrack: error: --chain side..main: side is not on main's first-parent line (its \
             first commit after the range's start has parent {}): name a BASE that main \
             descends from by first parents\n",
            first.trim()
        )
    );
}

/// A build-id directory that cannot be made (a file in its place): the run fails, naming the
/// executable it could not keep and the directory it could not create.
fn a_copy_that_cannot_be_kept_is_an_error() {
    let (_turn, dir) = project();
    let out_dir = tmp().join("unkept");
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::write(out_dir.join(".build-id"), "a file").unwrap();
    let out = bench(
        dir,
        &["--backend", "alloc", "--out", out_dir.to_str().unwrap()],
        &[],
    );
    let _ = std::fs::remove_dir_all(&out_dir);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    let (exe, rest) = last
        .strip_prefix("memtrack: error: cannot keep a copy of ")
        .and_then(|l| l.split_once(": creating "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        Path::new(exe)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("tokenize-"))
            && rest.starts_with(&format!("{}/.build-id/", out_dir.display()))
            && last.ends_with(": Not a directory (os error 20)"),
        "{stderr}"
    );
}

/// `--measure instructions --base HEAD~1`: the second commit makes `tokenize` do more work
/// per token and leaves `render` as it was: exactly tokenize regressed, render's count within
/// 0.01 %, the grown functions name `downstream::tokenize`, exit 1; each side has
/// one result file per benchmark, with identical counts in its two runs; memory's files in
/// `--out` are kept.
fn instructions_base_names_the_regression() {
    let (_turn, dir) = project();
    let out_dir = tmp().join("instructions");
    let args = [
        "--measure",
        "instructions",
        "--runs",
        "2",
        "--base",
        "HEAD~1",
        "--format",
        "json",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    // A memory run's artifact, left where this run writes: an instructions run keeps it.
    let memory = out_dir.join("head").join("earlier.memtrack");
    std::fs::create_dir_all(memory.parent().unwrap()).unwrap();
    std::fs::write(&memory, b"a memory run's").unwrap();
    let out = bench(dir, &args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        memory.exists(),
        "an instructions run removed memory's artifact"
    );
    let j = json(&out);
    let rows = j["rows"].as_array().unwrap();
    let row = |id: &str| {
        rows.iter()
            .find(|r| r["benchmark"] == id)
            .unwrap_or_else(|| panic!("no row {id}: {j}"))
    };
    assert_eq!(rows.len(), 2, "{j}");
    let tokenize = row("tokenize");
    assert_eq!(tokenize["metric"], "instructions");
    assert_eq!(tokenize["verdict"], "regressed", "{j}");
    assert!(
        tokenize["head_per_iteration"].as_f64() > tokenize["base_per_iteration"].as_f64(),
        "{j}"
    );
    assert_eq!(j["metrics"], serde_json::json!(["instructions"]), "{j}");
    assert_eq!(j["regressions"], 1, "{j}");
    let grown: Vec<&str> = j["grown"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["benchmark"] == "tokenize")
        .map(|g| g["function"].as_str().unwrap())
        .collect();
    assert!(grown.contains(&"downstream::tokenize"), "grown: {grown:?}");
    // render's code is the same on both sides; its input (made by each side's tokenize) holds
    // the same strings, allocated otherwise, and the allocator's paths may differ by a few
    // instructions.
    let render = row("render");
    assert!(
        ["unchanged", "within_threshold", "improved"]
            .contains(&render["verdict"].as_str().unwrap()),
        "{j}"
    );
    let (b, h) = (
        render["base_per_iteration"].as_f64().unwrap(),
        render["head_per_iteration"].as_f64().unwrap(),
    );
    assert!((h - b).abs() / b < 1e-4, "render: {b} → {h}");
    for side in ["base", "head"] {
        for id in ["tokenize", "render"] {
            let file = out_dir.join(side).join(format!("{id}.instructions.json"));
            let m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            let runs = m["runs"].as_array().unwrap();
            assert_eq!(runs.len(), 2, "{file:?}");
            assert_eq!(
                runs[0], runs[1],
                "{file:?}: single-threaded, the same in both runs"
            );
            assert_eq!(m["not_gated"], serde_json::Value::Null);
            assert!(
                m["toolchain"]["rustc"]
                    .as_str()
                    .unwrap()
                    .starts_with("rustc ")
            );
        }
    }
}

/// The edit that makes `tokenize` do more work and allocate nothing more: the source scanned
/// twice to size the vector.
const LONGER_LOOP: (&str, &str) = (
    "Vec::with_capacity(words().count())",
    "Vec::with_capacity((0..2).map(|_| words().count()).max().unwrap_or(0))",
);

/// `--measure instructions --chain HEAD~2..HEAD` over base, [`LONGER_LOOP`] and a comment:
/// exit 1, tokenize alone regressed and followed (the commit between counts it only), one
/// step, named by the middle commit, whose grown functions name `downstream::tokenize`; the
/// job summary (markdown) names them too.
fn instructions_chain_names_the_commit() {
    let (_turn, _) = project();
    let dir = tmp().join("ir-chain");
    let _ = std::fs::remove_dir_all(&dir);
    copy_downstream(&dir);
    let mut ids = vec![common::init_repo(&dir, &tmp(), "base")];
    common::edit(&dir, "src/lib.rs", LONGER_LOOP);
    ids.push(common::commit_all(&dir, &tmp(), "tokenize scans twice"));
    let comment = ("//! The code under test", "//! The code under test (same)");
    common::edit(&dir, "src/lib.rs", comment);
    ids.push(common::commit_all(&dir, &tmp(), "a comment"));
    let out_dir = tmp().join("ir-chain-out");
    let _ = std::fs::remove_dir_all(&out_dir);
    let summary = tmp().join("ir-chain-summary.md");
    std::fs::write(&summary, "").unwrap();
    let args = [
        "--measure",
        "instructions",
        "--runs",
        "1",
        "--chain",
        "HEAD~2..HEAD",
        "--format",
        "json",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = bench(&dir, &args, &[("GITHUB_STEP_SUMMARY", &summary)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["regressed"], serde_json::json!(["tokenize"]), "{v:#}");
    let states: Vec<&str> = v["commits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["measured"; 3], "{v:#}");
    let verdicts: Vec<(&str, &str, &str)> = v["comparison"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap();
            (s("benchmark"), s("metric"), s("verdict"))
        })
        .filter(|r| r.2 == "regressed")
        .collect();
    assert_eq!(
        verdicts,
        [("tokenize", "instructions", "regressed")],
        "{v:#}"
    );
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{v:#}");
    let step = &steps[0];
    assert_eq!(step["commit"], ids[1].as_str());
    assert_eq!(step["after"], ids[0].as_str());
    let rows = step["comparison"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{step:#}");
    assert_eq!(
        (&rows[0]["benchmark"], &rows[0]["metric"]),
        (&"tokenize".into(), &"instructions".into())
    );
    assert!(
        rows[0]["head_per_iteration"].as_f64() > rows[0]["base_per_iteration"].as_f64(),
        "{step:#}"
    );
    let grown: Vec<(&str, &str)> = step["comparison"]["grown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["benchmark"].as_str().unwrap(),
                g["function"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        grown.contains(&("tokenize", "downstream::tokenize")),
        "{grown:?}"
    );
    assert!(grown.iter().all(|g| g.0 == "tokenize"), "{grown:?}");
    // The ends counted the whole suite, the commit between the regressed benchmark only.
    for (i, id) in ids.iter().enumerate() {
        let d = out_dir.join(format!("{i:02}-{}", &id[..12]));
        let mut files: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let expected: &[&str] = match i {
            1 => &["tokenize.instructions.json"],
            _ => &["render.instructions.json", "tokenize.instructions.json"],
        };
        assert_eq!(files, expected, "{}", d.display());
    }
    let markdown = std::fs::read_to_string(&summary).unwrap();
    assert!(
        markdown.contains(&format!(
            "At `{}`, functions that grew most (inclusive, per iteration):",
            &ids[1][..12]
        )) && markdown.contains("downstream::tokenize"),
        "{markdown}"
    );
    let worktrees = text(&git(&dir, &["worktree", "list"]).stdout);
    assert_eq!(worktrees.lines().count(), 1, "{worktrees}");
}

/// `--measure memory,instructions --chain HEAD~2..HEAD` over base, [`GROW`] and a comment:
/// tokenize regressed in both measures, and the one step, named by the middle commit, holds
/// both measures' rows for tokenize alone, memory's call sites in `tokenize` and the grown
/// function `downstream::tokenize`; the commit between ran tokenize alone in each measure.
fn both_measures_chain_name_the_commit() {
    let (_turn, _) = project();
    let dir = tmp().join("both-chain");
    let _ = std::fs::remove_dir_all(&dir);
    copy_downstream(&dir);
    let mut ids = vec![common::init_repo(&dir, &tmp(), "base")];
    common::edit(&dir, "src/lib.rs", GROW);
    ids.push(common::commit_all(
        &dir,
        &tmp(),
        "tokenize copies each token",
    ));
    let comment = ("//! The code under test", "//! The code under test (same)");
    common::edit(&dir, "src/lib.rs", comment);
    ids.push(common::commit_all(&dir, &tmp(), "a comment"));
    let out_dir = tmp().join("both-chain-out");
    let _ = std::fs::remove_dir_all(&out_dir);
    let args = [
        "--backend",
        "alloc",
        "--measure",
        "memory,instructions",
        "--runs",
        "1",
        "--chain",
        "HEAD~2..HEAD",
        "--format",
        "json",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = bench(&dir, &args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["regressed"], serde_json::json!(["tokenize"]), "{v:#}");
    assert_eq!(
        v["comparison"]["metrics"],
        serde_json::json!(["allocations", "bytes", "peak", "instructions"]),
        "{v:#}"
    );
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{v:#}");
    let step = &steps[0];
    assert_eq!(
        (&step["commit"], &step["after"]),
        (&ids[1].as_str().into(), &ids[0].as_str().into())
    );
    let c = &step["comparison"];
    let changed: Vec<(&str, &str)> = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] != "unchanged")
        .map(|r| {
            (
                r["benchmark"].as_str().unwrap(),
                r["metric"].as_str().unwrap(),
            )
        })
        .collect();
    for metric in ["allocations", "bytes", "instructions"] {
        assert!(changed.contains(&("tokenize", metric)), "{c:#}");
    }
    assert!(changed.iter().all(|r| r.0 == "tokenize"), "{c:#}");
    let a = c["attribution"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["metric"] == "allocations")
        .unwrap_or_else(|| panic!("no attribution of allocations: {c:#}"));
    assert_eq!(a["delta"], 10 * tokens().len() as i64, "{a:#}");
    let functions = functions(&a["sites"][0]["frames"]);
    assert!(
        functions
            .iter()
            .any(|f| f.starts_with("downstream::tokenize")),
        "{functions:?}"
    );
    let grown: Vec<&str> = c["grown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["function"].as_str().unwrap())
        .collect();
    assert!(grown.contains(&"downstream::tokenize"), "{grown:?}");
    let d = out_dir.join(format!("01-{}", &ids[1][..12]));
    let mut files: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["tokenize.instructions.json", "tokenize.memtrack"],
        "{}",
        d.display()
    );
}

/// Without valgrind on PATH, `--measure instructions` names the package to install, exit 2.
fn instructions_without_valgrind_names_the_package() {
    let (_turn, dir) = project();
    let out_dir = tmp().join("no-valgrind");
    let args = [
        "--measure",
        "instructions",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let empty = tmp().join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let out = bench(dir, &args, &[("PATH", &empty)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("install the package `valgrind`"),
        "{stderr}"
    );
}

fn main() {
    run(vec![
        requires(
            "instructions_base_names_the_regression",
            &[Need::Tool("valgrind")],
            instructions_base_names_the_regression,
        ),
        requires(
            "instructions_chain_names_the_commit",
            &[Need::Tool("valgrind")],
            instructions_chain_names_the_commit,
        ),
        requires(
            "both_measures_chain_name_the_commit",
            &[Need::Tool("valgrind")],
            both_measures_chain_name_the_commit,
        ),
        test(
            "instructions_without_valgrind_names_the_package",
            instructions_without_valgrind_names_the_package,
        ),
        test(
            "report_counts_what_each_routine_allocates",
            report_counts_what_each_routine_allocates,
        ),
        test(
            "base_finds_and_attributes_the_regression",
            base_finds_and_attributes_the_regression,
        ),
        test(
            "a_regression_from_nothing_names_the_function",
            a_regression_from_nothing_names_the_function,
        ),
        test(
            "chain_names_the_commit_of_each_step",
            chain_names_the_commit_of_each_step,
        ),
        test("chain_refuses_a_bad_range", chain_refuses_a_bad_range),
        test(
            "a_copy_that_cannot_be_kept_is_an_error",
            a_copy_that_cannot_be_kept_is_an_error,
        ),
        test(
            "a_suite_on_criterion_itself_is_refused_before_it_is_built",
            a_suite_on_criterion_itself_is_refused_before_it_is_built,
        ),
        test(
            "base_is_refused_without_a_commit",
            base_is_refused_without_a_commit,
        ),
    ])
}
