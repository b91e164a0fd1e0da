//! Where a version's inferences run: threads of its own, one per engine
//! instance, fed through a bounded queue.
//!
//! The async side (the protocol front ends) never waits for a session:
//! [`Executor::submit`] checks admission, pushes the request onto the
//! version's queue under a short lock, and returns a [`Pending`] future
//! that resolves when a session thread answers. The one exception is a
//! request its caller knows to be cheap that finds an instance free and
//! nobody waiting: it runs at once on the calling thread, on that instance
//! (docs/serving.md, "Running cheap requests inline"). Health checks,
//! metrics, the management API and other models' requests share the async
//! workers with requests in flight, so they must never wait behind an
//! inference that is long, or behind requests waiting for a session.
//!
//! Each session thread serves one engine instance (`Model::infer_on`), so
//! an instance is never contended and a thread never waits for one. A thread
//! takes the oldest waiting request — with dynamic batching, the oldest and
//! every compatible one that fits, after the batch window — and runs it. A
//! request whose deadline has passed when its turn comes is answered with
//! [`InferError::DeadlineExceeded`] and never run; one whose client stopped
//! waiting (its `Pending` was dropped) has already left the queue. A panic in
//! the engine fails the requests of that inference only: the thread catches
//! it, answers them with [`InferError::EnginePanicked`], and goes on with
//! the same instance.
//!
//! The threads are started at serving priority (see [`start_spawner`]), not
//! at the loader's: a version is built on a loading thread running at the
//! lowest priority, and threads inherit their creator's.

mod cost;
mod session;
mod spawn;
pub mod timing;

use std::collections::VecDeque;
use std::sync::{Arc, Condvar};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

pub use spawn::start_spawner;

/// Starts a thread running `work` at serving priority, whatever the
/// calling thread's: through the spawner [`start_spawner`] started. For
/// what must not inherit a loading thread's lowered priority, such as a
/// worker process started from a load.
pub fn spawn_at_serving_priority(work: impl FnOnce() + Send + 'static) -> std::io::Result<std::thread::JoinHandle<()>> {
    spawn::spawn(Box::new(work))
}

use crate::run::admission::{Limits, Load};
use crate::run::backend::Model;
use crate::run::batcher::{Batching, rows_of};
use crate::run::error::{Expired, InferError};
use crate::tensors::tensor::Tensor;
use crate::threads::sync::Lock;

/// The answer to one request.
pub type Answer = Result<Vec<Tensor>, InferError>;

/// An answer and the time the engine's run took as the thread that waited
/// for it counts it ([`timing`]; `None` when nothing ran).
pub type Timed = (Answer, Option<std::time::Duration>);

/// A request waiting for, or being run by, a session thread.
pub(crate) struct Job {
    id: u64,
    /// A comparison copy, given a free instance of its own: it waits in no
    /// queue and counts against no admission bound.
    copy: bool,
    /// Its inputs, checked against the signature.
    pub(crate) inputs: Vec<Tensor>,
    /// Its rows along the batch dimension.
    pub(crate) rows: usize,
    /// When it was queued.
    pub(crate) arrived: Instant,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Timed>,
}

impl Job {
    /// A job and the receiver of its answer.
    pub(crate) fn new(id: u64, inputs: Vec<Tensor>, deadline: Option<Instant>) -> (Job, oneshot::Receiver<Timed>) {
        let (reply, rx) = oneshot::channel();
        let rows = rows_of(&inputs);
        (Job { id, copy: false, inputs, rows, arrived: Instant::now(), deadline, reply }, rx)
    }

    /// Whether nobody waits for the answer any more, or it would come after
    /// the deadline anyway.
    fn lapsed(&self, now: Instant) -> bool {
        self.reply.is_closed() || self.deadline.is_some_and(|d| d <= now)
    }
}

