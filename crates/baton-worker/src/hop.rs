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
//! Messages are small by design: the tensors and their index lie in the
//! regions ([`frame`]), and a message says only where the index is. A
//! region is bounded (`[engine] worker_region_mb`): inputs or an answer
//! that do not fit fail their own call with `worker_region_exceeded`, and
//! the slot serves the next.
//!
//! Every call has a deadline. When the worker's ends close (the process
//! exited, was killed, aborted), every waiting call and every later one
//! fails at once with [`HopError::Gone`]; none waits for its deadline. A
//! slot whose peer breaks the protocol (a message or a region it cannot
//! read) is never used again, on either side: the worker exits, and the
//! server counts the worker as gone, so that it is replaced as one that
//! ended by itself.

use std::io;
use std::os::fd::OwnedFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use baton_core::run::executor::timing;
use baton_core::tensors::tensor::{Tensor, TensorView};
use serde::{Deserialize, Serialize};

use crate::channel::Channel;
use crate::frame::{self, Placed};
use crate::region::{PeerRegion, Region};

/// How long each side looks for the other's message by default before it
/// sleeps: longer than a small model's call and the hop together, short
/// enough that the CPU it spends when nothing comes stays small
/// (docs/workers.md, "Waiting for the other side").
pub const SPIN_DEFAULT: Duration = Duration::from_micros(100);

/// The largest shared region of a slot by default (`[engine]
/// worker_region_mb`): a call's inputs, or its answer, with their index.
pub const REGION_DEFAULT: usize = 1 << 30;

/// The largest message on a slot's channel: a call or an answer says where
/// its index lies, or why it failed, in a few hundred bytes.
pub const SLOT_MESSAGE: usize = 16 << 10;

/// The longest failure message an answer carries, in characters.
const MESSAGE_CHARS: usize = 2048;

/// The first region a slot gets; it grows to what a call needs.
const FIRST_REGION: usize = 64 * 1024;

/// The kind of a call whose inputs or answer do not fit a slot's region.
pub const REGION_EXCEEDED: &str = "worker_region_exceeded";

/// The kind of a call the hop itself failed, on either side, leaving the
/// slot to serve the next call.
pub const HOP_FAILED: &str = "worker_hop_failed";

/// The most tensors in a frame, unless the reader knows better (the
/// server bounds a worker's answers by its version's outputs).
pub const MOST_TENSORS: usize = 4096;

/// How many times a region's size an answer may take once the server has
/// copied it out: string elements cost the bookkeeping of each besides
/// their bytes ([`frame::HELD_PER_ELEMENT`]).
pub const HELD_PER_REGION: usize = 2;

