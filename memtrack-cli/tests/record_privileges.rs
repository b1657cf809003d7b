//! `memtrack record` as a privilege boundary: the command never gains privileges
//! through memtrack, whether memtrack holds capabilities from file capabilities or ambient
//! ones, or runs as root (then the command runs as root unless `--user` says otherwise); with
//! file capabilities, run by a user, memtrack follows the command's whole tree; a setuid
//! program the command starts gains nothing and is not followed; a planted symlink never
//! redirects the artifact; a setuid install of memtrack is refused.
//!
//! The command under test prints its own `/proc/self/status` lines (it is `grep`), so the
//! capability sets checked are the recorded process's own.
//!
//! `harness = false` (memtrack-test-support's runner): each test declares what it needs (root,
//! the tracker's CAP_BPF + CAP_PERFMON, the capabilities to switch users or give files away,
//! `setcap`/`setpriv`), and without it is reported as ignored with what is missing, never as
//! passed; CI runs them as root and fails if one was not run.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{s, text};
use memtrack_test_support::{Cap, Need, TRACKER, requires};

const STATUS: &str = "^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs):";
/// CAP_PERFMON (38) and CAP_BPF (39).
const BPF_CAPS: u64 = (1 << 38) | (1 << 39);

/// The `Key: value` lines of a `/proc/PID/status` excerpt.
fn status(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn caps(st: &BTreeMap<String, String>, key: &str) -> u64 {
    u64::from_str_radix(&st[key], 16).unwrap_or_else(|_| panic!("{key} in {st:?}"))
}

/// A scratch directory every user can enter and write (the unprivileged runs write there).
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Runs commands that execute freshly copied binaries. Another test thread that forks while
/// a copy's file is still open for writing holds it open until its child execs, and an exec of
/// the copy in that window fails with ETXTBSY ("Text file busy"): try again, a few times.
trait RunExec {
    fn run_exec(&mut self) -> Output;
}

impl RunExec for Command {
    fn run_exec(&mut self) -> Output {
        for _ in 0..20 {
            match self.output() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {}
                Ok(o) if String::from_utf8_lossy(&o.stderr).contains("Text file busy") => {}
                r => return r.unwrap(),
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("{self:?}: still 'Text file busy' after 20 tries");
    }
}

/// A copy of the memtrack binary in `dir`, mode 0755.
fn copy_memtrack(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    fs::copy(env!("CARGO_BIN_EXE_memtrack"), &p).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Runs `memtrack record -o OUT [extra] -- grep STATUS /proc/self/status` through `prefix`
/// (e.g. setpriv and its options); returns the output and the command's status lines.
fn record_status(
    prefix: &[&str],
    memtrack: &Path,
    out: &Path,
    extra: &[&str],
) -> (Output, BTreeMap<String, String>) {
    let mut cmd = Command::new(prefix.first().copied().unwrap_or(s(memtrack)));
    if !prefix.is_empty() {
        cmd.args(&prefix[1..]).arg(memtrack);
    }
    let o = cmd
        .args(["record", "-o", s(out)])
        .args(extra)
        .args(["--", "/bin/grep", "-E", STATUS, "/proc/self/status"])
        .run_exec();
    let st = status(&String::from_utf8_lossy(&o.stdout));
    (o, st)
}

fn verified(memtrack: &Path, artifact: &Path) {
    let v = Command::new(memtrack)
        .args(["verify", s(artifact)])
        .run_exec();
    assert!(v.status.success(), "{}", text(&v));
}

/// The capabilities a root process has here (the bounding set may lack some).
fn own_effective() -> u64 {
    let st = status(&fs::read_to_string("/proc/self/status").unwrap());
    caps(&st, "CapEff")
}

fn as_root_the_command_runs_as_root_unless_user_says_otherwise() {
    let dir = shared_dir();
    let me = Path::new(env!("CARGO_BIN_EXE_memtrack"));

    // `sudo memtrack record`: root, as sudo meant, but nothing ambient or inheritable.
    let art = dir.path().join("root.memtrack");
    let (o, st) = record_status(&[], me, &art, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(st["Uid"].split_whitespace().all(|u| u == "0"), "{st:?}");
    assert_eq!(caps(&st, "CapEff"), own_effective(), "{st:?}");
    assert_eq!((caps(&st, "CapInh"), caps(&st, "CapAmb")), (0, 0), "{st:?}");
    assert_eq!(st["NoNewPrivs"], "0");
    verified(me, &art);

    // `--user nobody`: nobody's uid, gid and groups, no capabilities, no new privileges.
    let art = dir.path().join("nobody.memtrack");
    let (o, st) = record_status(&[], me, &art, &["--user", "nobody"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(st["Uid"].split_whitespace().all(|u| u == "65534"), "{st:?}");
    assert!(st["Gid"].split_whitespace().all(|g| g == "65534"), "{st:?}");
    assert_eq!(st["Groups"], "65534", "{st:?}");
    for k in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(caps(&st, k), 0, "{k}: {st:?}");
    }
    assert_eq!(st["NoNewPrivs"], "1");
    verified(me, &art);

    // Its environment names the user.
    let o = Command::new(me)
        .args(["record", "--user", "nobody", "-o"])
        .arg(dir.path().join("env.memtrack"))
        .args(["--", "/usr/bin/env"])
        .run_exec();
    let env = String::from_utf8_lossy(&o.stdout);
    assert!(
        env.lines().any(|l| l == "USER=nobody") && env.lines().any(|l| l == "LOGNAME=nobody"),
        "{env}"
    );

    // An unknown user is refused before anything runs.
    let o = Command::new(me)
        .args(["record", "--user", "no-such-user-here", "-o"])
        .arg(dir.path().join("x.memtrack"))
        .args(["--", "/bin/true"])
        .run_exec();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("no user \"no-such-user-here\""),
        "{}",
        text(&o)
    );
    assert!(!dir.path().join("x.memtrack").exists());
}

/// Runs a program as nobody, as from a user's shell. setpriv itself still holds root's
/// capabilities when it executes (it keeps them to apply its options): a program with file
/// capabilities it executes directly gains none the kernel counts as new and stays dumpable,
/// unlike one a user starts. Through `env` (no capabilities), memtrack starts as a user's does.
const NOBODY: [&str; 5] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "/usr/bin/env",
];

/// A copy of memtrack with file capabilities (`setcap cap_bpf,cap_perfmon+ep`) in `dir`.
fn filecaps_memtrack(dir: &Path) -> PathBuf {
    let filecaps = copy_memtrack(dir, "memtrack-filecaps");
    let st = Command::new("setcap")
        .args(["cap_bpf,cap_perfmon+ep", s(&filecaps)])
        .status()
        .unwrap();
    assert!(st.success(), "setcap");
    filecaps
}

/// Records the command's status lines with `bin` run through `prefix` (as nobody, holding
/// CAP_BPF + CAP_PERFMON one way or another), and checks the command got none of them.
fn record_holding_caps(dir: &Path, what: &str, prefix: &[&str], bin: &Path) {
    let art = dir.join(format!("{}.memtrack", what.replace(' ', "-")));
    let (o, st) = record_status(prefix, bin, &art, &[]);
    // The recording itself worked: memtrack did hold CAP_BPF + CAP_PERFMON.
    assert!(o.status.success(), "{what}: {}", text(&o));
    verified(bin, &art);
    assert!(st["Uid"].split_whitespace().all(|u| u == "65534"), "{st:?}");
    for k in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(caps(&st, k) & BPF_CAPS, 0, "{what}: {k}: {st:?}");
        assert_eq!(caps(&st, k), 0, "{what}: {k}: {st:?}");
    }
    assert_eq!(st["NoNewPrivs"], "1", "{what}: {st:?}");
}

/// File capabilities on the binary (`setcap cap_bpf,cap_perfmon+ep`), run by nobody; and
/// `--user` without root is refused with the fix.
fn file_capabilities_of_memtrack_never_reach_the_command() {
    let dir = shared_dir();
    let filecaps = filecaps_memtrack(dir.path());
    record_holding_caps(dir.path(), "file capabilities", &NOBODY, &filecaps);

    let o = Command::new(NOBODY[0])
        .args(&NOBODY[1..])
        .arg(&filecaps)
        .args(["record", "--user", "root", "-o"])
        .arg(dir.path().join("u.memtrack"))
        .args(["--", "/bin/true"])
        .run_exec();
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o).contains("switching users needs root"),
        "{}",
        text(&o)
    );
}