/// What the session threads and the submitting side share.
struct Shared {
    state: Lock<State>,
    /// Session thread `i` waits on `work[i]` for work: a new request wakes
    /// exactly one idle thread, one whose instance is free.
    work: Vec<Condvar>,
    /// The thread gathering a batch waits here for more requests.
    arrived: Condvar,
    limits: Limits,
    batching: Option<Batching>,
    /// What a run costs, for deciding which requests are cheap.
    cost: cost::RunCost,
}

struct State {
    jobs: VecDeque<Job>,
    /// Per instance, a comparison copy given to it while it was free.
    assigned: Vec<Option<Job>>,
    /// Requests being run (by a thread, or inline) and not yet answered,
    /// comparison copies included.
    running: usize,
    /// Of those, comparison copies.
    copies: usize,
    /// Instances no one runs: their threads wait for work.
    free: Vec<usize>,
    /// Whether a thread is waiting for a batch to fill.
    gathering: bool,
    closed: bool,
    next_id: u64,
}

impl Shared {
    /// Wakes the thread of a free instance, if there is one, to take work.
    fn wake_one(&self, state: &State) {
        if let Some(&instance) = state.free.last() {
            self.work[instance].notify_one();
        }
    }

    /// Takes a job back out of the queue; `true` if it was still there.
    fn withdraw(&self, id: u64) -> bool {
        let mut state = self.state.lock();
        let Some(at) = state.jobs.iter().position(|j| j.id == id) else { return false };
        let job = state.jobs.remove(at);
        if state.gathering {
            self.arrived.notify_all();
        }
        drop(state);
        // Its inputs are freed here, outside the lock.
        drop(job);
        true
    }
}

/// The session threads of one version and the queue that feeds them.
pub struct Executor {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// For requests run inline ([`Executor::submit`]).
    engine: Arc<dyn Model>,
}

impl Executor {
    /// Starts one session thread per instance of `engine`, named
    /// `baton-session`, at serving priority. `first_cost` is what a run of
    /// one row is taken to cost until runs are measured.
    pub(crate) fn start(
        engine: Arc<dyn Model>,
        limits: Limits,
        batching: Option<Batching>,
        first_cost: std::time::Duration,
    ) -> Executor {
        let instances = engine.instances().max(1);
        let shared = Arc::new(Shared {
            state: Lock::new(State {
                jobs: VecDeque::new(),
                assigned: (0..instances).map(|_| None).collect(),
                running: 0,
                copies: 0,
                free: Vec::with_capacity(instances),
                gathering: false,
                closed: false,
                next_id: 0,
            }),
            work: (0..instances).map(|_| Condvar::new()).collect(),
            arrived: Condvar::new(),
            limits,
            batching,
            cost: cost::RunCost::new(first_cost),
        });
        // Each thread marks its instance free itself and says so: this
        // thread may be a lowered loader, which takes no lock that serving
        // threads take. The executor is returned once every instance is free.
        let (started, all_started) = crate::threads::sync::channel_here::<()>();
        let threads: Vec<JoinHandle<()>> = (0..instances)
            .filter_map(|instance| {
                let (thread_shared, thread_engine) = (Arc::clone(&shared), Arc::clone(&engine));
                let started = started.clone();
                let serve = move || session::serve(&thread_shared, thread_engine.as_ref(), instance, started);
                match spawn::spawn(Box::new(serve)) {
                    Ok(thread) => Some(thread),
                    Err(error) => {
                        tracing::error!(%error, instance, "Could not start a session thread; the instance goes unused.");
                        None
                    }
                }
            })
            .collect();
        drop(started);
        for _ in 0..threads.len() {
            if all_started.recv().is_none() {
                break;
            }
        }
        Executor { shared, threads, engine }
    }

    /// The bounds this version admits requests within.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// How a version batches, if it does.
    pub fn batching(&self) -> Option<Batching> {
        self.shared.batching
    }

    /// The estimated time of a run of `rows` rows, from the runs so far
    /// (see `cost.rs`).
    pub fn estimate(&self, rows: usize) -> std::time::Duration {
        self.shared.cost.estimate(rows)
    }

