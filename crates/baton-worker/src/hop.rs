//! Calls across the hop. Each slot is a control channel and two regions of
//! its own: the server's [`Caller`] lets one call at a time use a slot,
//! writes the inputs into the slot's input region and sends a short
//! message on its channel; on the worker's side ([`answer`]) a thread per
//! slot waits on that channel and runs the call on the inputs where they
//! lie, and the engine's outputs are written straight into the slot's
//! output region (the worker's, sent along when it is new or grew); then
//! it answers. So each tensor is copied once each way: the server's
//! inputs into the region, the engine's outputs into the other. The
//! calling thread waits on its own slot's channel, and no thread hands
//! work to another. Each side looks for the other's message briefly before
//! it sleeps: a call whose answer (or a slot whose next call) comes within
//! that time costs no wake-up, which on an idle CPU costs more than the
//! call itself (docs/workers.md, "Waiting for the other side").
//!
//! Every call has a deadline. When the worker's ends close (the process
//! exited, was killed, aborted), every waiting call and every later one
//! fails at once with [`HopError::Gone`]; none waits for its deadline.

use std::io;
use std::os::fd::OwnedFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use baton_core::tensor::{Tensor, TensorView};
use serde::{Deserialize, Serialize};

use crate::channel::{Channel, MAX_MESSAGE};
use crate::frame::{self, Meta};
use crate::region::Region;

/// How long each side looks for the other's message by default before it
/// sleeps: longer than a small model's call and the hop together, short
/// enough that the CPU it spends when nothing comes stays small
/// (docs/workers.md, "Waiting for the other side").
pub const SPIN_DEFAULT: Duration = Duration::from_micros(100);

/// The first region a slot gets; it grows to what a call needs.
const FIRST_REGION: usize = 64 * 1024;

/// Why a call across the hop failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HopError {
    /// The worker's end of the channel is closed.
    #[error("the worker is gone: {0}")]
    Gone(String),
    /// The worker did not answer within the deadline.
    #[error("the worker did not answer within {0:?}")]
    TimedOut(Duration),
    /// Every slot was taken for the whole deadline.
    #[error("no free slot to the worker within {0:?}")]
    Busy(Duration),
    /// The worker ran the call and it failed there.
    #[error("{message}")]
    Failed {
        /// The worker's stable kind string.
        kind: String,
        /// What went wrong.
        message: String,
    },
    /// The two sides did not understand each other, or a system call failed.
    #[error("the hop to the worker failed: {0}")]
    Broken(String),
}

