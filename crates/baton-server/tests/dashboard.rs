//! The Grafana dashboard (`deploy/grafana/baton.json`) against a real
//! Prometheus scraping the real binary, black box.
//!
//! - Every query of every panel outside the fleet row, with its template
//!   variables put in as Grafana puts them (every model and version, then
//!   one model and one version), returns series while a rollout is in
//!   progress, each series carrying every label its legend names.
//! - The fleet row's queries do the same against two replicas of a fleet
//!   over a real etcd, after a fleet rollout switched them.
//! - The template variables' own queries list the models and versions
//!   served.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_testkit::etcd::Etcd;
use baton_testkit::prometheus::Prometheus;
use baton_testkit::repo::{Damage, TestRepo, mlp_toml};
use baton_testkit::server::{Server, eventually};
use common::{bin, mlp, repo_with, request, start};
use serde_json::{Value, json};

/// The dashboard as it is shipped.
const DASHBOARD: &str = include_str!("../../../deploy/grafana/baton.json");

/// The row whose panels need a fleet.
const FLEET_ROW: &str = "Fleet";

/// What Grafana puts for `$__rate_interval` with the test Prometheus's
/// 200 ms scrape interval set on the data source and a 5 s `$__interval`:
/// max(`$__interval` + scrape interval, 4 × scrape interval).
const RATE_INTERVAL: &str = "5200ms";

/// What Grafana puts for `$__interval` in the test's setting: the bar
/// panels count what each interval added, once.
const INTERVAL: &str = "5s";

/// How long one query may take to show its series: scrapes every 200 ms,
/// and a rate needs two of them inside its window.
const PATIENCE: Duration = Duration::from_secs(60);

/// One query of a panel.
struct Query {
    panel: String,
    row: String,
    expr: String,
    legend: String,
}

