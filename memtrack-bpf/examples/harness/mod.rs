//! What memtrack-bpf's examples and its tests share to drive the BPF object by
//! hand, without the memtrack crate: load it for this process, switch recording on and off,
//! drain the ring buffer while a closure runs, and look up C functions of this process.
//!
//! `examples/*.rs` use it as `mod harness;`, the test as
//! `#[path = "../examples/harness/mod.rs"] mod harness;` (not an example itself: cargo builds
//! `examples/*.rs` and `examples/*/main.rs` only).

#![allow(dead_code)] // each user needs a different subset

pub mod chain;

use std::ffi::{CString, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use libbpf_rs::{
    Link, MapCore, MapFlags, Object, ObjectBuilder, RingBufferBuilder, UprobeMultiOpts,
};
use memtrack_bpf::{
    MAP_EVENTS, PROG_ENTRY, PROG_RET, RawConfig, RawSwitch, SCOPE_PROCESS, SWITCH_STREAM,
    probe_sites,
};

/// The C library this process maps.
pub fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.find('/').map(|i| &l[i..]))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("libc mapped")
}

/// Attaches memtrack's entry and return programs at every allocator site of `file` (the
/// placed offsets of [`probe_sites`], not the syscalls) for this process, the way memtrack
/// does (uprobe_multi, one link per program); recording stays off until [`switch`].
pub fn attach_sites(obj: &Object, file: &Path) -> Vec<Link> {
    let sites: Vec<_> = probe_sites(file)
        .unwrap()
        .into_iter()
        .filter(|s| !s.entry.is_syscall())
        .collect();
    let pid = std::process::id() as i32;
    let prog = |name: &str| obj.progs_mut().find(|p| p.name() == name).unwrap();
    let entry = UprobeMultiOpts {
        offsets: sites.iter().map(|s| s.offset as usize).collect(),
        cookies: sites.iter().map(|s| s.cookie()).collect(),
        ..Default::default()
    };
    let ret = UprobeMultiOpts {
        offsets: sites
            .iter()
            .filter(|s| s.ret)
            .map(|s| s.offset as usize)
            .collect(),
        cookies: sites.iter().filter(|s| s.ret).map(|s| s.cookie()).collect(),
        retprobe: true,
        ..Default::default()
    };
    vec![
        prog(PROG_ENTRY)
            .attach_uprobe_multi_with_opts(pid, file, "", entry)
            .unwrap(),
        prog(PROG_RET)
            .attach_uprobe_multi_with_opts(pid, file, "", ret)
            .unwrap(),
    ]
}

/// The BPF object loaded to record this process; `events_bytes` sizes the ring buffer (else
/// the object's default); stacks of up to the default depth.
pub fn load(events_bytes: Option<u32>) -> Object {
    load_with(events_bytes, memtrack_bpf::DEFAULT_STACK_DEPTH)
}

/// [`load`] with stacks of up to `stack_depth` frames (0: none).
pub fn load_with(events_bytes: Option<u32>, stack_depth: u32) -> Object {
    let mut open = ObjectBuilder::default()
        .open_memory(memtrack_bpf::OBJECT)
        .unwrap();
    for mut m in open.maps_mut() {
        let name = m.name().to_string_lossy().into_owned();
        if name.ends_with(".rodata") {
            let mut cfg = RawConfig::new(std::process::id());
            cfg.stack_depth = stack_depth;
            m.initial_value_mut()
                .unwrap()
                .copy_from_slice(&cfg.to_bytes());
        } else if name == MAP_EVENTS
            && let Some(bytes) = events_bytes
        {
            m.set_max_entries(bytes).unwrap();
        }
    }
    open.load().unwrap()
}

/// Writes the whole `.bss` (a [`RawSwitch`]): recording `on` or off for the whole process,
/// in `generation`.
pub fn switch(obj: &Object, on: bool, generation: u32) {
    let bss = obj
        .maps()
        .find(|m| m.name().to_string_lossy().ends_with(".bss"))
        .unwrap();
    let sw = RawSwitch {
        enabled: if on { SWITCH_STREAM } else { 0 },
        scope: SCOPE_PROCESS,
        generation,
        caller: 0,
    };
    bss.update(&0u32.to_ne_bytes(), &sw.to_bytes(), MapFlags::ANY)
        .unwrap();
}

/// CPU time (ns) of the draining thread of the last [`recording_with`], and the records it
/// handed on: what draining costs per event.
pub static DRAIN_CPU_NS: AtomicU64 = AtomicU64::new(0);
/// See [`DRAIN_CPU_NS`].
pub static DRAIN_RECORDS: AtomicU64 = AtomicU64::new(0);

/// The calling thread's CPU time in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs `f` with recording on (in `generation`) and a thread draining the ring buffer (its
/// callback allocates nothing, so it needs no exclusion); recording is off again when it
/// returns.
pub fn recording<T>(obj: &Object, generation: u32, f: impl FnOnce() -> T) -> T {
    recording_with(obj, generation, |_| {}, f)
}

/// [`recording`], handing every ring-buffer record to `each` on the draining thread (whose own
/// allocations are recorded too: tell them apart by tid).
pub fn recording_with<T>(
    obj: &Object,
    generation: u32,
    mut each: impl FnMut(&[u8]) + Send,
    f: impl FnOnce() -> T,
) -> T {
    let events = obj.maps().find(|m| m.name() == MAP_EVENTS).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut b = RingBufferBuilder::new();
        DRAIN_RECORDS.store(0, Ordering::Relaxed);
        b.add(&events, move |r: &[u8]| {
            DRAIN_RECORDS.fetch_add(1, Ordering::Relaxed);
            each(r);
            0
        })
        .unwrap();
        let rb = b.build().unwrap();
        let stop = &stop;
        let poller = s.spawn(move || {
            let cpu = thread_cpu_ns();
            while !stop.load(Ordering::Acquire) {
                rb.poll(Duration::from_millis(10)).unwrap();
                rb.consume().unwrap();
            }
            rb.consume().unwrap();
            DRAIN_CPU_NS.store(thread_cpu_ns() - cpu, Ordering::Relaxed);
        });
        switch(obj, true, generation);
        let out = f();
        switch(obj, false, generation);
        stop.store(true, Ordering::Release);
        poller.join().unwrap();
        out
    })
}

/// A symbol of the running process (`RTLD_DEFAULT`: a preloaded allocator first).
pub fn sym(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym with a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The function `name` as a pointer of type `F`; the caller names the C signature.
pub fn f<F: Copy>(name: &str) -> F {
    assert_eq!(
        size_of::<F>(),
        size_of::<*mut c_void>(),
        "{name}: not a function pointer type"
    );
    let p = sym(name).unwrap_or_else(|| panic!("{name} not found"));
    // SAFETY: `F` is a function pointer type (checked: pointer-sized) and the symbol is a
    // function with the C signature the caller's binding states.
    unsafe { std::mem::transmute_copy(&p) }
}

/// The middle value of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
