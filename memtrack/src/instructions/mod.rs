//! Instructions per benchmark: a benchmark harness marks each benchmark's measured iterations
//! with callgrind's client requests ([`client`]), one callgrind dump per benchmark named by a
//! [`Dump`] line; [`run`] runs a benchmark program under callgrind and reads those dumps into
//! figures per iteration, R times; [`compare`] compares two sides' figures, once they are
//! known to be comparable ([`Toolchain`]).
//!
//! Behind the `callgrind` feature, like [`crate::callgrind`], whose profiles it reads.

pub mod client;

use std::ffi::CString;

/// The text a harness gives `CALLGRIND_DUMP_STATS_AT` for one benchmark, and reads back from
/// the dump's `desc: Trigger: Client Request: …` line: `memtrack-bench iterations=N id=ID`,
/// a line break in the id written `\n` and a backslash `\\`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    /// The benchmark's id, as its harness names it (criterion's `group/function/parameter`).
    pub id: String,
    /// How many iterations the dump counted.
    pub iterations: u64,
}

const DUMP_PREFIX: &str = "memtrack-bench iterations=";
const CLIENT_REQUEST: &str = "Client Request: ";

impl Dump {
    /// The text to pass to [`client::dump_stats_at`].
    pub fn text(&self) -> CString {
        let mut id = String::with_capacity(self.id.len());
        for c in self.id.chars() {
            match c {
                '\\' => id.push_str("\\\\"),
                '\n' => id.push_str("\\n"),
                '\r' => id.push_str("\\r"),
                '\0' => id.push_str("\\0"),
                c => id.push(c),
            }
        }
        CString::new(format!("{DUMP_PREFIX}{} id={id}", self.iterations))
            .expect("NUL bytes are escaped")
    }

    /// The dump a profile's trigger ([`crate::callgrind::Profile::trigger`]) names, if a
    /// harness made it.
    pub fn from_trigger(trigger: &str) -> Option<Dump> {
        let rest = trigger
            .strip_prefix(CLIENT_REQUEST)?
            .strip_prefix(DUMP_PREFIX)?;
        let (n, id) = rest.split_once(" id=")?;
        let iterations = n.parse().ok()?;
        let mut out = String::with_capacity(id.len());
        let mut chars = id.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('0') => out.push('\0'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        }
        Some(Dump {
            id: out,
            iterations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_text_reads_back() {
        for id in ["vec/1024", "a\\b\nc #2", "", "id=x iterations=3"] {
            let d = Dump {
                id: id.into(),
                iterations: 7,
            };
            let text = d.text().into_string().unwrap();
            assert!(!text.contains('\n'));
            let back = Dump::from_trigger(&format!("{CLIENT_REQUEST}{text}"));
            assert_eq!(back, Some(d));
        }
        assert_eq!(Dump::from_trigger("Program termination"), None);
        assert_eq!(Dump::from_trigger("Client Request: other"), None);
    }
}
