//! The code mappings of recorded processes, to turn a return address into a [`Frame`] (a
//! module and a file offset) that can be symbolized after the process exited.
//!
//! ```text
//! scan(pid, ts)   /proc/PID/maps: executable file mappings (path, start, end, file offset);
//!                 each file read once for its build id      (at start, after a dlopen)
//! exec(pid, ts)   a new image: the old mappings stop counting for addresses seen from ts
//! frames(pid, ts, addrs) ──▶ [Frame]  the mapping of the image running at ts that held each
//!                 address then; a miss rescans the maps once (a library mapped since)
//! StackInterner   frames ──▶ one StackId per distinct stack, whatever pid or recorder
//! ```
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, the clock of the BPF program's timestamps: a stack
//! is resolved against the mappings as they were when it was taken, also when it is read
//! later (after an exec, after a dlopen that reused the addresses of a closed library).

use std::collections::HashMap;
use std::path::Path;

use rustc_hash::FxHashMap;

use crate::artifact::monotonic_ns;
use crate::stack::{Frame, Module, ModuleId, Stack, StackId};

/// One executable file mapping of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    /// The file offset mapped at `start`.
    offset: u64,
    module: ModuleId,
    /// When it was first seen: it holds addresses of stacks taken from then on.
    seen_ns: u64,
}

/// One program image of a process (a new one at each exec).
#[derive(Debug, Default)]
struct Image {
    /// When it began (0: before the recording).
    start_ns: u64,
    maps: Vec<Mapping>,
    /// When its maps were last read (a miss rescans only if they may have changed since).
    scanned_ns: u64,
    /// Every range mapped when they were last read (any permissions): an address in one of
    /// them that is not code is not worth a rescan (a frame-pointer chain broken by code built
    /// without frame pointers yields data words, which point into the heap and stacks).
    mapped: Vec<(u64, u64)>,
    /// Every executable range when they were last read, file-backed or not (JIT code, the
    /// vdso): a frame outside all of them is where a frame-pointer chain broke.
    code: Vec<(u64, u64)>,
}

/// The executable mappings of the processes of a recording, and the modules they map.
#[derive(Debug, Default)]
pub struct ModuleMap {
    /// Module `i + 1` (0 is [`ModuleId::UNKNOWN`]).
    modules: Vec<Module>,
    by_file: HashMap<(String, Option<Vec<u8>>), ModuleId>,
    /// Build ids by (device, inode, path): a file is read once however many processes map it.
    build_ids: HashMap<(u64, u64, String), Option<Vec<u8>>>,
    /// Per process, its images, oldest first.
    procs: FxHashMap<u32, Vec<Image>>,
}

