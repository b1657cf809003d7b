//! What a finished session measured ([`Report`]), and the lines that say it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::analysis::{Sites, SizeClass, Timeline};
use crate::artifact::{Backend, FormatError, Reader};
use crate::backend::Recorded;
use crate::human;
use crate::locks::{LockWaits, LockWaitsError, WaitClass};
use crate::scope::Scope;
use crate::totals::Totals;

/// What a session measured: what the recorder returned ([`Report::recorded`], which holds what
/// the encoder wrote, computed while streaming), and what the session knows of itself.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The session's name.
    pub name: String,
    /// The artifact; `None` for an in-memory session (`SessionBuilder::in_memory`).
    pub path: Option<PathBuf>,
    /// Wall-clock time the session recorded.
    pub duration: Duration,
    /// The recorder that produced it.
    pub backend: Backend,
    /// Which threads were recorded.
    pub scope: Scope,
    /// Iterations of a measured routine the session covers, if declared
    /// (`Session::set_iterations`): then allocations and bytes are also given per iteration.
    pub iterations: Option<u64>,
    /// What the recorder returned: the encoder's totals, size classes and timeline
    /// ([`Recorded::written`]), lost and out-of-scope events, stack counts.
    pub recorded: Recorded,
    /// The session's lock waits, when it recorded them ([`Report::lock_waits`]).
    pub(crate) lock_waits: Option<Result<LockWaits, Arc<LockWaitsError>>>,
}

impl Report {
    /// Totals over every event (see the accounting rules in [`Totals`]), with per-thread totals.
    pub fn totals(&self) -> &Totals {
        &self.recorded.written.totals
    }

    /// Allocations by size class, the non-empty classes, smallest first (what `memtrack show`
    /// tabulates).
    pub fn sizes(&self) -> &[SizeClass] {
        &self.recorded.written.sizes
    }

    /// Live heap and mapped bytes over the session, downsampled to
    /// [`TIMELINE_COLUMNS`](crate::encode::TIMELINE_COLUMNS) columns without losing extremes (the
    /// column holding the peak has it as its `heap.max`).
    pub fn timeline(&self) -> &Timeline {
        &self.recorded.written.timeline
    }

    /// Events lost because the ring buffer was full: non-zero means the numbers are incomplete.
    pub fn lost_events(&self) -> u64 {
        self.recorded.lost_events
    }

    /// Events recorded.
    pub fn events(&self) -> u64 {
        self.recorded.written.events
    }

    /// Size of the artifact in bytes.
    pub fn artifact_bytes(&self) -> u64 {
        self.recorded.written.bytes
    }

    /// Allocator calls (allocations and frees) of threads of this process outside the
    /// session's [`Scope::Threads`] scope while it recorded: not recorded, not in the totals.
    /// Non-zero means other threads were busy (parallel tests), or that work of the measured
    /// code ran on threads that existed before the session (use [`Scope::Process`]) or, with
    /// the allocator recorder, were spawned without `in_session`.
    pub fn out_of_scope(&self) -> u64 {
        self.recorded.out_of_scope
    }

    /// Heap allocations whose call stack stops early (see [`Recorded::short_stacks`]). The
    /// summary line says how to fix it when they are a significant share
    /// ([`Report::short_stacks_note`]).
    pub fn short_stacks(&self) -> u64 {
        self.recorded.short_stacks
    }

    /// The lock waits of a session that recorded them (`SessionBuilder::lock_waits`): per
    /// thread, by contended call site, and summed ([`LockWaits::totals`], which the summary line
    /// prints), from the same off-CPU intervals as `memtrack locks` reads from the artifact.
    /// `None` when the session did not ask for them; an error when they cannot be given: the
    /// recording lost events, or its context switches do not pair
    /// ([`LockWaitsError::NotWhole`]), or memtrack was built without its feature `symbolize`
    /// ([`LockWaitsError::NoSymbolizer`]). Computed when the session finishes, from its
    /// events (read again) and their stacks, symbolized once each.
    pub fn lock_waits(&self) -> Option<Result<&LockWaits, &LockWaitsError>> {
        self.lock_waits
            .as_ref()
            .map(|r| r.as_ref().map_err(|e| e.as_ref()))
    }

