//! Loading memtrack-bpf's object for one target process and attaching its probes.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libbpf_rs::{
    Link, MapCore, MapFlags, MapHandle, Object, ObjectBuilder, ProgramAttachType, UprobeMultiOpts,
    UprobeOpts,
};
use memtrack_bpf::{RawConfig, RawStats, RawSwitch};

use super::TrackerError;
use super::kernel::{Feature, Kernel};

type Result<T, E = TrackerError> = std::result::Result<T, E>;

/// The loaded BPF object of one target process, its maps, and its links.
pub(crate) struct Bpf {
    obj: Object,
    pub(crate) target: u32,
    /// The `.bss`: the runtime switch ([`RawSwitch`]).
    bss: Arc<MapHandle>,
    pub(crate) events: Arc<MapHandle>,
    stats: Arc<MapHandle>,
    /// The per-CPU counters' lookup buffer, allocated once: reading the counters must not
    /// allocate, since a criterion measurement reads them on the measured thread.
    stats_buf: Mutex<Vec<u8>>,
    /// The per-thread state map, where memtrack's own threads are marked excluded.
    pub(crate) excluded: Arc<ThreadStates>,
    /// One uprobe.multi link per program and file; else (the kernel lacks them) one link per
    /// probe site.
    multi: bool,
    /// The thread-exit program's link, for the object's life ([`Kernel::tid_state`] only: it
    /// deletes an exiting thread's tid-keyed state).
    exit_link: Option<Link>,
    /// How mmap, munmap, mremap and brk are recorded, if at all.
    syscalls: Syscalls,
    /// The raw-syscall tracepoint's link while a recording runs ([`Syscalls::Raw`] only).
    /// The program runs for every syscall of every process (the guide's performance
    /// page gives the cost), so it is attached only while recording, never for the tracker's
    /// lifetime.
    syscall_link: Mutex<Option<Link>>,
    /// The `sched_process_fork` program's link while a thread-scoped recording runs (it runs
    /// for every thread creation on the machine, so never longer).
    fork_link: Mutex<Option<Link>>,
    /// The `sched_process_exec` program's link while a recording runs (an exec ends the
    /// image's heap; it runs for every exec on the machine, which is rare).
    exec_link: Mutex<Option<Link>>,
    /// The `sched_switch` program's link while a recording of lock waits runs (it runs for
    /// every context switch on the machine, so never longer).
    switch_link: Mutex<Option<Link>>,
    /// The lock-wait program, loaded by the first recording that asks for lock waits (its
    /// verification is most of a cold start, which a recording without them need not pay): a
    /// second instance of the object with only that program, sharing every map of `obj`.
    switch_obj: once_cell::sync::OnceCell<Object>,
    /// The threads closing the links of earlier recordings, oldest first (finished ones are
    /// pruned at the next detach or attach).
    reapers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The uprobe links and what they cover; a mutex so that files can be attached while a
    /// recording runs (libraries the target maps later).
    attached: Mutex<Attached>,
    /// Following (`record`'s default): the set of recorded processes, and each one's links.
    follow: Option<Following>,
    /// The processes the target starts are counted ([`memtrack_bpf::FOLLOW_COUNT`]).
    counts_children: bool,
    /// Wall clock of opening (parsing) and loading (maps, verifier) the object.
    pub(crate) load_times: (Duration, Duration),
    /// Of the last [`Bpf::attach_probes`] that attached: waiting for the previous probes'
    /// background detach, and creating the links.
    pub(crate) attach_times: Mutex<(Duration, Duration)>,
}

/// The processes a following tracker records: each has links of its own (uprobes stay
/// pid-scoped), attached by the tracer before the process runs its first instruction.
struct Following {
    /// The `followed` map: a process is recorded while its tgid is in it.
    map: MapHandle,
    /// Per process, its links and the files (device, inode) they cover.
    procs: Mutex<HashMap<u32, ProcLinks>>,
    /// Probe sites of every ELF file examined, by (device, inode): a file is parsed once
    /// however many processes map it (`None`: no allocator sites, not ELF).
    sites: Mutex<HashMap<FileId, Option<Arc<FileSites>>>>,
    /// Links of processes that ended, closed on a thread of their own (each close waits for
    /// an RCU grace period, tens of ms: the tracer must not).
    closer: Mutex<Option<std::sync::mpsc::Sender<Vec<Link>>>>,
    closer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A file by (device, inode).
type FileId = (u64, u64);

/// The links of one followed process.
#[derive(Default)]
struct ProcLinks {
    links: Vec<Link>,
    files: HashSet<(u64, u64)>,
}

/// What a file contributes to a followed process: allocator sites, and ld.so's hook.
struct FileSites {
    probed: Option<ProbedFile>,
    /// File offset of `_dl_debug_state` (ld.so only).
    dl_state: Option<usize>,
}

/// How a tracker records mmap, munmap, mremap and brk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syscalls {
    /// Not at all.
    Off,
    /// Through uprobes on libc's wrappers, for the target's pid only: other processes pay
    /// nothing; raw syscalls that bypass libc are missed.
    Wrappers,
    /// Through the global `tp_btf/sys_exit` program: every syscall, at a cost to every
    /// process on the machine while recording.
    Raw,
}

