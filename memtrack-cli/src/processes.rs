//! Which processes a recording covered, and their own totals: `record`'s summary, `show`
//! (human and JSON), and the refusal of `verify` and `compare` when some were not covered.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use memtrack::render::{self, Align, Cell, Column, Table};
use memtrack::{analysis::ProcessTotals, artifact::Final, artifact::ProcessInfo, human};

/// Why a recording is not whole because of processes it did not cover, or `None`.
pub fn not_whole(fin: &Final) -> Option<String> {
    let n = fin.uncovered_processes();
    if n == 0 {
        return None;
    }
    let mut why: Vec<String> = fin
        .processes
        .iter()
        .filter_map(|p| {
            let r = p.uncovered.as_ref()?;
            Some(format!("pid {} ({r})", p.pid))
        })
        .collect();
    if fin.unfollowed_processes > 0 {
        why.push(format!(
            "{} started and not followed (--no-follow)",
            human::plural(fin.unfollowed_processes, "process", "processes")
        ));
    }
    Some(format!(
        "{} not covered: {}",
        human::plural(n, "process was", "processes were"),
        why.join("; ")
    ))
}

/// The table of processes: pid, parent, exit, their own allocations, bytes, frees and live
/// blocks at the end, and the command; then why any was not covered.
pub fn table(
    processes: &[ProcessInfo],
    unfollowed: u64,
    per: &BTreeMap<u32, ProcessTotals>,
) -> String {
    let mut o = String::new();
    if processes.is_empty() && unfollowed == 0 {
        return o;
    }
    if !processes.is_empty() {
        for line in render::text(&rows(processes, per)).lines() {
            let _ = writeln!(o, "  {line}");
        }
    }
    for p in processes {
        if let Some(why) = &p.uncovered {
            let _ = writeln!(o, "  pid {} not covered: {why}", p.pid);
        }
    }
    if unfollowed > 0 {
        let _ = writeln!(
            o,
            "  NOT COVERED: {} started by the command and not followed (--no-follow): \
             their allocations are not in the file",
            human::plural(unfollowed, "process", "processes")
        );
    }
    o
}

/// The processes, one row each: pid, parent, exit code, their own allocations, bytes, frees
/// and live blocks at the end, and the command (`NOT COVERED` after it when so).
fn rows(processes: &[ProcessInfo], per: &BTreeMap<u32, ProcessTotals>) -> Table {
    let mut t = Table::new(vec![
        Column::new("pid", "pid", Align::Right),
        Column::new("parent", "parent", Align::Right),
        Column::new("exit_code", "exit", Align::Right),
        Column::new("allocations", "allocations", Align::Right),
        Column::new("bytes_allocated", "allocated", Align::Right),
        Column::new("frees", "frees", Align::Right),
        Column::new("live_blocks_at_end", "live", Align::Right),
        Column::new("command", "command", Align::Left),
    ]);
    for p in processes {
        let x = per.get(&p.pid).copied().unwrap_or_default();
        let command = if p.command.is_empty() {
            p.exe.clone()
        } else {
            p.command.join(" ")
        };
        let uncovered = if p.uncovered.is_some() {
            "  NOT COVERED"
        } else {
            ""
        };
        t.push(vec![
            Cell::Text(p.pid.to_string()),
            Cell::Text(p.parent.map_or("-".into(), |x| x.to_string())),
            Cell::Text(p.exit_code.map_or("?".into(), |x| x.to_string())),
            Cell::Count(Some(x.allocations)),
            Cell::Bytes(x.bytes_allocated),
            Cell::Count(Some(x.frees)),
            Cell::Count(Some(x.live_blocks_at_end)),
            Cell::Text(format!("{}{uncovered}", truncate(&command, 60))),
        ]);
    }
    t
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut t: String = s.chars().take(n - 1).collect();
    t.push('…');
    t
}

/// `show --json`'s `processes`: every followed process with its own totals.
pub fn json(processes: &[ProcessInfo], per: &BTreeMap<u32, ProcessTotals>) -> serde_json::Value {
    processes
        .iter()
        .map(|p| {
            let t = per.get(&p.pid).copied().unwrap_or_default();
            serde_json::json!({
                "pid": p.pid,
                "parent": p.parent,
                "exe": p.exe,
                "command": p.command,
                "exit_code": p.exit_code,
                "uncovered": p.uncovered,
                "events": t.events,
                "allocations": t.allocations,
                "bytes_allocated": t.bytes_allocated,
                "frees": t.frees,
                "bytes_freed": t.bytes_freed,
                "unmatched_frees": t.unmatched_frees,
                "live_blocks_at_end": t.live_blocks_at_end,
                "live_bytes_at_end": t.live_bytes_at_end,
            })
        })
        .collect()
}