/// Every query of the dashboard's panels (rows excluded), with the row it
/// sits under, plus its annotations' queries.
fn queries() -> Vec<Query> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut row = String::new();
    let mut all = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for annotation in dashboard["annotations"]["list"].as_array().expect("annotations") {
        if let Some(expr) = annotation["expr"].as_str() {
            all.push(Query {
                panel: format!("annotation {}", annotation["name"]),
                row: String::new(),
                expr: expr.to_owned(),
                legend: annotation["titleFormat"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("every panel has a title").to_owned();
        assert!(
            ids.insert(panel["id"].as_u64().expect("every panel has an id")),
            "{title}: a second panel with its id"
        );
        if panel["type"] == "row" {
            row = title;
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title} uses the datasource variable");
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("{title} has no targets"));
        assert!(!targets.is_empty(), "{title} has no queries");
        for target in targets {
            all.push(Query {
                panel: title.clone(),
                row: row.clone(),
                expr: target["expr"].as_str().unwrap_or_else(|| panic!("{title}: a target without expr")).to_owned(),
                legend: target["legendFormat"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    all
}

/// The labels a legend names (`{{model}} v{{version}}` names model and
/// version).
fn legend_labels(legend: &str) -> Vec<String> {
    legend.split("{{").skip(1).filter_map(|s| s.split_once("}}")).map(|(name, _)| name.trim().to_owned()).collect()
}

/// A variable's value as Grafana's Prometheus data source writes it into
/// a regex matcher of a multi-value variable: every value with its regex
/// characters escaped, several joined as `(a|b)`, "All" as the variable's
/// `allValue`.
fn format_variable(values: Option<&[&str]>) -> String {
    let escape = |v: &str| {
        v.chars().fold(String::new(), |mut out, c| {
            if "\\^$*+?.()|{}[]/".contains(c) {
                out.push_str("\\\\");
            }
            out.push(c);
            out
        })
    };
    match values {
        None => ".*".to_owned(),
        Some([one]) => escape(one),
        Some(many) => format!("({})", many.iter().map(|v| escape(v)).collect::<Vec<_>>().join("|")),
    }
}

/// `expr` with the variables put in.
fn interpolate(expr: &str, model: Option<&[&str]>, version: Option<&[&str]>) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__interval", INTERVAL)
        .replace("$model", &format_variable(model))
        .replace("$version", &format_variable(version))
}

/// Whether an answer holds series with every label `labels` names and at
/// least one number.
fn has_series(answer: &Value, labels: &[String]) -> bool {
    let result = answer["data"]["result"].as_array().cloned().unwrap_or_default();
    let labelled = result.iter().all(|s| labels.iter().all(|l| s["metric"][l].is_string()));
    let numbers =
        result.iter().any(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).is_some_and(f64::is_finite));
    !result.is_empty() && labelled && numbers
}

/// Waits until one of `exprs` (the same query with different variables)
/// gives series with the labels its legend uses; gives its index and
/// answer, or panics naming the panel after [`PATIENCE`].
fn expect_series(prometheus: &Prometheus, query: &Query, exprs: &[String]) -> (usize, Value) {
    let labels = legend_labels(&query.legend);
    let deadline = Instant::now() + PATIENCE;
    let mut last = Vec::new();
    loop {
        last.clear();
        for (i, expr) in exprs.iter().enumerate() {
            let answer = prometheus.query(expr).unwrap_or_default();
            if has_series(&answer, &labels) {
                return (i, answer);
            }
            last.push(format!("{expr}\n  answered {answer}"));
        }
        assert!(
            Instant::now() < deadline,
            "panel {:?} (row {:?}) wanted series with the labels {labels:?} its legend {:?} uses:\n{}",
            query.panel,
            query.row,
            query.legend,
            last.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The values of `label` a `label_values(SELECTOR, label)` variable query
/// lists, with `$model` set to `model`.
fn variable_values(prometheus: &Prometheus, name: &str, model: Option<&[&str]>) -> Vec<String> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let list = dashboard["templating"]["list"].as_array().expect("template variables");
    let variable = list.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no variable {name}"));
    assert_eq!(variable["allValue"], ".*", "{name}: All is a regex matching every value");
    let query = variable["query"]["query"].as_str().expect("a label_values query");
    let inner = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).expect("label_values(...)");
    let (selector, label) = inner.rsplit_once(',').expect("label_values(SELECTOR, LABEL)");
    let answer = prometheus.query(&interpolate(selector, model, None)).unwrap_or_default();
    let mut values: Vec<String> = answer["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["metric"][label.trim()].as_str().map(str::to_owned))
        .collect();
    values.sort();
    values.dedup();
    values
}

/// Sends requests to each model until stopped: the rates have samples.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(base: &str, models: &[&str]) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let client = baton_testkit::server::Client::new(base);
        let paths: Vec<String> = models.iter().map(|m| format!("/v2/models/{m}/infer")).collect();
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let body = request(&[0.25f32; 8], 1);
            // Bounded: at most a few minutes of requests, whatever happens.
            for _ in 0..50_000 {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                for path in &paths {
                    let _ = client.try_post_raw(path, body.to_string().as_bytes(), &[]);
                }
                // Pacing, not waiting for a condition: a steady trickle.
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Traffic { stop, thread: Some(thread) }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends requests to `model` from several threads at once until the server
/// has shed one.
fn burst_until_shed(server: &Server, model: &str) {
    let shed = format!("baton_requests_shed_total{{model=\"{model}\"");
    let path = format!("/v2/models/{model}/infer");
    let body = request(&[0.25f32; 8], 1).to_string();
    eventually("a request shed", || {
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let client = server.client();
                    for _ in 0..20 {
                        let _ = client.try_post_raw(&path, body.as_bytes(), &[]);
                    }
                });
            }
        });
        server.metrics().contains(&shed).then_some(())
    });
}

/// `host:port` of a server, as Prometheus scrapes it.
fn target(server: &Server) -> String {
    server.base().trim_start_matches("http://").to_owned()
}

/// Checks every query of the panels `wanted` picks with every model and
/// version, then with one model and one of its versions: one of
/// `choices` must give series, each of that model alone.
fn check_panels(prometheus: &Prometheus, wanted: impl Fn(&Query) -> bool, choices: &[(&str, &str)]) -> usize {
    let mut checked = 0;
    for query in queries().iter().filter(|q| wanted(q)) {
        expect_series(prometheus, query, &[interpolate(&query.expr, None, None)]);
        let one: Vec<String> =
            choices.iter().map(|&(m, v)| interpolate(&query.expr, Some(&[m][..]), Some(&[v][..]))).collect();
        let (chosen, answer) = expect_series(prometheus, query, &one);
        let model = choices[chosen].0;
        if query.expr.contains("$model") {
            for s in answer["data"]["result"].as_array().into_iter().flatten() {
                assert!(
                    s["metric"].get("model").is_none_or(|m| m == model),
                    "panel {:?} with $model = {model}: {} gave {s}",
                    query.panel,
                    one[chosen]
                );
            }
        }
        checked += 1;
    }
    checked
}

#[test]
fn every_panel_returns_its_series_in_the_middle_of_a_rollout() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 1\n"));
    repo.publish_mlp("m", 1, &mlp(1));
    // In a worker, and admitting one request at a time: a burst is shed.
    let w = "[engine]\nisolation = \"process\"\n[admission]\nmax_in_flight = 1\nmax_queue = 0\n\
             [policy]\nkeep_previous = 1\n";
    repo.add_model("w", &mlp_toml(&mlp(1), w));
    repo.publish_mlp("w", 1, &mlp(1));
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 1);
    server.wait_settled("w", 1);

    // A load refused at its verify stage, for the failures panel.
    repo.publish_damaged("w", 2, &mlp(2), Damage::FlipByte);
    let refused = server.post_json("/baton/v1/models/w/load", &json!({ "version": 2 }));
    assert_ne!(refused.status, 200, "a damaged version loads: {}", refused.error());
    // A load and a rollback, for the updates panel.
    repo.publish_mlp("w", 3, &mlp(3));
    let loaded = server.post_json("/baton/v1/models/w/load", &json!({ "version": 3 }));
    assert_eq!(loaded.status, 200, "{}", loaded.error());
    let rolled = server.post_json("/baton/v1/models/w/rollback", &json!({}));
    assert_eq!(rolled.status, 200, "{}", rolled.error());
    // Scraping from before the rollout: its decisions are counted as they
    // happen.
    let prometheus = Prometheus::start(&target(&server));

    repo.publish_mlp("m", 2, &mlp(2));
    let traffic = Traffic::start(server.base(), &["m", "w"]);
    let plan = json!({ "steps": [10, 20, 30, 40, 50, 60, 70, 80, 90, 100], "interval_ms": 1000, "watch_ms": 0,
                       "max_inconclusive": 1000, "guards": { "min_samples": 5, "max_p99_ratio": 1000.0, "max_error_rate_increase": 1.0 } });
    eventually("the rollout to start", || {
        let answer = server.post_json("/baton/v1/models/m/rollout", &plan);
        match answer.status {
            200 => Some(()),
            409 if answer.json()["kind"] == "load_in_progress" => None,
            _ => panic!("start: {}", answer.error()),
        }
    });
    // Held in the middle once a window has been judged with values: the
    // guard gauges hold that window's values.
    eventually("a judged window with guard values", || {
        let status = server.get("/baton/v1/models/m/rollout").json();
        let decisions = status["rollout"]["decisions"].as_array().cloned().unwrap_or_default();
        let judged = decisions.iter().rev().find(|d| !d["verdict"].is_null())?;
        judged["verdict"]["checks"].as_array()?.iter().any(|c| c["value"].is_number()).then_some(())
    });
    let paused = server.post_json("/baton/v1/models/m/rollout/pause", &json!({}));
    assert_eq!(paused.status, 200, "{}", paused.error());
    let status = server.get("/baton/v1/models/m/rollout").json();
    assert_eq!(status["rollout"]["phase"], "paused", "{status}");

    // An error inside each version (a wrong input name) and one refused
    // before any version (a body that is not JSON), for the errors panel.
    let wrong = json!({ "inputs": [{ "name": "nope", "datatype": "FP32", "shape": [1, 8], "data": vec![0.0f32; 8] }] });
    for path in ["/v2/models/m/versions/1/infer", "/v2/models/m/versions/2/infer"] {
        assert_eq!(server.post_json(path, &wrong).status, 400, "{path}");
    }
    assert_eq!(server.post_raw("/v2/models/m/infer", b"{", &[]).status, 400);
    // A request whose deadline (1 µs) passes, and a burst that is shed.
    let mut hurried = request(&[0.25f32; 8], 1);
    hurried["parameters"] = json!({ "timeout": 1 });
    assert_ne!(server.post_json("/v2/models/m/infer", &hurried).status, 200);
    burst_until_shed(&server, "w");

    for (model, want) in [(None, vec!["m", "w"]), (Some(&["m"][..]), vec!["m"])] {
        let got = variable_values(&prometheus, "model", None);
        assert!(want.iter().all(|w| got.iter().any(|g| g == w)), "$model lists {got:?}, wanted {want:?}");
        let versions = variable_values(&prometheus, "version", model);
        assert!(versions.iter().any(|v| v == "1") && versions.iter().any(|v| v == "2"), "$version lists {versions:?}");
    }
    let choices = [("m", "2"), ("m", "1"), ("w", "1")];
    let panels = |q: &Query| q.row != FLEET_ROW && !q.panel.starts_with("annotation");
    let checked = check_panels(&prometheus, panels, &choices);
    assert!(checked > 20, "{checked} queries checked");

    // Decisions are marked as they happen: the rollout goes on, and its
    // next decisions show.
    let resumed = server.post_json("/baton/v1/models/m/rollout/resume", &json!({}));
    assert_eq!(resumed.status, 200, "{}", resumed.error());
    let marked = check_panels(&prometheus, |q| q.panel.starts_with("annotation"), &choices);
    assert_eq!(marked, 1);
    drop(traffic);
}

/// Waits until the query of the bar panel (not an annotation) that counts
/// `metric`, for model `m`, gives a series above 0 whose `label` is
/// `value`; panics naming the panel after [`PATIENCE`].
fn expect_above_zero(prometheus: &Prometheus, metric: &str, label: (&str, &str)) {
    let query = queries()
        .into_iter()
        .find(|q| !q.panel.starts_with("annotation") && q.expr.contains(&format!("{metric}{{")))
        .unwrap_or_else(|| panic!("no panel reads {metric}"));
    let expr = interpolate(&query.expr, Some(&["m"][..]), None);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = prometheus.query(&expr).unwrap_or_default();
        let result = answer["data"]["result"].as_array().cloned().unwrap_or_default();
        let above = result.iter().any(|s| {
            let value = s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).unwrap_or_default();
            (label.0.is_empty() || s["metric"][label.0] == label.1) && value > 0.0
        });
        if above {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "panel {:?}: {expr} never went above 0 for {label:?}; last {answer}",
            query.panel
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prometheus scrapes the server before anything happens to the model;
/// then its first refused load, first update, first rollback and a
/// rollout's first decisions each show above 0 on their panels: baton
/// writes those counters at 0 as soon as it knows the model, so the first
/// of each kind is an increase, not a series that appears at 1.
#[test]
fn a_first_refused_load_rollback_and_promotion_show_on_their_panels() {
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&mlp(1), "[policy]\nkeep_previous = 1\n"));
    repo.publish_mlp("m", 1, &mlp(1));
    let server = start(&repo, &["--no-watch"]);
    server.wait_settled("m", 1);
    let prometheus = Prometheus::start(&target(&server));
    eventually("a scrape of the model", || {
        let answer = prometheus.query("baton_model_state{model=\"m\"}").unwrap_or_default();
        answer["data"]["result"].as_array().is_some_and(|r| !r.is_empty()).then_some(())
    });

    repo.publish_damaged("m", 2, &mlp(2), Damage::FlipByte);
    let refused = server.post_json("/baton/v1/models/m/load", &json!({ "version": 2 }));
    assert_ne!(refused.status, 200, "a damaged version loads: {}", refused.error());
    expect_above_zero(&prometheus, "baton_load_failures_total", ("stage", "verify"));

    repo.publish_mlp("m", 3, &mlp(3));
    let loaded = server.post_json("/baton/v1/models/m/load", &json!({ "version": 3 }));
    assert_eq!(loaded.status, 200, "{}", loaded.error());
    expect_above_zero(&prometheus, "baton_updates_total", ("update", "graph"));
    let rolled = server.post_json("/baton/v1/models/m/rollback", &json!({}));
    assert_eq!(rolled.status, 200, "{}", rolled.error());
    expect_above_zero(&prometheus, "baton_rollbacks_total", ("", ""));

    repo.publish_mlp("m", 4, &mlp(4));
    let plan = json!({ "version": 4, "steps": [10, 100], "interval_ms": 600_000, "watch_ms": 0 });
    eventually("the rollout to start", || {
        let answer = server.post_json("/baton/v1/models/m/rollout", &plan);
        match answer.status {
            200 => Some(()),
            409 if answer.json()["kind"] == "load_in_progress" => None,
            _ => panic!("start: {}", answer.error()),
        }
    });
    expect_above_zero(&prometheus, "baton_rollout_decisions_total", ("decision", "started"));
    let promoted = server.post_json("/baton/v1/models/m/rollout/promote", &json!({}));
    assert_eq!(promoted.status, 200, "{}", promoted.error());
    expect_above_zero(&prometheus, "baton_rollout_decisions_total", ("decision", "promoted"));
}