    /// What the version holds now.
    pub fn load(&self) -> Load {
        let state = self.shared.state.lock();
        Load { queued: state.jobs.len(), running: state.running }
    }

    /// Whether a request would be admitted now. A hint, for refusing a
    /// request before its body is read; [`Executor::submit`] decides.
    pub fn would_admit(&self) -> bool {
        let state = self.shared.state.lock();
        self.shared.limits.admit(state.jobs.len(), state.running, state.free.len()).is_ok()
    }

    /// Queues a request whose inputs were checked against the signature,
    /// or refuses it: `Shed` when the version is full, `DeadlineExceeded`
    /// when its deadline has passed already. Never blocks beyond a short
    /// lock.
    ///
    /// With `inline`, a request that finds an instance free and nobody
    /// waiting runs at once on the calling thread instead, on that
    /// instance; the caller says so only for a request it knows to be cheap
    /// (see [`crate::run::version::Version::submit`]). It never waits for an
    /// instance: with none free it is queued like any other.
    pub(crate) fn submit(
        &self,
        inputs: Vec<Tensor>,
        deadline: Option<Instant>,
        inline: bool,
    ) -> Result<Pending, Refusal> {
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Err(Refusal::Expired);
        }
        let mut state = self.shared.state.lock();
        if state.closed || self.threads.is_empty() {
            return Err(Refusal::Stopped);
        }
        let running = state.running - state.copies;
        self.shared.limits.admit(state.jobs.len(), running, state.free.len()).map_err(Refusal::Shed)?;
        if inline
            && state.jobs.is_empty()
            && !state.gathering
            && let Some(instance) = state.free.pop()
        {
            state.running += 1;
            drop(state);
            return Ok(Pending::answered(self.run_inline(instance, &inputs), &self.shared));
        }
        let id = state.next_id;
        state.next_id += 1;
        let (job, rx) = Job::new(id, inputs, deadline);
        state.jobs.push_back(job);
        if state.gathering {
            self.shared.arrived.notify_all();
        } else {
            self.shared.wake_one(&state);
        }
        drop(state);
        Ok(Pending::queued(rx, id, &self.shared))
    }

    /// Queues a comparison copy only if an instance is free and nobody
    /// waits, giving it that instance in the same step: it never waits in
    /// the queue ahead of a request, never runs on the caller's thread, and
    /// counts against no admission bound. Refused (`Shed`) otherwise.
    pub(crate) fn submit_spare(&self, inputs: Vec<Tensor>) -> Result<Pending, Refusal> {
        let mut state = self.shared.state.lock();
        if state.closed || self.threads.is_empty() {
            return Err(Refusal::Stopped);
        }
        if !state.jobs.is_empty() || state.gathering {
            return Err(Refusal::Shed(crate::run::admission::Shed::QueueFull));
        }
        let Some(instance) = state.free.pop() else {
            return Err(Refusal::Shed(crate::run::admission::Shed::QueueFull));
        };
        state.running += 1;
        state.copies += 1;
        let id = state.next_id;
        state.next_id += 1;
        let (mut job, rx) = Job::new(id, inputs, None);
        job.copy = true;
        state.assigned[instance] = Some(job);
        self.shared.work[instance].notify_one();
        drop(state);
        Ok(Pending::queued(rx, id, &self.shared))
    }

    /// Runs one request on `instance`, taken out of the free ones, on the
    /// calling thread; then frees the instance again.
    fn run_inline(&self, instance: usize, inputs: &[Tensor]) -> Timed {
        let watch = timing::Stopwatch::start();
        let started = Instant::now();
        let answer = session::run_one(self.engine.as_ref(), instance, inputs);
        let ran = Some(watch.stop());
        self.shared.cost.record(rows_of(inputs), started.elapsed());
        let mut state = self.shared.state.lock();
        state.running -= 1;
        state.free.push(instance);
        if !state.jobs.is_empty() {
            // Requests queued meanwhile; this instance's thread takes them.
            self.shared.work[instance].notify_one();
        }
        (answer, ran)
    }

    /// Stops the threads once they finish what they run; requests still
    /// queued are dropped (their `Pending` resolves to
    /// [`InferError::Stopped`]). With `join`, waits until they have ended.
    pub(crate) fn stop(mut self, join: bool) {
        self.close();
        for thread in std::mem::take(&mut self.threads) {
            if join {
                let _ = thread.join();
            }
        }
    }

    fn close(&self) {
        let jobs = {
            let mut state = self.shared.state.lock();
            state.closed = true;
            let copies: Vec<Job> = state.assigned.iter_mut().filter_map(Option::take).collect();
            (std::mem::take(&mut state.jobs), copies)
        };
        for work in &self.shared.work {
            work.notify_all();
        }
        self.shared.arrived.notify_all();
        drop(jobs);
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.close();
    }
}

