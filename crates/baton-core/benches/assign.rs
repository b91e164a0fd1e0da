//! What picking a request's side of a rollout costs: the route a request
//! takes through a table with a canary rollout, with and without a sticky
//! key, and the sticky bucket of a key alone; and what the outcome id an
//! answer carries costs to issue (its HMAC-SHA256 code) and to check when
//! it is posted back.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use baton_core::files::manifest::Manifest;
use baton_core::files::rollout_spec::Mode;
use baton_core::files::spec::ModelSpec;
use baton_core::registry::routing::{ModelRoute, Routing};
use baton_core::rollout::window::Observations;
use baton_core::rollout::{CopyGate, Rollout, assign};
use baton_core::run::backend::{BackendError, Model, Weight, WeightsError};
use baton_core::run::version::{Version, VersionParts};
use baton_core::run::warmed::Warmed;
use baton_core::tensors::signature::Signature;
use baton_core::tensors::tensor::Tensor;
use criterion::{Criterion, criterion_group, criterion_main};

/// An engine that is never run: routing only needs versions to exist.
#[derive(Default)]
struct Idle {
    signature: Signature,
}

impl Model for Idle {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn visit_weights(&self, _: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        Ok(())
    }

    fn infer(&self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        Err(BackendError::new("not_run", "the benchmark engine runs nothing"))
    }
}

fn version(number: u64) -> Arc<Version> {
    let parts = VersionParts {
        model: "m".to_owned(),
        number,
        spec: Arc::new(ModelSpec::parse("").expect("an empty model.toml parses")),
        manifest: Manifest::default(),
        warmup: Vec::new(),
        warmed: Warmed::default(),
        bytes_held: 0,
        engine: Box::new(Idle::default()),
        twin: false,
        heap: None,
    };
    Arc::new(Version::new(parts, None))
}

/// A table routing model `m`: version 1 stable, version 2 a canary at 5%.
fn table() -> Routing {
    let mut route = ModelRoute::new(version(1), Vec::new());
    route.rollout = Some(Rollout {
        candidate: version(2),
        mode: Mode::Canary,
        weight: 500,
        paired: true,
        salt: assign::salt("m", 2),
        id: 1,
        outcomes: Arc::new(baton_core::rollout::outcome::OutcomeKey::new(b"bench").outcomes("m", 1)),
        observations: Arc::new(Observations::default()),
        copies: Arc::new(CopyGate::new(64)),
        shadow: None,
        baseline: None,
        twin: None,
    });
    Routing::new(1, BTreeMap::from([("m".to_owned(), route)]))
}

fn route(c: &mut Criterion) {
    let table = table();
    let key = b"user-0123456789a";
    c.bench_function("route/canary/keyed", |b| {
        b.iter(|| table.route(black_box("m"), None, Some(black_box(&key[..]))).map(|r| r.role))
    });
    c.bench_function("route/canary/unkeyed", |b| b.iter(|| table.route(black_box("m"), None, None).map(|r| r.role)));
}

fn bucket(c: &mut Criterion) {
    let short = [7u8; 16];
    let long = [7u8; 64];
    let salt = assign::salt("m", 2);
    c.bench_function("bucket/16_bytes", |b| b.iter(|| assign::bucket(salt, black_box(&short))));
    c.bench_function("bucket/64_bytes", |b| b.iter(|| assign::bucket(salt, black_box(&long))));
}

fn outcome_id(c: &mut Criterion) {
    let outcomes = baton_core::rollout::outcome::OutcomeKey::new(b"a benchmark's key").outcomes("m", 1);
    let role = baton_core::rollout::Role::Candidate;
    c.bench_function("outcome_id/issue", |b| b.iter(|| outcomes.issue(black_box(role))));
    let id = outcomes.issue(role).expect("an id");
    c.bench_function("outcome_id/parse", |b| b.iter(|| outcomes.parse(black_box(&id)).is_ok()));
}

criterion_group!(benches, route, bucket, outcome_id);
criterion_main!(benches);
