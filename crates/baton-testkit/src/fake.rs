//! A fake backend for tests of the core's mechanics that need control the
//! real engine does not give: a load that blocks until the test lets it go,
//! or a model that fails on demand.
//!
//! A fake version directory holds `fake.txt` with one number, the scale. The
//! model takes `x` FP32 `[-1, 4]` and returns `y = x * scale`; its one weight
//! is `scale` `[1, 1]`, so the validation checks see it. A version that also
//! holds a file named `hold` waits at the backend's [`Gate`] while loading;
//! one holding `hold-first-infer` waits there in its first inference, and
//! one holding `hold-every-infer` in every inference while the gate is
//! closed (open it for the load's warmup, close it to hold requests). One
//! holding `panic-on` (a number) panics in an inference whose first element
//! is that number. The backend records the rows of every inference, so
//! tests can see batches and which requests ran.
//!
//! For memory accounting: a version holding `ballast` (a number of MiB)
//! keeps that much memory resident while loaded, and one also holding
//! `leak` never gives it back — its ballast is leaked when it is freed.
//!
//! For rollout guards: a version holding `work` (a number) does that many
//! thousand rounds of arithmetic on each inference, on the calling thread,
//! so that two versions' costs in CPU compare as their numbers do,
//! however the threads are scheduled; one
//! holding `nan-from` (a number) answers NaN for every row whose first
//! element is at least that number; one holding `fail-when-told` fails
//! every inference while the backend's failure switch is on
//! ([`FakeBackend::failures`]). One holding `cold-work` (a number) does
//! that many thousand rounds more for every inference any other such
//! engine ran since its own last one (up to eight), as a model whose
//! weights other models' runs pushed out of the cache pays to read them
//! back: at a small share of the traffic, a version runs colder. One
//! holding `off-cpu` (a number) then sleeps that many times as long as its
//! arithmetic took, off the CPU, as a run that waits for a disk, a lock or
//! another device does: its wall time is that many times more than its CPU
//! time, on any machine. One holding `engine-thread` does its arithmetic
//! on a thread of its own while the calling thread waits for it, as an
//! engine that hands a run to its own threads does.
//!
//! For engines that end by themselves (as a worker process does): a
//! version holding `exit-after` (a number) reports its engine's end once it
//! has answered that many inferences: it is no longer alive, and whoever
//! asked is told from another thread. It still answers, so that the
//! inference that ends it succeeds. One holding `exit-when-asked` (a
//! number) ends once it has been asked that many times whether it is
//! alive (`Model::alive`), and reads as alive to that last question: so a
//! test ends it between two such checks, as a worker process may end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::{Backend, BackendError, Model, Weight, WeightRole, WeightsError};
use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, Tensor};

/// `model.toml` for a fake model.
pub const FAKE_TOML: &str = "backend = \"fake\"\n\
    inputs = [{ name = \"x\", datatype = \"FP32\", shape = [-1, 4] }]\n\
    outputs = [{ name = \"y\", datatype = \"FP32\", shape = [-1, 4] }]\n\
    [warmup]\nbatch_sizes = [1, 2]\n";

/// Holds loads until opened. Closed gates count the loads waiting at them.
#[derive(Clone, Default)]
pub struct Gate {
    state: Arc<(Mutex<(bool, usize)>, Condvar)>,
}

impl Gate {
    /// A closed gate.
    pub fn closed() -> Gate {
        Gate::default()
    }

    /// Lets every waiting and future load through.
    pub fn open(&self) {
        let (lock, cvar) = &*self.state;
        lock.lock().unwrap_or_else(|e| e.into_inner()).0 = true;
        cvar.notify_all();
    }

    /// Closes the gate again: from now on, whatever waits at it is held.
    pub fn close(&self) {
        let (lock, _) = &*self.state;
        lock.lock().unwrap_or_else(|e| e.into_inner()).0 = false;
    }

