//! `memtrack bench` against bad input and faults, in milliseconds: a stand-in for cargo
//! (`memtrack bench` runs `$CARGO`) plays the suite by copying artifacts made here into
//! `$MEMTRACK_DIR`, as the suite's bench binaries would. Each commit of a test repository
//! lists in `benches.txt` the artifacts its suite records (`SOURCE NAME` a line); the stand-in
//! logs where it ran and with which flags, and does what `$FAKE_HOOK` says (delete a
//! worktree's `.git`, wait, kill memtrack) to stage a fault. What these tests assert is what
//! `memtrack bench` must do around the suite: never touch the user's repository, worktrees or
//! files, never lose a side, never pass a gate that compared nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use memtrack_test_support::{Need, alloc_free_pairs, requires, run, test, write};

/// The stand-in: `cargo metadata` names the target directory and the packages
/// `packages.json` lists (where it runs; `null`, which tells nothing, without one); `cargo
/// bench` copies the artifacts `benches.txt` lists into `$MEMTRACK_DIR` (relative to where it
/// runs, as a bench binary would resolve it).
const STAND_IN: &str = r#"#!/bin/sh
while [ "$1" = --config ]; do shift 2; done
case "$1" in
metadata) printf '{"target_directory":"%s","packages":%s}\n' "$FAKE_TARGET" \
    "$(cat packages.json 2>/dev/null || echo null)"; exit 0 ;;
bench) ;;
*) echo "stand-in cargo: unexpected $*" >&2; exit 101 ;;
esac
[ -n "$FAKE_LOG" ] && printf '%s\t%s\t%s\n' "$(pwd -P)" "$RUSTFLAGS" "$*" >> "$FAKE_LOG"
[ -n "$FAKE_HOOK" ] && eval "$FAKE_HOOK"
mkdir -p "$MEMTRACK_DIR" || exit 101
[ -f benches.txt ] || exit 0
while read -r src name; do
  [ -n "$src" ] && { cp "$FAKE_ARTIFACTS/$src" "$MEMTRACK_DIR/$name.memtrack" || exit 101; }
done < benches.txt
"#;

/// A scratch directory with a user's repository, a target directory inside it (cargo's
/// default), the artifacts the stand-in copies and the stand-in itself.
struct Project {
    tmp: tempfile::TempDir,
}

