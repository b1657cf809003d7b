//! `memtrack verify FILE`: decodes every frame and checks checksums, counts and the trailer.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::{artifact::Completeness, artifact::Reader, human};

use crate::whole::{self, NotWhole};
use crate::{analyse, out, stored_totals_agree};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The artifact.
    file: PathBuf,
    /// Check the file's structure only (frames, checksums, counts, trailer): a recording
    /// that lost events passes, with a note of how many.
    #[arg(long)]
    structure_only: bool,
}

/// Exit 0 if `args.file` is sound and whole (or only sound, with `--structure-only`), else
/// print the first problem and exit 1.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    verify(&args.file, args.structure_only)
}

fn verify(path: &Path, structure_only: bool) -> crate::error::Result<ExitCode> {
    let fail = |msg: String| {
        out(&format!("FAILED {}: {msg}\n", path.display()))?;
        Ok(ExitCode::FAILURE)
    };
    let reader = match Reader::open(path) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    if let Completeness::Recovered { reason } = reader.completeness() {
        return fail(reason.clone());
    }
    let totals = match analyse(&reader, "verifying") {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    if !stored_totals_agree(&reader, &totals) {
        return fail(
            "the totals stored in the trailer differ from the totals of the decoded events".into(),
        );
    }
    // A recording that lost events or processes is structurally sound but not whole: its
    // numbers are not the program's.
    let not_whole = match whole::check(&reader) {
        Ok(_) => None,
        Err(why @ (NotWhole::Lost(_) | NotWhole::Uncovered(_))) => Some(why),
        Err(why) => return fail(why.reason()),
    };
    if let Some(why) = &not_whole
        && !structure_only
    {
        let fix = match why {
            NotWhole::Lost(_) => "record again with a larger --ringbuf-mib, or pass",
            _ => "pass",
        };
        return fail(format!(
            "{}: the file is sound but the recording is not whole; {fix} --structure-only to \
             check the file's structure alone",
            why.reason()
        ));
    }
    out(&format!(
        "OK {}: {} frames, {} events, checksums, counts, index and totals sound{}\n",
        path.display(),
        human::count(reader.frames().len() as u64),
        human::count(totals.events),
        match not_whole {
            Some(NotWhole::Lost(n)) => format!(
                " (structure only: {} lost, the recording is not whole)",
                human::plural(n, "event", "events")
            ),
            Some(why) => format!(
                " (structure only: {}, the recording is not whole)",
                why.reason()
            ),
            None => String::new(),
        }
    ))?;
    Ok(ExitCode::SUCCESS)
}