    /// How many are waiting at the gate now.
    pub fn waiters(&self) -> usize {
        let (lock, _) = &*self.state;
        lock.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Blocks until `n` loads are waiting at the gate.
    pub fn wait_for_waiters(&self, n: usize) {
        let (lock, cvar) = &*self.state;
        let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        while guard.1 < n {
            guard = cvar.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn pass(&self) {
        let (lock, cvar) = &*self.state;
        let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        guard.1 += 1;
        cvar.notify_all();
        while !guard.0 {
            guard = cvar.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        guard.1 -= 1;
    }
}

/// The fake backend.
#[derive(Default)]
pub struct FakeBackend {
    gate: Option<Gate>,
    calls: Arc<Mutex<Vec<usize>>>,
    threads: Arc<Mutex<Vec<String>>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeBackend {
    /// A backend whose loads return at once.
    pub fn new() -> FakeBackend {
        FakeBackend::default()
    }

    /// A backend whose loads of versions holding a `hold` file wait at `gate`.
    pub fn gated(gate: Gate) -> FakeBackend {
        FakeBackend { gate: Some(gate), ..FakeBackend::default() }
    }

    /// The rows of every inference run so far, in order.
    pub fn calls(&self) -> Arc<Mutex<Vec<usize>>> {
        Arc::clone(&self.calls)
    }

    /// The name of the thread that ran each inference so far, in order.
    pub fn threads(&self) -> Arc<Mutex<Vec<String>>> {
        Arc::clone(&self.threads)
    }

    /// The switch that makes versions holding `fail-when-told` fail every
    /// inference while it is on.
    pub fn failures(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.fail)
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn load(&self, version: &Verified, _spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        let has = |name: &str| version.file(name).is_some();
        // Read through the verified files, as a real backend must.
        let read = |name: &str| -> Result<Option<String>, BackendError> {
            let Some(file) = version.file(name) else { return Ok(None) };
            let bytes = file.read_all().map_err(|e| BackendError::new("model_invalid", format!("{name}: {e}")))?;
            file.unchanged()?;
            Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
        };
        if let Some(gate) = &self.gate
            && has("hold")
        {
            gate.pass();
        }
        let text =
            read("fake.txt")?.ok_or_else(|| BackendError::new("model_invalid", "the version has no fake.txt"))?;
        let scale: f32 =
            text.trim().parse().map_err(|_| BackendError::new("model_invalid", format!("'{text}' is not a number")))?;
        let spec = |name: &str| TensorSpec { name: name.into(), datatype: DataType::Fp32, shape: vec![-1, 4] };
        let hold = has("hold-first-infer").then(|| self.gate.clone()).flatten();
        let hold_every = has("hold-every-infer").then(|| self.gate.clone()).flatten();
        let panic_on = match read("panic-on")? {
            Some(text) => {
                Some(text.trim().parse::<f32>().map_err(|_| BackendError::new("model_invalid", "bad panic-on"))?)
            }
            None => None,
        };
        let number = |name: &str| -> Result<Option<f64>, BackendError> {
            match read(name)? {
                Some(text) => text
                    .trim()
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| BackendError::new("model_invalid", format!("bad {name}"))),
                None => Ok(None),
            }
        };
        let work = number("work")?.map(|thousands| (thousands * 1000.0) as u64);
        let nan_from = number("nan-from")?.map(|v| v as f32);
        let cold_work = number("cold-work")?.map(|thousands| (thousands * 1000.0) as u64);
        let off_cpu = number("off-cpu")?;
        let engine_thread = has("engine-thread");
        let fail = has("fail-when-told").then(|| Arc::clone(&self.fail));
        let exit_after = number("exit-after")?.map(|n| n as u64);
        let exit_when_asked = number("exit-when-asked")?.map(|n| n as u64);
        let ballast = match read("ballast")? {
            Some(mib) => {
                let mib: usize = mib.trim().parse().map_err(|_| BackendError::new("model_invalid", "bad ballast"))?;
                // Non-zero bytes, so every page is really resident.
                vec![0xA5u8; mib << 20]
            }
            None => Vec::new(),
        };
        Ok(Box::new(FakeModel {
            ballast,
            leak: has("leak"),
            scale,
            signature: Signature { inputs: vec![spec("x")], outputs: vec![spec("y")] },
            hold: Mutex::new(hold),
            hold_every,
            panic_on,
            work,
            cold: cold_work.map(|rounds| Cold { rounds, last: AtomicU64::new(RUNS.load(Ordering::SeqCst)) }),
            nan_from,
            off_cpu,
            engine_thread,
            fail,
            exit: (exit_after.is_some() || exit_when_asked.is_some()).then(|| Exit {
                after: exit_after,
                answered: AtomicU64::new(0),
                asked_after: exit_when_asked,
                asked: AtomicU64::new(0),
                state: Mutex::default(),
            }),
            calls: Arc::clone(&self.calls),
            threads: Arc::clone(&self.threads),
        }))
    }
}

/// Inferences run by engines with `cold-work`, in this process.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// How much colder an engine runs the more other engines ran since it last did.
struct Cold {
    /// Rounds per inference run elsewhere since this engine's last one.
    rounds: u64,
    /// [`RUNS`] at this engine's last inference.
    last: AtomicU64,
}

impl Cold {
    /// The extra rounds of this inference.
    fn rounds(&self) -> u64 {
        let now = RUNS.fetch_add(1, Ordering::SeqCst);
        let before = self.last.swap(now + 1, Ordering::SeqCst);
        now.saturating_sub(before).min(8) * self.rounds
    }
}

/// Busy on this thread's CPU for `rounds`, as a heavier model would be.
fn spin(rounds: u64) {
    let mut acc: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..rounds {
        acc = std::hint::black_box(acc.rotate_left(5) ^ i).wrapping_mul(0x0000_0100_0000_01b3);
    }
    std::hint::black_box(acc);
}

type Notify = Box<dyn FnOnce(String) + Send>;

/// An engine that ends by itself after answering a number of inferences,
/// or after being asked a number of times whether it is alive.
struct Exit {
    after: Option<u64>,
    answered: AtomicU64,
    asked_after: Option<u64>,
    asked: AtomicU64,
    /// Whether it has ended, and who to tell when it does.
    state: Mutex<(bool, Option<Notify>)>,
}

impl Exit {
    /// Counts one answered inference; the one that reaches `after` ends
    /// the engine.
    fn answered(&self) {
        if Some(self.answered.fetch_add(1, Ordering::SeqCst) + 1) == self.after {
            self.end();
        }
    }

    /// Counts one question whether it is alive; the one that reaches
    /// `asked_after` ends the engine.
    fn asked(&self) {
        if Some(self.asked.fetch_add(1, Ordering::SeqCst) + 1) == self.asked_after {
            self.end();
        }
    }

    fn end(&self) {
        let notify = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0 = true;
            state.1.take()
        };
        if let Some(notify) = notify {
            std::thread::spawn(move || notify("the fake engine ended, as asked".into()));
        }
    }

    fn ended(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn on_exit(&self, notify: Notify) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 {
            drop(state);
            std::thread::spawn(move || notify("the fake engine ended, as asked".into()));
        } else {
            state.1 = Some(notify);
        }
    }
}

struct FakeModel {
    ballast: Vec<u8>,
    leak: bool,
    scale: f32,
    signature: Signature,
    hold: Mutex<Option<Gate>>,
    hold_every: Option<Gate>,
    panic_on: Option<f32>,
    work: Option<u64>,
    cold: Option<Cold>,
    nan_from: Option<f32>,
    off_cpu: Option<f64>,
    engine_thread: bool,
    fail: Option<Arc<std::sync::atomic::AtomicBool>>,
    exit: Option<Exit>,
    calls: Arc<Mutex<Vec<usize>>>,
    threads: Arc<Mutex<Vec<String>>>,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        if self.leak {
            // A leak on purpose: the memory stays resident and unreachable.
            let _: &'static mut [u8] = std::mem::take(&mut self.ballast).leak();
        }
    }
}

impl Model for FakeModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn visit_weights(&self, visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        let data = self.scale.to_le_bytes();
        visit(&Weight {
            name: "scale",
            datatype: Some(DataType::Fp32),
            shape: &[1, 1],
            data: &data,
            role: WeightRole::Compute,
        })
        .map_err(WeightsError::Refused)
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let hold = self.hold.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(gate) = hold.as_ref().or(self.hold_every.as_ref()) {
            gate.pass();
        }
        if let (Some(value), Some(first)) = (self.panic_on, inputs.first().and_then(Tensor::to_f32))
            && first.first() == Some(&value)
        {
            panic!("the fake engine panics on {value}, as asked");
        }
        let rows = inputs.first().and_then(|t| t.shape.first()).copied().unwrap_or(0);
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(usize::try_from(rows).unwrap_or(0));
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).push(thread);
        let cpu = baton_core::threads::sys::thread_cpu_time();
        let rounds = self.work.unwrap_or(0) + self.cold.as_ref().map_or(0, Cold::rounds);
        if self.engine_thread {
            std::thread::scope(|scope| {
                scope.spawn(|| spin(rounds));
            });
        } else {
            spin(rounds);
        }
        if let (Some(times), Some(worked)) = (self.off_cpu, baton_core::threads::sys::thread_cpu_time().zip(cpu)) {
            std::thread::sleep((worked.0 - worked.1).mul_f64(times));
        }
        if self.fail.as_ref().is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst)) {
            return Err(BackendError::new("inference_failed", "the fake engine fails, as told"));
        }
        let x = inputs
            .first()
            .and_then(Tensor::to_f32)
            .ok_or_else(|| BackendError::new("inference_failed", "input x must be FP32"))?;
        let mut y: Vec<f32> = x.iter().map(|v| v * self.scale).collect();
        if let Some(from) = self.nan_from {
            for row in y.chunks_mut(4).zip(x.chunks(4)) {
                if row.1.first().is_some_and(|first| *first >= from) {
                    row.0.iter_mut().for_each(|v| *v = f32::NAN);
                }
            }
        }
        if let Some(exit) = &self.exit {
            exit.answered();
        }
        Ok(vec![Tensor::from_f32("y", inputs[0].shape.clone(), &y)])
    }

    fn alive(&self) -> bool {
        let Some(exit) = &self.exit else { return true };
        let alive = !exit.ended();
        if alive {
            exit.asked();
        }
        alive
    }

    fn on_exit(&self, notify: Notify) {
        match &self.exit {
            Some(exit) => exit.on_exit(notify),
            None => drop(notify),
        }
    }
}
