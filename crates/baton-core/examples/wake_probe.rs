//! How late a thread at serving priority wakes up while low-priority threads
//! keep every core busy with one kind of work — the probe behind "Fresh
//! memory" in docs/benchmarks-notebook.md §2.
//!
//! `cargo run --release -p baton-core --example wake_probe -- WORK [FILE] [SECONDS]`
//!
//! WORK is what the low-priority threads (one per CPU, nice 19, like baton's
//! loader) do over and over:
//!
//! - `compute`: arithmetic only, no memory;
//! - `touch-fresh`: allocate a new 3 MiB block and write one byte per page;
//! - `read-fresh`: read FILE into a newly allocated buffer (`std::fs::read`);
//! - `read-reused`: read FILE into one buffer, allocated in the first round
//!   and reused after.
//!
//! glibc's mmap threshold is set to 256 KiB first, as `baton serve` does, so
//! a new block of 256 KiB or more is a fresh mapping each time. Meanwhile a
//! thread at the caller's priority sleeps 200 µs at a time for SECONDS
//! (default 4) and records how much later than asked it woke. Prints the
//! p50, p99, p99.9 and maximum lateness and how many wakes were more than
//! 1 ms late, as JSON.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SLEEP: Duration = Duration::from_micros(200);
const BLOCK: usize = 3 << 20;
const PAGE: usize = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: wake_probe compute|touch-fresh|read-fresh|read-reused [FILE] [SECONDS]";
    let work = args.first().ok_or(usage)?.clone();
    let file = args.get(1).cloned().unwrap_or_default();
    let seconds: f64 = args.get(2).map_or(Ok(4.0), |s| s.parse())?;
    if !["compute", "touch-fresh", "read-fresh", "read-reused"].contains(&work.as_str()) {
        return Err(usage.into());
    }
    if work.starts_with("read") && std::fs::metadata(&file).is_err() {
        return Err(format!("{work} needs a readable FILE; {usage}").into());
    }
    baton_core::threads::sys::keep_large_allocations_mapped();

    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy: Vec<_> = (0..cpus)
        .map(|_| {
            let (work, file, stop) = (work.clone(), file.clone(), Arc::clone(&stop));
            std::thread::spawn(move || low_priority(&work, &file, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));

    let mut late_us = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let asked = Instant::now();
        std::thread::sleep(SLEEP);
        late_us.push(asked.elapsed().saturating_sub(SLEEP).as_secs_f64() * 1e6);
    }
    stop.store(true, Ordering::Relaxed);
    let mut rounds = 0u64;
    for thread in busy {
        rounds += thread.join().map_err(|_| "a low-priority thread panicked")??;
    }

    late_us.sort_by(f64::total_cmp);
    let at = |q: f64| late_us[((late_us.len() - 1) as f64 * q) as usize];
    println!(
        "{{\"work\":\"{work}\",\"wakes\":{},\"rounds_of_work\":{rounds},\"late_p50_us\":{:.0},\"late_p99_us\":{:.0},\
         \"late_p999_us\":{:.0},\"late_max_us\":{:.0},\"late_over_1ms\":{}}}",
        late_us.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0),
        late_us.iter().filter(|&&l| l > 1000.0).count()
    );
    Ok(())
}

/// Does `work` at nice 19 until `stop`; returns how many rounds it did.
fn low_priority(work: &str, file: &str, stop: &AtomicBool) -> Result<u64, String> {
    baton_core::threads::sys::set_current_thread_nice(19).map_err(|e| format!("setting nice 19: {e}"))?;
    let mut reused = Vec::new();
    let mut sink = 0u64;
    let mut rounds = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match work {
            "compute" => {
                for i in 0..100_000u64 {
                    sink = sink.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
                }
            }
            "touch-fresh" => {
                let mut block = vec![0u8; BLOCK];
                for i in (0..BLOCK).step_by(PAGE) {
                    block[i] = 1;
                }
                sink += u64::from(std::hint::black_box(&block)[PAGE]);
            }
            "read-fresh" => {
                let bytes = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
                sink += bytes.len() as u64;
            }
            _ => {
                // Keeps its capacity: only the first round allocates.
                reused.clear();
                let n = std::fs::File::open(file)
                    .and_then(|mut f| f.read_to_end(&mut reused))
                    .map_err(|e| format!("{file}: {e}"))?;
                sink += n as u64;
            }
        }
        rounds += 1;
    }
    std::hint::black_box(sink);
    Ok(rounds)
}
