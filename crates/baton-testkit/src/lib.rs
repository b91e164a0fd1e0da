//! Test helpers for baton: ONNX models generated in code, model
//! repositories with every kind of damage, a fake backend whose loads can be
//! held, a registry wired to the real ONNX Runtime backend, and ONNX Runtime
//! run directly, to compare baton's answers with ([`encoder::reference`]),
//! a real etcd for cluster mode ([`etcd::Etcd`]), and baton's container
//! image run under podman ([`podman`]).
//!
//! Nothing here is downloaded: every model a test uses is written by
//! [`onnx::encode_mlp`], [`encoder::Encoder`] or
//! [`baton_onnx::writer::GraphWriter`] from weights generated from a seed.

pub mod certs;
pub mod encoder;
pub mod etcd;
pub mod fake;
pub mod fuzz;
pub mod podman;
pub mod prometheus;
pub mod repo;
pub mod s3;
pub mod server;
pub mod signals;
pub mod text;

/// The ONNX model generator, re-exported for tests.
pub use baton_onnx::mlp as onnx;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_core::files::source::LocalRepository;
use baton_core::registry::events::{Event, EventReceiver, State};
use baton_core::registry::{Registry, RegistryConfig};
use baton_core::run::backend::Backend;

/// A registry over a local repository with the real ONNX Runtime backend
/// and the fake one. Panics with the runtime's own instructions when ONNX
/// Runtime is missing, so a test never silently skips.
pub fn registry(root: &Path) -> Registry {
    let onnx = baton_onnx::OnnxBackend::new().unwrap_or_else(|e| panic!("ONNX Runtime is needed for this test: {e}"));
    registry_with(root, vec![Arc::new(onnx), Arc::new(fake::FakeBackend::new())])
}

/// A registry over a local repository with the given backends.
pub fn registry_with(root: &Path, backends: Vec<Arc<dyn Backend>>) -> Registry {
    registry_configured(root, backends, RegistryConfig::default())
}

/// A registry over a local repository with the given backends and settings.
pub fn registry_configured(root: &Path, backends: Vec<Arc<dyn Backend>>, config: RegistryConfig) -> Registry {
    // Session threads start at the test thread's priority, not the loader's.
    baton_core::run::executor::start_spawner();
    Registry::new(Arc::new(LocalRepository::new(root)), backends, config)
}

/// Receives events until one matches, or panics after `limit`. The limit is
/// a safety net against a hung test, not a timing assertion.
pub fn wait_for_event(rx: &mut EventReceiver, limit: Duration, mut matches: impl FnMut(&Event) -> bool) -> Event {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a test runtime");
    runtime.block_on(async {
        tokio::time::timeout(limit, async {
            loop {
                match rx.recv().await {
                    Ok(event) if matches(&event) => return event,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(e) => panic!("event stream: {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no matching event within {limit:?}"))
    })
}

/// The states a model went through, read from its transition events.
pub fn states(events: &[Event]) -> Vec<State> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            baton_core::registry::events::EventKind::Transition { to, .. } => Some(*to),
            _ => None,
        })
        .collect()
}

/// Every event received so far.
pub fn drain_events(rx: &mut EventReceiver) -> Vec<Event> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// Runs one MLP inference (`input` → `output`, FP32) through a snapshot;
/// returns the version that answered and the outputs.
pub fn infer_mlp(
    snapshot: &baton_core::registry::routing::Routing,
    model: &str,
    input: &[f32],
    batch: usize,
) -> Result<(u64, Vec<f32>), baton_core::run::error::InferError> {
    let width = input.len() / batch.max(1);
    let tensor = baton_core::tensors::tensor::Tensor::from_f32("input", vec![batch as i64, width as i64], input);
    let answer = snapshot.infer(model, None, &[tensor])?;
    let output = answer.outputs.iter().find(|t| t.name == "output").and_then(|t| t.to_f32()).expect("an FP32 output");
    Ok((answer.version, output))
}

/// Largest absolute difference between two equally long slices.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// A program a test needs from Debian's packages: `/usr/bin/NAME`, or NAME
/// on the PATH. Panics saying how to install it when it is missing.
pub(crate) fn installed(name: &str) -> std::path::PathBuf {
    let debian = Path::new("/usr/bin").join(name);
    if debian.is_file() {
        return debian;
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| p.is_file()));
    on_path.unwrap_or_else(|| {
        panic!("{name} is needed for this test but was not found: run `bash scripts/setup-packages.sh` to install it")
    })
}
