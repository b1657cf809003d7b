//! memtrack's BPF programs, attached at the offsets [`memtrack_bpf::probe_sites`] places them (past the
//! skipped instructions of each prologue), record each call's arguments and result exactly:
//! every allocator entry point of the installed libraries is called with known arguments and
//! the ring buffer's events (kind, address, old address, size, alignment) are compared with
//! what the calls returned.
//!
//! Needs root (CAP_BPF + CAP_PERFMON); skipped with a message otherwise. jemalloc and
//! mimalloc are tested in a child process of this test binary with the library in
//! `LD_PRELOAD` (their initial-exec TLS refuses `dlopen`).

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_int, c_void};
use std::path::{Path, PathBuf};

use libbpf_rs::{MapCore, RingBufferBuilder};
use memtrack_bpf::{MAP_EVENTS, RawEvent, RawStack, kind};
use memtrack_test_support::{Need, TRACKER, requires, run};

const LIB: &str = "/usr/lib/x86_64-linux-gnu";
const CHILD: &str = "MEMTRACK_BPF_PLACED_ARGS_GROUP";

type P = *mut c_void;

/// (kind, addr, old_addr, size, align) of an event.
type Shape = (u32, u64, u64, u64, u64);

#[path = "../examples/harness/mod.rs"]
mod harness;
use harness::f;

fn sym(name: &str) -> P {
    harness::sym(name).unwrap_or_else(|| panic!("{name} not found"))
}

/// The file that defines `name` in this process.
fn file_of(name: &str) -> PathBuf {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address of a function of this process.
    assert!(unsafe { libc::dladdr(sym(name), &mut info) } != 0);
    // SAFETY: dladdr set dli_fname to a NUL-terminated path.
    PathBuf::from(unsafe { CStr::from_ptr(info.dli_fname) }.to_str().unwrap())
}

fn tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

const MARK_BEGIN: usize = 0xbe01;
const MARK_END: usize = 0xbe02;

/// Attaches memtrack's programs at every site of `file` for this process, records what
/// `calls` does on this thread between two marker allocations made with `alloc` (and freed
/// with `free`), and returns the events between the markers and the shapes `calls` expects.
/// (libbpf and the test harness allocate on this thread too: the markers cut that out.)
fn record(
    file: &Path,
    alloc: unsafe extern "C" fn(usize) -> P,
    free: unsafe extern "C" fn(P),
    calls: impl FnOnce(&mut Vec<Shape>),
) -> (Vec<Shape>, Vec<Shape>) {
    let obj = harness::load(Some(1 << 20));
    let _links = harness::attach_sites(&obj, file);
    harness::switch(&obj, true, 1);
    // Allocated before recording: `calls` pushes without growing it.
    let mut expected = Vec::with_capacity(256);
    let mark = |size| {
        // SAFETY: the library's own malloc and free, one block.
        unsafe { free(std::hint::black_box(alloc(size))) }
    };
    mark(MARK_BEGIN);
    calls(&mut expected);
    mark(MARK_END);
    assert!(expected.len() < 256, "grew while recording");
    harness::switch(&obj, false, 1);
    let events = obj.maps().find(|m| m.name() == MAP_EVENTS).unwrap();
    let got = RefCell::new(Vec::new());
    let me = tid();
    let mut b = RingBufferBuilder::new();
    b.add(&events, |bytes| {
        if RawStack::is_stack(bytes) {
            return 0;
        }
        let e = RawEvent::from_bytes(bytes).expect("a RawEvent");
        if e.tid == me {
            got.borrow_mut()
                .push((e.kind, e.addr, e.old_addr, e.size, e.align));
        }
        0
    })
    .unwrap();
    let rb = b.build().unwrap();
    rb.consume().unwrap();
    drop(rb);
    let got = got.into_inner();
    let pos = |size| {
        got.iter()
            .position(|e| e.0 != kind::FREE && e.3 == size as u64)
            .unwrap_or_else(|| panic!("marker {size:#x} not recorded: {got:?}"))
    };
    let (b, e) = (pos(MARK_BEGIN), pos(MARK_END));
    // After the begin marker and its free, before the end marker.
    (got[b + 2..e].to_vec(), expected)
}

