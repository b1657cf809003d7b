//! Following `record`'s process tree: a ptrace tracer that attaches every new process's
//! probes before it runs an instruction.
//!
//! ```text
//! fork ── SEIZE(first, TRACEFORK|VFORK|CLONE|EXEC|EXITKILL) ── go ──▶ exec stop
//!   new process (fork, vfork, posix_spawn, clone): starts stopped ─▶ follow its pid, probe
//!       the files it maps (its parent's images) ─▶ resume
//!   exec stop (the new image has not run yet) ─▶ credentials changed or a setuid/setgid
//!       program: stop following it (counted), detach; else probe the program and what ld.so
//!       will load for it (`ld.so --list` with its environment: LD_PRELOAD) ─▶ resume
//!   SIGSTOP from ld.so's `_dl_debug_state` probe (si_code SI_KERNEL) ─▶ probe the objects it
//!       just mapped (dlopen) ─▶ suppress the signal, resume
//!   any other signal ─▶ re-injected untouched; group-stops ─▶ PTRACE_LISTEN (job control)
//!   exit ─▶ its exit code; stop recording it
//! ```
//!
//! Uprobes stay pid-scoped: every followed process gets links of its own, so other processes
//! on the machine pay nothing. No per-syscall stops (no `PTRACE_SYSCALL`): a followed process
//! stops only when it forks, execs, gets a signal, or maps objects through ld.so.
//!
//! Side effects a user must know (docs/src/record.md): a followed process is traced, so it cannot be
//! traced by a debugger (or LeakSanitizer, which ptraces) while recorded; `--no-follow` uses no
//! ptrace.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::bpf::mapped_objects;
use super::{Tracker, TrackerError};
use crate::artifact::ProcessInfo;

/// What a tracer found: the first process's wait status, and every process it met.
pub(crate) struct Traced {
    /// The first process's wait status (`None` if it was never seen exiting).
    pub(crate) status: Option<libc::c_int>,
    /// Every process met, in the order they appeared.
    pub(crate) processes: Vec<ProcessInfo>,
}

/// Starts tracing `pid` (a child stopped before its exec) from the calling thread, which must
/// then run [`Tracer::run`]: ptrace requests are accepted only from the thread that attached.
pub(crate) fn seize(pid: u32) -> Result<(), TrackerError> {
    let opts = libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_EXITKILL;
    ptrace(libc::PTRACE_SEIZE, pid, 0, opts as usize).map_err(|source| TrackerError::Ptrace {
        what: format!("following the command (PTRACE_SEIZE of pid {pid})"),
        source,
    })?;
    Ok(())
}

