//! The checked-in object's BTF (compiled from memtrack.h) against the Rust mirrors: the same
//! struct sizes and field offsets. Needs no privileges (the object is only parsed).

use std::mem::offset_of;

use libbpf_rs::btf::types::{Func, MemberAttr, Struct};
use libbpf_rs::btf::{Btf, HasSize};
use memtrack_bpf::{OBJECT, RawConfig, RawEvent, RawStack, RawStats, RawSwitch};

fn layout(btf: &Btf<'_>, name: &str) -> (usize, Vec<(String, usize)>) {
    let s: Struct<'_> = btf
        .type_by_name(name)
        .unwrap_or_else(|| panic!("struct {name} in BTF"));
    let fields = s
        .iter()
        .map(|m| {
            let MemberAttr::Normal { offset } = m.attr else {
                panic!("bitfield in {name}")
            };
            let n = m.name.expect("named member").to_string_lossy().into_owned();
            (n, offset as usize / 8)
        })
        .collect();
    (s.size(), fields)
}

fn owned(v: &[(&str, usize)]) -> Vec<(String, usize)> {
    v.iter().map(|(n, o)| ((*n).to_owned(), *o)).collect()
}

#[test]
fn c_structs_match_the_rust_mirrors() {
    let btf = Btf::from_raw("memtrack", OBJECT)
        .unwrap()
        .expect("the object has BTF");
    assert_eq!(
        layout(&btf, "memtrack_event"),
        (
            size_of::<RawEvent>(),
            owned(&[
                ("ts", offset_of!(RawEvent, ts)),
                ("pid", offset_of!(RawEvent, pid)),
                ("tid", offset_of!(RawEvent, tid)),
                ("kind", offset_of!(RawEvent, kind)),
                ("stack", offset_of!(RawEvent, stack)),
                ("addr", offset_of!(RawEvent, addr)),
                ("old_addr", offset_of!(RawEvent, old_addr)),
                ("size", offset_of!(RawEvent, size)),
                ("align", offset_of!(RawEvent, align)),
            ])
        )
    );
    assert_eq!(
        layout(&btf, "memtrack_stats"),
        (
            size_of::<RawStats>(),
            owned(&[
                ("allocs", offset_of!(RawStats, allocs)),
                ("alloc_bytes", offset_of!(RawStats, alloc_bytes)),
                ("frees", offset_of!(RawStats, frees)),
                ("drops", offset_of!(RawStats, drops)),
                ("out_of_scope", offset_of!(RawStats, out_of_scope)),
                ("unfollowed", offset_of!(RawStats, unfollowed)),
                ("stacks", offset_of!(RawStats, stacks)),
                ("stacks_truncated", offset_of!(RawStats, stacks_truncated)),
                ("stack_collisions", offset_of!(RawStats, stack_collisions)),
                ("stack_map_full", offset_of!(RawStats, stack_map_full)),
                ("stacks_lost", offset_of!(RawStats, stacks_lost)),
            ])
        )
    );
    assert_eq!(
        layout(&btf, "memtrack_switch"),
        (
            size_of::<RawSwitch>(),
            owned(&[
                ("enabled", offset_of!(RawSwitch, enabled)),
                ("scope", offset_of!(RawSwitch, scope)),
                ("generation", offset_of!(RawSwitch, generation)),
                ("caller", offset_of!(RawSwitch, caller)),
            ])
        )
    );
    assert_eq!(
        layout(&btf, "call_state").1[2],
        ("scope_gen".to_owned(), memtrack_bpf::CALLS_SCOPE_OFFSET)
    );
    assert_eq!(
        layout(&btf, "memtrack_config"),
        (
            size_of::<RawConfig>(),
            owned(&[
                ("target_tgid", offset_of!(RawConfig, target_tgid)),
                ("follow", offset_of!(RawConfig, follow)),
                ("wakeup_bytes", offset_of!(RawConfig, wakeup_bytes)),
                ("page_size", offset_of!(RawConfig, page_size)),
                ("stack_depth", offset_of!(RawConfig, stack_depth)),
                ("fallbacks", offset_of!(RawConfig, fallbacks)),
            ])
        )
    );
    assert_eq!(
        layout(&btf, "memtrack_stack"),
        (
            RawStack::SIZE,
            owned(&[
                ("ts", offset_of!(RawStack, ts)),
                ("pid", offset_of!(RawStack, pid)),
                ("id", offset_of!(RawStack, id)),
                ("record", offset_of!(RawStack, record)),
                ("nframes", offset_of!(RawStack, nframes)),
                ("flags", offset_of!(RawStack, flags)),
                ("scanned", offset_of!(RawStack, scanned)),
            ])
        )
    );
}

#[test]
fn every_program_the_loader_names_exists() {
    let btf = Btf::from_raw("memtrack", OBJECT)
        .unwrap()
        .expect("the object has BTF");
    for n in [
        memtrack_bpf::PROG_ENTRY,
        memtrack_bpf::PROG_RET,
        memtrack_bpf::PROG_NOP,
        memtrack_bpf::PROG_SYS_EXIT,
        memtrack_bpf::PROG_FORK,
        memtrack_bpf::PROG_EXEC,
    ] {
        let f: Option<Func<'_>> = btf.type_by_name(n);
        assert!(f.is_some(), "no BPF program {n} in the object");
    }
}

/// The `MT_KIND_*` numbers of every BPF header equal the kind table (`for_each_kind!`, from which
/// `kind` and memtrack's `KindTag` are derived): every kind of the table is defined, with its
/// number, and the headers define no other.
#[test]
fn header_kinds_equal_the_kind_table() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bpf");
    let mut defined = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("src/bpf") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "h" && e != "c") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a header");
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("#define") {
                continue;
            }
            let (Some(name), Some(value)) = (words.next(), words.next()) else {
                continue;
            };
            if let Some(kind) = name.strip_prefix("MT_KIND_") {
                let value: u32 = value
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: {line:?} is not a number", path.display()));
                defined.push((kind.to_owned(), value));
            }
        }
    }
    defined.sort_by_key(|&(_, v)| v);
    let table: Vec<(String, u32)> = memtrack_bpf::kind::ALL
        .iter()
        .map(|&(n, v)| (n.to_owned(), v))
        .collect();
    assert_eq!(
        defined, table,
        "memtrack.h's MT_KIND_* and for_each_kind! differ"
    );
    assert_eq!(memtrack_bpf::kind::REALLOC, 3);
}

/// The stack record's constants of memtrack.h equal the Rust ones, and its marker is no kind's
/// number (the poller tells the two records apart by it).
#[test]
fn header_stack_constants_equal_the_rust_ones() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bpf/memtrack.h");
    let text = std::fs::read_to_string(&path).expect("memtrack.h");
    let define = |name: &str| -> u32 {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
            .unwrap_or_else(|| panic!("no #define {name} in memtrack.h"));
        let v = line.split_whitespace().nth(2).expect("a value");
        match v.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).expect("hex"),
            None => v.parse().expect("a number"),
        }
    };
    assert_eq!(define("MT_RECORD_STACK"), memtrack_bpf::RECORD_STACK);
    assert_eq!(define("MT_STACK_MAX"), memtrack_bpf::STACK_MAX);
    assert_eq!(define("MT_STACK_TRUNCATED"), memtrack_bpf::STACK_TRUNCATED);
    assert!(
        memtrack_bpf::kind::ALL
            .iter()
            .all(|&(_, v)| v != memtrack_bpf::RECORD_STACK)
    );
}
