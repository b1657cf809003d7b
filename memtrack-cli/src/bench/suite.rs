//! Running the user's criterion suite in memory mode: its target directory, `cargo bench` with
//! memtrack-criterion's cfg, and the git worktree of `--base`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use memtrack::artifact::{Backend, Output as OutputFile, Reader};

use crate::error::Error;

/// The `--cfg` memtrack-criterion reads for `backend`, and `MEMTRACK_BACKEND`'s value:
/// `--cfg memtrack_bench` builds the suite for the eBPF tracker, `memtrack_bench="alloc"`
/// with the allocator recorder as the global allocator (a suite is built for one of the two).
fn cfg_and_name(backend: Backend) -> (&'static str, &'static str) {
    if backend == Backend::Ebpf {
        ("memtrack_bench", "ebpf")
    } else {
        ("memtrack_bench=\"alloc\"", "alloc")
    }
}

/// How to run the suite: `cargo bench ARGS` in a target directory of memory mode's own.
pub(crate) struct Suite {
    /// The recorder the suite is built for: [`Backend::Ebpf`] or [`Backend::Alloc`].
    pub backend: Backend,
    pub args: Vec<OsString>,
    /// `<the user's target dir>/memtrack-bench`, or `memtrack-bench-base` for the worktree's
    /// builds (`--base`, `--chain`).
    pub target: PathBuf,
    /// Only these benchmark ids (`MEMTRACK_BENCHMARKS`, which memtrack-criterion reads), or all.
    pub only: Option<Vec<String>>,
    /// The build-id directory (`crate::BUILD_IDS`) of `--out`, one for every side and commit
    /// of the run: a copy is named by its build id, so an executable that two commits share
    /// is kept once.
    pub store: PathBuf,
}

/// The cargo that runs memtrack (`$CARGO` under cargo), else the one on the PATH.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cmd`'s program and arguments as a shell would show them, for messages.
pub(crate) fn shown(cmd: &Command) -> String {
    let mut words = vec![cmd.get_program().to_string_lossy().into_owned()];
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Adds `ours` to the rustflags of `cmd`, a cargo command to run in `dir`, keeping the user's.
pub(crate) fn add_rustflags(cmd: &mut Command, dir: &Path, ours: &[&str]) {
    // The user's flags are kept. CARGO_ENCODED_RUSTFLAGS, when set, wins over RUSTFLAGS, and
    // either replaces the rustflags of cargo's configuration.
    if let Some(enc) = std::env::var_os("CARGO_ENCODED_RUSTFLAGS") {
        let mut flags = enc;
        for f in ours {
            if !flags.is_empty() {
                flags.push("\u{1f}");
            }
            flags.push(f);
        }
        cmd.env("CARGO_ENCODED_RUSTFLAGS", flags);
    } else if let Some(mut flags) = std::env::var_os("RUSTFLAGS") {
        for f in ours {
            flags.push(" ");
            flags.push(f);
        }
        cmd.env("RUSTFLAGS", flags);
    } else {
        // Cargo's `--config` joins arrays to the configuration's own: the suite's
        // configured flags stay. Cargo reads `target.*.rustflags` instead of
        // `build.rustflags` when any is set, so ours join whichever it reads.
        let list = serde_json::to_string(ours).expect("strings serialize");
        let key = if target_rustflags_configured(dir) {
            "target.'cfg(all())'.rustflags"
        } else {
            "build.rustflags"
        };
        // Before the subcommand: the user's arguments may end in `-- FILTER`.
        cmd.arg("--config").arg(format!("{key}={list}"));
    }
}

/// Runs `cmd` to the end, its output captured: an error naming it if it cannot start or fails.
fn output(cmd: &mut Command) -> Result<Output, Error> {
    let out = cmd
        .output()
        .map_err(|e| crate::error::io(format!("cannot run `{}`", shown(cmd)), e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Command(format!(
            "`{}` failed ({}): {}",
            shown(cmd),
            out.status,
            err.trim()
        )));
    }
    Ok(out)
}

/// Whether cargo's configuration for a build in `dir` sets `rustflags` in a `[target.*]` table
/// (`.cargo/config.toml` or `.cargo/config` in `dir` and the directories above it, then in
/// `$CARGO_HOME`, or a `CARGO_TARGET_*_RUSTFLAGS` variable): cargo then ignores
/// `build.rustflags`. A file that cannot be read or parsed counts as not setting them (cargo
/// itself reports it).
fn target_rustflags_configured(dir: &Path) -> bool {
    let from_env = std::env::vars_os().any(|(k, _)| {
        k.to_str()
            .is_some_and(|k| k.starts_with("CARGO_TARGET_") && k.ends_with("_RUSTFLAGS"))
    });
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let mut files: Vec<PathBuf> = dir
        .ancestors()
        .flat_map(|d| [d.join(".cargo/config.toml"), d.join(".cargo/config")])
        .collect();
    if let Some(h) = home {
        files.extend([h.join("config.toml"), h.join("config")]);
    }
    from_env
        || files.iter().any(|f| {
            let Ok(text) = std::fs::read_to_string(f) else {
                return false;
            };
            let Ok(table) = text.parse::<toml::Table>() else {
                return false;
            };
            table
                .get("target")
                .and_then(toml::Value::as_table)
                .is_some_and(|t| {
                    t.values()
                        .any(|v| v.as_table().is_some_and(|v| v.contains_key("rustflags")))
                })
        })
}

/// The user's target directory: `$CARGO_TARGET_DIR`, else cargo's (`cargo metadata`) for the
/// package in `dir`.
pub(crate) fn target_dir(dir: &Path) -> Result<PathBuf, Error> {
    // Empty is unset, as cargo takes it.
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR").filter(|t| !t.is_empty()) {
        return Ok(dir.join(t));
    }
    let mut cmd = cargo();
    cmd.current_dir(dir).env_remove("CARGO_TARGET_DIR").args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]);
    let out = output(&mut cmd)?;
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Command(format!("`{}` printed no JSON: {e}", shown(&cmd))))?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| Error::Command(format!("`{}` named no target_directory", shown(&cmd))))
}