/// A replica of fleet `bb` over `etcd`, serving `repo`.
fn replica(etcd: &Etcd, repo: &TestRepo, id: &str) -> Server {
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    common::start(repo, &["--cluster", &cluster, "--cluster-name", "bb", "--replica-id", id])
}

#[test]
fn every_fleet_panel_returns_its_series_after_a_fleet_switch() {
    let etcd = Etcd::start();
    let (repo1, repo2) = (repo_with("m", &[1], ""), repo_with("m", &[1], ""));
    let replicas = [replica(&etcd, &repo1, "r1"), replica(&etcd, &repo2, "r2")];
    for r in &replicas {
        r.wait_ready();
    }
    for repo in [&repo1, &repo2] {
        repo.publish_mlp("m", 2, &mlp(2));
    }
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let output = Command::new(bin())
        .args(["fleet", "--cluster", &cluster, "--cluster-name", "bb", "rollout", "m", "--version", "2"])
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{said}");

    let targets: Vec<String> = replicas.iter().map(target).collect();
    let prometheus = Prometheus::start_scraping(&targets.iter().map(String::as_str).collect::<Vec<_>>());
    let checked = check_panels(&prometheus, |q| q.row == FLEET_ROW, &[("m", "2")]);
    assert!(checked >= 5, "{checked} fleet queries checked");
    // The skew query compares the two replicas: both are scraped.
    let delays = prometheus.query("baton_cluster_commit_delay_seconds{model=\"m\"}").unwrap_or_default();
    let instances = delays["data"]["result"].as_array().map_or(0, Vec::len);
    assert_eq!(instances, 2, "{delays}");
}
