//! Prometheus metrics, written in the text exposition format by hand: a few
//! counters and histograms do not need a metrics framework.
//!
//! Request metrics are updated on the request path with atomics only (a
//! read lock finds the series; a write lock is taken once per new model
//! version). Load, rollback and unload metrics are fed from the registry's
//! event stream, so loads started by the watcher, the API or the CLI are all
//! counted the same way. Gauges about versions and memory are read from the
//! registry when `/metrics` is scraped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use baton_core::registry::Registry;
use baton_core::registry::events::{Event, EventKind, Operation, Stage};
use baton_core::rollout::Role;

use crate::budget::Budget;

pub mod connections;
mod rollouts;
mod seed;
mod workers;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 16] =
    [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

/// A latency histogram with fixed buckets.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos(d), Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Request metrics of one model version.
#[derive(Default)]
pub struct VersionMetrics {
    requests: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    latency: Histogram,
    failures: AtomicU64,
    failure_nanos: AtomicU64,
    inferences: AtomicU64,
    last_ms: AtomicU64,
}

/// One model version's request counters, as Triton's statistics report them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VersionStats {
    /// Requests that reached the version and succeeded.
    pub successes: u64,
    /// Their total time inside the server, in nanoseconds.
    pub success_nanos: u64,
    /// Requests that reached the version and failed.
    pub failures: u64,
    /// Their total time, in nanoseconds.
    pub failure_nanos: u64,
    /// Inferences in successful requests, each element of a batch counted.
    pub inferences: u64,
    /// When the last request ended, in milliseconds since the Unix epoch;
    /// 0 before the first.
    pub last_ms: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl VersionMetrics {
    /// Records a request that reached the version: how long it took, how
    /// many inferences it asked for (its batch size), and its error kind if
    /// it failed.
    pub fn record(&self, took: Duration, batch: u64, error: Option<&'static str>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.latency.observe(took);
        if let Some(kind) = error {
            self.failures.fetch_add(1, Ordering::Relaxed);
            self.failure_nanos.fetch_add(nanos(took), Ordering::Relaxed);
            *self.errors.lock().unwrap_or_else(|e| e.into_inner()).entry(kind).or_default() += 1;
        } else {
            self.inferences.fetch_add(batch, Ordering::Relaxed);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_ms.fetch_max(u64::try_from(now.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The counters as they are now. Each is read on its own, so a request
    /// finishing meanwhile may show in one and not yet in another.
    pub fn stats(&self) -> VersionStats {
        let failures = self.failures.load(Ordering::Relaxed);
        let failure_nanos = self.failure_nanos.load(Ordering::Relaxed);
        VersionStats {
            successes: self.requests.load(Ordering::Relaxed).saturating_sub(failures),
            success_nanos: self.latency.sum_nanos.load(Ordering::Relaxed).saturating_sub(failure_nanos),
            failures,
            failure_nanos,
            inferences: self.inferences.load(Ordering::Relaxed),
            last_ms: self.last_ms.load(Ordering::Relaxed),
        }
    }
}

#[derive(Default)]
struct LoadMetrics {
    durations: BTreeMap<String, Histogram>,
    stages: BTreeMap<(String, Stage), Histogram>,
    failures: BTreeMap<(String, Stage), u64>,
    rollbacks: BTreeMap<String, u64>,
    rollout_decisions: BTreeMap<(String, &'static str), u64>,
    /// Versions whose worker process ended by itself, by what was done.
    worker_exits: BTreeMap<(String, String), u64>,
    /// Versions loaded, by model, kind of update and reason.
    updates: BTreeMap<(String, &'static str, &'static str), u64>,
    unloads: BTreeMap<String, u64>,
    /// Sum of every free's residual: growth of unaccounted memory since
    /// just before the first free.
    residual_sum: i64,
    /// Unaccounted memory after the last free.
    unaccounted: Option<u64>,
    residual_last: BTreeMap<(String, u64), i64>,
    /// How long resource swaps kept each model paused.
    pauses: BTreeMap<String, Histogram>,
    events_missed: u64,
    /// Models whose counters were written at 0 already.
    seeded: std::collections::BTreeSet<String>,
}

/// One model's request series, by version and the role it answered in.
type SeriesByVersion = BTreeMap<(u64, Role), Arc<VersionMetrics>>;

/// All of baton's metrics.
#[derive(Default)]
pub struct Metrics {
    /// By model, then version and the role it answered in: a request's lookup borrows the model name
    /// instead of allocating a key.
    versions: RwLock<BTreeMap<String, SeriesByVersion>>,
    rejected: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Requests refused at once by admission control, by model and reason.
    shed: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Requests whose deadline passed, by model and where they were.
    expired: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Outcomes posted, by model and what became of them.
    outcomes: Mutex<BTreeMap<(String, &'static str), u64>>,
    loads: Mutex<LoadMetrics>,
    inflight: AtomicI64,
    /// Client connections, by listener.
    pub connections: connections::Connections,
    /// The names that may label a request's series: those the registry
    /// knows. Requests for any other name are counted under `model=""`,
    /// so a client cannot create series by naming models.
    known: Option<Registry>,
}

/// Writes a metric family's help and type lines.
pub(crate) fn help(out: &mut String, name: &str, kind: &str, text: &str) {
    let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
}

/// A remote repository's metrics: whether its store answers, how, and
/// what was fetched from it.
pub fn render_store(out: &mut String, answer: &baton_core::files::source::StoreAnswer) {
    help(out, "baton_store_up", "gauge", "1 while the model store's last listing succeeded.");
    let _ = writeln!(out, "baton_store_up {}", u8::from(answer.ok));
    help(out, "baton_store_answer", "gauge", "1 for what the model store last answered: ok, or the failure's kind.");
    let _ = writeln!(out, "baton_store_answer{{kind=\"{}\"}} 1", escape(answer.kind));
    help(out, "baton_store_listing_failures", "gauge", "Listings of the model store that failed in a row.");
    let _ = writeln!(out, "baton_store_listing_failures {}", answer.failures);
    help(out, "baton_store_listings_total", "counter", "Listings of the model store made.");
    let _ = writeln!(out, "baton_store_listings_total {}", answer.listings);
    help(out, "baton_store_fetched_bytes_total", "counter", "Bytes downloaded from the model store into the cache.");
    let _ = writeln!(out, "baton_store_fetched_bytes_total {}", answer.bytes_fetched);
    help(out, "baton_store_cache_hits_total", "counter", "Versions loaded from the cache without a download.");
    let _ = writeln!(out, "baton_store_cache_hits_total {}", answer.cache_hits);
}

/// A fleet replica's metrics: connected or not, the timings of its last
/// prepare and switch per model, the fleet switches it coordinated, and
/// the rollouts it ended without promoting.
pub fn render_cluster(out: &mut String, state: &baton_cluster::health::State) {
    help(out, "baton_cluster_connected", "gauge", "1 while the replica holds its lease and watches the fleet's store.");
    let _ = writeln!(out, "baton_cluster_connected {}", u8::from(state.connected));
    help(out, "baton_cluster_replicas", "gauge", "Live replicas of the fleet, as last seen.");
    let _ = writeln!(out, "baton_cluster_replicas {}", state.replicas);
    help(
        out,
        "baton_cluster_leases_lost_total",
        "counter",
        "Times this process found its lease expired and registered again.",
    );
    let _ = writeln!(out, "baton_cluster_leases_lost_total {}", state.leases_lost);
    help(
        out,
        "baton_cluster_unconverged",
        "gauge",
        "1 for a model this replica does not serve as the fleet committed (a load under way, or a switch retried).",
    );
    for model in state.problems.keys() {
        let _ = writeln!(out, "baton_cluster_unconverged{{model=\"{}\"}} 1", escape(model));
    }
    let per_model = [
        ("baton_cluster_prepare_seconds", "How long this replica's last prepare took.", &state.prepare_seconds),
        (
            "baton_cluster_commit_delay_seconds",
            "From the last commit write to this replica's switch.",
            &state.commit_delay_seconds,
        ),
    ];
    for (name, text, values) in per_model {
        help(out, name, "gauge", text);
        for (model, seconds) in values {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {seconds}", escape(model));
        }
    }
    help(
        out,
        "baton_cluster_commit_skew_seconds",
        "gauge",
        "Last switch minus first, in the last fleet switch this process coordinated.",
    );
    for (model, summary) in &state.fleet_switch {
        let _ = writeln!(
            out,
            "baton_cluster_commit_skew_seconds{{model=\"{}\"}} {}",
            escape(model),
            summary.skew_ms / 1000.0
        );
    }
    help(
        out,
        "baton_cluster_rollouts_aborted_total",
        "counter",
        "Fleet rollouts this process ended without promoting, by reason.",
    );
    for (reason, n) in &state.aborted {
        let _ = writeln!(out, "baton_cluster_rollouts_aborted_total{{reason=\"{}\"}} {n}", escape(reason));
    }
}

/// A label value with Prometheus's escapes.
pub(crate) fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Counts a request in flight for as long as it lives.
pub struct InFlight<'a>(&'a AtomicI64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Metrics whose request series are labelled only with the names
    /// `registry` knows.
    pub fn for_registry(registry: Registry) -> Metrics {
        Metrics { known: Some(registry), ..Metrics::default() }
    }

    /// `model`, if it may label a series; `""` otherwise.
    fn label<'a>(&self, model: &'a str) -> &'a str {
        match &self.known {
            Some(registry) if !registry.knows(model) => "",
            _ => model,
        }
    }

    /// The series of one model version in one role, created on first use.
    pub fn version(&self, model: &str, version: u64, role: Role) -> Arc<VersionMetrics> {
        let versions = self.versions.read().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = versions.get(model).and_then(|v| v.get(&(version, role))) {
            return Arc::clone(found);
        }
        drop(versions);
        let mut versions = self.versions.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(versions.entry(model.to_owned()).or_default().entry((version, role)).or_default())
    }

    /// The counters of one model version, every role summed; all zero when
    /// it has served no request (the series is not created).
    pub fn version_stats(&self, model: &str, version: u64) -> VersionStats {
        let versions = self.versions.read().unwrap_or_else(|e| e.into_inner());
        let Some(series) = versions.get(model) else { return VersionStats::default() };
        series.range((version, Role::Stable)..=(version, Role::Previous)).map(|(_, m)| m.stats()).fold(
            VersionStats::default(),
            |a, b| VersionStats {
                successes: a.successes + b.successes,
                success_nanos: a.success_nanos + b.success_nanos,
                failures: a.failures + b.failures,
                failure_nanos: a.failure_nanos + b.failure_nanos,
                inferences: a.inferences + b.inferences,
                last_ms: a.last_ms.max(b.last_ms),
            },
        )
    }

    /// Counts a request refused before it reached a version.
    pub fn rejected(&self, model: &str, kind: &'static str) {
        let model = self.label(model).to_owned();
        *self.rejected.lock().unwrap_or_else(|e| e.into_inner()).entry((model, kind)).or_default() += 1;
    }

    /// Marks a request in flight until the guard drops, unless `max` are
    /// in flight already.
    pub fn try_in_flight(&self, max: usize) -> Option<InFlight<'_>> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.inflight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(InFlight(&self.inflight))
    }

    /// Counts a request refused at once by admission control: `reason` is
    /// `queue_full`, `version_in_flight`, `server_in_flight` or
    /// `memory_budget`.
    pub fn shed(&self, model: &str, reason: &'static str) {
        let model = self.label(model).to_owned();
        *self.shed.lock().unwrap_or_else(|e| e.into_inner()).entry((model, reason)).or_default() += 1;
    }

    /// Counts a request whose deadline passed: `at` is `arrival`, `queued`
    /// or `running`.
    pub fn expired(&self, model: &str, at: &'static str) {
        let model = self.label(model).to_owned();
        *self.expired.lock().unwrap_or_else(|e| e.into_inner()).entry((model, at)).or_default() += 1;
    }

    /// Counts a batch of posted outcomes by what became of them.
    pub fn outcomes(&self, model: &str, posted: &baton_core::rollout::outcome::Posted) {
        let model = self.label(model).to_owned();
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
        for (result, n) in [("accepted", posted.accepted), ("duplicate", posted.duplicate), ("unknown", posted.unknown)]
        {
            *outcomes.entry((model.clone(), result)).or_default() += n;
        }
    }

    /// Feeds one registry event into the load metrics.
    pub fn on_event(&self, event: &Event) {
        let mut loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
        loads.seed(&event.model);
        let model = event.model.clone();
        match &event.kind {
            EventKind::Finished { report } => {
                match report.operation {
                    Operation::Load => loads.durations.entry(model.clone()).or_default().observe(report.total),
                    Operation::Rollback => *loads.rollbacks.entry(model.clone()).or_default() += 1,
                    Operation::Unload
                    | Operation::Retire
                    | Operation::Keep
                    | Operation::Rollout
                    | Operation::Promote
                    | Operation::Abort => {}
                }
                for stage in &report.stages {
                    loads.stages.entry((model.clone(), stage.stage)).or_default().observe(stage.duration);
                }
                if let (Some(kind), Some(why)) = (report.update, report.update_reason) {
                    *loads.updates.entry((model.clone(), kind.as_str(), why.as_str())).or_default() += 1;
                }
            }
            EventKind::Failed { stage, .. } => *loads.failures.entry((model, *stage)).or_default() += 1,
            EventKind::Unloaded { residual, unaccounted, .. } => {
                *loads.unloads.entry(model.clone()).or_default() += 1;
                loads.residual_sum += residual;
                loads.unaccounted = Some(*unaccounted);
                if let Some(version) = event.version {
                    loads.residual_last.insert((model, version), *residual);
                }
            }
            EventKind::Rollout { decision } => {
                *loads.rollout_decisions.entry((model, decision.action.as_str())).or_default() += 1;
            }
            EventKind::Resumed { paused, .. } => loads.pauses.entry(model).or_default().observe(*paused),
            EventKind::Exited { action, .. } => *loads.worker_exits.entry((model, action.clone())).or_default() += 1,
            EventKind::Transition { .. }
            | EventKind::DrainTimedOut { .. }
            | EventKind::Decision { .. }
            | EventKind::Paused { .. }
            | EventKind::Store { .. }
            | EventKind::Unpackaged { .. } => {}
        }
    }

    /// Notes that the event stream lagged and events were missed.
    pub fn missed_events(&self, n: u64) {
        self.loads.lock().unwrap_or_else(|e| e.into_inner()).events_missed += n;
    }

    /// The exposition text.
    pub fn render(&self, registry: &Registry, ready: bool, budget: &Budget) -> String {
        let mut out = String::with_capacity(16 * 1024);

        help(&mut out, "baton_ready", "gauge", "1 when the server is ready for traffic.");
        let _ = writeln!(out, "baton_ready {}", u8::from(ready));
        help(&mut out, "baton_inflight_requests", "gauge", "Inference requests being served now.");
        let _ = writeln!(out, "baton_inflight_requests {}", self.inflight.load(Ordering::Relaxed));

        let versions = self.versions.read().unwrap_or_else(|e| e.into_inner());
        let series = || {
            versions
                .iter()
                .flat_map(|(model, v)| v.iter().map(move |((version, role), m)| (model, version, role.as_str(), m)))
        };
        help(&mut out, "baton_inference_requests_total", "counter", "Inference requests that reached a version.");
        for (model, version, role, m) in series() {
            let _ = writeln!(
                out,
                "baton_inference_requests_total{{model=\"{}\",version=\"{version}\",role=\"{role}\"}} {}",
                escape(model),
                m.requests.load(Ordering::Relaxed)
            );
        }
        help(&mut out, "baton_inference_errors_total", "counter", "Failed inference requests by error kind.");
        for (model, version, role, m) in series() {
            for (kind, n) in m.errors.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let _ = writeln!(
                    out,
                    "baton_inference_errors_total{{model=\"{}\",version=\"{version}\",role=\"{role}\",kind=\"{kind}\"}} {n}",
                    escape(model)
                );
            }
        }
        for ((model, kind), n) in self.rejected.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "baton_inference_errors_total{{model=\"{}\",version=\"\",role=\"\",kind=\"{kind}\"}} {n}",
                escape(model)
            );
        }
        help(&mut out, "baton_inference_duration_seconds", "histogram", "Inference latency inside the server.");
        for (model, version, role, m) in series() {
            m.latency.render(
                &mut out,
                "baton_inference_duration_seconds",
                &format!("model=\"{}\",version=\"{version}\",role=\"{role}\"", escape(model)),
            );
        }
        drop(versions);
        self.render_admission(&mut out, registry, budget);
        self.connections.render(&mut out);

        let statuses = registry.statuses();
        let mut loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
        for s in statuses.iter() {
            loads.seed(&s.name);
        }
        help(&mut out, "baton_load_duration_seconds", "histogram", "Whole load transactions, request to end of drain.");
        for (model, h) in &loads.durations {
            h.render(&mut out, "baton_load_duration_seconds", &format!("model=\"{}\"", escape(model)));
        }
        help(&mut out, "baton_load_stage_duration_seconds", "histogram", "Each stage of loads, rollbacks and unloads.");
        for ((model, stage), h) in &loads.stages {
            let labels = format!("model=\"{}\",stage=\"{}\"", escape(model), stage.as_str());
            h.render(&mut out, "baton_load_stage_duration_seconds", &labels);
        }
        help(&mut out, "baton_load_failures_total", "counter", "Loads refused, by the stage that refused them.");
        for ((model, stage), n) in &loads.failures {
            let _ = writeln!(
                out,
                "baton_load_failures_total{{model=\"{}\",stage=\"{}\"}} {n}",
                escape(model),
                stage.as_str()
            );
        }
        help(
            &mut out,
            "baton_swap_pause_seconds",
            "histogram",
            "How long a swap under the resource policy left the model without a version, requests waiting.",
        );
        for (model, h) in &loads.pauses {
            h.render(&mut out, "baton_swap_pause_seconds", &format!("model=\"{}\"", escape(model)));
        }
        help(&mut out, "baton_rollbacks_total", "counter", "Rollbacks to a kept version.");
        for (model, n) in &loads.rollbacks {
            let _ = writeln!(out, "baton_rollbacks_total{{model=\"{}\"}} {n}", escape(model));
        }
        let loads_decisions = loads.rollout_decisions.clone();
        help(
            &mut out,
            "baton_worker_exits_total",
            "counter",
            "Versions whose worker process ended by itself, by what the server did.",
        );
        for ((model, action), n) in &loads.worker_exits {
            let (model, action) = (escape(model), escape(action));
            let _ = writeln!(out, "baton_worker_exits_total{{model=\"{model}\",action=\"{action}\"}} {n}");
        }
        help(&mut out, "baton_updates_total", "counter", "Versions loaded and committed, by kind of update and why.");
        for ((model, kind, why), n) in &loads.updates {
            let model = escape(model);
            let _ = writeln!(out, "baton_updates_total{{model=\"{model}\",update=\"{kind}\",reason=\"{why}\"}} {n}");
        }
        help(&mut out, "baton_unloads_total", "counter", "Versions freed.");
        for (model, n) in &loads.unloads {
            let _ = writeln!(out, "baton_unloads_total{{model=\"{}\"}} {n}", escape(model));
        }
        help(
            &mut out,
            "baton_memory_residual_bytes",
            "gauge",
            "Growth of the memory no live version accounts for, summed over every free since the first.",
        );
        let _ = writeln!(out, "baton_memory_residual_bytes {}", loads.residual_sum);
        if let Some(unaccounted) = loads.unaccounted {
            help(
                &mut out,
                "baton_memory_unaccounted_bytes",
                "gauge",
                "RSS after the last free minus the footprint of live versions.",
            );
            let _ = writeln!(out, "baton_memory_unaccounted_bytes {unaccounted}");
        }
        help(
            &mut out,
            "baton_unload_residual_bytes",
            "gauge",
            "What the swap cycle ending in this version's free left behind.",
        );
        for ((model, version), n) in &loads.residual_last {
            let _ =
                writeln!(out, "baton_unload_residual_bytes{{model=\"{}\",version=\"{version}\"}} {n}", escape(model));
        }
        help(&mut out, "baton_events_missed_total", "counter", "Registry events the metrics missed (stream lagged).");
        let _ = writeln!(out, "baton_events_missed_total {}", loads.events_missed);
        drop(loads);

        let stepped = baton_core::threads::step_aside::counts();
        help(
            &mut out,
            "baton_loader_step_asides_total",
            "counter",
            "Times a thread building or freeing a version stepped off the CPU, for waiting threads or to keep to its share while requests are served (--loader-step-aside; 0 without it).",
        );
        let _ = writeln!(out, "baton_loader_step_asides_total {}", stepped.steps);
        help(&mut out, "baton_loader_step_aside_seconds_total", "counter", "Time those threads spent stepped aside.");
        let _ = writeln!(out, "baton_loader_step_aside_seconds_total {:.6}", stepped.paused.as_secs_f64());
        help(
            &mut out,
            "baton_loader_step_asides_declined_total",
            "counter",
            &format!(
                "Times the thread would have stepped aside again but had stepped aside {} times its CPU time already, and kept running.",
                baton_core::threads::step_aside::MAX_PAUSED_PER_CPU
            ),
        );
        let _ = writeln!(out, "baton_loader_step_asides_declined_total {}", stepped.declined);
        help(
            &mut out,
            "baton_worker_timings_trimmed_total",
            "counter",
            "A worker's timings of its calls that claimed longer than the server waited for the answer, and were cut down to that wait in the rollout's latency sample.",
        );
        let _ = writeln!(
            out,
            "baton_worker_timings_trimmed_total {}",
            baton_core::run::executor::timing::trimmed_reports()
        );

        help(&mut out, "baton_model_active_version", "gauge", "The version serving requests that name none.");
        for s in statuses.iter() {
            if let Some(v) = s.serving {
                let _ = writeln!(out, "baton_model_active_version{{model=\"{}\"}} {v}", escape(&s.name));
            }
        }
        help(
            &mut out,
            "baton_model_load_in_progress",
            "gauge",
            "1 while a load, rollback or unload of the model runs; mute latency alerts on it.",
        );
        for s in statuses.iter() {
            let _ = writeln!(out, "baton_model_load_in_progress{{model=\"{}\"}} {}", escape(&s.name), u8::from(s.busy));
        }
        help(
            &mut out,
            "baton_model_operation_in_progress",
            "gauge",
            "1 while a load, rollback, unload or rollout of the model is in progress; mute alerts on it.",
        );
        for s in statuses.iter() {
            let rolling = s.rollout.as_ref().is_some_and(|r| r.phase.in_progress());
            let _ = writeln!(
                out,
                "baton_model_operation_in_progress{{model=\"{}\"}} {}",
                escape(&s.name),
                u8::from(s.busy || rolling)
            );
        }
        rollouts::render(&mut out, &statuses, &loads_decisions);
        help(&mut out, "baton_model_state", "gauge", "1 for the state the model is in.");
        for s in statuses.iter() {
            let _ =
                writeln!(out, "baton_model_state{{model=\"{}\",state=\"{}\"}} 1", escape(&s.name), s.state.as_str());
        }
        help(&mut out, "baton_model_live_versions", "gauge", "Versions in memory, including ones being drained.");
        for s in statuses.iter() {
            let _ = writeln!(out, "baton_model_live_versions{{model=\"{}\"}} {}", escape(&s.name), s.live.len());
        }
        help(&mut out, "baton_version_bytes_held", "gauge", "Memory a live version holds, measured as it loaded.");
        for s in statuses.iter() {
            for v in &s.live {
                let _ = writeln!(
                    out,
                    "baton_version_bytes_held{{model=\"{}\",version=\"{}\",twin=\"{}\"}} {}",
                    escape(&s.name),
                    v.version,
                    v.twin,
                    v.bytes_held
                );
            }
        }
        help(
            &mut out,
            "baton_version_memory_bytes",
            "gauge",
            "A live version's memory by part: its weights, the part of them shared with another live version, \
             and what its sessions add.",
        );
        for s in statuses.iter() {
            for v in &s.live {
                let m = &v.memory;
                for (part, bytes) in
                    [("weights", m.weights), ("shared", m.shared), ("session_overhead", m.session_overhead)]
                {
                    let _ = writeln!(
                        out,
                        "baton_version_memory_bytes{{model=\"{}\",version=\"{}\",twin=\"{}\",part=\"{part}\",update=\"{}\"}} {bytes}",
                        escape(&s.name),
                        v.version,
                        v.twin,
                        v.update.as_str()
                    );
                }
            }
        }
        workers::render(&mut out, &statuses);
        out
    }
}

