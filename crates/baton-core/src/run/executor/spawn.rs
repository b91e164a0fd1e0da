//! Session threads are created by one spawner thread, started at serving
//! priority, so that they run at serving priority too.
//!
//! A version is built, and its executor started, on a loading thread that
//! runs at the lowest priority (nice 19, `SCHED_IDLE`); a thread started
//! there would inherit that priority, and an unprivileged process cannot
//! raise it again. The spawner inherits the priority of the thread that
//! starts it, which is why the server starts it at startup from its main
//! thread ([`start_spawner`]).

use std::io;
use std::sync::{OnceLock, mpsc};
use std::thread::JoinHandle;

/// The name session threads carry (Linux shows 15 bytes).
pub const SESSION_THREAD_NAME: &str = "baton-session";

type Work = Box<dyn FnOnce() + Send + 'static>;
type Request = (Work, mpsc::SyncSender<io::Result<JoinHandle<()>>>);

static SPAWNER: OnceLock<Option<mpsc::Sender<Request>>> = OnceLock::new();

/// Starts the thread that creates session threads, at the calling thread's
/// priority; later calls do nothing. Call it at startup from a thread at
/// serving priority, before the first version loads; without it, session
/// threads started from a loading thread run at the loader's low priority
/// (a warning says so).
pub fn start_spawner() {
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let started = std::thread::Builder::new().name("baton-spawner".into()).spawn(move || {
            for (work, reply) in rx {
                let _ = reply.send(std::thread::Builder::new().name(SESSION_THREAD_NAME.into()).spawn(work));
            }
        });
        match started {
            Ok(_) => Some(tx),
            Err(error) => {
                tracing::warn!(%error, "Could not start the session thread spawner; session threads start where their version loads.");
                None
            }
        }
    });
}

/// Starts a session thread running `work`, through the spawner. Without
/// one, the calling thread starts it: from a thread at serving priority
/// (tests, tools) it becomes the spawner; from a thread of lowered priority
/// the session thread is started directly, at that priority, and a warning
/// says so — the spawner is left for a thread at serving priority to start.
pub(super) fn spawn(work: Work) -> io::Result<JoinHandle<()>> {
    let direct = |work: Work| std::thread::Builder::new().name(SESSION_THREAD_NAME.into()).spawn(work);
    if SPAWNER.get().is_none() {
        if crate::threads::sys::current_thread_nice().is_ok_and(|nice| nice > 0) {
            tracing::warn!(
                "No session thread spawner was started; this version's session threads inherit its loader's \
                 lowered priority. Call baton_core::run::executor::start_spawner at startup."
            );
            return direct(work);
        }
        start_spawner();
    }
    let Some(Some(spawner)) = SPAWNER.get() else { return direct(work) };
    let (reply, answer) = mpsc::sync_channel(1);
    match spawner.send((work, reply)) {
        Ok(()) => answer.recv().unwrap_or_else(|_| Err(io::Error::other("the session thread spawner stopped"))),
        Err(mpsc::SendError((work, _))) => direct(work),
    }
}