fn ptrace(req: libc::c_uint, pid: u32, addr: usize, data: usize) -> std::io::Result<libc::c_long> {
    // SAFETY: every request used here takes integers or a pointer to a buffer of the size
    // the request writes (`data` then points at such a buffer owned by the caller).
    let r = unsafe {
        libc::ptrace(
            req,
            pid as libc::pid_t,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// One process met while following.
struct Proc {
    info: ProcessInfo,
    /// Its `Uid:` and `Gid:` lines when last seen (fork or exec), to notice a change at exec.
    creds: Option<String>,
    /// Whether it is recorded now (followed and not detached).
    followed: bool,
}

/// How to find the files a new image will map: a closure running `ld.so --list` with the
/// process's environment and credentials (see `record::objects_of`).
pub(crate) type Resolve<'a> =
    dyn Fn(&std::path::Path, &[(OsString, OsString)]) -> Vec<PathBuf> + 'a;

/// A program by (device, inode), and the loader variables of the environment it runs in.
type ResolveKey = (u64, u64, Vec<(OsString, OsString)>);

/// The ptrace side of a following recording; runs on the thread that called [`seize`].
pub(crate) struct Tracer<'a> {
    tracker: &'a Tracker,
    resolve: &'a Resolve<'a>,
    first: u32,
    /// Every process met, in the order they appeared.
    procs: Vec<Proc>,
    /// Pid → its entry in `procs` (the latest process with that pid).
    index: HashMap<u32, usize>,
    /// Thread id → its process (tgid), for every tracee seen.
    tgid_of: HashMap<u32, u32>,
    /// New processes announced by their parent's fork event, not yet seen stopped.
    parent_of: HashMap<u32, u32>,
    /// `ld.so --list` results by (device, inode) of the program and its loader variables.
    resolved: HashMap<ResolveKey, Vec<PathBuf>>,
    status: Option<libc::c_int>,
}

impl<'a> Tracer<'a> {
    /// A tracer of `first` (already [`seize`]d and followed by `tracker`), its command line
    /// `command`.
    pub(crate) fn new(
        tracker: &'a Tracker,
        resolve: &'a Resolve<'a>,
        first: u32,
        exe: String,
        command: Vec<String>,
    ) -> Self {
        let mut t = Tracer {
            tracker,
            resolve,
            first,
            procs: Vec::new(),
            index: HashMap::new(),
            tgid_of: HashMap::new(),
            parent_of: HashMap::new(),
            resolved: HashMap::new(),
            status: None,
        };
        t.tgid_of.insert(first, first);
        t.add(
            first,
            ProcessInfo::new(first, None, exe, command),
            None,
            true,
        );
        t
    }

    fn add(&mut self, pid: u32, info: ProcessInfo, creds: Option<String>, followed: bool) {
        self.index.insert(pid, self.procs.len());
        self.procs.push(Proc {
            info,
            creds,
            followed,
        });
    }

    fn proc_mut(&mut self, pid: u32) -> Option<&mut Proc> {
        let i = *self.index.get(&pid)?;
        self.procs.get_mut(i)
    }

    /// Marks process `pid` not (wholly) recorded, with why; the first reason stays.
    fn uncovered(&mut self, pid: u32, why: String) {
        if let Some(p) = self.proc_mut(pid) {
            p.info.uncovered.get_or_insert(why);
        }
    }

    /// Handles every stop and exit until no tracee is left; returns what it saw.
    pub(crate) fn run(mut self) -> Traced {
        loop {
            let mut status = 0;
            // This thread's tracees and children only (__WNOTHREAD): another thread of this
            // process may trace its own tree (two recordings at once) or wait for its own
            // children, and a stop taken from its tracer is a stop nobody resumes.
            // SAFETY: waiting into a valid int.
            let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::__WNOTHREAD) };
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break; // ECHILD: nothing left to wait for.
            }
            let tid = r as u32;
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.exited(tid, status);
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            if !self.tgid_of.contains_key(&tid) {
                self.appeared(tid);
            }
            let sig = libc::WSTOPSIG(status);
            let resume = match status >> 16 {
                libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                    if let Ok(child) = event_msg(tid) {
                        let parent = self.tgid_of.get(&tid).copied().unwrap_or(tid);
                        self.parent_of.insert(child as u32, parent);
                    }
                    Some(0)
                }
                libc::PTRACE_EVENT_EXEC => self.exec(tid),
                libc::PTRACE_EVENT_STOP => {
                    if matches!(
                        sig,
                        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                    ) {
                        // A group-stop: stay stopped, as without a tracer, until SIGCONT.
                        let _ = ptrace(libc::PTRACE_LISTEN, tid, 0, 0);
                        None
                    } else {
                        Some(0)
                    }
                }
                0 if sig == libc::SIGSTOP && from_kernel(tid) => {
                    // ld.so's hook: objects were mapped (dlopen). Probe them before the
                    // thread goes on to call into them; the signal was only our stop.
                    let pid = self.tgid_of.get(&tid).copied().unwrap_or(tid);
                    self.probe_mapped(pid);
                    Some(0)
                }
                0 => Some(sig),
                _ => Some(0),
            };
            if let Some(sig) = resume {
                // ESRCH: it was killed meanwhile; its exit comes next.
                let _ = ptrace(libc::PTRACE_CONT, tid, 0, sig as usize);
            }
        }
        let processes = self.procs.into_iter().map(|p| p.info).collect();
        Traced {
            status: self.status,
            processes,
        }
    }

    fn exited(&mut self, tid: u32, status: libc::c_int) {
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        };
        if tid == self.first {
            self.status = Some(status);
        }
        let leader = self.tgid_of.remove(&tid).is_none_or(|t| t == tid);
        if !leader {
            return;
        }
        if let Some(p) = self.proc_mut(tid) {
            if p.info.exit_code.is_none() {
                p.info.exit_code = Some(code);
            }
            if p.followed {
                p.followed = false;
                self.tracker.unfollow_process(tid);
            }
        }
    }

    /// A tracee seen for the first time: a new thread of a followed process (nothing to do:
    /// probes are per process), or a new process, which starts stopped: follow it and probe
    /// its images (its parent's) before it runs.
    fn appeared(&mut self, tid: u32) {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        let tgid = field("Tgid:").unwrap_or(tid);
        self.tgid_of.insert(tid, tgid);
        if tgid != tid {
            return;
        }
        let parent = self
            .parent_of
            .remove(&tid)
            .or_else(|| field("PPid:"))
            .filter(|p| self.index.contains_key(p));
        let exe = exe_of(tid);
        let info = ProcessInfo::new(tid, parent, exe, cmdline_of(tid));
        self.add(tid, info, Some(creds_of(&status)), true);
        if let Err(e) = self.tracker.follow_process(tid) {
            self.not_followed(tid, format!("it could not be followed: {e}"));
            return;
        }
        self.probe_mapped(tid);
    }

    /// Probes every ELF object process `pid` has mapped now that it has no probes on yet, and
    /// records its code mappings for its stacks (it is stopped: none of its code runs before).
    fn probe_mapped(&mut self, pid: u32) {
        self.tracker.scan_modules(pid);
        match mapped_objects(pid) {
            Ok(files) => self.attach(pid, &files),
            Err(e) => self.uncovered(pid, format!("its mapped objects could not be read: {e}")),
        }
    }

    fn attach(&mut self, pid: u32, files: &[PathBuf]) {
        match self.tracker.attach_process_files(pid, files) {
            Ok(failed) => {
                if let Some((file, why)) = failed.into_iter().next() {
                    self.uncovered(
                        pid,
                        format!(
                            "the allocator of {} could not be probed: {why}",
                            file.display()
                        ),
                    );
                }
            }
            Err(e) => self.uncovered(pid, format!("its probes could not be attached: {e}")),
        }
    }

    /// Stops recording `pid` (it stays unobserved) and lets it run untraced.
    fn not_followed(&mut self, pid: u32, why: String) {
        self.tracker.unfollow_process(pid);
        if let Some(p) = self.proc_mut(pid) {
            p.followed = false;
            p.info.uncovered.get_or_insert(why);
        }
        let _ = ptrace(libc::PTRACE_DETACH, pid, 0, 0);
    }

    /// The exec stop of `pid` (its thread id after exec): the new image is mapped and has not
    /// run. Returns the signal to resume it with, or `None` if it was detached.
    fn exec(&mut self, pid: u32) -> Option<libc::c_int> {
        let former = event_msg(pid).map_or(pid, |t| t as u32);
        if former != pid {
            // A non-leader thread exec'd and took the leader's id: the links of the process
            // point at the old leader's task, which is gone. Put new ones in their place.
            self.tgid_of.remove(&former);
            if let Err(e) = self.tracker.relink_process(pid) {
                self.uncovered(
                    pid,
                    format!("its probes could not be renewed after exec: {e}"),
                );
            }
        }
        self.tgid_of.insert(pid, pid);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let creds = creds_of(&status);
        let exe = exe_of(pid);
        let command = cmdline_of(pid);
        let image = std::fs::metadata(format!("/proc/{pid}/exe")).ok();
        let setid = image
            .as_ref()
            .is_some_and(|m| m.mode() & (libc::S_ISUID | libc::S_ISGID) != 0);
        let Some(p) = self.proc_mut(pid) else {
            return Some(0);
        };
        let changed = p.creds.as_ref().is_some_and(|c| *c != creds);
        p.creds = Some(creds);
        p.info.exe = exe.clone();
        p.info.command = command;
        if !p.followed {
            return Some(0);
        }
        if setid || changed {
            let why = if setid {
                format!("it executed {exe}, a setuid or setgid program, which is never followed")
            } else {
                format!("its credentials changed when it executed {exe}: not followed")
            };
            self.not_followed(pid, why);
            return None;
        }
        // Its stacks from now on are the new image's (those of the old one were taken before).
        self.tracker.exec_modules(pid);
        let mut files = image.map_or_else(Vec::new, |m| self.image_files(pid, &exe, &m));
        if let Ok(mapped) = mapped_objects(pid) {
            files.extend(mapped);
        }
        self.attach(pid, &files);
        if !self.tracker.any_allocator(&files) {
            self.uncovered(
                pid,
                format!(
                    "no allocator entry point in {exe} or the libraries it loads (statically \
                     linked with a stripped allocator?): its allocations cannot be recorded"
                ),
            );
        }
        Some(0)
    }

    /// What the dynamic loader will map for the program `exe` (`meta`: its metadata, through
    /// /proc/PID/exe) of process `pid`: `ld.so --list` with the process's own environment (LD_PRELOAD, LD_LIBRARY_PATH), cached per
    /// program and loader variables.
    fn image_files(&mut self, pid: u32, exe: &str, meta: &std::fs::Metadata) -> Vec<PathBuf> {
        let env = environ_of(pid);
        let loader_vars: Vec<(OsString, OsString)> = env
            .iter()
            .filter(|(k, _)| {
                let k = k.as_encoded_bytes();
                k.starts_with(b"LD_") || k == b"GLIBC_TUNABLES"
            })
            .cloned()
            .collect();
        let key = (meta.dev(), meta.ino(), loader_vars);
        if let Some(files) = self.resolved.get(&key) {
            return files.clone();
        }
        let files = (self.resolve)(std::path::Path::new(exe), &env);
        self.resolved.insert(key, files.clone());
        files
    }
}

