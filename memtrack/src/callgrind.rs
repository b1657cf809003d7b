//! Callgrind's output files (`callgrind.out.PID`), read into per-function costs: what counting
//! instructions per benchmark reads after a run under `valgrind --tool=callgrind`.
//!
//! A [`Profile`] holds the file's event names (`Ir`, and more when callgrind simulated caches
//! or branches), its totals, and per function its *self* cost (the cost lines inside its body)
//! and its *inclusive* cost (self plus the cost of every call it made, as callgrind stored it
//! with the call), with how often it was called. Function names are demangled (Rust's legacy
//! and v0 schemes, C++'s Itanium scheme); run callgrind with `--demangle=no` so that the names
//! arrive whole, hashes included, and are demangled once, here.
//!
//! The format is callgrind's "Callgrind Format Specification" (valgrind's docs): name
//! compression (`fn=(12) name`, then `fn=(12)`), relative positions (`+3`, `-1`, `*`), cost
//! lines shorter than the event list (the rest are zero), `calls=` lines whose next cost line
//! is the call's inclusive cost. A recursive call (a function calling itself, or a deeper level of
//! itself, `name'2`) adds nothing to the caller's inclusive cost: its cost is already inside it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A callgrind output file that cannot be read or does not parse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallgrindError {
    /// The file could not be read.
    #[error("cannot read callgrind output {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line does not follow callgrind's format.
    #[error("callgrind output {}, line {line}: {problem}", path.display())]
    Parse {
        /// The file (empty when parsed from text).
        path: PathBuf,
        /// Its line, from 1.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
}

/// One function's costs, summed over every object, file and thread the profile holds it in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Function {
    /// Its name, demangled (a Rust name without its hash).
    pub name: String,
    /// The cost of the instructions in its body, one value per event of the profile.
    pub self_cost: Vec<u64>,
    /// Its self cost and the cost of the calls it made (recursive calls excepted).
    pub inclusive: Vec<u64>,
    /// How many times it was called, by the calls the profile recorded.
    pub calls: u64,
}

/// A callgrind output file, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Profile {
    /// The events counted, in the order of every cost vector (`Ir` first when only
    /// instructions were counted).
    pub events: Vec<String>,
    /// The totals the file states (`totals:` or `summary:`), else the sum of its cost lines.
    pub totals: Vec<u64>,
    /// Every function with a cost or a call, largest inclusive first cost (the first event),
    /// then by name.
    pub functions: Vec<Function>,
    /// What made callgrind write this file (its `desc: Trigger:` line): `Program termination`,
    /// or `Client Request: TEXT` for a dump the program asked for with `CALLGRIND_DUMP_STATS_AT`.
    pub trigger: Option<String>,
}

impl Profile {
    /// Reads and parses the file at `path`.
    ///
    /// # Errors
    /// [`CallgrindError::Io`] if it cannot be read, [`CallgrindError::Parse`] naming the first
    /// line that does not follow the format.
    pub fn read(path: &Path) -> Result<Profile, CallgrindError> {
        let text = std::fs::read_to_string(path).map_err(|source| CallgrindError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Profile::parse(&text).map_err(|e| match e {
            CallgrindError::Parse { line, problem, .. } => CallgrindError::Parse {
                path: path.to_path_buf(),
                line,
                problem,
            },
            other => other,
        })
    }

    /// Parses the text of a callgrind output file.
    ///
    /// # Errors
    /// [`CallgrindError::Parse`] naming the first line that does not follow the format, or a
    /// file with no `events:` line.
    pub fn parse(text: &str) -> Result<Profile, CallgrindError> {
        Parser::default().parse(text)
    }

    /// The column of event `name` (`"Ir"`) in the cost vectors.
    pub fn event(&self, name: &str) -> Option<usize> {
        self.events.iter().position(|e| e == name)
    }

    /// The function named `name` (demangled, without a hash), if it has a cost or a call.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }
}

/// `name` demangled: a Rust symbol (legacy or v0) without its hash, a C++ symbol, or as it is.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name)
        && let Ok(d) = sym.demangle()
    {
        return d;
    }
    name.to_string()
}

