//! Guards on what a model does for the business, black box.
//!
//! Outcomes: every answer of a rollout in progress carries an outcome id;
//! a client posts clicks against them, and a candidate whose answers get
//! fewer clicks than the stable version's is rolled back, during the
//! rollout and during the watch after its promotion. A batch of outcomes
//! is checked whole, and a malformed one changes nothing.
//!
//! Prometheus: the real Prometheus scrapes an exporter the test owns; a
//! metric guard that reads a worse number for the candidate rolls it back,
//! and a query with no data, several series or NaN, or a Prometheus that
//! is down, makes the window inconclusive with the reason, never a pass.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use baton_testkit::prometheus::{Exporter, Prometheus};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, Server, eventually, metric};
use common::{mlp, repo_with, start};
use serde_json::{Value, json};

/// A server of `m` serving version 1, with version 2 published beside it.
fn two_versions(args: &[&str]) -> (TestRepo, Server) {
    let repo = repo_with("m", &[1], "[policy]\nkeep_previous = 1\n");
    let mut all = vec!["--no-watch"];
    all.extend_from_slice(args);
    let server = start(&repo, &all);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    (repo, server)
}

/// Starts a rollout of version 2 with `body`, retrying while the start's
/// load of version 1 still holds the model.
fn start_rollout(server: &Server, body: &Value) -> Value {
    eventually("the rollout to start", || {
        let answer = server.post_json("/baton/v1/models/m/rollout", body);
        match answer.status {
            200 => Some(answer.json()),
            409 if ["load_in_progress", "rollout_in_progress"]
                .contains(&answer.json()["kind"].as_str().unwrap_or("")) =>
            {
                None
            }
            _ => panic!("start: {}", String::from_utf8_lossy(&answer.body)),
        }
    })
}

fn status(server: &Server) -> Value {
    server.get("/baton/v1/models/m/rollout").json()
}

/// Waits until the rollout is in `phase`; returns its status.
fn wait_phase(server: &Server, phase: &str) -> Value {
    eventually(&format!("the rollout to be {phase}"), || {
        let status = status(server);
        let now = &status["rollout"]["phase"];
        assert!(
            now == phase || !["rolled_back", "aborted", "promoted"].contains(&now.as_str().unwrap_or("")),
            "ended {now} while waiting for {phase}: {status}"
        );
        (now == phase).then_some(status)
    })
}

/// The checks of the verdict of the last decision that had one.
fn last_checks(status: &Value) -> (Value, String) {
    let decisions = status["rollout"]["decisions"].as_array().cloned().unwrap_or_default();
    let judged = decisions.iter().rev().find(|d| !d["verdict"].is_null()).cloned().unwrap_or_default();
    (judged["verdict"]["checks"].clone(), judged["verdict"]["reason"].as_str().unwrap_or_default().to_owned())
}

fn check<'a>(checks: &'a Value, guard: &str) -> &'a Value {
    checks.as_array().and_then(|c| c.iter().find(|c| c["guard"] == guard)).unwrap_or(&Value::Null)
}

/// A client of `m` that posts a click for a share of the answers of each
/// version, as [`Rates`] says.
struct Clicks {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(u64, u64)>>,
}

impl Clicks {
    fn start(client: Client, rates: Arc<Rates>) -> Clicks {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
            let request = common::request(&input, 1).to_string();
            let headers = [("content-type", "application/json")];
            let (mut counts, mut batch, mut with_ids) = ([0u64; 2], Vec::new(), 0);
            let mut answers = 0;
            while !stopped.load(Ordering::Relaxed) && answers < 200_000 {
                answers += 1;
                let answer = client.post_raw("/v2/models/m/infer", request.as_bytes(), &headers);
                assert_eq!(answer.status, 200, "infer: {}", String::from_utf8_lossy(&answer.body));
                let body = answer.json();
                let Some(id) = body["parameters"]["baton_outcome_id"].as_str() else { continue };
                assert_eq!(answer.header("baton-outcome-id"), Some(id), "the header and the parameter agree");
                with_ids += 1;
                // By version: after a promotion, version 2 answers as stable.
                let side = usize::from(body["model_version"] == "2");
                let rate = rates.get(side);
                if counts[side] % 10 < rate {
                    batch.push(json!({ "id": id }));
                }
                counts[side] += 1;
                if batch.len() >= 8 {
                    let posted = client.post_json("/baton/v1/models/m/outcomes", &json!({ "outcomes": batch }));
                    assert_eq!(posted.status, 200, "outcomes: {}", String::from_utf8_lossy(&posted.body));
                    batch.clear();
                }
            }
            (answers, with_ids)
        });
        Clicks { stop, thread: Some(thread) }
    }

    /// Stops the clients; returns the answers and how many carried an id.
    fn stop(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(|t| t.join().expect("the clients")).unwrap_or_default()
    }
}

