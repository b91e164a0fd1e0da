//! The Prometheus alert rules shipped in deploy/prometheus: promtool finds
//! them well formed, their unit tests pass (each alert fires when it should
//! and stays silent while a model operation runs), and every baton metric
//! they name is one the server exposes.
//!
//! promtool comes with Debian's `prometheus` package, which
//! scripts/setup-packages.sh installs; without it these tests fail.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rules_dir() -> PathBuf {
    workspace().join("deploy/prometheus")
}

/// Runs `promtool args...` in deploy/prometheus and fails the test, with
/// everything promtool printed, unless it succeeds.
fn promtool(args: &[&str]) {
    let output = match Command::new("promtool").args(args).current_dir(rules_dir()).output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not installed: run scripts/setup-packages.sh (it installs Debian's prometheus package, which provides promtool)"
        ),
        Err(e) => panic!("running promtool: {e}"),
    };
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_rules_are_well_formed() {
    promtool(&["check", "rules", "baton-alerts.yml"]);
}

#[test]
fn the_rules_pass_their_unit_tests() {
    promtool(&["test", "rules", "baton-alerts.test.yml"]);
}

/// Every `baton_...` word in `text`, once each.
fn metric_names(text: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names: Vec<String> = text
        .split(|c: char| !word(c))
        .filter(|w| w.starts_with("baton_") && w.len() > "baton_".len())
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The text of every source file of the server, where it writes metrics.
fn server_sources() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut text = String::new();
    let mut pending = vec![dir];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                text += &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
    }
    text
}

#[test]
fn the_rules_name_only_metrics_the_server_exposes() {
    let path = rules_dir().join("baton-alerts.yml");
    let rules = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let used = metric_names(&rules);
    assert!(used.iter().any(|n| n == "baton_ready"), "no metric names found in the rules: {used:?}");
    let exposed = metric_names(&server_sources());
    // A histogram is written under its base name; its series add a suffix.
    let is_exposed = |name: &str| {
        let base = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        exposed.iter().any(|e| e == name || e == base)
    };
    let missing: Vec<&String> = used.iter().filter(|n| !is_exposed(n)).collect();
    assert!(missing.is_empty(), "the alert rules use metrics the server does not expose: {missing:?}");
}
