//! `memtrack bench --chain BASE..HEAD`: which commit of a range made each regressed benchmark
//! change, for memory, instructions, time or any of them. The whole suite runs at BASE and at
//! HEAD and is compared as `--base` compares; then the benchmarks that regressed in each
//! measure run alone (`MEMTRACK_BENCHMARKS`) at every commit between, on HEAD's first-parent
//! line, in one worktree and, per measure, one target directory (`--base`'s), so that each
//! commit rebuilds only what it changed. Time, a comparison of two builds, is timed between
//! consecutive commits instead ([`timed`]). Each step, a change between two consecutive
//! measured commits, is named by its commit, with the call sites behind each growth of memory,
//! the functions whose inclusive instructions per iteration grew most, and the time that moved
//! beyond noise.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::render::{Align, Cell, Column, Table, md_escape};
use memtrack::{analysis::Metric, analysis::Row, analysis::Threshold, analysis::Verdict, human};

use super::instructions::{self, Counting, Gated};
use super::suite::{Repo, Suite, Worktree};
use super::time;
use crate::compare::{self, Attributed, Format, Judged, render};
use crate::error::Error;

mod timed;

pub(crate) use timed::Timing;

/// One commit of the range.
pub(crate) struct Commit {
    /// The full id.
    pub id: String,
    /// Its subject line.
    pub subject: String,
}

impl Commit {
    fn short(&self) -> &str {
        &self.id[..self.id.len().min(12)]
    }
}

/// `BASE..HEAD` resolved: BASE, then every commit of HEAD's first-parent line after it, oldest
/// first (HEAD last).
pub(crate) fn commits(repo: &Repo, spec: &str) -> Result<Vec<Commit>, Error> {
    let bad = |why: &str| Error::Usage(format!("--chain {spec}: {why}"));
    if spec.contains("...") {
        return Err(bad(
            "`...` is a symmetric difference: give BASE..HEAD, BASE an ancestor of HEAD",
        ));
    }
    let Some((base, head)) = spec.split_once("..") else {
        return Err(bad("expected BASE..HEAD (two revisions joined by `..`)"));
    };
    let head = if head.is_empty() { "HEAD" } else { head };
    let resolve = |r: &str| {
        repo.git(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{r}^{{commit}}"),
        ])
        .map_err(|_| {
            bad(&format!(
                "no commit {r:?} here: name a branch, tag or commit"
            ))
        })
    };
    let (b, h) = (resolve(base)?, resolve(head)?);
    let log = repo.git(&[
        "log",
        "--first-parent",
        "--reverse",
        "--format=%H %P%x09%s",
        &format!("{b}..{h}"),
    ])?;
    let mut out = vec![Commit {
        subject: repo.git(&["log", "-1", "--format=%s", &b])?,
        id: b.clone(),
    }];
    for line in log.lines() {
        let (ids, subject) = line.split_once('\t').unwrap_or((line, ""));
        let mut ids = ids.split(' ');
        let (id, parent) = (
            ids.next().unwrap_or_default(),
            ids.next().unwrap_or_default(),
        );
        if out.len() == 1 && parent != b {
            return Err(bad(&format!(
                "{base} is not on {head}'s first-parent line (its first commit after the range's \
                 start has parent {parent}): name a BASE that {head} descends from by first parents"
            )));
        }
        out.push(Commit {
            id: id.to_string(),
            subject: subject.to_string(),
        });
    }
    if out.len() == 1 {
        return Err(bad("the range holds no commit: give BASE older than HEAD"));
    }
    Ok(out)
}

/// What the chain measures at each commit, each measure in a target directory of its own: the
/// suite in memory mode, instructions under callgrind, time in alternating order, or several.
pub(crate) struct Measures {
    pub memory: Option<Suite>,
    pub instructions: Option<Counting>,
    pub time: Option<Timing>,
}

impl Measures {
    /// Whether memory or instructions are measured (each commit's own figures, in one worktree).
    fn per_commit(&self) -> bool {
        self.memory.is_some() || self.instructions.is_some()
    }

