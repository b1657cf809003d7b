//! The CLI tests' view of the workspace's one test-support crate (`memtrack-test-support`),
//! plus the two helpers that must expand in the package that builds the `memtrack` binary
//! (`CARGO_BIN_EXE_memtrack` is set only for that package's integration tests).

#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use memtrack_test_support::{alloc_free_pairs, s, text, write};

/// Runs the `memtrack` binary with `args`.
pub fn memtrack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memtrack"))
        .args(args)
        .output()
        .expect("run memtrack")
}

/// Runs `memtrack synth` with `events` events, seed `seed`, 3 threads, into `path`.
pub fn synth(path: &Path, events: u64, seed: u64) -> PathBuf {
    let out = memtrack(&[
        "synth",
        "--events",
        &events.to_string(),
        "--seed",
        &seed.to_string(),
        "--threads",
        "3",
        "-o",
        s(path),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    path.to_path_buf()
}

/// An SVG parsed as XML (inferno's flame graphs carry flamegraph.pl's DOCTYPE).
pub fn svg_doc(body: &str) -> roxmltree::Document<'_> {
    let opt = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    roxmltree::Document::parse_with_options(body, opt).expect("well-formed SVG")
}

/// Runs `git args` in `dir` as a throwaway identity, and fails the test if it fails. It never
/// finds a repository at or above `ceiling`: the tests' repositories live in the target
/// directory, inside the workspace's own, and a missing `.git` must fail, not find that one.
pub fn git(dir: &Path, ceiling: &Path, args: &[&str]) -> Output {
    memtrack_test_support::run_ok(
        Command::new("git")
            .current_dir(dir)
            .env("GIT_CEILING_DIRECTORIES", ceiling)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args),
    )
}

/// Makes `dir`, which holds a project's files, a git repository of one commit of them all
/// (`message`), as [`git`] does: its id.
pub fn init_repo(dir: &Path, ceiling: &Path, message: &str) -> String {
    git(dir, ceiling, &["init", "-q"]);
    git(dir, ceiling, &["add", "."]);
    git(dir, ceiling, &["commit", "-qm", message]);
    head(dir, ceiling)
}

/// Commits every change to the tracked files of the repository at `dir` (`message`): the new
/// commit's id.
pub fn commit_all(dir: &Path, ceiling: &Path, message: &str) -> String {
    git(dir, ceiling, &["commit", "-qam", message]);
    head(dir, ceiling)
}

/// The id of the commit checked out in the repository at `dir`.
pub fn head(dir: &Path, ceiling: &Path) -> String {
    let out = git(dir, ceiling, &["rev-parse", "HEAD"]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// examples/downstream (a user's project on memtrack-criterion) copied to `dir`, replacing
/// what was there, its memtrack-criterion dependency made absolute and its `target/` ignored
/// by git.
pub fn copy_downstream(dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/downstream");
    let _ = std::fs::remove_dir_all(dir);
    for f in [
        "Cargo.toml",
        "Cargo.lock",
        "src/lib.rs",
        "benches/tokenize.rs",
        ".cargo/config.toml",
    ] {
        let to = dir.join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let mut body = std::fs::read_to_string(src.join(f)).unwrap();
        if f == "Cargo.toml" {
            let crit = src.join("../../memtrack-criterion").canonicalize().unwrap();
            body = body.replace("\"../../memtrack-criterion\"", &format!("{crit:?}"));
        }
        std::fs::write(&to, body).unwrap();
    }
    std::fs::write(dir.join(".gitignore"), "/target\n").unwrap();
}

/// Replaces `what.0` with `what.1` in `file` of `dir` (which must hold it).
pub fn edit(dir: &Path, file: &str, what: (&str, &str)) {
    let path = dir.join(file);
    let body = std::fs::read_to_string(&path).unwrap();
    assert!(body.contains(what.0), "{file} holds no {:?}", what.0);
    std::fs::write(&path, body.replacen(what.0, what.1, 1)).unwrap();
}

/// `memtrack bench` in `dir`, builds in `target`, kept from what the environment could change:
/// no RUSTFLAGS, job summary, criterion or memtrack directory of the caller's.
pub fn bench_command(dir: &Path, target: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memtrack"));
    cmd.current_dir(dir).arg("bench");
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "GITHUB_STEP_SUMMARY",
        "CRITERION_HOME",
        "MEMTRACK_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("CARGO_TARGET_DIR", target);
    cmd
}

/// The cheap `cargo bench` arguments of the downstream suite in `dir`: the dev profile, its
/// one benchmark target, the lock file as it is, offline when that resolves without the
/// network.
pub fn cheap_cargo_args(dir: &Path) -> Vec<String> {
    let offline = Command::new(env!("CARGO"))
        .current_dir(dir)
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut args: Vec<String> = ["--profile", "dev", "--bench", "tokenize", "--locked"]
        .map(String::from)
        .into();
    if offline {
        args.push("--offline".into());
    }
    args
}

/// The host's target triple (`rustc -vV`): with `--target`, RUSTFLAGS apply to the suite's
/// crates only, so builds with different flags share their build scripts and proc macros.
pub fn host() -> String {
    let out = memtrack_test_support::run_ok(Command::new("rustc").arg("-vV"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap()
        .to_string()
}