impl Project {
    /// A repository whose commits record, in turn, what each of `commits` lists: `(benchmark,
    /// allocations)` pairs, each an artifact of that many 8-byte allocations.
    fn new(commits: &[&[(&str, u64)]]) -> Project {
        let p = Project {
            tmp: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(p.repo()).unwrap();
        std::fs::create_dir_all(p.artifacts()).unwrap();
        let cargo = p.tmp.path().join("cargo");
        std::fs::write(&cargo, STAND_IN).unwrap();
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.git(&["init", "-q"]);
        std::fs::write(p.repo().join(".gitignore"), "/target\n").unwrap();
        std::fs::write(p.repo().join("notes.txt"), "the user's file\n").unwrap();
        for (i, benches) in commits.iter().enumerate() {
            p.record(benches);
            p.git(&["add", "."]);
            p.git(&[
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                &format!("commit {i}"),
            ]);
        }
        p
    }

    /// Makes `benches.txt` list `benches`, each with its artifact.
    fn record(&self, benches: &[(&str, u64)]) {
        let mut list = String::new();
        for &(name, n) in benches {
            let file = format!("{name}-{n}.memtrack");
            let path = self.artifacts().join(&file);
            if !path.exists() {
                write(&path, Some(name), &alloc_free_pairs(n, 8), 0);
            }
            list.push_str(&format!("{file} {name}\n"));
        }
        std::fs::write(self.repo().join("benches.txt"), list).unwrap();
    }

    fn repo(&self) -> PathBuf {
        self.tmp.path().join("repo")
    }

    fn target(&self) -> PathBuf {
        self.repo().join("target")
    }

    fn artifacts(&self) -> PathBuf {
        self.tmp.path().join("artifacts")
    }

    fn log(&self) -> PathBuf {
        self.tmp.path().join("cargo.log")
    }

    /// `git ARGS` in the repository: its standard output, trimmed.
    fn git(&self, args: &[&str]) -> String {
        git(&self.repo(), self.tmp.path(), args)
    }

    /// `memtrack bench ARGS --` in `dir`, the stand-in as cargo, with `env`.
    fn bench_in(&self, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(dir, args, env).output().expect("run memtrack")
    }

    fn bench(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.bench_in(&self.repo(), args, env)
    }

    fn command(&self, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memtrack"));
        cmd.current_dir(dir)
            .arg("bench")
            .args(["--backend", "alloc"])
            .args(args)
            .arg("--");
        for var in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "GITHUB_STEP_SUMMARY",
            "MEMTRACK_DIR",
            "FAKE_HOOK",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("CARGO", self.tmp.path().join("cargo"))
            .env("CARGO_TARGET_DIR", self.target())
            .env("FAKE_TARGET", self.target())
            .env("FAKE_ARTIFACTS", self.artifacts())
            .env("FAKE_LOG", self.log())
            .env("GIT_CEILING_DIRECTORIES", self.tmp.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// The directories the stand-in ran in, in order.
    fn ran_in(&self) -> Vec<PathBuf> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(|l| PathBuf::from(l.split('\t').next().unwrap()))
            .collect()
    }
}

/// `git args` in `dir` (a repository in `ceiling`), its stdout trimmed.
fn git(dir: &Path, ceiling: &Path, args: &[&str]) -> String {
    let out = common::git(dir, ceiling, args);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `*.memtrack` files in `dir`, by name.
fn artifacts_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".memtrack"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The state of the user's checkout that memtrack must leave as it found it.
#[derive(Debug, PartialEq)]
struct UserState {
    head: String,
    branch: String,
    status: String,
    notes: String,
    worktrees: String,
    stash: String,
}

fn user_state(p: &Project) -> UserState {
    UserState {
        head: p.git(&["rev-parse", "HEAD"]),
        branch: p.git(&["symbolic-ref", "-q", "HEAD"]),
        status: p.git(&["status", "--porcelain"]),
        notes: std::fs::read_to_string(p.repo().join("notes.txt")).unwrap(),
        worktrees: p.git(&["worktree", "list", "--porcelain"]),
        stash: p.git(&["stash", "list", "--format=%H %s"]),
    }
}

/// The chain of three commits most tests use: `grow` doubles from the first to the last.
fn three_commits() -> Project {
    Project::new(&[
        &[("grow", 10), ("flat", 5)],
        &[("grow", 15), ("flat", 5)],
        &[("grow", 20), ("flat", 5)],
    ])
}

/// A suite step that deletes the worktree's `.git` file (a `cargo clean`, a build step):
/// the next `git checkout --force` must not find the user's repository by walking up.
fn chain_never_checks_out_the_users_repository() {
    let p = three_commits();
    std::fs::write(p.repo().join("notes.txt"), "an uncommitted edit\n").unwrap();
    let before = user_state(&p);
    let repo = p.repo().canonicalize().unwrap();
    let hook = format!(
        "case \"$(pwd -P)\" in {}) ;; *) rm -f .git ;; esac",
        repo.display()
    );
    let out = p.bench(
        &["--chain", "HEAD~2..HEAD", "--format", "json"],
        &[("FAKE_HOOK", &hook)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(user_state(&p), before);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<&str> = v["commits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["measured", "measured", "measured"], "{v:#}");
    // Every commit ran outside the user's checkout.
    let ran = p.ran_in();
    assert_eq!(ran.len(), 3, "{ran:?}");
    assert!(ran.iter().all(|d| !d.starts_with(&repo)), "{ran:?}");
}

/// A worktree of the user's whose folder is away (a moved folder, an unmounted drive) keeps
/// its git directory: memtrack removes its own worktree only, never prunes the repository.
fn base_removes_only_its_own_worktree() {
    let p = three_commits();
    let away = p.tmp.path().join("away");
    p.git(&["worktree", "add", "-q", away.to_str().unwrap(), "HEAD~1"]);
    std::fs::write(away.join("staged.txt"), "staged\n").unwrap();
    git(&away, p.tmp.path(), &["add", "staged.txt"]);
    std::fs::rename(&away, p.tmp.path().join("moved")).unwrap();
    let admin = p.repo().join(".git/worktrees/away");
    assert!(admin.join("index").is_file());
    let before = user_state(&p);
    let out = p.bench(&["--base", "HEAD~2"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(admin.join("index").is_file(), "{}", stderr(&out));
    assert_eq!(user_state(&p), before);
}

/// `--out results --base REF` from the user's directory: both sides land in
/// `results/base` and `results/head` there, whichever directory the suite ran in.
fn a_relative_out_keeps_both_sides() {
    let p = three_commits();
    let out = p.bench(&["--out", "results", "--base", "HEAD~2"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    for side in ["base", "head"] {
        assert_eq!(
            artifacts_in(&p.repo().join("results").join(side)),
            ["flat.memtrack", "grow.memtrack"],
            "{side}: {}",
            stderr(&out)
        );
    }
}

/// A second run while one runs with the same target directory: refused at once, naming the
/// lock; the first goes on and measures its own commit.
fn a_second_run_is_refused_while_one_runs() {
    let p = three_commits();
    let gate = p.tmp.path().join("go");
    let hook = format!(
        "touch {0}.started; while [ ! -e {0} ]; do sleep 0.01; done",
        gate.display()
    );
    let first = p
        .command(&p.repo(), &["--base", "HEAD~2"], &[("FAKE_HOOK", &hook)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = p.tmp.path().join("go.started");
    let t0 = std::time::Instant::now();
    while !started.exists() {
        assert!(t0.elapsed().as_secs() < 60, "the first run never started");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = p.bench(&["--base", "HEAD~1"], &[]);
    std::fs::write(&gate, "").unwrap();
    let first = first.wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    let lock = p.target().join("memtrack-bench.lock");
    assert_eq!(
        stderr(&second),
        format!(
            "memtrack: error: another `memtrack bench` is running with the target directory {} \
             (it holds {}): wait for it to end, or give this run a CARGO_TARGET_DIR of its own\n",
            p.target().display(),
            lock.display()
        )
    );
    // The first compared HEAD~2 with HEAD: grow from 10 to 20 allocations.
    assert_eq!(first.status.code(), Some(1), "{}", stderr(&first));
    assert!(stdout(&first).contains("grow"), "{}", stdout(&first));
}

/// A base whose benchmarks were all renamed: exit 2, naming what each side holds.
fn a_renamed_base_compares_nothing_and_is_refused() {
    let p = Project::new(&[&[("old_name", 10)], &[("new_name", 10)]]);
    let out = p.bench(&["--base", "HEAD~1"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let results = p.target().join("memtrack/bench");
    assert_eq!(
        stderr(&out),
        format!(
            "memtrack: error: nothing to compare: no benchmark is on both sides (base {}: \
             \"old_name\"; head {}: \"new_name\"); compare recordings of the same benchmarks\n",
            results.join("base").display(),
            results.join("head").display()
        )
    );
}

/// A base, or the first commit of a chain, whose suite is on criterion itself (its one package
/// depends on `criterion`): refused before its suite is built or run, naming the side and the
/// fix; `cargo bench` ran nowhere, not even in the head.
fn a_base_on_criterion_itself_is_refused_before_it_runs() {
    let p = Project::new(&[]);
    let package =
        |dep: &str| format!(r#"[{{"name":"suite","dependencies":[{{"name":"{dep}"}}]}}]"#);
    for (dep, grow) in [("criterion", 10), ("memtrack-criterion", 20)] {
        std::fs::write(p.repo().join("packages.json"), package(dep)).unwrap();
        p.record(&[("grow", grow)]);
        p.git(&["add", "."]);
        p.git(&["commit", "-qm", dep]);
    }
    let base = p.git(&["rev-parse", "HEAD~1"]);
    let fix = "is not on memtrack-criterion, so it has no memory mode: compare from a commit \
               whose criterion line points at it (`criterion = { package = \"memtrack-criterion\", \
               … }`)";
    let out = p.bench(&["--base", "HEAD~1"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "memtrack: error: the suite (base HEAD~1, {}) {fix}\n",
            &base[..12]
        )
    );
    // Refused before the head ran, too.
    assert!(p.ran_in().is_empty(), "{:?}", p.ran_in());
    let out = p.bench(&["--chain", "HEAD~1..HEAD"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).ends_with(&format!(
            "memtrack: error: the suite (commit {}) {fix}\n",
            &base[..12]
        )),
        "{}",
        stderr(&out)
    );
    assert!(p.ran_in().is_empty(), "{:?}", p.ran_in());
    assert_eq!(p.git(&["worktree", "list"]).lines().count(), 1);
}

/// A `$GITHUB_STEP_SUMMARY` that cannot be written: the table is printed, the regression's
/// exit 1 kept, and a warning says the summary lacks it.
fn an_unwritable_step_summary_keeps_the_result() {
    let p = three_commits();
    let summary = p.tmp.path().join("no-such-dir/summary.md");
    let out = p.bench(
        &["--base", "HEAD~2"],
        &[("GITHUB_STEP_SUMMARY", summary.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("grow"), "{}", stdout(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "memtrack: warning: cannot append to $GITHUB_STEP_SUMMARY ({}): No such file or \
             directory (os error 2); the job summary lacks this result",
            summary.display()
        )
    );
}

/// The base's suite runs outside the head's tree: neither cargo nor git, walking up from it,
/// reaches the head's manifest, `.cargo/config.toml` or repository.
fn the_base_runs_outside_the_heads_tree() {
    let p = three_commits();
    let out = p.bench(&["--base", "HEAD~1"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let repo = p.repo().canonicalize().unwrap();
    let ran = p.ran_in();
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert_eq!(ran[0], repo);
    assert!(!ran[1].starts_with(&repo), "{ran:?}");
    // And is gone afterwards, with its entry in the user's repository.
    assert!(!ran[1].exists(), "{}", ran[1].display());
    assert_eq!(p.git(&["worktree", "list"]).lines().count(), 1);
}

/// A commit between the chain's ends whose suite records nothing: listed as not measured, and
/// the chain goes on to name the step.
fn a_commit_that_records_nothing_is_passed_over() {
    let p = Project::new(&[&[("grow", 10)], &[("grow", 10)], &[], &[("grow", 20)]]);
    let out = p.bench(&["--chain", "HEAD~3..HEAD", "--format", "json"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<&str> = v["commits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["measured", "measured", "failed", "measured"],
        "{v:#}"
    );
    assert!(
        v["commits"][2]["error"]
            .as_str()
            .unwrap()
            .starts_with("its suite recorded no benchmark in "),
        "{v:#}"
    );
    let ids: Vec<String> = p
        .git(&["log", "--reverse", "--format=%H"])
        .lines()
        .map(String::from)
        .collect();
    let steps: Vec<(&str, &str)> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["commit"].as_str().unwrap(), s["after"].as_str().unwrap()))
        .collect();
    assert_eq!(steps, [(ids[3].as_str(), ids[1].as_str())]);
}

/// A second `--chain` into the same `--out` leaves no directory of the first range: a
/// commit's directory it does not reuse is emptied and removed.
fn a_chain_clears_an_earlier_ranges_directories() {
    let p = three_commits();
    let out_dir = p.tmp.path().join("chain");
    let args = [
        "--chain",
        "HEAD~2..HEAD",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = p.bench(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    p.record(&[("grow", 30), ("flat", 5)]);
    p.git(&["commit", "-qam", "grow more"]);
    let args = [
        "--chain",
        "HEAD~1..HEAD",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = p.bench(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let ids: Vec<String> = p
        .git(&["log", "-2", "--reverse", "--format=%h", "--abbrev=12"])
        .lines()
        .map(String::from)
        .collect();
    let mut left: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [format!("00-{}", ids[0]), format!("01-{}", ids[1])]);
}

/// A run killed while the base's suite runs leaves the user's checkout as it was (its tree,
/// branch and stash); the next run removes the worktree it left, and its entry in the
/// repository.
fn an_interrupted_run_is_cleaned_up_by_the_next() {
    let p = three_commits();
    std::fs::write(p.repo().join("notes.txt"), "stashed\n").unwrap();
    p.git(&["stash", "-q"]);
    std::fs::write(p.repo().join("notes.txt"), "an uncommitted edit\n").unwrap();
    let before = user_state(&p);
    assert_eq!(before.stash.lines().count(), 1);
    let repo = p.repo().canonicalize().unwrap();
    let hook = format!(
        "case \"$(pwd -P)\" in {}) ;; *) kill -KILL $PPID; exit 1 ;; esac",
        repo.display()
    );
    let out = p.bench(&["--base", "HEAD~1"], &[("FAKE_HOOK", &hook)]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9)
    );
    let left = p.ran_in()[1].clone();
    assert!(left.is_dir());
    assert_eq!(p.git(&["worktree", "list"]).lines().count(), 2);
    let out = p.bench(&["--base", "HEAD~1"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!left.exists(), "{}", left.display());
    assert!(!left.parent().unwrap().exists(), "{}", left.display());
    assert_eq!(user_state(&p), before);
}

/// `--out` naming a file: refused before anything runs, saying so.
fn an_out_that_is_a_file_is_refused() {
    let p = three_commits();
    let file = p.tmp.path().join("results");
    std::fs::write(&file, "mine\n").unwrap();
    let out = p.bench(&["--out", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "memtrack: error: --out {}: it is a file, and bench writes a directory of \
             artifacts: name a directory\n",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine\n");
    assert!(p.ran_in().is_empty());
}

/// An empty `CARGO_TARGET_DIR` is unset, as cargo takes it: the target directory is cargo's
/// (`cargo metadata`'s), not the source tree.
fn an_empty_target_dir_is_unset() {
    let p = three_commits();
    let out = p.bench(&[], &[("CARGO_TARGET_DIR", "")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        artifacts_in(&p.target().join("memtrack/bench")),
        ["flat.memtrack", "grow.memtrack"]
    );
    assert!(!p.repo().join("memtrack").exists());
}

/// As root, an `--out` that is another user's symbolic link (planted in a shared directory)
/// is refused: what it leads to keeps its artifacts and build-id directory.
fn another_users_link_in_out_is_refused() {
    let p = three_commits();
    let victim = p.tmp.path().join("victim");
    std::fs::create_dir_all(victim.join(".build-id/ab")).unwrap();
    std::fs::write(victim.join("precious.memtrack"), "keep me").unwrap();
    std::fs::write(victim.join(".build-id/ab/cd"), "keep me").unwrap();
    let link = p.tmp.path().join("out");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    let out = p.bench(&["--out", link.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "memtrack: error: refusing to write {}: it is a symbolic link owned by uid 65534, \
             neither you nor root, and memtrack does not follow such links (another user may \
             have planted it to choose which file is replaced); remove it, or name the file it \
             points to\n",
            link.display()
        )
    );
    assert!(victim.join("precious.memtrack").is_file());
    assert!(victim.join(".build-id/ab/cd").is_file());
    // Nor is the build-id directory inside a trusted `--out` followed when it is such a link.
    let out_dir = p.tmp.path().join("mine");
    std::fs::create_dir_all(&out_dir).unwrap();
    let planted = out_dir.join(".build-id");
    std::os::unix::fs::symlink(victim.join(".build-id"), &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let out = p.bench(&["--out", out_dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(victim.join(".build-id/ab/cd").is_file());
}

/// A crate whose bench records (copies `$FAKE_ARTIFACT` into `$MEMTRACK_DIR`) only when built
/// with both memory mode's cfg (the allocator recorder's) and the `user_flag` cfg its
/// `.cargo/config.toml` sets.
const FLAGGED: &str = r#"fn main() {
    if cfg!(all(user_flag, memtrack_bench = "alloc")) {
        let dir = std::path::PathBuf::from(std::env::var_os("MEMTRACK_DIR").unwrap());
        std::fs::copy(std::env::var_os("FAKE_ARTIFACT").unwrap(), dir.join("b.memtrack")).unwrap();
    }
}
"#;

/// In memory mode the rustflags of the suite's `.cargo/config.toml` stay, whether in
/// `[build]` or in a `[target]` table (which cargo then reads instead): built by cargo itself.
fn configured_rustflags_are_kept_in_memory_mode() {
    let p = Project::new(&[&[("b", 3)]]);
    let krate = p.tmp.path().join("flagged");
    std::fs::create_dir_all(krate.join("benches")).unwrap();
    std::fs::create_dir_all(krate.join(".cargo")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"flagged\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [[bench]]\nname = \"b\"\nharness = false\n\n[lints.rust]\nunexpected_cfgs = \"allow\"\n",
    )
    .unwrap();
    std::fs::write(krate.join("benches/b.rs"), FLAGGED).unwrap();
    // On memtrack-criterion, as `memtrack bench` requires, without building it: the bench
    // plays the suite.
    let criterion = Path::new(env!("CARGO_MANIFEST_DIR")).join("../memtrack-criterion");
    let manifest = krate.join("Cargo.toml");
    let body = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        format!(
            "{body}\n[dependencies]\nmemtrack-criterion = {{ path = {:?}, optional = true }}\n",
            criterion.canonicalize().unwrap()
        ),
    )
    .unwrap();
    let artifact = p.artifacts().join("b-3.memtrack");
    for table in ["[build]", "[target.'cfg(all())']"] {
        std::fs::write(
            krate.join(".cargo/config.toml"),
            format!("{table}\nrustflags = [\"--cfg\", \"user_flag\"]\n"),
        )
        .unwrap();
        let mut cmd = p.command(&krate, &["--format", "json"], &[]);
        // A filter for the bench binary after `--`, as criterion's.
        cmd.args(["--offline", "--", "--bench"])
            .env("CARGO", env!("CARGO"))
            .env("CARGO_TARGET_DIR", p.tmp.path().join("flagged-target"))
            .env("FAKE_ARTIFACT", &artifact)
            .env_remove("CARGO_BUILD_RUSTFLAGS");
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{table}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["benchmarks"][0]["benchmark"], "b", "{table}: {v:#}");
    }
}

fn main() {
    run(vec![
        test(
            "configured_rustflags_are_kept_in_memory_mode",
            configured_rustflags_are_kept_in_memory_mode,
        ),
        test(
            "chain_never_checks_out_the_users_repository",
            chain_never_checks_out_the_users_repository,
        ),
        test(
            "base_removes_only_its_own_worktree",
            base_removes_only_its_own_worktree,
        ),
        test(
            "a_relative_out_keeps_both_sides",
            a_relative_out_keeps_both_sides,
        ),
        test(
            "a_second_run_is_refused_while_one_runs",
            a_second_run_is_refused_while_one_runs,
        ),
        test(
            "a_renamed_base_compares_nothing_and_is_refused",
            a_renamed_base_compares_nothing_and_is_refused,
        ),
        test(
            "a_base_on_criterion_itself_is_refused_before_it_runs",
            a_base_on_criterion_itself_is_refused_before_it_runs,
        ),
        test(
            "an_unwritable_step_summary_keeps_the_result",
            an_unwritable_step_summary_keeps_the_result,
        ),
        test(
            "the_base_runs_outside_the_heads_tree",
            the_base_runs_outside_the_heads_tree,
        ),
        test(
            "a_commit_that_records_nothing_is_passed_over",
            a_commit_that_records_nothing_is_passed_over,
        ),
        test(
            "a_chain_clears_an_earlier_ranges_directories",
            a_chain_clears_an_earlier_ranges_directories,
        ),
        test(
            "an_interrupted_run_is_cleaned_up_by_the_next",
            an_interrupted_run_is_cleaned_up_by_the_next,
        ),
        test(
            "an_out_that_is_a_file_is_refused",
            an_out_that_is_a_file_is_refused,
        ),
        test("an_empty_target_dir_is_unset", an_empty_target_dir_is_unset),
        requires(
            "another_users_link_in_out_is_refused",
            &[Need::Root],
            another_users_link_in_out_is_refused,
        ),
    ])
}
