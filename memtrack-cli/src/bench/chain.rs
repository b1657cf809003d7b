//! `memtrack bench --chain BASE..HEAD`: which commit of a range made each regressed benchmark
//! change. The whole suite runs at BASE and at HEAD and is compared as `--base` compares; then
//! the regressed benchmarks alone (`MEMTRACK_BENCHMARKS`) run at every commit between, on
//! HEAD's first-parent line, in one worktree and one target directory (`--base`'s), so that
//! each commit rebuilds only what it changed. Each step, a change between two consecutive
//! measured commits, is named by its commit, with the call sites behind each growth.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::render::{Align, Cell, Column, Table, md_escape};
use memtrack::{analysis::Metric, analysis::Row, analysis::Threshold, analysis::Verdict, human};

use super::suite::{Repo, Suite, Worktree};
use crate::compare::{self, Attributed, Format, Judged, render};
use crate::error::Error;

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

/// What became of one commit of the chain.
enum Outcome {
    /// Measured: its artifacts' directory.
    Measured(PathBuf),
    /// Its suite did not build or run (a broken commit of the range): why.
    Failed(String),
    /// Not run: nothing regressed, so the commits between were not needed.
    Skipped,
}

/// A change of the followed benchmarks between two consecutive measured commits.
struct Step {
    /// Indices into the chain: the measured commit before, and the one that changed.
    from: usize,
    to: usize,
    /// The two compared with a threshold of 0, so that every growth gets its call sites.
    judged: Judged,
}

/// Runs the chain; see the module docs. Exit 1 when a benchmark regressed from BASE to HEAD.
pub(crate) fn run(
    repo: &Repo,
    target: &Path,
    out: &Path,
    suite: Suite,
    spec: &str,
    threshold: Threshold,
    format: Format,
) -> Result<ExitCode, Error> {
    let chain = commits(repo, spec)?;
    let n = chain.len();
    let tree = Worktree::add(repo, &chain[0].id, target, "--chain")?;
    // The target directory of `--base`'s builds, in the same worktree: one set of builds.
    let suite = Suite {
        target: target.join("memtrack-bench-base"),
        ..suite
    };
    let dirs: Vec<PathBuf> = chain
        .iter()
        .enumerate()
        .map(|(i, c)| out.join(format!("{i:02}-{}", c.short())))
        .collect();
    // One build-id store for the whole chain, and no directory of an earlier range left.
    super::clear(out)?;
    clear_old_commits(out, &dirs)?;
    eprintln!(
        "memtrack: --chain {spec}: {n} commits; the whole suite at {} and {} first",
        chain[0].short(),
        chain[n - 1].short()
    );
    for i in [0, n - 1] {
        measure(&tree, &suite, &chain[i], &dirs[i])?;
    }
    let ends = compare::load_pair(&dirs[0], &dirs[n - 1])?;
    compare::nothing_in_common(&ends, &dirs[0], &dirs[n - 1])?;
    super::mixed(&ends.base, &ends.head)?;
    let overall = compare::judge(&ends, &Metric::ALL, threshold)?;
    let regressed: BTreeSet<String> = overall
        .cmp
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regressed)
        .map(|r| r.benchmark.clone())
        .collect();
    let mut outcomes: Vec<Outcome> = (0..n).map(|_| Outcome::Skipped).collect();
    outcomes[0] = Outcome::Measured(dirs[0].clone());
    outcomes[n - 1] = Outcome::Measured(dirs[n - 1].clone());
    if !regressed.is_empty() {
        let only = Suite {
            only: Some(regressed.iter().cloned().collect()),
            ..suite
        };
        between(&tree, &only, &chain, &dirs, &mut outcomes);
    }
    drop(tree);
    let steps = if regressed.is_empty() {
        Vec::new()
    } else {
        follow(&outcomes, &regressed)?
    };
    let report = Report {
        spec,
        regressed: &regressed,
        chain: &chain,
        outcomes: &outcomes,
        overall: &overall,
        steps: &steps,
    };
    crate::out(&report.render(format))?;
    super::summary(&report.markdown());
    Ok(overall.exit_code())
}

/// Measures the commits between the ends (the suite limited to the regressed benchmarks); a
/// commit whose suite does not build or run is noted and passed over.
fn between(
    tree: &Worktree,
    only: &Suite,
    chain: &[Commit],
    dirs: &[PathBuf],
    outcomes: &mut [Outcome],
) {
    let n = chain.len();
    if n <= 2 {
        return;
    }
    let count = only.only.as_ref().map_or(0, Vec::len) as u64;
    eprintln!(
        "memtrack: following {} along the {} commits between",
        human::plural(count, "regressed benchmark", "regressed benchmarks"),
        n - 2
    );
    for i in 1..n - 1 {
        outcomes[i] = match measure(tree, only, &chain[i], &dirs[i]) {
            Ok(()) => Outcome::Measured(dirs[i].clone()),
            Err(e) => {
                eprintln!(
                    "memtrack: warning: commit {} not measured: {}; its change counts with the \
                     next measured commit's",
                    chain[i].short(),
                    human::terminal(&e.to_string())
                );
                Outcome::Failed(e.to_string())
            }
        };
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
        let _ = std::fs::remove_dir(&path);
    }
    Ok(())
}