/// One ELF file's probe sites, resolved once (parsing the ELF and placing the probes is the
/// expensive part) and attached again for every recording.
struct ProbedFile {
    path: PathBuf,
    /// Entry-probe offsets and their cookies (`memtrack_bpf::ProbeSite::cookie`).
    entry: Vec<(usize, u64)>,
    /// Offsets that also get a return probe, and their cookies (the same as at entry).
    ret: Vec<(usize, u64)>,
}

impl ProbedFile {
    /// The links' offsets and cookies for `sites` of `path` (one place, so that the
    /// single-process and the following paths attach the same programs the same way).
    fn new(path: &Path, sites: &[memtrack_bpf::ProbeSite]) -> Self {
        Self {
            path: path.to_path_buf(),
            entry: sites
                .iter()
                .map(|s| (s.offset as usize, s.cookie()))
                .collect(),
            ret: sites
                .iter()
                .filter(|s| s.ret)
                .map(|s| (s.offset as usize, s.cookie()))
                .collect(),
        }
    }
}

#[derive(Default)]
struct Attached {
    /// Every file with probe sites, in the order found.
    files: Vec<ProbedFile>,
    /// The uprobe links, `Some` exactly while the probes are attached: while the tracker's
    /// switch state needs them (its lock decides every attach and detach), never otherwise (an
    /// attached uprobe traps on every call even when its program returns at once; the
    /// `after_session` test holds it).
    links: Option<Vec<Link>>,
    /// (device, inode) of every file examined, so a file mapped twice is probed once.
    probed: HashSet<(u64, u64)>,
    /// Paths already examined (a cheap first filter for rescans of /proc/PID/maps).
    paths: HashSet<PathBuf>,
    /// Probe sites over all files.
    sites: usize,
}

fn handle(obj: &Object, pred: impl Fn(&str) -> bool, what: &str) -> Result<Arc<MapHandle>> {
    let map = obj
        .maps()
        .find(|m| pred(&m.name().to_string_lossy()))
        .ok_or_else(|| TrackerError::ObjectMismatch(format!("it has no map {what}")))?;
    MapHandle::try_from(&map)
        .map(Arc::new)
        .map_err(|e| TrackerError::bpf(format!("duplicating the {what} map"), e))
}

/// Sets the loaded program's configuration (`.rodata`) and ring buffer size, and leaves out
/// the programs no recording of this tracker can use: the verifier is most of a cold start.
/// The lock-wait program is loaded on first use ([`Bpf::attach_switch`]).
fn configure(
    open: &mut libbpf_rs::OpenObject,
    config: &RawConfig,
    ringbuf_bytes: u64,
    syscalls: Syscalls,
    kernel: &Kernel,
) -> Result<()> {
    let tid_state = kernel.tid_state();
    for mut map in open.maps_mut() {
        let name = map.name().to_string_lossy().into_owned();
        if name.ends_with(".rodata") {
            let init = map
                .initial_value_mut()
                .ok_or_else(|| TrackerError::ObjectMismatch("its .rodata has no data".into()))?;
            if init.len() != RawConfig::SIZE {
                return Err(TrackerError::ObjectMismatch(format!(
                    "its .rodata is {} bytes, expected {} (memtrack.h and the Rust mirror \
                     disagree)",
                    init.len(),
                    RawConfig::SIZE
                )));
            }
            init.copy_from_slice(&config.to_bytes());
        } else if name == memtrack_bpf::MAP_EVENTS {
            map.set_max_entries(ringbuf_bytes as u32)
                .map_err(|e| TrackerError::bpf("sizing the ring buffer", e))?;
        }
        // Only the per-thread state map in use is created (the other one's references are
        // in code the verifier proves dead for this configuration).
        let unused = if tid_state {
            name == memtrack_bpf::MAP_CALLS
        } else {
            name == memtrack_bpf::MAP_CALLS_TID || name == MAP_CALLS_ZERO
        };
        if unused {
            map.set_autocreate(false)
                .map_err(|e| TrackerError::bpf(format!("leaving out the {name} map"), e))?;
        }
    }
    let multi = kernel.has(Feature::UprobeMulti);
    for mut prog in open.progs_mut() {
        let name = prog.name().to_string_lossy();
        let needed = match &*name {
            memtrack_bpf::PROG_SWITCH | memtrack_bpf::PROG_NOP => false,
            memtrack_bpf::PROG_SYS_EXIT => syscalls == Syscalls::Raw,
            memtrack_bpf::PROG_DL_STATE => config.follow == memtrack_bpf::FOLLOW_TREE,
            memtrack_bpf::PROG_THREAD_EXIT => tid_state,
            _ => true,
        };
        if !needed {
            prog.set_autoload(false);
        }
        let uprobe = matches!(
            &*name,
            memtrack_bpf::PROG_ENTRY
                | memtrack_bpf::PROG_RET
                | memtrack_bpf::PROG_DL_STATE
                | memtrack_bpf::PROG_NOP
        );
        if !multi && uprobe {
            // A plain uprobe program (expected attach type 0, which the enum calls
            // CgroupInetIngress), attached site by site through perf events.
            prog.set_attach_type(ProgramAttachType::CgroupInetIngress);
        }
    }
    Ok(())
}

