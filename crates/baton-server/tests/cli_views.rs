//! The `baton` commands that report, against a running server: `status`
//! shows each version's role (serving, kept, a rollout's candidate and
//! twin), kind of update, memory and worker, the decision in force and
//! until when, and takes a model and `--json`; `load`, `rollback` and
//! `unpin` print what serves afterwards and the decision they recorded;
//! `load` with nothing new says so instead of reloading; `list`, `unload`
//! and `retire` do what the API does.

mod common;

use std::process::{Command, Output};

use baton_testkit::server::Server;
use common::{bin, mlp, repo_with, start, text};
use serde_json::Value;

/// Windows that outlast the test: a rollout started here stays at its first step.
const SLOW: &str = "[policy]\nkeep_previous = 1\n[rollout]\ninterval_ms = 600000\nsteps = [10, 50, 100]";

/// Runs `baton args... --url <server>` to completion.
fn baton(server: &Server, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .args(["--url", server.base()])
        .env_remove("BATON_URL")
        .env_remove("BATON_LOG")
        .output()
        .expect("running baton")
}

/// Runs a command that must succeed; returns its stdout.
fn ok(server: &Server, args: &[&str]) -> String {
    let out = baton(server, args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "baton {args:?} failed: {}\n{stdout}", text(&out.stderr));
    stdout
}

/// The row of the VERSIONS table for `model` `version` whose role starts
/// with `role`.
fn version_row<'a>(stdout: &'a str, model: &str, version: u64, role: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| {
            let mut cells = l.split_whitespace();
            cells.next() == Some(model)
                && cells.next() == Some(&version.to_string())
                && l.split_once(&format!(" {version} ")).is_some_and(|(_, rest)| rest.trim_start().starts_with(role))
        })
        .unwrap_or_else(|| panic!("no row for {model} {version} as {role}:\n{stdout}"))
}

