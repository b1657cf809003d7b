//! What recording lock waits costs: its `tp_btf/sched_switch` program runs for every context
//! switch on the machine while a recording asks for lock waits.
//!
//! (a) To other processes: an unrelated process (this binary, run again with `--child`)
//!     ping-pongs a byte over two pipes between two threads pinned to one CPU (as lmbench's
//!     `lat_ctx` does: each round trip is two direct switches between them, with no idle CPU
//!     to wake, whose cost swings by microseconds in this VM), each blocking in `read` once per
//!     round trip; ns per context switch (the loop's wall time, and the two threads' CPU time
//!     (`CLOCK_THREAD_CPUTIME_ID`: what the program adds to the switches runs in their kernel
//!     time, and waiting for a CPU other work took is not in it), over the two threads' own
//!     context switches, `getrusage(RUSAGE_THREAD)`) with no session, while a session of this
//!     process records without lock waits (the program is not attached: must be no change), and
//!     while one records with lock waits (the program rejects the other process on its tgid).
//! (b) To the recorded process: the same ping-pong in this process, recorded by a session
//!     without and with lock waits, and with no session.
//!
//! The three configurations are interleaved, their order rotated and reversed round after
//! round (so drift of the machine hits them alike), and the median and range of the rounds are
//! printed with the added ns over no session. It also prints this process's attached BPF links
//! by type (`/proc/self/fdinfo`) in each configuration: the session with lock waits has one
//! `raw_tracepoint` link more than the one without (its `tp_btf/sched_switch` program).
//!
//! ```text
//! sudo cargo bench --bench switch_cost -- [ROUND_TRIPS] [ROUNDS]   # default 20000 7
//! ```

use std::process::Command;
use std::time::Instant;

use memtrack::{Scope, Session, SessionBuilder};

/// The calling thread's context switches (voluntary and involuntary) and CPU time (ns) so far.
fn thread_counts() -> [u64; 2] {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is the calling thread.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    // SAFETY: clock_gettime writes into the zeroed struct it is given.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0);
    [
        (u.ru_nvcsw + u.ru_nivcsw) as u64,
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64,
    ]
}

fn since(before: [u64; 2]) -> [u64; 2] {
    let now = thread_counts();
    [now[0] - before[0], now[1] - before[1]]
}

/// What one run measured: wall and CPU ns (both threads') per context switch.
#[derive(Clone, Copy)]
struct PerSwitch {
    wall: f64,
    cpu: f64,
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and sched_setaffinity get it whole.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// The CPU the ping-pong threads are pinned to: the last one.
fn ping_pong_cpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
}

/// `rounds` round trips of one byte between this thread and another over two pipes, both
/// pinned to one CPU: wall and CPU ns per context switch of the two threads.
fn ping_pong(rounds: u32) -> PerSwitch {
    let mut a = [0i32; 2];
    let mut b = [0i32; 2];
    // SAFETY: each pipe() writes two descriptors into its array.
    assert_eq!(unsafe { libc::pipe(a.as_mut_ptr()) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::pipe(b.as_mut_ptr()) }, 0);
    let (a_read, b_write) = (a[0], b[1]);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let b2 = std::sync::Arc::clone(&barrier);
    let cpu = ping_pong_cpu();
    let echo = std::thread::spawn(move || {
        pin(cpu);
        b2.wait();
        let before = thread_counts();
        let mut byte = 0u8;
        for _ in 0..rounds {
            // SAFETY: one byte into and out of a live local, on descriptors open until joined.
            unsafe {
                assert_eq!(libc::read(a_read, (&raw mut byte).cast(), 1), 1);
                assert_eq!(libc::write(b_write, (&raw const byte).cast(), 1), 1);
            }
        }
        since(before)
    });
    // This thread's affinity is put back after: the rest of the process is not pinned.
    // SAFETY: sched_getaffinity writes the calling thread's mask into `saved`.
    let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut saved) };
    pin(cpu);
    barrier.wait();
    let before = thread_counts();
    let t = Instant::now();
    let mut byte = 1u8;
    for _ in 0..rounds {
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::write(a[1], (&raw const byte).cast(), 1), 1);
            assert_eq!(libc::read(b[0], (&raw mut byte).cast(), 1), 1);
        }
    }
    let ns = t.elapsed().as_nanos() as f64;
    let [s1, c1] = since(before);
    let [s2, c2] = echo.join().unwrap();
    let switches = (s1 + s2).max(1) as f64;
    for fd in a.into_iter().chain(b) {
        // SAFETY: closing descriptors this function opened, once.
        unsafe { libc::close(fd) };
    }
    // SAFETY: `saved` is the mask sched_getaffinity gave.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &saved) };
    PerSwitch {
        wall: ns / switches,
        cpu: (c1 + c2) as f64 / switches,
    }
}

