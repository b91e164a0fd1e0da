//! The executor on a scripted engine: where inferences run, what is refused
//! when the queue is full, what a deadline or a dropped request does to a
//! queued one, what a panic costs, and batches formed on a session thread.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::run::admission::Shed;
use crate::run::backend::{BackendError, Weight, WeightsError};
use crate::tensors::signature::Signature;

/// How long a test waits for a condition before it fails: a safety net
/// against a hung test, not a speed requirement.
const PATIENCE: Duration = Duration::from_secs(60);

/// An engine whose inferences wait while its gate is closed, that panics
/// on an input whose first element is negative, and records the rows and
/// the thread of every inference.
#[derive(Default)]
struct Scripted {
    gate: Mutex<(bool, usize)>,
    changed: Condvar,
    calls: Mutex<Vec<(usize, String)>>,
    signature: Signature,
}

impl Scripted {
    fn closed() -> Arc<Scripted> {
        Arc::new(Scripted::default())
    }

    fn open(&self) {
        self.gate.lock().unwrap().0 = true;
        self.changed.notify_all();
    }

    /// Waits until `n` inferences are held at the gate.
    fn until_held(&self, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        let mut gate = self.gate.lock().unwrap();
        while gate.1 < n {
            assert!(Instant::now() < deadline, "{n} inferences were never held");
            gate = self.changed.wait_timeout(gate, Duration::from_millis(50)).unwrap().0;
        }
    }

    fn rows(&self) -> Vec<usize> {
        self.calls.lock().unwrap().iter().map(|(rows, _)| *rows).collect()
    }
}

impl Model for Scripted {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn visit_weights(&self, _: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        Ok(())
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let x = inputs[0].to_f32().unwrap();
        if x[0] < 0.0 {
            panic!("a scripted panic");
        }
        {
            let mut gate = self.gate.lock().unwrap();
            gate.1 += 1;
            self.changed.notify_all();
            while !gate.0 {
                gate = self.changed.wait(gate).unwrap();
            }
            gate.1 -= 1;
        }
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        self.calls.lock().unwrap().push((rows_of(inputs), thread));
        Ok(vec![Tensor::from_f32("y", inputs[0].shape.clone(), &x)])
    }
}

fn rows(n: usize, start: f32) -> Vec<Tensor> {
    let values: Vec<f32> = (0..n * 2).map(|i| start + i as f32).collect();
    vec![Tensor::from_f32("x", vec![n as i64, 2], &values)]
}

fn executor(engine: &Arc<Scripted>, max_queue: usize, batching: Option<Batching>) -> Executor {
    let limits = Limits { max_queue, max_in_flight: 100 };
    Executor::start(Arc::clone(engine) as Arc<dyn Model>, limits, batching, Duration::ZERO)
}

/// An executor of one session with room for `max_queue` waiting requests,
/// and a request of one row held at its closed gate.
fn one_held(max_queue: usize) -> (Arc<Scripted>, Executor, Pending) {
    let engine = Scripted::closed();
    let executor = executor(&engine, max_queue, None);
    let held = executor.submit(rows(1, 0.0), None, false).unwrap();
    engine.until_held(1);
    (engine, executor, held)
}

