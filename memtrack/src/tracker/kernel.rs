//! What the running kernel offers the tracker, probed once per process the way libbpf's
//! feature probes do (load a tiny program, try a link), never read from the version string;
//! and the older way the tracker takes where a feature is missing.
//!
//! Required (Linux 5.15 with BTF): BTF, the BPF ring buffer, attach cookies and
//! `bpf_task_pt_regs` in uprobe programs, `bpf_get_current_task_btf`. Optional, each with a
//! fallback that records the same events: `uprobe.multi` links (one link per probe site
//! instead), thread pidfds and task storage in uprobe programs (per-thread state keyed by tid
//! instead), `bpf_loop` (the stack walk in a bounded loop); `bpf_find_vma` (lock waits lose
//! the scanned caller words).
//!
//! `MEMTRACK_KERNEL_WITHOUT=name,name` pretends features are missing (their [`Feature::name`],
//! or `fallbacks` for every optional one), so that the older paths, and the error for a
//! kernel that is too old, are tested on a kernel that has everything.

use std::sync::OnceLock;

use libbpf_rs::libbpf_sys;

use super::TrackerError;

/// A kernel feature the tracker uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Feature {
    /// The kernel's BTF (`/sys/kernel/btf/vmlinux`, `CONFIG_DEBUG_INFO_BTF`): CO-RE and the
    /// `tp_btf` programs. Required.
    Btf,
    /// The BPF ring buffer (Linux 5.8). Required.
    Ringbuf,
    /// `bpf_get_attach_cookie` in uprobe programs (Linux 5.15): which probe site fired.
    /// Required.
    AttachCookie,
    /// `bpf_task_pt_regs` (Linux 5.15): a switched-out thread's user registers. Required.
    TaskPtRegs,
    /// `bpf_get_current_task_btf` in uprobe programs (Linux 5.11). Required.
    CurrentTaskBtf,
    /// `bpf_loop` (Linux 5.17): the call-stack walk. Without: the walk's steps in a bounded
    /// loop (the same frames; the verifier takes longer at load).
    BpfLoop,
    /// `uprobe.multi` links with process filtering (Linux 6.6, fixed in 6.10 and stable):
    /// one link per file. Without: one link per probe site.
    UprobeMulti,
    /// Thread pidfds (`pidfd_open(tid, PIDFD_THREAD)`, Linux 6.9): user space reaches a
    /// thread's task storage. Without: per-thread state in a hash map keyed by tid.
    ThreadPidfd,
    /// `bpf_task_storage_get` in uprobe programs. Without: per-thread state keyed by tid.
    TaskStorage,
    /// `bpf_find_vma` (Linux 5.17): the code mapping of a blocked thread's innermost frame.
    /// Without: lock waits in glibc's blocking calls are named by the blocking function only.
    FindVma,
}

/// Every feature, required first.
const ALL: [Feature; 10] = [
    Feature::Btf,
    Feature::Ringbuf,
    Feature::AttachCookie,
    Feature::TaskPtRegs,
    Feature::CurrentTaskBtf,
    Feature::UprobeMulti,
    Feature::BpfLoop,
    Feature::ThreadPidfd,
    Feature::TaskStorage,
    Feature::FindVma,
];

impl Feature {
    /// Its name in `MEMTRACK_KERNEL_WITHOUT` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Btf => "btf",
            Feature::Ringbuf => "ringbuf",
            Feature::AttachCookie => "attach-cookie",
            Feature::TaskPtRegs => "task-pt-regs",
            Feature::CurrentTaskBtf => "current-task-btf",
            Feature::BpfLoop => "bpf-loop",
            Feature::UprobeMulti => "uprobe-multi",
            Feature::ThreadPidfd => "thread-pidfd",
            Feature::TaskStorage => "task-storage",
            Feature::FindVma => "find-vma",
        }
    }

    /// What it is, for a user: the kernel interface and the release that added it.
    fn what(self) -> &'static str {
        match self {
            Feature::Btf => "BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF=y)",
            Feature::Ringbuf => "the BPF ring buffer (5.8)",
            Feature::AttachCookie => "bpf_get_attach_cookie in uprobes (5.15)",
            Feature::TaskPtRegs => "bpf_task_pt_regs (5.15)",
            Feature::CurrentTaskBtf => "bpf_get_current_task_btf in uprobes (5.11)",
            Feature::BpfLoop => "bpf_loop (5.17)",
            Feature::UprobeMulti => "uprobe.multi links (6.6)",
            Feature::ThreadPidfd => "thread pidfds (6.9)",
            Feature::TaskStorage => "task storage in uprobes",
            Feature::FindVma => "bpf_find_vma (5.17)",
        }
    }

    /// Whether the tracker cannot work without it.
    pub fn required(self) -> bool {
        !matches!(
            self,
            Feature::UprobeMulti
                | Feature::ThreadPidfd
                | Feature::TaskStorage
                | Feature::FindVma
                | Feature::BpfLoop
        )
    }
}

