//! Symbolizing recorded stacks on real binaries: `cargo bench --bench symbolize` prints figures
//! (not a timed test: the machine is shared, read the numbers, do not gate on them).
//!
//! The target: every distinct stack of a 10 M-event artifact symbolized, and `--top 20`
//! printed, in ≤ 1 s once the first run has warmed the caches. The number of distinct stacks does
//! not grow with the events (`synth` models 300 call sites, whatever its length), so this bench
//! symbolizes N distinct stacks of 20 frames for N = 300, 3,000 and 30,000, and prints the
//! top 20 of them through `SymFrame`'s `Display`.
//!
//! The stacks are return addresses inside real functions (read from the modules' own symbol
//! tables) of real files: this bench's own binary (a Rust program with line tables: std, rayon,
//! blazesym, gimli), the `stacks` fixture (Rust, full debug info), the `chain` fixture and its
//! dlopened library (C, full debug info), and the system's libc and libstdc++ (symbols only).
//! Stacks share their outer frames as real ones do (and as `synth` models them): a stack's
//! outer frames are an earlier stack's for a random depth with probability 0.8.
//!
//! Per N, four runs, each symbolizing N stacks and printing the top 20:
//! - `first`: a new `Symbolizer` (every module's ELF and DWARF parsed): the first `memtrack show`
//!   of a recording (the files are in the page cache: they were just built or read, and this
//!   bench cannot drop the cache of a shared machine);
//! - `fresh`: another new `Symbolizer`, the same stacks: a second `show` run;
//! - `warm`: the first `Symbolizer` (its modules parsed) on N *other* stacks of the same
//!   modules: the cost per frame once the module cache is warm;
//! - `memo`: the first `Symbolizer` on the first stacks again: every frame already resolved.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memtrack::{stack::Frame, stack::Module, stack::ModuleId, stack::Stack, symbolize::Symbolizer};
use memtrack_test_support::fixtures;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

const DEPTH: usize = 20;
const TOP: usize = 20;

/// A module and the file offsets of its functions' bodies: (start, size).
struct Source {
    module: Module,
    functions: Vec<(u64, u64)>,
    /// Relative weight of its frames.
    weight: u32,
}

fn source(path: &Path, weight: u32) -> Source {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = object::File::parse(&*data).expect("an ELF file");
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.size(), s.file_range().0))
        .collect();
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() >= 16)
        .filter_map(|s| {
            let (addr, _, off) = segments
                .iter()
                .find(|(a, size, _)| (*a..a + size).contains(&s.address()))?;
            Some((s.address() - addr + off, s.size()))
        })
        .collect();
    functions.sort_unstable();
    functions.dedup();
    assert!(!functions.is_empty(), "{}: no functions", path.display());
    Source {
        module: Module {
            path: path.to_str().expect("UTF-8 path").to_string(),
            build_id: file.build_id().expect("notes").map(<[u8]>::to_vec),
        },
        functions,
        weight,
    }
}

/// splitmix64: a fixed stream, so that every run measures the same stacks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A return address inside a random function of a source drawn by weight.
fn frame(rng: &mut Rng, sources: &[Source]) -> Frame {
    let total: u32 = sources.iter().map(|s| s.weight).sum();
    let mut pick = rng.below(u64::from(total)) as u32;
    let (i, src) = sources
        .iter()
        .enumerate()
        .find(|(_, s)| {
            if pick < s.weight {
                true
            } else {
                pick -= s.weight;
                false
            }
        })
        .expect("weights add up");
    let (start, size) = src.functions[rng.below(src.functions.len() as u64) as usize];
    Frame {
        module: ModuleId(i as u32 + 1),
        offset: start + 1 + rng.below(size - 1),
    }
}

