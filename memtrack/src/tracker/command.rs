//! `memtrack record -- CMD`: run a command with the tracker attached from its first
//! instruction, and (by default) every process it starts from theirs.
//!
//! The child is forked, sets up its credentials and waits on a pipe before `execve`.
//! Following (the default), a tracer thread seizes it with ptrace and probes every process of
//! the tree before it runs (see `follow.rs`). With [`CommandOptions::follow`] off, the parent
//! attaches the uprobes (for the child's pid) to the command's executable and every library
//! the dynamic loader will map for it, switches recording on, and only then lets the child
//! exec; a `dlopen`ed library with its own allocator is then found by rescanning
//! /proc/PID/maps every 20 ms while the command runs (its calls before that are missed), and
//! the processes it starts are counted, not recorded.
//!
//! The command never gains privileges through memtrack. Between fork and exec the child
//! clears its ambient and inheritable capabilities (the ones memtrack may hold through file
//! capabilities or `setpriv --ambient-caps` stay with memtrack), switches to the user of
//! [`CommandOptions::user`] if one is given, and sets `PR_SET_NO_NEW_PRIVS` whenever it will
//! not run as root, so that a setuid or setgid program it executes runs without gaining
//! privileges and memtrack never observes a more privileged program than the one it started.
//! A memtrack that gained capabilities at its exec is not dumpable, nor its forked child, and
//! ptrace needs a dumpable tracee: following, the child of such a memtrack (not root) makes
//! itself dumpable until it is seized, still holding memtrack's capabilities and blocking every
//! signal, so that no process less privileged than memtrack can read it (see `child_side`).
//! A followed process that executes a setuid or setgid program, or whose credentials change at
//! an exec, is no longer followed (counted as not covered).
//!
//! Signals: INT, TERM and HUP sent to memtrack go to the command (see `Forward`); the
//! artifact is finished once it exits. The command gets `PR_SET_PDEATHSIG(SIGKILL)`, so that
//! it never runs on untracked after memtrack is killed.

use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use super::follow::{Tracer, seize};
use super::{Tracker, TrackerError, TrackerOptions};
use crate::artifact::{Backend, Metadata, ProcessInfo};
use crate::backend::Recorded;
use crate::encode::{EncoderOptions, default_workers};

/// How often `record` looks for objects the command mapped since it started (20 ms: the
/// child's exit is noticed at most this late).
const RESCAN_PERIOD: std::time::Duration = std::time::Duration::from_millis(20);

/// How a recorded command ended.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RecordOutcome {
    /// The command's process id.
    pub pid: u32,
    /// Its exit code; 128 + the signal number if a signal killed it (as shells report).
    pub exit_code: i32,
    /// What was recorded.
    pub recorded: Recorded,
    /// Every process recorded, in the order they started (the command's first); empty with
    /// [`CommandOptions::follow`] off.
    pub processes: Vec<ProcessInfo>,
}

/// Who the recorded command runs as; see the module docs for what it never inherits.
#[derive(Debug, Clone)]
pub struct CommandOptions {
    user: Option<String>,
    follow: bool,
    lock_waits: bool,
}

impl Default for CommandOptions {
    fn default() -> Self {
        Self {
            user: None,
            follow: true,
            lock_waits: false,
        }
    }
}

impl CommandOptions {
    /// Defaults: the command runs as memtrack's user (root under sudo), without memtrack's
    /// capabilities, and its descendants are followed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether to record the processes the command starts (forked, vforked, spawned, and what
    /// they execute), each from its first instruction (default: yes). They are followed with
    /// ptrace (see the module docs); with `false`, only the command's own process is recorded,
    /// without ptrace, and the processes it starts are counted as not followed.
    pub fn follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// Whether to record lock waits too (default: no): every context switch of the recorded
    /// processes' threads, with the stack each thread left the CPU in
    /// ([`Capture::lock_waits`](super::Capture::lock_waits)).
    pub fn lock_waits(mut self, on: bool) -> Self {
        self.lock_waits = on;
        self
    }

    /// Runs the command as `user` (a name or a numeric uid from the password database): its
    /// uid, primary gid and supplementary groups, with `HOME`, `USER` and `LOGNAME` set to its
    /// own, and no capabilities. Needs root (`sudo memtrack record --user NAME`).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }
}

/// What the child does to its credentials between fork and exec, prepared before the fork
/// (after it, only async-signal-safe calls are allowed).
#[derive(Clone)]
struct Credentials {
    /// The user to become: uid, gid, supplementary groups.
    switch: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)>,
    /// Set `PR_SET_NO_NEW_PRIVS` (the command will not run as root).
    no_new_privs: bool,
    /// Make the child traceable by memtrack until its exec (see `child_side`): following, as a
    /// user holding the tracker's capabilities but not CAP_SYS_PTRACE.
    traceable: bool,
}