/// The map a new tid-keyed state starts from ([`memtrack_bpf::MAP_CALLS_TID`]'s companion).
const MAP_CALLS_ZERO: &str = "calls_zero";

impl Following {
    /// The state of following a process tree, with the thread that closes the links of the
    /// processes that end (closing waits for the kernel: never on the tracer's thread).
    fn new(obj: &Object) -> Result<Self> {
        let map = handle(obj, |n| n == memtrack_bpf::MAP_FOLLOWED, "followed")?;
        let map = Arc::try_unwrap(map)
            .map_err(|_| TrackerError::Internal("the followed map's handle is shared"))?;
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Link>>();
        let thread = std::thread::Builder::new()
            .name("memtrack-detach".into())
            .spawn(move || {
                while let Ok(mut batch) = rx.recv() {
                    // Everything queued meanwhile is closed in the same parallel batch.
                    while let Ok(more) = rx.try_recv() {
                        batch.extend(more);
                    }
                    detach_all(batch);
                }
            })
            .map_err(|source| TrackerError::Io {
                what: "starting memtrack's link-closing thread".into(),
                source,
            })?;
        Ok(Following {
            map,
            procs: Mutex::new(HashMap::new()),
            sites: Mutex::new(HashMap::new()),
            closer: Mutex::new(Some(tx)),
            closer_thread: Mutex::new(Some(thread)),
        })
    }
}

impl Bpf {
    /// Loads the program for process `target` with a ring buffer of `ringbuf_bytes`, recording
    /// syscalls as `syscalls` says, and the processes it starts as `follow` says
    /// ([`memtrack_bpf::FOLLOW_NONE`], `FOLLOW_TREE` or `FOLLOW_COUNT`). Nothing is attached: the probes and tracepoints are
    /// attached per recording.
    pub(crate) fn load(
        target: u32,
        ringbuf_bytes: u64,
        syscalls: Syscalls,
        follow: u32,
        stack_depth: u32,
    ) -> Result<Self> {
        let kernel = Kernel::get();
        kernel.check()?;
        let t0 = Instant::now();
        let mut open = ObjectBuilder::default()
            .open_memory(memtrack_bpf::OBJECT)
            .map_err(|e| TrackerError::bpf("opening memtrack's BPF object", e))?;
        let mut config = RawConfig::new(target);
        config.follow = follow;
        config.stack_depth = stack_depth;
        config.fallbacks = kernel.fallbacks();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        config.page_size = u64::try_from(page).unwrap_or(4096);
        configure(&mut open, &config, ringbuf_bytes, syscalls, kernel)?;
        let opened = t0.elapsed();
        let t1 = Instant::now();
        let obj = open
            .load()
            .map_err(|e| TrackerError::bpf("loading memtrack's BPF program", e))?;
        let loaded = t1.elapsed();
        let bss = handle(&obj, |n| n.ends_with(".bss"), ".bss")?;
        let events = handle(&obj, |n| n == memtrack_bpf::MAP_EVENTS, "events")?;
        let stats = handle(&obj, |n| n == memtrack_bpf::MAP_STATS, "stats")?;
        let tid_state = kernel.tid_state();
        let calls = if tid_state {
            memtrack_bpf::MAP_CALLS_TID
        } else {
            memtrack_bpf::MAP_CALLS
        };
        let excluded = handle(&obj, |n| n == calls, calls)?;
        let excluded = Arc::new(ThreadStates {
            map: Arc::try_unwrap(excluded)
                .map_err(|_| TrackerError::Internal("the calls map's handle is shared"))?,
            by_tid: tid_state,
        });
        let exit_link = if tid_state {
            let slot = Mutex::new(None);
            attach_tp_of(&obj, &slot, memtrack_bpf::PROG_THREAD_EXIT)?;
            slot.into_inner().unwrap_or_else(|e| e.into_inner())
        } else {
            None
        };
        let follow = if follow == memtrack_bpf::FOLLOW_TREE {
            Some(Following::new(&obj)?)
        } else {
            None
        };
        Ok(Self {
            obj,
            target,
            bss,
            events,
            stats,
            stats_buf: Mutex::new(vec![0u8; stats_stride() * possible_cpus()?]),
            excluded,
            multi: kernel.has(Feature::UprobeMulti),
            exit_link,
            syscalls,
            syscall_link: Mutex::new(None),
            fork_link: Mutex::new(None),
            exec_link: Mutex::new(None),
            switch_link: Mutex::new(None),
            switch_obj: once_cell::sync::OnceCell::new(),
            reapers: Mutex::new(Vec::new()),
            attached: Mutex::new(Attached::default()),
            follow,
            counts_children: config.follow == memtrack_bpf::FOLLOW_COUNT,
            load_times: (opened, loaded),
            attach_times: Mutex::new((Duration::ZERO, Duration::ZERO)),
        })
    }

