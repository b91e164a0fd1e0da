//! Stepping aside on Linux: a POSIX timer per armed thread and a real-time
//! signal whose handler decides whether the thread sleeps.
//!
//! While a thread does loading work it holds an [`Armed`] timer
//! (`CLOCK_MONOTONIC`, delivered to that one thread). The handler looks at
//! how much CPU the thread has used since it last stepped aside; once that
//! is a whole quantum, it reads how many threads are runnable on the machine
//! (`/proc/loadavg`), and when there are more than CPUs it sleeps for the
//! pause. While requests are being served it also sleeps long enough after
//! each quantum to keep to its share of a CPU. While nobody waits, the looks
//! are spaced [`IDLE_SPACING`] quanta apart, since every interruption costs
//! the thread tens of microseconds. Time stepped aside is capped by
//! [`super::MAX_PAUSED_PER_CPU`].
//!
//! The handler makes only async-signal-safe calls (`clock_gettime`,
//! `pread`, `nanosleep`, `timer_settime`), allocates nothing, takes no lock
//! and keeps `errno`; the signal is installed with `SA_RESTART`. What it
//! cannot know is which user-space locks the interrupted code holds, or
//! whether that code retries the calls a signal interrupts regardless of
//! `SA_RESTART` (timed waits among them): code that must not be paused runs
//! inside [`hold`], which keeps the signal blocked.
//!
//! The count of runnable threads is the whole machine's: in a container
//! limited to fewer CPUs than the machine has, a saturated container on an
//! idle host is not seen as saturated.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

use super::{Counts, MAX_PAUSED_PER_CPU, SERVING_RECENT, StepAside, nanos, share_pause};

/// Arms the calling thread, which is not armed yet, with `policy`, which is on.
pub(super) fn arm(policy: StepAside) -> Armed {
    let Some(signal) = installed() else { return Armed::none() };
    let quantum = policy.quantum.max(StepAside::MIN_QUANTUM);
    let slack = Slack::exact();
    match Timer::start(signal, quantum) {
        Ok(timer) => {
            ENABLED.store(true, Ordering::Relaxed);
            TIMER.set(Some(timer.0));
            SPACING_NS.set(nanos(quantum));
            QUANTUM_NS.set(nanos(quantum));
            PAUSE_NS.set(nanos(policy.pause));
            SHARE_PAUSE_NS.set(share_pause(quantum, policy.serving_share));
            RAN_FROM_NS.set(thread_cpu_ns());
            ARMED_CPU_NS.set(RAN_FROM_NS.get());
            ARMED_PAUSED_NS.set(PAUSED_HERE_NS.get());
            Armed { timer: Some(timer), _slack: slack, _this_thread: PhantomData }
        }
        Err(error) => {
            warn_once(format!("cannot create the step-aside timer: {error}"));
            Armed::none()
        }
    }
}

/// Stepping aside, armed on the thread that created it; dropping it stops.
#[derive(Debug)]
pub struct Armed {
    timer: Option<Timer>,
    /// Dropped after the timer, restoring the thread's own slack.
    _slack: Slack,
    /// The timer signals the thread that armed it, and the handler's state
    /// is that thread's: the guard must be dropped there.
    _this_thread: PhantomData<*const ()>,
}

impl Armed {
    pub(super) fn none() -> Armed {
        Armed { timer: None, _slack: Slack(None), _this_thread: PhantomData }
    }

    /// Whether the timer really runs.
    pub fn is_active(&self) -> bool {
        self.timer.is_some()
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if self.timer.is_some() {
            // A signal still pending finds a zero quantum and returns; the
            // handler never touches the timer once it is cleared here.
            QUANTUM_NS.set(0);
            TIMER.set(None);
            self.timer = None;
        }
    }
}

/// Whether the calling thread is armed now (for tests of where baton arms).
pub fn armed_here() -> bool {
    TIMER.get().is_some()
}

/// How long the calling thread has been stepped aside, in all, since it
/// started: the time it slept to leave the CPU to others, which timings of
/// its work leave out. The wait for a CPU after each such sleep is not in
/// it: that is the thread's run delay ([`crate::threads::sys::thread_run_delay`]).
pub fn paused_here() -> Duration {
    Duration::from_nanos(SLEPT_HERE_NS.get())
}