/// The state of one pass over the lines.
#[derive(Default)]
struct Parser {
    events: Vec<String>,
    positions: usize,
    stated_totals: Option<Vec<u64>>,
    /// Compressed names by their id: functions (`fn`, `cfn`).
    names: HashMap<u64, String>,
    /// Demangled function name → index in `functions`.
    index: HashMap<String, usize>,
    functions: Vec<Function>,
    current: Option<usize>,
    callee: Option<usize>,
    /// Set by a `calls=` line: the next cost line is that call's inclusive cost.
    pending_call: Option<u64>,
    summed: Vec<u64>,
    trigger: Option<String>,
}

impl Parser {
    fn parse(mut self, text: &str) -> Result<Profile, CallgrindError> {
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim_end();
            self.line(line).map_err(|problem| CallgrindError::Parse {
                path: PathBuf::new(),
                line: i + 1,
                problem,
            })?;
        }
        if self.events.is_empty() {
            return Err(CallgrindError::Parse {
                path: PathBuf::new(),
                line: text.lines().count(),
                problem: "no `events:` line: not a callgrind output file".into(),
            });
        }
        let Parser {
            events,
            stated_totals,
            mut functions,
            summed,
            trigger,
            ..
        } = self;
        for f in &mut functions {
            for (inc, own) in f.inclusive.iter_mut().zip(&f.self_cost) {
                *inc += own;
            }
        }
        functions.sort_by(|a, b| {
            b.inclusive
                .first()
                .cmp(&a.inclusive.first())
                .then_with(|| a.name.cmp(&b.name))
        });
        Ok(Profile {
            totals: stated_totals.unwrap_or(summed),
            events,
            functions,
            trigger,
        })
    }

    fn line(&mut self, line: &str) -> Result<(), String> {
        let Some(first) = line.chars().next() else {
            return Ok(());
        };
        if first.is_ascii_digit() || matches!(first, '+' | '-' | '*') {
            return self.cost(line);
        }
        if first == '#' {
            return Ok(());
        }
        let Some((key, value)) = line.split_once(['=', ':']) else {
            return Err(format!("{line:?} is neither a cost line nor `key=value`"));
        };
        if matches!(key, "fn" | "cfn" | "cfunc" | "calls") && self.events.is_empty() {
            return Err(format!("a `{key}=` line before the `events:` line"));
        }
        match key {
            "events" => {
                if !self.events.is_empty() {
                    return Err("a second `events:` line".into());
                }
                self.events = value.split_whitespace().map(String::from).collect();
                if self.events.is_empty() {
                    return Err("an `events:` line that names no event".into());
                }
                self.summed = vec![0; self.events.len()];
            }
            "desc" => {
                if let Some(t) = value.trim().strip_prefix("Trigger:") {
                    self.trigger = Some(t.trim().to_string());
                }
            }
            "positions" => self.positions = value.split_whitespace().count(),
            "totals" | "summary" => self.stated_totals = Some(self.numbers(value, key)?),
            "fn" => {
                let name = self.name(value)?;
                self.current = Some(self.function(&name));
            }
            "cfn" | "cfunc" => {
                let name = self.name(value)?;
                self.callee = Some(self.function(&name));
            }
            "calls" => {
                let count = value
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| format!("`calls={value}` has no call count"))?;
                let callee = self
                    .callee
                    .ok_or("a `calls=` line without a `cfn=` before it")?;
                self.functions[callee].calls += count;
                self.pending_call = Some(count);
            }
            // Files, objects, jumps, and the header's descriptive lines: no cost of their own.
            _ => {}
        }
        Ok(())
    }

    /// A cost line: positions, then one count per event (fewer: the rest are zero).
    fn cost(&mut self, line: &str) -> Result<(), String> {
        if self.events.is_empty() {
            return Err("a cost line before the `events:` line".into());
        }
        let mut fields = line.split_whitespace();
        for _ in 0..self.positions.max(1) {
            fields.next();
        }
        let costs = self.numbers_from(fields, "cost line")?;
        let current = self
            .current
            .ok_or("a cost line outside any function (no `fn=`)")?;
        match self.pending_call.take() {
            Some(_) => {
                let callee = self
                    .callee
                    .take()
                    .ok_or("a call's cost line without its callee")?;
                if callee != current {
                    add(&mut self.functions[current].inclusive, &costs);
                }
            }
            None => {
                add(&mut self.functions[current].self_cost, &costs);
                add(&mut self.summed, &costs);
            }
        }
        Ok(())
    }

    fn numbers(&self, value: &str, what: &str) -> Result<Vec<u64>, String> {
        self.numbers_from(value.split_whitespace(), what)
    }

    fn numbers_from<'a>(
        &self,
        fields: impl Iterator<Item = &'a str>,
        what: &str,
    ) -> Result<Vec<u64>, String> {
        let mut out = vec![0; self.events.len()];
        for (i, f) in fields.enumerate() {
            let slot = out.get_mut(i).ok_or_else(|| {
                format!(
                    "a {what} with more counts than the {} events",
                    self.events.len()
                )
            })?;
            *slot = f
                .parse()
                .map_err(|_| format!("a {what} whose count {f:?} is not a whole number"))?;
        }
        Ok(out)
    }

    /// A (possibly compressed) function name: `(id) name` defines `id`, `(id)` uses it.
    fn name(&mut self, value: &str) -> Result<String, String> {
        let value = value.trim();
        let Some(rest) = value.strip_prefix('(') else {
            return Ok(value.to_string());
        };
        let (id, name) = rest
            .split_once(')')
            .ok_or_else(|| format!("a compressed name {value:?} without its `)`"))?;
        // Uncompressed, a name may begin with `(` too: valgrind's `(below main)`.
        let Ok(id) = id.parse::<u64>() else {
            return Ok(value.to_string());
        };
        let name = name.trim();
        if name.is_empty() {
            self.names
                .get(&id)
                .cloned()
                .ok_or_else(|| format!("the compressed name ({id}) is used before it is defined"))
        } else {
            self.names.insert(id, name.to_string());
            Ok(name.to_string())
        }
    }

    /// The index of function `mangled` (demangled), added with zero costs if new. Callgrind
    /// names the deeper levels of a recursion `name'2`, `name'3` (`--separate-recs`): they
    /// are the same function.
    fn function(&mut self, mangled: &str) -> usize {
        let mangled = match mangled.rsplit_once('\'') {
            Some((base, level))
                if !level.is_empty() && level.bytes().all(|b| b.is_ascii_digit()) =>
            {
                base
            }
            _ => mangled,
        };
        let name = demangle(mangled);
        if let Some(&i) = self.index.get(&name) {
            return i;
        }
        let n = self.events.len();
        self.functions.push(Function {
            name: name.clone(),
            self_cost: vec![0; n],
            inclusive: vec![0; n],
            calls: 0,
        });
        self.index.insert(name, self.functions.len() - 1);
        self.functions.len() - 1
    }
}