    /// Whether this tracker follows a process tree (a tracer sees its execs and dlopens).
    pub(crate) fn follows(&self) -> bool {
        self.follow.is_some()
    }

    fn following(&self) -> Result<&Following> {
        self.follow.as_ref().ok_or(TrackerError::Internal(
            "a process was followed with a tracker not loaded to follow",
        ))
    }

    /// Records process `pid` from now on (a following tracker: its tgid joins the
    /// `followed` map). Its probes are attached with [`Bpf::attach_process_files`].
    pub(crate) fn follow_process(&self, pid: u32) -> Result<()> {
        let f = self.following()?;
        f.map
            .update(&pid.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| TrackerError::bpf(format!("following process {pid}"), e))?;
        lock(&f.procs).entry(pid).or_default();
        Ok(())
    }

    /// Stops recording process `pid` at once (it left the followed set), and closes its links
    /// in the background.
    pub(crate) fn unfollow_process(&self, pid: u32) {
        let Some(f) = &self.follow else { return };
        // ENOENT (never followed) is what we want anyway.
        let _ = f.map.delete(&pid.to_ne_bytes());
        let links = lock(&f.procs).remove(&pid).map(|p| p.links);
        if let Some(links) = links.filter(|l| !l.is_empty()) {
            match lock(&f.closer).as_ref() {
                Some(tx) => {
                    if let Err(e) = tx.send(links) {
                        drop(e.0);
                    }
                }
                None => drop(links),
            }
        }
    }

    /// Closes the links of process `pid` and waits until they are gone (its image changed
    /// under links that point at a thread that no longer exists: new ones follow).
    pub(crate) fn relink_process(&self, pid: u32) -> Result<()> {
        let f = self.following()?;
        let old = lock(&f.procs).insert(pid, ProcLinks::default());
        // Its files are probed again from scratch.
        if let Some(old) = old {
            detach_all(old.links);
        }
        Ok(())
    }

    /// Attaches, for process `pid` (followed), the allocator probes of every file in `files`
    /// it has none on yet, and the dynamic loader's hook ([`memtrack_bpf::PROG_DL_STATE`]) if
    /// one of them is ld.so. Returns the files whose probes could not be attached, with why
    /// (a file that is not ELF or defines no allocator is not a failure).
    pub(crate) fn attach_process_files(
        &self,
        pid: u32,
        files: &[PathBuf],
    ) -> Result<Vec<(PathBuf, String)>> {
        let f = self.following()?;
        let mut failed = Vec::new();
        for path in files {
            let Ok(meta) = std::fs::metadata(path) else {
                continue;
            };
            let key = (meta.dev(), meta.ino());
            if lock(&f.procs)
                .get(&pid)
                .is_some_and(|p| p.files.contains(&key))
            {
                continue;
            }
            let sites = {
                let mut cache = lock(&f.sites);
                match cache.get(&key) {
                    Some(s) => s.clone(),
                    None => {
                        let s = self.file_sites(path).map(Arc::new);
                        cache.insert(key, s.clone());
                        s
                    }
                }
            };
            let mut links = Vec::new();
            if let Some(sites) = &sites {
                let attached = (|| {
                    if let Some(p) = &sites.probed {
                        links.extend(self.link_file_for(p, pid)?);
                    }
                    if let Some(off) = sites.dl_state {
                        links.extend(self.link_sites(
                            pid,
                            path,
                            memtrack_bpf::PROG_DL_STATE,
                            &[(off, 0)],
                            false,
                        )?);
                    }
                    Ok::<_, TrackerError>(())
                })();
                if let Err(e) = attached {
                    detach_all(std::mem::take(&mut links));
                    failed.push((path.clone(), e.to_string()));
                    continue;
                }
            }
            let mut procs = lock(&f.procs);
            let p = procs.entry(pid).or_default();
            p.files.insert(key);
            p.links.extend(links);
        }
        Ok(failed)
    }