impl ModuleMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The module `id` (`None` for [`ModuleId::UNKNOWN`] or an id this map did not give).
    pub fn module(&self, id: ModuleId) -> Option<&Module> {
        (id.0 as usize)
            .checked_sub(1)
            .and_then(|i| self.modules.get(i))
    }

    /// Reads process `pid`'s executable file mappings and adds those not known yet, as seen at
    /// `now_ns`. Returns how many were added. A process that is gone is an error (`ENOENT`).
    pub fn scan(&mut self, pid: u32, now_ns: u64) -> std::io::Result<usize> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let mut found = Vec::new();
        let mut mapped = Vec::new();
        let mut code = Vec::new();
        for line in text.lines() {
            if let Some(r) = parse_range(line) {
                mapped.push(r);
                if is_executable(line) {
                    code.push(r);
                }
            }
            if let Some(m) = parse_maps_line(line) {
                found.push(m);
            }
        }
        let mut added = 0;
        let mut new = Vec::new();
        {
            let images = self.procs.entry(pid).or_default();
            if images.is_empty() {
                images.push(Image::default());
            }
            let image = images.last().expect("one image at least");
            for (start, end, offset, path) in found {
                let known = image
                    .maps
                    .iter()
                    .any(|m| m.start == start && m.end == end && m.offset == offset);
                if !known {
                    new.push((start, end, offset, path));
                }
            }
        }
        for (start, end, offset, path) in new {
            let module = self.module_of(pid, &path);
            let image = self
                .procs
                .get_mut(&pid)
                .and_then(|i| i.last_mut())
                .expect("created above");
            // A mapping replaced at the same place (dlclose, then dlopen of another file)
            // keeps the old entry for stacks taken before `now_ns`.
            image.maps.push(Mapping {
                start,
                end,
                offset,
                module,
                seen_ns: now_ns,
            });
            added += 1;
        }
        if let Some(image) = self.procs.get_mut(&pid).and_then(|i| i.last_mut()) {
            image.scanned_ns = now_ns;
            image.mapped = mapped;
            image.code = code;
        }
        Ok(added)
    }

    /// Process `pid` replaced its image at `ts_ns` (execve): addresses of stacks taken from
    /// then on are resolved against the mappings scanned after this call only.
    pub fn exec(&mut self, pid: u32, ts_ns: u64) {
        self.procs.entry(pid).or_default().push(Image {
            start_ns: ts_ns,
            ..Image::default()
        });
    }

    /// The frames of absolute addresses `addrs` of process `pid`, from a stack taken at
    /// `ts_ns`. An address no mapping of that image holds makes the process's maps be read
    /// again (once per call, only if they were last read before `ts_ns` or never, and only for
    /// an address that was in no mapping at all then) when `rescan` and the image is the
    /// current one; an address still outside every executable file mapping but in executable
    /// memory (JIT code, the vdso) is a [`ModuleId::UNKNOWN`] frame holding the address itself.
    /// An address outside all executable memory of the process as last read is where the chain
    /// broke: the frames end there with [`Frame::BROKEN`] (see its documentation).
    pub fn frames(&mut self, pid: u32, ts_ns: u64, addrs: &[u64], rescan: bool) -> Vec<Frame> {
        let mut out = Vec::with_capacity(addrs.len());
        let mut rescanned = false;
        for &addr in addrs {
            let mut frame = self.lookup(pid, ts_ns, addr);
            if frame.is_none() && rescan && !rescanned && self.may_rescan(pid, ts_ns, addr) {
                rescanned = true;
                let _ = self.scan(pid, monotonic_ns());
                frame = self.lookup(pid, ts_ns, addr);
            }
            match frame {
                Some(f) => out.push(f),
                None if self.in_code(pid, addr) => out.push(Frame {
                    module: ModuleId::UNKNOWN,
                    offset: addr,
                }),
                None => {
                    out.push(Frame::BROKEN);
                    break;
                }
            }
        }
        out
    }

    /// Whether `addr` is in executable memory of process `pid` as its maps were last read (a
    /// process never read counts as all code: nothing is cut on no evidence).
    fn in_code(&self, pid: u32, addr: u64) -> bool {
        match self.procs.get(&pid).and_then(|i| i.last()) {
            Some(image) if image.scanned_ns > 0 || !image.code.is_empty() => {
                image.code.iter().any(|&(s, e)| s <= addr && addr < e)
            }
            _ => true,
        }
    }

    /// Whether a rescan can find a mapping holding `addr` for a stack of `ts_ns`: the image of
    /// `ts_ns` is the process's current one, its maps may have changed since they were read,
    /// and `addr` was in none of them (a user-space address: not a small number, not the
    /// kernel's half).
    fn may_rescan(&self, pid: u32, ts_ns: u64, addr: u64) -> bool {
        if !(0x10000..0x8000_0000_0000).contains(&addr) {
            return false;
        }
        match self.procs.get(&pid) {
            None => true,
            Some(images) => {
                let current = images.last().expect("one image at least");
                current.start_ns <= ts_ns
                    && current.scanned_ns < ts_ns
                    && !current.mapped.iter().any(|&(s, e)| s <= addr && addr < e)
            }
        }
    }

    fn lookup(&self, pid: u32, ts_ns: u64, addr: u64) -> Option<Frame> {
        let images = self.procs.get(&pid)?;
        // The image running at ts_ns: the last one begun by then.
        let image = images
            .iter()
            .rev()
            .find(|i| i.start_ns <= ts_ns)
            .unwrap_or(&images[0]);
        let holding = || {
            image
                .maps
                .iter()
                .filter(|m| m.start <= addr && addr < m.end)
        };
        // The mapping seen last before the stack was taken; else (a stack older than the scan
        // that found its mapping: a library mapped while not stopped) the first seen after.
        let m = holding()
            .filter(|m| m.seen_ns <= ts_ns)
            .max_by_key(|m| m.seen_ns)
            .or_else(|| holding().min_by_key(|m| m.seen_ns))?;
        Some(Frame {
            module: m.module,
            offset: addr - m.start + m.offset,
        })
    }

    fn module_of(&mut self, pid: u32, path: &str) -> ModuleId {
        let build_id = self.build_id(pid, path);
        let key = (path.to_owned(), build_id);
        if let Some(&id) = self.by_file.get(&key) {
            return id;
        }
        self.modules.push(Module {
            path: key.0.clone(),
            build_id: key.1.clone(),
        });
        let id = ModuleId(self.modules.len() as u32);
        self.by_file.insert(key, id);
        id
    }

    /// The build id of `path` as process `pid` maps it: read through `/proc/PID/root` (the
    /// process's view of the file system), once per file.
    fn build_id(&mut self, pid: u32, path: &str) -> Option<Vec<u8>> {
        let rooted = format!("/proc/{pid}/root{path}");
        let file = if Path::new(&rooted).exists() {
            rooted
        } else {
            path.to_owned()
        };
        let meta = std::fs::metadata(&file).ok()?;
        use std::os::unix::fs::MetadataExt;
        let key = (meta.dev(), meta.ino(), path.to_owned());
        if let Some(id) = self.build_ids.get(&key) {
            return id.clone();
        }
        let id = memtrack_bpf::Elf::open(Path::new(&file))
            .ok()
            .and_then(|e| e.build_id().map(<[u8]>::to_vec));
        self.build_ids.insert(key, id.clone());
        id
    }
}

