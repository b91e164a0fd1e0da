//! The few operating-system calls baton's core needs: process memory, giving
//! freed heap back to the kernel, thread CPU priority, and how long a thread
//! has waited for a CPU.
//!
//! Linux is where baton runs; elsewhere each call is a portable no-op (or
//! answers `None`), so the crate still builds there. With the Linux part of
//! [`crate::threads::step_aside`], this is the only module of the core that uses
//! `unsafe`; each block is one libc call with plain integer arguments.
#![allow(unsafe_code)]

use std::cell::Cell;

thread_local! {
    /// Whether this thread lowered its priority for loading work, or was
    /// started by core code from one that did (see [`current_thread_lowered`]).
    static LOWERED: Cell<bool> = const { Cell::new(false) };
}

/// Resident set size of this process in bytes, read from `/proc/self/statm`.
///
/// RSS is what the kernel actually backs with memory, so it sees every
/// allocation — Rust's, and ONNX Runtime's C++ `new`/`malloc` alike, which a
/// Rust global allocator never sees. Returns `None` where `/proc` is absent.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(resident * page_size())
}

/// Whether process `pid` is gone: no entry under `/proc` (a process that
/// ended and was reaped). `None` where `/proc` is absent.
pub fn process_gone(pid: u32) -> Option<bool> {
    if !std::path::Path::new("/proc/self").exists() {
        return None;
    }
    Some(!std::path::Path::new(&format!("/proc/{pid}")).exists())
}

fn page_size() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no memory-safety preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
    }
    #[cfg(not(unix))]
    4096
}

/// Asks the C allocator to return free heap pages to the kernel, so that a
/// following [`rss_bytes`] reflects memory really in use rather than memory
/// glibc keeps cached for reuse.
///
/// `malloc_trim` locks every arena in turn, serving threads' own among
/// them, so it runs with stepping aside held off: a loading thread never
/// pauses while a serving thread waits for an arena it holds.
pub fn trim_heap() {
    let _held = crate::threads::step_aside::hold();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes glibc serve every allocation of 256 KiB or more with its own
/// `mmap`, returned to the kernel the moment it is freed. By default glibc
/// raises that threshold after large blocks are freed (up to 32 MiB), after
/// which a model's tensors come from the heap, where they fragment it and
/// stay resident across swaps. Call once, early, before threads start.
pub fn keep_large_allocations_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a glibc tuning parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// Raises this process's soft limit on open files to its hard limit, and
/// returns the limit now in force. A load keeps every file of the version
/// it verifies open until the engine has read them ([`crate::files::verified`]),
/// and serving connections need descriptors meanwhile; the usual soft limit
/// of 1024 would leave a version of many files, or a server with many
/// connections, short of them. Call once, at start.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads one rlimit struct, which `raised` is.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}

/// [`trim_heap`] followed by [`rss_bytes`]: the memory this process really holds now.
pub fn trimmed_rss() -> Option<u64> {
    trim_heap();
    rss_bytes()
}

/// Sets the nice value of the calling thread only (Linux keeps a nice value
/// per thread). Raising it needs no privilege; lowering it again does, which
/// is why baton never lowers a thread's priority and back: work that must
/// run at serving priority is started from threads that never changed theirs.
pub fn set_current_thread_nice(nice: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers.
        let tid = unsafe { libc::gettid() };
        let who = libc::id_t::try_from(tid).map_err(|_| std::io::Error::other("negative thread id"))?;
        // SAFETY: as above.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
    Ok(())
}

/// Puts the calling thread under `SCHED_IDLE`: it runs only on CPU time no
/// other thread wants, and a waking normal thread preempts it at once
/// rather than after the scheduler's wake-up granularity. Needs no
/// privilege; like the nice value, threads it creates inherit it.
pub fn set_current_thread_idle() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    return set_current_thread_policy(libc::SCHED_IDLE, 0);
    #[cfg(not(target_os = "linux"))]
    Ok(())
}

/// `sched_setscheduler` for the calling thread.
#[cfg(target_os = "linux")]
fn set_current_thread_policy(policy: libc::c_int, priority: libc::c_int) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Puts the calling thread under `SCHED_FIFO` at the lowest real-time
/// priority, for a thread that must wake when asked whatever else is
/// runnable (the drill's stall probe). Needs `CAP_SYS_NICE` or an
/// `RLIMIT_RTPRIO` of at least 1.
pub fn set_current_thread_realtime() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    return set_current_thread_policy(libc::SCHED_FIFO, 1);
    #[cfg(not(target_os = "linux"))]
    Ok(())
}

/// Sets the calling thread's timer slack to 1 ns, so that its sleeps end
/// when asked rather than up to 50 µs later (the kernel's default slack).
pub fn set_current_thread_exact_timers() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_TIMERSLACK takes a plain integer and concerns the calling thread only.
        let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Lowers the calling thread to the loader's priority: `nice`, and
