//! A worker process's life, as the server sees it: started, watched, and
//! stopped. A third socket pair, beside the setup channel and the slots,
//! carries the heartbeat: the worker holds its end for as long as it runs,
//! so the server's end reads its close the moment the process ends,
//! however it ends. A thread waits on it, reaps the process and tells
//! whoever asked ([`Worker::on_exit`]), unless the server was stopping the
//! worker itself. The same thread asks the worker, every so often, whether
//! it still runs; a worker that does not answer within the bound is hung
//! (stopped, or frozen), and is killed and ended as above, calls or none.

use std::io;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_core::run::backend::{MemoryLimit, ProcessInfo};
use rustix::process::{WaitId, WaitIdOptions, waitid};

use crate::cgroup::Group;
use crate::channel::Channel;

/// How long a worker that ended, or was told to, may take to exit before
/// it is killed.
const EXIT_LIMIT: Duration = Duration::from_secs(5);

/// How long one wait of the watcher lasts without a heartbeat; it waits
/// again after.
const WATCH: Duration = Duration::from_secs(3600);

/// What the server sends on the life channel to ask whether the worker
/// still runs, and what the worker answers.
pub(crate) const PING: &[u8] = b"?";
pub(crate) const PONG: &[u8] = b"!";

/// How often a worker is asked whether it still runs, and how long it has
/// to answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heartbeat {
    pub(crate) every: Duration,
    pub(crate) within: Duration,
}

type Notify = Box<dyn FnOnce(String) + Send>;

/// A worker's memory limit, as it was started with.
#[derive(Debug)]
pub(crate) enum Memory {
    /// None.
    Unlimited,
    /// A memory cgroup of its own, removed once the worker is reaped.
    Group(Group),
    /// A bound on its address space, because no memory cgroup could be
    /// made.
    AddressSpace { bytes: u64 },
}

impl Memory {
    fn limit(&self) -> Option<MemoryLimit> {
        match self {
            Memory::Unlimited => None,
            Memory::Group(group) => Some(group.limit()),
            Memory::AddressSpace { bytes } => Some(MemoryLimit { bytes: *bytes, by: "address_space" }),
        }
    }
}

/// Who to tell of an exit, or the exit already seen.
enum Exit {
    Waiting(Option<Notify>),
    Ended(String),
}

