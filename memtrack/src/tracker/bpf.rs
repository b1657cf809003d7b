//! Loading memtrack-bpf's object for one target process and attaching its probes.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, Object, ObjectBuilder, UprobeMultiOpts};
use memtrack_bpf::{RawConfig, RawStats};

use super::TrackerError;

type Result<T, E = TrackerError> = std::result::Result<T, E>;

/// The loaded BPF object of one target process, its maps, and its links.
pub(crate) struct Bpf {
    obj: Object,
    pub(crate) target: u32,
    /// The 4-byte `.bss`: the runtime switch.
    bss: Arc<MapHandle>,
    pub(crate) events: Arc<MapHandle>,
    stats: Arc<MapHandle>,
    /// The per-CPU counters' lookup buffer, allocated once: reading the counters must not
    /// allocate, since a criterion measurement reads them on the measured thread.
    stats_buf: Mutex<Vec<u8>>,
    /// The per-thread state map, where memtrack's own threads are marked excluded.
    pub(crate) excluded: Arc<MapHandle>,
    /// Whether to record syscalls (the `tp_btf/sys_exit` program).
    syscalls: bool,
    /// The syscall tracepoint's link while a recording runs. The program runs for every
    /// syscall of every process (~85 ns each, measured on getppid), so it is attached only
    /// while recording, never for the tracker's whole lifetime.
    syscall_link: Mutex<Option<Link>>,
    /// The uprobe links and what they cover; a mutex so that files can be attached while a
    /// recording runs (libraries the target maps later).
    attached: Mutex<Attached>,
}

#[derive(Default)]
struct Attached {
    links: Vec<Link>,
    /// (device, inode) of every file examined, so a file mapped twice is probed once.
    probed: HashSet<(u64, u64)>,
    /// Paths already examined (a cheap first filter for rescans of /proc/PID/maps).
    paths: HashSet<PathBuf>,
    /// Probe sites attached, over all files.
    sites: usize,
}

fn handle(obj: &Object, pred: impl Fn(&str) -> bool, what: &str) -> Result<Arc<MapHandle>> {
    let map = obj
        .maps()
        .find(|m| pred(&m.name().to_string_lossy()))
        .ok_or_else(|| TrackerError::InvalidOption(format!("BPF object has no map {what}")))?;
    MapHandle::try_from(&map)
        .map(Arc::new)
        .map_err(|e| TrackerError::bpf(format!("duplicating the {what} map"), e))
}

impl Bpf {
    /// Loads the program for process `target` with a ring buffer of `ringbuf_bytes` and, if
    /// `syscalls`, attaches the syscall tracepoint. Recording stays disabled.
    pub(crate) fn load(target: u32, ringbuf_bytes: u64, syscalls: bool) -> Result<Self> {
        if !Path::new("/sys/kernel/btf/vmlinux").exists() {
            return Err(TrackerError::NoBtf);
        }
        let mut open = ObjectBuilder::default()
            .open_memory(memtrack_bpf::OBJECT)
            .map_err(|e| TrackerError::bpf("opening memtrack's BPF object", e))?;
        let mut config = RawConfig::new(target);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        config.page_size = u64::try_from(page).unwrap_or(4096);
        for mut map in open.maps_mut() {
            let name = map.name().to_string_lossy().into_owned();
            if name.ends_with(".rodata") {
                let init = map.initial_value_mut().ok_or_else(|| {
                    TrackerError::InvalidOption("BPF object's .rodata has no data".into())
                })?;
                if init.len() != RawConfig::SIZE {
                    return Err(TrackerError::InvalidOption(format!(
                        "BPF object's .rodata is {} bytes, expected {} (memtrack.h and the Rust \
                         mirror disagree: regenerate the object)",
                        init.len(),
                        RawConfig::SIZE
                    )));
                }
                init.copy_from_slice(&config.to_bytes());
            } else if name == memtrack_bpf::MAP_EVENTS {
                map.set_max_entries(ringbuf_bytes as u32)
                    .map_err(|e| TrackerError::bpf("sizing the ring buffer", e))?;
            }
        }
        let obj = open
            .load()
            .map_err(|e| TrackerError::bpf("loading memtrack's BPF program", e))?;
        let bss = handle(&obj, |n| n.ends_with(".bss"), ".bss")?;
        let events = handle(&obj, |n| n == memtrack_bpf::MAP_EVENTS, "events")?;
        let stats = handle(&obj, |n| n == memtrack_bpf::MAP_STATS, "stats")?;
        let excluded = handle(&obj, |n| n == memtrack_bpf::MAP_CALLS, "calls")?;
        Ok(Self {
            obj,
            target,
            bss,
            events,
            stats,
            stats_buf: Mutex::new(vec![0u8; stats_stride() * possible_cpus()?]),
            excluded,
            syscalls,
            syscall_link: Mutex::new(None),
            attached: Mutex::new(Attached::default()),
        })
    }