/// `SCHED_IDLE` when `idle` is set. Threads it creates inherit both.
///
/// It also marks the thread as lowered ([`current_thread_lowered`]), even
/// when the calls fail: from then on it must take no lock that serving
/// threads take (see [`crate::threads::sync`]), logging's included, so it does not
/// log what failed but returns it for the caller to report elsewhere.
pub fn lower_current_thread(nice: i32, idle: bool) -> std::io::Result<()> {
    mark_current_thread_lowered();
    let mut failed = Vec::new();
    if let Err(error) = set_current_thread_nice(nice) {
        failed.push(format!("nice {nice}: {error}"));
    }
    if idle && let Err(error) = set_current_thread_idle() {
        failed.push(format!("SCHED_IDLE: {error}"));
    }
    if failed.is_empty() { Ok(()) } else { Err(std::io::Error::other(failed.join("; "))) }
}

/// Whether the calling thread lowered its priority with
/// [`lower_current_thread`], or was started by baton's core from a thread
/// that did (a version's build thread). Such a thread may be kept off the
/// CPU for a long time while it holds whatever it holds.
pub fn current_thread_lowered() -> bool {
    LOWERED.get()
}

/// Marks the calling thread as lowered: for threads that inherited a lowered
/// thread's priority when it created them.
pub(crate) fn mark_current_thread_lowered() {
    LOWERED.set(true);
}

/// The nice value of the calling thread.
pub fn current_thread_nice() -> std::io::Result<i32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain integer syscalls; errno is reset first because -1 is a valid result.
        unsafe {
            let tid = libc::gettid();
            *libc::__errno_location() = 0;
            let value = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            if value == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(value)
        }
    }
    #[cfg(not(target_os = "linux"))]
    Ok(0)
}

/// The CPUs the calling thread may run on, in order; empty where that
/// cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `set` is plain data, zeroed and then filled by
        // sched_getaffinity for the calling thread (pid 0); CPU_ISSET only
        // reads it at indexes below CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
        }
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

/// Keeps the calling thread on one CPU from now on.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!("CPU {cpu} is beyond the CPU set's size")));
        }
        // SAFETY: `set` is plain data, zeroed, with one CPU below
        // CPU_SETSIZE set; sched_setaffinity applies it to the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
    Ok(())
}

/// The scheduling policy of the calling thread (`libc::SCHED_OTHER`,
/// `SCHED_IDLE`, ...).
pub fn current_thread_policy() -> std::io::Result<i32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getscheduler takes the calling thread's id, 0, and returns an integer.
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(policy)
    }
    #[cfg(not(target_os = "linux"))]
    Ok(0)
}

/// How long the calling thread has waited for a CPU while runnable, in all,
/// since it started: the second field of `/proc/thread-self/schedstat`.
/// `None` where the kernel does not keep it.
///
/// The loader runs at the lowest priority, so on a busy machine most of its
/// wall time can be this wait; subtracting it tells how long its work took.
pub fn thread_run_delay() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos: u64 = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(std::time::Duration::from_nanos(nanos))
}

/// The CPU time the calling thread has used, from the kernel's per-thread
/// clock; `None` where there is none. A rollout's timing of a run bounds
/// what a worker's report may take away from its sample with it
/// ([`crate::run::executor::timing`]).
pub fn thread_cpu_time() -> Option<std::time::Duration> {
    #[cfg(unix)]
    {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec.
        let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        if status != 0 {
            return None;
        }
        let (secs, nanos) = (u64::try_from(now.tv_sec).ok()?, u32::try_from(now.tv_nsec).ok()?);
        Some(std::time::Duration::new(secs, nanos))
    }
    #[cfg(not(unix))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        let start = thread_cpu_time().expect("a thread CPU clock");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_cpu_time().unwrap() - start;
        let mut acc = 0u64;
        for i in 0..20_000_000u64 {
            acc = std::hint::black_box(acc.wrapping_add(i));
        }
        let worked = thread_cpu_time().unwrap() - start - slept;
        assert!(slept < std::time::Duration::from_millis(20), "sleeping used {slept:?} of CPU");
        assert!(worked > slept, "work {worked:?}, sleep {slept:?}");
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_alone() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "a thread may run somewhere");
        let last = *cpus.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(last).expect("pinning to an allowed CPU");
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![last]);
        assert!(pin_current_thread(1 << 20).is_err(), "a CPU beyond the set is refused");
    }

    #[test]
    fn a_threads_wait_for_a_cpu_is_read_and_never_shrinks() {
        let first = thread_run_delay().expect("/proc/thread-self/schedstat readable on linux");
        std::thread::yield_now();
        let second = thread_run_delay().expect("readable again");
        assert!(second >= first, "{second:?} < {first:?}");
    }

    #[test]
    fn rss_is_positive_and_grows_with_touched_memory() {
        let before = trimmed_rss().expect("rss readable on linux");
        assert!(before > 0);
        // black_box: an optimised build would not allocate an unused block.
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = rss_bytes().expect("rss readable");
        assert!(after >= before + (32 << 20), "before {before} after {after}");
        drop(block);
    }

    #[test]
    fn nice_applies_to_the_calling_thread_only() {
        let main_nice = current_thread_nice().unwrap();
        let child = std::thread::spawn(|| {
            set_current_thread_nice(current_thread_nice().unwrap() + 3).unwrap();
            current_thread_nice().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(child, main_nice + 3);
        assert_eq!(current_thread_nice().unwrap(), main_nice);
    }
}