/// What the running kernel has, as the tracker uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// `uname -r`.
    pub release: String,
    /// The features it lacks (or is said to lack by `MEMTRACK_KERNEL_WITHOUT`).
    pub missing: Vec<Feature>,
}

impl Kernel {
    /// The running kernel, probed once per process (each probe loads a tiny program; needs
    /// the tracker's privileges, which the caller has checked).
    pub fn get() -> &'static Kernel {
        static KERNEL: OnceLock<Kernel> = OnceLock::new();
        KERNEL.get_or_init(|| {
            let pretend = std::env::var("MEMTRACK_KERNEL_WITHOUT").unwrap_or_default();
            let pretend: Vec<&str> = pretend.split(',').map(str::trim).collect();
            let missing = ALL
                .into_iter()
                .filter(|&f| {
                    pretend.contains(&f.name())
                        || (!f.required() && pretend.contains(&"fallbacks"))
                        || !probe(f)
                })
                .collect();
            Kernel {
                release: release(),
                missing,
            }
        })
    }

    /// Whether it has `f`.
    pub fn has(&self, f: Feature) -> bool {
        !self.missing.contains(&f)
    }

    /// An error naming the kernel and what it lacks, if the tracker cannot work on it.
    pub fn check(&self) -> Result<(), TrackerError> {
        let missing: Vec<&str> = self
            .missing
            .iter()
            .filter(|f| f.required())
            .map(|f| f.what())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        // Without the privileges to use BPF every probe fails: not the kernel's lack.
        if let Some(what) = not_permitted() {
            return Err(TrackerError::NotPrivileged { what });
        }
        Err(TrackerError::KernelTooOld {
            release: self.release.clone(),
            missing: missing.join(", "),
        })
    }

    /// Per-thread state keyed by tid instead of task storage.
    pub(crate) fn tid_state(&self) -> bool {
        !self.has(Feature::ThreadPidfd) || !self.has(Feature::TaskStorage)
    }

    /// The program's `config.fallbacks` bits for this kernel.
    pub(crate) fn fallbacks(&self) -> u32 {
        let mut bits = 0;
        if self.tid_state() {
            bits |= memtrack_bpf::FALLBACK_TID_STATE;
        }
        if !self.has(Feature::FindVma) {
            bits |= memtrack_bpf::FALLBACK_NO_FIND_VMA;
        }
        if !self.has(Feature::BpfLoop) {
            bits |= memtrack_bpf::FALLBACK_NO_LOOP;
        }
        bits
    }

    /// One line per older way taken on this kernel, saying what it costs (none on a kernel
    /// with every feature); the one about lock waits only if a recording of them is
    /// `lock_waits`.
    pub fn notes(&self, lock_waits: bool) -> Vec<String> {
        let mut notes = Vec::new();
        let r = &self.release;
        if !self.has(Feature::UprobeMulti) {
            notes.push(format!(
                "Linux {r} has no uprobe.multi links (6.6): one link per probe site, and the \
                 kernel closes them one at a time, so detaching takes longer; the same events \
                 are recorded"
            ));
        }
        if self.tid_state() {
            let what = if self.has(Feature::ThreadPidfd) {
                Feature::TaskStorage.what()
            } else {
                Feature::ThreadPidfd.what()
            };
            notes.push(format!(
                "Linux {r} has no {what}: per-thread state is kept by thread id (a hash \
                 lookup per event); the same events are recorded"
            ));
        }
        if !self.has(Feature::BpfLoop) {
            notes.push(format!(
                "Linux {r} has no bpf_loop (5.17): the stack walk runs in a bounded loop, \
                 which takes longer to load; the same events are recorded"
            ));
        }
        if lock_waits && !self.has(Feature::FindVma) {
            notes.push(format!(
                "Linux {r} has no bpf_find_vma (5.17): lock waits inside glibc's blocking \
                 calls are named by the blocking function, not by the call that waits \
                 (pthread_cond_wait, pthread_rwlock_*)"
            ));
        }
        notes
    }
}

/// `uname -r`.
fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "(unknown release)".into())
}