/// The process-wide counts.
pub(super) fn counts() -> Counts {
    Counts {
        steps: STEPS.load(Ordering::Relaxed),
        paused: Duration::from_nanos(PAUSED_NS.load(Ordering::Relaxed)),
        declined: DECLINED.load(Ordering::Relaxed),
    }
}

/// Keeps the step-aside signal blocked on the calling thread until the
/// guard is dropped: for code that holds a lock serving threads need, so
/// that it is never paused while it holds it. A signal that arrives
/// meanwhile is handled when the guard drops.
pub fn hold() -> Hold {
    let Some(signal) = SIGNAL.get().copied().flatten() else {
        return Hold { previous: None, _this_thread: PhantomData };
    };
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset
    // before use; pthread_sigmask changes only the calling thread's mask.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, signal);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut previous) != 0 {
            return Hold { previous: None, _this_thread: PhantomData };
        }
        Hold { previous: Some(previous), _this_thread: PhantomData }
    }
}

/// The guard of [`hold`]. It restores the mask of the thread that made it,
/// so it is dropped there.
pub struct Hold {
    previous: Option<libc::sigset_t>,
    _this_thread: PhantomData<*const ()>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            // SAFETY: restores the mask saved by `hold` on this same thread.
            unsafe {
                libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
            }
        }
    }
}

// The handler's state, per thread. `const` thread-locals without a
// destructor are plain thread-local storage: reading them in a signal
// handler runs no initialiser and takes no lock.
thread_local! {
    static QUANTUM_NS: Cell<u64> = const { Cell::new(0) };
    static PAUSE_NS: Cell<u64> = const { Cell::new(0) };
    /// The sleep after each quantum while requests are served; 0 for none.
    static SHARE_PAUSE_NS: Cell<u64> = const { Cell::new(0) };
    static RAN_FROM_NS: Cell<u64> = const { Cell::new(0) };
    /// CPU time and time stepped aside when the thread was armed.
    static ARMED_CPU_NS: Cell<u64> = const { Cell::new(0) };
    static ARMED_PAUSED_NS: Cell<u64> = const { Cell::new(0) };
    /// The armed timer and the period it runs at. (Not a null pointer for
    /// none: glibc's id of the kernel's first timer is 0.)
    static TIMER: Cell<Option<libc::timer_t>> = const { Cell::new(None) };
    static SPACING_NS: Cell<u64> = const { Cell::new(0) };
    /// This thread's looks and steps, for tests that share the process.
    static LOOKS_HERE: Cell<u64> = const { Cell::new(0) };
    static STEPS_HERE: Cell<u64> = const { Cell::new(0) };
    /// This thread's time stepped aside, in all, each step until it was
    /// back on a CPU (what the budget caps).
    static PAUSED_HERE_NS: Cell<u64> = const { Cell::new(0) };
    /// Of that, the sleeps alone ([`paused_here`]).
    static SLEPT_HERE_NS: Cell<u64> = const { Cell::new(0) };
}

/// Whether any thread was ever armed: until then, noting requests costs nothing.
static ENABLED: AtomicBool = AtomicBool::new(false);
static STEPS: AtomicU64 = AtomicU64::new(0);
static PAUSED_NS: AtomicU64 = AtomicU64::new(0);
static DECLINED: AtomicU64 = AtomicU64::new(0);
/// `/proc/loadavg`, kept open; -1 until installed or if it could not be opened.
static LOADAVG: AtomicI32 = AtomicI32::new(-1);
/// CPUs online when the handler was installed.
static CPUS: AtomicU64 = AtomicU64::new(1);
/// The signal the handler is installed for, or `None` if it could not be.
static SIGNAL: OnceLock<Option<libc::c_int>> = OnceLock::new();

/// Which real-time signal, counted from the first one glibc leaves free.
const SIGNAL_OFFSET: libc::c_int = 7;

/// Installs the handler once for the process; `None` when it cannot be.
fn installed() -> Option<libc::c_int> {
    *SIGNAL.get_or_init(|| match install() {
        Ok(signal) => Some(signal),
        Err(error) => {
            warn_once(error);
            None
        }
    })
}

