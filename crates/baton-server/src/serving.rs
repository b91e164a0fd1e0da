//! The serving path both front ends share: resolve the version a request
//! names in its snapshot, check the batch, reserve memory for the outputs,
//! queue it for the version's session threads within its deadline, count.
//! Protocol front ends only read, decode and encode around it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::registry::routing::{Routing, Snapshot};
use baton_core::rollout::{Role, Rollout};
use baton_core::run::error::InferError;
use baton_core::run::version::Version;
use baton_core::tensors::tensor::Tensor;

use crate::app::App;
use crate::budget::Reservation;
use crate::error::{Class, ServeError};

/// `max_batch_size` when `model.toml` sets none and the model batches.
pub const DEFAULT_MAX_BATCH_SIZE: usize = 1024;

/// Parses a version number as a client writes it: a path segment, a gRPC
/// field or a load parameter.
pub fn parse_version(text: &str) -> Result<u64, ServeError> {
    text.parse().map_err(|_| ServeError::bad_request("invalid_version", format!("'{text}' is not a version number")))
}

/// The largest batch a version accepts; 0 when the model does not batch.
pub fn max_batch_size(version: &Version) -> usize {
    if version.signature().is_batched() { version.spec().max_batch_size.unwrap_or(DEFAULT_MAX_BATCH_SIZE) } else { 0 }
}

/// The platform and backend names Triton clients expect.
pub fn platform(version: &Version) -> (&'static str, String) {
    match version.spec().backend.as_str() {
        "onnx" => ("onnxruntime_onnx", "onnxruntime".to_owned()),
        other => ("baton", other.to_owned()),
    }
}

/// The version a request names, or why it cannot be served: not found for
/// a model or version baton does not know, unavailable for one that is not
/// loaded yet.
pub fn resolve<'a>(
    app: &App,
    snapshot: &'a Routing,
    model: &str,
    version: Option<u64>,
) -> Result<&'a Arc<Version>, ServeError> {
    match snapshot.resolve(model, version) {
        Ok(v) => Ok(v),
        Err(InferError::ModelNotFound(_)) => Err(not_serving(app, model)),
        Err(e) => Err(e.into()),
    }
}

/// The error for a model with no route: known but not (yet) serving is
/// unavailable, unknown is not found.
pub fn not_serving(app: &App, model: &str) -> ServeError {
    let state = app.registry.status(model).map(|s| s.state.as_str());
    let known = state.is_some() || app.registry.source().spec(model).is_ok();
    if known {
        let state = state.unwrap_or("IDLE");
        ServeError::new(Class::Unavailable, "model_not_ready", format!("model '{model}' is not ready (state {state})"))
    } else {
        // The models served, so that a misspelt name finds its right one.
        let served: Vec<String> = app.registry.snapshot().models().keys().cloned().collect();
        let listed = baton_core::tensors::signature::names(&served);
        ServeError::new(
            Class::NotFound,
            "model_not_found",
            format!("unknown model '{model}'; the models served are {listed}"),
        )
    }
}

/// The longest a request waits for a model paused by a swap under the
/// resource policy, counted from its arrival, when its deadline is later
/// or unset: many times one load of a large model (a resource swap of the
/// 480 MiB benchmark MLP paused its model 1.5–1.8 s with warmup off).
pub const PAUSE_WAIT: Duration = Duration::from_secs(30);

/// The routing table a request is served from: the current one, or, while
/// its model is paused by a swap under the resource policy, the one that
/// ends the pause, awaited without holding an async worker, up to the
/// request's deadline or [`PAUSE_WAIT`] after its arrival, whichever comes
/// first. A request the pause outlasts is refused as overloaded (reason
/// `model_paused`): it never reached a version, and another server may
/// answer it. Counted as shed; the caller counts the error.
pub async fn snapshot(
    app: &App,
    model: &str,
    arrived: Instant,
    deadline: Option<Instant>,
) -> Result<Snapshot, ServeError> {
    let snapshot = app.registry.snapshot();
    if snapshot.paused(model).is_none() {
        return Ok(snapshot);
    }
    drop(snapshot);
    let cap = arrived + PAUSE_WAIT;
    let until = deadline.map_or(cap, |d| d.min(cap));
    match tokio::time::timeout_at(until.into(), app.registry.snapshot_serving(model)).await {
        Ok(snapshot) => Ok(snapshot),
        Err(_) => {
            app.metrics.shed(model, "model_paused");
            Err(ServeError::overloaded(format!(
                "model '{model}' is paused while a new version replaces the old one ([policy] swap = \"resource\") \
                 and did not resume within this request's wait; retry later or elsewhere"
            )))
        }
    }
}