/// Waits until the executor holds `queued` waiting requests.
fn until_queued(executor: &Executor, queued: usize) {
    let deadline = Instant::now() + PATIENCE;
    while executor.load().queued != queued {
        assert!(Instant::now() < deadline, "the queue never held {queued}; it holds {:?}", executor.load());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn inferences_run_on_session_threads_and_a_full_queue_refuses_at_once() {
    let (engine, executor, first) = one_held(1);
    let second = executor.submit(rows(2, 0.0), None, false).unwrap();
    assert_eq!(executor.load(), Load { queued: 1, running: 1 });
    // The one session is busy and the one queue slot taken: refused, not queued.
    assert!(matches!(executor.submit(rows(3, 0.0), None, false), Err(Refusal::Shed(Shed::QueueFull))));
    assert!(!executor.would_admit());
    engine.open();
    assert_eq!(first.wait().unwrap()[0].shape, vec![1, 2]);
    assert_eq!(second.wait().unwrap()[0].shape, vec![2, 2]);
    let threads: Vec<String> = engine.calls.lock().unwrap().iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(threads, [spawn::SESSION_THREAD_NAME; 2]);
    assert!(executor.would_admit());
    executor.stop(true);
}

#[test]
fn a_cheap_request_runs_inline_only_when_an_instance_is_free() {
    let engine = Scripted::closed();
    engine.open();
    let executor = executor(&engine, 4, None);
    executor.submit(rows(1, 0.0), None, true).unwrap().wait().unwrap();
    let here = std::thread::current().name().unwrap_or_default().to_owned();
    assert_eq!(engine.calls.lock().unwrap()[0].1, here, "a free instance ran it on the calling thread");
    executor.stop(true);

    // With the one instance busy it is queued, not waited for.
    let (engine, executor, held) = one_held(4);
    let queued = executor.submit(rows(2, 0.0), None, true).unwrap();
    assert_eq!(executor.load(), Load { queued: 1, running: 1 });
    engine.open();
    held.wait().unwrap();
    queued.wait().unwrap();
    let threads: Vec<String> = engine.calls.lock().unwrap().iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(threads, [spawn::SESSION_THREAD_NAME; 2]);
    executor.stop(true);
}

#[test]
fn a_request_whose_deadline_passes_while_queued_never_runs() {
    let (engine, executor, held) = one_held(4);
    let deadline = Instant::now() + Duration::from_millis(20);
    let late = executor.submit(rows(3, 0.0), Some(deadline), false).unwrap();
    while Instant::now() <= deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    engine.open();
    held.wait().unwrap();
    assert!(matches!(late.wait(), Err(InferError::DeadlineExceeded { at: Expired::Queued })));
    assert_eq!(engine.rows(), [1], "the expired request ran");
    // A deadline already past is refused before it is queued.
    assert!(matches!(executor.submit(rows(1, 0.0), Some(Instant::now()), false), Err(Refusal::Expired)));
    executor.stop(true);
}

#[test]
fn a_dropped_or_withdrawn_request_leaves_the_queue() {
    let (engine, executor, held) = one_held(4);
    let dropped = executor.submit(rows(2, 0.0), None, false).unwrap();
    let withdrawn = executor.submit(rows(3, 0.0), None, false).unwrap();
    until_queued(&executor, 2);
    drop(dropped);
    assert_eq!(withdrawn.withdraw(), Expired::Queued);
    assert_eq!(executor.load().queued, 0, "both left the queue at once");
    let after = executor.submit(rows(4, 0.0), None, false).unwrap();
    engine.open();
    held.wait().unwrap();
    after.wait().unwrap();
    assert_eq!(engine.rows(), [1, 4]);
    executor.stop(true);
}

#[test]
fn a_panic_fails_its_request_and_the_session_serves_the_next() {
    let engine = Scripted::closed();
    engine.open();
    let executor = executor(&engine, 4, None);
    let panicked = executor.submit(vec![Tensor::from_f32("x", vec![1, 2], &[-1.0, 0.0])], None, false).unwrap().wait();
    assert!(matches!(panicked, Err(InferError::EnginePanicked(ref m)) if m.contains("scripted panic")), "{panicked:?}");
    // One instance: the same thread and session answer the next request.
    assert_eq!(
        executor.submit(rows(2, 1.0), None, false).unwrap().wait().unwrap()[0].to_f32().unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
    assert_eq!(executor.load(), Load::default());
    executor.stop(true);
}

#[test]
fn requests_waiting_behind_a_busy_session_run_as_one_batch() {
    let engine = Scripted::closed();
    let batching = Batching { max_batch: 16, delay: Duration::ZERO };
    let executor = executor(&engine, 8, Some(batching));
    let leader = executor.submit(rows(1, 0.0), None, false).unwrap();
    engine.until_held(1);
    let queued: Vec<(usize, f32, Pending)> = [(2, 100.0), (3, 200.0), (1, 300.0)]
        .into_iter()
        .map(|(n, start)| (n, start, executor.submit(rows(n, start), None, false).unwrap()))
        .collect();
    engine.open();
    leader.wait().unwrap();
    for (n, start, pending) in queued {
        let output = pending.wait().unwrap();
        assert_eq!(output[0].to_f32(), rows(n, start)[0].to_f32(), "rows went to the wrong request");
    }
    assert_eq!(engine.rows(), [1, 6], "the three waiting requests ran as one batch of 6 rows");
    executor.stop(true);
}

#[test]
fn the_batch_window_waits_for_more_on_the_session_thread() {
    let engine = Scripted::closed();
    engine.open();
    // Without the window the first request would run alone, at once.
    let batching = Batching { max_batch: 4, delay: PATIENCE };
    let executor = executor(&engine, 8, Some(batching));
    let first = executor.submit(rows(1, 0.0), None, false).unwrap();
    let second = executor.submit(rows(3, 10.0), None, false).unwrap();
    first.wait().unwrap();
    second.wait().unwrap();
    assert_eq!(engine.rows(), [4]);
    executor.stop(true);
}

#[test]
fn stopping_answers_what_is_still_queued() {
    let (engine, executor, held) = one_held(4);
    let queued = executor.submit(rows(2, 0.0), None, false).unwrap();
    let stopping = std::thread::spawn(move || executor.stop(true));
    assert!(matches!(queued.wait(), Err(InferError::Stopped)));
    engine.open();
    held.wait().unwrap();
    stopping.join().unwrap();
}

#[test]
fn a_comparison_copy_takes_a_free_instance_at_once_or_is_refused_and_never_counts_against_admission() {
    let engine = Scripted::closed();
    // One session, room for one waiting request and one in flight.
    let limits = Limits { max_queue: 1, max_in_flight: 1 };
    let executor = Executor::start(Arc::clone(&engine) as Arc<dyn Model>, limits, None, Duration::ZERO);
    // The instance is free: the copy takes it, on the session thread.
    let copy = executor.submit_spare(rows(1, 0.0)).unwrap();
    engine.until_held(1);
    assert_eq!(executor.load().queued, 0, "the copy waits in no queue");
    // No instance is free now: a second copy is refused, never queued.
    assert!(matches!(executor.submit_spare(rows(1, 1.0)), Err(Refusal::Shed(Shed::QueueFull))));
    // Requests are admitted as if the copy were not there: the one
    // request in flight the bound allows waits for the instance.
    let first = executor.submit(rows(1, 2.0), None, false).unwrap();
    until_queued(&executor, 1);
    assert!(executor.submit_spare(rows(1, 3.0)).is_err(), "a copy never queues behind a request");
    engine.open();
    let (answer, ran) = copy.wait_timed();
    assert!(answer.is_ok());
    assert!(ran.is_some(), "the engine's run is timed");
    assert!(first.wait().is_ok());
    let threads: Vec<String> = engine.calls.lock().unwrap().iter().map(|(_, t)| t.clone()).collect();
    assert!(threads.iter().all(|t| t == "baton-session"), "{threads:?}");
}