    /// Attaches the allocator probes of the ELF file `path` for the target process. Returns
    /// how many sites were attached (0 if it defines no allocator entry point or was already
    /// probed).
    pub(crate) fn attach_file(&self, path: &Path) -> Result<usize> {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        if !attached.paths.insert(path.to_path_buf()) {
            return Ok(0);
        }
        let meta = std::fs::metadata(path).map_err(|source| TrackerError::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        if !attached.probed.insert((meta.dev(), meta.ino())) {
            return Ok(0);
        }
        let sites = memtrack_bpf::probe_sites(path)?;
        if sites.is_empty() {
            return Ok(0);
        }
        let pid = self.target as i32;
        // One uprobe_multi link per program and file: closing a link waits ~130 ms for the
        // kernel to synchronise, measured here; a link per site made `record` of a C++
        // program take seconds to detach.
        let entry = UprobeMultiOpts {
            offsets: sites.iter().map(|s| s.offset as usize).collect(),
            cookies: sites.iter().map(|s| s.entry.cookie()).collect(),
            ..Default::default()
        };
        let ret = UprobeMultiOpts {
            offsets: sites
                .iter()
                .filter(|s| s.ret)
                .map(|s| s.offset as usize)
                .collect(),
            retprobe: true,
            ..Default::default()
        };
        for (program, opts) in [
            (memtrack_bpf::PROG_ENTRY, entry),
            (memtrack_bpf::PROG_RET, ret),
        ] {
            if opts.offsets.is_empty() {
                continue;
            }
            let n = opts.offsets.len();
            let prog = self
                .obj
                .progs_mut()
                .find(|p| p.name() == program)
                .ok_or_else(|| TrackerError::InvalidOption(format!("no BPF program {program}")))?;
            let link = prog
                .attach_uprobe_multi_with_opts(pid, path, "", opts)
                .map_err(|e| {
                    TrackerError::bpf(
                        format!(
                            "attaching {program} to {n} sites of {} for pid {pid}",
                            path.display()
                        ),
                        e,
                    )
                })?;
            attached.links.push(link);
        }
        attached.sites += sites.len();
        Ok(sites.len())
    }

    /// Probe sites attached so far, over all files.
    pub(crate) fn sites(&self) -> usize {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sites
    }

    /// Attaches the syscall tracepoint (if syscalls are recorded) for a recording.
    pub(crate) fn attach_syscalls(&self) -> Result<()> {
        if !self.syscalls {
            return Ok(());
        }
        let mut link = self.syscall_link.lock().unwrap_or_else(|e| e.into_inner());
        if link.is_some() {
            return Ok(());
        }
        let name = memtrack_bpf::PROG_SYS_EXIT;
        let prog = self
            .obj
            .progs_mut()
            .find(|p| p.name() == name)
            .ok_or_else(|| TrackerError::InvalidOption(format!("no BPF program {name}")))?;
        *link = Some(
            prog.attach()
                .map_err(|e| TrackerError::bpf(format!("attaching {name} (tp_btf)"), e))?,
        );
        Ok(())
    }

    /// Detaches the syscall tracepoint after a recording: other processes stop paying for it.
    pub(crate) fn detach_syscalls(&self) {
        drop(
            self.syscall_link
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    /// Sets the program's `.bss` switch to `bits` (`memtrack_bpf::SWITCH_*`; 0 = off).
    pub(crate) fn set_switch(&self, bits: u32) -> Result<()> {
        self.bss
            .update(&0u32.to_ne_bytes(), &bits.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| TrackerError::bpf("flipping the recording switch", e))
    }

    /// The counters summed over CPUs.
    pub(crate) fn stats(&self) -> Result<RawStats> {
        let mut buf = self.stats_buf.lock().unwrap_or_else(|e| e.into_inner());
        let key = 0u32;
        // SAFETY: the map is a per-CPU array with a `u32` key; `buf` holds one value slot
        // (rounded up to 8 bytes, as the kernel copies them) for every possible CPU.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_map_lookup_elem(
                self.stats.as_fd().as_raw_fd(),
                (&key as *const u32).cast(),
                buf.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(TrackerError::Io {
                what: "reading the BPF counters".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(buf
            .chunks_exact(stats_stride())
            .filter_map(|b| RawStats::from_bytes(&b[..RawStats::SIZE]))
            .fold(RawStats::default(), |a, b| a + b))
    }
}

/// Bytes per CPU of a per-CPU value as the kernel copies it out.
fn stats_stride() -> usize {
    RawStats::SIZE.next_multiple_of(8)
}

fn possible_cpus() -> Result<usize> {
    // SAFETY: no preconditions; returns a count or a negative errno.
    let n = unsafe { libbpf_rs::libbpf_sys::libbpf_num_possible_cpus() };
    usize::try_from(n).map_err(|_| TrackerError::Io {
        what: "counting the possible CPUs".into(),
        source: std::io::Error::from_raw_os_error(-n),
    })
}

/// Never records thread `tid` of this process (memtrack's own threads): sets the exclusion
/// flag of its task-local state, which user space addresses by a thread pidfd.
pub(crate) fn exclude_tid(calls: &MapHandle, tid: u32) -> Result<()> {
    const PIDFD_THREAD: libc::c_long = libc::O_EXCL as libc::c_long;
    // SAFETY: pidfd_open takes a tid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::c_long, PIDFD_THREAD) };
    if fd < 0 {
        return Err(TrackerError::Io {
            what: format!("pidfd_open of memtrack thread {tid} (Linux 6.9+ is needed)"),
            source: std::io::Error::last_os_error(),
        });
    }
    let fd = fd as i32;
    let mut value = vec![0u8; calls.value_size() as usize];
    value[..4].copy_from_slice(&1u32.to_ne_bytes());
    let res = calls
        .update(&fd.to_ne_bytes(), &value, MapFlags::ANY)
        .map_err(|e| TrackerError::bpf("excluding a memtrack thread", e));
    // SAFETY: closing the pidfd opened above.
    unsafe { libc::close(fd) };
    res
}

/// The calling thread's kernel thread id.
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

impl Drop for Bpf {
    /// Detaches the uprobes in parallel: each close waits for an RCU grace period, so
    /// closing hundreds one after another takes visibly long.
    fn drop(&mut self) {
        let attached = self.attached.get_mut().unwrap_or_else(|e| e.into_inner());
        let links = std::mem::take(&mut attached.links);
        let threads = 8.min(links.len());
        if threads > 1 {
            let per = links.len().div_ceil(threads);
            let mut links = links;
            let mut chunks = Vec::new();
            while !links.is_empty() {
                let rest = links.split_off(per.min(links.len()));
                chunks.push(std::mem::replace(&mut links, rest));
            }
            std::thread::scope(|s| {
                for chunk in chunks {
                    s.spawn(move || drop(chunk));
                }
            });
        }
        self.detach_syscalls();
    }
}

/// The distinct ELF files mapped executable into process `pid` (from /proc/PID/maps).
pub(crate) fn mapped_objects(pid: u32) -> Result<Vec<PathBuf>> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).map_err(|source| TrackerError::Io {
        what: format!("reading {path}"),
        source,
    })?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        // "start-end perms offset dev inode   /path": only the path contains a '/'.
        let perms = line.split_whitespace().nth(1).unwrap_or("");
        let Some(file) = line.find('/').map(|i| &line[i..]) else {
            continue;
        };
        if !perms.contains('x') || line.ends_with("(deleted)") {
            continue;
        }
        if seen.insert(file.to_owned()) {
            out.push(PathBuf::from(file));
        }
    }
    Ok(out)
}
