//! `memtrack record -- CMD`: run a command with the tracker attached from its first
//! instruction.
//!
//! The child is forked and waits on a pipe before `execve`; the parent attaches the uprobes
//! (for the child's pid) to the command's executable and every library the dynamic loader
//! will map for it, switches recording on, and only then lets the child exec. Uprobes follow
//! the file, so libraries mapped after exec (and libc under a `dlopen`ed library) are covered;
//! a `dlopen`ed library with its own allocator is found by rescanning /proc/PID/maps every
//! 20 ms while the command runs (its calls before that are missed).

use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{Recorded, Tracker, TrackerError, TrackerOptions};
use crate::artifact::{Backend, Metadata};
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
}

/// `program` as `execvp` would find it.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |c: &Path| {
        std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let p = Path::new(program);
    if program.as_bytes().contains(&b'/') {
        return runnable(p).then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| runnable(c))
}

/// The executable and every library the dynamic loader maps for it (`ld.so --list`); just
/// the executable if it is static.
fn objects_of(exe: &Path) -> Vec<PathBuf> {
    let mut files = vec![exe.to_path_buf()];
    let loader = Path::new("/lib64/ld-linux-x86-64.so.2");
    let Ok(out) = std::process::Command::new(loader)
        .arg("--list")
        .arg(exe)
        .output()
    else {
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

fn pipe() -> Result<[libc::c_int; 2], TrackerError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(TrackerError::Io {
            what: "creating a pipe".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(fds)
}

fn close(fd: libc::c_int) {
    // SAFETY: closing a descriptor this module created and owns.
    unsafe { libc::close(fd) };
}

/// Runs `command` (program and arguments) with allocation tracking, writing the artifact to
/// `out`; returns once it has exited and the artifact is complete.
pub fn record_command(
    command: &[OsString],
    out: impl Write + Send + 'static,
    opts: &TrackerOptions,
) -> crate::Result<RecordOutcome> {
    let program = command
        .first()
        .ok_or_else(|| TrackerError::InvalidOption("no command to record".into()))?;
    let spawn_err = |source| TrackerError::Spawn {
        command: program.to_string_lossy().into_owned(),
        source,
    };
    let exe = resolve(program)
        .ok_or_else(|| spawn_err(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
    let files = objects_of(&exe);

    // Everything the child needs is prepared before fork: after it, only async-signal-safe
    // calls (read, execve, write, _exit) are allowed.
    let path_c = cstring(exe.as_os_str())?;
    let args_c = command
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<Vec<_>, _>>()?;
    let env_c = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut argv: Vec<*const libc::c_char> = args_c.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    let go = pipe()?;
    let err = pipe()?;

    // SAFETY: the child only calls async-signal-safe functions on memory prepared above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(spawn_err(std::io::Error::last_os_error()).into());
    }
    if pid == 0 {
        // SAFETY: child side; see above. `argv`/`envp` are NULL-terminated arrays of valid
        // C strings that outlive the call.
        unsafe {
            let mut b = 0u8;
            loop {
                let n = libc::read(go[0], (&raw mut b).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 || *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
            }
            libc::execve(path_c.as_ptr(), argv.as_ptr(), envp.as_ptr());
            let e = *libc::__errno_location();
            libc::write(err[1], (&raw const e).cast(), size_of::<libc::c_int>());
            libc::_exit(127);
        }
    }
    let pid = pid as u32;
    close(go[0]);
    close(err[1]);
    let kill_child = || {
        // SAFETY: `pid` is our child; reaping it avoids a zombie.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
        close(go[1]);
        close(err[0]);
    };

    let tracker = match Tracker::attach_files(pid, &files, opts) {
        Ok(t) => t,
        Err(e) => {
            kill_child();
            return Err(e.into());
        }
    };
    let meta = Metadata::now(pid, Backend::Ebpf).with_command(
        command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    );
    let recording = match tracker.start(out, &meta, EncoderOptions::new(), default_workers()) {
        Ok(r) => r,
        Err(e) => {
            kill_child();
            return Err(e);
        }
    };

    // Let the child exec, and learn whether execve failed.
    // SAFETY: writing one byte from a valid buffer to our pipe, then closing our end.
    unsafe { libc::write(go[1], [1u8].as_ptr().cast(), 1) };
    close(go[1]);
    let mut errno: libc::c_int = 0;
    // SAFETY: reading at most size_of::<c_int>() bytes into `errno`.
    let n = unsafe { libc::read(err[0], (&raw mut errno).cast(), size_of::<libc::c_int>()) };
    close(err[0]);

    // Ctrl-C reaches the whole foreground group: let the command handle it and finish the
    // artifact once it exits (the child execs before this, so it keeps the default).
    // SAFETY: changing this process's SIGINT disposition; restored below.
    let old_int = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    // Wait for the child; meanwhile probe libraries it maps later (a dlopen()ed allocator):
    // uprobes attached before exec cover only the files known then.
    let mut status = 0;
    loop {
        // SAFETY: polling our own child into a valid int.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
        if r == pid as libc::pid_t
            || (r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
        {
            break;
        }
        // /proc/PID/maps vanishes as the child exits: errors here are not the user's problem.
        let _ = tracker.attach_new_objects();
        std::thread::sleep(RESCAN_PERIOD);
    }
    // SAFETY: restoring the disposition saved above.
    unsafe { libc::signal(libc::SIGINT, old_int) };
    let recorded = recording.stop()?;
    drop(tracker);
    if n == size_of::<libc::c_int>() as isize {
        return Err(spawn_err(std::io::Error::from_raw_os_error(errno)).into());
    }
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
        recorded,
    })
}