/// (start, end) of any line of `/proc/PID/maps`.
fn parse_range(line: &str) -> Option<(u64, u64)> {
    let (start, rest) = line.split_once('-')?;
    let end = rest.split(' ').next()?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// Whether a `/proc/PID/maps` line maps executable memory.
fn is_executable(line: &str) -> bool {
    line.split(' ')
        .nth(1)
        .is_some_and(|perms| perms.contains('x'))
}

/// (start, end, file offset, path) of an executable mapping of a file; `None` for any other
/// line (anonymous, not executable, a pseudo-file like `[vdso]`).
fn parse_maps_line(line: &str) -> Option<(u64, u64, u64, String)> {
    // start-end perms offset dev inode path
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let _dev = it.next()?;
    let inode = it.next()?;
    let path = it.next()?.trim_start();
    if !perms.contains('x') || inode == "0" || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
        u64::from_str_radix(offset, 16).ok()?,
        path.to_owned(),
    ))
}

/// Distinct stacks: the same frames (from any process or recorder) are one [`StackId`], ids
/// numbered from 1 in the order first seen.
#[derive(Debug, Default)]
pub struct StackInterner {
    ids: HashMap<Stack, StackId>,
    stacks: Vec<Stack>,
}

impl StackInterner {
    /// No stacks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `stack`, and whether it is new (its definition not given out before).
    pub fn intern(&mut self, stack: Stack) -> (StackId, bool) {
        if let Some(&id) = self.ids.get(&stack) {
            return (id, false);
        }
        self.stacks.push(stack.clone());
        let id = StackId(self.stacks.len() as u32);
        self.ids.insert(stack, id);
        (id, true)
    }

    /// The stack `id` (`None` for [`StackId::NONE`] or an id this interner did not give).
    pub fn stack(&self, id: StackId) -> Option<&Stack> {
        (id.0 as usize)
            .checked_sub(1)
            .and_then(|i| self.stacks.get(i))
    }

