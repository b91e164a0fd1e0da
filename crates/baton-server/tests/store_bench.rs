//! A benchmark, ignored by default (`bash bench/store.sh` runs it in a
//! release build): a 1 GiB weights-only version loaded by the real binary
//! from a local directory, from an S3-compatible store on loopback
//! (SeaweedFS) with an empty cache, and from the store again after a
//! restart (the cache), each load's stages printed. Meanwhile two clients
//! send 300 requests/s in all to a small model of the same server (open
//! loop); their p99 while the bytes come in (fetch and verify) is printed
//! against the p99 of the five seconds before. With `ELSEWHERE=1`, the
//! same bytes are also downloaded by curl in another process beside
//! serving.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_onnx::mlp::mlp_safetensors;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::s3::S3;
use baton_testkit::server::Server;
use common::{SIZES, bin, mlp};
use serde_json::{Value, json};

/// Each client's interval between requests: 150 requests/s each, 300 in
/// all, as the load-isolation benchmark sends.
const PERIOD: Duration = Duration::from_micros(6667);

/// Requests of the small model: when each was sent (from the start) and
/// how long it took.
type Samples = Arc<Mutex<Vec<(Duration, Duration)>>>;

fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort_unstable();
    latencies.get(latencies.len().saturating_sub(1) * 99 / 100).copied().unwrap_or_default()
}

