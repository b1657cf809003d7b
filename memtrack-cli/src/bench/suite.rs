//! Running the user's criterion suite in memory mode: its target directory, `cargo bench` with
//! memtrack-criterion's cfg, and the git worktree of `--base`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use memtrack::artifact::{Output as OutputFile, Reader};

/// The recorder the suite is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorder {
    /// `--cfg memtrack_bench`: the eBPF tracker.
    Ebpf,
    /// `--cfg memtrack_bench="alloc"`: the allocator recorder as the global allocator.
    Alloc,
}

impl Recorder {
    /// The `--cfg` memtrack-criterion reads.
    fn cfg(self) -> &'static str {
        match self {
            Recorder::Ebpf => "memtrack_bench",
            Recorder::Alloc => "memtrack_bench=\"alloc\"",
        }
    }

    /// `MEMTRACK_BACKEND`'s value for it.
    fn name(self) -> &'static str {
        match self {
            Recorder::Ebpf => "ebpf",
            Recorder::Alloc => "alloc",
        }
    }
}

/// How to run the suite: `cargo bench ARGS` in a target directory of memory mode's own.
pub(crate) struct Suite {
    pub recorder: Recorder,
    pub args: Vec<OsString>,
    /// `<the user's target dir>/memtrack-bench`, or `memtrack-bench-base` for the worktree's
    /// builds (`--base`, `--chain`).
    pub target: PathBuf,
    /// Only these benchmark ids (`MEMTRACK_BENCHMARKS`, which memtrack-criterion reads), or all.
    pub only: Option<Vec<String>>,
}

/// The cargo that runs memtrack (`$CARGO` under cargo), else the one on the PATH.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cmd`'s program and arguments as a shell would show them, for messages.
fn shown(cmd: &Command) -> String {
    let mut words = vec![cmd.get_program().to_string_lossy().into_owned()];
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Runs `cmd` to the end, its output captured: an error naming it if it cannot start or fails.
fn output(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", shown(cmd)))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "`{}` failed ({}): {}",
            shown(cmd),
            out.status,
            err.trim()
        ));
    }
    Ok(out)
}

/// The user's target directory: `$CARGO_TARGET_DIR`, else cargo's (`cargo metadata`) for the
/// package in `dir`.
pub(crate) fn target_dir(dir: &Path) -> Result<PathBuf, String> {
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(dir.join(t));
    }
    let mut cmd = cargo();
    cmd.current_dir(dir)
        .args(["metadata", "--format-version", "1", "--no-deps"]);
    let out = output(&mut cmd)?;
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`{}` printed no JSON: {e}", shown(&cmd)))?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| format!("`{}` named no target_directory", shown(&cmd)))
}

impl Suite {
    /// Runs `cargo bench` in `dir`, the artifacts written to `out`. Cargo's standard output
    /// (criterion's own table) goes to stderr with cargo's messages, so that memtrack's
    /// standard output is its table or JSON only. `what` names the side for messages.
    pub(crate) fn run(&self, dir: &Path, out: &Path, what: &str) -> Result<(), String> {
        let mut cmd = cargo();
        cmd.current_dir(dir).arg("bench").args(&self.args);
        let ours = [
            "--cfg",
            self.recorder.cfg(),
            "-C",
            "force-frame-pointers=yes",
        ];
        // The user's flags are kept; CARGO_ENCODED_RUSTFLAGS, when set, wins over RUSTFLAGS.
        if let Some(enc) = std::env::var_os("CARGO_ENCODED_RUSTFLAGS") {
            let mut flags = enc;
            for f in ours {
                if !flags.is_empty() {
                    flags.push("\u{1f}");
                }
                flags.push(f);
            }
            cmd.env("CARGO_ENCODED_RUSTFLAGS", flags);
        } else {
            let mut flags = std::env::var_os("RUSTFLAGS").unwrap_or_default();
            for f in ours {
                flags.push(" ");
                flags.push(f);
            }
            cmd.env("RUSTFLAGS", flags);
        }
        match &self.only {
            Some(ids) => cmd.env("MEMTRACK_BENCHMARKS", benchmark_list(ids)),
            None => cmd.env_remove("MEMTRACK_BENCHMARKS"),
        };
        cmd.env("CARGO_TARGET_DIR", &self.target)
            .env("MEMTRACK_DIR", out)
            .env("MEMTRACK_BACKEND", self.recorder.name())
            .stdin(Stdio::null())
            .stdout(std::io::stderr());
        let status = cmd
            .status()
            .map_err(|e| format!("cannot run `{}` ({what}): {e}", shown(&cmd)))?;
        if !status.success() {
            return Err(format!(
                "`{}` failed ({what}, in {}): {status}; its messages are above",
                shown(&cmd),
                dir.display()
            ));
        }
        self.keep_executables(out)
    }