    /// Successful calls returning a heap block.
    pub fn allocations(&self) -> u64 {
        self.totals().allocations
    }

    /// Bytes requested by those calls.
    pub fn bytes_allocated(&self) -> u64 {
        self.totals().bytes_allocated
    }

    /// Maximum of live heap bytes.
    pub fn peak_live_bytes(&self) -> u64 {
        self.totals().peak_live_bytes
    }

    /// The call sites of the session's allocations (DHAT's per-stack numbers: see [`Sites`]),
    /// read from its artifact in a pass of their own (the writer keeps no per-site state, so
    /// that a session pays nothing for them unless asked). `None` for an in-memory session,
    /// which has no artifact to read. Allocations without a call stack (a recorder that
    /// captures none) are counted in [`Sites::no_stack`].
    pub fn sites(&self) -> Option<Result<Sites, FormatError>> {
        let path = self.path.as_ref()?;
        Some(Reader::open(path).and_then(|r| Sites::read(&r)))
    }

    /// The artifact's path for messages, or `not written (in-memory session)`.
    pub fn where_written(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "not written (in-memory session)".into(),
        }
    }

    /// Prints the summary line on stderr, and the note on short stacks if there is one: what
    /// a session that is not quiet says when it finishes.
    pub(crate) fn announce(&self) {
        eprintln!("{}", self.summary_line());
        if let Some(note) = self.short_stacks_note() {
            eprintln!("memtrack: {note}");
        }
    }

    /// The one-line summary printed when a session ends, e.g.
    /// `memtrack: parse_json — 12,345 allocations, 1.2 MiB allocated in total; peak live heap
    /// 512.0 KiB; still live at the end: 5 blocks (320 B); no events lost; scope: this thread
    /// and the threads it spawned →
    /// target/memtrack/parse_json.memtrack` (on one line). Bytes are heap bytes (malloc
    /// family; mappings are not counted); "allocated in total" is the sum of the sizes of
    /// every allocation, not net of frees; "still live at the end" is what was allocated during
    /// the session and not freed by its end; "events lost" counts events the recorder dropped
    /// (non-zero: every number is incomplete).
    pub fn summary_line(&self) -> String {
        let t = self.totals();
        let lost = if self.lost_events() == 0 {
            "no events lost".to_string()
        } else {
            format!(
                "{} LOST (the numbers are incomplete: raise the ring buffer size)",
                human::plural(self.lost_events(), "event", "events")
            )
        };
        let scope = match (self.scope, self.out_of_scope()) {
            (Scope::Process, _) => "scope: whole process".to_string(),
            (Scope::Threads, 0) => format!("scope: {}", self.scope),
            (Scope::Threads, n) => format!(
                "scope: {} ({} allocator calls of other threads not counted)",
                self.scope,
                human::count(n)
            ),
        };
        let per_iteration = match (&t.iteration_spread, self.iterations) {
            // One call: its totals are its figures.
            (Some(p), _) if p.iterations <= 1 => String::new(),
            (Some(p), _) => format!(
                "{}, per call (median, min–max): {}; over all of them: ",
                human::plural(p.iterations, "call", "calls"),
                p.describe()
            ),
            (None, Some(n)) => format!(
                "per iteration (of {}): {:.2} allocations, {} allocated; over all of them: ",
                human::count(n),
                t.allocations as f64 / n.max(1) as f64,
                human::bytes_f64(t.bytes_allocated as f64 / n.max(1) as f64),
            ),
            (None, None) => String::new(),
        };
        format!(
            "memtrack: {} — {per_iteration}{}, {} allocated in total; peak live heap {}; still \
             live at the end: {} ({}); {}{}; {} → {}",
            self.name,
            human::plural(t.allocations, "allocation", "allocations"),
            human::bytes(t.bytes_allocated),
            human::bytes(t.peak_live_bytes),
            human::plural(t.live_blocks_at_end, "block", "blocks"),
            human::bytes(t.live_bytes_at_end),
            lost,
            self.lock_waits_summary(),
            scope,
            self.where_written()
        ) + if self.backend == Backend::Alloc {
            " (Rust allocator only: C/libc allocations and mmaps are not covered)"
        } else {
            ""
        }
    }

    /// The one line that says how to give the short call stacks their callers, when those a
    /// rebuild with frame pointers can fix are at least 1 % of the allocations
    /// ([`human::short_stacks_note`]).
    pub fn short_stacks_note(&self) -> Option<String> {
        human::short_stacks_note(
            self.short_stacks(),
            self.recorded.short_stacks_in_libc,
            self.totals().allocations,
        )
    }

    /// The summary line's part on lock waits (empty when not recorded): `; lock waits of 4
    /// threads: mutex 41.2 ms, condvar 3.0 ms, sleep 20.0 ms; on CPU 12.3 ms`, the classes
    /// with any time, mutex always; or why they are not given.
    fn lock_waits_summary(&self) -> String {
        let ms = |ns: u64| format!("{:.1} ms", ns as f64 / 1e6);
        match self.lock_waits() {
            None => String::new(),
            Some(Err(e)) => format!("; lock waits NOT GIVEN ({e})"),
            Some(Ok(w)) => {
                let t = w.totals();
                let classes: Vec<String> = t
                    .times
                    .by_class()
                    .iter()
                    .filter(|(c, ns)| *ns > 0 || *c == WaitClass::Mutex)
                    .map(|(c, ns)| format!("{} {}", c.name().replace('_', " "), ms(*ns)))
                    .collect();
                format!(
                    "; lock waits of {}: {}; on CPU {}",
                    human::plural(t.threads, "thread", "threads"),
                    classes.join(", "),
                    ms(t.times.cpu_ns)
                )
            }
        }
    }
}