/// The guide's set-up (file capabilities, run by a user: docs/src/security.md) with the default following: memtrack
/// may trace the command before its exec, records every process of the tree, and none of them
/// gets a capability.
fn file_capabilities_follow_the_whole_tree_without_giving_it_any() {
    let dir = shared_dir();
    let filecaps = filecaps_memtrack(dir.path());
    let art = dir.path().join("tree.memtrack");
    // grep, a child of the shell, prints its own status lines and the shell's.
    let script = format!("/bin/grep -E '{STATUS}' /proc/self/status /proc/$$/status; /bin/true");
    let o = Command::new(NOBODY[0])
        .args(&NOBODY[1..])
        .arg(&filecaps)
        .args(["record", "-o", s(&art), "--", "/bin/sh", "-c", &script])
        .run_exec();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // "/proc/self/status:CapEff:\t0…" (grep's) and "/proc/PID/status:CapEff:\t0…" (the shell's).
    let out = String::from_utf8_lossy(&o.stdout);
    let mut by_file: BTreeMap<&str, String> = BTreeMap::new();
    for (file, kv) in out.lines().filter_map(|l| l.split_once("status:")) {
        let lines = by_file.entry(file).or_default();
        lines.push_str(kv);
        lines.push('\n');
    }
    assert_eq!(by_file.len(), 2, "{out}");
    for (file, lines) in &by_file {
        let st = status(lines);
        assert!(
            st["Uid"].split_whitespace().all(|u| u == "65534"),
            "{file}: {out}"
        );
        for k in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
            assert_eq!(caps(&st, k), 0, "{file}{k}: {out}");
        }
        assert_eq!(st["NoNewPrivs"], "1", "{file}: {out}");
    }

    // Every process recorded from its first instruction: verify refuses a recording that
    // left one out.
    verified(&filecaps, &art);
    let show = Command::new(&filecaps)
        .args(["show", "--json", s(&art)])
        .run_exec();
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).expect("show --json");
    assert_eq!(v["uncovered_processes"], 0, "{v}");
    let ps: Vec<(String, serde_json::Value)> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["command"][0].as_str().unwrap().to_string(),
                p["exit_code"].clone(),
            )
        })
        .collect();
    assert_eq!(
        ps,
        [
            ("/bin/sh".to_string(), 0.into()),
            ("/bin/grep".to_string(), 0.into()),
            ("/bin/true".to_string(), 0.into()),
        ],
        "{v}"
    );
}