/// Why a call across the hop failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HopError {
    /// The worker's end of the channel is closed, or the worker counts as
    /// gone since its hop broke.
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
    /// The call's inputs do not fit a slot's region.
    #[error("the request's inputs need {need} bytes of the worker's shared region, more than its {most} bytes")]
    TooLarge {
        /// What they need, index included.
        need: usize,
        /// The region's bound.
        most: usize,
    },
    /// A system call on the server's side failed; nothing was sent.
    #[error("the hop to the worker failed: {0}")]
    System(String),
    /// The worker broke the protocol: a message or a region the server
    /// cannot read. The worker counts as gone from then on.
    #[error("the hop to the worker broke: {0}")]
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
            HopError::TooLarge { .. } => REGION_EXCEEDED,
            HopError::System(_) => HOP_FAILED,
            HopError::Broken(_) => "worker_hop_broken",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Call {
    /// Run on the inputs whose index is at `inputs` in the slot's region;
    /// `region`: the region's descriptor is attached (the slot's first
    /// call, or a larger region); `instance`: on that instance of the
    /// engine (warmup reaches each).
    Infer {
        inputs: Placed,
        region: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance: Option<usize>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// The outputs' index is at `outputs` in the slot's output region;
    /// `region`: in a new one (the slot's first, or a larger), whose
    /// descriptor is attached and which replaces it.
    /// `ran_ns`: how long the call took on the slot's thread, from its
    /// message read to its answer, less that thread's waits for a CPU
    /// meanwhile (absent where the kernel does not count them). The
    /// server's latency sample counts it in place of its wait for the
    /// answer, at most that wait (`baton_core::run::executor::timing`); a value
    /// that is not a whole number of nanoseconds is read as absent.
    Done {
        outputs: Placed,
        region: bool,
        #[serde(default, deserialize_with = "lenient_nanos", skip_serializing_if = "Option::is_none")]
        ran_ns: Option<u64>,
    },
    /// The call failed in the worker.
    Failed { kind: String, message: String },
    /// The worker could not map the input region the call carried, and
    /// holds none now: the call did not run, and the slot's next call
    /// carries a region again.
    Unmapped { message: String },
}

/// A count of nanoseconds from the worker, or `None` for anything else: a
/// timing the server cannot read costs the call nothing.
fn lenient_nanos<'de, D: serde::Deserializer<'de>>(from: D) -> Result<Option<u64>, D::Error> {
    Ok(serde_json::Value::deserialize(from)?.as_u64())
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
    outputs: Option<PeerRegion>,
    buffer: Vec<u8>,
}

/// The server's side of the hop to one worker.
pub struct Caller {
    slots: Vec<Mutex<Slot>>,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
    gone: Mutex<Option<String>>,
    spin: Duration,
    most: usize,
    tensors: usize,
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
    /// Regions hold up to [`REGION_DEFAULT`] bytes.
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
            most: REGION_DEFAULT,
            tensors: MOST_TENSORS,
        }
    }

    /// Bounds the tensors of an answer to `most` (a version's outputs).
    pub fn with_tensor_limit(mut self, most: usize) -> Caller {
        self.tensors = most;
        self
    }

    /// Bounds each region, the server's and the worker's, to `most` bytes
    /// (taken down to a whole number of pages, as the worker takes it).
    pub fn with_region_limit(mut self, most: usize) -> Caller {
        self.most = page_floor(most);
        self
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
        let result =
            self.send(&mut slot, instance, inputs).and_then(|waiting| self.wait(&mut slot, waiting, deadline, within));
        drop(slot);
        match &result {
            // The slot is left to the worker, which may still write into
            // it; the server kills a worker that does not answer.
            Err(HopError::TimedOut(_)) => {}
            // Nobody can tell what the slot holds now: the worker goes.
            Err(HopError::Broken(why)) => drop(self.set_gone(format!("its hop broke: {why}"))),
            _ => {
                lock(&self.free).push(index);
                self.freed.notify_one();
            }
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

    /// Sends the call; the wait for its answer, begun just before the
    /// message left, so that the worker's part always falls within it.
    fn send(&self, slot: &mut Slot, instance: Option<usize>, inputs: &[Tensor]) -> Result<timing::Waiting, HopError> {
        let system = |e: io::Error| HopError::System(e.to_string());
        let views: Vec<TensorView<'_>> = inputs.iter().map(Tensor::view).collect();
        let (metas, end) = frame::layout(&views);
        let index = frame::index_bytes(&metas);
        let need = end.saturating_add(index.len());
        if need > self.most {
            return Err(HopError::TooLarge { need, most: self.most });
        }
        if slot.region.as_ref().is_none_or(|(r, _)| r.len() < need) {
            let size = need.max(FIRST_REGION).min(self.most);
            slot.region = Some((Region::create(size).map_err(system)?, false));
        }
        let (region, shared) = slot.region.as_mut().expect("a region was just made");
        let inputs = frame::write(region.bytes_mut(), &views, end, &index).map_err(HopError::System)?;
        let call = Call::Infer { inputs, region: !*shared, instance };
        let message = serde_json::to_vec(&call).map_err(|e| HopError::System(e.to_string()))?;
        let fds = if *shared { Vec::new() } else { vec![region.fd()] };
        let waiting = timing::Waiting::start();
        match slot.channel.send(&message, &fds) {
            Ok(()) => {}
            // A peer that died with data unread reads as a reset connection.
            Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                return Err(self.set_gone("the worker closed its channel".into()));
            }
            Err(e) => return Err(system(e)),
        }
        *shared = true;
        Ok(waiting)
    }

    /// Waits for the answer; the wait counts as the worker's timing of
    /// its part.
    fn wait(
        &self,
        slot: &mut Slot,
        waiting: timing::Waiting,
        deadline: Instant,
        within: Duration,
    ) -> Result<Vec<Tensor>, HopError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if !slot.channel.readable_soon(self.spin.min(left))
            && !slot.channel.readable_within(left).map_err(|e| HopError::Broken(format!("waiting for it: {e}")))?
        {
            return Err(HopError::TimedOut(within));
        }
        if slot.buffer.len() < SLOT_MESSAGE {
            slot.buffer = vec![0; SLOT_MESSAGE];
        }
        let mut buffer = std::mem::take(&mut slot.buffer);
        let received = slot.channel.recv_into(&mut buffer);
        let result = match received {
            Ok(None) => Err(self.set_gone("the worker closed its channel".into())),
            // A peer that died with data unread reads as a reset connection.
            Err(error) if error.kind() == io::ErrorKind::ConnectionReset => {
                Err(self.set_gone("the worker closed its channel".into()))
            }
            Err(error) => Err(HopError::Broken(format!("reading its answer: {error}"))),
            Ok(Some((bytes, fds))) => match serde_json::from_slice::<Answer>(&buffer[..bytes]) {
                Err(error) => Err(HopError::Broken(format!("it sent a message baton does not read: {error}"))),
                Ok(answer) => {
                    let ran = match &answer {
                        Answer::Done { ran_ns, .. } => ran_ns.map(Duration::from_nanos),
                        _ => None,
                    };
                    waiting.answered(ran);
                    self.read_answer(slot, answer, fds.into_iter().next())
                }
            },
        };
        slot.buffer = buffer;
        result
    }

    /// The outputs an answer points at, in the slot's output region or in
    /// the new one the worker sent.
    fn read_answer(&self, slot: &mut Slot, answer: Answer, fd: Option<OwnedFd>) -> Result<Vec<Tensor>, HopError> {
        match answer {
            Answer::Failed { kind, message } => Err(HopError::Failed { kind, message }),
            Answer::Unmapped { message } => {
                // The worker holds no input region: the next call makes one
                // of the size it needs, and sends it.
                slot.region = None;
                Err(HopError::Failed { kind: HOP_FAILED.to_owned(), message })
            }
            Answer::Done { outputs, region: new, .. } => {
                if new {
                    let fd = fd.ok_or_else(|| HopError::Broken("an output region was announced, not sent".into()))?;
                    let region = PeerRegion::open(fd, self.most)
                        .map_err(|e| HopError::Broken(format!("its output region: {e}")))?;
                    slot.outputs = Some(region);
                }
                let region = slot.outputs.as_ref().ok_or_else(|| HopError::Broken("an answer in no region".into()))?;
                let bounds = frame::Bounds { tensors: self.tensors, held: self.most.saturating_mul(HELD_PER_REGION) };
                frame::read(region, outputs, bounds).map_err(|e| HopError::Broken(format!("its answer: {e}")))
            }
        }
    }
}