/// Checks `commit` out, clears `dir` and runs the suite there into it: an error when it
/// recorded nothing (the benchmarks followed are gone at that commit, or its suite records
/// elsewhere).
fn measure(tree: &Worktree, suite: &Suite, commit: &Commit, dir: &Path) -> Result<(), Error> {
    tree.checkout(&commit.id)?;
    super::clear(dir)?;
    suite.run(&tree.dir, dir, &format!("commit {}", commit.short()))?;
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
    Ok(())
}

/// The steps of the regressed benchmarks between consecutive measured commits.
fn follow(outcomes: &[Outcome], regressed: &BTreeSet<String>) -> Result<Vec<Step>, Error> {
    let measured: Vec<(usize, &PathBuf)> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Outcome::Measured(d) => Some((i, d)),
            _ => None,
        })
        .collect();
    let mut steps = Vec::new();
    for pair in measured.windows(2) {
        let ((from, a), (to, b)) = (pair[0], pair[1]);
        let mut loaded = compare::load_pair(a, b)?;
        loaded.retain(regressed);
        let zero = Threshold::from_ppm(0);
        let judged = compare::judge(&loaded, &Metric::ALL, zero)?;
        let changed = judged
            .cmp
            .rows
            .iter()
            .any(|r| r.verdict != Verdict::Unchanged)
            || !judged.cmp.added.is_empty()
            || !judged.cmp.removed.is_empty();
        if changed {
            steps.push(Step { from, to, judged });
        }
    }
    Ok(steps)
}

/// What the chain found, to render.
struct Report<'a> {
    spec: &'a str,
    /// The benchmarks that regressed from BASE to HEAD, by name.
    regressed: &'a BTreeSet<String>,
    chain: &'a [Commit],
    outcomes: &'a [Outcome],
    overall: &'a Judged,
    steps: &'a [Step],
}

/// The rows of a step that changed.
fn changed(step: &Step) -> impl Iterator<Item = &Row> {
    step.judged
        .cmp
        .rows
        .iter()
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
        step.judged.attributed.iter().filter(|a| {
            self.overall.cmp.rows.iter().any(|r| {
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
    /// before and after (per iteration when compared so) and the commit's subject.
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
        }
        t
    }

    fn table(&self) -> String {
        let mut out = format!("memtrack: --chain {}: {}\n", self.spec, self.headline());
        // The sites are the steps': each commit's own.
        out.push_str(&render::table(&self.overall.cmp, &[]));
        if self.steps.is_empty() {
            return out;
        }
        out.push_str("\nsteps along the chain (oldest first)\n");
        out.push_str(&memtrack::render::text(&self.steps_table()));
        for step in self.steps {
            self.presence_lines(step, &mut out);
            for a in self.sites(step) {
                out.push_str(&format!("\nat {}: ", self.chain[step.to].short()));
                out.push_str(&render::attribution_table(a));
            }
        }
        self.failures(&mut out);
        out
    }

    /// A benchmark that appears or disappears in a step, one line each.
    fn presence_lines(&self, step: &Step, out: &mut String) {
        let at = self.chain[step.to].short();
        for b in &step.judged.cmp.added {
            out.push_str(&format!("{}: first measured at {at}\n", b.name));
        }
        for b in &step.judged.cmp.removed {
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
        out.push_str(&render::markdown(&self.overall.cmp, &[]));
        if self.steps.is_empty() {
            return out;
        }
        out.push_str("#### Steps along the chain (oldest first)\n\n");
        out.push_str(&memtrack::render::markdown(&self.steps_table()));
        out.push('\n');
        for step in self.steps {
            let mut lines = String::new();
            self.presence_lines(step, &mut lines);
            for l in lines.lines() {
                out.push_str(&format!("- {}\n", md_escape(l)));
            }
            for a in self.sites(step) {
                out.push_str(&format!("At `{}`:\n\n", self.chain[step.to].short()));
                out.push_str(&render::attribution_markdown(a));
            }
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
                    "comparison": render::json(&s.judged.cmp, &s.judged.attributed),
                })
            })
            .collect();
        serde_json::json!({
            "range": self.spec,
            "regressed": self.regressed,
            "commits": commits,
            "comparison": render::json(&self.overall.cmp, &self.overall.attributed),
            "steps": steps,
        })
    }
}
