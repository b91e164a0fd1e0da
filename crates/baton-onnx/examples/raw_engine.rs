//! The raw-engine baseline: ONNX Runtime sessions called in a loop, with no
//! server around them — the rate baton's serving path is compared with.
//!
//! `cargo run --release -p baton-onnx --example raw_engine -- MODEL.onnx [SECONDS] [BATCH] [THREADS]`
//!
//! Each thread owns one session with one intra-op thread (baton's default
//! engine settings) and calls it back to back. Prints calls per second and
//! the p50/p99 latency of a call, as JSON.

use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::{Tensor, ValueType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().ok_or("usage: raw_engine MODEL.onnx [SECONDS] [BATCH] [THREADS]")?.clone();
    let seconds: f64 = args.get(1).map_or(Ok(5.0), |s| s.parse())?;
    let batch: i64 = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let env = std::sync::Arc::new(ort::init_from(baton_onnx::runtime_path()?.as_path())?.build()?);

    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (model, env) = (model.clone(), env.clone());
            std::thread::spawn(move || -> Result<Vec<Duration>, String> {
                let mut session = Session::builder(&env)
                    .map_err(|e| e.to_string())?
                    .with_intra_threads(1)
                    .map_err(|e| e.to_string())?
                    .commit_from_file(&model)
                    .map_err(|e| e.to_string())?;
                let input = &session.inputs()[0];
                let name = input.name().to_owned();
                let ValueType::Tensor { shape, .. } = input.dtype() else { return Err("not a tensor input".into()) };
                let dims: Vec<i64> = shape.iter().map(|d| if *d < 0 { batch } else { *d }).collect();
                let count = dims.iter().product::<i64>() as usize;
                let data: Vec<f32> = (0..count).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
                let deadline = Instant::now() + Duration::from_secs_f64(seconds);
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let value = Tensor::from_array((dims.clone(), data.clone())).map_err(|e| e.to_string())?;
                    let started = Instant::now();
                    let outputs = session.run(ort::inputs![name.as_str() => value]).map_err(|e| e.to_string())?;
                    drop(outputs);
                    latencies.push(started.elapsed());
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.join().map_err(|_| "a worker panicked")??);
    }
    all.sort();
    let pick = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)].as_secs_f64() * 1e6;
    println!(
        "{}",
        serde_json::json!({
            "calls": all.len(),
            "calls_per_s": all.len() as f64 / seconds,
            "p50_us": pick(0.5),
            "p99_us": pick(0.99),
            "threads": threads,
            "batch": batch,
        })
    );
    Ok(())
}