/// Ambient capabilities handed to a plain copy (`setpriv --ambient-caps`), which memtrack
/// passed on to the command as they were before.
fn ambient_capabilities_of_memtrack_never_reach_the_command() {
    let dir = shared_dir();
    let plain = copy_memtrack(dir.path(), "memtrack-plain");
    let ambient = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=+bpf,+perfmon",
        "--ambient-caps=+bpf,+perfmon",
    ];
    record_holding_caps(dir.path(), "ambient capabilities", &ambient, &plain);
}

/// A setuid-root program started by the command gains nothing (no_new_privs): memtrack,
/// holding capabilities but not root, never observes a root program, and stops following at
/// its exec.
fn a_setuid_program_the_command_starts_gains_nothing() {
    let dir = shared_dir();
    let filecaps = filecaps_memtrack(dir.path());
    let id = dir.path().join("id-setuid");
    fs::copy("/usr/bin/id", &id).unwrap();
    fs::set_permissions(&id, fs::Permissions::from_mode(0o4755)).unwrap();
    // Setuid works here (`Need::Setuid` checked the mount and no_new_privs): run directly by
    // nobody, the copy runs as root.
    let direct = Command::new(NOBODY[0])
        .args(&NOBODY[1..])
        .args([s(&id), "-u"])
        .run_exec();
    assert_eq!(
        String::from_utf8_lossy(&direct.stdout).trim(),
        "0",
        "a setuid-root copy of id run by nobody: {}",
        text(&direct)
    );
    let o = Command::new(NOBODY[0])
        .args(&NOBODY[1..])
        .arg(&filecaps)
        .args(["record", "-o"])
        .arg(dir.path().join("id.memtrack"))
        .args(["--", s(&id), "-u"])
        .run_exec();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "65534",
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("is setuid or setgid"), "{}", text(&o));
    // Followed up to its exec of the setuid program, and not beyond.
    assert!(
        text(&o).contains("a setuid or setgid program, which is never followed"),
        "{}",
        text(&o)
    );
}