    /// Built in the target directories of `--base`'s builds (under `target`), as the chain's
    /// worktree is: one set of builds.
    fn in_worktree(self, target: &Path) -> Measures {
        Measures {
            memory: self.memory.map(|s| Suite {
                target: target.join("memtrack-bench-base"),
                ..s
            }),
            instructions: self.instructions.map(|i| Counting {
                target: target.join(super::TIME_BASE_TARGET),
                ..i
            }),
            time: self.time,
        }
    }
}

/// What became of one commit of the chain.
enum Outcome {
    /// Measured: its results' directory.
    Measured(PathBuf),
    /// Its suite did not build or run (a broken commit of the range): why.
    Failed(String),
    /// Not run: nothing regressed, so the commits between were not needed.
    Skipped,
}

/// BASE compared with HEAD in each measure, and the benchmarks each follows along the chain.
struct Overall {
    memory: Option<Judged>,
    instructions: Option<Gated>,
    time: Option<time::Report>,
    /// The benchmarks whose memory regressed.
    memory_regressed: BTreeSet<String>,
    /// The benchmarks whose instructions regressed.
    instructions_regressed: BTreeSet<String>,
    /// The benchmarks whose time regressed.
    time_regressed: BTreeSet<String>,
    /// Whether a time regression gates (`--gate time`).
    time_gate: bool,
}

impl Overall {
    /// Compares the ends, measured into `base` and `head`, in each measure of `m`; `time`, the
    /// ends timed.
    fn judge(
        m: &Measures,
        (base, head): (&Path, &Path),
        time: Option<time::Report>,
        threshold: Threshold,
    ) -> Result<Self, Error> {
        let memory = match m.memory {
            Some(_) => {
                let ends = compare::load_pair(base, head)?;
                compare::nothing_in_common(&ends, base, head)?;
                super::mixed(&ends.base, &ends.head)?;
                Some(compare::judge(&ends, &Metric::ALL, threshold)?)
            }
            None => None,
        };
        let instructions = match m.instructions {
            Some(_) => Some(instructions::gate(base, head, threshold)?),
            None => None,
        };
        let memory_regressed = memory
            .iter()
            .flat_map(|j| &j.cmp.rows)
            .filter(|r| r.verdict == Verdict::Regressed)
            .map(|r| r.benchmark.clone())
            .collect();
        let instructions_regressed = instructions
            .iter()
            .flat_map(Gated::regressed_benchmarks)
            .cloned()
            .collect();
        let time_regressed = time
            .iter()
            .flat_map(|t| &t.rows)
            .filter(|r| r.verdict == Verdict::Regressed)
            .map(|r| r.benchmark.clone())
            .collect();
        Ok(Overall {
            memory,
            instructions,
            time,
            memory_regressed,
            instructions_regressed,
            time_regressed,
            time_gate: m.time.as_ref().is_some_and(|t| t.gate),
        })
    }

    /// The benchmarks that regressed in a measure, by name.
    fn regressed(&self) -> BTreeSet<String> {
        let mut all = self.memory_regressed.clone();
        all.extend(self.instructions_regressed.iter().cloned());
        all.extend(self.time_regressed.iter().cloned());
        all
    }

    /// `m` limited to what the chain follows: each measure's regressed benchmarks, and no
    /// measure where none regressed.
    fn followed(&self, m: Measures) -> Measures {
        let list = |set: &BTreeSet<String>| Some(set.iter().cloned().collect());
        Measures {
            memory: m
                .memory
                .filter(|_| !self.memory_regressed.is_empty())
                .map(|s| Suite {
                    only: list(&self.memory_regressed),
                    ..s
                }),
            instructions: m
                .instructions
                .filter(|_| !self.instructions_regressed.is_empty())
                .map(|c| Counting {
                    only: list(&self.instructions_regressed),
                    ..c
                }),
            time: m.time.filter(|_| !self.time_regressed.is_empty()),
        }
    }