    /// Whether any of `files` (examined by [`Bpf::attach_process_files`]) has allocator
    /// probe sites.
    pub(crate) fn any_allocator(&self, files: &[PathBuf]) -> bool {
        let Some(f) = &self.follow else { return false };
        let cache = lock(&f.sites);
        files.iter().any(|path| {
            std::fs::metadata(path).is_ok_and(|m| {
                cache
                    .get(&(m.dev(), m.ino()))
                    .is_some_and(|s| s.as_ref().is_some_and(|s| s.probed.is_some()))
            })
        })
    }

    /// The allocator sites of `path` and its `_dl_debug_state`, or `None` if it has neither
    /// (or is not an ELF file).
    fn file_sites(&self, path: &Path) -> Option<FileSites> {
        let elf = memtrack_bpf::Elf::open(path).ok()?;
        let sites = self.recorded_sites(memtrack_bpf::probe_sites_in(&elf));
        let dl_state = elf
            .functions()
            .find(|s| s.name == memtrack_bpf::DL_STATE_SYMBOL)
            .and_then(|s| elf.file_offset(s.vaddr))
            .map(|o| o as usize);
        let probed = (!sites.is_empty()).then(|| ProbedFile::new(path, &sites));
        (probed.is_some() || dl_state.is_some()).then_some(FileSites { probed, dl_state })
    }

    /// The sites of `sites` this tracker probes: the syscall wrappers' only in the mode that
    /// uses them (with the raw tracepoint too, every mapping would be recorded twice).
    fn recorded_sites(
        &self,
        mut sites: Vec<memtrack_bpf::ProbeSite>,
    ) -> Vec<memtrack_bpf::ProbeSite> {
        if self.syscalls != Syscalls::Wrappers {
            sites.retain(|s| !s.entry.is_syscall());
        }
        sites
    }

    /// Adds the allocator probe sites of the ELF file `path` (attached at once if the probes
    /// are live, else at the next [`Bpf::attach_probes`]). Returns how many sites it has (0 if
    /// it defines no allocator entry point or was already examined).
    pub(crate) fn add_file(&self, path: &Path) -> Result<usize> {
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
        let sites = self.recorded_sites(memtrack_bpf::probe_sites(path)?);
        if sites.is_empty() {
            return Ok(0);
        }
        let file = ProbedFile::new(path, &sites);
        if attached.links.is_some() {
            let links = self.link_file_for(&file, self.target)?;
            attached.links.get_or_insert_default().extend(links);
        }
        attached.files.push(file);
        attached.sites += sites.len();
        Ok(sites.len())
    }

    /// Attaches every known file's probes (a no-op if they are attached).
    pub(crate) fn attach_probes(&self) -> Result<()> {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        if attached.links.is_some() {
            return Ok(());
        }
        // The links being closed in the background must be gone first: a site probed by an
        // old and a new link at once would record every call twice.
        let t0 = Instant::now();
        let reapers = std::mem::take(&mut *lock(&self.reapers));
        for t in reapers {
            let _ = t.join();
        }
        let waited = t0.elapsed();
        let t1 = Instant::now();
        let mut links = Vec::new();
        for file in &attached.files {
            match self.link_file_for(file, self.target) {
                Ok(l) => links.extend(l),
                Err(e) => {
                    detach_all(links);
                    return Err(e);
                }
            }
        }
        attached.links = Some(links);
        *lock(&self.attach_times) = (waited, t1.elapsed());
        Ok(())
    }

    /// Detaches every probe and returns when all are gone. Each link's close waits for the
    /// kernel to synchronise (an RCU grace period), so they are closed in parallel.
    pub(crate) fn detach_probes(&self) {
        detach_all(self.take_links());
        let reapers = std::mem::take(&mut *lock(&self.reapers));
        for t in reapers {
            let _ = t.join();
        }
    }