/// `n` distinct stacks of DEPTH frames, sharing outer frames as `synth`'s sites do.
fn stacks(n: usize, sources: &[Source], rng: &mut Rng) -> Vec<Stack> {
    let mut out: Vec<Stack> = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::new();
    while out.len() < n {
        // Outermost first while building.
        let mut frames: Vec<Frame> = if !out.is_empty() && rng.below(10) < 8 {
            let parent = &out[rng.below(out.len() as u64) as usize];
            let keep = 3 + rng.below(DEPTH as u64 - 4) as usize;
            parent.frames.iter().rev().take(keep).copied().collect()
        } else {
            Vec::new()
        };
        while frames.len() < DEPTH {
            frames.push(frame(rng, sources));
        }
        frames.reverse();
        let stack = Stack {
            frames,
            truncated: false,
        };
        if seen.insert(stack.clone()) {
            out.push(stack);
        }
    }
    out
}

/// Symbolizes every stack and prints the first TOP of them into a string, as `show --top`
/// would: the time, the text's length, and how many frames came out named.
fn run(sym: &mut Symbolizer, stacks: &[Stack], sources: &[Source]) -> (Duration, usize, usize) {
    let t = Instant::now();
    let refs: Vec<&Stack> = stacks.iter().collect();
    let out = sym.symbolize_stacks(&refs, |id| {
        sources
            .get((id.0 as usize).wrapping_sub(1))
            .map(|s| &s.module)
    });
    let mut text = String::new();
    for (i, frames) in out.iter().take(TOP).enumerate() {
        text.push_str(&format!("#{} ({} frames)\n", i + 1, frames.len()));
        for f in frames.iter().flatten() {
            text.push_str(&format!("    {f}\n"));
        }
    }
    let elapsed = t.elapsed();
    let named = out
        .iter()
        .flatten()
        .filter(|f| f.last().is_some_and(|f| f.is_resolved()))
        .count();
    (elapsed, black_box(text).len(), named)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and `cargo test --benches` list nothing to run.
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let rust = fixtures::rust_stacks(dir.path(), "stacks");
    let chain = fixtures::c_chain(dir.path(), "chain", true, &["-ldl"]);
    let so = fixtures::dlopen_lib(dir.path(), "libdlfixture.so");
    let me = std::env::current_exe().expect("current_exe");
    let sys = |name: &str| -> PathBuf {
        let p = Path::new("/usr/lib/x86_64-linux-gnu").join(name);
        std::fs::canonicalize(&p).unwrap_or(p)
    };
    let sources = [
        source(&me, 60),
        source(&rust, 15),
        source(&chain, 3),
        source(&so, 2),
        source(&sys("libc.so.6"), 10),
        source(&sys("libstdc++.so.6"), 10),
    ];
    println!("modules (weight of their frames, functions):");
    for s in &sources {
        let size = std::fs::metadata(&s.module.path).map_or(0, |m| m.len());
        println!(
            "  {:>3}  {:>6} fns  {:>6.1} MB  {}",
            s.weight,
            s.functions.len(),
            size as f64 / 1e6,
            s.module.path
        );
    }
    println!(
        "{:>7} {:>9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "stacks", "distinct", "named", "first", "fresh", "warm", "memo", "warm/frame"
    );
    let mut rng = Rng(0x5eed);
    // `cargo bench --bench symbolize -- 300 3000` measures those N only.
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = vec![300, 3_000, 30_000];
    }
    for n in sizes {
        let stacks = stacks(n, &sources, &mut rng);
        let distinct: std::collections::HashSet<Frame> = stacks
            .iter()
            .flat_map(|s| s.frames.iter().copied())
            .collect();
        let mut first_sym = Symbolizer::new();
        let (first, len, named) = run(&mut first_sym, &stacks, &sources);
        let (fresh, len2, named2) = run(&mut Symbolizer::new(), &stacks, &sources);
        let other = self::stacks(n, &sources, &mut rng);
        let (warm, _, _) = run(&mut first_sym, &other, &sources);
        let (memo, len3, named3) = run(&mut first_sym, &stacks, &sources);
        assert_eq!((len, named), (len2, named2), "two symbolizers disagree");
        assert_eq!((len, named), (len3, named3), "the cache changed the result");
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{n:>7} {:>9} {:>6.1}% {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>8.1}ms {:>10.2}µs",
            distinct.len(),
            100.0 * named as f64 / (n * DEPTH) as f64,
            ms(first),
            ms(fresh),
            ms(warm),
            ms(memo),
            warm.as_secs_f64() * 1e6 / distinct.len() as f64,
        );
    }
}