impl Metrics {
    /// Admission control: what was shed and what expired, what each version
    /// holds, and the request memory budget.
    fn render_admission(&self, out: &mut String, registry: &Registry, budget: &Budget) {
        help(out, "baton_requests_shed_total", "counter", "Requests refused at once by admission control, by reason.");
        for ((model, reason), n) in self.shed.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "baton_requests_shed_total{{model=\"{}\",reason=\"{reason}\"}} {n}", escape(model));
        }
        help(
            out,
            "baton_deadline_exceeded_total",
            "counter",
            "Requests whose deadline passed, by where they were then (arrival, queued: never run, running).",
        );
        for ((model, stage), n) in self.expired.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "baton_deadline_exceeded_total{{model=\"{}\",stage=\"{stage}\"}} {n}", escape(model));
        }
        help(
            out,
            "baton_outcomes_total",
            "counter",
            "Business outcomes posted for rollout answers: accepted, duplicate (posted before) or unknown (no rollout \
             in progress issued the id).",
        );
        for ((model, result), n) in self.outcomes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "baton_outcomes_total{{model=\"{}\",result=\"{result}\"}} {n}", escape(model));
        }
        let snapshot = registry.snapshot();
        // Every version of each route, and a rollout's twin of the stable
        // version (same number, a second instance): `twin` tells them apart.
        let versions = || {
            snapshot.models().iter().flat_map(|(model, route)| {
                let twin = route.rollout.as_ref().and_then(|r| r.twin.as_ref());
                route.versions().map(move |v| (model, v, false)).chain(twin.map(move |t| (model, t, true)))
            })
        };
        help(out, "baton_queue_depth", "gauge", "Requests waiting for a session thread of the version.");
        for (model, v, twin) in versions() {
            let load = v.executor().load();
            let labels = format!("model=\"{}\",version=\"{}\",twin=\"{twin}\"", escape(model), v.number());
            let _ = writeln!(out, "baton_queue_depth{{{labels}}} {}", load.queued);
        }
        help(out, "baton_version_in_flight", "gauge", "Requests a version holds, waiting and running.");
        for (model, v, twin) in versions() {
            let load = v.executor().load();
            let labels = format!("model=\"{}\",version=\"{}\",twin=\"{twin}\"", escape(model), v.number());
            let _ = writeln!(out, "baton_version_in_flight{{{labels}}} {}", load.queued + load.running);
        }
        help(out, "baton_request_memory_bytes", "gauge", "Bytes requests hold now: bodies, tensors and outputs.");
        let _ = writeln!(out, "baton_request_memory_bytes {}", budget.used());
        help(out, "baton_request_memory_budget_bytes", "gauge", "The most bytes requests may hold at once.");
        let _ = writeln!(out, "baton_request_memory_budget_bytes {}", budget.capacity());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(30));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(100));
        let mut out = String::new();
        h.render(&mut out, "x", "m=\"a\"");
        assert!(out.contains("x_bucket{m=\"a\",le=\"0.00005\"} 1"), "{out}");
        assert!(out.contains("x_bucket{m=\"a\",le=\"0.005\"} 2"), "{out}");
        assert!(out.contains("x_bucket{m=\"a\",le=\"30\"} 2"), "{out}");
        assert!(out.contains("x_bucket{m=\"a\",le=\"+Inf\"} 3"), "{out}");
        assert!(out.contains("x_count{m=\"a\"} 3"), "{out}");
    }

    #[test]
    fn each_model_version_has_one_series() {
        let metrics = Metrics::default();
        let a1 = metrics.version("a", 1, Role::Stable);
        assert!(Arc::ptr_eq(&a1, &metrics.version("a", 1, Role::Stable)));
        assert!(!Arc::ptr_eq(&a1, &metrics.version("a", 2, Role::Stable)));
        assert!(!Arc::ptr_eq(&a1, &metrics.version("b", 1, Role::Stable)));
        assert!(!Arc::ptr_eq(&a1, &metrics.version("a", 1, Role::Candidate)));
        a1.record(Duration::from_millis(2), 3, None);
        metrics.version("a", 1, Role::Candidate).record(Duration::from_millis(2), 2, None);
        metrics.version("b", 1, Role::Stable).record(Duration::from_millis(1), 1, Some("invalid_input"));
        assert_eq!(metrics.version_stats("a", 1).inferences, 5);
        assert_eq!(metrics.version_stats("a", 1).failures, 0);
        assert_eq!(metrics.version_stats("b", 1).failures, 1);
        assert_eq!(metrics.version_stats("a", 2).successes, 0);
        assert_eq!(metrics.version_stats("c", 1).successes, 0);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
