//! Every file the `memtrack` CLI writes, against a local attacker and special files: a
//! symbolic link planted at any name memtrack may use never
//! redirects a write, a device is written in place (its error reported) and never replaced,
//! an existing artifact is replaced only by a finished one, and a failed write to stdout is a
//! one-line error.
//!
//! `harness = false` (memtrack-test-support's runner): the test that plants a link owned by
//! another user needs CAP_CHOWN and without it is reported as ignored with what is missing,
//! never as passed; CI runs it as root and fails if it was not run. Without root the special
//! files test uses the machine's own `/dev/full` and `/dev/null` (another user cannot write
//! /dev), as root copies of them made with `mknod`.

mod common;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{memtrack, s, synth, text};
use memtrack_test_support::{Cap, Need, requires, test};

/// A character device node at `path` with major 1 and `minor` (3: null, 7: full).
fn mknod(path: &Path, minor: u32) -> PathBuf {
    let c = std::ffi::CString::new(s(path)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
    assert_eq!(r, 0, "mknod {}", path.display());
    path.to_path_buf()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Every name in `dir` (for "no debris left behind").
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The names [`plant`] puts links at.
fn plant_names(target: &str) -> Vec<String> {
    let stem = target.split('.').next().unwrap();
    vec![
        format!("{target}.partial"),
        format!("{stem}.partial"),
        format!("{target}.memtrack.partial"),
        format!("{stem}.memtrack.partial"),
    ]
}

/// A victim file and symbolic links to it at every name a writer of `target` has used or
/// might guess: `<target>.partial`, `<stem>.partial`, `<target>.memtrack.partial`.
fn plant(dir: &Path, target: &str) -> (PathBuf, Vec<PathBuf>) {
    let victim = dir.join("victim");
    fs::write(&victim, "precious").unwrap();
    let links: Vec<PathBuf> = plant_names(target).iter().map(|n| dir.join(n)).collect();
    for l in &links {
        let _ = std::os::unix::fs::symlink(&victim, l);
    }
    (victim, links)
}

fn assert_untouched(victim: &Path, links: &[PathBuf]) {
    assert_eq!(fs::read_to_string(victim).unwrap(), "precious");
    for l in links {
        let m = fs::symlink_metadata(l).unwrap();
        assert!(m.file_type().is_symlink(), "{} was replaced", l.display());
    }
}

fn planted_symlinks_at_temporary_names_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // synth.
    let (victim, links) = plant(d, "x.memtrack");
    let out = memtrack(&["synth", "--events", "1000", "-o", s(&d.join("x.memtrack"))]);
    assert!(out.status.success(), "{}", text(&out));
    assert_untouched(&victim, &links);
    let art = fs::symlink_metadata(d.join("x.memtrack")).unwrap();
    assert!(art.is_file(), "the artifact is a regular file, not a link");
    let verify = memtrack(&["verify", s(&d.join("x.memtrack"))]);
    assert!(verify.status.success(), "{}", text(&verify));

    // plot.
    let (victim, links) = plant(d, "heap.svg");
    let out = memtrack(&[
        "plot",
        s(&d.join("x.memtrack")),
        "-o",
        s(&d.join("heap.svg")),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_untouched(&victim, &links);
    assert!(fs::symlink_metadata(d.join("heap.svg")).unwrap().is_file());
    assert!(
        fs::read_to_string(d.join("heap.svg"))
            .unwrap()
            .starts_with("<svg")
    );
    // No temporary file is left behind: the planted links, the victim and the outputs only.
    let mut expected: Vec<String> = ["victim", "x.memtrack", "heap.svg"]
        .iter()
        .map(|n| n.to_string())
        .chain(
            plant_names("x.memtrack")
                .into_iter()
                .chain(plant_names("heap.svg")),
        )
        .collect();
    expected.sort();
    expected.dedup();
    assert_eq!(names(d), expected);
}

/// The user's own link at the target is followed (root's would be too).
fn a_symlink_the_user_owns_at_the_target_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // The user's own link: followed, the link kept, the file it names replaced.
    let own = d.join("latest.memtrack");
    std::os::unix::fs::symlink("real.memtrack", &own).unwrap();
    let out = memtrack(&["synth", "--events", "100", "-o", s(&own)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::symlink_metadata(&own).unwrap().file_type().is_symlink());
    assert!(
        fs::symlink_metadata(d.join("real.memtrack"))
            .unwrap()
            .is_file()
    );
}

/// A link planted by another user (nobody's, which only a process with CAP_CHOWN can make)
/// at the target or on the way to it is refused.
fn a_symlink_another_user_owns_at_the_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let victim = d.join("victim");
    fs::write(&victim, "precious").unwrap();
    // The artifact `plot` reads below.
    synth(&d.join("real.memtrack"), 100, 1);

    // Another user's link (nobody's, as if planted in a shared directory): refused, for the
    // target and for a directory on the way to it.
    let planted = d.join("y.memtrack");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let sub = d.join("sub");
    std::os::unix::fs::symlink(d, &sub).unwrap();
    std::os::unix::fs::lchown(&sub, Some(65534), Some(65534)).unwrap();
    for (args, target) in [
        (vec!["synth", "--events", "100", "-o"], planted.clone()),
        (vec!["synth", "--events", "100", "-o"], sub.join("victim")),
        (
            vec!["plot", s(&d.join("real.memtrack")), "-o"],
            planted.clone(),
        ),
    ] {
        let mut args = args;
        args.push(s(&target));
        let out = memtrack(&args);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {t}");
        assert!(
            t.contains("symbolic link owned by uid 65534") && t.contains("remove it"),
            "{t}"
        );
        assert!(!t.contains("panicked"), "{t}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    }
    assert!(
        fs::symlink_metadata(&planted)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

fn special_files_are_written_in_place_or_refused_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let art = synth(&d.join("a.memtrack"), 1000, 1);

    // As root, copies of /dev/full and /dev/null made with mknod in the scratch directory: a
    // regression must not replace the machine's own devices. Another user cannot write /dev, so there the real devices are safe to use.
    let (full, null) = if is_root() {
        (mknod(&d.join("full"), 7), mknod(&d.join("null"), 3))
    } else {
        (PathBuf::from("/dev/full"), PathBuf::from("/dev/null"))
    };

    // full: every write fails with ENOSPC, reported; the device stays a device.
    for args in [
        vec!["synth", "--events", "1000", "-o", s(&full)],
        vec!["plot", s(&art), "-o", s(&full)],
    ] {
        let out = memtrack(&args);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {t}");
        assert!(t.contains(s(&full)) && t.contains("No space left"), "{t}");
        assert!(!t.contains("panicked"), "{t}");
    }
    assert!(fs::metadata(&full).unwrap().file_type().is_char_device());

    // null: written in place, exit 0.
    let out = memtrack(&["synth", "--events", "1000", "-o", s(&null)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::metadata(&null).unwrap().file_type().is_char_device());

    // A FIFO: written in place; what the reader gets is the whole artifact.
    let fifo = d.join("pipe");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            fs::File::open(fifo)
                .unwrap()
                .read_to_end(&mut bytes)
                .unwrap();
            bytes
        })
    };
    let out = memtrack(&["synth", "--events", "1000", "-o", s(&fifo)]);
    assert!(out.status.success(), "{}", text(&out));
    let bytes = reader.join().unwrap();
    let r = memtrack::artifact::Reader::from_bytes(bytes).unwrap();
    assert_eq!(
        r.completeness(),
        &memtrack::artifact::Completeness::Complete
    );
    assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());

    // A directory is refused with the reason.
    let out = memtrack(&["synth", "--events", "10", "-o", s(d)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("is a directory"), "{}", text(&out));
    assert!(fs::metadata(d).unwrap().is_dir());
}

fn record_leaves_an_existing_artifact_whole_when_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = synth(&d.join("old.memtrack"), 1000, 1);
    let before = fs::read(&old).unwrap();
    let before_names = names(d);
    // Each fails before recording anything, privileged or not.
    for (args, expect, code) in [
        (
            vec![
                "record",
                "--ringbuf-mib",
                "3",
                "-o",
                s(&old),
                "--",
                "/bin/true",
            ],
            "power of two",
            2,
        ),
        (
            vec!["record", "-o", s(&old), "--", "/nonexistent/cmd"],
            "command not found",
            127,
        ),
    ] {
        let out = memtrack(&args);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {t}");
        assert!(t.contains(expect), "{t}");
        assert_eq!(
            fs::read(&old).unwrap(),
            before,
            "{args:?} changed the artifact"
        );
        assert_eq!(names(d), before_names, "{args:?} left a file behind");
    }

    // `-o ./prog -- ./prog`: refused; the program is not touched.
    let prog = d.join("prog");
    fs::copy("/bin/true", &prog).unwrap();
    let size = fs::metadata(&prog).unwrap().size();
    let out = memtrack(&["record", "-o", s(&prog), "--", s(&prog)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("is the program being recorded"),
        "{}",
        text(&out)
    );
    assert_eq!(fs::metadata(&prog).unwrap().size(), size);
}

fn failed_writes_to_stdout_are_errors_and_a_closed_pipe_is_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let art = synth(&dir.path().join("a.memtrack"), 1000, 1);
    let full = || {
        fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    for (args, code) in [
        (vec!["show", s(&art)], 1),
        (vec!["show", "--json", s(&art)], 1),
        (vec!["verify", s(&art)], 1),
        (vec!["compare", s(&art), s(&art)], 2),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_memtrack"))
            .args(&args)
            .stdout(full())
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {e}");
        assert_eq!(
            e.trim_end(),
            "memtrack: error: writing to standard output: No space left on device (os error 28)",
            "{args:?}"
        );
    }

    // A reader that is gone (`| head` after its lines): ended by SIGPIPE, nothing on stderr.
    let mut child = Command::new(env!("CARGO_BIN_EXE_memtrack"))
        .args(["show", "--threads", s(&art)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    memtrack_test_support::run(vec![
        test(
            "planted_symlinks_at_temporary_names_change_nothing",
            planted_symlinks_at_temporary_names_change_nothing,
        ),
        test(
            "a_symlink_the_user_owns_at_the_target_is_followed",
            a_symlink_the_user_owns_at_the_target_is_followed,
        ),
        requires(
            "a_symlink_another_user_owns_at_the_target_is_refused",
            &[Need::Caps(&[Cap::Chown])],
            a_symlink_another_user_owns_at_the_target_is_refused,
        ),
        test(
            "special_files_are_written_in_place_or_refused_never_replaced",
            special_files_are_written_in_place_or_refused_never_replaced,
        ),
        test(
            "record_leaves_an_existing_artifact_whole_when_it_fails",
            record_leaves_an_existing_artifact_whole_when_it_fails,
        ),
        test(
            "failed_writes_to_stdout_are_errors_and_a_closed_pipe_is_quiet",
            failed_writes_to_stdout_are_errors_and_a_closed_pipe_is_quiet,
        ),
    ]);
}