/// Two open-loop clients of the small model, sending until stopped.
struct Traffic {
    start: Instant,
    stop: Arc<AtomicBool>,
    samples: Samples,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(server: &Server) -> Traffic {
        server.wait_serving("small", 1);
        let (stop, samples): (Arc<AtomicBool>, Samples) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let start = Instant::now();
        let input = sample_input(SIZES[0], 1, 3);
        let clients = (0..2)
            .map(|_| {
                let (client, stop, samples) = (server.client(), Arc::clone(&stop), Arc::clone(&samples));
                let body = common::request(&input, 1);
                std::thread::spawn(move || {
                    // Open loop: a request every PERIOD, whatever the answers take.
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(300) {
                        next += PERIOD;
                        std::thread::sleep(next.saturating_duration_since(Instant::now()));
                        let sent = Instant::now();
                        let answer = client.post_json("/v2/models/small/infer", &body);
                        assert_eq!(answer.status, 200, "{}", answer.error());
                        samples.lock().unwrap().push((sent - start, sent.elapsed()));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(5));
        Traffic { start, stop, samples, clients }
    }

    /// Stops the clients; says the p99 of the five seconds before `from`
    /// and of the window from `from` to `to` (from the start).
    fn stop(self, from: Duration, to: Duration) -> String {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.join().unwrap();
        }
        let samples = self.samples.lock().unwrap().clone();
        let steady = p99(samples.iter().filter(|(at, _)| *at < from).map(|s| s.1).collect());
        let window: Vec<Duration> = samples.iter().filter(|(at, _)| *at >= from && *at < to).map(|s| s.1).collect();
        let during = p99(window.clone());
        format!(
            "small model p99 steady {:.2} ms, while the bytes come in {:.2} ms ({} requests), ratio {:.2}",
            steady.as_secs_f64() * 1e3,
            during.as_secs_f64() * 1e3,
            window.len(),
            during.as_secs_f64() / steady.as_secs_f64().max(1e-9),
        )
    }
}

/// Loads `big` version 1 through the management API with the small model
/// under load, and prints the stages and the small model's p99.
fn measure(server: &Server, what: &str) {
    let traffic = Traffic::start(server);
    let load_at = traffic.start.elapsed();
    let answer = server.post_json("/baton/v1/models/big/load", &json!({ "version": 1 }));
    assert_eq!(answer.status, 200, "{}", answer.error());
    let report: Value = answer.json();
    let stages = report["stages"].as_array().cloned().unwrap_or_default();
    let ms =
        |name: &str| stages.iter().find(|s| s["stage"] == name).and_then(|s| s["duration"].as_f64()).unwrap_or(0.0);
    let committed: f64 =
        stages.iter().take_while(|s| s["stage"] != "drain").filter_map(|s| s["duration"].as_f64()).sum();
    // The bytes come in during fetch (from a store) or verify (a local
    // file is copied while hashed): the window is both.
    let bytes_in = load_at + Duration::from_secs_f64((ms("fetch") + ms("verify")).max(1.0) / 1e3);
    let p99s = traffic.stop(load_at, bytes_in);
    println!(
        "figure: {what}: committed in {:.2} s; stages ms: fetch {:.0}, verify {:.0}, load {:.0}, validate {:.0}, warmup {:.0}; {p99s}",
        committed / 1e3,
        ms("fetch"),
        ms("verify"),
        ms("load"),
        ms("validate"),
        ms("warmup"),
    );
}

/// The same download done by other processes while `server` serves the
/// small model: curl fetches the weights object from the store, `tee`
/// writes it to a file and `sha256sum` hashes it. Tells a cost that comes
/// with the bytes (the machine's CPUs, the kernel's receive path) from one
/// that comes from downloading inside the serving process.
fn measure_elsewhere(server: &Server, s3: &S3, what: &str) {
    let (key, secret) = s3.credentials.clone();
    let url = format!("{}/models/prod/big/1/weights.safetensors", s3.endpoint());
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("weights.safetensors");
    // ELSEWHERE_SPLIT=1: the server and its clients on CPU 0, the store and
    // the download on CPU 1, so that they share no CPU (the kernel's
    // loopback receive work runs on the sending CPU).
    let split = std::env::var("ELSEWHERE_SPLIT").is_ok_and(|v| v == "1");
    let pin = |pid: u32, cpus: &str| {
        let status = std::process::Command::new("taskset").args(["-a", "-cp", cpus, &pid.to_string()]).output();
        assert!(status.is_ok_and(|o| o.status.success()), "taskset {cpus} {pid}");
    };
    if split {
        pin(server.pid(), "0");
        pin(std::process::id(), "0");
        pin(s3.pid(), "1");
    }
    let traffic = Traffic::start(server);
    let from = traffic.start.elapsed();
    // ELSEWHERE_SINK=null: curl throws the bytes away, so that only the
    // transfer itself runs beside serving.
    let sink = match std::env::var("ELSEWHERE_SINK").as_deref() {
        Ok("null") => "wc -c".to_owned(),
        _ => format!("tee '{}' | sha256sum >/dev/null", target.display()),
    };
    // ELSEWHERE_RATE: curl's --limit-rate (such as 100M), to pace the bytes.
    let rate = std::env::var("ELSEWHERE_RATE").map(|r| format!("--limit-rate {r}")).unwrap_or_default();
    let script = format!("curl -sSf {rate} --aws-sigv4 aws:amz:us-east-1:s3 --user '{key}:{secret}' '{url}' | {sink}");
    // ELSEWHERE_NICE (19 unless set): the downloading processes' nice level.
    let nice = std::env::var("ELSEWHERE_NICE").unwrap_or_else(|_| "19".into());
    let cpus = if split { "1" } else { "0-1" };
    let status = std::process::Command::new("taskset")
        .args(["-c", cpus, "nice", "-n", &nice, "bash", "-o", "pipefail", "-c", &script])
        .status()
        .unwrap();
    let to = traffic.start.elapsed();
    assert!(status.success(), "the download by curl failed");
    let p99s = traffic.stop(from, to);
    if split {
        pin(std::process::id(), "0-1");
        pin(s3.pid(), "0-1");
    }
    println!(
        "figure: {what}: in {:.2} s by curl {rate} | {sink} at nice {nice} on CPUs {cpus}; {p99s}",
        (to - from).as_secs_f64()
    );
}

#[test]
#[ignore = "a benchmark: prints load times from disk and from a store"]
fn a_gigabyte_from_disk_from_a_store_and_from_its_cache() {
    let prepack = std::env::var("PREPACK").is_ok_and(|v| v == "true");
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    // Four 8192 × 8192 FP32 layers: 1 GiB, as a weights-only version.
    let graph = Mlp::new(&[8192, 8192, 8192, 8192, 8192, 1], 1);
    let repo = TestRepo::new();
    let toml = format!("[warmup]\ngenerated = false\n[engine]\nsessions = 1\nprepack = {prepack}");
    repo.add_model("big", &mlp_toml(&graph, &toml));
    let big = repo.publish_weights("big", 1, &graph, &mlp_safetensors(&graph), &[]);
    // MANIFEST_FORMAT=1: each file's plain SHA-256, hashed on one core.
    if std::env::var("MANIFEST_FORMAT").is_ok_and(|v| v == "1") {
        baton_core::files::manifest::write_as(&big, baton_core::files::manifest::Format::Whole).unwrap();
    }
    repo.add_model("small", &mlp_toml(&mlp(1), ""));
    repo.publish_mlp("small", 1, &mlp(1));

    // STORE_NICE=19: the store on this machine takes CPU only when serving
    // leaves it some, as a remote one takes none.
    let nice = std::env::var("STORE_NICE").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
    let s3 = S3::start_nice(nice);
    s3.create_bucket("models");
    for model in ["big", "small"] {
        s3.publish_model("models", "prod", &repo.root().join(model));
    }
    // SERVER_ARGS: more flags for every server, such as --loader-idle.
    let extra = std::env::var("SERVER_ARGS").unwrap_or_default();
    let mut explicit = vec!["--model-control", "explicit", "--load-model", "small"];
    explicit.extend(extra.split_whitespace());
    // LOCAL_ONLY=1: the local directory's loads alone.
    let local_only = std::env::var("LOCAL_ONLY").is_ok_and(|v| v == "1");
    for round in 1..=rounds {
        let local = Server::start(bin(), repo.root(), &explicit);
        measure(&local, &format!("round {round}, local disk (page cache)"));
        drop(local);
        if local_only {
            continue;
        }

        let cache = tempfile::tempdir().unwrap();
        let mut args = explicit.clone();
        let cache_dir = cache.path().to_str().unwrap();
        args.extend(["--cache-dir", cache_dir]);
        let cold = Server::start_with_env(bin(), Path::new("s3://models/prod"), &args, &s3.env());
        measure(&cold, &format!("round {round}, store, empty cache"));
        drop(cold);
        let cached = Server::start_with_env(bin(), Path::new("s3://models/prod"), &args, &s3.env());
        measure(&cached, &format!("round {round}, store, cached"));
        drop(cached);
        // ELSEWHERE=1: the same bytes downloaded by other processes.
        if std::env::var("ELSEWHERE").is_ok_and(|v| v == "1") {
            let local = Server::start(bin(), repo.root(), &explicit);
            measure_elsewhere(&local, &s3, &format!("round {round}, store, downloaded by another process"));
        }
    }
}