/// A step of [`Credentials::apply`] that failed, and its errno.
type Failed = (libc::c_int, libc::c_int);

const STEP_EXEC: libc::c_int = 0;
const STEP_USER: libc::c_int = 1;
const STEP_CAPS: libc::c_int = 2;
const STEP_NNP: libc::c_int = 3;
/// Not a failure: every step before the exec is done, the child waits for its go.
const STEP_READY: libc::c_int = 4;

/// Linux's capability ABI, version 3 (64 capability bits in two 32-bit words).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAP_V3: u32 = 0x2008_0522;
const CAP_SYS_ADMIN: u64 = 1 << 21;
const CAP_SYS_PTRACE: u64 = 1 << 19;
/// CAP_PERFMON (38) and CAP_BPF (39): what the tracker needs, unless CAP_SYS_ADMIN.
const TRACKER_CAPS: u64 = (1 << 38) | (1 << 39);

/// This process's (effective, permitted) capability sets.
fn own_caps() -> std::io::Result<(u64, u64)> {
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget of this process into a header and two data words of the V3 ABI.
    if unsafe { libc::syscall(libc::SYS_capget, &raw mut hdr, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let set = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32);
    Ok((set(|d| d.effective), set(|d| d.permitted)))
}

fn errno() -> libc::c_int {
    // SAFETY: reading this thread's errno.
    unsafe { *libc::__errno_location() }
}

impl Credentials {
    /// Looks up `opts.user` and decides what the child drops.
    fn new(opts: &CommandOptions) -> Result<(Self, Option<Passwd>), TrackerError> {
        let pw = match &opts.user {
            None => None,
            Some(u) => Some(Passwd::lookup(u)?),
        };
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if let Some(pw) = &pw
            && euid != 0
        {
            return Err(TrackerError::Credentials {
                what: format!("as user {:?}", pw.name),
                source: std::io::Error::other(
                    "switching users needs root: run `sudo memtrack record --user …`",
                ),
            });
        }
        let switch = pw.as_ref().map(|p| (p.uid, p.gid, p.groups.clone()));
        let runs_as = switch.as_ref().map_or(euid, |s| s.0);
        // Following needs the child traceable by memtrack (see `child_side`): only while it
        // keeps the tracker's capabilities until its exec, as ptrace then lets in only
        // processes that hold them too. Root and CAP_SYS_PTRACE need nothing.
        let traceable = opts.follow
            && switch.is_none()
            && euid != 0
            && own_caps().is_ok_and(|(eff, prm)| {
                eff & CAP_SYS_PTRACE == 0
                    && (prm & TRACKER_CAPS == TRACKER_CAPS || prm & CAP_SYS_ADMIN != 0)
            });
        Ok((
            Credentials {
                switch,
                no_new_privs: runs_as != 0,
                traceable,
            },
            pw,
        ))
    }

    /// Switches user, clears the ambient and inheritable capabilities, sets no_new_privs.
    ///
    /// # Safety
    /// Runs in a forked child of a multi-threaded process: it makes only async-signal-safe
    /// system calls, on memory prepared before the fork.
    unsafe fn apply(&self) -> Result<(), Failed> {
        // SAFETY: plain system calls on valid pointers into `self` and this stack frame.
        unsafe {
            if let Some((uid, gid, groups)) = &self.switch {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setresgid(*gid, *gid, *gid) != 0
                    || libc::setresuid(*uid, *uid, *uid) != 0
                {
                    return Err((STEP_USER, errno()));
                }
            }
            // Ambient capabilities would pass to the command as they are; EINVAL: a kernel
            // older than 4.3 has none.
            if libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) != 0
                && errno() != libc::EINVAL
            {
                return Err((STEP_CAPS, errno()));
            }
            // Inheritable ones would pass to a program with file-inheritable capabilities.
            let mut hdr = CapHeader {
                version: CAP_V3,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            if libc::syscall(libc::SYS_capget, &raw mut hdr, data.as_mut_ptr()) != 0 {
                return Err((STEP_CAPS, errno()));
            }
            if data.iter().any(|d| d.inheritable != 0) {
                for d in &mut data {
                    d.inheritable = 0;
                }
                if libc::syscall(libc::SYS_capset, &raw mut hdr, data.as_ptr()) != 0 {
                    return Err((STEP_CAPS, errno()));
                }
            }
            if self.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err((STEP_NNP, errno()));
            }
        }
        Ok(())
    }

    /// The error of a failed step, as the parent reports it.
    fn error(&self, command: &OsStr, user: Option<&Passwd>, (step, e): Failed) -> TrackerError {
        let source = std::io::Error::from_raw_os_error(e);
        let what = match step {
            STEP_USER => format!("as user {:?}", user.map_or("?", |p| p.name.as_str())),
            STEP_CAPS => "without memtrack's capabilities (clearing them failed)".into(),
            STEP_NNP => "with no_new_privs (setting it failed)".into(),
            _ => {
                return TrackerError::Spawn {
                    command: command.to_string_lossy().into_owned(),
                    source,
                };
            }
        };
        TrackerError::Credentials { what, source }
    }
}