/// The number of inferences a request asks for: its batch size when the
/// model batches (`max` > 0), else 1.
fn batch_size(max: usize, inputs: &[Tensor]) -> u64 {
    if max == 0 {
        return 1;
    }
    inputs.first().and_then(|t| t.shape.first()).map_or(1, |&b| u64::try_from(b).unwrap_or(0))
}

/// What a request carries through the serving path: when it must be
/// answered by, and the request memory it holds (its body, then its
/// tensors, then room for its outputs). The memory is given back when the
/// ticket is dropped, after the answer is encoded.
pub struct Ticket {
    /// The deadline; `None` when neither the client nor the server sets one.
    pub deadline: Option<Instant>,
    /// The request's bytes in the budget.
    pub memory: Reservation,
}

impl Ticket {
    /// A ticket holding no memory yet.
    pub fn new(app: &App, deadline: Option<Instant>) -> Ticket {
        Ticket { deadline, memory: app.budget.empty() }
    }

    /// Reserves `bytes` more for `model`'s request, waiting briefly for
    /// room; a refusal for want of room is counted as shed
    /// (`memory_budget`). The caller counts the error.
    pub async fn reserve(&mut self, app: &App, model: &str, bytes: u64) -> Result<(), ServeError> {
        let until = crate::budget::wait_until(self.deadline);
        self.memory.grow(bytes, until).await.inspect_err(|e| {
            if e.class == Class::Overloaded {
                app.metrics.shed(model, "memory_budget");
            }
        })
    }
}

/// Work on a request's bytes above this size — decoding a body, encoding an
/// answer — runs on tokio's blocking pool rather than on an async worker,
/// which would answer nothing else meanwhile. Below it the hand-off would cost more
/// than the work.
pub const INLINE_WORK_BYTES: usize = 1 << 20;

/// Runs `work` on `bytes` of a request: inline when they are few, else on
/// the blocking pool (see [`INLINE_WORK_BYTES`]), as many at once as there
/// are CPUs: the work is all CPU, so more at once would not finish sooner,
/// and each holds the working memory of its decoder or encoder meanwhile.
pub async fn work_on<T: Send + 'static>(bytes: usize, work: impl FnOnce() -> T + Send + 'static) -> T {
    if bytes < INLINE_WORK_BYTES {
        return work();
    }
    static LARGE_WORK: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let permits = LARGE_WORK.get_or_init(|| tokio::sync::Semaphore::new(cpus));
    // The semaphore is never closed.
    let _permit = permits.acquire().await.ok();
    blocking(work).await
}

/// Runs blocking work (file I/O, a large decode) on tokio's blocking pool.
/// Work that panics panics the caller's task too, as it would inline.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The bytes of the decoded tensors of a request.
pub fn tensor_bytes(tensors: &[Tensor]) -> u64 {
    tensors.iter().map(|t| t.data_bytes() as u64).fold(0, u64::saturating_add)
}

/// The bytes the outputs of `rows` rows will take, for outputs whose size
/// the signature fixes (every dimension but the batch); others count 0.
fn output_bytes(target: &Version, batched: bool, rows: u64) -> u64 {
    let one = |spec: &baton_core::tensors::signature::TensorSpec| -> Option<u64> {
        let dims = if batched { spec.shape.get(1..)? } else { &spec.shape[..] };
        let per_row = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
        let size = spec.datatype.size()? as u64;
        per_row.checked_mul(size)?.checked_mul(if batched { rows } else { 1 })
    };
    target.signature().outputs.iter().filter_map(one).fold(0, u64::saturating_add)
}

/// The name of the HTTP header and gRPC metadata key that carries a
/// request's sticky key, which keeps it on one side of a rollout.
pub const STICKY_KEY_HEADER: &str = "baton-sticky-key";

/// The request parameter that carries a sticky key, for clients that set
/// parameters more easily than headers. A header wins over it.
pub const STICKY_KEY_PARAMETER: &str = "baton_sticky_key";

/// The HTTP response header, and the response parameter, naming the role
/// of the version that answered: `stable`, `candidate` or `previous`.
pub const ROLE_HEADER: &str = "baton-role";

