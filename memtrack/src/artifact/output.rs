//! Creating output files safely: every file memtrack writes (artifacts of `synth`, `record` and
//! sessions, `plot`'s SVG) goes through [`Output`].
//!
//! memtrack often runs as root and writes into shared directories (`/tmp`, a shared
//! `$MEMTRACK_DIR`), so a name in the target's directory may have been planted by another user.
//! The rules:
//!
//! - A regular file (or a name that does not exist yet) is written through a temporary file
//!   beside it, `<name>.<6 random characters>.partial`, created with `O_CREAT | O_EXCL` (which
//!   never follows a symbolic link) and the mode `0666` minus the umask, and renamed over the
//!   target by [`Output::commit`] once it is complete and synced. Until then the target is
//!   untouched; an error removes the temporary file. A process that dies while writing (a
//!   crash, `SIGKILL`, `process::exit` in a session) leaves the temporary file: every complete
//!   frame in it is readable (`memtrack show` recovers it).
//! - A symbolic link at the target is followed only if it is owned by the effective user or by
//!   root (a link planted by someone else is refused: following it would let them choose which
//!   file a root memtrack replaces). The file it leads to follows the same rules. So does
//!   every directory on the way to the target: a link there owned by another user is refused
//!   too (the kernel's `fs.protected_symlinks` catches some of these, but it is 0 on some
//!   machines, the CI machines included).
//! - A character device (`/dev/null`, `/dev/full`) or a FIFO, owned by the effective user or by
//!   root and with a single name (a hard link to `/dev/mem` planted in `/tmp` has two), is
//!   written in place: it is never replaced, and its write errors are reported (`ENOSPC` on
//!   `/dev/full`). A path through `/proc` (`/dev/stdout` is `/proc/self/fd/1`) is written in
//!   place too, whatever it leads to.
//! - Directories, sockets, block devices, and special files owned by another user or with
//!   several names are refused with a message naming the file and the fix.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// Links followed before giving up (the kernel's own limit is 40).
const MAX_SYMLINKS: usize = 40;

/// Why an output file could not be created or put in place.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The target (or a link on the way to it) is a symbolic link owned by another user.
    #[error(
        "refusing to write {path}: it is a symbolic link owned by uid {owner}, neither you nor \
         root, and memtrack does not follow such links (another user may have planted it to \
         choose which file is replaced); remove it, or name the file it points to"
    )]
    UntrustedSymlink {
        /// The link.
        path: PathBuf,
        /// Its owner.
        owner: u32,
    },
    /// More than 40 symbolic links lead from the path to a file.
    #[error("refusing to write {path}: more than {MAX_SYMLINKS} symbolic links to follow")]
    TooManySymlinks {
        /// The path as given.
        path: PathBuf,
    },
    /// The target is a kind of file memtrack does not write to.
    #[error(
        "refusing to write {path}: it is a {kind}; memtrack writes regular files (replaced \
         atomically), and character devices or FIFOs (written in place): choose a file name"
    )]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What it is: "directory", "socket", "block device".
        kind: &'static str,
    },
    /// A directory to write into is something else (a regular file).
    #[error("{path} is not a directory: name a directory, or a name that does not exist yet")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The target is a character device or FIFO owned by another user, or with several names
    /// (hard links).
    #[error(
        "refusing to write {path}: it is a {kind} owned by uid {owner} with {links} name(s); \
         memtrack writes in place only to one owned by you or root with a single name \
         (another user may have planted it, to read what memtrack writes or to pick the device \
         it goes to); remove it or choose another name"
    )]
    UntrustedSpecial {
        /// The file.
        path: PathBuf,
        /// "character device" or "FIFO".
        kind: &'static str,
        /// Its owner.
        owner: u32,
        /// Its number of hard links.
        links: u64,
    },
    /// An I/O operation on the target or its temporary file failed.
    #[error("cannot write {path}: {what}: {source}")]
    Io {
        /// The target.
        path: PathBuf,
        /// What was being done, e.g. "creating a temporary file in /tmp".
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// [`Output::commit_new`] found a file at the target; the finished file is kept.
    #[error(
        "{path} exists, and this output may not replace it; the finished file is kept at {partial}"
    )]
    Exists {
        /// The target.
        path: PathBuf,
        /// Where the finished file is.
        partial: PathBuf,
    },
    /// The finished file could not be renamed over the target; it is kept.
    #[error("cannot rename {partial} to {path}: {source}; the finished file is kept at {partial}")]
    Persist {
        /// The target.
        path: PathBuf,
        /// Where the finished file is.
        partial: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Where the bytes go until [`Output::commit`].
#[derive(Debug)]
enum Dest {
    /// A temporary file beside the target, renamed over it by `commit`.
    Temp(NamedTempFile),
    /// A character device, a FIFO or a `/proc` path, written in place.
    InPlace(File),
}

/// An output file being written; see the module docs for the rules. Get a handle with
/// [`Output::writer`], write the whole file through it, then call [`Output::commit`]. Dropping
/// an `Output` without committing removes its temporary file and leaves the target untouched.
#[derive(Debug)]
pub struct Output {
    /// The file the bytes end up in (the requested path, or the file its links lead to).
    target: PathBuf,
    dest: Dest,
}

fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether something owned by `owner` may be trusted by this process: it is ours, or root's.
fn trusted(owner: u32) -> bool {
    owner == 0 || owner == geteuid()
}

/// The directory `path` is in ("." for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Refuses a symbolic link owned by another user among the directories leading to `path`
/// (each component is examined where the kernel's resolution of the ones before it leads).
fn check_directories(path: &Path) -> Result<(), OutputError> {
    let mut dir = PathBuf::new();
    for component in parent(path).components() {
        dir.push(component);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() && !trusted(m.uid()) => {
                return Err(OutputError::UntrustedSymlink {
                    path: dir,
                    owner: m.uid(),
                });
            }
            // A missing directory is reported when the temporary file cannot be created.
            _ => {}
        }
    }
    Ok(())
}

