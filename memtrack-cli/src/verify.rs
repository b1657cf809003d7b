//! `memtrack verify FILE`: decodes every frame and checks checksums, counts and the trailer.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::{artifact::Completeness, artifact::Reader, human};

use crate::{analyse, out, processes, stored_totals_agree};

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
pub(crate) fn run(args: Args) -> memtrack::Result<ExitCode> {
    verify(&args.file, args.structure_only)
}

fn verify(path: &Path, structure_only: bool) -> memtrack::Result<ExitCode> {
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
    // A lossy recording is structurally sound but not whole: its numbers are not the
    // program's.
    let lost = reader.final_metadata().map_or(0, |f| f.lost_events);
    if lost > 0 && !structure_only {
        return fail(format!(
            "{} lost while recording (the ring buffer was full): the file is sound but the \
             recording is not whole; record again with a larger --ringbuf-mib, or pass \
             --structure-only to check the file's structure alone",
            human::plural(lost, "event was", "events were")
        ));
    }
    let uncovered = reader.final_metadata().and_then(processes::not_whole);
    if let Some(why) = &uncovered
        && !structure_only
    {
        return fail(format!(
            "{why}: the file is sound but the recording is not whole; pass --structure-only \
             to check the file's structure alone"
        ));
    }
    out(&format!(
        "OK {}: {} frames, {} events, checksums, counts, index and totals sound{}\n",
        path.display(),
        human::count(reader.frames().len() as u64),
        human::count(totals.events),
        if lost > 0 {
            format!(
                " (structure only: {} lost, the recording is not whole)",
                human::plural(lost, "event", "events")
            )
        } else if let Some(why) = uncovered {
            format!(" (structure only: {why}, the recording is not whole)")
        } else {
            String::new()
        }
    ))?;
    Ok(ExitCode::SUCCESS)
}
