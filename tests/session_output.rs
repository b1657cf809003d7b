//! A session's artifact goes through the same safe output as the CLI: a symbolic
//! link planted at the old temporary name `<name>.memtrack.partial` changes nothing, the
//! temporary file has a random name beside the artifact and holds complete frames while the
//! session runs, and another user's link at the artifact's name is refused at `start`.
//!
//! `harness = false`, tests run one after another on the main thread: sessions are
//! process-global. They use the allocator recorder (no privileges needed); planting a link owned
//! by another user needs CAP_CHOWN, and without it that test is reported as ignored.

use std::fs;
use std::path::Path;

use memtrack::{BackendChoice, Error, SessionBuilder, artifact::OutputError, artifact::Reader};
use memtrack_test_support::{Cap, Need};

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

fn builder(name: &str, dir: &Path) -> SessionBuilder {
    SessionBuilder::new(name)
        .backend(BackendChoice::Alloc)
        .output_dir(dir)
        .quiet(true)
}

fn sessions_write_through_a_random_temporary_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let victim = d.join("victim");
    fs::write(&victim, "precious").unwrap();
    let old_partial = d.join("bench.memtrack.partial");
    std::os::unix::fs::symlink(&victim, &old_partial).unwrap();

    let session = builder("bench", d).start().unwrap();
    let partial = session
        .partial_path()
        .expect("a temporary file")
        .to_path_buf();
    let name = partial.file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        partial.parent() == Some(d)
            && name.starts_with("bench.memtrack.")
            && name.ends_with(".partial")
            && partial != old_partial,
        "{}",
        partial.display()
    );
    assert!(fs::symlink_metadata(&partial).unwrap().is_file());
    // While the session runs the temporary file is a readable (recovered) artifact.
    let header = Reader::open(&partial).expect("the partial file reads");
    assert_eq!(header.metadata().name.as_deref(), Some("bench"));
    std::hint::black_box(vec![0u8; 4096]);
    let report = session.finish().unwrap();

    let path = report.path.clone().expect("written to a file");
    assert_eq!(path, d.join("bench.memtrack"));
    assert!(fs::symlink_metadata(&path).unwrap().is_file());
    assert!(!partial.exists(), "the temporary file was renamed");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(
        fs::symlink_metadata(&old_partial)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let r = Reader::open(&path).unwrap();
    assert_eq!(
        r.completeness(),
        &memtrack::artifact::Completeness::Complete
    );
}

/// `Report::sites` reads the session's artifact: the allocator recorder captures a call stack
/// for every allocation, so no allocation is in the no-stack site and the sites' numbers add
/// up to the session's totals; an in-memory session has no artifact and no sites.
fn report_sites_are_read_from_the_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let session = builder("sites", dir.path()).start().unwrap();
    let kept: Vec<Vec<u8>> = (0..10)
        .map(|i| std::hint::black_box(vec![i as u8; 100]))
        .filter(|v| v[0] % 3 == 0)
        .collect();
    let report = session.finish().unwrap();
    drop(kept);
    let sites = report.sites().expect("a file").expect("read");
    assert!(sites.has_stacks());
    assert!(sites.no_stack().is_none(), "an allocation without a stack");
    let t = &report.totals();
    assert!(t.allocations >= 10, "{}", t.allocations);
    let sum = |f: fn(&memtrack::analysis::Site) -> u64| sites.sites.iter().map(f).sum::<u64>();
    assert_eq!(
        (sum(|s| s.blocks), sum(|s| s.bytes)),
        (t.allocations, t.bytes_allocated)
    );
    assert_eq!(
        (sum(|s| s.blocks_at_end), sum(|s| s.bytes_at_end)),
        (t.live_blocks_at_end, t.live_bytes_at_end)
    );
    assert_eq!(sum(|s| s.bytes_at_peak), t.peak_live_bytes);
    let memory = builder("sites-in-memory", dir.path())
        .in_memory(true)
        .start()
        .unwrap()
        .finish()
        .unwrap();
    assert!(memory.sites().is_none());
}