    /// How many distinct stacks.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_keep_executable_files_only() {
        assert_eq!(
            parse_maps_line(
                "7f1c2a828000-7f1c2a9bd000 r-xp 00028000 fe:01 1442 /usr/lib/x86_64-linux-gnu/libc.so.6"
            ),
            Some((
                0x7f1c2a828000,
                0x7f1c2a9bd000,
                0x28000,
                "/usr/lib/x86_64-linux-gnu/libc.so.6".into()
            ))
        );
        assert_eq!(
            parse_maps_line(
                "7f1c2a800000-7f1c2a828000 r--p 00000000 fe:01 1442 /usr/lib/libc.so.6"
            ),
            None
        );
        assert_eq!(
            parse_maps_line("7ffd1b1f0000-7ffd1b1f2000 r-xp 00000000 00:00 0 [vdso]"),
            None
        );
        assert_eq!(parse_maps_line("7f00-7f10 rwxp 00000000 00:00 0 "), None);
        assert_eq!(
            parse_maps_line("10-20 r-xp 00001000 fe:01 9 /tmp/a b (deleted)"),
            Some((0x10, 0x20, 0x1000, "/tmp/a b (deleted)".into()))
        );
    }

    #[test]
    fn own_code_resolves_to_this_file_with_its_build_id() {
        let mut map = ModuleMap::new();
        let pid = std::process::id();
        let now = monotonic_ns();
        assert!(map.scan(pid, now).unwrap() > 0);
        let f = maps_lines_keep_executable_files_only as fn() as usize as u64;
        let frames = map.frames(pid, now + 1, &[f, 8], false);
        let module = map.module(frames[0].module).expect("a module");
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(Path::new(&module.path), exe);
        let elf = memtrack_bpf::Elf::open(&exe).unwrap();
        assert_eq!(module.build_id.as_deref(), elf.build_id());
        // The file offset of the function is what its symbol's address maps to in the file.
        let sym = elf
            .functions()
            // Not the `{{closure}}` inside it, whose symbol may come first.
            .find(|s| {
                s.name.contains("maps_lines_keep_executable_files_only")
                    && !s.name.contains("closure")
            })
            .expect("the test function's symbol");
        assert_eq!(Some(frames[0].offset), elf.file_offset(sym.vaddr));
        // 8 is in no executable mapping: the chain broke there.
        assert_eq!(frames[1], Frame::BROKEN);
    }

    /// An image made by hand (its process never scanned): module 1 mapped at 0x1000..0x2000
    /// from file offset 0, before the recording; maps read at 10 ns.
    fn image_of_module_1() -> Image {
        Image {
            start_ns: 0,
            maps: vec![Mapping {
                start: 0x1000,
                end: 0x2000,
                offset: 0,
                module: ModuleId(1),
                seen_ns: 0,
            }],
            scanned_ns: 10,
            mapped: vec![(0x1000, 0x2000)],
            code: vec![(0x1000, 0x2000)],
        }
    }

    /// A frame in executable memory that is no file's (JIT code) is kept and the walk goes on;
    /// the first one outside all executable memory ends the stack with [`Frame::BROKEN`], the
    /// words after it dropped.
    #[test]
    fn a_stack_ends_where_it_leaves_the_code() {
        let mut map = ModuleMap::new();
        let pid = 1; // never scanned: the image is made by hand
        let mut image = image_of_module_1();
        image.mapped.extend([(0x5000, 0x6000), (0x8000, 0x9000)]);
        image.code.push((0x5000, 0x6000));
        map.procs.insert(pid, vec![image]);
        let jit = Frame {
            module: ModuleId::UNKNOWN,
            offset: 0x5010,
        };
        let at = |offset| Frame {
            module: ModuleId(1),
            offset,
        };
        assert_eq!(
            map.frames(pid, 20, &[0x1100, 0x5010, 0x1200], false),
            [at(0x100), jit, at(0x200)]
        );
        // Heap data (0x8010), then a word that is not even mapped, then code again.
        assert_eq!(
            map.frames(pid, 20, &[0x1100, 0x8010, 0x77, 0x1200], false),
            [at(0x100), Frame::BROKEN]
        );
        assert_eq!(
            map.frames(pid, 20, &[0x1100, 0x1300, 0x4], false),
            [at(0x100), at(0x300), Frame::BROKEN]
        );
    }

    #[test]
    fn an_exec_separates_the_images() {
        let mut map = ModuleMap::new();
        let pid = 1; // never scanned: mappings are pushed by hand
        map.procs.insert(pid, vec![image_of_module_1()]);
        map.exec(pid, 100);
        map.procs.get_mut(&pid).unwrap()[1].maps.push(Mapping {
            start: 0x1000,
            end: 0x3000,
            offset: 0x10,
            module: ModuleId(2),
            seen_ns: 100,
        });
        let before = map.frames(pid, 50, &[0x1800], false);
        let after = map.frames(pid, 150, &[0x1800, 0x2800], false);
        assert_eq!(
            before[0],
            Frame {
                module: ModuleId(1),
                offset: 0x800
            }
        );
        assert_eq!(
            after[0],
            Frame {
                module: ModuleId(2),
                offset: 0x810
            }
        );
        assert_eq!(
            after[1],
            Frame {
                module: ModuleId(2),
                offset: 0x1810
            }
        );
    }

    #[test]
    fn a_miss_rescans_only_for_an_address_mapped_since() {
        let mut map = ModuleMap::new();
        let pid = std::process::id();
        let t0 = monotonic_ns();
        map.scan(pid, t0).unwrap();
        let heap = Box::new(5u64);
        let data = &*heap as *const u64 as u64;
        // A data word (broken chain), a small number, a kernel address: no rescan.
        assert!(!map.may_rescan(pid, t0 + 1, data));
        assert!(!map.may_rescan(pid, t0 + 1, 42));
        assert!(!map.may_rescan(pid, t0 + 1, 0xffff_ffff_8100_0000));
        // An address in no mapping, from a stack taken after the scan: maybe mapped since.
        let unmapped = map.procs[&pid][0]
            .mapped
            .windows(2)
            .find(|w| w[1].0 > w[0].1 + 0x1000)
            .map(|w| w[0].1 + 0x800)
            .expect("a hole in the address space");
        assert!(map.may_rescan(pid, t0 + 1, unmapped));
        assert!(
            !map.may_rescan(pid, t0 - 1, unmapped),
            "a stack older than the scan"
        );
    }

    #[test]
    fn equal_stacks_are_one_id() {
        let mut i = StackInterner::new();
        let s = |o: u64| Stack {
            frames: vec![Frame {
                module: ModuleId(1),
                offset: o,
            }],
            truncated: false,
        };
        assert_eq!(i.intern(s(1)), (StackId(1), true));
        assert_eq!(i.intern(s(2)), (StackId(2), true));
        assert_eq!(i.intern(s(1)), (StackId(1), false));
        assert_eq!(i.stack(StackId(2)), Some(&s(2)));
        assert_eq!(i.stack(StackId::NONE), None);
        assert_eq!(i.len(), 2);
    }
}