/// Follows trusted symbolic links from `path`: the path of the file they lead to and its
/// metadata (`None` if it does not exist), or `(path, None)` with `in_place` for `/proc` paths.
fn resolve(path: &Path) -> Result<(PathBuf, Option<std::fs::Metadata>, bool), OutputError> {
    let mut p = path.to_path_buf();
    for _ in 0..=MAX_SYMLINKS {
        // `/proc/self/fd/N` and friends are "magic" links whose text (`pipe:[123]`) is not a
        // path: only the kernel can follow them.
        if p.starts_with("/proc") {
            return Ok((p, None, true));
        }
        check_directories(&p)?;
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((p, None, false)),
            Err(e) => return Err(io_err(&p, "inspecting it", e)),
        };
        if !meta.file_type().is_symlink() {
            return Ok((p, Some(meta), false));
        }
        if !trusted(meta.uid()) {
            return Err(OutputError::UntrustedSymlink {
                path: p,
                owner: meta.uid(),
            });
        }
        let dest = std::fs::read_link(&p).map_err(|e| io_err(&p, "reading the link", e))?;
        p = parent(&p).join(dest);
    }
    Err(OutputError::TooManySymlinks {
        path: path.to_path_buf(),
    })
}

fn io_err(path: &Path, what: impl Into<String>, source: io::Error) -> OutputError {
    OutputError::Io {
        path: path.to_path_buf(),
        what: what.into(),
        source,
    }
}

/// Opens a `/proc` path for writing, which only the kernel can resolve; a directory is refused.
fn open_proc(target: &Path) -> Result<File, OutputError> {
    let file = OpenOptions::new()
        .write(true)
        .open(target)
        .map_err(|e| io_err(target, "opening it", e))?;
    let meta = file
        .metadata()
        .map_err(|e| io_err(target, "inspecting it", e))?;
    if meta.is_dir() {
        return Err(OutputError::Unsupported {
            path: target.to_path_buf(),
            kind: "directory",
        });
    }
    Ok(file)
}

/// Opens an existing file that is not a regular one, `meta` its metadata: only a trusted
/// character device or FIFO with one link, written in place.
fn open_special(target: &Path, meta: &std::fs::Metadata) -> Result<File, OutputError> {
    let ft = meta.file_type();
    let kind = if ft.is_char_device() {
        "character device"
    } else if ft.is_fifo() {
        "FIFO"
    } else {
        let kind = if ft.is_dir() {
            "directory"
        } else if ft.is_block_device() {
            "block device"
        } else if ft.is_socket() {
            "socket"
        } else {
            "special file"
        };
        return Err(OutputError::Unsupported {
            path: target.to_path_buf(),
            kind,
        });
    };
    if !trusted(meta.uid()) || meta.nlink() != 1 {
        return Err(OutputError::UntrustedSpecial {
            path: target.to_path_buf(),
            kind,
            owner: meta.uid(),
            links: meta.nlink(),
        });
    }
    // No O_CREAT: never create a file here; O_NOFOLLOW: the name was not swapped for a
    // link since it was inspected. A FIFO's open waits for a reader, as `>` does.
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(|e| io_err(target, "opening it", e))?;
    let now = file
        .metadata()
        .map_err(|e| io_err(target, "inspecting it", e))?;
    if (now.dev(), now.ino()) != (meta.dev(), meta.ino()) {
        return Err(io_err(
            target,
            "opening it",
            io::Error::other("it was replaced while being opened"),
        ));
    }
    Ok(file)
}