fn a(p: P) -> u64 {
    p as u64
}

/// The calls of a malloc-family library (glibc's, or the preloaded jemalloc or mimalloc), each
/// with the event it must produce. Every symbol is looked up here (dlsym allocates), the calls
/// run in the returned closure.
fn libc_calls(group: &str) -> impl FnOnce(&mut Vec<Shape>) {
    let malloc: unsafe extern "C" fn(usize) -> P = f("malloc");
    let free: unsafe extern "C" fn(P) = f("free");
    let calloc: unsafe extern "C" fn(usize, usize) -> P = f("calloc");
    let realloc: unsafe extern "C" fn(P, usize) -> P = f("realloc");
    let aligned_alloc: unsafe extern "C" fn(usize, usize) -> P = f("aligned_alloc");
    let posix_memalign: unsafe extern "C" fn(*mut P, usize, usize) -> c_int = f("posix_memalign");
    type Reallocarray = unsafe extern "C" fn(P, usize, usize) -> P;
    let reallocarray = (group != "jemalloc").then(|| f::<Reallocarray>("reallocarray"));
    type Je = (
        unsafe extern "C" fn(usize, c_int) -> P,
        unsafe extern "C" fn(P, usize, c_int) -> P,
        unsafe extern "C" fn(P, usize, c_int),
        unsafe extern "C" fn(P, c_int),
    );
    let je: Option<Je> =
        (group == "jemalloc").then(|| (f("mallocx"), f("rallocx"), f("sdallocx"), f("dallocx")));
    type Mi = (
        unsafe extern "C" fn(usize) -> P,
        unsafe extern "C" fn(usize) -> P,
        unsafe extern "C" fn(P),
    );
    let mi: Option<Mi> =
        (group == "mimalloc").then(|| (f("mi_malloc_small"), f("mi_zalloc_small"), f("mi_free")));
    // mimalloc's API, whose prologues move the arguments to other registers.
    type Fn2 = unsafe extern "C" fn(usize, usize) -> P;
    type Re3 = unsafe extern "C" fn(P, usize, usize) -> P;
    type MiMoved = (
        unsafe extern "C" fn(usize) -> P,
        Fn2,
        Re3,
        unsafe extern "C" fn(P, usize) -> P,
        [Fn2; 4],
        Re3,
    );
    let mi_moved: Option<MiMoved> = (group == "mimalloc").then(|| {
        (
            f("mi_zalloc"),
            f("mi_mallocn"),
            f("mi_reallocn"),
            f("mi_reallocf"),
            [
                f("mi_malloc_aligned"),
                f("mi_zalloc_aligned"),
                f("mi_memalign"),
                f("mi_aligned_alloc"),
            ],
            f("mi_new_reallocn"),
        )
    });
    // SAFETY: each call matches its C signature; every block is freed once, by its allocator.
    move |v| unsafe {
        let p = malloc(1001);
        v.push((kind::MALLOC, a(p), 0, 1001, 0));
        free(p);
        v.push((kind::FREE, a(p), 0, 0, 0));
        let p = calloc(3, 333);
        v.push((kind::CALLOC, a(p), 0, 999, 0));
        let q = realloc(p, 5000);
        v.push((kind::REALLOC, a(q), a(p), 5000, 0));
        free(q);
        v.push((kind::FREE, a(q), 0, 0, 0));
        let p = aligned_alloc(64, 640);
        v.push((kind::ALIGNED_ALLOC, a(p), 0, 640, 64));
        free(p);
        v.push((kind::FREE, a(p), 0, 0, 0));
        let mut p: P = std::ptr::null_mut();
        assert_eq!(posix_memalign(&mut p, 128, 1280), 0);
        v.push((kind::ALIGNED_ALLOC, a(p), 0, 1280, 128));
        free(p);
        v.push((kind::FREE, a(p), 0, 0, 0));
        if let Some(reallocarray) = reallocarray {
            let p = malloc(16);
            v.push((kind::MALLOC, a(p), 0, 16, 0));
            let q = reallocarray(p, 7, 300);
            v.push((kind::REALLOC, a(q), a(p), 2100, 0));
            free(q);
            v.push((kind::FREE, a(q), 0, 0, 0));
        }
        if let Some((mallocx, rallocx, sdallocx, dallocx)) = je {
            let p = mallocx(100, 6); // MALLOCX_LG_ALIGN(6): align 64
            v.push((kind::ALIGNED_ALLOC, a(p), 0, 100, 64));
            let q = rallocx(p, 3000, 0);
            v.push((kind::REALLOC, a(q), a(p), 3000, 0));
            sdallocx(q, 3000, 0);
            v.push((kind::FREE, a(q), 0, 0, 0));
            let p = mallocx(50, 0x40); // MALLOCX_ZERO
            v.push((kind::CALLOC, a(p), 0, 50, 0));
            dallocx(p, 0);
            v.push((kind::FREE, a(p), 0, 0, 0));
        }
        if let Some((zalloc, mallocn, reallocn, reallocf, aligned, new_rn)) = mi_moved {
            let p = zalloc(20);
            v.push((kind::CALLOC, a(p), 0, 20, 0));
            let q = reallocf(p, 700);
            v.push((kind::REALLOC, a(q), a(p), 700, 0));
            free(q);
            v.push((kind::FREE, a(q), 0, 0, 0));
            let p = mallocn(4, 8);
            v.push((kind::MALLOC, a(p), 0, 32, 0));
            let q = reallocn(p, 3, 100);
            v.push((kind::REALLOC, a(q), a(p), 300, 0));
            let r = new_rn(q, 5, 600);
            v.push((kind::REALLOC, a(r), a(q), 3000, 0));
            free(r);
            v.push((kind::FREE, a(r), 0, 0, 0));
            // (x, y) of mi_malloc_aligned(size, align), mi_zalloc_aligned(size, align),
            // mi_memalign(align, size), mi_aligned_alloc(align, size): size, align.
            let shapes = [
                (64, 128, 64, 128),
                (96, 64, 96, 64),
                (256, 512, 512, 256),
                (64, 192, 192, 64),
            ];
            for (alloc, (x, y, size, align)) in aligned.into_iter().zip(shapes) {
                let p = alloc(x, y);
                v.push((kind::ALIGNED_ALLOC, a(p), 0, size, align));
                free(p);
                v.push((kind::FREE, a(p), 0, 0, 0));
            }
        }
        if let Some((small, zsmall, mi_free)) = mi {
            let p = small(24);
            v.push((kind::MALLOC, a(p), 0, 24, 0));
            mi_free(p);
            v.push((kind::FREE, a(p), 0, 0, 0));
            let p = zsmall(40);
            v.push((kind::CALLOC, a(p), 0, 40, 0));
            mi_free(p);
            v.push((kind::FREE, a(p), 0, 0, 0));
        }
    }
}

