//! `memtrack synth --events N -o FILE`: an artifact from a seeded model of a multi-threaded
//! program.

use std::path::PathBuf;
use std::process::ExitCode;

use memtrack::{
    artifact::Backend, artifact::Metadata, artifact::Output, encode::Encoder,
    encode::EncoderOptions, human, synth::Synth, synth::SynthOptions,
};

use crate::writing;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Number of events.
    #[arg(long)]
    events: u64,
    /// Seed of the model: the same seed gives the same trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of threads in the model.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    threads: u32,
    /// Allocations carry call stacks (300 call sites, Zipf-like counts, 10–40 frames with
    /// shared prefixes), each stack defined where the trace first uses it.
    #[arg(long)]
    stacks: bool,
    /// Compression threads (default: available cores − 2, at least 1).
    #[arg(long)]
    workers: Option<usize>,
    /// Output file.
    #[arg(short, long)]
    output: PathBuf,
}

/// Writes `args.events` events of the model to `args.output`.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    let Args {
        events,
        seed,
        threads,
        stacks,
        workers,
        output,
    } = args;
    let opts = SynthOptions { seed, threads };
    let model = if stacks {
        Synth::with_stacks(opts)
    } else {
        Synth::new(opts)
    };
    let meta = Metadata::now(model.pid(), Backend::Synth)
        .with_name(format!("synth seed={seed} threads={threads}"))
        .with_command(std::env::args().collect());
    let mut opts = EncoderOptions::new();
    if let Some(w) = workers {
        opts = opts.workers(w);
    }
    // A temporary file renamed over `output` when finished (see `Output`): an existing
    // artifact is only ever replaced by a complete one.
    let out = Output::create(&output)?;
    let w = Encoder::new(out.writer()?, &meta, opts)
        .and_then(|mut enc| {
            for (id, m) in model.modules() {
                enc.define_module(*id, m.clone())?;
            }
            // Each stack defined just before the first event that names it, as a recorder does.
            let table = model.stacks().to_vec();
            let mut defined = vec![false; table.len() + 1];
            for ev in model.take(events as usize) {
                let id = ev.stack.0 as usize;
                if id != 0 && !defined[id] {
                    defined[id] = true;
                    let (sid, stack) = &table[id - 1];
                    enc.define_stack(*sid, stack.clone())?;
                }
                enc.push(ev)?;
            }
            enc.finish(0)
        })
        .map_err(|e| writing(e, out.path()))?;
    let written = out.commit()?;
    eprintln!(
        "memtrack: wrote {} events in {} frames to {} ({}, {:.2} bytes/event)",
        human::count(w.events),
        w.frames,
        written.display(),
        human::bytes(w.bytes),
        w.bytes as f64 / w.events.max(1) as f64
    );
    Ok(ExitCode::SUCCESS)
}