/// Why [`Executor::submit`] did not queue a request.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The version is full.
    Shed(crate::run::admission::Shed),
    /// The deadline had passed.
    Expired,
    /// The threads have stopped.
    Stopped,
}

/// The answer to a queued request, to be awaited. Dropping it before the
/// answer takes the request out of the queue if it still waits there, so a
/// request whose client gave up is never run.
pub struct Pending {
    rx: oneshot::Receiver<Timed>,
    id: u64,
    shared: Arc<Shared>,
    settled: bool,
    /// The answer of a request run inline.
    answered: Option<Timed>,
    /// The time of the engine's run ([`timing`]), once answered.
    engine_time: Option<std::time::Duration>,
}

impl Pending {
    fn queued(rx: oneshot::Receiver<Timed>, id: u64, shared: &Arc<Shared>) -> Pending {
        Pending { rx, id, shared: Arc::clone(shared), settled: false, answered: None, engine_time: None }
    }

    fn answered(answer: Timed, shared: &Arc<Shared>) -> Pending {
        let rx = oneshot::channel().1;
        Pending {
            rx,
            id: u64::MAX,
            shared: Arc::clone(shared),
            settled: true,
            answered: Some(answer),
            engine_time: None,
        }
    }

    /// Takes the request back: `Expired::Queued` if it still waited (it
    /// will never run), `Expired::Running` if a thread has it already.
    /// For a caller whose deadline passed while it awaited the answer.
    pub fn withdraw(mut self) -> Expired {
        self.settled = true;
        if self.shared.withdraw(self.id) { Expired::Queued } else { Expired::Running }
    }

    /// The time the engine's run took ([`timing`]), once
    /// the answer came; `None` before, or when nothing ran.
    pub fn engine_time(&self) -> Option<std::time::Duration> {
        self.engine_time
    }

    /// Blocks the calling thread until the answer comes. For synchronous
    /// callers only: an async task awaits the `Pending` instead.
    pub fn wait(self) -> Answer {
        self.wait_timed().0
    }

    /// [`Pending::wait`], with the time of the engine's run.
    pub fn wait_timed(mut self) -> Timed {
        if let Some(answer) = self.answered.take() {
            return answer;
        }
        let answer = std::mem::replace(&mut self.rx, oneshot::channel().1).blocking_recv();
        self.settled = true;
        answer.unwrap_or((Err(InferError::Stopped), None))
    }
}

impl std::future::Future for Pending {
    type Output = Answer;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Answer> {
        let this = self.get_mut();
        if let Some((answer, ran)) = this.answered.take() {
            this.engine_time = ran;
            return std::task::Poll::Ready(answer);
        }
        std::pin::Pin::new(&mut this.rx).poll(cx).map(|answer| {
            this.settled = true;
            let (answer, ran) = answer.unwrap_or((Err(InferError::Stopped), None));
            this.engine_time = ran;
            answer
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.settled {
            self.shared.withdraw(self.id);
        }
    }
}

#[cfg(test)]
mod tests;