/// A password database entry: what `--user` switches to.
struct Passwd {
    name: String,
    uid: libc::uid_t,
    gid: libc::gid_t,
    home: OsString,
    groups: Vec<libc::gid_t>,
}

impl Passwd {
    /// `user` by name, else (if numeric) by uid, with its supplementary groups.
    fn lookup(user: &str) -> Result<Self, TrackerError> {
        let unknown = || TrackerError::UnknownUser {
            user: user.to_string(),
        };
        let name_c = CString::new(user).map_err(|_| unknown())?;
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: an all-zero passwd is a valid value for getpw*_r to overwrite.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the sizes given; the strings `pw` points to live
        // in `buf`, which outlives their use below.
        unsafe {
            libc::getpwnam_r(
                name_c.as_ptr(),
                &mut pw,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            );
            if found.is_null()
                && let Ok(uid) = user.parse::<libc::uid_t>()
            {
                libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found);
            }
        }
        if found.is_null() {
            return Err(unknown());
        }
        // SAFETY: getpw*_r filled `pw` with NUL-terminated strings in `buf`.
        let (name, home) = unsafe {
            (
                std::ffi::CStr::from_ptr(pw.pw_name).to_owned(),
                std::ffi::CStr::from_ptr(pw.pw_dir).to_owned(),
            )
        };
        let mut groups = vec![0 as libc::gid_t; 64];
        loop {
            let mut n = groups.len() as libc::c_int;
            // SAFETY: `groups` has room for `n` gids; getgrouplist reports the needed count.
            let r = unsafe {
                libc::getgrouplist(name.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n)
            };
            if r >= 0 {
                groups.truncate(n.max(0) as usize);
                break;
            }
            groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
        }
        Ok(Passwd {
            name: name.to_string_lossy().into_owned(),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            home: OsStr::from_bytes(home.to_bytes()).to_os_string(),
            groups,
        })
    }
}