impl Drop for Clicks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Clicks per ten answers of version 1 and of version 2, changeable while
/// the client runs.
#[derive(Default)]
struct Rates([AtomicU64; 2]);

impl Rates {
    fn new(stable: u64, candidate: u64) -> Arc<Rates> {
        let rates = Rates::default();
        rates.set(stable, candidate);
        Arc::new(rates)
    }

    fn set(&self, stable: u64, candidate: u64) {
        self.0[0].store(stable, Ordering::Relaxed);
        self.0[1].store(candidate, Ordering::Relaxed);
    }

    fn get(&self, side: usize) -> u64 {
        self.0[side].load(Ordering::Relaxed)
    }
}

/// A canary through 50 and 100 % in 1.5 s windows, watched `watch_ms`
/// after promotion, with the default guards written out and the outcome
/// guard.
fn clicks_plan(watch_ms: u64) -> Value {
    json!({
        "steps": [50, 100], "interval_ms": 1500, "watch_ms": watch_ms,
        "guards": { "min_samples": 50, "max_error_rate_increase": 0.01, "max_p99_ratio": 1.5, "min_outcome_ratio": 0.8 },
    })
}

#[test]
fn a_candidate_with_fewer_clicks_is_rolled_back_with_the_default_guards_on() {
    let (_repo, server) = two_versions(&[]);
    start_rollout(&server, &clicks_plan(0));
    // Three clicks in ten stable answers, one in ten of the candidate's.
    let clicks = Clicks::start(server.client(), Rates::new(3, 1));
    let ended = wait_phase(&server, "rolled_back");
    let (answers, with_ids) = clicks.stop();
    assert!(with_ids > 0 && with_ids <= answers, "{with_ids} of {answers} answers carried an outcome id");
    let (checks, reason) = last_checks(&ended);
    let ratio = check(&checks, "outcome_ratio");
    assert_eq!(ratio["outcome"], "fail", "{reason}\n{ended}");
    let value = ratio["value"].as_f64().expect("a ratio");
    assert!((0.2..0.5).contains(&value), "about a third: {value} ({reason})");
    assert_eq!(
        ended["rollout"]["decisions"].as_array().map(|d| d.last().unwrap()["action"].clone()),
        Some(json!("rolled_back"))
    );
    let totals = &ended["rollout"]["totals"];
    assert!(
        totals["stable"]["outcomes"].as_u64() > Some(0) && totals["candidate"]["outcomes"].as_u64() > Some(0),
        "{totals}"
    );
    // Once the rollout has ended, answers carry no id.
    let (_, answer) = infer_once(&server);
    assert!(answer["parameters"]["baton_outcome_id"].is_null(), "{answer}");
    assert!(metric(&server.metrics(), r#"baton_outcomes_total{model="m",result="accepted"}"#) > Some(0.0));
}

fn infer_once(server: &Server) -> (u16, Value) {
    let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
    let answer = server.post_json("/v2/models/m/infer", &common::request(&input, 1));
    (answer.status, answer.json())
}

#[test]
fn a_candidate_that_loses_clicks_after_promotion_is_rolled_back_inside_the_watch() {
    let (_repo, server) = two_versions(&[]);
    start_rollout(&server, &clicks_plan(60000));
    let rates = Rates::new(3, 3);
    let clicks = Clicks::start(server.client(), Arc::clone(&rates));
    wait_phase(&server, "watching");
    // Promoted and watched against version 1's click rate over the rollout:
    // now its answers get a third of the clicks.
    rates.set(3, 1);
    let ended = wait_phase(&server, "rolled_back");
    clicks.stop();
    let (checks, reason) = last_checks(&ended);
    assert_eq!(check(&checks, "outcome_ratio")["outcome"], "fail", "{reason}\n{ended}");
    let decisions = ended["rollout"]["decisions"].as_array().cloned().unwrap_or_default();
    let actions: Vec<&str> = decisions.iter().filter_map(|d| d["action"].as_str()).collect();
    assert!(actions.contains(&"promoted") && actions.last() == Some(&"rolled_back"), "{actions:?}");
    assert!(decisions.last().unwrap()["message"].as_str().unwrap_or("").contains("during the watch"), "{decisions:?}");
    assert_eq!(infer_once(&server).1["model_version"], "1", "version 1 serves again");
}

#[test]
fn a_batch_of_outcomes_is_checked_whole_and_counted_once() {
    let (_repo, server) = two_versions(&[]);
    let body = json!({ "steps": [50, 100], "interval_ms": 600000, "guards": { "min_outcome_ratio": 0.9 } });
    start_rollout(&server, &body);
    let ids: Vec<String> = (0..40)
        .filter_map(|_| infer_once(&server).1["parameters"]["baton_outcome_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 40, "every answer of a rollout in progress carries an id");
    let post =
        |body: &[u8]| server.post_raw("/baton/v1/models/m/outcomes", body, &[("content-type", "application/json")]);
    let good = json!({ "id": ids[0] });
    let bad: [(Value, &str); 5] = [
        (
            json!({ "outcomes": [good, { "id": ids[1], "value": -1.0 }] }),
            "outcome 1: its value must be a finite number",
        ),
        (json!({ "outcomes": [good, { "id": "click-42" }] }), "'click-42' is not an outcome id"),
        (json!({ "outcomes": [good, { "id": ids[1], "weight": 2 }] }), "unknown field `weight`"),
        (json!({ "outcome": [good] }), "unknown field `outcome`"),
        (json!({ "outcomes": [good, { "id": 7 }] }), "invalid type"),
    ];
    for (body, needle) in bad {
        let answer = post(body.to_string().as_bytes());
        assert_eq!(answer.status, 400, "{body}: {}", String::from_utf8_lossy(&answer.body));
        assert!(answer.error().contains(needle), "{body}: {}", answer.error());
    }
    assert_eq!(post(b"{not json").status, 400);
    let counted = |status: &Value| {
        let totals = &status["rollout"]["totals"];
        totals["stable"]["outcomes"].as_u64().unwrap_or(0) + totals["candidate"]["outcomes"].as_u64().unwrap_or(0)
    };
    assert_eq!(counted(&status(&server)), 0, "nothing of a refused batch counted");
    // Another rollout's id (another tag), ids posted twice, values.
    let foreign = format!("o{}{}", if ids[2].starts_with("o0") { "1" } else { "0" }, &ids[2][2..]);
    let batch = json!({ "outcomes": [
        { "id": ids[0] }, { "id": ids[1], "value": 0.5 }, { "id": ids[0] }, { "id": foreign },
    ] });
    let answer = post(batch.to_string().as_bytes());
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json(), json!({ "accepted": 2, "duplicate": 1, "unknown": 1 }));
    let again = post(json!({ "outcomes": [{ "id": ids[1] }] }).to_string().as_bytes()).json();
    assert_eq!(again, json!({ "accepted": 0, "duplicate": 1, "unknown": 0 }), "a retried post counts once");
    let now = status(&server);
    assert_eq!(counted(&now), 2, "{now}");
    let totals = &now["rollout"]["totals"];
    let value = totals["stable"]["outcome_value"].as_f64().unwrap_or(0.0)
        + totals["candidate"]["outcome_value"].as_f64().unwrap_or(0.0);
    assert!((value - 1.5).abs() < 1e-9, "{totals}");
    let missing = server.post_json("/baton/v1/models/nope/outcomes", &json!({ "outcomes": [] }));
    assert_eq!(missing.status, 404);
    // After the rollout, ids are of no rollout in progress: unknown, not errors.
    assert_eq!(server.post_json("/baton/v1/models/m/rollout/abort", &json!({})).status, 200);
    let late = post(json!({ "outcomes": [{ "id": ids[5] }] }).to_string().as_bytes());
    assert_eq!(late.json(), json!({ "accepted": 0, "duplicate": 0, "unknown": 1 }));
}

/// The page an application would export: a click-through rate per model
/// version, and a second series of another model.
fn page(stable: f64, candidate: f64) -> String {
    format!(
        "# TYPE shop_ctr gauge\nshop_ctr{{model=\"m\",version=\"1\"}} {stable}\nshop_ctr{{model=\"m\",version=\"2\"}} \
         {candidate}\nshop_ctr{{model=\"other\",version=\"1\"}} 0.5\n"
    )
}

#[test]
fn a_metric_guard_reads_prometheus_and_no_data_is_never_a_pass() {
    let exporter = Exporter::start(&page(0.20, 0.08));
    let mut prometheus = Prometheus::start(&exporter.target());
    prometheus.wait_for(r#"shop_ctr{model="m",version="2"}"#, 0.08);
    let url = prometheus.url();
    let (_repo, server) = two_versions(&["--prometheus-url", &url]);
    let ctr =
        json!({ "name": "ctr", "query": "shop_ctr{model=\"{{model}}\",version=\"{{version}}\"}", "min_ratio": 0.9 });
    let guards = json!({ "min_samples": 1, "metrics": [ctr] });
    start_rollout(&server, &json!({ "steps": [50, 100], "interval_ms": 1000, "watch_ms": 0, "guards": guards }));
    let traffic = Clicks::start(server.client(), Rates::new(0, 0));
    let ended = wait_phase(&server, "rolled_back");
    let (checks, reason) = last_checks(&ended);
    let read = check(&checks, "metric:ctr");
    assert_eq!(read["outcome"], "fail", "{reason}");
    assert!((read["value"].as_f64().unwrap() - 0.4).abs() < 1e-9, "{read}");

    // Queries that give no number: each check is inconclusive and says why.
    let queries = [
        ("nodata", "shop_ctr{model=\"{{model}}\",version=\"{{version}}\",shop=\"none\"}", "gave no series"),
        ("several", "shop_ctr{version=\"{{version}}\"}", "series where one is needed"),
        ("nan", "0 / 0 * scalar(shop_ctr{model=\"{{model}}\",version=\"{{version}}\"})", "not a finite number"),
        ("refused", "shop_ctr{{{version}}", "Prometheus refused the query"),
    ];
    let metrics: Vec<Value> =
        queries.iter().map(|(n, q, _)| json!({ "name": n, "query": q, "min_ratio": 0.5 })).collect();
    let guards = json!({ "min_samples": 1, "metrics": metrics });
    let body = json!({ "steps": [50, 100], "interval_ms": 1000, "max_inconclusive": 100, "guards": guards });
    start_rollout(&server, &body);
    let held = eventually("a judged window", || {
        let status = status(&server);
        let (checks, reason) = last_checks(&status);
        (!checks.is_null()).then_some((checks, reason))
    });
    for (name, _, why) in queries {
        let read = check(&held.0, &format!("metric:{name}"));
        assert_eq!(read["outcome"], "inconclusive", "{name}: {}", held.1);
        assert!(read["note"].as_str().unwrap_or("").contains(why), "{name}: {read}");
    }
    assert!(held.1.starts_with("inconclusive"), "{}", held.1);

    // Prometheus down: inconclusive, and the reason says so.
    prometheus.stop();
    let down = eventually("a window judged with Prometheus down", || {
        let (checks, reason) = last_checks(&status(&server));
        reason.contains("did not answer").then_some(checks)
    });
    let metric_checks = down.as_array().unwrap().iter().filter(|c| c["guard"].as_str().unwrap().starts_with("metric:"));
    assert!(
        metric_checks.clone().count() == 4 && metric_checks.clone().all(|c| c["outcome"] == "inconclusive"),
        "{down}"
    );
    assert_eq!(status(&server)["rollout"]["phase"], "running", "never a pass, never a step up");
    traffic.stop();
    drop(exporter);
}

#[test]
fn metric_guards_without_a_prometheus_are_refused_at_the_start() {
    let (_repo, server) = two_versions(&[]);
    let ctr = json!({ "name": "ctr", "query": "up", "min_ratio": 0.9 });
    let answer = eventually("an answer other than busy", || {
        let answer = server.post_json("/baton/v1/models/m/rollout", &json!({ "guards": { "metrics": [ctr] } }));
        (answer.status != 409 || answer.json()["kind"] != "load_in_progress").then_some(answer)
    });
    assert!(answer.status >= 400 && answer.status < 500, "{}", String::from_utf8_lossy(&answer.body));
    assert!(answer.error().contains("--prometheus-url"), "{}", answer.error());
    let invalid = server
        .post_json("/baton/v1/models/m/rollout", &json!({ "guards": { "metrics": [{ "name": "x", "query": "up" }] } }));
    assert_eq!(invalid.status, 400, "{}", invalid.error());
    assert!(invalid.error().contains("needs min_ratio, max_ratio or both"), "{}", invalid.error());
    assert_eq!(infer_once(&server).1["model_version"], "1");
}