#[cfg(feature = "symbolize")]
impl Report {
    /// The call sites of this session compared with those of `base` (an earlier session of the
    /// same benchmark, maybe of another build), read from both artifacts and symbolized
    /// (feature `symbolize`): [`SiteComparison::attribution`](crate::symbolize::SiteComparison::attribution) ranks the site deltas of a
    /// metric. Sites match across builds by their frames' functions and source files, never by
    /// address or line ([`KeyFrame`](crate::symbolize::KeyFrame)). `None` when either session was in memory (no artifact to
    /// read).
    ///
    /// ```no_run
    /// use memtrack::{analysis::Metric, Report};
    ///
    /// # fn f(base: &Report, head: &Report) -> Result<(), memtrack::artifact::FormatError> {
    /// let cmp = head.compare_sites(base).expect("both sessions wrote artifacts")?;
    /// let a = cmp.attribution(Metric::Bytes);
    /// for d in &a.sites {
    ///     println!("{:+} bytes ({:?} of the change): {}", d.delta(), a.share(d), d.key);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn compare_sites(
        &self,
        base: &Report,
    ) -> Option<Result<crate::symbolize::SiteComparison, FormatError>> {
        let (bp, hp) = (base.path.as_ref()?, self.path.as_ref()?);
        use crate::symbolize::{SiteComparison, Symbolizer};
        Some((|| {
            let (br, hr) = (Reader::open(bp)?, Reader::open(hp)?);
            let (bs, hs) = (Sites::read(&br)?, Sites::read(&hr)?);
            SiteComparison::new(&mut Symbolizer::new(), &br, &bs, &hr, &hs)
        })())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;
    use crate::limits::describe;

    pub(super) fn report(allocations: u64, live_blocks: u64, lost_events: u64) -> Report {
        let mut recorded = Recorded::of_totals(Totals {
            allocations,
            bytes_allocated: 1_572_864,
            peak_live_bytes: 1536,
            live_blocks_at_end: live_blocks,
            live_bytes_at_end: 48,
            ..Default::default()
        });
        recorded.lost_events = lost_events;
        Report {
            name: "parse".into(),
            path: Some(PathBuf::from("t/parse.memtrack")),
            duration: Duration::ZERO,
            backend: Backend::Ebpf,
            scope: Scope::Threads,
            iterations: None,
            recorded,
            lock_waits: None,
        }
    }

    /// Every number says what it is; singular and plural are right.
    #[test]
    fn summary_line_explains_itself() {
        assert_eq!(
            report(20_013, 20_001, 0).summary_line(),
            "memtrack: parse — 20,013 allocations, 1.5 MiB allocated in total; peak live heap \
             1.5 KiB; still live at the end: 20,001 blocks (48 B); no events lost; scope: this \
             thread and the threads it spawned → t/parse.memtrack"
        );
        assert_eq!(
            report(1, 1, 1).summary_line(),
            "memtrack: parse — 1 allocation, 1.5 MiB allocated in total; peak live heap \
             1.5 KiB; still live at the end: 1 block (48 B); 1 event LOST (the numbers are \
             incomplete: raise the ring buffer size); scope: this thread and the threads it \
             spawned → t/parse.memtrack"
        );
        let mut r = report(2, 0, 0);
        r.path = None;
        assert!(
            r.summary_line()
                .ends_with("; no events lost; scope: this thread and the threads it spawned → not written (in-memory session)"),
            "{}",
            r.summary_line()
        );
        // Short call stacks are not the summary line's: its own note says them, once.
        r.recorded.short_stacks = 2;
        assert!(!r.summary_line().contains("short"), "{}", r.summary_line());
    }

    /// The short stacks' note is the rule of `human::short_stacks_note` over the report's own
    /// counts: the C library's short stacks are left out of the share.
    #[test]
    fn short_stacks_note_is_the_reports_share() {
        let mut r = report(200, 0, 0);
        r.recorded.short_stacks = 2;
        assert!(
            r.short_stacks_note()
                .unwrap()
                .starts_with("2 of 200 allocations (1.0 %)")
        );
        r.recorded.short_stacks_in_libc = 1;
        assert_eq!(r.short_stacks_note(), None);
    }

    /// A session that recorded lock waits says their totals: the classes with any time
    /// (mutex always), then the time on a CPU; one whose waits cannot be given says why.
    #[test]
    fn summary_line_carries_lock_wait_totals() {
        use crate::locks::{ThreadWaits, WaitTimes};
        let mut r = report(2, 0, 0);
        assert!(!r.summary_line().contains("lock waits"));
        let thread = |tid, mutex, sleep, cpu| ThreadWaits {
            pid: 1,
            tid,
            times: WaitTimes {
                mutex_wait_ns: mutex,
                sleep_ns: sleep,
                cpu_ns: cpu,
                ..WaitTimes::default()
            },
            ..ThreadWaits::default()
        };
        let waits = LockWaits {
            window_ns: 100_000_000,
            threads: vec![
                thread(1, 0, 20_000_000, 80_000_000),
                thread(2, 41_250_000, 0, 1_000_000),
            ],
            sites: Vec::new(),
        };
        let t = waits.totals();
        assert_eq!(
            (
                t.threads,
                t.times.mutex_wait_ns,
                t.times.sleep_ns,
                t.times.cpu_ns
            ),
            (2, 41_250_000, 20_000_000, 81_000_000)
        );
        r.lock_waits = Some(Ok(waits));
        assert!(
            r.summary_line().contains(
                "; no events lost; lock waits of 2 threads: mutex 41.2 ms, sleep 20.0 ms; on CPU \
                 81.0 ms; scope:"
            ),
            "{}",
            r.summary_line()
        );
        r.lock_waits = Some(Err(Arc::new(LockWaitsError::NotWhole(
            "3 events lost".into(),
        ))));
        assert!(
            r.summary_line()
                .contains("; lock waits NOT GIVEN (the recording is not whole (3 events lost)"),
            "{}",
            r.summary_line()
        );
    }

    #[test]
    fn limits_message_shows_every_violation_with_exact_numbers() {
        let mut r = report(1234, 3, 0);
        r.recorded.written.totals.bytes_allocated = 2_000_000;
        r.recorded.written.totals.live_bytes_at_end = 96;
        let l = Limits::new()
            .max_allocations(1000)
            .max_bytes(1_048_576)
            .no_leaks();
        assert_eq!(
            describe(&l.check(r.totals(), r.lost_events())),
            "allocations 1,234 > max_allocations 1,000; \
             bytes allocated 2,000,000 B > max_bytes 1,048,576 B; \
             live at end 3 blocks (96 B) with no_leaks"
        );
    }
}