/// `bytes` taken down to a whole number of pages (of at least one): a
/// region's bound, so that a region made up to it, whole pages, stays
/// within it.
pub fn page_floor(bytes: usize) -> usize {
    (bytes - bytes % crate::region::PAGE).max(crate::region::PAGE)
}

/// What a worker's run returns when a call fails: a stable kind and a message.
pub type RunError = (String, String);

/// Where a worker's run lends each output, in turn.
pub type Out<'o> = &'o mut dyn FnMut(&TensorView<'_>);

/// How the worker's side answers: how long a slot looks for its next call
/// before it sleeps, and how large a region may be.
#[derive(Clone, Copy, Debug)]
pub struct Answering {
    /// The look for the next call; zero sleeps at once.
    pub spin: Duration,
    /// The largest region, the server's or the worker's, in bytes.
    pub most: usize,
}

/// The worker's side: answers the calls of each of `channels` on a thread
/// of its own with `run` (given the engine instance a call names, if any,
/// the inputs where they lie in shared memory, and where to lend each
/// output), until the server's ends close. After each answer a thread looks
/// for its next call for `how.spin` before it sleeps.
///
/// A slot that fails (a call it cannot read, an answer it cannot send)
/// ends every slot, and this returns its error: the worker then exits,
/// and the server replaces it, rather than keep a process whose slots the
/// server can no longer trust.
pub fn answer<F>(channels: Vec<Channel>, how: Answering, run: F) -> io::Result<()>
where
    F: Fn(Option<usize>, &[TensorView<'_>], Out<'_>) -> Result<(), RunError> + Sync,
{
    let how = Answering { most: page_floor(how.most), ..how };
    std::thread::scope(|scope| {
        let all = &channels;
        let threads: Vec<_> = channels
            .iter()
            .map(|channel| {
                let run = &run;
                std::thread::Builder::new().name("baton-worker-slot".into()).spawn_scoped(scope, move || {
                    let served = serve_slot(channel, how, run);
                    if served.is_err() {
                        // The others read their channel's close and end.
                        all.iter().for_each(Channel::shutdown);
                    }
                    served
                })
            })
            .collect::<io::Result<_>>()?;
        let ended: Vec<io::Result<()>> = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(io::Error::other("a slot thread panicked"))))
            .collect();
        ended.into_iter().collect()
    })
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// One slot's calls, answered in turn until the server's end closes.
fn serve_slot<F>(channel: &Channel, how: Answering, run: &F) -> io::Result<()>
where
    F: Fn(Option<usize>, &[TensorView<'_>], Out<'_>) -> Result<(), RunError> + Sync,
{
    let mut inputs_region: Option<PeerRegion> = None;
    let mut outputs = Outputs::new(how.most);
    let mut buffer = vec![0; SLOT_MESSAGE];
    loop {
        // The next call often follows at once under load: looking for it
        // briefly spares the wake-up.
        channel.readable_soon(how.spin);
        let Some((bytes, fds)) = channel.recv_into(&mut buffer)? else { break };
        // The call's own time, sent with its answer, runs from here.
        let (began, delay) = (Instant::now(), timing::own_run_delay());
        let call: Call = serde_json::from_slice(&buffer[..bytes])
            .map_err(|e| invalid(format!("the server sent a call this worker does not read: {e}")))?;
        let Call::Infer { inputs, region: sent, instance } = call;
        let mut unmapped = None;
        if sent {
            let fd = fds.into_iter().next().ok_or_else(|| invalid("a region was announced, not sent"))?;
            // A region this process cannot map (its memory limit, say)
            // fails this call alone; one that is no region breaks the hop.
            inputs_region = match PeerRegion::open(fd, how.most) {
                Ok(region) => Some(region),
                Err(error) if error.kind() == io::ErrorKind::InvalidData => {
                    return Err(invalid(format!("the input region: {error}")));
                }
                Err(error) => {
                    unmapped = Some(format!("the worker could not map the request's input region: {error}"));
                    None
                }
            };
        }
        let mut answer = match (unmapped, &inputs_region) {
            (Some(message), _) => Answer::Unmapped { message: bounded(&message) },
            (None, None) => return Err(invalid("a call before any region")),
            (None, Some(current)) => {
                run_one(current, inputs, &mut outputs, &|views: &[TensorView<'_>], out: Out<'_>| {
                    run(instance, views, out)
                })
            }
        };
        if let Answer::Done { ran_ns, .. } = &mut answer {
            let waited = timing::own_run_delay().zip(delay).map(|(now, then)| now.saturating_sub(then));
            let ran = waited.map(|waited| began.elapsed().saturating_sub(waited));
            *ran_ns = ran.map(|ran| u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX));
        }
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
/// engine lends them, the region made anew (larger, up to `most` bytes)
/// when one does not fit.
struct Outputs {
    region: Option<Region>,
    /// Whether this call made the region, so the server must be sent it.
    new: bool,
    offset: usize,
    metas: Vec<frame::Meta>,
    /// What the outputs so far cost the server once it copies them out.
    held: usize,
    /// Why the answer cannot be written: its kind and message.
    error: Option<(&'static str, String)>,
    most: usize,
}

impl Outputs {
    fn new(most: usize) -> Outputs {
        Outputs { region: None, new: false, offset: 0, metas: Vec::new(), held: 0, error: None, most }
    }

    /// Begins a call's outputs. A region made by a call that then failed
    /// is still new: it goes with the next answer that has outputs.
    fn start(&mut self) {
        (self.offset, self.held, self.error) = (0, 0, None);
        self.metas.clear();
    }

    /// Makes sure the region holds `need` bytes, what this call wrote so
    /// far moving into a larger one if it does not.
    fn fit(&mut self, need: usize) -> Result<(), (&'static str, String)> {
        if self.region.as_ref().is_some_and(|r| r.len() >= need) {
            return Ok(());
        }
        if need > self.most {
            let why = format!(
                "the answer needs more than the {} MiB the worker's shared region may hold \
                 ([engine] worker_region_mb): ask for less in one request, or raise it",
                self.most >> 20
            );
            return Err((REGION_EXCEEDED, why));
        }
        // Rare: a region grows to what calls need and stays.
        let size = need.max(FIRST_REGION).max(self.region.as_ref().map_or(0, |r| r.len() * 2)).min(self.most);
        let mut larger =
            Region::create(size).map_err(|e| (HOP_FAILED, format!("making an output region of {size} bytes: {e}")))?;
        if let Some(mut old) = self.region.take() {
            larger.bytes_mut()[..self.offset].copy_from_slice(&old.bytes_mut()[..self.offset]);
        }
        (self.region, self.new) = (Some(larger), true);
        Ok(())
    }

    fn push(&mut self, tensor: &TensorView<'_>) {
        if self.error.is_some() {
            return;
        }
        // The server refuses an answer that costs it more than this once
        // copied out: refused here first, for this request alone.
        self.held = self.held.saturating_add(frame::held_by(tensor));
        let most = self.most.saturating_mul(HELD_PER_REGION);
        if self.held > most {
            let why = format!(
                "the answer would take more than {} MiB once copied out of the worker's shared region, twice \
                 [engine] worker_region_mb (each string element costs {} bytes besides its own): ask for less \
                 in one request, or raise it",
                most >> 20,
                frame::HELD_PER_ELEMENT
            );
            self.error = Some((REGION_EXCEEDED, why));
            return;
        }
        let len = frame::len_of(tensor);
        let written = self.fit(self.offset.saturating_add(len)).and_then(|()| {
            let region = self.region.as_mut().expect("a region fits");
            frame::write_one(region.bytes_mut(), self.offset, tensor).map_err(|e| ("invalid_tensors", e))
        });
        match written {
            Ok(meta) => {
                self.offset += len.next_multiple_of(frame::ALIGN);
                self.metas.push(meta);
            }
            Err(error) => self.error = Some(error),
        }
    }

    /// Writes the index after the outputs; where it lies.
    fn finish(&mut self) -> Result<Placed, (&'static str, String)> {
        let index = frame::index_bytes(&self.metas);
        self.fit(self.offset.saturating_add(index.len()))?;
        let region = self.region.as_mut().expect("a region fits");
        frame::write_index(region.bytes_mut(), self.offset, &index).map_err(|e| (HOP_FAILED, e))
    }
}

/// A failure's message as an answer carries it: at most
/// [`MESSAGE_CHARS`] characters, without control characters, so that the
/// answer fits a slot's message.
pub(crate) fn bounded(message: &str) -> String {
    let mut bounded: String =
        message.chars().take(MESSAGE_CHARS).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if message.chars().nth(MESSAGE_CHARS).is_some() {
        bounded.push_str(" (cut short)");
    }
    bounded
}

/// A stable kind as an answer carries it: what the engine said, when it is
/// a short word.
fn bounded_kind(kind: &str) -> String {
    let word = !kind.is_empty() && kind.len() <= 64 && kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if word { kind.to_owned() } else { "worker_failed".to_owned() }
}

/// The message of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("")
}

/// Runs one call on the inputs whose index is at `inputs` in `region`, its
/// outputs written into `outputs`; the answer.
fn run_one<F>(region: &PeerRegion, inputs: Placed, outputs: &mut Outputs, run: &F) -> Answer
where
    F: Fn(&[TensorView<'_>], Out<'_>) -> Result<(), RunError> + Sync,
{
    let failed = |kind: &str, message: &str| Answer::Failed { kind: bounded_kind(kind), message: bounded(message) };
    outputs.start();
    let bytes = region.bytes_in_place();
    let metas = match frame::index(bytes, inputs, usize::MAX) {
        Ok(metas) => metas,
        Err(message) => return failed("invalid_tensors", &message),
    };
    let ran = match frame::views(bytes, &metas) {
        Err(message) => Err(("invalid_tensors".to_owned(), message)),
        Ok(views) => catch_unwind(AssertUnwindSafe(|| run(&views, &mut |tensor| outputs.push(tensor)))).unwrap_or_else(
            |payload| {
                // The kind an engine's panic has in the server's process too.
                let message = format!("the engine panicked on this request: {}", panic_message(payload.as_ref()));
                Err(("engine_panicked".to_owned(), message))
            },
        ),
    };
    match (ran, outputs.error.take()) {
        (Err((kind, message)), _) => failed(&kind, &message),
        (Ok(()), Some((kind, message))) => failed(kind, &message),
        (Ok(()), None) => match outputs.finish() {
            Ok(placed) => Answer::Done { outputs: placed, region: std::mem::take(&mut outputs.new), ran_ns: None },
            Err((kind, message)) => failed(kind, &message),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_s_timing_that_is_not_a_whole_number_of_nanoseconds_is_read_as_absent() {
        let waited = |value: &str| {
            let text = format!(r#"{{"Done":{{"outputs":{{"offset":0,"len":8}},"region":false{value}}}}}"#);
            match serde_json::from_str::<Answer>(&text).unwrap_or_else(|e| panic!("{text}: {e}")) {
                Answer::Done { ran_ns, .. } => ran_ns,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(waited(r#","ran_ns":1500"#), Some(1500));
        assert_eq!(waited(""), None);
        for bad in ["-5", "1.5", "\"1000\"", "18446744073709551616", "null", "[]"] {
            assert_eq!(waited(&format!(r#","ran_ns":{bad}"#)), None, "{bad}");
        }
    }

    #[test]
    fn a_failure_s_kind_and_message_are_bounded_so_that_its_answer_fits_a_message() {
        let message = "\"\\\u{0}é".repeat(10_000);
        let answer = Answer::Failed { kind: bounded_kind(&"k".repeat(100)), message: bounded(&message) };
        assert!(serde_json::to_vec(&answer).unwrap().len() <= SLOT_MESSAGE);
        assert_eq!(bounded_kind("model_refused"), "model_refused");
        assert_eq!(bounded_kind("no spaces"), "worker_failed");
        assert_eq!(bounded("short"), "short");
    }

    /// The failures by which a worker is ending are the ones the core
    /// reads as such (a rollout's twin that fails so is not the stable
    /// version's error); a failure that leaves the worker serving is not.
    #[test]
    fn the_failures_of_a_worker_that_is_ending_are_the_ones_the_core_reads_so() {
        let ending =
            [HopError::Gone(String::new()), HopError::TimedOut(Duration::ZERO), HopError::Broken(String::new())];
        let serving = [
            HopError::Busy(Duration::ZERO),
            HopError::System(String::new()),
            HopError::TooLarge { need: 1, most: 0 },
            HopError::Failed { kind: HOP_FAILED.into(), message: String::new() },
        ];
        for error in &ending {
            assert!(baton_core::rollout::ENGINE_ENDING.contains(&error.kind()), "{error:?}");
        }
        for error in &serving {
            assert!(!baton_core::rollout::ENGINE_ENDING.contains(&error.kind()), "{error:?}");
        }
    }

    #[test]
    fn an_answer_past_the_region_bound_is_refused_and_the_next_fits() {
        let mut outputs = Outputs::new(1 << 20);
        outputs.start();
        let big = Tensor::from_f32("big", vec![1 << 19], &vec![0.5; 1 << 19]);
        outputs.push(&big.view());
        assert_eq!(outputs.error.as_ref().map(|(kind, _)| *kind), Some(REGION_EXCEEDED));
        outputs.start();
        outputs.push(&Tensor::from_f32("small", vec![4], &[1.0; 4]).view());
        assert!(outputs.error.is_none());
        let placed = outputs.finish().unwrap();
        let region = outputs.region.as_mut().unwrap();
        let bounds = frame::Bounds { tensors: 1, held: 2 << 20 };
        let tensors = frame::read(&region.bytes_mut()[..], placed, bounds).unwrap();
        assert_eq!(tensors, vec![Tensor::from_f32("small", vec![4], &[1.0; 4])]);
    }

    /// An answer whose string elements would cost the server more than
    /// twice the region once copied out is refused by the worker, for
    /// that request alone, though its bytes fit the region.
    #[test]
    fn an_answer_of_more_string_elements_than_the_server_takes_is_refused_and_the_next_fits() {
        let mut outputs = Outputs::new(1 << 20);
        outputs.start();
        // 100,000 empty strings: 400,000 bytes of lengths in the region,
        // 2.8 MB once copied out.
        let empties = Tensor {
            name: "s".into(),
            datatype: baton_core::tensors::tensor::DataType::Bytes,
            shape: vec![100_000],
            data: baton_core::tensors::tensor::TensorData::Bytes(vec![Vec::new(); 100_000]),
        };
        outputs.push(&empties.view());
        let (kind, message) = outputs.error.clone().expect("refused");
        assert_eq!(kind, REGION_EXCEEDED);
        assert!(message.contains("worker_region_mb"), "{message}");
        outputs.start();
        outputs.push(&Tensor::from_f32("small", vec![4], &[1.0; 4]).view());
        assert!(outputs.error.is_none());
    }
}