    /// 2 when a benchmark of the ends could not be timed; 1 when a benchmark regressed from
    /// BASE to HEAD in a gated measure (memory, instructions; time with `--gate time`); else 0.
    fn exit_code(&self) -> ExitCode {
        if self.time.as_ref().is_some_and(|t| !t.failures.is_empty()) {
            return ExitCode::from(2);
        }
        let memory = self
            .memory
            .as_ref()
            .is_some_and(|j| j.exit_code() != ExitCode::SUCCESS);
        let time = self.time_gate && !self.time_regressed.is_empty();
        if memory || time || !self.instructions_regressed.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// A change of the followed benchmarks between two consecutive measured commits.
struct Step {
    /// Indices into the chain: the measured commit before, and the one that changed.
    from: usize,
    to: usize,
    /// Memory's comparison of the two, when memory is followed: with a threshold of 0, so
    /// that every growth gets its call sites.
    memory: Option<Judged>,
    /// Instructions', when they are followed: with a threshold of 0, so that every growth
    /// names its functions.
    instructions: Option<Gated>,
    /// Time's, when it is followed: the two commits' builds timed in alternating order.
    time: Option<time::Report>,
}

/// Where the chain runs, and what it runs.
pub(crate) struct Chain<'a> {
    pub repo: &'a Repo,
    pub target: &'a Path,
    pub out: &'a Path,
    pub spec: &'a str,
    pub threshold: Threshold,
    pub format: Format,
}

/// Runs the chain; see the module docs. Exit 1 when a benchmark regressed from BASE to HEAD
/// in a gated measure; 2 when a benchmark of the ends could not be timed.
pub(crate) fn run(c: &Chain<'_>, measures: Measures) -> Result<ExitCode, Error> {
    let chain = commits(c.repo, c.spec)?;
    let n = chain.len();
    // Memory's and instructions' worktree: each commit's own figures, one after the other.
    let tree = match measures.per_commit() {
        true => Some(Worktree::add(c.repo, &chain[0].id, c.target, "--chain")?),
        false => None,
    };
    let measures = measures.in_worktree(c.target);
    let dirs: Vec<PathBuf> = chain
        .iter()
        .enumerate()
        .map(|(i, commit)| c.out.join(format!("{i:02}-{}", commit.short())))
        .collect();
    // One build-id store for the whole chain, and no directory of an earlier range left.
    super::clear(c.out)?;
    clear_old_commits(c.out, &dirs)?;
    eprintln!(
        "memtrack: --chain {}: {n} commits; the whole suite at {} and {} first",
        c.spec,
        chain[0].short(),
        chain[n - 1].short()
    );
    if let Some(tree) = &tree {
        for i in [0, n - 1] {
            measure(tree, &measures, &chain[i], &dirs[i])?;
        }
    }
    // Time's two worktrees, BASE and HEAD built and timed.
    let (mut trees, ends_timed) = match &measures.time {
        Some(t) => {
            let (trees, report) = t.ends(c.repo, c.target, c.out, &chain, c.threshold)?;
            (Some(trees), Some(report))
        }
        None => (None, None),
    };
    let overall = Overall::judge(&measures, (&dirs[0], &dirs[n - 1]), ends_timed, c.threshold)?;
    let mut outcomes: Vec<Outcome> = (0..n).map(|_| Outcome::Skipped).collect();
    outcomes[0] = Outcome::Measured(dirs[0].clone());
    outcomes[n - 1] = Outcome::Measured(dirs[n - 1].clone());
    let regressed = overall.regressed();
    let mut times: Vec<Option<time::Report>> = (0..n).map(|_| None).collect();
    if !regressed.is_empty() {
        let followed = overall.followed(measures);
        let mut along = Along {
            tree: tree.as_ref(),
            trees: trees.as_mut(),
            followed: &followed,
            chain: &chain,
            dirs: &dirs,
            outcomes: &mut outcomes,
            times: &mut times,
            threshold: c.threshold,
        };
        along.between(&overall, regressed.len())?;
    }
    drop(tree);
    drop(trees);
    let steps = follow(&outcomes, &overall, &mut times)?;
    let report = Report {
        spec: c.spec,
        regressed: &regressed,
        chain: &chain,
        outcomes: &outcomes,
        overall: &overall,
        steps: &steps,
    };
    crate::out(&report.render(c.format))?;
    super::summary(&report.markdown());
    Ok(overall.exit_code())
}

/// The commits between the ends, measured: what each measure followed needs, and where the
/// results go.
struct Along<'a> {
    /// Memory's and instructions' worktree, when either is followed.
    tree: Option<&'a Worktree>,
    /// Time's two worktrees, when time is measured.
    trees: Option<&'a mut timed::Trees>,
    followed: &'a Measures,
    chain: &'a [Commit],
    dirs: &'a [PathBuf],
    outcomes: &'a mut [Outcome],
    /// Each commit's time step: its build timed against the last measured commit's.
    times: &'a mut [Option<time::Report>],
    threshold: Threshold,
}