fn install() -> Result<libc::c_int, String> {
    let signal = libc::SIGRTMIN() + SIGNAL_OFFSET;
    if signal > libc::SIGRTMAX() {
        return Err(format!("real-time signal {signal} does not exist"));
    }
    let path = c"/proc/loadavg";
    // SAFETY: a NUL-terminated path and plain flags.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("cannot open /proc/loadavg: {}", std::io::Error::last_os_error()));
    }
    LOADAVG.store(fd, Ordering::Relaxed);
    // SAFETY: sysconf has no memory-safety preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    CPUS.store(u64::try_from(cpus).unwrap_or(1).max(1), Ordering::Relaxed);
    // SAFETY: `action` is zeroed plain data with the handler and flags set;
    // the previous action is read first so another user of the signal is
    // never overridden.
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut previous) != 0 {
            return Err(format!("cannot read signal {signal}'s action: {}", std::io::Error::last_os_error()));
        }
        if previous.sa_sigaction != libc::SIG_DFL {
            return Err(format!("signal {signal} is already handled by other code"));
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return Err(format!("cannot install the handler of signal {signal}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(signal)
}

fn warn_once(reason: String) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        crate::threads::agent::at_serving_priority(move || {
            tracing::warn!(
                %reason,
                "Loading threads cannot step aside for waiting threads; they keep their priority alone."
            );
        });
    });
}

/// The calling thread's timer slack set to 1 ns until dropped; `None` when
/// it could not be read.
#[derive(Debug)]
struct Slack(Option<libc::c_ulong>);

impl Slack {
    fn exact() -> Slack {
        // SAFETY: PR_GET_TIMERSLACK takes and returns plain integers and
        // concerns the calling thread only.
        let previous = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        if previous <= 0 || crate::threads::sys::set_current_thread_exact_timers().is_err() {
            return Slack(None);
        }
        Slack(libc::c_ulong::try_from(previous).ok())
    }
}

impl Drop for Slack {
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            // SAFETY: as in `exact`.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, previous, 0, 0, 0);
            }
        }
    }
}

/// A POSIX timer that signals the calling thread every `period`.
#[derive(Debug)]
struct Timer(libc::timer_t);

