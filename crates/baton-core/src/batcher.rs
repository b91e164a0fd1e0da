//! Dynamic batching: requests to one version that arrive while its engine
//! instances are busy are joined along the batch dimension and run as one
//! inference, then the outputs are split back, row for row, to the requests
//! they came from. For small models most of an inference's cost is per call,
//! not per row, so a batch of four costs far less than four calls.
//!
//! There are no batching threads. A request that finds an engine instance
//! free runs at once on its own thread — no hand-off, so a lightly loaded
//! model pays nothing for batching — taking along whatever compatible
//! requests are already queued (same inputs and datatypes, same shape after
//! the batch dimension, rows within `max_batch`), after waiting up to
//! `max_queue_delay_us` for more to arrive. A request that finds every
//! instance busy queues. An instance that finishes a batch and finds
//! requests queued keeps going on a new task, so the request that led the
//! batch gets its answer without waiting for the next one.
//!
//! A request's tensors are never mixed with another's: each request gets
//! exactly the rows it sent, in order.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::backend::{BackendError, Model};
use crate::spec::BatchingPolicy;
use crate::sync::Lock;
use crate::tensor::{Tensor, TensorData};

/// An inference expected to take this long or more is heavy: it runs with
/// `tokio::task::block_in_place` rather than inline on an async worker, so
/// the worker's other tasks (health checks, metrics, other models'
/// requests) move to another thread instead of waiting behind it. Lighter
/// ones run inline: for them the hand-off would cost more than the work.
pub const HEAVY_INFERENCE: Duration = Duration::from_millis(1);

/// The answer to one batched request.
pub type Answer = Result<Vec<Tensor>, BackendError>;

struct Job {
    inputs: Vec<Tensor>,
    rows: usize,
    arrived: Instant,
    reply: oneshot::Sender<Answer>,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Engine instances no batch is running on.
    free: Vec<usize>,
}

struct Shared {
    queue: Lock<Queue>,
    arrived: Condvar,
    engine: Arc<dyn Model>,
    max_batch: usize,
    delay: Duration,
    /// Whether batches run with `block_in_place`.
    heavy: bool,
}

/// The batcher of one version.
pub struct Batcher {
    shared: Arc<Shared>,
}

impl Batcher {
    /// A batcher over `engine`. With `heavy` (see [`HEAVY_INFERENCE`]),
    /// batches run with `block_in_place` on a multi-threaded runtime, so the
    /// serving thread's other tasks move to another thread meanwhile.
    pub fn new(engine: Arc<dyn Model>, policy: &BatchingPolicy, heavy: bool) -> Batcher {
        let free = (0..engine.instances()).rev().collect();
        let shared = Arc::new(Shared {
            queue: Lock::new(Queue { jobs: VecDeque::new(), free }),
            arrived: Condvar::new(),
            engine,
            max_batch: policy.max_batch.max(1),
            delay: Duration::from_micros(policy.max_queue_delay_us),
            heavy,
        });
        Batcher { shared }
    }

    /// Queues a request whose inputs were already checked against the
    /// signature, and runs a batch now if an engine instance is free. The
    /// receiver gets the request's outputs.
    pub fn submit(&self, inputs: Vec<Tensor>) -> oneshot::Receiver<Answer> {
        let (reply, rx) = oneshot::channel();
        let rows = rows_of(&inputs);
        let shared = &self.shared;
        let mut queue = shared.queue.lock();
        queue.jobs.push_back(Job { inputs, rows, arrived: Instant::now(), reply });
        shared.arrived.notify_all();
        if let Some(instance) = queue.free.pop() {
            let batch = gather(shared, queue);
            run(shared, instance, batch);
            carry_on(Arc::clone(shared), instance);
        }
        rx
    }
}

fn rows_of(inputs: &[Tensor]) -> usize {
    inputs.first().and_then(|t| t.shape.first()).map_or(0, |r| usize::try_from(*r).unwrap_or(0))
}