impl Along<'_> {
    /// Measures the commits between the ends (each measure limited to its regressed
    /// benchmarks, `count` in all), then times HEAD against the last of them; a commit whose
    /// suite does not build or run is noted and passed over.
    ///
    /// # Errors
    /// Time's step into HEAD failed (HEAD built before, so the run log could not be written).
    fn between(&mut self, overall: &Overall, count: usize) -> Result<(), Error> {
        let n = self.chain.len();
        if n > 2 {
            eprintln!(
                "memtrack: following {} along the {} commits between",
                human::plural(count as u64, "regressed benchmark", "regressed benchmarks"),
                n - 2
            );
        }
        let mut last = 0;
        for i in 1..n - 1 {
            self.outcomes[i] = match self.at(overall, last, i) {
                Ok(()) => {
                    last = i;
                    Outcome::Measured(self.dirs[i].clone())
                }
                Err(e) => {
                    eprintln!(
                        "memtrack: warning: commit {} not measured: {}; its change counts with \
                         the next measured commit's",
                        self.chain[i].short(),
                        human::terminal(&e.to_string())
                    );
                    Outcome::Failed(e.to_string())
                }
            };
        }
        if self.followed.time.is_none() {
            return Ok(());
        }
        match last {
            // No commit between measured: the ends' own timing is the one step.
            0 => {
                let ends = overall.time.as_ref();
                self.times[n - 1] = ends.map(|t| t.only(&overall.time_regressed));
            }
            _ => self.time(overall, last, n - 1)?,
        }
        Ok(())
    }

    /// Measures commit `i` in each measure followed; times it against `last`.
    fn at(&mut self, overall: &Overall, last: usize, i: usize) -> Result<(), Error> {
        if let Some(tree) = self.tree.filter(|_| self.followed.per_commit()) {
            measure(tree, self.followed, &self.chain[i], &self.dirs[i])?;
        }
        self.time(overall, last, i)
    }

    /// Times the benchmarks whose time regressed at `last` against `i`, when time is followed.
    fn time(&mut self, overall: &Overall, last: usize, i: usize) -> Result<(), Error> {
        let (Some(t), Some(trees)) = (&self.followed.time, self.trees.as_deref_mut()) else {
            return Ok(());
        };
        let only = (&overall.time_regressed, self.threshold);
        self.times[i] = Some(t.step(trees, (last, i), self.chain, &self.dirs[i], only)?);
        Ok(())
    }
}

/// Empties and removes the `NN-COMMIT` directories of an earlier chain in `out` that this one
/// does not reuse (a directory that holds other files than memtrack's stays, emptied of them).
fn clear_old_commits(out: &Path, dirs: &[PathBuf]) -> Result<(), Error> {
    let ours = |name: &str| {
        let b = name.as_bytes();
        b.len() == 15
            && b[..2].iter().all(u8::is_ascii_digit)
            && b[2] == b'-'
            && b[3..].iter().all(|c| c.is_ascii_hexdigit())
    };
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let name = entry.file_name();
        if !entry.file_type().is_ok_and(|t| t.is_dir())
            || !name.to_str().is_some_and(ours)
            || dirs.contains(&path)
        {
            continue;
        }
        super::clear(&path)?;
        instructions::clear(&path)?;
        let _ = std::fs::remove_dir(&path);
    }
    Ok(())
}

