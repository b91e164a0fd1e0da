//! The loop of one session thread: take the next request (or batch), run
//! it on this thread's engine instance, answer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::MutexGuard;
use std::time::Instant;

use super::{Answer, Job, Shared, State};
use crate::run::backend::Model;
use crate::run::batcher::{Batching, fitting_rows, run_batch, take_batch};
use crate::run::error::{Expired, InferError};
use crate::tensors::tensor::Tensor;

/// Serves engine instance `instance` until the executor closes.
pub(super) fn serve(shared: &Shared, engine: &dyn Model, instance: usize, started: crate::threads::sync::Sender<()>) {
    shared.state.lock().free.push(instance);
    let _ = started.send(());
    drop(started);
    while let Some(batch) = next(shared, instance) {
        let watch = super::timing::Stopwatch::start();
        let started = Instant::now();
        let answers = run(engine, instance, &batch);
        let ran = Some(watch.stop());
        shared.cost.record(batch.iter().map(|j| j.rows).sum(), started.elapsed());
        let count = batch.len();
        let copies = batch.iter().filter(|j| j.copy).count();
        {
            // Counted out before the answers go, so a client that sends its
            // next request as soon as it has this answer finds the room.
            let mut state = shared.state.lock();
            state.running -= count;
            state.copies -= copies;
            state.free.push(instance);
        }
        for (job, answer) in batch.into_iter().zip(answers) {
            let _ = job.reply.send((answer, ran));
        }
    }
}

/// Runs `work`, turning a panic of the engine into its message. The
/// instance stays usable: a backend whose state a panic could leave
/// half-changed must guard against that itself (the ONNX backend catches
/// panics around each run).
fn caught<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned())
    })
}

/// Runs a batch; a panic fails each of its requests.
fn run(engine: &dyn Model, instance: usize, batch: &[Job]) -> Vec<Answer> {
    caught(|| run_batch(engine, instance, batch)).unwrap_or_else(|message| {
        tracing::error!(instance, requests = batch.len(), %message, "The engine panicked; its requests failed.");
        batch.iter().map(|_| Err(InferError::EnginePanicked(message.clone()))).collect()
    })
}

/// Runs one request on `instance`; a panic fails it.
pub(super) fn run_one(engine: &dyn Model, instance: usize, inputs: &[Tensor]) -> Answer {
    caught(|| engine.infer_on(instance, inputs).map_err(InferError::from)).unwrap_or_else(|message| {
        tracing::error!(instance, %message, "The engine panicked; its request failed.");
        Err(InferError::EnginePanicked(message))
    })
}

/// Waits until there is work and this thread's instance is free (a
/// request run inline may hold it), and takes the work; `None` once the
/// executor closes. Requests whose deadline has passed, or whose client
/// stopped waiting, are taken out of the queue here and never run.
fn next(shared: &Shared, instance: usize) -> Option<Vec<Job>> {
    let mut state = shared.state.lock();
    loop {
        while !state.closed
            && state.assigned[instance].is_none()
            && (state.jobs.is_empty() || state.gathering || !state.free.contains(&instance))
        {
            state = shared.work[instance].wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if state.closed {
            return None;
        }
        // A comparison copy given to this instance while it was free: the
        // instance is out of the free ones and counted running already.
        if let Some(copy) = state.assigned[instance].take() {
            return Some(vec![copy]);
        }
        state.free.retain(|&i| i != instance);
        if let Some(batching) = shared.batching {
            state = gather(shared, state, batching);
        }
        let lapsed = take_lapsed(&mut state);
        let batch = match shared.batching {
            Some(batching) => take_batch(&mut state.jobs, batching.max_batch),
            None => state.jobs.pop_front().into_iter().collect(),
        };
        state.running += batch.len();
        if batch.is_empty() {
            state.free.push(instance);
        }
        if !state.jobs.is_empty() {
            // Another free thread can start on what is left.
            shared.wake_one(&state);
        }
        drop(state);
        for job in lapsed {
            let _ = job.reply.send((Err(InferError::DeadlineExceeded { at: Expired::Queued }), None));
        }
        if !batch.is_empty() {
            return Some(batch);
        }
        state = shared.state.lock();
    }
}

/// Waits up to the batch window, counted from the oldest request's arrival,
/// for the batch to fill. Only one thread gathers at a time; the others
/// wait until it has taken its batch.
fn gather<'a>(shared: &'a Shared, mut state: MutexGuard<'a, State>, batching: Batching) -> MutexGuard<'a, State> {
    if batching.delay.is_zero() {
        return state;
    }
    state.gathering = true;
    while let Some(oldest) = state.jobs.front() {
        let window = oldest.arrived + batching.delay;
        let now = Instant::now();
        if state.closed || now >= window || fitting_rows(&state.jobs, batching.max_batch) >= batching.max_batch {
            break;
        }
        state = shared.arrived.wait_timeout(state, window - now).unwrap_or_else(|e| e.into_inner()).0;
    }
    state.gathering = false;
    state
}

/// Takes every request out of the queue that must not run.
fn take_lapsed(state: &mut State) -> Vec<Job> {
    let now = Instant::now();
    if !state.jobs.iter().any(|j| j.lapsed(now)) {
        return Vec::new();
    }
    let (lapsed, kept): (Vec<Job>, Vec<Job>) = std::mem::take(&mut state.jobs).into_iter().partition(|j| j.lapsed(now));
    state.jobs = kept.into();
    lapsed
}