#[cfg(all(test, feature = "symbolize"))]
mod site_tests {
    use std::path::Path;

    use super::*;
    use crate::analysis::Metric;
    use crate::artifact::Backend;
    use crate::artifact::Metadata;
    use crate::encode::{Encoder, EncoderOptions};
    use crate::event::{Event, EventKind};
    use crate::stack::{Frame, Module, ModuleId, Stack, StackId};

    /// A finished artifact at `path` whose sites are `sites`: (stack id, frame offsets in one
    /// module of build id 0xab that is not on disk, blocks, bytes each); every block freed.
    fn artifact(path: &Path, sites: &[(u32, &[u64], u64, u64)]) {
        let meta = Metadata::now(1, Backend::Ebpf);
        let f = std::fs::File::create(path).unwrap();
        let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
        let module = Module {
            path: "/nonexistent/app".into(),
            build_id: Some(vec![0xab]),
        };
        enc.define_module(ModuleId(1), module).unwrap();
        let mut ts = 0;
        for &(id, offsets, blocks, size) in sites {
            let frames = offsets
                .iter()
                .map(|&offset| Frame {
                    module: ModuleId(1),
                    offset,
                })
                .collect();
            let stack = Stack {
                frames,
                truncated: false,
            };
            enc.define_stack(StackId(id), stack).unwrap();
            for i in 0..blocks {
                let addr = 0x1000 + i * 0x1000;
                ts += 10;
                let ev = Event::new(ts, 1, 1, EventKind::Malloc { addr, size });
                enc.push(ev.with_stack(StackId(id))).unwrap();
                ts += 10;
                enc.push(Event::new(ts, 1, 1, EventKind::Free { addr }))
                    .unwrap();
            }
        }
        enc.finish(0).unwrap();
    }