struct Shared {
    child: Mutex<Option<Child>>,
    /// How the process ended, once reaped.
    status: Mutex<Option<String>>,
    alive: AtomicBool,
    stopping: AtomicBool,
    exit: Mutex<Exit>,
    life: Channel,
    /// Why the server killed the worker, when it did.
    killed: Mutex<Option<String>>,
    memory: Memory,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Waits up to [`EXIT_LIMIT`] for the process to exit, kills it after;
    /// says how it ended.
    fn reap(&self) -> String {
        let Some(mut child) = lock(&self.child).take() else {
            return lock(&self.status).clone().unwrap_or_else(|| "ended".into());
        };
        let deadline = Instant::now() + EXIT_LIMIT;
        let mut status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = child.kill();
                    break child.wait().map_or_else(|e| e.to_string(), |s| format!("{s} (killed)"));
                }
            }
        };
        if let Memory::Group(group) = &self.memory {
            if let Some(kills) = group.oom_kills().filter(|n| *n > 0) {
                let limit = group.limit();
                status = format!(
                    "{status}; its memory cgroup's limit of {} MiB was reached ({kills} killed for it)",
                    limit.bytes >> 20
                );
            }
            group.remove();
        }
        *lock(&self.status) = Some(status.clone());
        status
    }

    /// The watcher: waits for the worker's end of the life channel to
    /// close, asking it for a heartbeat meanwhile.
    fn watch(&self, pid: u32, mut heartbeat: Option<Heartbeat>) {
        let mut buffer = Vec::new();
        // When the last ping went, while it waits for its answer.
        let mut asked: Option<Instant> = None;
        loop {
            let wait = match (heartbeat, asked) {
                (None, _) => WATCH,
                (Some(beat), None) => beat.every,
                (Some(beat), Some(at)) => (at + beat.within).saturating_duration_since(Instant::now()),
            };
            match self.life.readable_within(wait) {
                Ok(true) => match self.life.recv(&mut buffer) {
                    Ok(Some(_)) => asked = None,
                    _ => break,
                },
                Ok(false) => match (heartbeat, asked) {
                    (Some(beat), Some(_)) => {
                        // Killed, its end closes: the next wait reads it.
                        self.kill(format!("it did not answer a heartbeat within {:?}", beat.within), false);
                        heartbeat = None;
                    }
                    (Some(_), None) => {
                        if self.life.send(PING, &[]).is_err() {
                            break;
                        }
                        asked = Some(Instant::now());
                    }
                    (None, _) => {}
                },
                Err(_) => break,
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let status = self.reap();
        let why = match lock(&self.killed).take() {
            Some(reason) => format!("worker process {pid} was killed ({status}): {reason}"),
            None => format!("worker process {pid} ended: {status}"),
        };
        let notify = match std::mem::replace(&mut *lock(&self.exit), Exit::Ended(why.clone())) {
            Exit::Waiting(notify) => notify,
            Exit::Ended(_) => None,
        };
        if let Some(notify) = notify {
            notify(why);
        }
    }

    /// Kills the process for `reason`, unless it was reaped already; or,
    /// when `unless_exited`, unless it has exited (reaped or not), so that
    /// a process that ended by itself is not said to have been killed.
    fn kill(&self, reason: String, unless_exited: bool) {
        let mut child = lock(&self.child);
        let Some(child) = child.as_mut() else { return };
        if unless_exited {
            // Not reaped (the child is held here): its pid is still its own.
            let pid = rustix::process::Pid::from_raw(child.id() as i32);
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
            if pid.is_some_and(|pid| matches!(waitid(WaitId::Pid(pid), options), Ok(Some(_)))) {
                return;
            }
        }
        lock(&self.killed).get_or_insert(reason);
        let _ = child.kill();
    }
}

/// A running worker process.
pub(crate) struct Worker {
    pid: u32,
    started_at: SystemTime,
    shared: Arc<Shared>,
    watcher: Option<JoinHandle<()>>,
}

impl Worker {
    /// Watches `child`, which holds the other end of `life`, asking it for
    /// a `heartbeat` when one is given; `memory` is its memory limit.
    pub(crate) fn new(child: Child, life: Channel, heartbeat: Option<Heartbeat>, memory: Memory) -> io::Result<Worker> {
        let pid = child.id();
        let shared = Arc::new(Shared {
            child: Mutex::new(Some(child)),
            status: Mutex::new(None),
            alive: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
            exit: Mutex::new(Exit::Waiting(None)),
            life,
            killed: Mutex::new(None),
            memory,
        });
        let watched = Arc::clone(&shared);
        let watcher =
            std::thread::Builder::new().name("baton-worker-life".into()).spawn(move || watched.watch(pid, heartbeat));
        let mut worker = Worker { pid, started_at: SystemTime::now(), shared, watcher: None };
        match watcher {
            Ok(watcher) => worker.watcher = Some(watcher),
            Err(error) => {
                worker.stop();
                return Err(error);
            }
        }
        Ok(worker)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process still runs, as far as the watcher knows.
    pub(crate) fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Tells `notify` once the process ends by itself; at once when it
    /// already has.
    pub(crate) fn on_exit(&self, notify: Notify) {
        let mut exit = lock(&self.shared.exit);
        match &mut *exit {
            Exit::Waiting(slot) => *slot = Some(notify),
            Exit::Ended(why) => {
                let why = why.clone();
                drop(exit);
                notify(why);
            }
        }
    }

    /// Its pid, resident memory and start time.
    pub(crate) fn info(&self) -> ProcessInfo {
        let rss = std::fs::read_to_string(format!("/proc/{}/statm", self.pid))
            .ok()
            .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|pages| pages * rustix::param::page_size() as u64);
        let started_at = self.started_at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        ProcessInfo { pid: self.pid, rss, started_at, memory_limit: self.shared.memory.limit() }
    }

    /// Kills the worker, for `reason`: it then ends as one that ended by
    /// itself, and whoever asked is told, with the reason.
    pub(crate) fn kill(&self, reason: String) {
        self.shared.kill(reason, false);
    }

    /// Ends the worker, for `reason`, unless its process has exited
    /// already: a worker the server can no longer call (a slot read as
    /// closed, say) that still runs is killed, and then ends as one that
    /// ended by itself, and is replaced. One that exited by itself is left
    /// to say so.
    pub(crate) fn end_if_running(&self, reason: String) {
        self.shared.kill(reason, true);
    }

    /// Stops the worker (its other channels are closed by then, so it is
    /// exiting): ends the watcher without telling anyone, and reaps it.
    /// Says how it ended.
    pub(crate) fn stop(&mut self) -> String {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.life.shutdown();
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        self.shared.reap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}
