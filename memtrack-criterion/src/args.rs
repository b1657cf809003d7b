//! Criterion's command line, as memory mode reads it: the filter (`parse`, or `--exact`),
//! `--list`, `--test`, `--ignored` and `--bench` act as in criterion; its other options
//! (baselines, plots, timing settings, output formats) are accepted, with their values, and
//! have nothing to do here. Anything else is refused, as criterion refuses it.

// Compiled for its unit tests in timing mode, where nothing else uses it.
#![cfg_attr(not(memtrack_measured), allow(dead_code))]

/// What a benchmark binary was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Record each benchmark (`cargo bench` passes `--bench`).
    Record,
    /// Print each benchmark's id (`--list`).
    List,
    /// Run each benchmark once, recording nothing: `--test`, or no `--bench` (as criterion:
    /// `cargo test --benches` runs bench binaries without it).
    Test,
}

/// The arguments memory mode acts on.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Args {
    /// Criterion's FILTER: a regex an id must match, or with `exact` the whole id.
    pub(crate) filter: Option<String>,
    pub(crate) exact: bool,
    /// `--ignored`: criterion runs no benchmark then.
    pub(crate) ignored: bool,
    list: bool,
    test: bool,
    bench: bool,
    /// `-h`/`--help`.
    pub(crate) help: bool,
}

/// Criterion's options that take no value, libtest's that criterion accepts among them.
const FLAGS: &[&str] = &[
    "-v",
    "--verbose",
    "--quiet",
    "-n",
    "--noplot",
    "--discard-baseline",
    "--list",
    "--ignored",
    "--exact",
    "--quick",
    "--test",
    "--bench",
    "--nocapture",
    "--show-output",
    "--include-ignored",
    "-V",
    "--version",
    "-h",
    "--help",
];

/// Criterion's options that take a value.
const VALUED: &[&str] = &[
    "-c",
    "--color",
    "--colour",
    "-s",
    "--save-baseline",
    "-b",
    "--baseline",
    "--baseline-lenient",
    "--format",
    "--profile-time",
    "--load-baseline",
    "--sample-size",
    "--warm-up-time",
    "--measurement-time",
    "--nresamples",
    "--noise-threshold",
    "--confidence-level",
    "--significance-level",
    "--plotting-backend",
    "--output-format",
];

/// The help memory mode prints for `--help`.
pub(crate) const HELP: &str = "\
memtrack-criterion memory mode: records each benchmark's allocations into an artifact
usage: BENCH [FILTER] [--exact] [--list] [--test] [--ignored] (criterion's other options are ignored)
environment: MEMTRACK_WARMUP (default 2), MEMTRACK_ITERATIONS (default 10), MEMTRACK_DIR, MEMTRACK_BACKEND,
MEMTRACK_BENCHMARKS (the ids to run, one per line)";

impl Args {
    /// Parses the arguments after the program's name.
    ///
    /// # Errors
    /// A one-line message for an option criterion does not have, a missing value, or a second
    /// filter.
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut out = Args::default();
        let mut args = args.into_iter();
        let mut options_done = false;
        while let Some(arg) = args.next() {
            if options_done || !arg.starts_with('-') || arg == "-" {
                if let Some(first) = &out.filter {
                    return Err(format!(
                        "memtrack: a second filter `{arg}` (the first is `{first}`): give one"
                    ));
                }
                out.filter = Some(arg);
                continue;
            }
            if arg == "--" {
                options_done = true;
                continue;
            }
            let (name, attached) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                // `-calways`, as clap reads a short option with its value attached.
                // By characters: `-é` is a dash and two bytes.
                _ if !arg.starts_with("--") && arg.chars().count() > 2 => {
                    let at = arg.char_indices().nth(2).map_or(arg.len(), |(i, _)| i);
                    (arg[..at].to_string(), Some(arg[at..].to_string()))
                }
                _ => (arg.clone(), None),
            };
            if VALUED.contains(&name.as_str()) {
                if attached.is_none() && args.next().is_none() {
                    return Err(format!("memtrack: option `{name}` needs a value"));
                }
                continue;
            }
            if !FLAGS.contains(&name.as_str()) || attached.is_some() {
                return Err(format!(
                    "memtrack: unknown option `{arg}` (memory mode takes criterion's options)"
                ));
            }
            match name.as_str() {
                "--exact" => out.exact = true,
                "--ignored" => out.ignored = true,
                "--list" => out.list = true,
                "--test" => out.test = true,
                "--bench" => out.bench = true,
                "-h" | "--help" => out.help = true,
                _ => {}
            }
        }
        Ok(out)
    }

    /// What to do: list, test (`--test`, or no `--bench`), or record.
    pub(crate) fn mode(&self) -> Mode {
        if self.list {
            Mode::List
        } else if self.test || !self.bench {
            Mode::Test
        } else {
            Mode::Record
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        Args::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn cargo_bench_records_and_cargo_test_tests() {
        assert_eq!(parse(&["--bench"]).unwrap().mode(), Mode::Record);
        assert_eq!(parse(&[]).unwrap().mode(), Mode::Test);
        assert_eq!(parse(&["--bench", "--test"]).unwrap().mode(), Mode::Test);
        assert_eq!(parse(&["--list", "--bench"]).unwrap().mode(), Mode::List);
    }

    #[test]
    fn criterions_options_are_skipped_with_their_values() {
        let a = parse(&[
            "parse",
            "--save-baseline",
            "main",
            "--noplot",
            "-c",
            "never",
            "--sample-size=20",
            "-bbase",
            "--bench",
        ])
        .unwrap();
        assert_eq!(a.filter.as_deref(), Some("parse"));
        assert_eq!(a.mode(), Mode::Record);
        let a = parse(&["--exact", "parse/json/1024", "--bench"]).unwrap();
        assert!(a.exact);
        assert_eq!(a.filter.as_deref(), Some("parse/json/1024"));
        assert_eq!(
            parse(&["--", "--odd"]).unwrap().filter.as_deref(),
            Some("--odd")
        );
    }

    #[test]
    fn what_criterion_refuses_is_refused() {
        assert_eq!(
            parse(&["--frobnicate"]).unwrap_err(),
            "memtrack: unknown option `--frobnicate` (memory mode takes criterion's options)"
        );
        assert_eq!(
            parse(&["--baseline"]).unwrap_err(),
            "memtrack: option `--baseline` needs a value"
        );
        assert!(
            parse(&["a", "b"])
                .unwrap_err()
                .contains("second filter `b`")
        );
        assert!(parse(&["--bench=yes"]).is_err());
        // Options of characters beyond ASCII are read by characters, not bytes.
        assert_eq!(
            parse(&["-é"]).unwrap_err(),
            "memtrack: unknown option `-é` (memory mode takes criterion's options)"
        );
        assert_eq!(
            parse(&["-éx"]).unwrap_err(),
            "memtrack: unknown option `-éx` (memory mode takes criterion's options)"
        );
        assert!(parse(&["--é"]).is_err());
    }
}
