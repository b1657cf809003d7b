//! `memtrack::callgrind` on callgrind's real output: a program whose call counts follow from its
//! input, compiled here with rustc and run under valgrind, read against those counts and
//! against `callgrind_annotate` (valgrind's own reader of the same file).

use std::path::Path;
use std::process::Command;

use memtrack::callgrind::Profile;
use memtrack_test_support::{Need, requires, run, run_ok};

/// `work(n)` calls `leaf` n times, then itself with n / 2 while n > 10.
const PROGRAM: &str = r#"
#[inline(never)]
fn leaf(x: u64) -> u64 {
    x.wrapping_mul(2654435761).rotate_left(7)
}

#[inline(never)]
fn work(n: u64) -> u64 {
    let mut a = 0;
    for i in 0..std::hint::black_box(n) {
        a ^= leaf(i);
    }
    if n > 10 {
        // black_box: the call stays a call (not a loop the optimiser makes of it).
        a ^= std::hint::black_box(work(n / 2));
    }
    a
}

fn main() {
    let n: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    println!("{}", work(n));
}
"#;

const NEEDS: &[Need] = &[
    Need::Tool("rustc"),
    Need::Tool("valgrind"),
    Need::Tool("callgrind_annotate"),
];

/// The inputs `work` is called with, from `n`: n, n / 2, … while the caller's n > 10.
fn work_inputs(n: u64) -> Vec<u64> {
    let mut out = vec![n];
    while *out.last().unwrap() > 10 {
        out.push(out.last().unwrap() / 2);
    }
    out
}

/// The program built in `dir`, optimised, with line tables.
fn build(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("work.rs");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("work");
    run_ok(
        Command::new("rustc")
            .args(["-O", "-C", "debuginfo=1", "-o"])
            .arg(&exe)
            .arg(&src),
    );
    exe
}

/// Its callgrind output for input `n`, as callgrind writes it with names left mangled.
fn profile(dir: &Path, exe: &Path, n: u64) -> std::path::PathBuf {
    let out = dir.join(format!("callgrind.out.{n}"));
    run_ok(
        Command::new("valgrind")
            .args(["--tool=callgrind", "--demangle=no"])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(exe)
            .arg(n.to_string()),
    );
    out
}

/// What `callgrind_annotate` says of `file`: its program total, and per mangled function name
/// containing `part`, its self cost (summed over the source files it lists it under) and its
/// inclusive cost (the largest of its lines with `--inclusive=yes`).
fn annotate(file: &Path, part: &str) -> (u64, u64, u64) {
    let read = |inclusive: &str| {
        let out = run_ok(
            Command::new("callgrind_annotate")
                .arg(format!("--inclusive={inclusive}"))
                .args(["--threshold=100", "--auto=no"])
                .arg(file),
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let count = |line: &str| -> u64 {
        line.split_whitespace()
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap()
    };
    let of = |text: &str| -> Vec<u64> {
        text.lines()
            .filter(|l| l.contains(&format!(":{part}")) && !l.contains("=>"))
            .map(count)
            .collect()
    };
    let plain = read("no");
    let total = plain
        .lines()
        .find(|l| l.contains("PROGRAM TOTALS"))
        .map(count)
        .unwrap();
    let own: u64 = of(&plain).iter().sum();
    let inclusive = of(&read("yes")).into_iter().max().unwrap();
    (total, own, inclusive)
}

/// Call counts as the program makes them; self and inclusive costs as callgrind_annotate
/// reads them; the total as the file states it.
fn counts_match_the_program_and_callgrind_annotate() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path());
    let n = 1000;
    let file = profile(dir.path(), &exe, n);
    let p = Profile::read(&file).unwrap();
    assert_eq!(p.events, ["Ir"]);
    let inputs = work_inputs(n);
    let work = p.function("work::work").expect("work in the profile");
    let leaf = p.function("work::leaf").expect("leaf in the profile");
    assert_eq!(work.calls, inputs.len() as u64);
    assert_eq!(leaf.calls, inputs.iter().sum::<u64>());
    // leaf calls nothing; work's inclusive cost is its own and leaf's (its calls of itself
    // are inside its own cost lines).
    assert_eq!(leaf.inclusive, leaf.self_cost);
    assert_eq!(work.inclusive[0], work.self_cost[0] + leaf.inclusive[0]);

    let (total, own, inclusive) = annotate(&file, &work_symbol(&file, "4work4work"));
    assert_eq!(p.totals, [total]);
    assert_eq!((work.self_cost[0], work.inclusive[0]), (own, inclusive));
    let (_, own, inclusive) = annotate(&file, &work_symbol(&file, "4work4leaf"));
    assert_eq!((leaf.self_cost[0], leaf.inclusive[0]), (own, inclusive));
}

/// The mangled name the file gives the function whose mangled name holds `part` (the crate is
/// `work` too: `4work4work` is its function `work`).
fn work_symbol(file: &Path, part: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let line = text
        .lines()
        .find(|l| (l.starts_with("fn=") || l.starts_with("cfn=")) && l.contains(part))
        .unwrap_or_else(|| panic!("no function with {part} in {}", file.display()));
    line.rsplit(' ').next().unwrap().to_string()
}

/// Differenced at two inputs, `leaf`'s cost per call is a whole number of instructions, the
/// same at every size: what counting per iteration relies on.
fn cost_per_call_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path());
    let at = |n: u64| {
        let p = Profile::read(&profile(dir.path(), &exe, n)).unwrap();
        let leaf = p.function("work::leaf").unwrap();
        (leaf.calls, leaf.self_cost[0])
    };
    let (a, b, c) = (at(1000), at(2000), at(4000));
    let per_call = (b.1 - a.1) / (b.0 - a.0);
    assert_eq!((b.1 - a.1) % (b.0 - a.0), 0, "{a:?} {b:?}");
    assert_eq!(c.1 - b.1, per_call * (c.0 - b.0), "{a:?} {b:?} {c:?}");
    assert_eq!(a.1, per_call * a.0, "every call of leaf costs the same");
}

fn main() {
    run(vec![
        requires(
            "counts_match_the_program_and_callgrind_annotate",
            NEEDS,
            counts_match_the_program_and_callgrind_annotate,
        ),
        requires("cost_per_call_is_exact", NEEDS, cost_per_call_is_exact),
    ])
}