    /// A report of an artifact at `path` (`None`: in memory); its numbers do not matter here.
    fn report(path: Option<&Path>) -> Report {
        let mut r = tests::report(0, 0, 0);
        r.path = path.map(Path::to_path_buf);
        r
    }

    /// Two sessions whose sites differ in stack ids but not in frames: matched by frames, the
    /// one site that allocates more ranked with its exact delta, the other unchanged; a frame
    /// of the same offset but another depth is another site.
    #[test]
    fn reports_compare_their_sites() {
        let dir = tempfile::tempdir().unwrap();
        let (b, h) = (dir.path().join("b.memtrack"), dir.path().join("h.memtrack"));
        artifact(
            &b,
            &[(1, &[0x10, 0x20], 10, 100), (2, &[0x30, 0x20], 5, 50)],
        );
        artifact(
            &h,
            &[
                (7, &[0x30, 0x20], 5, 50),
                (8, &[0x10, 0x20], 12, 100),
                (9, &[0x10], 1, 8),
            ],
        );
        let (base, head) = (report(Some(&b)), report(Some(&h)));
        let cmp = head.compare_sites(&base).unwrap().unwrap();
        let a = cmp.attribution(Metric::Bytes);
        assert_eq!((a.base_total, a.head_total), (1250, 1458));
        let got: Vec<(String, u64, u64, bool)> = a
            .sites
            .iter()
            .map(|d| (d.key.to_string(), d.base, d.head, d.is_new()))
            .collect();
        assert_eq!(
            got,
            [
                ("app+0x10 ← app+0x20".to_string(), 1000, 1200, false),
                ("app+0x10".to_string(), 0, 8, true),
            ]
        );
        assert_eq!(a.unchanged, 1);
        assert_eq!(cmp.attribution(Metric::Allocations).delta(), 3);
        assert_eq!(
            cmp.unnamed_modules().len(),
            1,
            "{:?}",
            cmp.unnamed_modules()
        );
        // An in-memory session has no artifact to compare.
        assert!(head.compare_sites(&report(None)).is_none());
    }
}