fn another_users_link_at_the_artifact_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let victim = d.join("victim");
    fs::write(&victim, "precious").unwrap();
    let planted = d.join("other.memtrack");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let e = builder("other", d).start().err().expect("refused");
    assert!(
        matches!(
            e,
            Error::Output(OutputError::UntrustedSymlink { owner: 65534, .. })
        ),
        "{e}"
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    // The refused session left nothing behind and the next one may start.
    let names: Vec<_> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "only the victim and the link: {names:?}");
    builder("after", d).start().unwrap().finish().unwrap();
}

/// The names of the `*.memtrack` files in `d`, sorted, each with the name its artifact holds.
fn artifacts(d: &Path) -> Vec<(String, Option<String>)> {
    let mut v: Vec<(String, Option<String>)> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "memtrack"))
        .map(|p| {
            let name = Reader::open(&p).unwrap().metadata().name.clone();
            (p.file_name().unwrap().to_string_lossy().into_owned(), name)
        })
        .collect();
    v.sort();
    v
}

/// Ids that used to give one file name (`a/b`, `a b`, `a_b`) give three; with `replace(false)`
/// (what `MEMTRACK_NO_REPLACE`, set by `memtrack bench`, makes the default) a session whose
/// file is taken fails at start, naming the benchmark the file holds, and one whose file was
/// taken while it ran fails at finish, the file left as it was.
fn a_session_that_may_not_replace_refuses_a_taken_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for name in ["a/b", "a b", "a_b"] {
        builder(name, d)
            .replace(false)
            .start()
            .unwrap()
            .finish()
            .unwrap();
    }
    let held = |f: &str, n: &str| (f.to_string(), Some(n.to_string()));
    assert_eq!(
        artifacts(d),
        [
            held("a%20b.memtrack", "a b"),
            held("a%2Fb.memtrack", "a/b"),
            held("a_b.memtrack", "a_b"),
        ]
    );
    let e = builder("a_b", d)
        .replace(false)
        .start()
        .err()
        .expect("refused");
    assert_eq!(
        e.to_string(),
        format!(
            "{} already holds benchmark \"a_b\" of this run, and session \"a_b\" would replace \
             it: give the two distinct names (two bench targets or packages with one benchmark \
             id?)",
            d.join("a_b.memtrack").display()
        )
    );
    // Taken while the session runs: its finish fails and the file stays.
    let session = builder("late", d).replace(false).start().unwrap();
    fs::write(d.join("late.memtrack"), "first").unwrap();
    match session.finish() {
        Err(Error::ArtifactTaken { path, holder, name }) => {
            assert_eq!(
                (path, holder, name.as_str()),
                (d.join("late.memtrack"), None, "late")
            );
        }
        other => panic!("{:?}", other.map(|r| r.path)),
    }
    assert_eq!(
        fs::read_to_string(d.join("late.memtrack")).unwrap(),
        "first"
    );
    // By default a session replaces its own earlier artifact, as before.
    builder("a_b", d).start().unwrap().finish().unwrap();
}

fn main() {
    use memtrack_test_support::{requires, test};
    memtrack_test_support::run_sequential(vec![
        test(
            "sessions_write_through_a_random_temporary_name",
            sessions_write_through_a_random_temporary_name,
        ),
        test(
            "a_session_that_may_not_replace_refuses_a_taken_file",
            a_session_that_may_not_replace_refuses_a_taken_file,
        ),
        test(
            "report_sites_are_read_from_the_artifact",
            report_sites_are_read_from_the_artifact,
        ),
        requires(
            "another_users_link_at_the_artifact_is_refused_at_start",
            &[Need::Caps(&[Cap::Chown])],
            another_users_link_at_the_artifact_is_refused_at_start,
        ),
    ]);
}