/// Refuses, before anything is built, a suite that `mode` ("memory", "instructions") cannot
/// measure: one where no package of the workspace in `dir` depends on memtrack-criterion (by
/// any name). On criterion itself it would run criterion's whole timing and record or count
/// nothing. `cargo_args` are the user's `cargo bench` arguments (their `--manifest-path`
/// names the workspace); `what` names the side ("head", "base main, 0123abcd", "commit
/// 0123abcd"). A `cargo metadata` that fails or lists no packages refuses nothing: the build
/// that follows says what is wrong.
///
/// # Errors
/// [`Error::NotOnMemtrackCriterion`], naming the side and the fix.
pub(crate) fn require_memtrack_criterion(
    dir: &Path,
    cargo_args: &[OsString],
    what: &str,
    mode: &'static str,
) -> Result<(), Error> {
    let mut cmd = cargo();
    cmd.current_dir(dir)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .args(manifest_path(cargo_args))
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    let Some(meta) = cmd
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
    else {
        return Ok(());
    };
    match on_memtrack_criterion(&meta) {
        Some(false) => Err(Error::NotOnMemtrackCriterion {
            side: what.to_string(),
            mode,
            at_head: what == "head",
        }),
        _ => Ok(()),
    }
}

/// Whether a package of `cargo metadata --no-deps`'s output (the workspace's) depends on
/// memtrack-criterion, as a dependency of any kind and under any name; None when it lists no
/// packages.
fn on_memtrack_criterion(meta: &serde_json::Value) -> Option<bool> {
    let packages = meta["packages"].as_array()?;
    Some(
        packages
            .iter()
            .flat_map(|p| p["dependencies"].as_array().into_iter().flatten())
            .any(|d| d["name"] == "memtrack-criterion"),
    )
}

/// The user's `--manifest-path` among `cargo_args` (before a `--`), as arguments for another
/// cargo command.
fn manifest_path(cargo_args: &[OsString]) -> Vec<OsString> {
    let mut args = cargo_args.iter().take_while(|a| *a != "--");
    while let Some(a) = args.next() {
        if a == "--manifest-path" {
            return [a.clone()]
                .into_iter()
                .chain(args.next().cloned())
                .collect();
        }
        if a.to_str()
            .is_some_and(|a| a.starts_with("--manifest-path="))
        {
            return vec![a.clone()];
        }
    }
    Vec::new()
}