/// Waits up to the queue delay for the batch to fill, then takes it.
fn gather(shared: &Shared, mut queue: MutexGuard<'_, Queue>) -> Vec<Job> {
    if !shared.delay.is_zero() {
        let deadline = queue.jobs.front().map_or_else(Instant::now, |j| j.arrived + shared.delay);
        while fitting_rows(&queue.jobs, shared.max_batch) < shared.max_batch {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            queue = shared.arrived.wait_timeout(queue, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
    take_batch(&mut queue.jobs, shared.max_batch)
}

/// After a batch: frees the instance, or — when requests are queued — keeps
/// the instance busy on a new task that runs batches until the queue is
/// empty. Without an async runtime it does so on this thread.
fn carry_on(shared: Arc<Shared>, instance: usize) {
    {
        let mut queue = shared.queue.lock();
        if queue.jobs.is_empty() {
            queue.free.push(instance);
            return;
        }
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move { drain(&shared, instance) });
        }
        Err(_) => drain(&shared, instance),
    }
}

fn drain(shared: &Shared, instance: usize) {
    loop {
        let queue = shared.queue.lock();
        if queue.jobs.is_empty() {
            let mut queue = queue;
            queue.free.push(instance);
            return;
        }
        let batch = gather(shared, queue);
        run(shared, instance, batch);
    }
}

/// The rows the next batch would hold if it were taken now.
fn fitting_rows(jobs: &VecDeque<Job>, max: usize) -> usize {
    let Some(first) = jobs.front() else { return 0 };
    let mut rows = 0;
    for job in jobs.iter().filter(|j| compatible(&first.inputs, &j.inputs)) {
        if rows + job.rows <= max {
            rows += job.rows;
        }
    }
    rows
}

/// The oldest job and every later compatible one that fits; the others keep
/// their place in the queue.
fn take_batch(jobs: &mut VecDeque<Job>, max: usize) -> Vec<Job> {
    let Some(first) = jobs.pop_front() else { return Vec::new() };
    let mut rows = first.rows;
    let mut batch = vec![first];
    let mut kept = VecDeque::with_capacity(jobs.len());
    while let Some(job) = jobs.pop_front() {
        if rows + job.rows <= max && compatible(&batch[0].inputs, &job.inputs) {
            rows += job.rows;
            batch.push(job);
        } else {
            kept.push_back(job);
        }
    }
    *jobs = kept;
    batch
}

/// Whether two requests can share a batch: the same inputs in the same
/// order, each with the same datatype and the same shape after the batch
/// dimension.
fn compatible(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.datatype == y.datatype
                && !x.shape.is_empty()
                && x.shape.len() == y.shape.len()
                && x.shape[1..] == y.shape[1..]
        })
}

fn run(shared: &Shared, instance: usize, batch: Vec<Job>) {
    // While a batch waits for its delay the lock is released, and another
    // instance may take the jobs; then there is nothing left to run.
    if batch.is_empty() {
        return;
    }
    run_inference(shared.heavy, || run_batch(shared.engine.as_ref(), instance, batch));
}

/// Runs inference work on the calling thread: inline, or — when `heavy`
/// and on a multi-threaded tokio runtime — inside `block_in_place`, so the
/// async worker's other tasks move elsewhere meanwhile (see
/// [`HEAVY_INFERENCE`]).
pub fn run_inference<T>(heavy: bool, work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if heavy && multi_thread { tokio::task::block_in_place(work) } else { work() }
}

fn run_batch(engine: &dyn Model, instance: usize, batch: Vec<Job>) {
    if let [_] = batch.as_slice() {
        let job = batch.into_iter().next().expect("one job");
        let _ = job.reply.send(engine.infer_on(instance, &job.inputs));
        return;
    }
    let inputs = concat(&batch);
    match engine.infer_on(instance, &inputs).and_then(|outputs| split(&outputs, &batch)) {
        Ok(parts) => {
            for (job, outputs) in batch.into_iter().zip(parts) {
                let _ = job.reply.send(Ok(outputs));
            }
        }
        Err(error) => {
            for job in batch {
                let _ = job.reply.send(Err(BackendError::new(error.kind, error.message.clone())));
            }
        }
    }
}

/// Joins the jobs' inputs along the first dimension, in job order.
fn concat(batch: &[Job]) -> Vec<Tensor> {
    let rows: usize = batch.iter().map(|j| j.rows).sum();
    (0..batch[0].inputs.len())
        .map(|i| {
            let first = &batch[0].inputs[i];
            let mut shape = first.shape.clone();
            shape[0] = rows as i64;
            let data = match &first.data {
                TensorData::Raw(_) => TensorData::Raw(
                    batch
                        .iter()
                        .flat_map(|j| match &j.inputs[i].data {
                            TensorData::Raw(b) => b.as_slice(),
                            TensorData::Bytes(_) => &[],
                        })
                        .copied()
                        .collect(),
                ),
                TensorData::Bytes(_) => TensorData::Bytes(
                    batch
                        .iter()
                        .flat_map(|j| match &j.inputs[i].data {
                            TensorData::Bytes(items) => items.clone(),
                            TensorData::Raw(_) => Vec::new(),
                        })
                        .collect(),
                ),
            };
            Tensor { name: first.name.clone(), datatype: first.datatype, shape, data }
        })
        .collect()
}