/// `program` as `execvp` would find it, or why it cannot run: not found (a shell's 127), or
/// found but not executable (126). A name without `/` is looked up in `PATH`; a file there
/// that is not executable is skipped, as execvp does, and reported if nothing else is found.
fn resolve(program: &OsStr) -> Result<PathBuf, TrackerError> {
    let p = Path::new(program);
    if program.as_bytes().contains(&b'/') {
        return match std::fs::metadata(p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(TrackerError::CommandNotFound {
                    command: program.to_string_lossy().into_owned(),
                    where_: "does not exist".into(),
                })
            }
            Err(e) => Err(TrackerError::NotExecutable {
                path: p.to_path_buf(),
                why: format!("{e}"),
            }),
            Ok(m) => runnable(p, &m).map(|()| p.to_path_buf()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    let mut refused = None;
    for c in std::env::split_paths(&path).map(|d| d.join(p)) {
        let Ok(m) = std::fs::metadata(&c) else {
            continue;
        };
        match runnable(&c, &m) {
            Ok(()) => return Ok(c),
            Err(e) => {
                refused.get_or_insert(e);
            }
        }
    }
    Err(refused.unwrap_or_else(|| TrackerError::CommandNotFound {
        command: program.to_string_lossy().into_owned(),
        where_: "is in no directory of PATH".into(),
    }))
}

/// Whether the file `path` (with metadata `m`) can be executed, or why not.
fn runnable(path: &Path, m: &std::fs::Metadata) -> Result<(), TrackerError> {
    use std::os::unix::fs::PermissionsExt;
    let why = if m.is_dir() {
        "it is a directory, not a program"
    } else if !m.is_file() {
        "it is not a regular file"
    } else if m.permissions().mode() & 0o111 == 0 {
        "it is not executable (no execute permission): `chmod +x` it, or run it through its \
         interpreter"
    } else {
        return Ok(());
    };
    Err(TrackerError::NotExecutable {
        path: path.to_path_buf(),
        why: why.into(),
    })
}

/// How many `#!` interpreters the kernel follows before refusing with ELOOP
/// (`BINPRM_MAX_RECURSION` + 1 images in all).
const MAX_SCRIPT_DEPTH: usize = 5;

/// What actually runs when `exe` is executed: `exe` itself if it is an ELF program, else the
/// interpreter of its `#!` line, followed as the kernel does (an interpreter may be a script
/// itself). Allocator probes belong on that program, not on a script's text.
fn program_run_by(exe: &Path) -> Result<PathBuf, TrackerError> {
    use std::io::Read;
    let mut cur = exe.to_path_buf();
    for _ in 0..MAX_SCRIPT_DEPTH {
        // The kernel reads the first 256 bytes (BINPRM_BUF_SIZE) for the `#!` line.
        let mut head = Vec::with_capacity(256);
        std::fs::File::open(&cur)
            .and_then(|f| f.take(256).read_to_end(&mut head))
            .map_err(|e| TrackerError::NotExecutable {
                path: cur.clone(),
                why: format!("reading it failed: {e}"),
            })?;
        if head.starts_with(b"\x7fELF") {
            return Ok(cur);
        }
        let Some(line) = head.strip_prefix(b"#!") else {
            return Err(TrackerError::NotExecutable {
                path: cur,
                why: "it is neither an ELF program nor a script starting with a #! line: add \
                      one (e.g. #!/bin/sh), or record its interpreter (`-- sh FILE`)"
                    .into(),
            });
        };
        let line = line.split(|&b| b == b'\n').next().unwrap_or(b"");
        let interp = line
            .split(|&b| b == b' ' || b == b'\t')
            .find(|w| !w.is_empty())
            .unwrap_or(b"");
        if interp.is_empty() {
            return Err(TrackerError::NotExecutable {
                path: cur,
                why: "its #! line names no interpreter".into(),
            });
        }
        let next = PathBuf::from(OsStr::from_bytes(interp));
        match std::fs::metadata(&next) {
            Ok(m) => runnable(&next, &m)?,
            Err(e) => {
                return Err(TrackerError::NotExecutable {
                    path: cur,
                    why: format!(
                        "its interpreter {} (from its #! line) cannot be used: {e}",
                        next.display()
                    ),
                });
            }
        }
        cur = next;
    }
    Err(TrackerError::NotExecutable {
        path: exe.to_path_buf(),
        why: format!(
            "its chain of #! interpreters is longer than the kernel's limit of {}",
            MAX_SCRIPT_DEPTH - 1
        ),
    })
}

/// The executable and every library the dynamic loader maps for it (`ld.so --list`, run
/// with the command's credentials, and with `env` as its environment if given: LD_PRELOAD
/// and LD_LIBRARY_PATH decide what it loads); just the executable if it is static.
fn objects_of(
    exe: &Path,
    creds: &Credentials,
    env: Option<&[(OsString, OsString)]>,
) -> Vec<PathBuf> {
    let mut files = vec![exe.to_path_buf()];
    let loader = Path::new("/lib64/ld-linux-x86-64.so.2");
    let mut cmd = std::process::Command::new(loader);
    cmd.arg("--list").arg(exe);
    if let Some(env) = env {
        cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    }
    let creds = creds.clone();
    // SAFETY: `apply` makes only async-signal-safe calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            creds
                .apply()
                .map_err(|(_, e)| std::io::Error::from_raw_os_error(e))
        })
    };
    let Ok(out) = cmd.output() else {
        return files;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "\t/lib64/ld-linux... (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line.trim(),
        };
        let path = path.rsplit_once(" (").map_or(path, |(p, _)| p);
        if path.starts_with('/') && !files.iter().any(|f| f == Path::new(path)) {
            files.push(PathBuf::from(path));
        }
    }
    files
}

fn cstring(s: &OsStr) -> Result<CString, TrackerError> {
    CString::new(s.as_bytes()).map_err(|_| TrackerError::Spawn {
        command: s.to_string_lossy().into_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "contains a NUL byte"),
    })
}