/// A temporary file beside `target` (a regular file or a new name), to be renamed over it.
fn temp_beside(target: &Path) -> Result<NamedTempFile, OutputError> {
    let dir = parent(target);
    let name = target.file_name().ok_or_else(|| OutputError::Unsupported {
        path: target.to_path_buf(),
        kind: "directory",
    })?;
    let mut prefix = name.to_os_string();
    prefix.push(".");
    tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".partial")
        .rand_bytes(6)
        // The mode a plain `File::create` gives: 0666 minus the umask.
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| {
            io_err(
                target,
                format!("creating a temporary file in {}", dir.display()),
                e,
            )
        })
}

/// Creates the directory `path` and the missing ones on the way (mode `0777` minus the umask)
/// under the rules of the module docs: a symbolic link on the way, `path` itself included, is
/// followed only if owned by the effective user or root. For the directories memtrack writes
/// into and clears (`memtrack bench`'s `--out`, its build-id store).
///
/// # Errors
///
/// [`OutputError::UntrustedSymlink`] for another user's link on the way,
/// [`OutputError::NotADirectory`] when `path` is something other than a directory, and
/// [`OutputError::Io`] when a directory cannot be made.
pub fn create_dir_all(path: &Path) -> Result<(), OutputError> {
    // Every component of `path`, the last included, is a directory on the way to `path/_`.
    check_directories(&path.join("_"))?;
    if !std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        // `create_dir_all` fails with "File exists" on a file: say what it is instead.
        let made = std::fs::create_dir_all(path);
        if let (Err(e), false) = (made, path.exists()) {
            return Err(io_err(path, "creating the directory", e));
        }
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(OutputError::NotADirectory {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(io_err(path, "inspecting it", e)),
    }
}

impl Output {
    /// Prepares to write `path`: a temporary file beside a regular file (or a new name), or
    /// the file itself for a character device or FIFO. Fails, touching nothing, if the target
    /// is refused by the rules of the module docs or the temporary file cannot be created.
    pub fn create(path: impl AsRef<Path>) -> Result<Output, OutputError> {
        let (target, meta, proc_path) = resolve(path.as_ref())?;
        let dest = match &meta {
            _ if proc_path => Dest::InPlace(open_proc(&target)?),
            Some(meta) if !meta.is_file() => Dest::InPlace(open_special(&target, meta)?),
            _ => Dest::Temp(temp_beside(&target)?),
        };
        Ok(Output { target, dest })
    }

    /// The file the output ends up in: the requested path, or the file its links lead to.
    pub fn path(&self) -> &Path {
        &self.target
    }

    /// Where the bytes are while being written: the temporary file (`None` when the target is
    /// written in place). A process that dies before [`Output::commit`] leaves this file.
    pub fn partial_path(&self) -> Option<&Path> {
        match &self.dest {
            Dest::Temp(t) => Some(t.path()),
            Dest::InPlace(_) => None,
        }
    }

    /// A handle to write the output through (a duplicate of the open file: the writer may own
    /// it and move it to another thread).
    pub fn writer(&self) -> Result<File, OutputError> {
        let file = match &self.dest {
            Dest::Temp(t) => t.as_file(),
            Dest::InPlace(f) => f,
        };
        file.try_clone().map_err(|e| OutputError::Io {
            path: self.target.clone(),
            what: "duplicating its file descriptor".into(),
            source: e,
        })
    }

    /// Keeps the temporary file where it is, under its own name, instead of removing it when
    /// dropped: for a finished output that cannot be put in place. Returns its path (the
    /// target's for an output written in place).
    pub fn keep(self) -> PathBuf {
        match self.dest {
            Dest::Temp(t) => match t.keep() {
                Ok((_, path)) => path,
                Err(e) => e.file.path().to_path_buf(),
            },
            Dest::InPlace(_) => self.target,
        }
    }

    /// [`Output::commit`], except that a file at the target is never replaced: then the
    /// finished file is kept under its temporary name and [`OutputError::Exists`] names both.
    /// An output written in place is done already.
    pub fn commit_new(self) -> Result<PathBuf, OutputError> {
        self.put(false)
    }

    /// Puts the finished output in place: syncs the temporary file to disk and renames it over
    /// the target (a reader sees the old file or the new one, never a part). Returns the
    /// target's path. If the rename fails, the finished file is kept and the error names it.
    pub fn commit(self) -> Result<PathBuf, OutputError> {
        self.put(true)
    }

    /// Syncs the temporary file and renames it to the target, over a file there if `replace`.
    fn put(self, replace: bool) -> Result<PathBuf, OutputError> {
        let temp = match self.dest {
            Dest::Temp(t) => t,
            Dest::InPlace(_) => return Ok(self.target),
        };
        temp.as_file().sync_all().map_err(|e| OutputError::Io {
            path: self.target.clone(),
            what: format!("syncing {}", temp.path().display()),
            source: e,
        })?;
        let persisted = if replace {
            temp.persist(&self.target)
        } else {
            temp.persist_noclobber(&self.target)
        };
        match persisted {
            Ok(_) => Ok(self.target),
            Err(e) => {
                let exists = !replace && e.error.kind() == io::ErrorKind::AlreadyExists;
                let source = e.error;
                let partial = match e.file.keep() {
                    Ok((_, p)) => p,
                    Err(k) => k.file.path().to_path_buf(),
                };
                if exists {
                    Err(OutputError::Exists {
                        path: self.target,
                        partial,
                    })
                } else {
                    Err(OutputError::Persist {
                        path: self.target,
                        partial,
                        source,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn read(p: &Path) -> String {
        let mut s = String::new();
        File::open(p).unwrap().read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn target_is_untouched_until_commit_and_temp_is_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.memtrack");
        std::fs::write(&target, "old").unwrap();
        let out = Output::create(&target).unwrap();
        let partial = out.partial_path().unwrap().to_path_buf();
        assert_eq!(partial.parent(), Some(dir.path()));
        let name = partial.file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("x.memtrack.") && name.ends_with(".partial") && name.len() == 25,
            "{name}"
        );
        out.writer().unwrap().write_all(b"new").unwrap();
        assert_eq!(read(&target), "old");
        assert_eq!(out.commit().unwrap(), target);
        assert_eq!(read(&target), "new");
        assert!(!partial.exists());
    }

    #[test]
    fn dropping_without_commit_removes_the_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x");
        let out = Output::create(&target).unwrap();
        let partial = out.partial_path().unwrap().to_path_buf();
        assert!(partial.exists());
        drop(out);
        assert!(!partial.exists() && !target.exists());
    }

    #[test]
    fn new_files_get_the_umask_mode() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x");
        // The umask is process-wide: read it back by setting it to itself.
        // SAFETY: umask has no preconditions.
        let mask = unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        };
        Output::create(&target).unwrap().commit().unwrap();
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !mask);
    }

    #[test]
    fn own_symlinks_are_followed_and_the_link_kept() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.memtrack");
        let link = dir.path().join("latest.memtrack");
        std::os::unix::fs::symlink("real.memtrack", &link).unwrap();
        let out = Output::create(&link).unwrap();
        assert_eq!(out.path(), real);
        out.writer().unwrap().write_all(b"data").unwrap();
        out.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(read(&real), "data");
    }

    #[test]
    fn create_dir_all_makes_directories_through_own_links_only_into_directories() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        create_dir_all(&d.path().join("link/a/b")).unwrap();
        assert!(real.join("a/b").is_dir());
        create_dir_all(&real.join("a")).unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, "x").unwrap();
        match create_dir_all(&file) {
            Err(OutputError::NotADirectory { path }) => assert_eq!(path, file),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    }

    #[test]
    fn directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = Output::create(dir.path()).unwrap_err();
        assert!(
            matches!(
                e,
                OutputError::Unsupported {
                    kind: "directory",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_null_device_is_written_in_place() {
        // As root, a copy made with mknod: a regression must not replace the machine's own.
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let null = if unsafe { libc::geteuid() } == 0 {
            let p = dir.path().join("null");
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path; (1, 3) is /dev/null's device number.
            let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
            assert_eq!(r, 0);
            p
        } else {
            PathBuf::from("/dev/null")
        };
        let out = Output::create(&null).unwrap();
        assert!(out.partial_path().is_none());
        out.writer().unwrap().write_all(b"x").unwrap();
        out.commit().unwrap();
        assert!(
            std::fs::metadata(&null)
                .unwrap()
                .file_type()
                .is_char_device()
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            usize::from(null.starts_with(dir.path()))
        );
    }
}
