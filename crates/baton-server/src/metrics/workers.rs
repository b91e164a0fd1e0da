//! The worker families of `/metrics`: what each live version's worker
//! process holds, so that a dashboard draws memory by version and by
//! worker (versions in the server's own process have no series).

use std::fmt::Write;

use super::{escape, help};

/// Each worker's resident memory, labelled with the model, the version it
/// runs and whether it is a rollout's twin (the twin runs the stable
/// number in a second worker). No pid label: a worker that restarts keeps
/// its series.
pub(super) fn render(out: &mut String, statuses: &[baton_core::registry::ModelStatus]) {
    help(
        out,
        "baton_worker_resident_bytes",
        "gauge",
        "Resident memory of the worker process a live version runs in, read at scrape time.",
    );
    for s in statuses {
        for v in &s.live {
            let Some(rss) = v.worker.as_ref().filter(|_| v.alive).and_then(|w| w.rss) else {
                continue;
            };
            let _ = writeln!(
                out,
                "baton_worker_resident_bytes{{model=\"{}\",version=\"{}\",twin=\"{}\"}} {rss}",
                escape(&s.name),
                v.version,
                v.twin
            );
        }
    }
}