#[test]
fn status_shows_each_version_the_decision_in_force_and_a_rollouts_twin() {
    let repo = repo_with("m", &[1, 2], SLOW);
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 2);

    // A load of an older version prints the hold it records.
    let stdout = ok(&server, &["load", "m", "--version", "1"]);
    assert!(stdout.contains("load m: version 1 serving (was 2)"), "{stdout}");
    assert!(
        stdout.contains(
            "m: version 1 serves; held at version 1 (recorded by the load) until a version newer than 2 is published."
        ),
        "{stdout}"
    );
    server.wait_settled("m", 1);

    let stdout = ok(&server, &["status", "m"]);
    assert!(stdout.starts_with(&format!("server: ready, pid {}", server.pid())), "{stdout}");
    let model = stdout.lines().find(|l| l.starts_with("m ")).unwrap_or_else(|| panic!("{stdout}"));
    let cells: Vec<&str> = model.split_whitespace().collect();
    assert_eq!(&cells[..3], ["m", "READY", "1"], "{model}");
    assert!(model.contains("held at 1 (load)") && model.contains("load 1 in"), "{model}");
    let serving = version_row(&stdout, "m", 1, "serving");
    assert!(serving.contains(" MiB") && serving.contains("in the server"), "{serving}");
    let status = server.status("m");
    let update = status["live"][0]["update"].as_str().expect("an update kind");
    assert!(serving.contains(update), "{serving}");
    version_row(&stdout, "m", 2, "previous (for rollback)");
    // One model's view says what each stage of its last load took.
    let stages = stdout.lines().find(|l| l.starts_with("m: last load 1 in ")).unwrap_or_else(|| panic!("{stdout}"));
    for stage in ["fetch", "verify", "load", "validate", "warmup", "commit", "drain"] {
        assert!(stages.contains(&format!("{stage} ")), "{stages}");
    }
    assert!(
        stdout.lines().any(|l| l.starts_with("m: held at version 1 by a load since ")
            && l.ends_with(", until a version newer than 2 is published.")),
        "{stdout}"
    );

    // --json prints the server's document, with RFC 3339 beside epoch seconds.
    let json: Value = serde_json::from_str(&ok(&server, &["status", "m", "--json"])).expect("JSON");
    assert_eq!(json["name"], "m");
    assert_eq!(json["decision"]["kind"], "load");
    let at = json["decision"]["at_rfc3339"].as_str().expect("the decision's time in RFC 3339");
    assert!(at.ends_with('Z') && at.contains('T'), "{at}");
    assert!(json["last"]["finished_at_rfc3339"].is_string(), "{json}");
    assert!(json["rollout"].is_null() && json["last_error"].is_null(), "no rollout, no error, stay null: {json}");
    let all: Value = serde_json::from_str(&ok(&server, &["status", "--json"])).expect("JSON");
    assert_eq!(all["pid"], server.pid());

    // An unknown model is refused with the models there are.
    let out = baton(&server, &["status", "nope"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no model 'nope'; it has: m"), "{}", text(&out.stderr));

    // Back to the newest, which clears the hold.
    let stdout = ok(&server, &["load", "m"]);
    assert!(stdout.contains("load m: version 2 serving (was 1)"), "{stdout}");
    assert!(stdout.contains("m: version 2 serves; it follows the repository's newest version."), "{stdout}");
    server.wait_settled("m", 2);
    // Nothing new: nothing loads, and it says so.
    let before = server.status("m")["last"].clone();
    let stdout = ok(&server, &["load", "m"]);
    assert!(stdout.contains("model 'm' already serves version 2, the repository's newest"), "{stdout}");
    assert_eq!(server.status("m")["last"], before, "nothing was loaded");
    // Unless forced.
    let stdout = ok(&server, &["load", "m", "--force"]);
    assert!(stdout.contains("load m: version 2 serving (was 2)"), "{stdout}");
    assert_ne!(server.status("m")["last"], before);
    server.wait_settled("m", 2);
    // The API's load with no version still loads, as it always has: only
    // a client that asks (`if_new`, as the CLI does) is told it serves.
    let before = server.status("m")["last"].clone();
    let answer = server.post_raw("/baton/v1/models/m/load", b"{}", &[("content-type", "application/json")]);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert!(answer.json()["already_serving"].is_null(), "{}", answer.json());
    assert_ne!(server.status("m")["last"], before, "the API's load loaded");
    server.wait_settled("m", 2);

    // A rollout: its candidate and the stable version's twin are named.
    repo.publish_mlp("m", 3, &mlp(3));
    ok(&server, &["rollout", "start", "m", "--version", "3"]);
    let stdout = ok(&server, &["status"]);
    let model = stdout.lines().find(|l| l.starts_with("m ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(model.contains("canary of 3 running, 10% (step 1/3)"), "{model}");
    version_row(&stdout, "m", 2, "serving");
    version_row(&stdout, "m", 3, "rollout candidate, 10% of requests");
    let twin = version_row(&stdout, "m", 2, "twin of the stable version");
    assert!(twin.contains(" MiB"), "{twin}");
    let json: Value = serde_json::from_str(&ok(&server, &["rollout", "abort", "m", "--json"])).expect("JSON");
    let decisions = json["rollout"]["decisions"].as_array().expect("the rollout's decisions");
    assert!(decisions.iter().all(|d| d["at_rfc3339"].as_str().is_some_and(|t| t.ends_with('Z'))), "{json}");
    common::assert_no_panic(&server);
}

#[test]
fn rollback_pin_and_unpin_say_what_serves_and_unpin_warns_of_the_return_to_the_newest() {
    let repo = repo_with("m", &[1], SLOW);
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    ok(&server, &["load", "m"]);
    server.wait_settled("m", 2);

    let stdout = ok(&server, &["rollback", "m"]);
    assert!(stdout.contains("rollback m: version 1 serving (was 2)"), "{stdout}");
    assert!(
        stdout.contains(
            "m: version 1 serves; held at version 1 (recorded by the rollback) until a version newer than 2 is published."
        ),
        "{stdout}"
    );
    server.wait_settled("m", 1);
    let stdout = ok(&server, &["pin", "m", "1"]);
    assert!(stdout.contains("m: version 1 serving; pin of version 1 until unpinned"), "{stdout}");
    let stdout = ok(&server, &["unpin", "m"]);
    assert!(stdout.contains("m: version 2 serving"), "{stdout}");
    assert!(stdout.contains("WARNING: m went back to its newest version, 2, in place of 1"), "{stdout}");
    assert!(stdout.contains("To keep 1: baton pin m 1."), "{stdout}");
    server.wait_settled("m", 2);
    // Unpinning again changes nothing, and warns of nothing.
    let stdout = ok(&server, &["unpin", "m"]);
    assert!(!stdout.contains("WARNING"), "{stdout}");
    let json: Value = serde_json::from_str(&ok(&server, &["unpin", "m", "--json"])).expect("JSON");
    assert_eq!(json["serving"], 2);
}

#[test]
fn list_retire_and_unload() {
    let repo = repo_with("m", &[1, 2], "[policy]\nkeep_previous = 1");
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 2);
    ok(&server, &["load", "m", "--version", "1"]);
    server.wait_settled("m", 1);
    ok(&server, &["load", "m"]);
    server.wait_settled("m", 2);

    let stdout = ok(&server, &["list"]);
    assert!(stdout.starts_with("MODEL"), "{stdout}");
    let rows: Vec<Vec<&str>> = stdout.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert!(rows.iter().any(|r| r[..3] == ["m", "2", "READY"]), "{stdout}");
    assert!(rows.iter().any(|r| r[..2] == ["m", "1"]), "{stdout}");
    let json: Value = serde_json::from_str(&ok(&server, &["list", "--json"])).expect("JSON");
    assert!(json.as_array().is_some_and(|rows| rows.iter().any(|r| r["name"] == "m" && r["version"] == "2")));

    assert_eq!(server.status("m")["previous"], serde_json::json!([1]));
    let stdout = ok(&server, &["retire", "m", "1"]);
    assert!(stdout.contains("retire m: version 1 freed"), "{stdout}");
    assert_eq!(server.status("m")["previous"], serde_json::json!([]));
    let out = baton(&server, &["retire", "m", "1"]);
    assert!(!out.status.success(), "retiring a version not kept must fail");

    let stdout = ok(&server, &["unload", "m"]);
    assert!(stdout.contains("unload m: version 2 left service"), "{stdout}");
    assert!(
        stdout.contains("m: no version serves; kept unloaded until a version newer than 2 is published."),
        "{stdout}"
    );
    assert!(server.status("m")["serving"].is_null());
    let stdout = ok(&server, &["unload", "m"]);
    assert!(stdout.contains("m was not loaded: nothing to unload."), "{stdout}");
    common::assert_no_panic(&server);
}

#[test]
fn durations_are_spelled_with_units_and_the_old_flags_still_work() {
    let repo = repo_with("m", &[1], "");
    // The older spellings: the poll in milliseconds, bare seconds.
    let old = start(&repo, &["--poll-ms", "20", "--shutdown-delay", "0", "--shutdown-timeout", "5"]);
    old.wait_settled("m", 1);
    drop(old);
    let server =
        start(&repo, &["--poll", "20ms", "--shutdown-delay", "0s", "--shutdown-timeout", "5s", "--idle-timeout", "2m"]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_settled("m", 2);

    let (status, stderr) = common::refused_start(&repo, &["--poll", "soon"]);
    assert!(!status.success());
    assert!(stderr.contains("'soon' is not a duration (e.g. 250ms, 2s, 1m)"), "{stderr}");
    // --poll replaces a flag in milliseconds: a bare number is refused.
    let (_, stderr) = common::refused_start(&repo, &["--poll", "500"]);
    assert!(stderr.contains("'500' needs a unit, e.g. 500ms or 2s"), "{stderr}");
    // The timeouts that never took a bare number still refuse one.
    let (_, stderr) = common::refused_start(&repo, &["--request-timeout", "30"]);
    assert!(stderr.contains("'30' needs a unit, ms, s or m"), "{stderr}");
    let out = baton(&server, &["upgrade", "--timeout", "500ms"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--timeout is whole seconds from 1s to 24h"), "{}", text(&out.stderr));
    let out = baton(&server, &["upgrade", "--timeout", "2d"]);
    assert!(!out.status.success() && text(&out.stderr).contains("not a duration"), "{}", text(&out.stderr));
}

#[test]
fn status_names_the_worker_process_a_version_runs_in() {
    let repo = repo_with("w", &[1], "[engine]\nisolation = \"process\"\nsessions = 1\n");
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("w", 1);
    let workers = common::children_of(server.pid(), "worker");
    assert_eq!(workers.len(), 1, "{workers:?}");
    let stdout = ok(&server, &["status", "w"]);
    let row = version_row(&stdout, "w", 1, "serving");
    assert!(row.contains(&format!("pid {}, ", workers[0])) && row.ends_with(" MiB resident"), "{row}");
    assert!(row.contains(" runtime "), "a version in a worker is a runtime update: {row}");
    let json: Value = serde_json::from_str(&ok(&server, &["status", "w", "--json"])).expect("JSON");
    assert!(json["live"][0]["worker"]["started_at_rfc3339"].as_str().is_some_and(|t| t.ends_with('Z')), "{json}");
}

#[test]
fn events_in_json_carry_their_time_in_rfc3339() {
    use std::io::BufRead;
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 1);
    let child = Command::new(bin())
        .args(["events", "--json", "--url", server.base()])
        .env_remove("BATON_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting baton events");
    let mut events = common::Reaper(Some(child));
    let stdout = events.0.as_mut().and_then(|c| c.stdout.take()).expect("piped stdout");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // The stream may not be open yet: reload until a finished load shows up.
    let finished = (0..60)
        .find_map(|_| {
            ok(&server, &["load", "m", "--force"]);
            server.wait_settled("m", 1);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
                let event: Value = serde_json::from_str(&line).expect("one JSON event a line");
                if event["event"] == "finished" {
                    return Some(event);
                }
            }
            None
        })
        .expect("baton events --json printed no finished load");
    let at = finished["at_rfc3339"].as_str().unwrap_or_else(|| panic!("{finished}"));
    assert!(at.ends_with('Z') && at.len() == "2026-12-07T13:25:09.250Z".len(), "{at}");
    assert!(finished["at"].as_f64().is_some(), "the epoch seconds stay: {finished}");
    assert!(finished["report"]["finished_at"].as_f64().is_some(), "{finished}");
}