fn a_setuid_install_of_memtrack_is_refused() {
    let dir = shared_dir();
    let bin = copy_memtrack(dir.path(), "memtrack-setuid");
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o4755)).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args([
            "synth",
            "--events",
            "10",
            "-o",
            "/etc/memtrack-must-not-exist",
        ])
        .run_exec();
    assert!(!Path::new("/etc/memtrack-must-not-exist").exists());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("runs setuid or setgid") && t.contains("chmod u-s"),
        "{t}"
    );
}

fn planted_symlinks_never_redirect_the_recording() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let me = Path::new(env!("CARGO_BIN_EXE_memtrack"));
    let victim = d.join("victim");
    fs::write(&victim, "precious").unwrap();
    for n in [
        "x.memtrack.partial",
        "x.partial",
        "x.memtrack.memtrack.partial",
    ] {
        std::os::unix::fs::symlink(&victim, d.join(n)).unwrap();
    }
    let o = Command::new(me)
        .args(["record", "-o"])
        .arg(d.join("x.memtrack"))
        .args(["--", "/bin/true"])
        .run_exec();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(
        fs::symlink_metadata(d.join("x.memtrack"))
            .unwrap()
            .is_file()
    );
    verified(me, &d.join("x.memtrack"));

    // Another user's link at the target: refused before the command runs.
    let planted = d.join("y.memtrack");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let marker = d.join("ran");
    let o = Command::new(me)
        .args(["record", "-o"])
        .arg(&planted)
        .args(["--", "/usr/bin/touch"])
        .arg(&marker)
        .run_exec();
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(
        text(&o).contains("symbolic link owned by uid 65534"),
        "{}",
        text(&o)
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(
        !marker.exists(),
        "the command ran although the output was refused"
    );
}

/// Running a command as nobody (`setpriv --reuid --regid --clear-groups`).
const SWITCH_USER: Need = Need::Caps(&[Cap::Setuid, Cap::Setgid]);

/// Giving a copy of memtrack file capabilities and running it as nobody: file capabilities
/// (like setuid bits) have no effect on a nosuid mount.
const FILE_CAPS: &[Need] = &[
    TRACKER,
    SWITCH_USER,
    Need::Caps(&[Cap::Setfcap]),
    Need::Tool("setcap"),
    Need::Tool("setpriv"),
    Need::Setuid,
];

fn main() {
    memtrack_test_support::run(vec![
        // Checks what the command gets when root runs memtrack (and `--user`, root's alone).
        requires(
            "as_root_the_command_runs_as_root_unless_user_says_otherwise",
            &[Need::Root, TRACKER],
            as_root_the_command_runs_as_root_unless_user_says_otherwise,
        ),
        // Gives a copy file capabilities (which a nosuid mount ignores) and runs it as nobody.
        requires(
            "file_capabilities_of_memtrack_never_reach_the_command",
            FILE_CAPS,
            file_capabilities_of_memtrack_never_reach_the_command,
        ),
        // Gives a copy file capabilities and records a shell's tree, following it, as nobody.
        requires(
            "file_capabilities_follow_the_whole_tree_without_giving_it_any",
            FILE_CAPS,
            file_capabilities_follow_the_whole_tree_without_giving_it_any,
        ),
        // Hands ambient capabilities to nobody.
        requires(
            "ambient_capabilities_of_memtrack_never_reach_the_command",
            &[TRACKER, SWITCH_USER, Need::Tool("setpriv")],
            ambient_capabilities_of_memtrack_never_reach_the_command,
        ),
        // The file-capabilities copy runs a setuid-root copy of `id`.
        requires(
            "a_setuid_program_the_command_starts_gains_nothing",
            FILE_CAPS,
            a_setuid_program_the_command_starts_gains_nothing,
        ),
        // Installs a setuid copy of memtrack and runs it as nobody.
        requires(
            "a_setuid_install_of_memtrack_is_refused",
            &[SWITCH_USER, Need::Tool("setpriv"), Need::Setuid],
            a_setuid_install_of_memtrack_is_refused,
        ),
        // Plants a link owned by nobody.
        requires(
            "planted_symlinks_never_redirect_the_recording",
            &[TRACKER, Need::Caps(&[Cap::Chown])],
            planted_symlinks_never_redirect_the_recording,
        ),
    ]);
}