    /// Detaches every probe in the background and returns at once: closing a link removes
    /// its breakpoints first, then waits for an RCU grace period (tens of ms) that
    /// costs the process nothing, so a session need not wait for it. The next
    /// [`Bpf::attach_probes`] waits for the closes to end.
    pub(crate) fn detach_probes_in_background(&self) {
        if !self.multi {
            // A link per site (perf-event uprobes) keeps its breakpoint until its close has
            // waited for the grace period: closed in the background, the probes would still
            // trap after the recording (`tests/after_session`). Waited for here.
            self.detach_probes();
            return;
        }
        let links = self.take_links();
        if links.is_empty() {
            return;
        }
        let mut reapers = lock(&self.reapers);
        reapers.retain(|t| !t.is_finished());
        // If no thread can be started, the closure (and the links in it) is dropped with the
        // error: the links are closed here, synchronously.
        if let Ok(t) = std::thread::Builder::new()
            .name("memtrack-detach".into())
            .stack_size(CLOSER_STACK)
            .spawn(move || detach_all(links))
        {
            reapers.push(t);
        }
    }

    fn take_links(&self) -> Vec<Link> {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        attached.links.take().unwrap_or_default()
    }

    /// The uprobe_multi links of one file for process `pid`: one per program and file
    /// (closing a link waits for the kernel to synchronise, so a link per site would make
    /// detaching from a C++ program take seconds).
    fn link_file_for(&self, file: &ProbedFile, pid: u32) -> Result<Vec<Link>> {
        let mut links = Vec::with_capacity(2);
        for (program, sites, ret) in [
            (memtrack_bpf::PROG_ENTRY, &file.entry, false),
            (memtrack_bpf::PROG_RET, &file.ret, true),
        ] {
            match self.link_sites(pid, &file.path, program, sites, ret) {
                Ok(l) => links.extend(l),
                Err(e) => {
                    detach_all(links);
                    return Err(e);
                }
            }
        }
        Ok(links)
    }

    /// The links of `program` over `sites` (offset, cookie) of `path` for `pid` (none if
    /// `sites` is empty): one uprobe_multi link, or one link per site on a kernel without
    /// them.
    fn link_sites(
        &self,
        pid: u32,
        path: &Path,
        program: &str,
        sites: &[(usize, u64)],
        retprobe: bool,
    ) -> Result<Vec<Link>> {
        if sites.is_empty() {
            return Ok(Vec::new());
        }
        let n = sites.len();
        let prog = self
            .obj
            .progs_mut()
            .find(|p| p.name() == program)
            .ok_or_else(|| TrackerError::ObjectMismatch(format!("it has no program {program}")))?;
        let failed = |e| {
            TrackerError::bpf(
                format!(
                    "attaching {program} to {n} sites of {} for pid {pid}",
                    path.display()
                ),
                e,
            )
        };
        if self.multi {
            let opts = UprobeMultiOpts {
                offsets: sites.iter().map(|&(o, _)| o).collect(),
                cookies: sites.iter().map(|&(_, c)| c).collect(),
                retprobe,
                ..Default::default()
            };
            return prog
                .attach_uprobe_multi_with_opts(pid as i32, path, "", opts)
                .map(|l| vec![l])
                .map_err(failed);
        }
        let mut links = Vec::with_capacity(n);
        for &(offset, cookie) in sites {
            let opts = UprobeOpts {
                cookie,
                retprobe,
                ..Default::default()
            };
            match prog.attach_uprobe_with_opts(pid as i32, path, offset, opts) {
                Ok(l) => links.push(l),
                Err(e) => {
                    detach_all(links);
                    return Err(failed(e));
                }
            }
        }
        Ok(links)
    }

    /// Probe sites attached so far, over all files.
    pub(crate) fn sites(&self) -> usize {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sites
    }

    /// Attaches the raw-syscall tracepoint (if [`Syscalls::Raw`]) for a recording.
    pub(crate) fn attach_syscalls(&self) -> Result<()> {
        if self.syscalls != Syscalls::Raw {
            return Ok(());
        }
        self.attach_tp(&self.syscall_link, memtrack_bpf::PROG_SYS_EXIT)
    }

    /// Detaches the syscall tracepoint after a recording: other processes stop paying for it.
    pub(crate) fn detach_syscalls(&self) {
        drop(lock(&self.syscall_link).take());
    }

    /// Whether the processes the target starts are counted (`record --no-follow`): the
    /// thread-creation tracepoint is then attached for every recording.
    pub(crate) fn counts_children(&self) -> bool {
        self.counts_children
    }

    /// Attaches the thread-creation tracepoint for a recording scoped to a thread tree, or
    /// counting the processes the target starts.
    pub(crate) fn attach_fork(&self) -> Result<()> {
        self.attach_tp(&self.fork_link, memtrack_bpf::PROG_FORK)
    }

    /// Detaches the thread-creation tracepoint.
    pub(crate) fn detach_fork(&self) {
        drop(lock(&self.fork_link).take());
    }