impl Timer {
    fn start(signal: libc::c_int, period: Duration) -> std::io::Result<Timer> {
        // SAFETY: `event` is zeroed plain data with the fields the kernel
        // reads set; `timer` is written by timer_create before it is used.
        unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_signo = signal;
            event.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::mem::zeroed();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Err(error) = Timer::set(timer, period) {
                libc::timer_delete(timer);
                return Err(error);
            }
            Ok(Timer(timer))
        }
    }

    /// Makes `timer` fire `period` from now, then every `period`. Async-signal-safe.
    fn set(timer: libc::timer_t, period: Duration) -> std::io::Result<()> {
        let every = timespec(period);
        let spec = libc::itimerspec { it_interval: every, it_value: every };
        // SAFETY: `timer` is a live timer id of this thread; `spec` is plain data.
        if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: the id came from timer_create and is deleted once.
        unsafe {
            libc::timer_delete(self.0);
        }
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: errno is this thread's; saved and restored around the handler
    // so the interrupted code never sees it change.
    let errno = unsafe { *libc::__errno_location() };
    on_tick();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// One interruption of an armed thread.
fn on_tick() {
    let quantum = QUANTUM_NS.get();
    if quantum == 0 {
        return;
    }
    // Only time the thread really ran counts: signals that queued while it
    // waited for a core would otherwise send it away the moment it got one.
    if thread_cpu_ns().saturating_sub(RAN_FROM_NS.get()) < quantum {
        return;
    }
    LOOKS_HERE.set(LOOKS_HERE.get() + 1);
    let waiting = runnable_threads().is_some_and(|runnable| runnable > CPUS.load(Ordering::Relaxed));
    let share_pause = if serving_now() { SHARE_PAUSE_NS.get() } else { 0 };
    let pause = if waiting { PAUSE_NS.get().max(share_pause) } else { share_pause };
    let step = pause > 0;
    if step && !within_budget() {
        DECLINED.fetch_add(1, Ordering::Relaxed);
    } else if step {
        let started = monotonic_ns();
        sleep_ns(pause);
        STEPS.fetch_add(1, Ordering::Relaxed);
        STEPS_HERE.set(STEPS_HERE.get() + 1);
        // Until the thread is back on a CPU: what the budget caps.
        let paused = monotonic_ns().saturating_sub(started);
        PAUSED_NS.fetch_add(paused, Ordering::Relaxed);
        PAUSED_HERE_NS.set(PAUSED_HERE_NS.get() + paused);
        // Only the sleep, the pause asked for or less if it ended early,
        // for timings of the thread's work. The wait for a CPU after it is
        // the scheduler's run delay (`sys::thread_run_delay`), which those
        // timings leave out already: counted here too, it would be left
        // out twice, and a warmup run could come out faster than it was.
        SLEPT_HERE_NS.set(SLEPT_HERE_NS.get() + paused.min(pause));
    }
    // Every interruption costs the thread tens of microseconds, so while
    // nobody waits it is interrupted only every few quanta.
    respace(if step { quantum } else { quantum * IDLE_SPACING });
    RAN_FROM_NS.set(thread_cpu_ns());
}

/// When the last request was noted, in `CLOCK_MONOTONIC` nanoseconds; 0 for never.
static LAST_REQUEST_NS: AtomicU64 = AtomicU64::new(0);

/// How stale [`LAST_REQUEST_NS`] may get before a request rewrites it: far
/// below [`SERVING_RECENT`], and it keeps serving threads on many cores
/// from writing one shared cache line on every request.
const NOTE_EVERY_NS: u64 = 1_000_000;

/// Notes that a request is being served now: loading threads with a
/// [`StepAside::serving_share`] under 100 keep to it for the next
/// [`SERVING_RECENT`]. Nothing until a thread was first armed; then one
/// clock read and one load, and a store at most once a millisecond.
pub fn note_request() {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let now = monotonic_ns();
    if now.saturating_sub(LAST_REQUEST_NS.load(Ordering::Relaxed)) >= NOTE_EVERY_NS {
        LAST_REQUEST_NS.store(now, Ordering::Relaxed);
    }
}

fn serving_now() -> bool {
    let last = LAST_REQUEST_NS.load(Ordering::Relaxed);
    last != 0 && monotonic_ns().saturating_sub(last) < nanos(SERVING_RECENT)
}

/// How many quanta apart the looks are while nobody waits.
const IDLE_SPACING: u64 = 4;

/// Whether the armed thread may step aside once more, within
/// [`MAX_PAUSED_PER_CPU`] times the CPU time it has used since it was armed.
fn within_budget() -> bool {
    let used = thread_cpu_ns().saturating_sub(ARMED_CPU_NS.get());
    let paused = PAUSED_HERE_NS.get().saturating_sub(ARMED_PAUSED_NS.get());
    paused < used.saturating_mul(MAX_PAUSED_PER_CPU)
}

/// Sets the armed thread's timer to fire every `every` ns, if it does not already.
fn respace(every: u64) {
    let Some(timer) = TIMER.get() else { return };
    if SPACING_NS.get() == every {
        return;
    }
    if Timer::set(timer, Duration::from_nanos(every)).is_ok() {
        SPACING_NS.set(every);
    }
}

/// Threads runnable on the machine now, the calling one included: the
/// numerator of `/proc/loadavg`'s fourth field ("3/456").
fn runnable_threads() -> Option<u64> {
    let fd = LOADAVG.load(Ordering::Relaxed);
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 128];
    // SAFETY: reads at most buf.len() bytes into buf.
    let read = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    let read = usize::try_from(read).ok()?;
    parse_runnable(&buf[..read])
}