impl Suite {
    /// Runs `cargo bench` in `dir`, the artifacts written to `out`. Cargo's standard output
    /// (criterion's own table) goes to stderr with cargo's messages, so that memtrack's
    /// standard output is its table or JSON only. `what` names the side for messages.
    ///
    /// # Errors
    /// A suite not on memtrack-criterion (refused before it is built), a `cargo bench` that
    /// cannot start or fails, an executable that cannot be kept.
    pub(crate) fn run(&self, dir: &Path, out: &Path, what: &str) -> Result<(), Error> {
        require_memtrack_criterion(dir, &self.args, what, "memory")?;
        let mut cmd = cargo();
        cmd.current_dir(dir);
        let ours = [
            "--cfg",
            cfg_and_name(self.backend).0,
            "-C",
            "force-frame-pointers=yes",
        ];
        add_rustflags(&mut cmd, dir, &ours);
        cmd.arg("bench").args(&self.args);
        match &self.only {
            Some(ids) => cmd.env("MEMTRACK_BENCHMARKS", benchmark_list(ids)),
            None => cmd.env_remove("MEMTRACK_BENCHMARKS"),
        };
        // `out` was cleared: an artifact already there is another benchmark's of this run.
        cmd.env("CARGO_TARGET_DIR", &self.target)
            .env(memtrack::NO_REPLACE, "1")
            .env("MEMTRACK_DIR", out)
            .env("MEMTRACK_BACKEND", cfg_and_name(self.backend).1)
            // One table, ours, for all the suite's binaries: each says one line.
            .env("MEMTRACK_SUMMARY", "line")
            .stdin(Stdio::null())
            .stdout(std::io::stderr());
        let status = cmd
            .status()
            .map_err(|e| crate::error::io(format!("cannot run `{}` ({what})", shown(&cmd)), e))?;
        if !status.success() {
            return Err(Error::Command(format!(
                "`{}` failed ({what}, in {}): {status}; its messages are above",
                shown(&cmd),
                dir.display()
            )));
        }
        self.keep_executables(out)
    }

    /// Copies into the run's build-id directory ([`Suite::store`]) each executable of this
    /// suite's target directory that an artifact in `out` has frames of, named by its build
    /// id: a later build (the next commit of `--chain`, the user's next run) replaces the file
    /// at its path, and `show`, `compare` and `flamegraph` then read the copy (they look beside
    /// an artifact and in the directory above).
    fn keep_executables(&self, out: &Path) -> Result<(), Error> {
        let target = self
            .target
            .canonicalize()
            .unwrap_or_else(|_| self.target.clone());
        let store = &self.store;
        let fail = |e| crate::error::io(format!("cannot keep a copy of {}", out.display()), e);
        for entry in std::fs::read_dir(out).map_err(fail)? {
            let path = entry.map_err(fail)?.path();
            if path.extension().is_none_or(|x| x != "memtrack") {
                continue;
            }
            let reader = Reader::open(&path)?;
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
                keep(file, &copy).map_err(|e| Error::KeepCopy {
                    file: file.to_path_buf(),
                    source: Box::new(e),
                })?;
            }
        }
        Ok(())
    }
}

/// Copies `file` to `copy` (a new file, put in place only once whole).
fn keep(file: &Path, copy: &Path) -> Result<(), Error> {
    if let Some(dir) = copy.parent() {
        // Through no link another user planted, as artifacts are written.
        memtrack::artifact::create_dir_all(dir).map_err(|e| match e {
            memtrack::artifact::OutputError::Io { source, .. } => {
                crate::error::io(format!("creating {}", dir.display()), source)
            }
            e => e.into(),
        })?;
    }
    let out = OutputFile::create(copy)?;
    let mut from = std::fs::File::open(file)
        .map_err(|e| crate::error::io(format!("opening {}", file.display()), e))?;
    let mut to = out.writer()?;
    std::io::copy(&mut from, &mut to)
        .map_err(|e| crate::error::io(copy.display().to_string(), e))?;
    Ok(out.commit().map(drop)?)
}

/// `ids` as `MEMTRACK_BENCHMARKS` lists them: one per line, each escaped
/// ([`memtrack::human::escape_line`]: criterion's ids may hold line breaks).
pub(crate) fn benchmark_list(ids: &[String]) -> String {
    let escaped: Vec<String> = ids
        .iter()
        .map(|id| memtrack::human::escape_line(id))
        .collect();
    escaped.join("\n")
}

/// What the user's environment may point git elsewhere with: removed from every git memtrack
/// runs.
const GIT_ENV: [&str; 7] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
];