/// Checks `commit` out, clears `dir` and runs each measure of `m` there into it: an error
/// when memory mode recorded nothing (the benchmarks followed are gone at that commit, or its
/// suite records elsewhere), or instructions mode counted nothing.
fn measure(tree: &Worktree, m: &Measures, commit: &Commit, dir: &Path) -> Result<(), Error> {
    tree.checkout(&commit.id)?;
    super::clear(dir)?;
    instructions::clear(dir)?;
    let what = format!("commit {}", commit.short());
    if let Some(suite) = &m.memory {
        suite.run(&tree.dir, dir, &what)?;
        let recorded = std::fs::read_dir(dir)
            .map_err(|e| crate::error::io(format!("cannot read {}", dir.display()), e))?
            .filter_map(Result::ok)
            .any(|e| e.path().extension().is_some_and(|x| x == "memtrack"));
        if !recorded {
            return Err(Error::Command(format!(
                "its suite recorded no benchmark in {}",
                dir.display()
            )));
        }
    }
    if let Some(counting) = &m.instructions {
        counting.run(&tree.dir, dir, &what)?;
    }
    Ok(())
}

/// The steps of the followed benchmarks between consecutive measured commits; `times`, each
/// commit's time step (taken).
fn follow(
    outcomes: &[Outcome],
    overall: &Overall,
    times: &mut [Option<time::Report>],
) -> Result<Vec<Step>, Error> {
    let measured: Vec<(usize, &PathBuf)> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Outcome::Measured(d) => Some((i, d)),
            _ => None,
        })
        .collect();
    let (memory, counted) = (&overall.memory_regressed, &overall.instructions_regressed);
    let mut steps = Vec::new();
    for pair in measured.windows(2) {
        let ((from, a), (to, b)) = (pair[0], pair[1]);
        let zero = Threshold::from_ppm(0);
        let mut step = Step {
            from,
            to,
            memory: None,
            instructions: None,
            time: times[to].take(),
        };
        if !memory.is_empty() {
            let mut loaded = compare::load_pair(a, b)?;
            loaded.retain(memory);
            step.memory = Some(compare::judge(&loaded, &Metric::ALL, zero)?);
        }
        if !counted.is_empty() {
            step.instructions = Some(instructions::step(a, b, counted)?);
        }
        let changed = step.memory.as_ref().is_some_and(|j| {
            j.cmp.rows.iter().any(|r| r.verdict != Verdict::Unchanged)
                || !j.cmp.added.is_empty()
                || !j.cmp.removed.is_empty()
        }) || step
            .instructions
            .as_ref()
            .is_some_and(|g| !g.moved().is_empty())
            || step.time.as_ref().is_some_and(|t| {
                t.rows.iter().any(moved)
                    || !t.added.is_empty()
                    || !t.removed.is_empty()
                    || !t.failures.is_empty()
            });
        if changed {
            steps.push(step);
        }
    }
    Ok(steps)
}

/// Whether a time row moved: beyond noise, either way.
fn moved(r: &time::Row) -> bool {
    matches!(r.verdict, Verdict::Regressed | Verdict::Improved)
}

/// What the chain found, to render.
struct Report<'a> {
    spec: &'a str,
    /// The benchmarks that regressed from BASE to HEAD in a measure, by name.
    regressed: &'a BTreeSet<String>,
    chain: &'a [Commit],
    outcomes: &'a [Outcome],
    overall: &'a Overall,
    steps: &'a [Step],
}

/// The memory rows of a step that changed.
fn changed(step: &Step) -> impl Iterator<Item = &Row> {
    step.memory
        .iter()
        .flat_map(|j| &j.cmp.rows)
        .filter(|r| r.verdict != Verdict::Unchanged)
}

