//! What each clock sees of a run, for the latency guard's choice of sample
//! (docs/rollout.md, "Latency, like for like"; docs/BENCHMARKS.md §7).
//!
//! `cargo run --release -p baton-server --example latency_clocks -- BATON [SECONDS] [BUSY]`
//!
//! BATON is a baton binary, started as `baton worker` for the versions
//! that run in a worker. For each case, two client threads call a stable
//! version (in this process) and a candidate alternately, as a canary and
//! its paired copies do, for SECONDS (default 10); BUSY threads (default 0)
//! spin beside them at the same priority, as other work on the machine.
//! Every call is timed on the calling thread by each clock:
//!
//! - `cpu`: the calling thread's CPU time (the guard's sample until now);
//! - `wall`: the calling thread's wall time, the hop included for a worker;
//! - `wall-delay`: the wall time less the kernel's count of the thread's
//!   wait for a core (`/proc/thread-self/schedstat`);
//! - `worker-ran`: the worker's own timing of the call, sent with its
//!   answer (workers only);
//! - `sample`: the guard's sample (`baton_core::run::executor::timing`).
//!
//! It prints, per case and clock, each side's median, and the ratio of the
//! candidate's tail to the stable version's in windows of 300 calls a side
//! (the quantile the guard reads there: 20 runs above it, p93.3): the
//! median over the windows, and the lowest and highest.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_core::files::spec::ModelSpec;
use baton_core::run::backend::{Backend, Model};
use baton_core::run::executor::timing::Stopwatch;
use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};

const SIZES: [usize; 4] = [256, 512, 512, 16];
const ROWS: usize = 128;
const CLOCKS: [&str; 5] = ["cpu", "wall", "wall-delay", "worker-ran", "sample"];
/// Calls a side in one window, as a window of a canary gathers.
const WINDOW: usize = 300;