/// Whether the running kernel has `f`.
fn probe(f: Feature) -> bool {
    use libbpf_sys::{BPF_PROG_TYPE_KPROBE as KPROBE, bpf_func_id};
    let helper = |id: bpf_func_id| {
        // SAFETY: libbpf's helper probe loads a two-instruction program; no pointers given.
        unsafe { libbpf_sys::libbpf_probe_bpf_helper(KPROBE, id, std::ptr::null()) == 1 }
    };
    match f {
        Feature::Btf => std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        Feature::Ringbuf => {
            // SAFETY: libbpf's map probe creates and closes a small map; no pointers given.
            unsafe {
                libbpf_sys::libbpf_probe_bpf_map_type(
                    libbpf_sys::BPF_MAP_TYPE_RINGBUF,
                    std::ptr::null(),
                ) == 1
            }
        }
        Feature::AttachCookie => helper(libbpf_sys::BPF_FUNC_get_attach_cookie),
        Feature::TaskPtRegs => helper(libbpf_sys::BPF_FUNC_task_pt_regs),
        Feature::CurrentTaskBtf => helper(libbpf_sys::BPF_FUNC_get_current_task_btf),
        Feature::BpfLoop => helper(libbpf_sys::BPF_FUNC_loop),
        Feature::TaskStorage => helper(libbpf_sys::BPF_FUNC_task_storage_get),
        Feature::FindVma => helper(libbpf_sys::BPF_FUNC_find_vma),
        Feature::ThreadPidfd => thread_pidfd(),
        Feature::UprobeMulti => uprobe_multi(),
    }
}

/// What the kernel refused for lack of privileges, if creating a BPF ring buffer (a map
/// only `CAP_BPF` may create) is refused with EPERM or EACCES. libbpf's own probe answers
/// "unsupported" for any failure, so this creates the map itself.
fn not_permitted() -> Option<String> {
    // SAFETY: creates a one-page ring buffer map (no name, no options) and closes it.
    let fd = unsafe {
        libbpf_sys::bpf_map_create(
            libbpf_sys::BPF_MAP_TYPE_RINGBUF,
            std::ptr::null(),
            0,
            0,
            4096,
            std::ptr::null(),
        )
    };
    let err = std::io::Error::last_os_error().raw_os_error();
    if fd >= 0 {
        // SAFETY: closing the map just created.
        unsafe { libc::close(fd) };
        return None;
    }
    matches!(err, Some(libc::EPERM | libc::EACCES)).then(|| "creating a BPF map".to_string())
}

/// Whether `pidfd_open(PIDFD_THREAD)` works (older kernels refuse the flag with EINVAL).
fn thread_pidfd() -> bool {
    const PIDFD_THREAD: libc::c_long = libc::O_EXCL as libc::c_long;
    // SAFETY: gettid has no preconditions; pidfd_open takes a tid and flags and returns a new
    // descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_pidfd_open,
            libc::gettid() as libc::c_long,
            PIDFD_THREAD,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: closing the descriptor just opened.
    unsafe { libc::close(fd as i32) };
    true
}

/// libbpf's own probe (features.c, `probe_uprobe_multi_link`): a uprobe.multi link on "/"
/// fails with EBADF where the link type exists; with pid -1 it fails with EINVAL only where
/// the kernel filters by process (the first kernels with these links filtered by thread, so a
/// pid-scoped link would miss the target's other threads: taken as missing).
fn uprobe_multi() -> bool {
    // mov r0, 0; exit
    let insns: [u64; 2] = [0xb7, 0x95];
    let opts = libbpf_sys::bpf_prog_load_opts {
        sz: size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
        expected_attach_type: libbpf_sys::BPF_TRACE_UPROBE_MULTI,
        ..Default::default()
    };
    let mut opts = opts;
    // SAFETY: two valid instructions (8 bytes each, `bpf_insn`'s layout) and sized options.
    let prog = unsafe {
        libbpf_sys::bpf_prog_load(
            libbpf_sys::BPF_PROG_TYPE_KPROBE,
            std::ptr::null(),
            c"GPL".as_ptr(),
            insns.as_ptr().cast(),
            insns.len() as _,
            &mut opts,
        )
    };
    if prog < 0 {
        return false;
    }
    let offset: libc::c_ulong = 0;
    let link = |pid: u32| {
        let mut lopts = libbpf_sys::bpf_link_create_opts {
            sz: size_of::<libbpf_sys::bpf_link_create_opts>() as _,
            ..Default::default()
        };
        lopts.__bindgen_anon_1.uprobe_multi.path = c"/".as_ptr();
        lopts.__bindgen_anon_1.uprobe_multi.offsets = &offset;
        lopts.__bindgen_anon_1.uprobe_multi.cnt = 1;
        lopts.__bindgen_anon_1.uprobe_multi.pid = pid;
        // SAFETY: `prog` is a loaded program; the options point at `offset` and a C string,
        // both alive for the call.
        let fd = unsafe {
            libbpf_sys::bpf_link_create(prog, -1, libbpf_sys::BPF_TRACE_UPROBE_MULTI, &lopts)
        };
        let err = std::io::Error::last_os_error().raw_os_error();
        if fd >= 0 {
            // SAFETY: closing the link just created.
            unsafe { libc::close(fd) };
        }
        (fd, err)
    };
    let (fd, err) = link(0);
    let has = if fd >= 0 || err != Some(libc::EBADF) {
        false
    } else {
        let (fd, err) = link(u32::MAX);
        fd < 0 && err == Some(libc::EINVAL)
    };
    // SAFETY: closing the program loaded above.
    unsafe { libc::close(prog) };
    has
}