    /// Attaches the exec tracepoint for a recording.
    pub(crate) fn attach_exec(&self) -> Result<()> {
        self.attach_tp(&self.exec_link, memtrack_bpf::PROG_EXEC)
    }

    /// Detaches the exec tracepoint.
    pub(crate) fn detach_exec(&self) {
        drop(lock(&self.exec_link).take());
    }

    /// Attaches the context-switch tracepoint for a recording of lock waits (loading its
    /// program the first time).
    pub(crate) fn attach_switch(&self) -> Result<()> {
        let obj = self
            .switch_obj
            .get_or_try_init(|| self.load_alone(memtrack_bpf::PROG_SWITCH))?;
        attach_tp_of(obj, &self.switch_link, memtrack_bpf::PROG_SWITCH)
    }

    /// Loads program `name` of the object again, alone, on the maps of the loaded object
    /// (its switch, ring buffer, counters and per-thread state are the same ones; its
    /// `.rodata` the one already frozen).
    fn load_alone(&self, name: &str) -> Result<Object> {
        let _log = super::error::LibbpfLog::capture();
        let mut open = ObjectBuilder::default()
            .open_memory(memtrack_bpf::OBJECT)
            .map_err(|e| TrackerError::bpf("opening memtrack's BPF object", e))?;
        for mut prog in open.progs_mut() {
            let this = prog.name().to_string_lossy() == name;
            prog.set_autoload(this);
        }
        for mut map in open.maps_mut() {
            let map_name = map.name().to_string_lossy().into_owned();
            let loaded = self
                .obj
                .maps()
                .find(|m| m.name().to_string_lossy() == map_name)
                .ok_or_else(|| TrackerError::ObjectMismatch(format!("it has no map {map_name}")))?;
            if !loaded.autocreate() {
                // Left out for this kernel (see `configure`): left out again.
                map.set_autocreate(false)
                    .map_err(|e| TrackerError::bpf(format!("leaving out the {map_name} map"), e))?;
                continue;
            }
            map.reuse_fd(loaded.as_fd())
                .map_err(|e| TrackerError::bpf(format!("sharing the {map_name} map"), e))?;
        }
        open.load()
            .map_err(|e| TrackerError::bpf(format!("loading memtrack's {name} program"), e))
    }

    /// Detaches the context-switch tracepoint: other processes' switches stop paying for it.
    pub(crate) fn detach_switch(&self) {
        drop(lock(&self.switch_link).take());
    }

    fn attach_tp(&self, slot: &Mutex<Option<Link>>, name: &str) -> Result<()> {
        attach_tp_of(&self.obj, slot, name)
    }

