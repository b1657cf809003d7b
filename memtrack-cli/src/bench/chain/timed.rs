//! Time along a chain. Wall-clock time is a comparison of two builds run in alternating order,
//! not a figure of one commit: so the chain keeps two builds at once, in two worktrees, each
//! with a target directory of its own (timing mode's two). BASE and HEAD are built first and
//! every benchmark they share is timed, as `--measure time --base` times them; then each
//! commit between is built in the worktree that does not hold the last measured commit, and
//! the benchmarks whose time regressed from BASE to HEAD are timed against that commit's
//! build, one step at a time (each commit built once; HEAD once more at the end).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use memtrack::analysis::Threshold;

use super::Commit;
use crate::bench::suite::{Repo, Worktree};
use crate::bench::time::{self, Built, Failure, Report, Side, TimeArgs, Timer};
use crate::error::Error;

/// `--measure time` along the chain: what each run is asked.
pub(crate) struct Timing {
    /// Cargo's arguments, then criterion's after `--`.
    pub cargo: Vec<OsString>,
    pub args: TimeArgs,
    /// Whether a time regression from BASE to HEAD makes the exit code 1 (`--gate time`).
    pub gate: bool,
}

/// The two worktrees, each with its target directory and the commit (by its index in the
/// chain) it holds built.
pub(super) struct Trees {
    trees: [Worktree; 2],
    targets: [PathBuf; 2],
    built: [Option<(usize, Built)>; 2],
}

impl Timing {
    /// Builds BASE and HEAD, each in a worktree of its own, and times every benchmark both
    /// hold, every run logged in `out`/time/runs.jsonl.
    ///
    /// # Errors
    /// A worktree cannot be made, an end's suite does not build or list its benchmarks, or
    /// the run log cannot be written.
    pub(super) fn ends(
        &self,
        repo: &Repo,
        target: &Path,
        out: &Path,
        chain: &[Commit],
        threshold: Threshold,
    ) -> Result<(Trees, Report), Error> {
        let n = chain.len();
        let targets = [
            target.join(crate::bench::TIME_BASE_TARGET),
            target.join(crate::bench::TIME_TARGET),
        ];
        let mut trees = Vec::with_capacity(2);
        for (i, dir) in [0, n - 1].into_iter().zip(&targets) {
            // Each worktree's record of itself in its own target directory.
            memtrack::artifact::create_dir_all(dir)?;
            trees.push(Worktree::add(repo, &chain[i].id, dir, "--chain")?);
        }
        let trees: [Worktree; 2] = trees.try_into().unwrap_or_else(|_| unreachable!());
        let mut trees = Trees {
            trees,
            targets,
            built: [None, None],
        };
        for (slot, i) in [(0, 0), (1, n - 1)] {
            self.build(&mut trees, slot, &chain[i], i)?;
        }
        let (base, head) = trees.pair(0, 1);
        let mut timer = Timer::start(&out.join("time"), &self.args, threshold)?;
        let mut failures = Vec::new();
        let rows = timer.compare((base, head), None, &mut failures);
        let report = timer.finish(chain[0].id.clone(), (base, head), None, (rows, failures))?;
        Ok((trees, report))
    }

    /// Builds commit `k` of the chain (unless a worktree holds it built) in the worktree that
    /// does not hold `last`, the last measured commit, and times `only` at `last` against it,
    /// the runs logged in `dir`/time/runs.jsonl.
    ///
    /// # Errors
    /// `k`'s suite does not build or list its benchmarks (the commit is not measured), or the
    /// run log cannot be written.
    pub(super) fn step(
        &self,
        trees: &mut Trees,
        (last, k): (usize, usize),
        chain: &[Commit],
        dir: &Path,
        (only, threshold): (&BTreeSet<String>, Threshold),
    ) -> Result<Report, Error> {
        let from = trees
            .slot_of(last)
            .expect("the last measured commit's build is kept");
        let to = 1 - from;
        if trees.slot_of(k) != Some(to) {
            self.build(trees, to, &chain[k], k)?;
        }
        let (base, head) = trees.pair(from, to);
        eprintln!(
            "memtrack: timing commit {} against {}",
            chain[k].short(),
            chain[last].short()
        );
        let mut timer = Timer::start(&dir.join("time"), &self.args, threshold)?;
        let mut failures = Vec::new();
        let rows = timer.compare((base, head), Some(only), &mut failures);
        timer.finish(
            chain[last].id.clone(),
            (base, head),
            Some(only),
            (rows, failures),
        )
    }

    /// Checks `commit` (index `k`) out in worktree `slot` and builds it there for timing.
    fn build(
        &self,
        trees: &mut Trees,
        slot: usize,
        commit: &Commit,
        k: usize,
    ) -> Result<(), Error> {
        trees.built[slot] = None;
        let tree = &trees.trees[slot];
        tree.checkout(&commit.id)?;
        let (cargo_args, filter) = time::split(&self.cargo);
        let mut failures: Vec<Failure> = Vec::new();
        let what = format!("commit {}, timing", commit.short());
        let built = time::prepare(
            &tree.dir,
            &trees.targets[slot],
            cargo_args,
            filter,
            Side::Head,
            &what,
            &mut failures,
        );
        // A build or listing that failed: the commit cannot be timed. Two executables holding
        // one id is the suite's own doing, and it is the same at every commit: also refused.
        if let Some(f) = failures.first() {
            return Err(Error::Command(format!("{what}: {}", f.error)));
        }
        trees.built[slot] = Some((k, built));
        Ok(())
    }
}

impl Trees {
    /// The worktree that holds commit `k` built.
    fn slot_of(&self, k: usize) -> Option<usize> {
        (0..2).find(|&s| self.built[s].as_ref().is_some_and(|b| b.0 == k))
    }

    /// The builds of two worktrees, both built.
    fn pair(&self, a: usize, b: usize) -> (&Built, &Built) {
        let get = |s: usize| &self.built[s].as_ref().expect("both sides are built").1;
        (get(a), get(b))
    }
}
