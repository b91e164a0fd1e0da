//! The drill's outputs: the JSON report with everything, the table on the
//! terminal, and the SVG chart.

pub mod rollout_table;
pub mod svg;
pub mod table;

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use super::analyze::{Analysis, Run};

/// Every request, column by column (compact for large runs).
#[derive(Serialize)]
pub struct Records<'a> {
    /// Start, ms since the load started (sent, or scheduled in open loop).
    pub start_ms: Vec<f64>,
    /// Latency, ms.
    pub latency_ms: Vec<f64>,
    /// Index into `versions`; 0: none.
    pub version: Vec<u32>,
    /// 0: success, else 1 + index into `errors`.
    pub error: Vec<u32>,
    /// The worker (connection).
    pub worker: Vec<u32>,
    /// The role the answer named in a rollout: 0 none, 1 stable, 2
    /// candidate, 3 previous, 4 another.
    pub role: Vec<u8>,
    /// The version table.
    pub versions: &'a [String],
    /// The error table: (kind, message).
    pub errors: &'a [(String, String)],
}

impl<'a> Records<'a> {
    /// The columns of a run's records.
    pub fn of(run: &'a Run) -> Records<'a> {
        let r = &run.records;
        let round = |ns: u64| (ns as f64 / 1e3).round() / 1e3;
        Records {
            start_ms: r.iter().map(|r| round(r.start)).collect(),
            latency_ms: r.iter().map(|r| round(r.latency)).collect(),
            version: r.iter().map(|r| r.version).collect(),
            error: r.iter().map(|r| r.error).collect(),
            worker: r.iter().map(|r| r.worker).collect(),
            role: r.iter().map(|r| r.role).collect(),
            versions: &run.versions,
            errors: &run.errors,
        }
    }
}

/// The whole JSON report.
#[derive(Serialize)]
pub struct Report<'a> {
    /// `baton drill`.
    pub tool: &'static str,
    /// baton's version.
    pub tool_version: &'static str,
    /// When the load started, seconds since the Unix epoch.
    pub started_unix_s: f64,
    /// The options, as used.
    pub config: Value,
    /// How the load generator kept up.
    pub client: Value,
    /// Everything concluded.
    #[serde(flatten)]
    pub analysis: &'a Analysis,
    /// Every request, with --records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<Records<'a>>,
}

/// Writes `text` to `path`, creating its directory.
pub fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