/// The HTTP response header, and gRPC response metadata, naming the
/// version that answered, as the body's `model_version` does: for proxies
/// and access logs, which do not read bodies.
pub const VERSION_HEADER: &str = "baton-model-version";

/// The response parameter naming the role of the version that answered.
pub const ROLE_PARAMETER: &str = "baton_role";

/// The response parameter, and HTTP header, carrying the outcome id of an
/// answer given while its model's rollout is in progress: the id a client
/// posts a click, a conversion or a value against later
/// (`POST /baton/v1/models/{model}/outcomes`).
pub const OUTCOME_ID_PARAMETER: &str = "baton_outcome_id";

/// The HTTP header carrying the outcome id.
pub const OUTCOME_ID_HEADER: &str = "baton-outcome-id";

/// Where a request goes, resolved once from its snapshot: the version, its
/// batch limit, its role, and the rollout it takes part in.
#[derive(Clone)]
pub struct Target {
    /// The version that answers.
    pub version: Arc<Version>,
    /// Its largest batch; 0 when it does not batch.
    pub max_batch: usize,
    /// The role it answers in.
    pub role: Role,
    /// The side of the rollout's windows it counts on (see
    /// [`baton_core::registry::routing::Routed::side`]).
    pub side: Role,
    /// The rollout the request takes part in, if its model has one.
    pub rollout: Option<Rollout>,
    /// Where a copy of the request goes to be compared, and in which role.
    pub compare: Option<(Arc<Version>, Role)>,
}

impl Target {
    /// A new outcome id for the answer this request got, when its model has
    /// a rollout in progress and the answer is one of its sides'.
    pub fn outcome_id(&self) -> Option<String> {
        if self.role == Role::Previous {
            return None;
        }
        self.rollout.as_ref()?.outcomes.issue(self.side)
    }
}

/// The version a request will be queued on, resolved before its tensors
/// are decoded so that they are checked against its signature and batch
/// limit first: a request the model cannot take is refused before any
/// memory is allocated for its tensors. A request that names no version is
/// assigned a side of a rollout here, by its sticky `key` if it has one.
/// The caller counts the error.
pub fn target_of(
    app: &App,
    snapshot: &Routing,
    model: &str,
    version: Option<u64>,
    key: Option<&[u8]>,
) -> Result<Target, ServeError> {
    let routed = match snapshot.route(model, version, key) {
        Ok(routed) => routed,
        Err(InferError::ModelNotFound(_)) => return Err(not_serving(app, model)),
        Err(e) => return Err(e.into()),
    };
    Ok(Target {
        max_batch: max_batch_size(routed.version),
        version: Arc::clone(routed.version),
        role: routed.role,
        side: routed.side,
        rollout: routed.rollout.cloned(),
        compare: routed.compare.map(|c| (Arc::clone(c.other), c.role)),
    })
}

/// Counts a request that reached `target` but whose inputs it cannot take
/// as one of the version's failures, as Triton's statistics count it, and
/// gives the error back.
pub fn refused_by(app: &App, model: &str, target: &Target, arrived: Instant, e: ServeError) -> ServeError {
    app.metrics.version(model, target.version.number(), target.role).record(arrived.elapsed(), 0, Some(e.kind));
    e
}

/// Refuses a request at once, before its body is read, when the version it
/// names takes no more now. A hint that saves reading a body only to shed
/// it; admission itself is decided when the request is queued. Counted as
/// shed (`version_full`); the caller counts the error.
pub fn precheck(app: &App, model: &str, version: Option<u64>) -> Result<(), ServeError> {
    let snapshot = app.registry.snapshot();
    let Ok(target) = snapshot.resolve(model, version) else { return Ok(()) };
    if target.executor().would_admit() {
        return Ok(());
    }
    app.metrics.shed(model, "version_full");
    Err(ServeError::overloaded(format!(
        "model '{model}' version {} holds as many requests as it takes; retry later or elsewhere",
        target.number()
    )))
}