fn add(to: &mut [u64], costs: &[u64]) {
    for (t, c) in to.iter_mut().zip(costs) {
        *t += c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as callgrind writes one with `--compress-strings=yes --compress-pos=yes`: main
    /// (self 5 + 2 + 1) calls work twice (70 inclusive), and work calls itself once (its 40
    /// are inside work's own cost lines already) and `leaf` (30 inclusive, 10 calls).
    const FILE: &str = "\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 7
cmd: ./prog
part: 1

positions: line
events: Ir

fl=(1) src/main.rs
fn=(1) main
10 5
+1 2
cfl=(1)
cfn=(2) _ZN4prog4work17h0123456789abcdefE
calls=2 20
* 70
* 1

fn=(2)
20 30
cfn=(2)
calls=1 20
+1 40
cfn=(3) _RNvCs1234_4prog4leaf
calls=10 30
* 30
fi=(2) src/inline.rs
5 10

fn=(3)
30 30

totals: 78
";

    /// Each function's name, self and inclusive cost (the first event) and calls.
    fn rows(p: &Profile) -> Vec<(&str, u64, u64, u64)> {
        p.functions
            .iter()
            .map(|f| (f.name.as_str(), f.self_cost[0], f.inclusive[0], f.calls))
            .collect()
    }

    #[test]
    fn self_inclusive_and_calls_of_each_function() {
        let p = Profile::parse(FILE).unwrap();
        assert_eq!(p.events, ["Ir"]);
        assert_eq!(p.totals, [78]);
        let got = rows(&p);
        assert_eq!(
            got,
            [
                // 5 + 2 + 1 of its own, 70 for the two calls of work.
                ("main", 8, 78, 0),
                // 30 + 10 (inlined code is its body too) of its own, 30 for the calls of
                // leaf, nothing for the recursive call; called 2 + 1 times.
                ("prog::work", 40, 70, 3),
                ("prog::leaf", 30, 30, 10),
            ]
        );
        assert_eq!(p.function("prog::leaf").map(|f| f.calls), Some(10));
        assert_eq!(p.event("Ir"), Some(0));
    }

    /// Callgrind's `'2` names the deeper levels of a recursion: one function, called by
    /// each level, whose inclusive cost counts each instruction once.
    #[test]
    fn recursion_levels_are_one_function() {
        let text = "events: Ir\nfn=(1) main\n1 1\ncfn=(2) f\ncalls=1 5\n* 60\n\
                    fn=(2)\n5 10\ncfn=(3) f'2\ncalls=1 5\n* 50\ncfn=(4) g\ncalls=1 9\n* 5\n\
                    fn=(3)\n5 20\ncfn=(3)\ncalls=2 5\n* 20\ncfn=(4)\ncalls=2 9\n* 10\n\
                    fn=(4)\n9 15\n";
        let p = Profile::parse(text).unwrap();
        let got = rows(&p);
        assert_eq!(
            got,
            [("main", 1, 61, 0), ("f", 30, 45, 4), ("g", 15, 15, 3)]
        );
        assert_eq!(p.totals, [46]);
    }

    #[test]
    fn short_cost_lines_and_several_events() {
        let text = "events: Ir Dr Dw\nfn=f\n1 7 2\n2 1\nsummary: 8 2 0\n";
        let p = Profile::parse(text).unwrap();
        assert_eq!(p.totals, [8, 2, 0]);
        assert_eq!(p.functions[0].self_cost, [8, 2, 0]);
        // Without a stated total, the sum of the self costs.
        let p = Profile::parse("events: Ir\nfn=f\n1 7\nfn=g\n3 4\n").unwrap();
        assert_eq!(p.totals, [11]);
    }

    /// Uncompressed names are as they are, one in parentheses too; the dump's trigger is kept.
    #[test]
    fn uncompressed_names_and_the_trigger() {
        let text = "desc: Trigger: Client Request: x y\nevents: Ir\nfn=(below main)\n1 3\n\
                    cfn=main\ncalls=1 1\n1 4\nfn=main\n1 4\n";
        let p = Profile::parse(text).unwrap();
        assert_eq!(p.trigger.as_deref(), Some("Client Request: x y"));
        let below = p.function("(below main)").unwrap();
        assert_eq!((below.self_cost[0], below.inclusive[0]), (3, 7));
    }

    #[test]
    fn bad_lines_are_named() {
        let cases = [
            ("fn=f\n1 2\n", 1, "before the `events:` line"),
            ("version: 1\n1 2\n", 2, "before the `events:` line"),
            ("events: Ir\n1 2\n", 2, "outside any function"),
            ("events: Ir\nfn=f\n1 x\n", 3, "not a whole number"),
            (
                "events: Ir\nfn=f\n1 2 3\n",
                3,
                "more counts than the 1 events",
            ),
            ("events: Ir\nfn=(4)\n", 2, "used before it is defined"),
            ("events: Ir\nfn=f\ncalls=1 2\n", 3, "without a `cfn=`"),
            ("events: Ir\nfn=f\nwhat\n", 3, "neither a cost line"),
            ("version: 1\n", 1, "no `events:` line"),
        ];
        for (text, line, problem) in cases {
            match Profile::parse(text) {
                Err(CallgrindError::Parse {
                    line: l,
                    problem: p,
                    ..
                }) => {
                    assert_eq!(l, line, "{text:?}: {p}");
                    assert!(p.contains(problem), "{text:?}: {p}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn names_are_demangled() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_4prog4leaf"), "prog::leaf");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(demangle("malloc"), "malloc");
        assert_eq!(demangle("0x00000000004011a0"), "0x00000000004011a0");
    }
}