impl Report<'_> {
    fn render(&self, format: Format) -> String {
        match format {
            Format::Table => self.table(),
            Format::Markdown => self.markdown(),
            Format::Json => {
                serde_json::to_string_pretty(&self.json()).expect("json values serialize") + "\n"
            }
        }
    }

    /// The first line: what regressed from BASE to HEAD and how many commits were followed.
    fn headline(&self) -> String {
        let (base, head) = (&self.chain[0], &self.chain[self.chain.len() - 1]);
        if self.regressed.is_empty() {
            return format!(
                "no benchmark regressed from {} to {}: no commit to name",
                base.short(),
                head.short()
            );
        }
        let measured = self
            .outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Measured(_)))
            .count();
        format!(
            "{} regressed from {} to {}; {} of the chain's {} commits measured, {}",
            self.regressed
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            base.short(),
            head.short(),
            measured,
            self.chain.len(),
            human::plural(self.steps.len() as u64, "step", "steps")
        )
    }

    /// The call sites behind a step's growth of the metrics that regressed from BASE to HEAD
    /// (a step's other changes are in its rows, and all its sites in the JSON).
    fn sites<'s>(&'s self, step: &'s Step) -> impl Iterator<Item = &'s Attributed> {
        let overall = self.overall.memory.iter().flat_map(|j| &j.cmp.rows);
        let attributed = step.memory.iter().flat_map(|j| &j.attributed);
        attributed.filter(move |a| {
            overall.clone().any(|r| {
                r.verdict == Verdict::Regressed
                    && r.benchmark == a.benchmark
                    && r.metric == a.attribution.metric
            })
        })
    }

    /// The commit column of a step: the commit that changed, with the unmeasured ones before
    /// it that may share the change.
    fn commit_text(&self, step: &Step) -> String {
        let to = self.chain[step.to].short();
        match step.to - step.from - 1 {
            0 => to.to_string(),
            1 => format!("{to} (or {}, unmeasured)", self.chain[step.to - 1].short()),
            k => format!("{to} (or one of the {k} unmeasured commits before it)"),
        }
    }

    /// The steps: per benchmark and metric that changed at a step, the commit, the figures
    /// before and after (per iteration when compared so; instructions per iteration) and the
    /// commit's subject.
    fn steps_table(&self) -> Table {
        let mut t = Table::new(vec![
            Column::new("benchmark", "benchmark", Align::Left),
            Column::new("metric", "metric", Align::Left),
            Column::new("commit", "commit", Align::Left),
            Column::new("before", "before", Align::Right),
            Column::new("after", "after", Align::Right),
            Column::new("change_percent", "change", Align::Right),
            Column::new("subject", "subject", Align::Left),
        ]);
        for step in self.steps {
            for r in changed(step) {
                t.push(vec![
                    Cell::Text(r.benchmark.clone()),
                    Cell::Text(r.metric.name().into()),
                    Cell::Code(self.commit_text(step)),
                    Cell::metric(r.metric, r.base, r.base_per_iteration),
                    Cell::metric(r.metric, r.head, r.head_per_iteration),
                    Cell::Change(r.change_percent),
                    Cell::Text(self.chain[step.to].subject.clone()),
                ]);
            }
            for m in step.instructions.iter().flat_map(Gated::moved) {
                t.push(vec![
                    Cell::Text(m.benchmark.clone()),
                    Cell::Text("instructions".into()),
                    Cell::Code(self.commit_text(step)),
                    m.base.clone(),
                    m.head.clone(),
                    m.change.clone(),
                    Cell::Text(self.chain[step.to].subject.clone()),
                ]);
            }
            for r in step.time.iter().flat_map(|t| &t.rows).filter(|r| moved(r)) {
                t.push(vec![
                    Cell::Text(r.benchmark.clone()),
                    Cell::Text("time".into()),
                    Cell::Code(self.commit_text(step)),
                    time::render::timing(&r.base),
                    time::render::timing(&r.head),
                    Cell::Change(Some(r.change_percent)),
                    Cell::Text(self.chain[step.to].subject.clone()),
                ]);
            }
        }
        t
    }

    /// The benchmarks whose time regressed from BASE to HEAD though no step moved it beyond
    /// noise: small changes that added up, or noise at the ends.
    fn crept(&self) -> Vec<&String> {
        let moved_at_a_step = |b: &String| {
            (self.steps.iter())
                .flat_map(|s| s.time.iter().flat_map(|t| &t.rows))
                .any(|r| &r.benchmark == b && r.verdict == Verdict::Regressed)
        };
        (self.overall.time_regressed.iter())
            .filter(|b| !moved_at_a_step(b))
            .collect()
    }

    /// What a step's timing did not compare, one line each, and the benchmarks whose time
    /// regressed but moved at no single step.
    fn time_lines(&self, step: Option<&Step>) -> Vec<String> {
        let Some(step) = step else {
            return (self.crept().into_iter())
                .map(|b| {
                    format!(
                        "{b}: its time regressed from {} to {}, but at no single step beyond noise",
                        self.chain[0].short(),
                        self.chain[self.chain.len() - 1].short()
                    )
                })
                .collect();
        };
        let at = self.chain[step.to].short();
        (step.time.iter())
            .flat_map(time::render::notes)
            .map(|n| format!("at {at}, time: {n}"))
            .collect()
    }

    /// BASE compared with HEAD in each measure, rendered as `format` (table or markdown),
    /// without memory's call sites (the steps have each commit's own).
    fn overall_text(&self, format: Format) -> String {
        let mut out = String::new();
        if let Some(j) = &self.overall.memory {
            out.push_str(&match format {
                Format::Markdown => render::markdown(&j.cmp, &[]),
                _ => render::table(&j.cmp, &[]),
            });
        }
        if let Some(g) = &self.overall.instructions {
            // Markdown's sections end in a blank line already.
            if !out.is_empty() && !matches!(format, Format::Markdown) {
                out.push('\n');
            }
            out.push_str(&g.render(format));
        }
        if let Some(t) = &self.overall.time {
            if !out.is_empty() && !matches!(format, Format::Markdown) {
                out.push('\n');
            }
            out.push_str(&match format {
                Format::Markdown => time::render::markdown(t),
                _ => time::render::table(t),
            });
        }
        out
    }

    /// The functions whose instructions per iteration grew most at a step, as `format`.
    fn grown_text(&self, step: &Step, format: Format) -> Option<String> {
        let grown = step.instructions.as_ref()?.grown(format)?;
        let at = self.chain[step.to].short();
        Some(match format {
            Format::Markdown => format!(
                "At `{at}`, functions that grew most (inclusive, per iteration):\n\n{grown}\n"
            ),
            _ => {
                format!("\nat {at}: functions that grew most (inclusive, per iteration):\n{grown}")
            }
        })
    }

    fn table(&self) -> String {
        let mut out = format!("memtrack: --chain {}: {}\n", self.spec, self.headline());
        out.push_str(&self.overall_text(Format::Table));
        for l in self.time_lines(None) {
            out.push_str(&l);
            out.push('\n');
        }
        if self.steps.is_empty() {
            return out;
        }
        out.push_str("\nsteps along the chain (oldest first)\n");
        out.push_str(&memtrack::render::text(&self.steps_table()));
        for step in self.steps {
            self.presence_lines(step, &mut out);
            for l in self.time_lines(Some(step)) {
                out.push_str(&l);
                out.push('\n');
            }
            for a in self.sites(step) {
                out.push_str(&format!("\nat {}: ", self.chain[step.to].short()));
                out.push_str(&render::attribution_table(a));
            }
            out.extend(self.grown_text(step, Format::Table));
        }
        self.failures(&mut out);
        out
    }

    /// A benchmark that appears or disappears in a step, one line each.
    fn presence_lines(&self, step: &Step, out: &mut String) {
        let at = self.chain[step.to].short();
        let Some(j) = &step.memory else { return };
        for b in &j.cmp.added {
            out.push_str(&format!("{}: first measured at {at}\n", b.name));
        }
        for b in &j.cmp.removed {
            out.push_str(&format!("{}: not measured at {at}\n", b.name));
        }
    }

    /// The commits that could not be measured, one line each.
    fn failures(&self, out: &mut String) {
        for (c, o) in self.chain.iter().zip(self.outcomes) {
            if let Outcome::Failed(why) = o {
                let why = why.lines().next().unwrap_or_default();
                out.push_str(&format!("not measured: {} ({why})\n", c.short()));
            }
        }
    }

    fn markdown(&self) -> String {
        let mut out = format!(
            "### memtrack: commits behind the change, {}\n\n{}\n\n",
            md_escape(self.spec),
            md_escape(&self.headline())
        );
        out.push_str(&self.overall_text(Format::Markdown));
        for l in self.time_lines(None) {
            out.push_str(&format!("- {}\n", md_escape(&l)));
        }
        if self.steps.is_empty() {
            return out;
        }
        out.push_str("#### Steps along the chain (oldest first)\n\n");
        out.push_str(&memtrack::render::markdown(&self.steps_table()));
        out.push('\n');
        for step in self.steps {
            let mut lines = String::new();
            self.presence_lines(step, &mut lines);
            lines.extend(self.time_lines(Some(step)).into_iter().map(|l| l + "\n"));
            for l in lines.lines() {
                out.push_str(&format!("- {}\n", md_escape(l)));
            }
            for a in self.sites(step) {
                out.push_str(&format!("At `{}`:\n\n", self.chain[step.to].short()));
                out.push_str(&render::attribution_markdown(a));
            }
            out.extend(self.grown_text(step, Format::Markdown));
        }
        let mut failed = String::new();
        self.failures(&mut failed);
        for l in failed.lines() {
            out.push_str(&format!("- {}\n", md_escape(l)));
        }
        out
    }

    fn json(&self) -> serde_json::Value {
        let commits: Vec<serde_json::Value> = self
            .chain
            .iter()
            .zip(self.outcomes)
            .map(|(c, o)| {
                let (state, error) = match o {
                    Outcome::Measured(_) => ("measured", None),
                    Outcome::Failed(e) => ("failed", Some(e.as_str())),
                    Outcome::Skipped => ("skipped", None),
                };
                serde_json::json!({
                    "commit": c.id, "subject": c.subject, "state": state, "error": error,
                })
            })
            .collect();
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|s| {
                serde_json::json!({
                    "commit": self.chain[s.to].id,
                    "after": self.chain[s.from].id,
                    "subject": self.chain[s.to].subject,
                    "comparison": comparison_json(
                        s.memory.as_ref(),
                        s.instructions.as_ref(),
                        s.time.as_ref()
                    ),
                })
            })
            .collect();
        serde_json::json!({
            "range": self.spec,
            "regressed": self.regressed,
            "commits": commits,
            "comparison": comparison_json(
                self.overall.memory.as_ref(),
                self.overall.instructions.as_ref(),
                self.overall.time.as_ref()
            ),
            "steps": steps,
            "time_crept": self.crept(),
        })
    }
}

/// A comparison's JSON document, `memtrack compare`'s shape: memory's, with the instruction
/// rows added to it (`--base`'s document); either alone when the other is not measured; and
/// time's, `--measure time`'s document, under `time`.
fn comparison_json(
    memory: Option<&Judged>,
    counted: Option<&Gated>,
    timed: Option<&time::Report>,
) -> serde_json::Value {
    let mut doc = memory.map_or_else(
        || serde_json::json!({}),
        |j| render::json(&j.cmp, &j.attributed),
    );
    if let Some(g) = counted {
        g.add_to(&mut doc);
    }
    if let Some(t) = timed {
        doc["time"] = time::render::document(t);
    }
    doc
}