/// The ping-pong in a fresh process, not recorded by anyone.
fn unrelated(rounds: u32) -> PerSwitch {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", &rounds.to_string()])
        .output()
        .expect("run the child");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().expect("ns per switch"))
        .collect();
    PerSwitch {
        wall: v[0],
        cpu: v[1],
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Config {
    None,
    Plain,
    Locks,
}

impl Config {
    const ALL: [Config; 3] = [Config::None, Config::Plain, Config::Locks];

    fn name(self) -> &'static str {
        match self {
            Config::None => "no session",
            Config::Plain => "session without lock waits",
            Config::Locks => "session with lock waits",
        }
    }

    fn start(self) -> Option<Session> {
        let locks = match self {
            Config::None => return None,
            Config::Plain => false,
            Config::Locks => true,
        };
        Some(
            SessionBuilder::new("switch-cost")
                .in_memory(true)
                .quiet(true)
                .scope(Scope::Process)
                .lock_waits(locks)
                .start()
                .expect("an eBPF session (run as root)"),
        )
    }
}

/// This process's BPF links by type (`link_type` of /proc/self/fdinfo), e.g. `tracing: 3,
/// uprobe_multi: 2`.
fn links() -> String {
    let mut types: std::collections::BTreeMap<String, usize> = Default::default();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        if !target.to_string_lossy().contains("link") {
            continue;
        }
        let info = format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy());
        let info = std::fs::read_to_string(info).unwrap_or_default();
        let t = info
            .lines()
            .find_map(|l| l.strip_prefix("link_type:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        *types.entry(t).or_default() += 1;
    }
    let v: Vec<String> = types.iter().map(|(t, n)| format!("{t}: {n}")).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("--child") {
        let p = ping_pong(args[1].parse().unwrap());
        println!("{} {}", p.wall, p.cpu);
        return;
    }
    let rounds: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let reps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(7);
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "switch_cost: {rounds} round trips per run, {reps} rounds; load average before: {}",
        load().trim()
    );
    // Warm up: the tracker is loaded once per process.
    drop(Config::Locks.start().map(|s| s.finish()));
    let mut seen = [String::new(), String::new(), String::new()];
    let mut other = [vec![], vec![], vec![]];
    let mut own = [vec![], vec![], vec![]];
    for r in 0..reps {
        let mut order: Vec<usize> = (0..3).map(|i| (i + r) % 3).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for &i in &order {
            let c = Config::ALL[i];
            let s = c.start();
            seen[i] = links();
            other[i].push(unrelated(rounds));
            own[i].push(ping_pong(rounds));
            if let Some(s) = s {
                let report = s.finish().expect("finish");
                assert_eq!(
                    report.lost_events(),
                    0,
                    "events lost: raise the ring buffer"
                );
            }
        }
    }
    for (i, c) in Config::ALL.iter().enumerate() {
        println!("BPF links of this process, {}: {}", c.name(), seen[i]);
    }
    for (what, v) in [
        ("(a) an unrelated process", &other),
        ("(b) the recorded process", &own),
    ] {
        println!(
            "{what}: ns per context switch, median [min, max] of {reps} rounds; added: the median \
             of each round's difference from no session"
        );
        for (metric, get) in [
            ("wall", (|p: &PerSwitch| p.wall) as fn(&PerSwitch) -> f64),
            ("CPU of the two threads", |p: &PerSwitch| p.cpu),
        ] {
            println!("  {metric}:");
            for (i, c) in Config::ALL.iter().enumerate() {
                let mut abs: Vec<f64> = v[i].iter().map(get).collect();
                let mut diff: Vec<f64> = v[i]
                    .iter()
                    .zip(&v[0])
                    .map(|(x, base)| get(x) - get(base))
                    .collect();
                let (m, lo, hi) = stats(&mut abs);
                let (d, dlo, dhi) = stats(&mut diff);
                println!(
                    "    {:<28} {m:>8.1} [{lo:.1}, {hi:.1}]  added {d:+.1} [{dlo:+.1}, {dhi:+.1}]",
                    c.name()
                );
            }
        }
    }
    println!("load average after: {}", load().trim());
}
