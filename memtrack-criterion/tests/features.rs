//! A suite's `default-features` on its memtrack-criterion line does what it does on a criterion
//! 0.8 line: criterion's default features (`rayon`, `plotters`, `cargo_bench_support`) on by
//! default, off with `default-features = false`; criterion 0.5 keeps its own. Read from cargo's resolve of a project with
//! that line (`cargo metadata`, offline, from the workspace's lock file).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Criterion's default features, 0.5's and 0.8's alike (`cargo info criterion@0.5`, `@0.8`).
const DEFAULTS: [&str; 3] = ["cargo_bench_support", "plotters", "rayon"];

/// Cargo's resolve (`cargo metadata`) of a project whose dev-dependency line is
/// `criterion = { package = "memtrack-criterion", path = …, OPTIONS }`.
fn metadata(options: &str) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let crate_dir = root.join("memtrack-criterion").canonicalize().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), "").unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        format!(
            "[package]\nname = \"suite\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [dev-dependencies]\ncriterion = {{ package = \"memtrack-criterion\", path = \
             {crate_dir:?}{options} }}\n\n[workspace]\n"
        ),
    )
    .unwrap();
    // The workspace's lock holds every package the project needs: no network.
    std::fs::copy(root.join("Cargo.lock"), dir.path().join("Cargo.lock")).unwrap();
    let out =
        memtrack_test_support::run_ok(Command::new(env!("CARGO")).current_dir(dir.path()).args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
        ]));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The features cargo turns on in criterion `version` ("0.5", "0.8") for a project with that
/// line (see [`metadata`]).
fn criterion_features(version: &str, options: &str) -> BTreeSet<String> {
    let meta = metadata(options);
    let id = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            p["name"] == "criterion"
                && p["version"]
                    .as_str()
                    .is_some_and(|v| v.starts_with(&format!("{version}.")))
        })
        .unwrap_or_else(|| panic!("{options}: no criterion {version} in the resolve"))["id"]
        .clone();
    let node = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .unwrap();
    node["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

fn set(features: &[&str]) -> BTreeSet<String> {
    features.iter().map(|f| f.to_string()).collect()
}

#[test]
fn criterion_0_8_defaults_follow_the_suites_line() {
    assert_eq!(criterion_features("0.8", ""), set(&DEFAULTS));
    assert_eq!(
        criterion_features(
            "0.8",
            ", default-features = false, features = [\"criterion-0_8\"]"
        ),
        set(&[])
    );
    assert_eq!(
        criterion_features(
            "0.8",
            ", default-features = false, features = [\"criterion-0_8\", \"html_reports\"]"
        ),
        set(&["html_reports"])
    );
}

#[test]
fn criterion_0_5_keeps_its_defaults() {
    // `default-features = false` leaves 0.8 out; 0.5's own defaults stay on.
    assert_eq!(
        criterion_features(
            "0.5",
            ", default-features = false, features = [\"criterion-0_5\"]"
        ),
        set(&DEFAULTS)
    );
}

/// A 0.8 suite's resolve holds no criterion 0.5: no feature on by default names it, so cargo
/// does not write it, nor its dependencies, into the suite's lock file.
#[test]
fn a_criterion_0_8_suite_resolves_no_criterion_0_5() {
    let meta = metadata("");
    let versions: Vec<&str> = (meta["packages"].as_array().unwrap().iter())
        .filter(|p| p["name"] == "criterion")
        .map(|p| p["version"].as_str().unwrap())
        .collect();
    assert!(
        versions.iter().all(|v| v.starts_with("0.8.")),
        "{versions:?}"
    );
}