fn parse_runnable(loadavg: &[u8]) -> Option<u64> {
    let field = loadavg.split(|b| *b == b' ').nth(3)?;
    let running = field.split(|b| *b == b'/').next()?;
    if running.is_empty() {
        return None;
    }
    running.iter().try_fold(0u64, |n, b| b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0')))
}

fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(clock, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

fn sleep_ns(nanos: u64) {
    let span = timespec(Duration::from_nanos(nanos));
    // SAFETY: nanosleep reads one timespec; an early wake-up only shortens the pause.
    unsafe { libc::nanosleep(&span, std::ptr::null_mut()) };
}

fn timespec(span: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(span.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(span.subsec_nanos() as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `test` on a thread of its own: arming and the handler's state are per thread.
    fn on_own_thread<T: Send + 'static>(test: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(test).join().unwrap()
    }

    #[test]
    fn loadavg_gives_the_runnable_count() {
        assert_eq!(parse_runnable(b"0.52 0.58 0.59 3/456 12345\n"), Some(3));
        assert_eq!(parse_runnable(b"1.00 1.00 1.00 12/80 7"), Some(12));
        assert_eq!(parse_runnable(b"0.52 0.58 0.59 /456 12345"), None);
        assert_eq!(parse_runnable(b"0.52 0.58"), None);
        assert_eq!(parse_runnable(b"0.52 0.58 0.59 x/456 1"), None);
        installed().expect("the step-aside signal installs on linux");
        let live = runnable_threads().expect("/proc/loadavg readable");
        assert!(live >= 1, "the reading thread itself is runnable, read {live}");
    }

    /// Spins until this thread has used `cpu` of CPU time.
    fn spin_for(cpu: Duration) {
        let until = thread_cpu_ns() + nanos(cpu);
        while thread_cpu_ns() < until {
            std::hint::spin_loop();
        }
    }

    const SHORT: StepAside =
        StepAside { quantum: StepAside::MIN_QUANTUM, pause: Duration::from_micros(50), serving_share: 100 };

    #[test]
    fn an_armed_thread_steps_aside_while_the_cpus_are_full_and_stops_when_disarmed() {
        // More threads spinning than there are CPUs, for as long as the armed thread runs.
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hogs: Vec<_> = (0..=cpus)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let (steps, stepped_after, paused) = on_own_thread(|| {
            let armed = StepAside::STANDARD.arm();
            assert!(armed.is_active());
            // 200 quanta of CPU time: with every CPU wanted, the looks
            // find others waiting.
            spin_for(StepAside::STANDARD.quantum * 200);
            // Counted once the guard is gone: a tick that lands while it
            // is being dropped still belongs to the armed time.
            drop(armed);
            let steps = STEPS_HERE.get();
            spin_for(StepAside::STANDARD.quantum * 40);
            (steps, STEPS_HERE.get() - steps, paused_here())
        });
        stop.store(true, Ordering::Relaxed);
        hogs.into_iter().for_each(|h| h.join().unwrap());
        assert!(steps > 0, "an armed thread never stepped aside while {} threads spun", cpus + 1);
        assert!(paused > Duration::ZERO, "stepped aside {steps} times for no time");
        // Each step counts at most the pause it asked for (the share's, if
        // another test's requests count as serving): the wait for a CPU
        // after it, long with every CPU busy, is the run delay's, not a pause.
        let longest = StepAside::STANDARD
            .pause
            .max(Duration::from_nanos(share_pause(StepAside::STANDARD.quantum, StepAside::STANDARD.serving_share)));
        assert!(paused <= longest * steps as u32, "{steps} steps counted {paused:?}, more than they asked for");
        assert_eq!(stepped_after, 0, "stepped aside after the guard was dropped");
        assert!(counts().steps >= steps && counts().paused > Duration::ZERO);
    }

    #[test]
    fn an_armed_threads_system_calls_complete() {
        let (looks, data, sleeping_cpu) = on_own_thread(|| {
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), vec![7u8; 1 << 20]).unwrap();
            let armed = SHORT.arm();
            let mut data = Vec::new();
            let mut sleeping_cpu = 0;
            for _ in 0..100 {
                data = std::fs::read(file.path()).unwrap();
                let before = thread_cpu_ns();
                std::thread::sleep(Duration::from_micros(100));
                sleeping_cpu += thread_cpu_ns() - before;
            }
            spin_for(Duration::from_millis(5));
            drop(armed);
            (LOOKS_HERE.get(), data, Duration::from_nanos(sleeping_cpu))
        });
        assert!(looks > 0, "the timer never interrupted the armed thread");
        // A sleep that each signal restarts with its slack added never
        // ends and burns CPU meanwhile (see `StepAside::MIN_QUANTUM`).
        assert!(sleeping_cpu < Duration::from_secs(2), "100 sleeps of 100 µs used {sleeping_cpu:?} of CPU");
        assert_eq!(data.len(), 1 << 20);
        assert!(data.iter().all(|b| *b == 7));
    }

    /// The period the calling thread's armed timer runs at.
    fn period_of_timer() -> Duration {
        let mut spec: libc::itimerspec = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::timer_gettime(TIMER.get().expect("armed"), &mut spec) }, 0);
        Duration::new(spec.it_interval.tv_sec as u64, spec.it_interval.tv_nsec as u32)
    }

    #[test]
    fn looks_are_spaced_out_while_nobody_waits_and_back_to_a_quantum_when_someone_does() {
        on_own_thread(|| {
            let armed = StepAside::STANDARD.arm();
            let quantum = StepAside::STANDARD.quantum;
            assert_eq!(period_of_timer(), quantum);
            let _held = hold();
            respace(nanos(quantum) * IDLE_SPACING);
            assert_eq!(period_of_timer(), quantum * IDLE_SPACING as u32);
            respace(nanos(quantum));
            assert_eq!(period_of_timer(), quantum);
            drop(armed);
            assert!(!armed_here());
            // Without a timer there is nothing to respace.
            respace(1);
            assert_eq!(SPACING_NS.get(), nanos(quantum));
        });
    }

    #[test]
    fn while_requests_are_served_an_armed_thread_keeps_to_its_share_and_an_old_request_does_not_count() {
        // Global: the only test that notes requests.
        const SHARED: StepAside = StepAside { serving_share: 25, ..StepAside::STANDARD };
        assert_eq!(StepAside::STANDARD.serving_share, 50);
        let sleep = share_pause(SHARED.quantum, SHARED.serving_share);
        let (steps, paused) = on_own_thread(move || {
            let armed = SHARED.arm();
            assert!(armed.is_active());
            for _ in 0..100 {
                note_request();
                spin_for(SHARED.quantum * 2);
            }
            (STEPS_HERE.get(), paused_here())
        });
        assert!(steps >= 20, "stepped aside {steps} times in 200 quanta of CPU while requests were served");
        // Every step sleeps at least the share's pause, whether or not others wait.
        assert!(paused >= Duration::from_nanos(sleep * steps), "{steps} steps paused only {paused:?}");
        LAST_REQUEST_NS.store(monotonic_ns() - nanos(SERVING_RECENT) - 1, Ordering::Relaxed);
        assert!(!serving_now(), "a request older than SERVING_RECENT counts as serving");
        note_request();
        assert!(serving_now());
        // A note under NOTE_EVERY_NS old is left as it is (dated ahead here,
        // so that no preemption of this thread can age it); an older one is
        // rewritten.
        let recent = monotonic_ns() + NOTE_EVERY_NS;
        LAST_REQUEST_NS.store(recent, Ordering::Relaxed);
        note_request();
        assert_eq!(LAST_REQUEST_NS.load(Ordering::Relaxed), recent);
        let old = monotonic_ns() - 2 * NOTE_EVERY_NS;
        LAST_REQUEST_NS.store(old, Ordering::Relaxed);
        note_request();
        assert!(LAST_REQUEST_NS.load(Ordering::Relaxed) > old);
    }

    #[test]
    fn time_stepped_aside_is_capped_by_the_cpu_time_used() {
        on_own_thread(|| {
            let _armed = StepAside::STANDARD.arm();
            let _held = hold();
            spin_for(Duration::from_millis(1));
            assert!(within_budget(), "1 ms of CPU and nothing stepped aside yet");
            // As if it had stepped aside for 20 ms since arming: more than
            // ten times the little over 1 ms it ran.
            PAUSED_HERE_NS.set(PAUSED_HERE_NS.get() + 20_000_000);
            assert!(!within_budget(), "20 ms stepped aside for about 1 ms of CPU");
            spin_for(Duration::from_millis(2));
            assert!(within_budget(), "3 ms of CPU allow 30 ms stepped aside");
        });
    }

    #[test]
    fn arming_an_armed_thread_leaves_it_armed_by_the_outer_guard() {
        on_own_thread(|| {
            let outer = StepAside::STANDARD.arm();
            let inner = SHORT.arm();
            assert!(outer.is_active() && !inner.is_active());
            drop(inner);
            assert!(armed_here());
            assert_eq!(QUANTUM_NS.get(), nanos(StepAside::STANDARD.quantum));
            drop(outer);
            assert!(!armed_here());
        });
    }

    #[test]
    fn a_held_signal_waits_until_the_hold_ends() {
        let (during, after) = on_own_thread(|| {
            let armed = SHORT.arm();
            let held = hold();
            spin_for(Duration::from_millis(5));
            let during = LOOKS_HERE.get();
            drop(held);
            // The pending signal is handled as the mask is restored.
            let after = LOOKS_HERE.get();
            drop(armed);
            (during, after)
        });
        assert_eq!(during, 0, "the handler ran while the signal was held");
        assert_eq!(after, 1, "the signal that came during the hold was lost");
    }
}