/// Splits each output back into the jobs' rows. Every output must carry
/// the batch along its first dimension.
fn split(outputs: &[Tensor], batch: &[Job]) -> Result<Vec<Vec<Tensor>>, BackendError> {
    let rows: usize = batch.iter().map(|j| j.rows).sum();
    let mut parts: Vec<Vec<Tensor>> = batch.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
    for output in outputs {
        if output.shape.first().copied() != Some(rows as i64) {
            return Err(BackendError::new(
                "batching_failed",
                format!(
                    "output '{}' has shape {:?}, not {rows} rows; the model cannot be batched",
                    output.name, output.shape
                ),
            ));
        }
        let per_row = crate::tensor::element_count(&output.shape[1..]).unwrap_or(0);
        let mut start = 0;
        for (job, part) in batch.iter().zip(parts.iter_mut()) {
            let mut shape = output.shape.clone();
            shape[0] = job.rows as i64;
            let (from, to) = (start * per_row, (start + job.rows) * per_row);
            let data = match &output.data {
                TensorData::Raw(bytes) => {
                    let size = output.datatype.size().unwrap_or(1);
                    TensorData::Raw(bytes[from * size..to * size].to_vec())
                }
                TensorData::Bytes(items) => TensorData::Bytes(items[from..to].to_vec()),
            };
            part.push(Tensor { name: output.name.clone(), datatype: output.datatype, shape, data });
            start += job.rows;
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DataType;

    fn job(rows: usize, width: i64, start: f32) -> (Job, oneshot::Receiver<Answer>) {
        let values: Vec<f32> = (0..rows * width as usize).map(|i| start + i as f32).collect();
        let (reply, rx) = oneshot::channel();
        let inputs = vec![Tensor::from_f32("x", vec![rows as i64, width], &values)];
        (Job { inputs, rows, arrived: Instant::now(), reply }, rx)
    }

    #[test]
    fn take_batch_keeps_order_and_skips_what_does_not_fit() {
        let mut q: VecDeque<Job> = VecDeque::new();
        for (rows, width) in [(2, 3), (1, 4), (3, 3), (4, 3), (1, 3)] {
            q.push_back(job(rows, width, 0.0).0);
        }
        let batch = take_batch(&mut q, 6);
        let taken: Vec<(usize, i64)> = batch.iter().map(|j| (j.rows, j.inputs[0].shape[1])).collect();
        assert_eq!(taken, vec![(2, 3), (3, 3), (1, 3)], "width-4 does not fit beside width-3; 4 rows would exceed 6");
        let left: Vec<(usize, i64)> = q.iter().map(|j| (j.rows, j.inputs[0].shape[1])).collect();
        assert_eq!(left, vec![(1, 4), (4, 3)]);
    }

    #[test]
    fn concat_then_split_gives_every_job_its_own_rows() {
        let jobs: Vec<Job> = [(2, 0.0), (1, 100.0), (3, 200.0)].iter().map(|(r, s)| job(*r, 2, *s).0).collect();
        let joined = concat(&jobs);
        assert_eq!(joined[0].shape, vec![6, 2]);
        // An identity "model": outputs are the inputs renamed.
        let outputs: Vec<Tensor> = joined.iter().map(|t| Tensor { name: "y".into(), ..t.clone() }).collect();
        let parts = split(&outputs, &jobs).unwrap();
        for (job, part) in jobs.iter().zip(&parts) {
            assert_eq!(part[0].shape, job.inputs[0].shape);
            assert_eq!(part[0].to_f32(), job.inputs[0].to_f32(), "rows went to the wrong request");
            assert_eq!(part[0].datatype, DataType::Fp32);
        }
        let wrong = vec![Tensor::from_f32("y", vec![1, 2], &[0.0, 0.0])];
        assert_eq!(split(&wrong, &jobs).unwrap_err().kind, "batching_failed");
    }
}