/// `git` without [`GIT_ENV`]: every command names its git directory and work tree on its
/// command line, and the index is the git directory's.
fn git_command(git_dir: &Path, work_tree: &Path) -> Command {
    let mut cmd = Command::new("git");
    for var in GIT_ENV {
        cmd.env_remove(var);
    }
    cmd.current_dir(work_tree)
        .arg("--git-dir")
        .arg(git_dir)
        .arg("--work-tree")
        .arg(work_tree);
    cmd
}

/// `cmd`'s standard output, trimmed, or an error naming it.
fn stdout_of(cmd: &mut Command) -> Result<String, Error> {
    output(cmd).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The user's git repository, found from the directory memtrack runs in (the one place git is
/// let look for it); every later command names its git directory and work tree.
pub(crate) struct Repo {
    /// The git directory of the user's checkout (a linked worktree's own, if they are in one).
    git_dir: PathBuf,
    /// The repository's common git directory, which holds `worktrees/`.
    common: PathBuf,
    /// The top of the user's checkout.
    top: PathBuf,
    /// The user's directory, relative to `top` (empty, or ending in `/`).
    prefix: String,
}

impl Repo {
    /// The repository holding `dir`; `option` (`--base`, `--chain`) names what needs it.
    pub(crate) fn find(dir: &Path, option: &str) -> Result<Repo, Error> {
        let mut cmd = Command::new("git");
        for var in GIT_ENV {
            cmd.env_remove(var);
        }
        cmd.current_dir(dir).args([
            "rev-parse",
            "--path-format=absolute",
            "--absolute-git-dir",
            "--git-common-dir",
            "--show-toplevel",
            "--show-prefix",
        ]);
        let text = output(&mut cmd)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .map_err(|e| {
                Error::Usage(format!(
                    "{option} needs a git repository, and {} is in none: {e}",
                    dir.display()
                ))
            })?;
        let mut lines = text.lines();
        let mut next = || lines.next().unwrap_or_default().to_string();
        let (git_dir, common, top, prefix) = (next(), next(), next(), next());
        if top.is_empty() {
            return Err(Error::Usage(format!(
                "{option} needs a checkout, and {} is in a bare repository ({git_dir})",
                dir.display()
            )));
        }
        Ok(Repo {
            git_dir: git_dir.into(),
            common: common.into(),
            top: top.into(),
            prefix,
        })
    }

    /// `git ARGS` in the user's checkout: its standard output, trimmed.
    pub(crate) fn git(&self, args: &[&str]) -> Result<String, Error> {
        stdout_of(git_command(&self.git_dir, &self.top).args(args))
    }
}

/// One `memtrack bench` at a time per target directory: the lock on
/// `<target>/memtrack-bench.lock`, held until dropped. Two runs would share the base's
/// worktree record, the builds' target directories and the default `--out`.
pub(crate) struct Lock {
    _file: std::fs::File,
}

impl Lock {
    /// Takes the lock, or an error naming the run that holds it and the way round.
    pub(crate) fn take(target: &Path) -> Result<Lock, Error> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        memtrack::artifact::create_dir_all(target)?;
        let path = target.join("memtrack-bench.lock");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| crate::error::io(format!("cannot open {}", path.display()), e))?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Lock { _file: file });
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(Error::Busy(format!(
                "another `memtrack bench` is running with the target directory {} (it holds \
                 {}): wait for it to end, or give this run a CARGO_TARGET_DIR of its own",
                target.display(),
                path.display()
            ))),
            e => Err(crate::error::io(
                format!("cannot lock {}", path.display()),
                e,
            )),
        }
    }
}

/// Where a run notes the worktree it made, so that the next run removes it if this one is
/// interrupted: the worktree's git directory and its path, one a line.
const RECORD: &str = "memtrack-bench.worktree";

/// A detached git worktree of the user's repository, made by this run in a directory of its own
/// outside the user's tree (so that neither git nor cargo, walking up from it, reaches the
/// user's checkout); removed when dropped.
pub(crate) struct Worktree {
    /// The user's git directory and checkout, named when the worktree is removed.
    git_dir: PathBuf,
    top: PathBuf,
    /// The directory made for it (a fresh, private directory in the temporary directory).
    home: PathBuf,
    /// The worktree's top.
    path: PathBuf,
    /// Its own git directory, `<common>/worktrees/NAME`, named in every command run in it.
    admin: PathBuf,
    /// The record of it in the target directory ([`RECORD`]).
    record: PathBuf,
    /// The commit checked out first.
    pub commit: String,
    /// Where in the worktree the suite runs: the user's directory's place in the repository.
    pub dir: PathBuf,
}