impl HopError {
    /// A stable kind string for metrics and responses.
    pub fn kind(&self) -> &str {
        match self {
            HopError::Gone(_) => "worker_gone",
            HopError::TimedOut(_) => "worker_timed_out",
            HopError::Busy(_) => "worker_busy",
            HopError::Failed { kind, .. } => kind,
            HopError::Broken(_) => "worker_hop_broken",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Call {
    /// Run on the inputs in the slot's region; `region`: the region's
    /// descriptor is attached (the slot's first call, or a larger region);
    /// `instance`: on that instance of the engine (warmup reaches each).
    Infer {
        inputs: Vec<Meta>,
        region: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance: Option<usize>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// The outputs are in the slot's output region; `region`: in a new
    /// one (the slot's first, or a larger), whose descriptor is attached
    /// and which replaces it.
    Done { outputs: Vec<Meta>, region: bool },
    /// The call failed in the worker.
    Failed { kind: String, message: String },
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One call at a time's place on the hop: its channel, its input region
/// with whether the worker has that region yet, and the worker's output
/// region.
struct Slot {
    channel: Channel,
    region: Option<(Region, bool)>,
    outputs: Option<Region>,
    buffer: Vec<u8>,
}

/// The server's side of the hop to one worker.
pub struct Caller {
    slots: Vec<Mutex<Slot>>,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
    gone: Mutex<Option<String>>,
    spin: Duration,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller").field("slots", &self.slots.len()).field("gone", &self.gone()).finish()
    }
}

impl Caller {
    /// The server's side over `channels`, one slot each: as many calls in
    /// flight at most. A call looks for its answer for up to `spin` before
    /// its thread sleeps ([`Channel::readable_soon`]); zero sleeps at once.
    pub fn new(channels: Vec<Channel>, spin: Duration) -> Caller {
        let slots: Vec<_> = channels
            .into_iter()
            .map(|channel| Mutex::new(Slot { channel, region: None, outputs: None, buffer: Vec::new() }))
            .collect();
        Caller {
            free: Mutex::new((0..slots.len()).rev().collect()),
            slots,
            freed: Condvar::new(),
            gone: Mutex::new(None),
            spin,
        }
    }

    /// Why the worker is gone, once it is.
    pub fn gone(&self) -> Option<String> {
        lock(&self.gone).clone()
    }

    fn set_gone(&self, why: String) -> HopError {
        let why = lock(&self.gone).get_or_insert(why).clone();
        let _free = lock(&self.free);
        self.freed.notify_all();
        HopError::Gone(why)
    }

    /// Runs one call on the worker, within `within`.
    pub fn call(&self, inputs: &[Tensor], within: Duration) -> Result<Vec<Tensor>, HopError> {
        self.call_on(None, inputs, within)
    }

    /// Runs one call on the worker, on the engine's `instance` when one is
    /// named, within `within`.
    pub fn call_on(
        &self,
        instance: Option<usize>,
        inputs: &[Tensor],
        within: Duration,
    ) -> Result<Vec<Tensor>, HopError> {
        let deadline = Instant::now() + within;
        let index = self.take_slot(deadline, within)?;
        let mut slot = lock(&self.slots[index]);
        let result = self.send(&mut slot, instance, inputs).and_then(|()| self.wait(&mut slot, deadline, within));
        drop(slot);
        // A call that timed out leaves its slot to the worker, which may
        // still write into it; any other returns it.
        if !matches!(result, Err(HopError::TimedOut(_))) {
            lock(&self.free).push(index);
            self.freed.notify_one();
        }
        result
    }

    fn take_slot(&self, deadline: Instant, within: Duration) -> Result<usize, HopError> {
        let mut free = lock(&self.free);
        loop {
            if let Some(why) = self.gone() {
                return Err(HopError::Gone(why));
            }
            if let Some(index) = free.pop() {
                return Ok(index);
            }
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
            let Some(left) = left else { return Err(HopError::Busy(within)) };
            free = self.freed.wait_timeout(free, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn send(&self, slot: &mut Slot, instance: Option<usize>, inputs: &[Tensor]) -> Result<(), HopError> {
        let broken = |e: io::Error| HopError::Broken(e.to_string());
        let need = frame::size_of(inputs);
        if slot.region.as_ref().is_none_or(|(r, _)| r.len() < need) {
            slot.region = Some((Region::create(need.max(FIRST_REGION)).map_err(broken)?, false));
        }
        let (region, shared) = slot.region.as_mut().expect("a region was just made");
        let inputs = frame::write(region.bytes_mut(), inputs).map_err(HopError::Broken)?;
        let call = Call::Infer { inputs, region: !*shared, instance };
        let message = serde_json::to_vec(&call).map_err(|e| HopError::Broken(e.to_string()))?;
        let fds = if *shared { Vec::new() } else { vec![region.fd()] };
        match slot.channel.send(&message, &fds) {
            Ok(()) => {}
            // A peer that died with data unread reads as a reset connection.
            Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                return Err(self.set_gone("the worker closed its channel".into()));
            }
            Err(e) => return Err(broken(e)),
        }
        *shared = true;
        Ok(())
    }

    fn wait(&self, slot: &mut Slot, deadline: Instant, within: Duration) -> Result<Vec<Tensor>, HopError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if !slot.channel.readable_soon(self.spin.min(left))
            && !slot.channel.readable_within(left).map_err(|e| HopError::Broken(e.to_string()))?
        {
            return Err(HopError::TimedOut(within));
        }
        if slot.buffer.len() < MAX_MESSAGE {
            slot.buffer = vec![0; MAX_MESSAGE];
        }
        let mut buffer = std::mem::take(&mut slot.buffer);
        let received = slot.channel.recv_into(&mut buffer);
        let result = match received {
            Ok(None) => Err(self.set_gone("the worker closed its channel".into())),
            Err(error) => Err(self.set_gone(format!("reading from the worker: {error}"))),
            Ok(Some((bytes, fds))) => match serde_json::from_slice::<Answer>(&buffer[..bytes]) {
                Err(error) => Err(HopError::Broken(format!("the worker sent a message baton does not read: {error}"))),
                Ok(answer) => read_answer(slot, answer, fds.into_iter().next()),
            },
        };
        slot.buffer = buffer;
        result
    }
}

/// The outputs an answer points at, in the slot's output region or in
/// the new one the worker sent.
fn read_answer(slot: &mut Slot, answer: Answer, fd: Option<OwnedFd>) -> Result<Vec<Tensor>, HopError> {
    match answer {
        Answer::Failed { kind, message } => Err(HopError::Failed { kind, message }),
        Answer::Done { outputs, region: new } => {
            if new {
                let fd = fd.ok_or_else(|| HopError::Broken("an output region was announced, not sent".into()))?;
                slot.outputs = Some(Region::open(fd).map_err(|e| HopError::Broken(e.to_string()))?);
            }
            let region = match (&slot.outputs, outputs.is_empty()) {
                (Some(region), _) => region.bytes(),
                (None, true) => &[],
                (None, false) => return Err(HopError::Broken("an answer in no region".into())),
            };
            frame::read(region, &outputs).map_err(HopError::Broken)
        }
    }
}

/// What a worker's run returns when a call fails: a stable kind and a message.
pub type RunError = (String, String);

/// Where a worker's run lends each output, in turn.
pub type Out<'o> = &'o mut dyn FnMut(&TensorView<'_>);

/// The worker's side: answers the calls of each of `channels` on a thread
/// of its own with `run` (given the engine instance a call names, if any,
/// the inputs where they lie in shared memory, and where to lend each
/// output), until the server's ends close. After each answer a thread looks
/// for its next call for up to `spin` before it sleeps.
pub fn answer<F>(channels: Vec<Channel>, spin: Duration, run: F) -> io::Result<()>
where
    F: Fn(Option<usize>, &[TensorView<'_>], Out<'_>) -> Result<(), RunError> + Sync,
{
    std::thread::scope(|scope| {
        let threads: Vec<_> = channels
            .into_iter()
            .map(|channel| {
                let run = &run;
                std::thread::Builder::new()
                    .name("baton-worker-slot".into())
                    .spawn_scoped(scope, move || serve_slot(&channel, spin, run))
            })
            .collect::<io::Result<_>>()?;
        threads
            .into_iter()
            .try_for_each(|t| t.join().unwrap_or_else(|_| Err(io::Error::other("a slot thread panicked"))))
    })
}

/// One slot's calls, answered in turn until the server's end closes.
fn serve_slot<F>(channel: &Channel, spin: Duration, run: &F) -> io::Result<()>
where
    F: Fn(Option<usize>, &[TensorView<'_>], Out<'_>) -> Result<(), RunError> + Sync,
{
    let mut inputs_region: Option<Region> = None;
    let mut outputs = Outputs { region: None, new: false, offset: 0, metas: Vec::new(), error: None };
    let mut buffer = vec![0; MAX_MESSAGE];
    loop {
        // The next call often follows at once under load: looking for it
        // briefly spares the wake-up.
        channel.readable_soon(spin);
        let Some((bytes, fds)) = channel.recv_into(&mut buffer)? else { break };
        let call: Call =
            serde_json::from_slice(&buffer[..bytes]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let Call::Infer { inputs, region: sent, instance } = call;
        if sent {
            let fd = fds.into_iter().next();
            let fd =
                fd.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "a region was announced, not sent"))?;
            inputs_region = Some(Region::open(fd)?);
        }
        let Some(current) = inputs_region.as_ref() else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a call before any region"));
        };
        let answer = run_one(current, &inputs, &mut outputs, &|views: &[TensorView<'_>], out: Out<'_>| {
            run(instance, views, out)
        });
        let message = serde_json::to_vec(&answer).map_err(io::Error::other)?;
        let fds = match (&answer, &outputs.region) {
            (Answer::Done { region: true, .. }, Some(region)) => vec![region.fd()],
            _ => Vec::new(),
        };
        channel.send(&message, &fds)?;
    }
    Ok(())
}

/// The outputs of one call, written into the slot's output region as the
/// engine lends them, the region made anew (larger) when one does not fit.
struct Outputs {
    region: Option<Region>,
    /// Whether this call made the region, so the server must be sent it.
    new: bool,
    offset: usize,
    metas: Vec<Meta>,
    error: Option<String>,
}

impl Outputs {
    /// Begins a call's outputs. A region made by a call that then failed
    /// is still new: it goes with the next answer that has outputs.
    fn start(&mut self) {
        (self.offset, self.error) = (0, None);
        self.metas.clear();
    }

    fn push(&mut self, tensor: &TensorView<'_>) {
        if self.error.is_some() {
            return;
        }
        let need = self.offset + tensor.len().next_multiple_of(frame::ALIGN);
        if self.region.as_ref().is_none_or(|r| r.len() < need) {
            // What this call wrote so far moves with it: rare, as a region
            // grows to what calls need and stays.
            let size = need.max(FIRST_REGION).max(self.region.as_ref().map_or(0, |r| r.len() * 2));
            match Region::create(size) {
                Ok(mut larger) => {
                    if let Some(old) = &self.region {
                        larger.bytes_mut()[..self.offset].copy_from_slice(&old.bytes()[..self.offset]);
                    }
                    (self.region, self.new) = (Some(larger), true);
                }
                Err(e) => {
                    self.error = Some(format!("making an output region of {size} bytes: {e}"));
                    return;
                }
            }
        }
        let region = self.region.as_mut().expect("a region fits");
        let meta = frame::write_one(region.bytes_mut(), self.offset, tensor);
        self.offset = need;
        self.metas.push(meta);
    }
}

/// Runs one call on the inputs in `region`, its outputs written into
/// `outputs`; the answer.
fn run_one<F>(region: &Region, inputs: &[Meta], outputs: &mut Outputs, run: &F) -> Answer
where
    F: Fn(&[TensorView<'_>], Out<'_>) -> Result<(), RunError> + Sync,
{
    let failed = |kind: &str, message: String| Answer::Failed { kind: kind.to_owned(), message };
    outputs.start();
    let ran = match frame::views(region.bytes(), inputs) {
        Err(message) => Err(("invalid_tensors".to_owned(), message)),
        Ok(views) => catch_unwind(AssertUnwindSafe(|| run(&views, &mut |tensor| outputs.push(tensor))))
            .unwrap_or_else(|_| Err(("worker_panicked".to_owned(), "the worker's engine panicked".to_owned()))),
    };
    match (ran, outputs.error.take()) {
        (Err((kind, message)), _) => failed(&kind, message),
        (Ok(()), Some(message)) => failed("worker_hop_broken", message),
        (Ok(()), None) => {
            Answer::Done { outputs: std::mem::take(&mut outputs.metas), region: std::mem::take(&mut outputs.new) }
        }
    }
}
