//! Dynamic batching: requests to one version that wait while its session
//! threads are busy are joined along the batch dimension and run as one
//! inference, then the outputs are split back, row for row, to the requests
//! they came from. For small models most of an inference's cost is per call,
//! not per row, so a batch of four costs far less than four calls.
//!
//! The batches are formed on the version's session threads
//! ([`crate::run::executor`]): a thread that takes work takes the oldest waiting
//! request and every later compatible one (same inputs and datatypes, same
//! shape after the batch dimension) while the rows fit in `max_batch`, after
//! waiting up to `max_queue_delay_us` from the oldest one's arrival for more
//! to come. A lightly loaded model therefore runs each request alone, at
//! once; batches form only from requests that wait anyway.
//!
//! A request's tensors are never mixed with another's: each request gets
//! exactly the rows it sent, in order.

use std::collections::VecDeque;
use std::time::Duration;

use crate::files::spec::BatchingPolicy;
use crate::run::backend::{BackendError, Model};
use crate::run::error::InferError;
use crate::run::executor::{Answer, Job};
use crate::tensors::tensor::{Tensor, TensorData};

/// How a version batches, resolved from its `[batching]` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    /// The most rows one batch holds.
    pub max_batch: usize,
    /// How long the oldest waiting request may wait for others to join it.
    pub delay: Duration,
}

impl Batching {
    /// The batching `policy` asks for.
    pub fn new(policy: &BatchingPolicy) -> Batching {
        Batching { max_batch: policy.max_batch.max(1), delay: Duration::from_micros(policy.max_queue_delay_us) }
    }
}

/// The rows of a request: the first dimension of its first input.
pub(crate) fn rows_of(inputs: &[Tensor]) -> usize {
    inputs.first().and_then(|t| t.shape.first()).map_or(0, |r| usize::try_from(*r).unwrap_or(0))
}

/// The rows the next batch would hold if it were taken now.
pub(crate) fn fitting_rows(jobs: &VecDeque<Job>, max: usize) -> usize {
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
pub(crate) fn take_batch(jobs: &mut VecDeque<Job>, max: usize) -> Vec<Job> {
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

/// Runs a batch on engine instance `instance` and returns each job's
/// answer, in job order. A batch of one runs as it came.
pub(crate) fn run_batch(engine: &dyn Model, instance: usize, batch: &[Job]) -> Vec<Answer> {
    if let [job] = batch {
        return vec![engine.infer_on(instance, &job.inputs).map_err(InferError::from)];
    }
    let inputs = concat(batch);
    match engine.infer_on(instance, &inputs).and_then(|outputs| split(&outputs, batch)) {
        Ok(parts) => parts.into_iter().map(Ok).collect(),
        Err(error) => batch.iter().map(|_| Err(BackendError::new(error.kind, error.message.clone()).into())).collect(),
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
        let per_row = crate::tensors::tensor::element_count(&output.shape[1..]).unwrap_or(0);
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
    use crate::tensors::tensor::DataType;

    fn job(rows: usize, width: i64, start: f32) -> (Job, tokio::sync::oneshot::Receiver<crate::run::executor::Timed>) {
        let values: Vec<f32> = (0..rows * width as usize).map(|i| start + i as f32).collect();
        Job::new(0, vec![Tensor::from_f32("x", vec![rows as i64, width], &values)], None)
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