/// C++ `operator new`/`delete` of libstdc++ (or of the preloaded allocator).
fn cxx_calls() -> impl FnOnce(&mut Vec<Shape>) {
    let new: unsafe extern "C" fn(usize) -> P = f("_Znwm");
    let del: unsafe extern "C" fn(P) = f("_ZdlPv");
    let del_sized: unsafe extern "C" fn(P, usize) = f("_ZdlPvm");
    let new_al: unsafe extern "C" fn(usize, usize) -> P = f("_ZnwmSt11align_val_t");
    let del_al: unsafe extern "C" fn(P, usize) = f("_ZdlPvSt11align_val_t");
    let del_sized_al: unsafe extern "C" fn(P, usize, usize) = f("_ZdlPvmSt11align_val_t");
    let del_arr_sized_al: unsafe extern "C" fn(P, usize, usize) = f("_ZdaPvmSt11align_val_t");
    let new_arr_al: unsafe extern "C" fn(usize, usize) -> P = f("_ZnamSt11align_val_t");
    // SAFETY: each call matches its C++ ABI signature; every block is freed once, by the
    // matching operator.
    move |v| unsafe {
        let p = new(1001);
        v.push((kind::MALLOC, a(p), 0, 1001, 0));
        del(p);
        v.push((kind::FREE, a(p), 0, 0, 0));
        let p = new(48);
        v.push((kind::MALLOC, a(p), 0, 48, 0));
        del_sized(p, 48);
        v.push((kind::FREE, a(p), 0, 0, 0));
        let p = new_al(192, 64);
        v.push((kind::ALIGNED_ALLOC, a(p), 0, 192, 64));
        del_al(p, 64);
        v.push((kind::FREE, a(p), 0, 0, 0));
        let p = new_al(320, 128);
        v.push((kind::ALIGNED_ALLOC, a(p), 0, 320, 128));
        del_sized_al(p, 320, 128);
        v.push((kind::FREE, a(p), 0, 0, 0));
        let p = new_arr_al(640, 64);
        v.push((kind::ALIGNED_ALLOC, a(p), 0, 640, 64));
        del_arr_sized_al(p, 640, 64);
        v.push((kind::FREE, a(p), 0, 0, 0));
    }
}