    /// Writes the program's `.bss` switch.
    pub(crate) fn set_switch(&self, sw: RawSwitch) -> Result<()> {
        self.bss
            .update(&0u32.to_ne_bytes(), &sw.to_bytes(), MapFlags::ANY)
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

/// The per-thread state map as user space addresses it: task storage by a thread pidfd, or
/// the tid-keyed fallback ([`memtrack_bpf::MAP_CALLS_TID`]) by tid.
pub(crate) struct ThreadStates {
    map: MapHandle,
    by_tid: bool,
}

/// The key of thread `tid`'s state: a thread pidfd (closed on drop), or the tid itself.
enum ThreadKey {
    Pidfd(i32),
    Tid(u32),
}

impl ThreadKey {
    fn open(states: &ThreadStates, tid: u32, whose: &str) -> Result<Self> {
        if states.by_tid {
            return Ok(Self::Tid(tid));
        }
        const PIDFD_THREAD: libc::c_long = libc::O_EXCL as libc::c_long;
        // SAFETY: pidfd_open takes a tid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::c_long, PIDFD_THREAD) };
        if fd < 0 {
            return Err(TrackerError::Io {
                what: format!("pidfd_open of {whose} thread {tid}"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self::Pidfd(fd as i32))
    }

    fn key(&self) -> [u8; 4] {
        match self {
            Self::Pidfd(fd) => fd.to_ne_bytes(),
            Self::Tid(tid) => tid.to_ne_bytes(),
        }
    }
}

impl Drop for ThreadKey {
    fn drop(&mut self) {
        if let Self::Pidfd(fd) = self {
            // SAFETY: closing the pidfd this value owns.
            unsafe { libc::close(*fd) };
        }
    }
}

/// Never records thread `tid` of this process (memtrack's own threads): sets the exclusion
/// flag of its per-thread state.
pub(crate) fn exclude_tid(states: &ThreadStates, tid: u32) -> Result<()> {
    let key = ThreadKey::open(states, tid, "memtrack")?;
    let calls = &states.map;
    let mut value = vec![0u8; calls.value_size() as usize];
    value[..4].copy_from_slice(&1u32.to_ne_bytes());
    calls
        .update(&key.key(), &value, MapFlags::ANY)
        .map_err(|e| TrackerError::bpf("excluding a memtrack thread", e))
}

/// Whether thread `tid` of this process is in the scope of recording `generation` by its mark:
/// a thread spawned by one in the scope (the fork program marks it).
/// Allocates nothing: a nested `#[memtrack]` asks this inside a session that counts it.
pub(crate) fn in_scope(states: &ThreadStates, tid: u32, generation: u32) -> Result<bool> {
    let fd = ThreadKey::open(states, tid, "a")?;
    let calls = &states.map;
    let mut value = [0u8; 128];
    if calls.value_size() as usize > value.len() {
        return Err(TrackerError::ObjectMismatch(format!(
            "its calls map's values are {} bytes, more than the {} expected",
            calls.value_size(),
            value.len()
        )));
    }
    // SAFETY: a lookup in a map keyed by a pidfd or a tid (4 bytes), into a buffer larger
    // than its value size (checked above).
    let rc = unsafe {
        libbpf_rs::libbpf_sys::bpf_map_lookup_elem(
            calls.as_fd().as_raw_fd(),
            fd.key().as_ptr().cast(),
            value.as_mut_ptr().cast(),
        )
    };
    if rc != 0 {
        // ENOENT: the thread never touched the program's state, so it was never marked.
        return match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            source => Err(TrackerError::Io {
                what: "reading a thread's scope".into(),
                source,
            }),
        };
    }
    let at = memtrack_bpf::CALLS_SCOPE_OFFSET;
    let mut g = [0u8; 4];
    g.copy_from_slice(&value[at..at + 4]);
    Ok(u32::from_ne_bytes(g) == generation)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The calling thread's kernel thread id.
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

impl Drop for Bpf {
    fn drop(&mut self) {
        if let Some(f) = &self.follow {
            let links: Vec<Link> = lock(&f.procs).drain().flat_map(|(_, p)| p.links).collect();
            detach_all(links);
            drop(lock(&f.closer).take());
            if let Some(t) = lock(&f.closer_thread).take() {
                let _ = t.join();
            }
        }
        self.detach_probes();
        self.detach_syscalls();
        self.detach_fork();
        self.detach_exec();
        drop(self.exit_link.take());
    }
}

/// Closes `links` in parallel, each on its own thread up to 256: each close waits for an RCU
/// grace period, and waits that run at the same time share one. With 8 threads, `record` of
/// `sh -c 'for i in $(seq 160); do /bin/true; done'` spent 3.8 s closing the 160 processes'
/// links after the command had ended; with one thread per link, 0.1 s (benches/NOTES.md).
fn detach_all(links: Vec<Link>) {
    let threads = 256.min(links.len());
    if threads <= 1 {
        drop(links);
        return;
    }
    let per = links.len().div_ceil(threads);
    let mut links = links;
    let mut chunks = Vec::new();
    while !links.is_empty() {
        let rest = links.split_off(per.min(links.len()));
        chunks.push(std::mem::replace(&mut links, rest));
    }
    std::thread::scope(|s| {
        for chunk in chunks {
            let closer = std::thread::Builder::new()
                .stack_size(CLOSER_STACK)
                .spawn_scoped(s, move || drop(chunk));
            // Without a thread, the chunk was dropped with the error: closed here.
            drop(closer);
        }
    });
}

/// The stack of a thread that closes links: small, so that glibc never hands it a stack the
/// recorded program's threads left in its cache (it reuses a cached stack of 1-4× the size
/// asked for). A closer started by one session's end and still waiting for the kernel's grace
/// period when the next session spawned a thread took that thread's cached stack with the
/// default size: the spawn then allocated its TLS anew (a calloc of 304 bytes here), so what
/// a spawn allocates depended on how soon the next session started (tests/parallel_limits).
const CLOSER_STACK: usize = 64 << 10;

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

/// Attaches the `tp_btf` program `name` of `obj` into `slot` (a no-op if attached).
fn attach_tp_of(obj: &Object, slot: &Mutex<Option<Link>>, name: &str) -> Result<()> {
    let mut link = lock(slot);
    if link.is_some() {
        return Ok(());
    }
    let prog = obj
        .progs_mut()
        .find(|p| p.name() == name)
        .ok_or_else(|| TrackerError::ObjectMismatch(format!("it has no program {name}")))?;
    *link = Some(
        prog.attach()
            .map_err(|e| TrackerError::bpf(format!("attaching {name} (tp_btf)"), e))?,
    );
    Ok(())
}