impl Worktree {
    /// Checks `reference` out in a new worktree of `repo`, after removing the one an
    /// interrupted run noted in `target` (the caller holds `target`'s [`Lock`]). `option`
    /// (`--base`, `--chain`) names what asked, for messages.
    pub(crate) fn add(
        repo: &Repo,
        reference: &str,
        target: &Path,
        option: &str,
    ) -> Result<Worktree, Error> {
        let commit = repo
            .git(&[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{reference}^{{commit}}"),
            ])
            .map_err(|_| {
                Error::Usage(format!(
                    "{option} {reference}: no such commit in {}: name a branch, tag or commit",
                    repo.top.display()
                ))
            })?;
        let record = target.join(RECORD);
        remove_left_over(repo, &record);
        let home = tempfile::Builder::new()
            .prefix("memtrack-bench-")
            .tempdir()
            .map_err(|e| {
                crate::error::io(
                    format!(
                        "cannot make a directory for the worktree in {}",
                        std::env::temp_dir().display()
                    ),
                    e,
                )
            })?
            .keep();
        // Canonical, as git notes it: the record and the checks compare it with git's.
        let home = home.canonicalize().unwrap_or(home);
        let name = repo.top.file_name().unwrap_or("repo".as_ref());
        let path = home.join(name);
        let made = repo.git(&[
            "worktree",
            "add",
            "--quiet",
            "--detach",
            &path.to_string_lossy(),
            &commit,
        ]);
        let admin = made.and_then(|_| admin_of(&repo.common, &path));
        let admin = match admin {
            Ok(a) => a,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&home);
                return Err(e);
            }
        };
        let tree = Worktree {
            git_dir: repo.git_dir.clone(),
            top: repo.top.clone(),
            dir: path.join(&repo.prefix),
            home,
            path,
            admin,
            record,
            commit,
        };
        tree.note()?;
        Ok(tree)
    }

    /// Writes [`RECORD`].
    fn note(&self) -> Result<(), Error> {
        use std::io::Write;
        let text = format!("{}\n{}\n", self.admin.display(), self.path.display());
        let out = OutputFile::create(&self.record)?;
        let mut w = out.writer()?;
        w.write_all(text.as_bytes())
            .map_err(|e| crate::error::io(format!("cannot write {}", self.record.display()), e))?;
        Ok(out.commit().map(drop)?)
    }

    /// Checks `commit` out in the worktree, discarding what a previous run changed in it; the
    /// files the commit does not change keep their times, so cargo rebuilds only what changed.
    /// Refused unless the worktree's git directory is still the one this run made and names
    /// this worktree.
    pub(crate) fn checkout(&self, commit: &str) -> Result<(), Error> {
        if !names(&self.admin, &self.path) {
            return Err(Error::Worktree(format!(
                "the worktree at {} is no longer the one memtrack made (its git directory {} \
                 is gone or names another): refusing to check out there",
                self.path.display(),
                self.admin.display()
            )));
        }
        output(
            git_command(&self.admin, &self.path)
                .args(["checkout", "--quiet", "--force", "--detach", commit]),
        )
        .map(drop)
    }
}

/// The git directory `git worktree add` made for the worktree at `path`: the one under
/// `<common>/worktrees/` that names `path` (read from `path/.git`, then checked both ways).
fn admin_of(common: &Path, path: &Path) -> Result<PathBuf, Error> {
    let text = std::fs::read_to_string(path.join(".git"))
        .map_err(|e| crate::error::io(format!("cannot read {}/.git", path.display()), e))?;
    let admin = text
        .strip_prefix("gitdir: ")
        .map(|d| PathBuf::from(d.trim()))
        .filter(|a| names(a, path) && in_worktrees(common, a))
        .ok_or_else(|| {
            Error::Worktree(format!(
                "{}/.git does not name a worktree of {}: {text:?}",
                path.display(),
                common.display()
            ))
        })?;
    Ok(admin)
}

/// Whether `admin` is a directory of `<common>/worktrees/`.
fn in_worktrees(common: &Path, admin: &Path) -> bool {
    let worktrees = common.join("worktrees").canonicalize().ok();
    worktrees.is_some() && admin.parent().and_then(|p| p.canonicalize().ok()) == worktrees
}

/// Whether the worktree git directory `admin` names the worktree at `path` (its `gitdir` file
/// holds `path/.git`, which need not exist any more).
fn names(admin: &Path, path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(admin.join("gitdir")) else {
        return false;
    };
    let named = Path::new(text.trim()).parent();
    named == Some(path)
        || named
            .and_then(|p| p.canonicalize().ok())
            .is_some_and(|n| Some(n) == path.canonicalize().ok())
}