    /// Copies into `out`'s build-id directory (`crate::BUILD_IDS`) each executable of this
    /// suite's target directory that an artifact in `out` has frames of, named by its build
    /// id: a later build (the next commit of `--chain`, the user's next run) replaces the file
    /// at its path, and `show`, `compare` and `flamegraph` then read the copy.
    fn keep_executables(&self, out: &Path) -> Result<(), String> {
        let target = self
            .target
            .canonicalize()
            .unwrap_or_else(|_| self.target.clone());
        let store = out.join(crate::BUILD_IDS);
        let fail = |what: &Path, e: &dyn std::fmt::Display| {
            format!("cannot keep a copy of {}: {e}", what.display())
        };
        for entry in std::fs::read_dir(out).map_err(|e| fail(out, &e))? {
            let path = entry.map_err(|e| fail(out, &e))?.path();
            if path.extension().is_none_or(|x| x != "memtrack") {
                continue;
            }
            let reader = Reader::open(&path).map_err(|e| e.to_string())?;
            let Ok(table) = reader.stacks() else { continue };
            for (_, module) in table.modules() {
                let (file, Some(id)) = (Path::new(&module.path), module.build_id.as_deref()) else {
                    continue;
                };
                if id.len() < 2 || !file.starts_with(&target) {
                    continue;
                }
                let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
                let copy = store.join(&hex[..2]).join(&hex[2..]);
                if copy.exists() {
                    continue;
                }
                keep(file, &copy).map_err(|e| fail(file, &e))?;
            }
        }
        Ok(())
    }
}

/// Copies `file` to `copy` (a new file, put in place only once whole).
fn keep(file: &Path, copy: &Path) -> Result<(), String> {
    if let Some(dir) = copy.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let out = OutputFile::create(copy).map_err(|e| e.to_string())?;
    let mut from = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let mut to = out.writer().map_err(|e| e.to_string())?;
    std::io::copy(&mut from, &mut to).map_err(|e| format!("{}: {e}", copy.display()))?;
    out.commit().map(drop).map_err(|e| e.to_string())
}

/// `ids` as `MEMTRACK_BENCHMARKS` lists them: one per line, a backslash written `\\` and a
/// line break `\n` (criterion's ids may hold either).
fn benchmark_list(ids: &[String]) -> String {
    let escaped: Vec<String> = ids
        .iter()
        .map(|id| id.replace('\\', "\\\\").replace('\n', "\\n"))
        .collect();
    escaped.join("\n")
}

/// `git ARGS` in `dir`: its standard output, trimmed, or an error naming the command.
pub(crate) fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir).args(args);
    output(&mut cmd).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// A detached git worktree of `--base`'s commit, removed when dropped.
pub(crate) struct Worktree {
    repo: PathBuf,
    path: PathBuf,
    /// The commit checked out.
    pub commit: String,
    /// Where in the worktree the suite runs: the user's directory's place in the repository.
    pub dir: PathBuf,
}

impl Worktree {
    /// Checks `reference` out at `path` (a worktree left there by an interrupted run is
    /// replaced), for the repository holding `dir`.
    pub(crate) fn add(dir: &Path, reference: &str, path: PathBuf) -> Result<Worktree, String> {
        let git = |args: &[&str]| git(dir, args);
        let repo = git(&["rev-parse", "--show-toplevel"]).map_err(|e| {
            format!(
                "--base needs a git repository, and {} is in none: {e}",
                dir.display()
            )
        })?;
        let prefix = git(&["rev-parse", "--show-prefix"])?;
        let commit = git(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{reference}^{{commit}}"),
        ])
        .map_err(|_| {
            format!("--base {reference}: no such commit in {repo}: name a branch, tag or commit")
        })?;
        let repo = PathBuf::from(repo);
        if path.exists() {
            remove_left_over(&repo, &path);
            if path.exists() {
                return Err(format!(
                    "{} is in the way of the base's worktree: remove it",
                    path.display()
                ));
            }
        }
        let p = path.to_string_lossy().into_owned();
        git(&["worktree", "add", "--detach", &p, &commit])?;
        Ok(Worktree {
            dir: path.join(prefix),
            repo,
            path,
            commit,
        })
    }
}

impl Worktree {
    /// Checks `commit` out in the worktree, discarding what a previous run changed in it; the
    /// files the commit does not change keep their times, so cargo rebuilds only what changed.
    pub(crate) fn checkout(&self, commit: &str) -> Result<(), String> {
        let mut cmd = Command::new("git");
        cmd.current_dir(&self.path)
            .args(["checkout", "--quiet", "--force", "--detach", commit]);
        output(&mut cmd).map(drop)
    }
}

/// Removes the worktree an interrupted run left at `path`: this repository's, another's (a
/// worktree knows its repository), or one whose repository is gone (its `.git` file names a
/// git directory that no longer exists). Anything else at `path` stays.
fn remove_left_over(repo: &Path, path: &Path) {
    let gitdir = std::fs::read_to_string(path.join(".git"))
        .ok()
        .and_then(|t| t.strip_prefix("gitdir: ").map(|d| PathBuf::from(d.trim())));
    let Some(gitdir) = gitdir else { return };
    if gitdir.exists() {
        let owner = git(
            path,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .ok()
        .and_then(|d| PathBuf::from(d).parent().map(Path::to_path_buf));
        remove(owner.as_deref().unwrap_or(repo), path);
    } else if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        if let Err(e) = std::fs::remove_dir_all(path) {
            eprintln!("memtrack: warning: cannot remove {}: {e}", path.display());
        }
    }
}

/// `git worktree remove --force PATH`, then `git worktree prune`; a warning if PATH stays.
fn remove(repo: &Path, path: &Path) {
    let mut cmd = Command::new("git");
    cmd.current_dir(repo)
        .args(["worktree", "remove", "--force"])
        .arg(path);
    if let Err(e) = output(&mut cmd) {
        if path.exists() {
            eprintln!("memtrack: warning: {e}; remove {} by hand", path.display());
        }
    }
    let _ = Command::new("git")
        .current_dir(repo)
        .args(["worktree", "prune"])
        .output();
}

impl Drop for Worktree {
    fn drop(&mut self) {
        remove(&self.repo, &self.path);
    }
}
