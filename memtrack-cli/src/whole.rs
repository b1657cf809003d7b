//! Whether a recording stands for its whole program: the one gate of the commands that compare
//! or diff recordings (`compare`, `bench`, `flamegraph --diff`: a partial recording would show
//! what it missed as shrinking), and the one warning of those that draw what there is (`plot`,
//! the call-site views), and the one message of lost events (`verify`'s too).

use std::path::Path;

use memtrack::artifact::{Completeness, Final, Reader};
use memtrack::human;

use crate::error::Error;

/// Why a recording is not whole.
#[derive(Debug)]
pub(crate) enum NotWhole {
    /// The file was not finished; its complete frames were recovered.
    Incomplete(String),
    /// No trailer to say whether anything was lost.
    NoTrailer,
    /// Events the ring buffer dropped.
    Lost(u64),
    /// Processes of the command that were not recorded (from `processes::not_whole`).
    Uncovered(String),
}

impl NotWhole {
    /// What is missing.
    pub(crate) fn reason(&self) -> String {
        match self {
            NotWhole::Incomplete(reason) => format!("the artifact is incomplete ({reason})"),
            NotWhole::NoTrailer => "the artifact has no trailer".into(),
            NotWhole::Lost(n) => lost(*n),
            NotWhole::Uncovered(why) => why.clone(),
        }
    }

    /// How to record it whole.
    pub(crate) fn fix(&self) -> &'static str {
        match self {
            NotWhole::Incomplete(_) | NotWhole::NoTrailer => {
                "record it again and let the recording finish"
            }
            NotWhole::Lost(_) => "record it again with a larger --ringbuf-mib",
            NotWhole::Uncovered(_) => {
                "record it again following every process (without --no-follow)"
            }
        }
    }
}

/// The one message of lost events, wherever they are reported: "3 events were lost while
/// recording (the ring buffer overflowed)".
pub(crate) fn lost(n: u64) -> String {
    format!(
        "{} lost while recording (the ring buffer overflowed)",
        human::plural(n, "event was", "events were")
    )
}

/// The recording's final metadata if it is whole, else why not.
pub(crate) fn check(reader: &Reader) -> Result<&Final, NotWhole> {
    if let Completeness::Recovered { reason } = reader.completeness() {
        return Err(NotWhole::Incomplete(reason.to_string()));
    }
    let fin = reader.final_metadata().ok_or(NotWhole::NoTrailer)?;
    if fin.lost_events > 0 {
        return Err(NotWhole::Lost(fin.lost_events));
    }
    if let Some(why) = super::processes::not_whole(fin) {
        return Err(NotWhole::Uncovered(why));
    }
    Ok(fin)
}

/// The recording's final metadata if it is whole, else the refusal of `file` by a command that
/// would `verb` it ("compared", "diffed"): what is missing, and how to record it whole.
pub(crate) fn require<'r>(
    reader: &'r Reader,
    file: &Path,
    verb: &'static str,
) -> Result<&'r Final, Error> {
    check(reader).map_err(|why| Error::NotWhole {
        file: file.to_path_buf(),
        why,
        verb,
    })
}

/// Warns, once, that `file` lost events while recording and that what is drawn from it
/// (`misses`: "the curve", "the call sites") misses them.
pub(crate) fn warn_lost(reader: &Reader, file: &Path, misses: &str) {
    if let Some(f) = reader.final_metadata()
        && f.lost_events > 0
    {
        eprintln!(
            "memtrack: warning: {}: {}; {misses} misses them",
            file.display(),
            lost(f.lost_events)
        );
    }
}