/// A pipe: (read end, write end), both close-on-exec.
fn pipe() -> Result<(OwnedFd, OwnedFd), TrackerError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(TrackerError::Io {
            what: "creating a pipe".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What `execve` gets, prepared before the fork: after it, the child may not allocate.
struct Exec {
    path: CString,
    /// Owns the strings `argv` points to.
    _args: Vec<CString>,
    /// Owns the strings `envp` points to.
    _env: Vec<CString>,
    /// NULL-terminated.
    argv: Vec<*const libc::c_char>,
    /// NULL-terminated.
    envp: Vec<*const libc::c_char>,
}

impl Exec {
    /// `exe` run with `command` as its arguments and memtrack's environment, with `HOME`,
    /// `USER` and `LOGNAME` of `user` if the command runs as another user.
    fn new(exe: &Path, command: &[OsString], user: Option<&Passwd>) -> Result<Self, TrackerError> {
        let path = cstring(exe.as_os_str())?;
        let args = command
            .iter()
            .map(|a| cstring(a))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        if let Some(pw) = user {
            // As `su` does: the user's own identity and home, the rest of the environment kept.
            env.retain(|(k, _)| !matches!(k.as_bytes(), b"HOME" | b"USER" | b"LOGNAME"));
            env.push(("HOME".into(), pw.home.clone()));
            env.push(("USER".into(), pw.name.clone().into()));
            env.push(("LOGNAME".into(), pw.name.clone().into()));
        }
        let env = env
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k;
                kv.push("=");
                kv.push(v);
                cstring(&kv)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The pointers stay valid when the vectors move: they point into each CString's own
        // heap buffer.
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());
        Ok(Exec {
            path,
            _args: args,
            _env: env,
            argv,
            envp,
        })
    }
}

/// How a poll of the command ([`Child::try_wait`]) found it.
enum Poll {
    /// Still running.
    Running,
    /// Exited (and reaped), with this wait status.
    Exited(libc::c_int),
    /// No longer this process's child to wait for (reaped elsewhere).
    Gone,
}

/// The forked command, from `fork` until it is reaped. It waits before `execve` until
/// [`Child::release`] lets it go. Dropped before it was reaped (any error after the fork, or a
/// panic), it is killed with SIGKILL and reaped: no error path leaves a command running
/// untracked, or a zombie.
struct Child {
    pid: u32,
    /// Our end of the pipe the child reads before it execs (closed unwritten: it exits 127).
    go: Option<OwnedFd>,
    /// Our end of the pipe on which the child reports a failed step before or at its exec.
    err: Option<OwnedFd>,
    /// Reaped (or found reaped): its pid may belong to another process now, never signal it.
    reaped: bool,
}

impl Child {
    /// Forks the child that sets up `creds` and, once released, executes `exec`; returns once
    /// it is ready (its credentials set up: it may be seized), or why it failed.
    fn spawn(
        exec: &Exec,
        creds: &Credentials,
        program: &OsStr,
        user: Option<&Passwd>,
    ) -> Result<Self, TrackerError> {
        let (go_rx, go_tx) = pipe()?;
        let (err_rx, err_tx) = pipe()?;
        let (go, err) = (go_rx.as_raw_fd(), err_tx.as_raw_fd());
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the child only calls async-signal-safe functions on memory prepared before.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(TrackerError::Spawn {
                command: program.to_string_lossy().into_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        if pid == 0 {
            // SAFETY: the forked child; it never returns.
            unsafe { child_side(parent, go, err, exec, creds) }
        }
        // The child's ends, closed here: a read of `err` then ends when the child execs (its
        // copy is close-on-exec) or exits.
        drop((go_rx, err_tx));
        // From here, an error return kills and reaps it (Drop).
        let child = Child {
            pid: pid as u32,
            go: Some(go_tx),
            err: Some(err_rx),
            reaped: false,
        };
        match child.report() {
            Some((STEP_READY, _)) => Ok(child),
            Some(failed) => Err(creds.error(program, user, failed)),
            None => Err(TrackerError::Spawn {
                command: program.to_string_lossy().into_owned(),
                source: std::io::Error::other("its process ended before its exec"),
            }),
        }
    }

    /// The next report of the child on the `err` pipe: `None` once it has executed the
    /// command (the pipe is close-on-exec) or exited.
    fn report(&self) -> Option<Failed> {
        let err = self.err.as_ref()?;
        let mut msg: [libc::c_int; 2] = [0; 2];
        loop {
            // SAFETY: reading at most size_of_val(&msg) bytes into `msg`.
            let n =
                unsafe { libc::read(err.as_raw_fd(), msg.as_mut_ptr().cast(), size_of_val(&msg)) };
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            // The child writes each report whole, in one write of less than PIPE_BUF bytes.
            return (n == size_of_val(&msg) as isize).then_some((msg[0], msg[1]));
        }
    }

    /// Lets the child exec (one byte on the go pipe) and learns whether it did: the errno
    /// of its failed `execve` (as a failed step), else `None`.
    fn release(&mut self) -> Option<Failed> {
        if let Some(go) = self.go.take() {
            // SAFETY: writing one byte from a valid buffer to our pipe (closed when dropped).
            unsafe { libc::write(go.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
        let failed = self.report();
        self.err = None;
        failed
    }

    /// Waits for the child to exit and reaps it: its wait status, or `None` if it was not
    /// this process's child to wait for any more (its tracer reaped it).
    fn wait(&mut self) -> Option<libc::c_int> {
        let mut status = 0;
        // SAFETY: waiting for our own child into a valid int.
        let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, 0) };
        if r == self.pid as libc::pid_t {
            self.reaped = true;
            return Some(status);
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            self.reaped = true;
        }
        None
    }

    /// Whether the child has exited (reaping it if so), without waiting.
    fn try_wait(&mut self) -> Poll {
        let mut status = 0;
        // SAFETY: polling our own child into a valid int.
        let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, libc::WNOHANG) };
        if r == self.pid as libc::pid_t {
            self.reaped = true;
            return Poll::Exited(status);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            _ if r >= 0 => Poll::Running,
            Some(libc::EINTR) => Poll::Running,
            _ => {
                self.reaped = true;
                Poll::Gone
            }
        }
    }

    /// Kills the child (SIGKILL) and reaps it, unless it was reaped; closes the pipes.
    fn kill(&mut self) {
        self.go = None;
        self.err = None;
        if self.reaped {
            return;
        }
        // SAFETY: `pid` is our child, not reaped yet (so not another process).
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        loop {
            // SAFETY: waiting for our own child; the status is not wanted.
            let r = unsafe { libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0) };
            if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        self.reaped = true;
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The forked child: sets up `creds`, reports it is ready on `err`, waits for the parent's go
/// and executes `exec`; reports a failed step on `err` instead and exits 127.
///
/// # Safety
/// Runs in a forked child of a multi-threaded process: only async-signal-safe calls, on memory
/// prepared before the fork. `exec`'s `argv`/`envp` are NULL-terminated arrays of valid C
/// strings.
unsafe fn child_side(
    parent: libc::pid_t,
    go: libc::c_int,
    err: libc::c_int,
    exec: &Exec,
    creds: &Credentials,
) -> ! {
    // SAFETY: see the function's contract.
    unsafe {
        let report = |msg: [libc::c_int; 2]| {
            libc::write(err, msg.as_ptr().cast(), size_of_val(&msg));
        };
        // Never outlive memtrack unobserved: SIGKILL when it dies (even by SIGKILL). If it
        // died before this line, the parent is already someone else.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != parent {
            libc::_exit(127);
        }
        // Rust ignores SIGPIPE and exec keeps ignored signals: give the command the
        // default, as std::process::Command does.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if let Err((step, e)) = creds.apply() {
            report([step, e]);
            libc::_exit(127);
        }
        // Changing credentials cleared the parent-death signal: set it again.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // A memtrack that gained capabilities at its exec is not dumpable, nor its forked child,
        // and without CAP_SYS_PTRACE ptrace attaches only to a dumpable process. Dumpable until
        // it is seized, the child still holds memtrack's capabilities (ptrace, and /proc's
        // memory, fd and environment files, let in only processes that hold them too) and
        // blocks every signal (none makes it dump core); its exec then sets the command's
        // dumpability as for any program of the user.
        let mut mask: libc::sigset_t = std::mem::zeroed();
        let traceable = creds.traceable && libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) != 1;
        if traceable {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::sigprocmask(libc::SIG_SETMASK, &all, &mut mask);
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
        }
        report([STEP_READY, 0]);
        let mut b = 0u8;
        loop {
            let n = libc::read(go, (&raw mut b).cast(), 1);
            if n == 1 {
                break;
            }
            if n == 0 || *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if traceable {
            // Seized now (ptrace checks only when attaching): not dumpable again before a
            // signal that came meanwhile is delivered.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        }
        libc::execve(exec.path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr());
        report([STEP_EXEC, *libc::__errno_location()]);
        libc::_exit(127);
    }
}

/// The recorded command's pid while [`Forward`] is installed, else 0.
static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The signals memtrack passes on to the recorded command rather than dying of them: Ctrl-C,
/// `kill`, `timeout`, a closed terminal.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// While alive, INT, TERM and HUP sent to memtrack are sent on to the command, which decides
/// whether to end; memtrack then finishes the artifact whole and exits with its code. A
/// signal from the terminal (Ctrl-C, si_code `SI_KERNEL`) already reached the command's
/// process group and is not sent twice. Dropped after the artifact is finished: the
/// previous dispositions come back.
struct Forward {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let pid = FORWARD_TO.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; kill is
    // async-signal-safe.
    unsafe {
        let from_terminal = !info.is_null() && (*info).si_code == libc::SI_KERNEL;
        if pid > 0 && !from_terminal {
            libc::kill(pid, sig);
        }
    }
}

impl Forward {
    fn install(pid: u32) -> Self {
        FORWARD_TO.store(pid as i32, std::sync::atomic::Ordering::Relaxed);
        let mut old = Vec::new();
        for sig in FORWARDED {
            // SAFETY: a zeroed sigaction is valid; the handler only loads an atomic and calls
            // kill, both async-signal-safe.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = forward as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &sa, &mut prev) == 0 {
                    old.push((sig, prev));
                }
            }
        }
        Forward { old }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        FORWARD_TO.store(0, std::sync::atomic::Ordering::Relaxed);
        for (sig, prev) in &self.old {
            // SAFETY: restoring a disposition sigaction returned.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
    }
}

/// Runs `command` (program and arguments) with allocation tracking, writing the artifact to
/// `out`; returns once it has exited and the artifact is complete. The command runs with
/// [`CommandOptions::new`]'s defaults.
pub fn record_command(
    command: &[OsString],
    out: impl Write + Send + 'static,
    opts: &TrackerOptions,
) -> Result<RecordOutcome, TrackerError> {
    record_command_with(command, out, opts, &CommandOptions::new())
}

/// [`record_command`], the command run as `child` says (e.g. as another user). Options, the
/// command and the user are checked before anything is started.
pub fn record_command_with(
    command: &[OsString],
    out: impl Write + Send + 'static,
    opts: &TrackerOptions,
    child: &CommandOptions,
) -> Result<RecordOutcome, TrackerError> {
    let plan = Plan::new(command, opts, child)?;
    // From here, every return (or panic) before the command is reaped kills and reaps it.
    let mut cmd = Child::spawn(&plan.exec, &plan.creds, plan.program, plan.user.as_ref())?;
    let tracker = plan.attach(cmd.pid, opts)?;
    let capture = super::Capture::new(crate::scope::Scope::Process).lock_waits(child.lock_waits);
    let recording = tracker.start_with(
        out,
        &plan.metadata(cmd.pid),
        EncoderOptions::new(),
        default_workers(),
        capture,
    )?;
    // INT, TERM and HUP go to the command, and memtrack finishes the artifact once it exits;
    // the handler stays until the artifact is finished (`timeout` signals memtrack and then
    // its whole process group: the second signal may come after the command has ended).
    // Installed before the child may exec: a signal sent as soon as the command runs (a short
    // `timeout`) must find the handler, not kill memtrack. The child was forked before this,
    // so it keeps the default dispositions.
    let _forward = Forward::install(cmd.pid);
    let ran = if plan.follow {
        match run_followed(&mut cmd, &tracker, &plan) {
            Ok(ran) => ran,
            Err(e) => {
                // The command first: it must not run on while the recording stops.
                cmd.kill();
                drop(recording.stop());
                return Err(e);
            }
        }
    } else {
        run_unfollowed(&mut cmd, &tracker)
    };
    finish(recording, ran, &plan, cmd.pid)
}

/// Everything `record` decides before it forks: the checked command, what runs (a script's
/// interpreter), with which credentials, the files to probe (not following), and the
/// `execve` arguments.
struct Plan<'c> {
    command: &'c [OsString],
    program: &'c OsString,
    /// What is probed: the program that runs (a script's interpreter).
    image: PathBuf,
    creds: Credentials,
    user: Option<Passwd>,
    follow: bool,
    /// Not following: the executable and the libraries the loader maps for it.
    files: Vec<PathBuf>,
    exec: Exec,
}

impl<'c> Plan<'c> {
    fn new(
        command: &'c [OsString],
        opts: &TrackerOptions,
        child: &CommandOptions,
    ) -> Result<Self, TrackerError> {
        opts.validate()?;
        let program = command
            .first()
            .ok_or_else(|| TrackerError::InvalidOption("no command to record".into()))?;
        let exe = resolve(program)?;
        let (creds, user) = Credentials::new(child)?;
        // A script runs its interpreter: probe that (and its libraries), exec the script.
        let image = program_run_by(&exe)?;
        // Following, the tracer resolves each image at its exec stop, with its own environment.
        let files = if child.follow {
            Vec::new()
        } else {
            objects_of(&image, &creds, None)
        };
        let exec = Exec::new(&exe, command, user.as_ref())?;
        Ok(Plan {
            command,
            program,
            image,
            creds,
            user,
            follow: child.follow,
            files,
            exec,
        })
    }

    /// Loads the tracker for the command `pid` (forked, not exec'd yet): following it, or
    /// with its files' probes attached.
    fn attach(&self, pid: u32, opts: &TrackerOptions) -> Result<Tracker, TrackerError> {
        let tracker = if self.follow {
            Tracker::following(pid, opts).and_then(|t| t.follow_process(pid).map(|()| t))
        } else {
            Tracker::attach_files(pid, &self.files, opts)
        };
        tracker.map_err(|e| match e {
            TrackerError::NoAllocatorSymbols { files, .. } => TrackerError::NoAllocatorSymbols {
                program: Some(self.image.clone()),
                files,
            },
            e => e,
        })
    }

    fn command_strings(&self) -> Vec<String> {
        self.command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn metadata(&self, pid: u32) -> Metadata {
        Metadata::now(pid, Backend::Ebpf).with_command(self.command_strings())
    }
}

/// How the command ran.
struct Ran {
    /// The step that failed before or at its exec (then the command never ran), and errno.
    failed: Option<Failed>,
    /// Its wait status.
    status: libc::c_int,
    /// Every process recorded (following), the command's first.
    processes: Vec<ProcessInfo>,
}

/// Following: a tracer thread seizes the command, lets it exec and follows its process tree
/// until it exits; then the command is reaped.
fn run_followed(cmd: &mut Child, tracker: &Tracker, plan: &Plan) -> Result<Ran, TrackerError> {
    let pid = cmd.pid;
    let command_s = plan.command_strings();
    let creds = &plan.creds;
    let resolve = |exe: &Path, env: &[(OsString, OsString)]| objects_of(exe, creds, Some(env));
    let run = std::thread::scope(|s| {
        let (seized_tx, seized_rx) = std::sync::mpsc::channel();
        let resolve = &resolve;
        let image = plan.image.to_string_lossy().into_owned();
        // ptrace answers only the thread that attached: this one seizes and traces.
        let tracer = std::thread::Builder::new()
            .name("memtrack-tracer".into())
            .spawn_scoped(s, move || {
                let seized = seize(pid);
                let ok = seized.is_ok();
                let _ = seized_tx.send(seized);
                ok.then(|| Tracer::new(tracker, resolve, pid, image, command_s).run())
            })
            .map_err(|source| TrackerError::Io {
                what: "starting memtrack's tracer thread".into(),
                source,
            })?;
        match seized_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(TrackerError::Io {
                    what: "starting memtrack's tracer thread".into(),
                    source: std::io::Error::other("it ended before attaching"),
                });
            }
        }
        let failed = cmd.release();
        let traced = tracer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        Ok((failed, traced))
    });
    let (failed, traced) = run?;
    let Some(traced) = traced else {
        unreachable!("the tracer runs once seized")
    };
    // The command is this thread's child: its tracer got its exit status, and it is reaped
    // here (or waited for, if it was detached at a setuid exec).
    let reaped = cmd.wait();
    Ok(Ran {
        failed,
        status: traced.status.or(reaped).unwrap_or(1 << 8),
        processes: traced.processes,
    })
}

