//! `memtrack compare BASE HEAD`: the memory regression gate. Exit 0: no regression; 1: at least
//! one metric grew past the threshold; 2: bad usage or an input refused (unreadable, corrupt,
//! incomplete or lossy) or the output could not be written, with one message per refused file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::{
    analysis::Attribution, analysis::Benchmark, analysis::Comparison, analysis::Metric,
    analysis::SiteAnalyzer, analysis::Sites, analysis::Threshold, analysis::Verdict,
    artifact::Reader, symbolize::SiteComparison, symbolize::SiteKey,
};

use crate::error::Error;

pub(crate) mod render;

/// The call sites of the loaded recordings, by file: those of a recording with call stacks, and
/// the empty set of one that allocated nothing (no call site to miss). A recording that
/// allocated without call stacks has none here.
pub(crate) type SiteSets = std::collections::HashMap<PathBuf, Sites>;

/// Which metrics `--metric` selects.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum MetricArg {
    /// Number of allocations.
    Allocations,
    /// Bytes allocated.
    Bytes,
    /// Peak live heap bytes.
    Peak,
    /// All three.
    All,
}

impl MetricArg {
    fn metrics(self) -> Vec<Metric> {
        match self {
            MetricArg::Allocations => vec![Metric::Allocations],
            MetricArg::Bytes => vec![Metric::Bytes],
            MetricArg::Peak => vec![Metric::Peak],
            MetricArg::All => Metric::ALL.to_vec(),
        }
    }
}

/// Output format of `compare`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Format {
    /// Aligned table for a terminal.
    Table,
    /// GitHub-flavoured markdown for a CI job summary.
    Markdown,
    /// Machine-readable JSON with exact values.
    Json,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The baseline: an artifact or a directory of them.
    base: PathBuf,
    /// The candidate: an artifact or a directory of them.
    head: PathBuf,
    /// Growth allowed before a metric counts as regressed, with its % sign (`3%`, `0.5%`;
    /// a bare number is refused). Growth from 0 is always a regression; any shrinking is an
    /// improvement.
    #[arg(long, default_value = "3%", value_parser = |s: &str| s.parse::<Threshold>())]
    threshold: Threshold,
    /// Which metric to gate on.
    #[arg(long, value_enum, default_value_t = MetricArg::All)]
    metric: MetricArg,
    /// Output format (markdown is ready for a CI job summary).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Runs the comparison; see the module docs for the exit codes.
pub(crate) fn run(args: Args) -> crate::error::Result<ExitCode> {
    let Args {
        base,
        head,
        threshold,
        metric,
        format,
    } = args;
    let (base, head) = (base.as_path(), head.as_path());
    let mut loaded = load_pair(base, head)?;
    // Two files name their benchmark explicitly: compare them whatever their names.
    let (b, h) = (&mut loaded.base[0], &loaded.head[0]);
    if base.is_file() && head.is_file() && b.name != h.name {
        eprintln!(
            "memtrack: note: comparing {} (benchmark {:?}) with {} (benchmark {:?})",
            base.display(),
            b.name,
            head.display(),
            h.name
        );
        b.name = h.name.clone();
    }
    nothing_in_common(&loaded, base, head)?;
    let judged = judge(&loaded, &metric.metrics(), threshold)?;
    super::out(&judged.render(format))?;
    Ok(judged.exit_code())
}

/// Both sides of a comparison, read whole and found fit to compare.
pub(crate) struct Loaded {
    /// The base's benchmarks.
    pub base: Vec<Benchmark>,
    /// The head's benchmarks.
    pub head: Vec<Benchmark>,
    sites: SiteSets,
}

impl Loaded {
    /// Keeps only the benchmarks named in `names`, on both sides.
    pub(crate) fn retain(&mut self, names: &std::collections::BTreeSet<String>) {
        self.base.retain(|b| names.contains(&b.name));
        self.head.retain(|b| names.contains(&b.name));
    }
}

/// An error when `loaded` compares nothing (no benchmark is on both sides), naming each
/// side's benchmarks: a gate that compared nothing must not pass.
pub(crate) fn nothing_in_common(loaded: &Loaded, base: &Path, head: &Path) -> Result<(), Error> {
    if loaded
        .base
        .iter()
        .any(|b| loaded.head.iter().any(|h| h.name == b.name))
    {
        return Ok(());
    }
    let names = |set: &[Benchmark]| {
        let mut n: Vec<String> = set
            .iter()
            .take(5)
            .map(|b| format!("{:?}", b.name))
            .collect();
        if set.len() > 5 {
            n.push(format!("and {} more", set.len() - 5));
        }
        if n.is_empty() {
            "none".into()
        } else {
            n.join(", ")
        }
    };
    Err(Error::NothingInCommon(format!(
        "nothing to compare: no benchmark is on both sides (base {}: {}; head {}: {}); compare \
         recordings of the same benchmarks",
        base.display(),
        names(&loaded.base),
        head.display(),
        names(&loaded.head)
    )))
}