/// Removes the worktree an interrupted run noted in `record`: its entry in the user's
/// repository, only if that entry names it, and the directory made for it, only if it is a
/// `memtrack-bench-*` directory of the temporary directory owned by this user. Nothing else.
fn remove_left_over(repo: &Repo, record: &Path) {
    let Ok(text) = std::fs::read_to_string(record) else {
        return;
    };
    let mut lines = text.lines().map(PathBuf::from);
    let (Some(admin), Some(path)) = (lines.next(), lines.next()) else {
        return;
    };
    if in_worktrees(&repo.common, &admin) && names(&admin, &path) {
        remove((&repo.git_dir, &repo.top), &admin, &path);
    }
    if let Some(home) = path.parent().filter(|h| made_by_us(h)) {
        let _ = std::fs::remove_dir_all(home);
    }
    let _ = std::fs::remove_file(record);
}

/// Whether `dir` is a directory this user made for a worktree: `memtrack-bench-*` in the
/// temporary directory, a real directory (not a link) owned by the effective user.
fn made_by_us(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let tmp = std::env::temp_dir();
    let named = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("memtrack-bench-"));
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    named
        && dir.parent().and_then(|p| p.canonicalize().ok()) == tmp.canonicalize().ok()
        && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == euid)
}

/// Removes the worktree at `path` whose git directory is `admin`: git's own removal of that
/// one worktree (never `git worktree prune`, which would drop every worktree of the user's
/// whose folder is away); if git cannot (its `.git` file is gone), its git directory by hand.
fn remove(repo: (&Path, &Path), admin: &Path, path: &Path) {
    let removed = output(
        git_command(repo.0, repo.1)
            .args(["worktree", "remove", "--force"])
            .arg(path),
    );
    if removed.is_err() && names(admin, path) {
        if let Err(e) = std::fs::remove_dir_all(admin) {
            eprintln!("memtrack: warning: cannot remove {}: {e}", admin.display());
        }
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        remove((&self.git_dir, &self.top), &self.admin, &self.path);
        if let Err(e) = std::fs::remove_dir_all(&self.home) {
            eprintln!(
                "memtrack: warning: cannot remove {}: {e}; remove it by hand",
                self.home.display()
            );
        }
        let _ = std::fs::remove_file(&self.record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo metadata --no-deps`'s output for a workspace whose one package has these
    /// dependencies (`name`, `rename`, `kind`), as cargo lists them.
    fn metadata(deps: &[(&str, Option<&str>, Option<&str>)]) -> serde_json::Value {
        let deps: Vec<serde_json::Value> = deps
            .iter()
            .map(|(name, rename, kind)| {
                serde_json::json!({ "name": name, "rename": rename, "kind": kind, "req": "*" })
            })
            .collect();
        serde_json::json!({
            "packages": [{ "name": "semver", "dependencies": deps }],
            "target_directory": "/t"
        })
    }

    #[test]
    fn a_suite_on_memtrack_criterion_is_told_from_one_on_criterion() {
        let renamed = metadata(&[
            ("serde", None, None),
            ("memtrack-criterion", Some("criterion"), Some("dev")),
        ]);
        assert_eq!(on_memtrack_criterion(&renamed), Some(true));
        let plain = metadata(&[("criterion", None, Some("dev"))]);
        assert_eq!(on_memtrack_criterion(&plain), Some(false));
        let none = metadata(&[]);
        assert_eq!(on_memtrack_criterion(&none), Some(false));
        // What cannot be told refuses nothing.
        let unknown = serde_json::json!({ "target_directory": "/t" });
        assert_eq!(on_memtrack_criterion(&unknown), None);
    }

    #[test]
    fn the_users_manifest_path_is_kept() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            manifest_path(&args(&[
                "--locked",
                "--manifest-path",
                "a/Cargo.toml",
                "-q"
            ])),
            args(&["--manifest-path", "a/Cargo.toml"])
        );
        assert_eq!(
            manifest_path(&args(&["--manifest-path=a/Cargo.toml"])),
            args(&["--manifest-path=a/Cargo.toml"])
        );
        assert_eq!(
            manifest_path(&args(&["--", "--manifest-path", "x"])),
            Vec::<OsString>::new()
        );
    }
}