/// Not following: lets the command exec and polls for its exit, meanwhile probing libraries
/// it maps later (a dlopen()ed allocator): uprobes attached before exec cover only the files
/// known then.
fn run_unfollowed(cmd: &mut Child, tracker: &Tracker) -> Ran {
    let failed = cmd.release();
    let status = loop {
        match cmd.try_wait() {
            Poll::Exited(status) => break status,
            Poll::Gone => break 0,
            Poll::Running => {}
        }
        // /proc/PID/maps vanishes as the child exits: errors here are not the user's problem.
        let _ = tracker.attach_new_objects();
        std::thread::sleep(RESCAN_PERIOD);
    };
    Ran {
        failed,
        status,
        processes: Vec::new(),
    }
}

/// Finishes the artifact, then reports how the command ended: its exit code, or the failed
/// step that kept it from running.
fn finish<W: Write + Send + 'static>(
    mut recording: super::Recording<'_, W>,
    ran: Ran,
    plan: &Plan,
    pid: u32,
) -> Result<RecordOutcome, TrackerError> {
    recording.set_processes(ran.processes.clone());
    let recorded = recording.stop()?;
    if let Some(failed) = ran.failed {
        return Err(plan.creds.error(plan.program, plan.user.as_ref(), failed));
    }
    let status = ran.status;
    let exit_code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    };
    Ok(RecordOutcome {
        pid,
        exit_code,
        processes: ran.processes,
        recorded,
    })
}