/// Runs `group` here if this is the child for it, else in a child with `preload`.
fn in_child(group: &str, test: &str, preload: &str) {
    let lib = Path::new(LIB).join(preload);
    if std::env::var(CHILD).as_deref() == Ok(group) {
        let file = file_of("malloc");
        assert!(file.ends_with(preload), "malloc is {}", file.display());
        let (c, cxx) = (libc_calls(group), cxx_calls());
        let (got, want) = record(&file, f("malloc"), f("free"), |v| {
            c(v);
            cxx(v);
        });
        assert_eq!(got, want, "{group}: events (left) vs calls (right)");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, group)
        .env("LD_PRELOAD", &lib)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{group} child failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "{group} child ran no test:\n{text}"
    );
}

fn glibc() {
    let file = file_of("malloc");
    let (got, want) = record(&file, f("malloc"), f("free"), libc_calls("glibc"));
    assert_eq!(got, want, "events (left) vs calls (right)");
}

fn libstdcxx() {
    let path = CString::new(format!("{LIB}/libstdc++.so.6")).unwrap();
    // SAFETY: dlopen of a library path; the handle stays open for the process's life.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "dlopen libstdc++");
    let file = file_of("_Znwm");
    let (got, want) = record(&file, f("_Znwm"), f("_ZdlPv"), cxx_calls());
    assert_eq!(got, want, "events (left) vs calls (right)");
}

fn jemalloc() {
    in_child("jemalloc", "jemalloc", "libjemalloc.so.2");
}

fn mimalloc() {
    in_child("mimalloc", "mimalloc", "libmimalloc.so.2");
}

/// What every test needs: the BPF programs load and attach only with CAP_BPF + CAP_PERFMON.
const NEEDS: &[Need] = &[TRACKER];
const APT: &str = "apt-get install libjemalloc-dev libmimalloc-dev (.ci/setup does)";

fn main() {
    run(vec![
        requires("glibc", NEEDS, glibc),
        requires("libstdcxx", NEEDS, libstdcxx),
        requires(
            "jemalloc",
            &[
                TRACKER,
                Need::File("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", APT),
            ],
            jemalloc,
        ),
        requires(
            "mimalloc",
            &[
                TRACKER,
                Need::File("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2", APT),
            ],
            mimalloc,
        ),
    ]);
}