/// One call's readings, in microseconds, by clock (`NaN`: not read).
type Reading = [f64; 5];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let program = args.first().ok_or("usage: latency_clocks BATON [SECONDS] [BUSY]")?.into();
    let seconds: f64 = args.get(1).map_or(Ok(10.0), |s| s.parse())?;
    let busy: usize = args.get(2).map_or(Ok(0), |s| s.parse())?;
    baton_core::run::executor::start_spawner();
    let onnx = baton_onnx::OnnxBackend::new()?;
    let backend = baton_worker::process::ProcessBackend::new(Arc::new(onnx), program, vec!["worker".into()])
        .with_runtime_env("ORT_DYLIB_PATH");
    let repo = TestRepo::new();
    let mlp = Mlp::new(&SIZES, 49);
    let load = |rows: usize, engine: &str| -> Result<Box<dyn Model>, Box<dyn std::error::Error>> {
        let version = repo.root().join(format!("v{rows}-{}", engine.len()));
        let model = baton_onnx::costly::encode_costly(&mlp, rows);
        std::fs::create_dir_all(&version)?;
        std::fs::write(version.join("model.onnx"), model)?;
        baton_core::files::manifest::write(&version)?;
        let verified = baton_core::files::manifest::verify(&version)?;
        let spec = ModelSpec::parse(&mlp_toml(&mlp, &format!("[engine]\nsessions = 2\n{engine}")))?;
        Ok(backend.load(&verified, &spec)?)
    };
    let stable: Arc<dyn Model> = Arc::from(load(ROWS, "")?);
    let cases: [(&str, usize, &str); 6] = [
        ("identical, in the server", ROWS, ""),
        ("identical, in a worker", ROWS, "isolation = \"process\""),
        ("3x, in a worker", 3 * ROWS, "isolation = \"process\""),
        ("3x, 2 engine threads (busy-wait)", 3 * ROWS, "intra_op_threads = 2"),
        ("4x, 4 engine threads (sleep)", 4 * ROWS, "intra_op_threads = 4\nallow_spinning = false"),
        ("identical, 2 engine threads (busy-wait)", ROWS, "intra_op_threads = 2"),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..busy)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    println!("{busy} busy threads, {seconds} s a case, load average {}", loadavg());
    println!("| case | clock | stable p50, µs | candidate p50, µs | tail ratio per window: median (lowest–highest) |");
    println!("|---|---|---|---|---|");
    for (name, rows, engine) in cases {
        let candidate: Arc<dyn Model> = Arc::from(load(rows, engine)?);
        let trimmed = baton_core::run::executor::timing::trimmed_reports();
        let (a, b) = paired(&stable, &candidate, Duration::from_secs_f64(seconds));
        let trimmed = baton_core::run::executor::timing::trimmed_reports() - trimmed;
        if trimmed > 0 {
            println!("| {name} | {trimmed} of {} worker reports cut down | | | |", b.len());
        }
        for (clock, label) in CLOCKS.iter().enumerate() {
            let (a50, b50) = (quantile(&column(&a, clock), 0.5), quantile(&column(&b, clock), 0.5));
            let mut ratios: Vec<f64> = a
                .chunks(WINDOW)
                .zip(b.chunks(WINDOW))
                .filter(|(a, b)| a.len() == WINDOW && b.len() == WINDOW)
                .filter_map(|(a, b)| Some(tail(&column(b, clock))? / tail(&column(a, clock))?))
                .collect();
            ratios.sort_by(f64::total_cmp);
            let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
            let spread = match (ratios.first(), ratios.last()) {
                (Some(low), Some(high)) => {
                    format!("{:.2} ({low:.2}–{high:.2}), {} windows", ratios[ratios.len() / 2], ratios.len())
                }
                _ => "-".to_owned(),
            };
            if b50.is_some() {
                println!("| {name} | {label} | {} | {} | {spread} |", cell(a50), cell(b50));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    spinners.into_iter().for_each(|s| s.join().unwrap());
    println!("load average {}", loadavg());
    Ok(())
}

/// Two client threads calling `a` then `b` in turn, each on its own
/// session; every call's readings, per side.
fn paired(a: &Arc<dyn Model>, b: &Arc<dyn Model>, run: Duration) -> (Vec<Reading>, Vec<Reading>) {
    let clients: Vec<_> = (0..2usize)
        .map(|instance| {
            let (a, b) = (Arc::clone(a), Arc::clone(b));
            std::thread::spawn(move || {
                let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
                let until = Instant::now() + run;
                let mut seed = instance as u64 * 1_000_000;
                while Instant::now() < until {
                    seed += 1;
                    let input = [Tensor::from_f32("input", vec![1, SIZES[0] as i64], &sample_input(SIZES[0], 1, seed))];
                    on_a.push(read(a.as_ref(), instance, &input));
                    on_b.push(read(b.as_ref(), instance, &input));
                }
                (on_a, on_b)
            })
        })
        .collect();
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    for client in clients {
        let (a, b) = client.join().unwrap();
        // The first calls warm each session's buffers.
        on_a.extend(a.into_iter().skip(20));
        on_b.extend(b.into_iter().skip(20));
    }
    (on_a, on_b)
}

/// One call on `instance`, read by every clock.
fn read(model: &dyn Model, instance: usize, inputs: &[Tensor]) -> Reading {
    let watch = Stopwatch::start();
    model.infer_on(instance, inputs).expect("a run");
    let reading = watch.read();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    [
        reading.cpu.map_or(f64::NAN, us),
        us(reading.wall),
        reading.delay.map_or(f64::NAN, |d| us(reading.wall.saturating_sub(d))),
        if reading.replaced.0.is_zero() { f64::NAN } else { us(reading.replaced.1) },
        us(reading.sample),
    ]
}

fn column(readings: &[Reading], clock: usize) -> Vec<f64> {
    let mut values: Vec<f64> = readings.iter().map(|r| r[clock]).filter(|v| !v.is_nan()).collect();
    values.sort_by(f64::total_cmp);
    values
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// The quantile the latency guard reads for this many runs.
fn tail(sorted: &[f64]) -> Option<f64> {
    quantile(sorted, baton_core::rollout::window::tail_quantile(sorted.len() as u64))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').take(3).collect::<Vec<_>>().join(" ")
}
