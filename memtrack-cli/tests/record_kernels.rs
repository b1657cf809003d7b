//! `memtrack record` on kernels that lack what the eBPF tracker uses, pretended on this one
//! with `MEMTRACK_KERNEL_WITHOUT` (the tracker probes the kernel; the variable says a feature
//! is missing whatever the probe found): a kernel older than the floor, or without BTF, is
//! refused with exit 2 and a line that names the kernel, what it lacks and the allocator
//! recorder; on the older paths (no uprobe.multi links, no thread pidfds, no bpf_loop, no
//! bpf_find_vma) a fixture's figures are those of the newer ones, and one line per older way
//! says what it costs.
//!
//! `harness = false` (memtrack-test-support's runner): every test needs the tracker's
//! CAP_BPF + CAP_PERFMON (the kernel is probed by loading programs), and the last one a C
//! compiler; without them they are reported as ignored with what is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use memtrack_test_support::{Need, TRACKER, requires};

/// The kernel's release, as the error must name it.
fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}

/// `memtrack record -o OUT -- CMD` with `MEMTRACK_KERNEL_WITHOUT=without` (if empty, as this
/// process has it: this kernel, or the older paths a forced-fallback run asks for).
fn record(out: &Path, without: &str, cmd: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memtrack"));
    c.arg("record").arg("-o").arg(out).arg("--").args(cmd);
    if !without.is_empty() {
        c.env("MEMTRACK_KERNEL_WITHOUT", without);
    }
    c.output().expect("run memtrack")
}

/// Asserts that `memtrack record` refuses to start on a kernel lacking `without`, with exit
/// 2, one line naming the kernel and each of `lacks`, and no artifact.
fn refused(without: &str, lacks: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.memtrack");
    let o = record(&out, without, &["/bin/true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let line = err.lines().next().unwrap();
    assert!(line.starts_with("memtrack: error: "), "{line}");
    assert!(
        line.contains(&format!("Linux {} lacks", release())),
        "{line}"
    );
    for l in lacks {
        assert!(line.contains(l), "{l:?} in {line}");
    }
    assert!(line.contains("Linux 5.15 or newer"), "{line}");
    assert!(line.contains("the allocator recorder"), "{line}");
    assert!(!out.exists(), "no artifact for a refused recording");
    let left: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");
}

fn a_kernel_without_btf_is_refused() {
    refused("btf", &["BTF (/sys/kernel/btf/vmlinux"]);
}

fn a_kernel_older_than_the_floor_is_refused() {
    refused(
        "attach-cookie,task-pt-regs",
        &[
            "bpf_get_attach_cookie in uprobes (5.15)",
            "bpf_task_pt_regs (5.15)",
        ],
    );
}

/// The figures `memtrack show --json` gives for `file`: totals, and each top site's counts
/// and functions.
fn figures(file: &Path) -> String {
    let o = common::memtrack(&["show", "--json", "--top", "10", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut lines = vec![];
    for k in [
        "allocations",
        "bytes_allocated",
        "frees",
        "bytes_freed",
        "peak_live_bytes",
        "peak_live_blocks",
        "live_blocks_at_end",
        "live_bytes_at_end",
        "lost_events",
        "kinds",
    ] {
        lines.push(format!("{k} {}", v[k]));
    }
    for row in v["top_sites"]["rows"].as_array().unwrap() {
        let functions: Vec<&str> = row["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap_or("?"))
            .collect();
        lines.push(format!(
            "{} {} {} {} {functions:?}",
            row["blocks"], row["bytes"], row["blocks_at_peak"], row["blocks_at_end"]
        ));
    }
    lines.join("\n")
}

fn the_older_paths_give_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("alloc");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/alloc.c");
    let st = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());
    let exe = exe.to_str().unwrap();
    for mode in ["basic", "maps"] {
        let newer = dir.path().join(format!("{mode}-newer.memtrack"));
        let older = dir.path().join(format!("{mode}-older.memtrack"));
        let n = record(&newer, "", &[exe, mode]);
        assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
        let o = record(&older, "fallbacks", &[exe, mode]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(figures(&newer), figures(&older), "alloc {mode}");
        // One line per older way, only where one is taken (lock waits were not asked for).
        let notes = |o: &Output| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .filter(|l| l.contains(&format!("Linux {} has no", release())))
                .count()
        };
        // uprobe.multi, thread pidfds, bpf_loop (bpf_find_vma's is about lock waits).
        assert_eq!(notes(&o), 3, "{}", String::from_utf8_lossy(&o.stderr));
        // This kernel's own older ways, if it lacks a feature (none on a recent one).
        let own = memtrack::tracker::Kernel::get().notes(false).len();
        assert_eq!(notes(&n), own, "{}", String::from_utf8_lossy(&n.stderr));
    }
}

fn main() {
    memtrack_test_support::run(vec![
        requires(
            "a_kernel_without_btf_is_refused",
            &[TRACKER],
            a_kernel_without_btf_is_refused,
        ),
        requires(
            "a_kernel_older_than_the_floor_is_refused",
            &[TRACKER],
            a_kernel_older_than_the_floor_is_refused,
        ),
        requires(
            "the_older_paths_give_the_same_figures",
            &[TRACKER, Need::Tool("cc")],
            the_older_paths_give_the_same_figures,
        ),
    ]);
}
