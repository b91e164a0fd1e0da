//! Where the metric guards' numbers come from: the operator's monitoring
//! system (Prometheus, in baton's server), behind a trait so that the core
//! knows no protocol. Read at the end of each window, one query per guard
//! and side, all at once, each bounded by the source's own timeout.

use super::window::MetricReading;
use crate::files::rollout_spec::Guards;

/// Answers a metric guard's query with one number.
pub trait MetricSource: Send + Sync + std::fmt::Debug {
    /// The one number `query` gives now, or a sentence saying why there is
    /// none: the source did not answer, the query failed, it gave no series
    /// or several, or a value that is not a number. Blocks for at most the
    /// source's timeout.
    fn read(&self, query: &str) -> Result<f64, String>;
}

/// The sides a window's queries are read for.
#[derive(Clone, Copy, Debug)]
pub struct Sides<'a> {
    /// The model.
    pub model: &'a str,
    /// The stable version; `None` during the watch after promotion, when
    /// the replaced version answers nobody and its recorded value stands in.
    pub stable: Option<u64>,
    /// The candidate.
    pub candidate: u64,
    /// The window's length, in milliseconds (`{{window}}`).
    pub window_ms: u64,
}

/// Reads every metric guard of `guards` for both sides, the queries in
/// parallel so that the window waits for one timeout at most. Without a
/// source, each reading says that none is configured.
pub fn read(source: Option<&dyn MetricSource>, guards: &Guards, sides: Sides<'_>) -> Vec<MetricReading> {
    let query = |guard: &crate::files::rollout_spec::MetricGuard, version: u64| -> Result<f64, String> {
        let Some(source) = source else {
            return Err("this server has no Prometheus to ask (start it with --prometheus-url)".to_owned());
        };
        source.read(&guard.query_for(sides.model, version, sides.window_ms)?)
    };
    std::thread::scope(|scope| {
        let started: Vec<_> = guards
            .metrics
            .iter()
            .map(|guard| {
                let stable = sides.stable.map(|v| scope.spawn(move || query(guard, v)));
                let candidate = scope.spawn(move || query(guard, sides.candidate));
                (guard, stable, candidate)
            })
            .collect();
        started
            .into_iter()
            .map(|(guard, stable, candidate)| {
                let joined = |handle: std::thread::ScopedJoinHandle<'_, Result<f64, String>>| {
                    handle.join().unwrap_or_else(|_| Err("the query's thread failed".to_owned()))
                };
                let stable = stable.map(joined);
                let candidate = joined(candidate);
                let mut problems = Vec::new();
                if let Some(Err(e)) = &stable {
                    problems.push(format!("stable version {}: {e}", sides.stable.unwrap_or_default()));
                }
                if let Err(e) = &candidate {
                    problems.push(format!("candidate version {}: {e}", sides.candidate));
                }
                MetricReading {
                    name: guard.name.clone(),
                    stable: stable.and_then(Result::ok),
                    candidate: candidate.ok(),
                    problem: (!problems.is_empty()).then(|| problems.join("; ")),
                }
            })
            .collect()
    })
}
