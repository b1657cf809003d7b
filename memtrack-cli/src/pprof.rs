//! `memtrack export --format pprof`: a gzipped `profile.proto` as Go's heap profiles write it
//! (runtime/pprof/protomem.go): sample types `alloc_objects/count`, `alloc_space/bytes`,
//! `inuse_objects/count`, `inuse_space/bytes` (in use: at the end of the recording), period
//! type `space/bytes`, default `inuse_space`; one sample per call site, one location per
//! recorded return address with its inlined functions as several lines, each stack whole (the
//! allocator's own frames included). Mapping 1 is the recorded program's executable
//! ([`crate::callsites::executable`]): pprof takes the first mapping for the main binary (the
//! `File:` and `Build ID:` it prints, whose sources `-list` shows); each mapping has its
//! module's build id, in hex.
//!
//! The messages are derived with prost from the checked-in schema (`proto/profile.proto`, the
//! fields memtrack writes): prost is the maintained protobuf crate of the Rust ecosystem, and
//! deriving by hand needs neither protoc nor a build script (the `pprof` crate would bring a
//! CPU profiler and its signal handler with its types).

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use crate::callsites::{CallSites, NO_STACK};

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `perftools.profiles.ValueType`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `perftools.profiles.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

/// `perftools.profiles.Mapping`.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `perftools.profiles.Location`.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `perftools.profiles.Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `perftools.profiles.Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// The string table: index 0 is "", as the format requires.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The profile of `cs`.
pub fn profile(cs: &CallSites) -> Profile {
    let mut b = Builder::new(cs);
    for c in &cs.call_sites {
        let s = &c.site;
        let mut ids = Vec::with_capacity(c.locations.len());
        if c.locations.is_empty() {
            ids.push(b.no_stack_location());
        }
        for l in &c.locations {
            ids.push(b.location(l));
        }
        b.p.sample.push(Sample {
            location_id: ids,
            value: vec![
                s.blocks as i64,
                s.bytes as i64,
                s.blocks_at_end as i64,
                s.bytes_at_end as i64,
            ],
        });
    }
    b.p.string_table = b.st.table;
    b.p
}

/// A profile being built: its tables, and the ids already given to mappings, functions and
/// locations (ids count from 1 in the order of first sight; 0 is "none").
struct Builder<'a> {
    p: Profile,
    st: Strings,
    mappings: HashMap<String, u64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<(u64, u64), u64>,
    /// The modules' build ids, by path.
    build_ids: &'a HashMap<String, String>,
}

impl<'a> Builder<'a> {
    /// A profile of no samples yet, with Go's sample types and `cs`'s duration and name, and
    /// its executable's mapping first.
    fn new(cs: &'a CallSites) -> Builder<'a> {
        let mut st = Strings::new();
        let mut p = Profile {
            sample_type: [
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes"),
            ]
            .iter()
            .map(|(t, u)| ValueType {
                r#type: st.get(t),
                unit: st.get(u),
            })
            .collect(),
            ..Profile::default()
        };
        p.period_type = Some(ValueType {
            r#type: st.get("space"),
            unit: st.get("bytes"),
        });
        p.period = 1;
        p.default_sample_type = st.get("inuse_space");
        p.duration_nanos = cs.last_ts.saturating_sub(cs.first_ts) as i64;
        p.comment = vec![st.get(&format!("memtrack: {}", cs.name))];
        let mut b = Builder {
            p,
            st,
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            build_ids: &cs.build_ids,
        };
        if let Some(exe) = &cs.executable {
            b.mapping(exe);
        }
        b
    }

    /// The location of a site without a stack: one line naming [`NO_STACK`], no mapping.
    fn no_stack_location(&mut self) -> u64 {
        let fid = self.function(NO_STACK, "");
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line {
                function_id: fid,
                line: 0,
            }],
        });
        id
    }

    /// The id of the location of `l`, made on first sight with one line per inlined frame.
    fn location(&mut self, l: &crate::callsites::Location) -> u64 {
        let mapping_id = l.module.as_ref().map_or(0, |path| self.mapping(path));
        let key = (mapping_id, l.offset);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let line = l
            .frames
            .iter()
            .map(|f| {
                let name = crate::callsites::frame_name(f);
                let file = f.file.clone().unwrap_or_default();
                Line {
                    function_id: self.function(&name, &file),
                    line: f.line.map_or(0, i64::from),
                }
            })
            .collect();
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location {
            id,
            mapping_id,
            address: l.offset,
            line,
        });
        self.locations.insert(key, id);
        id
    }

    /// The id of the mapping of the module at `path`, made on first sight.
    fn mapping(&mut self, path: &str) -> u64 {
        if let Some(&id) = self.mappings.get(path) {
            return id;
        }
        let id = self.p.mapping.len() as u64 + 1;
        let build_id = self.build_ids.get(path).map_or(0, |b| self.st.get(b));
        self.p.mapping.push(Mapping {
            id,
            memory_start: 0,
            memory_limit: u64::MAX,
            file_offset: 0,
            filename: self.st.get(path),
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        self.mappings.insert(path.to_string(), id);
        id
    }

    /// The id of the function `name` in `file`, made on first sight.
    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (name.to_string(), file.to_string());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let n = self.st.get(name);
        self.p.function.push(Function {
            id,
            name: n,
            system_name: n,
            filename: self.st.get(file),
        });
        self.functions.insert(key, id);
        id
    }
}

/// `cs`'s profile, encoded and gzipped, written to `w`.
pub fn write(cs: &CallSites, w: impl Write) -> std::io::Result<()> {
    let bytes = profile(cs).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?.flush()
}