/// `PTRACE_GETEVENTMSG` of a tracee in an event stop.
fn event_msg(tid: u32) -> std::io::Result<libc::c_ulong> {
    let mut msg: libc::c_ulong = 0;
    ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, (&raw mut msg) as usize)?;
    Ok(msg)
}

/// Whether the signal `tid` is stopped with was sent by the kernel (`SI_KERNEL`): the
/// `_dl_debug_state` probe's SIGSTOP. No process can send one (kill and sigqueue set
/// SI_USER or SI_QUEUE), and a seized tracee gets no SIGSTOP of ptrace's own.
fn from_kernel(tid: u32) -> bool {
    // SAFETY: an all-zero siginfo is a valid buffer for PTRACE_GETSIGINFO to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    ptrace(libc::PTRACE_GETSIGINFO, tid, 0, (&raw mut info) as usize).is_ok()
        && info.si_code == libc::SI_KERNEL
}

fn exe_of(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn cmdline_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn environ_of(pid: u32) -> Vec<(OsString, OsString)> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|&b| b == b'=')?;
            Some((
                OsString::from_vec(kv[..eq].to_vec()),
                OsString::from_vec(kv[eq + 1..].to_vec()),
            ))
        })
        .collect()
}

/// The `Uid:` and `Gid:` lines of a /proc status (real, effective, saved, filesystem).
fn creds_of(status: &str) -> String {
    status
        .lines()
        .filter(|l| l.starts_with("Uid:") || l.starts_with("Gid:"))
        .collect::<Vec<_>>()
        .join("\n")
}
