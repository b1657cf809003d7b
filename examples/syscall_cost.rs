//! What a recording costs a process it does not record: ns per `getppid` syscall of an
//! unrelated process with no tracker loaded, while `record` runs with its default syscall
//! recording (libc's wrappers, pid-scoped uprobes), and while it runs with raw syscalls (the
//! global `tp_btf/sys_exit` program). The three are interleaved, round after round, so that
//! drift of the machine hits them alike; the median of the rounds is printed.
//!
//! ```text
//! sudo cargo run --release --example syscall_cost [CALLS] [ROUNDS]
//! ```

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use memtrack::{tracker::TrackerOptions, tracker::record_command};

/// The unrelated process: `CALLS` getppid syscalls, then ns per call on stdout.
fn syscall_loop(calls: u64) {
    let t = Instant::now();
    for _ in 0..calls {
        // SAFETY: getppid has no preconditions.
        std::hint::black_box(unsafe { libc::getppid() });
    }
    println!("{}", t.elapsed().as_nanos() as f64 / calls as f64);
}

/// ns per call of the loop run in a fresh process (not a descendant of the recorded one).
fn unrelated(calls: u64) -> f64 {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .arg("--loop")
        .arg(calls.to_string())
        .output()
        .expect("run the loop");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("ns per call")
}

/// The loop run while `record` runs `sleep` with `opts`.
fn while_recording(calls: u64, opts: TrackerOptions) -> f64 {
    let rec = std::thread::spawn(move || {
        let cmd: Vec<OsString> = vec!["sleep".into(), "3".into()];
        record_command(&cmd, std::io::sink(), &opts).expect("record")
    });
    // Loading and attaching take well under a second.
    std::thread::sleep(Duration::from_millis(800));
    let ns = unrelated(calls);
    rec.join().expect("recording thread");
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--loop") {
        syscall_loop(args[2].parse().expect("CALLS"));
        return;
    }
    let calls: u64 = args.get(1).map_or(1_000_000, |a| a.parse().expect("CALLS"));
    let rounds: usize = args.get(2).map_or(5, |a| a.parse().expect("ROUNDS"));
    let (mut none, mut wrappers, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        none.push(unrelated(calls));
        wrappers.push(while_recording(calls, TrackerOptions::new()));
        raw.push(while_recording(
            calls,
            TrackerOptions::new().raw_syscalls(true),
        ));
        eprintln!(
            "round {r}: no tracker {:.1} ns, recording (default) {:.1} ns, recording \
             (--raw-syscalls) {:.1} ns",
            none[r], wrappers[r], raw[r]
        );
    }
    println!(
        "ns per getppid of an unrelated process, median of {rounds} rounds of {calls}: \
         no tracker {:.1}, recording (default: libc wrappers) {:.1}, recording \
         (--raw-syscalls) {:.1}",
        median(none),
        median(wrappers),
        median(raw)
    );
}
