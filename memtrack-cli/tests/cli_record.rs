//! `memtrack record -- CMD` end to end: exit code forwarded, summary line, errors with fixes.
//!
//! `harness = false` (memtrack-test-support's runner): a test that needs the tracker (CAP_BPF +
//! CAP_PERFMON), a compiler or another user is reported as ignored with what is missing, never
//! as passed; CI runs them as root and fails if one was not run.

use std::path::Path;
use std::process::Command;

use memtrack_test_support::{Cap, Need, TRACKER, requires, test};

fn memtrack() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memtrack"))
}

fn record_forwards_exit_code_and_prints_summary() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("alloc");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/alloc.c");
    assert!(
        Command::new("cc")
            .arg("-O1")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .status()
            .unwrap()
            .success()
    );
    let out_file = dir.path().join("out.memtrack");

    // `exit` mode: two marker pairs and one last malloc(4242), then _exit(7).
    let out = memtrack()
        .arg("record")
        .arg("-o")
        .arg(&out_file)
        .arg("--")
        .arg(&exe)
        .arg("exit")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("memtrack: 3 allocations"), "{stderr}");
    assert!(
        stderr.contains("still live at the end: 1 block ("),
        "{stderr}"
    );
    // The fixture is built with -O1, which omits frame pointers: its three allocations' stacks
    // stop at their call sites, and one line after the summary says so and how to fix it.
    assert!(stderr.contains("; 0 events lost -> "), "{stderr}");
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("stop early"))
        .collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(
        notes[0].starts_with("memtrack: 3 of 3 allocations (100.0 %) have call stacks")
            && notes[0].contains("-fno-omit-frame-pointer"),
        "{stderr}"
    );
    assert!(stderr.contains(&out_file.display().to_string()), "{stderr}");
    let verify = memtrack().arg("verify").arg(&out_file).output().unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );

    // A ring buffer size that is not a power of two is refused with the valid range.
    let bad = memtrack()
        .args(["record", "--ringbuf-mib", "3", "-o"])
        .arg(&out_file)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("power of two"));

    // A missing command is not found (127), not a tracker error.
    let missing = memtrack()
        .args(["record", "-o"])
        .arg(&out_file)
        .args(["--", "/nonexistent/cmd"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("command not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );

    // Without privileges: the error names the capabilities and the fix.
    if Command::new("setpriv").arg("--version").output().is_ok() {
        let unpriv = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_memtrack"))
            .args(["record", "-o", "/dev/null", "--", "/bin/true"])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&unpriv.stderr);
        assert_eq!(unpriv.status.code(), Some(125), "{e}");
        assert!(
            e.contains("CAP_BPF") && e.contains("CAP_PERFMON") && e.contains("setcap"),
            "{e}"
        );
    }
}

/// `record`'s own failures never look like the command's exit code: 127 not
/// found, 126 not executable (a file without x, a directory), 2 a bad option value (in the unit
/// typed), as shells and `timeout` report them. Needs no privileges: all fail before loading.
fn record_exit_codes_tell_its_failures_from_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plain = d.join("plain");
    std::fs::write(&plain, "#!/bin/sh\ntrue\n").unwrap();
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out_file = d.join("o.memtrack");
    let run = |args: &[&std::ffi::OsStr]| {
        let o = memtrack()
            .args(["record", "-o"])
            .arg(&out_file)
            .args(args)
            .env("PATH", d)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    for (args, code, expect) in [
        (
            vec![os("--"), os("no-such-command-here")],
            127,
            "command not found: \"no-such-command-here\" is in no directory of PATH",
        ),
        (
            vec![os("--"), os("/nonexistent/cmd")],
            127,
            "command not found: \"/nonexistent/cmd\" does not exist",
        ),
        (
            vec![os("--"), plain.as_os_str()],
            126,
            "it is not executable (no execute permission)",
        ),
        // Found in PATH but not executable: 126, as execvp reports EACCES.
        (vec![os("--"), os("plain")], 126, "it is not executable"),
        (vec![os("--"), sub.as_os_str()], 126, "it is a directory"),
        (
            vec![os("--ringbuf-mib"), os("0"), os("--"), os("true")],
            2,
            "expected a power of two from 1 to 1024 (MiB), got \"0\"",
        ),
        (
            vec![os("--ringbuf-mib"), os("3"), os("--"), os("true")],
            2,
            "got \"3\"",
        ),
        (
            vec![
                os("--ringbuf-mib"),
                os("99999999999999"),
                os("--"),
                os("true"),
            ],
            2,
            "got \"99999999999999\"",
        ),
    ] {
        let (got, err) = run(&args);
        assert_eq!(got, Some(code), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(
            !err.contains("entity not found") && !err.contains("bytes"),
            "{err}"
        );
    }
    assert!(!out_file.exists());
}

/// The default pipeline's resident memory stays small: the ring buffer's pages are mapped
/// twice, all resident, so its default is sized from the measured event rate
/// (docs/src/record.md, "Memory").
// The child is reaped by wait4 (for its rusage), which clippy does not see.
#[allow(clippy::zombie_processes)]
fn default_record_stays_under_64_mib_resident() {
    let dir = tempfile::tempdir().unwrap();
    let child = memtrack()
        .arg("record")
        .arg("-o")
        .arg(dir.path().join("true.memtrack"))
        .arg("--")
        .arg("/bin/true")
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child into valid pointers.
    let r = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as libc::pid_t);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    // ru_maxrss is in KiB.
    let kib = usage.ru_maxrss;
    assert!(
        kib <= 64 * 1024,
        "memtrack record -- /bin/true: {kib} KiB resident"
    );
}

fn main() {
    memtrack_test_support::run(vec![
        // The fixture is compiled with `cc`; the unprivileged part runs memtrack as nobody.
        requires(
            "record_forwards_exit_code_and_prints_summary",
            &[
                TRACKER,
                Need::Tool("cc"),
                Need::Tool("setpriv"),
                Need::Caps(&[Cap::Setuid, Cap::Setgid]),
            ],
            record_forwards_exit_code_and_prints_summary,
        ),
        test(
            "record_exit_codes_tell_its_failures_from_the_commands",
            record_exit_codes_tell_its_failures_from_the_commands,
        ),
        requires(
            "default_record_stays_under_64_mib_resident",
            &[TRACKER],
            default_record_stays_under_64_mib_resident,
        ),
    ]);
}