/// Runs one inference on `target`, the version the request's snapshot
/// routed it to (see [`target_of`]), whose `max` batch size its inputs
/// were checked against before they were decoded; counts it in the
/// metrics either way.
///
/// The request is queued for one of the version's session threads and
/// awaited; the async worker never runs it and never waits for a session.
/// It is refused at once when the version holds as many requests as its
/// `[admission]` bounds allow, or when its deadline has passed; a request
/// whose deadline passes while it waits is answered then and taken out of
/// the queue, never run.
pub async fn infer(
    app: &App,
    model: &str,
    routed: &Target,
    inputs: Vec<Tensor>,
    ticket: &mut Ticket,
) -> Result<Vec<Tensor>, ServeError> {
    let (target, max) = (&*routed.version, routed.max_batch);
    let rows = batch_size(max, &inputs);
    ticket
        .reserve(app, model, output_bytes(target, max > 0, rows))
        .await
        .inspect_err(|e| app.metrics.rejected(model, e.kind))?;
    let series = app.metrics.version(model, target.number(), routed.role);
    // The copy for a comparison is made before the inputs go to the engine.
    let copied = routed.compare.as_ref().map(|_| inputs.clone());
    let started = Instant::now();
    let mut pending = match target.submit(inputs, ticket.deadline) {
        Ok(pending) => pending,
        Err(e) => {
            let e = refused(app, model, &series, started, rows, e);
            let _ = observe(routed, None, Some(&e));
            return Err(e);
        }
    };
    let (outcome, ran) = match ticket.deadline {
        None => {
            let answer = (&mut pending).await;
            (answer, pending.engine_time())
        }
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), &mut pending).await {
            Ok(answer) => (answer, pending.engine_time()),
            // The answer is not awaited any more; a request still queued
            // leaves the queue now and is never run.
            Err(_) => (Err(InferError::DeadlineExceeded { at: pending.withdraw() }), None),
        },
    };
    if let Err(InferError::DeadlineExceeded { at }) = &outcome {
        app.metrics.expired(model, at.as_str());
    }
    let outcome = outcome.map_err(ServeError::from);
    series.record(started.elapsed(), rows, outcome.as_ref().err().map(|e| e.kind));
    let failed = observe(routed, ran, outcome.as_ref().err());
    // A request the version failed is copied too, so that the other side
    // has a sample to hold the failure against.
    if let Some(inputs) = copied.filter(|_| outcome.is_ok() || failed) {
        compare(routed, inputs, outcome.as_deref().ok());
    }
    outcome
}

/// Records a request in its rollout's window, as its side's: the CPU time
/// its engine run took (`ran`; none when it never ran), and whether it
/// failed for a reason of the server's (a malformed request is not the
/// version's failure). Returns whether it did.
fn observe(routed: &Target, ran: Option<std::time::Duration>, error: Option<&ServeError>) -> bool {
    let failed = error.is_some_and(|e| !matches!(e.class, Class::BadRequest | Class::NotFound | Class::TooLarge));
    if let Some(rollout) = &routed.rollout {
        rollout.observations.record(routed.side, ran, failed);
    }
    failed
}

/// Starts the copy of an answered request on the other side of its
/// rollout, from a task of its own, so that the answer goes back first: a
/// shadow copy goes to the rollout's lowered runner; a paired copy takes a
/// free instance of the other version, or is dropped and counted when it
/// has none. It never runs on an async worker.
fn compare(routed: &Target, inputs: Vec<Tensor>, outputs: Option<&[Tensor]>) {
    let (Some(rollout), Some((other, role))) = (routed.rollout.clone(), routed.compare.clone()) else { return };
    let answered = outputs.map(<[Tensor]>::to_vec);
    tokio::spawn(async move {
        let side = baton_core::rollout::Compare { rollout: &rollout, other: &other, role };
        let Some(mut copy) = side.start(inputs, answered.as_deref()) else { return };
        let outcome = (&mut copy.pending).await;
        copy.finish(answered.as_deref(), outcome);
    });
}

/// Counts a request the version did not queue: shed and expired ones as
/// rejected (they never reached an engine), others as the version's errors.
fn refused(
    app: &App,
    model: &str,
    series: &crate::metrics::VersionMetrics,
    started: Instant,
    rows: u64,
    e: InferError,
) -> ServeError {
    match &e {
        InferError::Overloaded { shed, .. } => {
            app.metrics.shed(model, shed.reason());
            app.metrics.rejected(model, "overloaded");
        }
        InferError::DeadlineExceeded { at } => {
            app.metrics.expired(model, at.as_str());
            app.metrics.rejected(model, "deadline_exceeded");
        }
        _ => {
            let e = ServeError::from(e);
            series.record(started.elapsed(), rows, Some(e.kind));
            return e;
        }
    }
    e.into()
}