/// Reads both sides (an artifact or a directory of them each). An error with every problem
/// when an input is refused.
pub(crate) fn load_pair(base: &Path, head: &Path) -> Result<Loaded, Error> {
    // The two sides are read at once, on two threads (each decodes on the rayon pool too).
    let load = |path: &Path, side: &str| {
        let (mut errors, mut sites) = (Vec::new(), SiteSets::new());
        let set = load_side(path, side, &mut errors, &mut sites);
        (set, errors, sites)
    };
    let ((base_set, mut errors, mut sites), (head_set, head_errors, head_sites)) =
        std::thread::scope(|s| {
            let h = s.spawn(|| load(head, "head"));
            let b = load(base, "base");
            (b, h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        });
    errors.extend(head_errors);
    sites.extend(head_sites);
    if !errors.is_empty() {
        let summary = format!(
            "refusing to compare: {} input problem{}",
            errors.len(),
            if errors.len() == 1 { "" } else { "s" }
        );
        return Err(Error::Refused {
            problems: errors,
            summary: Some(summary),
        });
    }
    Ok(Loaded {
        base: base_set,
        head: head_set,
        sites,
    })
}

/// A comparison and the call sites behind its regressions.
pub(crate) struct Judged {
    /// The numbers and verdicts.
    pub cmp: Comparison,
    /// The sites behind each regressed row whose recordings have call stacks.
    pub attributed: Vec<Attributed>,
}

impl Judged {
    /// The comparison as a table, markdown or JSON.
    pub(crate) fn render(&self, format: Format) -> String {
        match format {
            Format::Table => render::table(&self.cmp, &self.attributed),
            Format::Markdown => render::markdown(&self.cmp, &self.attributed),
            Format::Json => {
                serde_json::to_string_pretty(&render::json(&self.cmp, &self.attributed))
                    .expect("json values serialize")
                    + "\n"
            }
        }
    }

    /// 1 when a metric regressed, else 0.
    pub(crate) fn exit_code(&self) -> ExitCode {
        if self.cmp.regressions() > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// Compares `loaded` on `metrics` and attributes the regressions. An error naming each
/// benchmark that holds per-iteration figures on one side and plain totals on the other.
pub(crate) fn judge(
    loaded: &Loaded,
    metrics: &[Metric],
    threshold: Threshold,
) -> Result<Judged, Error> {
    let cmp = Comparison::new(&loaded.base, &loaded.head, metrics, threshold);
    if !cmp.mismatched.is_empty() {
        return Err(Error::Refused {
            problems: (cmp.mismatched.iter())
                .map(|(b, h)| Error::Mismatched(render::mismatch(b, h)))
                .collect(),
            summary: Some(format!(
                "refusing to compare per-iteration figures with plain totals: {}",
                memtrack::human::plural(cmp.mismatched.len() as u64, "benchmark", "benchmarks")
            )),
        });
    }
    let attributed = attribute(&cmp, &loaded.base, &loaded.head, &loaded.sites)?;
    Ok(Judged { cmp, attributed })
}

/// The benchmarks of one side: a file, or the `*.memtrack` files of a directory. Problems are
/// appended to `errors` (all of them, so that one run reports every bad input).
pub(crate) fn load_side(
    path: &Path,
    side: &str,
    errors: &mut Vec<Error>,
    sites: &mut SiteSets,
) -> Vec<Benchmark> {
    let files = match artifacts(path, side) {
        Ok(f) => f,
        Err(e) => {
            errors.push(e);
            return Vec::new();
        }
    };
    let mut set: Vec<Benchmark> = Vec::new();
    for f in files {
        match load(&f) {
            Ok((b, s)) => {
                if let Some(s) = s {
                    sites.insert(b.path.clone(), s);
                }
                if let Some(other) = set.iter().find(|o| o.name == b.name) {
                    errors.push(Error::SameBenchmark {
                        side: side.into(),
                        first: other.path.clone(),
                        second: b.path.clone(),
                        name: b.name.clone(),
                    });
                } else {
                    set.push(b);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    set
}

/// `path` itself if it is a file, else the `*.memtrack` files in it, sorted; `side` names it
/// in errors.
fn artifacts(path: &Path, side: &str) -> Result<Vec<PathBuf>, Error> {
    let unlisted = |source| Error::Unlisted {
        side: side.into(),
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(unlisted)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(unlisted)? {
        let p = entry.map_err(unlisted)?.path();
        if p.extension().is_some_and(|x| x == "memtrack") && p.is_file() {
            files.push(p);
        }
    }
    if files.is_empty() {
        return Err(Error::NoArtifacts {
            side: side.into(),
            path: path.to_path_buf(),
        });
    }
    files.sort();
    Ok(files)
}

/// Reads one artifact whole and checks it is fit to compare: finished, no lost events, every
/// frame sound and its decoded totals equal to those its writer stored.
/// Its sites too when it has call stacks.
fn load(path: &Path) -> Result<(Benchmark, Option<Sites>), Error> {
    let reader = Reader::open(path).map_err(|e| Error::Uncomparable(e.into()))?;
    let fin = super::whole::require(&reader, path, "compared")?;
    // A recording with call stacks gets its sites in the same pass (the site accounting costs
    // less than decoding the file a second time when a regression is attributed).
    let stacked = reader.stacks().is_ok_and(|t| t.stacks().len() > 0);
    let (totals, sites) = if stacked {
        let bar = super::progress::events_bar(&reader, "reading");
        let a = SiteAnalyzer::read(&reader, |evs| bar.inc(evs.len() as u64))?;
        bar.finish_and_clear();
        (a.analyzer().totals(), Some(a.sites()))
    } else {
        let totals = super::analyse(&reader, "reading")?;
        let sites = (totals.allocations == 0).then(Sites::default);
        (totals, sites)
    };
    if !super::stored_totals_agree(&reader, &totals) {
        return Err(Error::TotalsDisagree {
            file: path.to_path_buf(),
        });
    }
    let name = match &reader.metadata().name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        ),
    };
    Ok((
        Benchmark::new(name, path, totals).with_iterations(fin.iterations),
        sites,
    ))
}

/// The call sites behind one regressed row of a comparison.
pub struct Attributed {
    /// The benchmark.
    pub benchmark: String,
    /// The sites ranked by their part in the change of the row's metric.
    pub attribution: Attribution<SiteKey>,
    /// Sites of the base, then of the head, with a frame that cannot be matched across
    /// recordings (no symbol and no build id): they show as vanished and new.
    pub unmatched: [usize; 2],
    /// Modules whose frames could not be named (path, why), of either side.
    pub unnamed_modules: Vec<(String, String)>,
}

/// The sites behind every regressed row, matched by symbolized frames: a side that allocated
/// nothing has no sites, so every site of the other is new (or vanished). A regressed
/// benchmark one of whose recordings allocated without call stacks gets a note on stderr
/// instead (the standard output stays what it is without attribution).
fn attribute(
    cmp: &Comparison,
    base_set: &[Benchmark],
    head_set: &[Benchmark],
    sites: &SiteSets,
) -> crate::error::Result<Vec<Attributed>> {
    let mut out = Vec::new();
    let mut benchmarks: Vec<&str> = cmp
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regressed)
        .map(|r| r.benchmark.as_str())
        .collect();
    benchmarks.dedup();
    let mut sym = super::symbolizer_of(base_set.iter().chain(head_set).map(|b| b.path.as_path()));
    for name in benchmarks {
        let find = |set: &[Benchmark]| {
            // A lone file's benchmark was renamed to the head's: it is the only one.
            set.iter()
                .find(|b| b.name == name)
                .or(set.first().filter(|_| set.len() == 1))
                .map(|b| b.path.clone())
        };
        let (Some(bp), Some(hp)) = (find(base_set), find(head_set)) else {
            continue;
        };
        let stacked = |path: &PathBuf| {
            sites
                .get(path)
                .filter(|s| s.sites.is_empty() || s.has_stacks())
        };
        let (Some(bs), Some(hs)) = (stacked(&bp), stacked(&hp)) else {
            for path in [&bp, &hp].into_iter().filter(|p| stacked(p).is_none()) {
                let why = Reader::open(path)
                    .map_or_else(|e| e.to_string(), |r| super::show::no_stacks_note(&r));
                eprintln!(
                    "memtrack: note: no call sites for the regression of {}: {} allocated \
                     without them: {why}",
                    memtrack::human::terminal(name),
                    path.display()
                );
            }
            continue;
        };
        let (br, hr) = (Reader::open(&bp)?, Reader::open(&hp)?);
        let keyed = SiteComparison::new(&mut sym, &br, bs, &hr, hs)?;
        let unnamed = keyed.unnamed_modules();
        for r in cmp
            .rows
            .iter()
            .filter(|r| r.benchmark == name && r.verdict == Verdict::Regressed)
        {
            out.push(Attributed {
                benchmark: name.to_string(),
                attribution: keyed.attribution(r.metric),
                unmatched: [keyed.base.unmatched, keyed.head.unmatched],
                unnamed_modules: unnamed.clone(),
            });
        }
    }
    Ok(out)
}
