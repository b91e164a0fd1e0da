//! A run in a worker is timed where it runs: the worker's slot thread
//! times each call (less its waits for a CPU) and sends that with the
//! answer, and the calling thread's sample counts it in place of its wait,
//! so a run on the worker's CPU or asleep there is in the sample.

use std::time::Duration;

use baton_core::run::executor::timing::{Stopwatch, own_run_delay, trimmed_reports};
use baton_core::tensors::tensor::Tensor;
use baton_worker::channel::Channel;
use baton_worker::hop::{self, Answering, Caller};

const LONG: Duration = Duration::from_secs(60);

/// `for_cpu` of this thread's CPU, however long the wait for it.
fn work(for_cpu: Duration) {
    let cpu = baton_core::threads::sys::thread_cpu_time().unwrap();
    while baton_core::threads::sys::thread_cpu_time().unwrap() - cpu < for_cpu {
        std::hint::spin_loop();
    }
}

/// Calls a worker side, on a thread of this process, whose run works 5 ms
/// on its CPU for an input named `work` and sleeps 5 ms for one named
/// `sleep`; each call's readings on the calling thread.
fn readings(names: &[&str]) -> Vec<baton_core::run::executor::timing::Reading> {
    readings_after(names, || {})
}

/// [`readings`], `caller` run on the calling thread once the worker's
/// thread is started.
fn readings_after(names: &[&str], caller: impl FnOnce()) -> Vec<baton_core::run::executor::timing::Reading> {
    let (ours, theirs) = Channel::pair().unwrap();
    let worker = std::thread::spawn(move || {
        let how = Answering { spin: Duration::ZERO, most: hop::REGION_DEFAULT };
        hop::answer(vec![theirs], how, |_, inputs, out| {
            match inputs.first().map(|i| i.name) {
                Some("work") => work(Duration::from_millis(5)),
                Some("sleep") => std::thread::sleep(Duration::from_millis(5)),
                _ => {}
            }
            out(&Tensor::from_f32("y", vec![1], &[1.0]).view());
            Ok(())
        })
    });
    caller();
    let caller = Caller::new(vec![ours], Duration::ZERO);
    let readings = names
        .iter()
        .map(|name| {
            let watch = Stopwatch::start();
            let outputs = caller.call(&[Tensor::from_f32(*name, vec![1], &[0.0])], LONG).unwrap();
            assert_eq!(outputs.len(), 1);
            watch.read()
        })
        .collect();
    drop(caller);
    worker.join().unwrap().unwrap();
    readings
}

#[test]
fn the_caller_s_sample_holds_the_worker_s_run_on_its_cpu_or_asleep() {
    let trimmed = trimmed_reports();
    for (name, reading) in ["work", "sleep", "work", "sleep"].iter().zip(readings(&["work", "sleep", "work", "sleep"]))
    {
        // The calling thread's own CPU time is a sliver of the run: timed
        // by it alone, a worker's run read as next to nothing.
        if own_run_delay().is_some() {
            assert!(reading.replaced.1 >= Duration::from_millis(5), "{name}: {reading:?}");
        }
        assert!(reading.sample >= Duration::from_millis(5), "{name}: {reading:?}");
        assert!(reading.sample <= reading.wall, "{name}: {reading:?}");
        if own_run_delay().is_some() {
            assert!(reading.cpu.unwrap() < reading.sample, "{name}: {reading:?}");
        }
    }
    // An honest worker's reports are never cut down.
    assert_eq!(trimmed_reports(), trimmed);
}

#[test]
fn a_worker_that_runs_before_its_caller_waits_is_still_timed_whole() {
    // The caller and the worker on one CPU, the caller below everything
    // (as the shadow runner is): the worker's thread, woken by the call,
    // runs it at once, before the caller gets its CPU back. Its part must
    // still fall within the caller's wait, and be counted whole.
    let Some(&cpu) = baton_core::threads::sys::allowed_cpus().first() else { return };
    let got = std::thread::spawn(move || {
        baton_core::threads::sys::pin_current_thread(cpu).unwrap();
        let trimmed = trimmed_reports();
        let got =
            readings_after(&["work", "work", "work"], || baton_core::threads::sys::set_current_thread_idle().unwrap());
        (got, trimmed_reports() - trimmed)
    })
    .join()
    .unwrap();
    let (got, trimmed) = got;
    for reading in &got {
        assert!(reading.sample >= Duration::from_millis(5), "{reading:?}");
    }
    assert_eq!(trimmed, 0, "an honest worker's report was cut down: {got:?}");
}
