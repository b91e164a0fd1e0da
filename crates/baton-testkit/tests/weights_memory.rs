//! Memory and load-time figures of shared weights, printed for the
//! benchmark (`bash bench/weights.sh`); ignored in the test suite, since
//! they measure rather than check. Each prints one `figure:` line per
//! measurement.

use baton_onnx::mlp::mlp_safetensors;
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};

const MIB: f64 = 1048576.0;

fn weights_of(mlp: &Mlp) -> u64 {
    mlp.layers.iter().map(|l| (l.weight.len() + l.bias.len()) as u64 * 4).sum()
}

fn stages(report: &baton_core::registry::events::LoadReport) -> String {
    report
        .stages
        .iter()
        .map(|s| format!("{} {:.0}", s.stage.as_str(), s.duration.as_secs_f64() * 1e3))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
#[ignore = "a benchmark: prints memory figures"]
fn bytes_held_per_pool_size() {
    let mlp = Mlp::new(&[1024, 4096, 4096, 1], 3);
    let weights = weights_of(&mlp);
    for (sessions, prepack) in [(1, true), (2, true), (4, true), (1, false), (2, false), (4, false)] {
        let repo = TestRepo::new();
        let engine = format!("[engine]\nsessions = {sessions}\nprepack = {prepack}");
        repo.add_model("m", &mlp_toml(&mlp, &engine));
        repo.publish_mlp("m", 1, &mlp);
        let registry = baton_testkit::registry(repo.root());
        let report = registry.load("m", Some(1)).unwrap().wait().unwrap();
        let held = report.bytes_held;
        println!(
            "figure: pool {sessions}, prepack {prepack}: bytes_held {:.1} MiB = {:.3}x the weights ({:.1} MiB); stages ms: {}",
            held as f64 / MIB,
            held as f64 / weights as f64,
            weights as f64 / MIB,
            stages(&report)
        );
    }
}

#[test]
#[ignore = "a benchmark: prints load times"]
fn a_gigabyte_of_safetensors_loads() {
    // Four 8192 × 8192 FP32 layers: 1 GiB.
    let graph = Mlp::new(&[8192, 8192, 8192, 8192, 8192, 1], 1);
    let weights = mlp_safetensors(&graph);
    let prepack = std::env::var("PREPACK").map_or(true, |v| v != "false");
    let repo = TestRepo::new();
    let toml = format!("[warmup]\ngenerated = false\n[engine]\nsessions = 1\nprepack = {prepack}");
    repo.add_model("m", &mlp_toml(&graph, &toml));
    let dir = repo.publish_weights("m", 1, &graph, &weights, &[]);
    drop(weights);
    manifest_format_from_env(&dir);
    let registry = baton_testkit::registry(repo.root());
    // The file is in the page cache: it was just written.
    load_twice(&registry, &format!("1 GiB safetensors, prepack {prepack}"));
}

/// Loads version 1 of `m`, then again (the second load replaces the first
/// with the same version), printing each one's time to commit as `what`.
fn load_twice(registry: &baton_core::registry::Registry, what: &str) {
    for version in [1, 1] {
        let report = registry.load("m", Some(version)).unwrap().wait().unwrap();
        let to_commit: f64 = report
            .stages
            .iter()
            .take_while(|s| s.stage != baton_core::registry::events::Stage::Drain)
            .map(|s| s.duration.as_secs_f64())
            .sum();
        println!(
            "figure: {what}, version {version}: committed in {:.3} s; stages ms: {}; bytes_held {:.1} MiB",
            to_commit,
            stages(&report),
            report.bytes_held as f64 / MIB
        );
    }
}

#[test]
#[ignore = "a benchmark: prints load times"]
fn a_gigabyte_as_one_onnx_file_loads() {
    // The graph of `a_gigabyte_of_safetensors_loads`, its weights inside
    // model.onnx: the whole-model load a weights-only one is held against.
    let graph = Mlp::new(&[8192, 8192, 8192, 8192, 8192, 1], 1);
    let prepack = std::env::var("PREPACK").map_or(true, |v| v != "false");
    let repo = TestRepo::new();
    let toml = format!("[warmup]\ngenerated = false\n[engine]\nsessions = 1\nprepack = {prepack}");
    repo.add_model("m", &mlp_toml(&graph, &toml));
    let dir = repo.publish_mlp("m", 1, &graph);
    drop(graph);
    manifest_format_from_env(&dir);
    let registry = baton_testkit::registry(repo.root());
    load_twice(&registry, &format!("1 GiB as one ONNX file, prepack {prepack}"));
}

/// With `MANIFEST_FORMAT=1`, writes the version's MANIFEST again with each
/// file's plain SHA-256, which one core hashes.
fn manifest_format_from_env(dir: &std::path::Path) {
    if std::env::var("MANIFEST_FORMAT").is_ok_and(|v| v == "1") {
        baton_core::files::manifest::write_as(dir, baton_core::files::manifest::Format::Whole).unwrap();
        println!("figure: (MANIFEST format 1)");
    }
}

#[test]
#[ignore = "a benchmark: prints memory figures"]
fn memory_added_by_a_version_changing_one_layer_in_ten() {
    let sizes = [1024; 11];
    let base = Mlp::new(&sizes, 1);
    let mut tuned = base.clone();
    tuned.layers[9] = Mlp::new(&sizes, 2).layers[9].clone();
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&base, "[policy]\nkeep_previous = 1"));
    repo.publish_mlp("m", 1, &base);
    repo.publish_weights("m", 2, &base, &mlp_safetensors(&tuned), &[]);
    let registry = baton_testkit::registry(repo.root());
    let first = registry.load("m", Some(1)).unwrap().wait().unwrap();
    let second = registry.load("m", Some(2)).unwrap().wait().unwrap();
    let live = registry.live_versions("m");
    let memory = live.iter().find(|v| v.version == 2).unwrap().memory;
    let weights = weights_of(&base) as f64;
    println!(
        "figure: 1 of 10 layers changed: version 1 holds {:.1} MiB ({:.2}x), version 2 adds {:.1} MiB ({:.2}x the weights); \
         shared {:.1} MiB",
        first.bytes_held as f64 / MIB,
        first.bytes_held as f64 / weights,
        second.bytes_held as f64 / MIB,
        second.bytes_held as f64 / weights,
        memory.shared as f64 / MIB
    );
}

/// Resident memory now: (anonymous, file-backed) bytes, from /proc/self/status.
fn rss_split() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("RssAnon:"), field("RssFile:") + field("RssShmem:"))
}

#[test]
#[ignore = "a benchmark: prints the peak memory of swaps"]
fn peak_memory_of_availability_and_resource_swaps() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    // The 480 MiB MLP of the drill benchmarks.
    let sizes = [1024, 8192, 8192, 6144, 1];
    let (one, two) = (Mlp::new(&sizes, 1), Mlp::new(&sizes, 2));
    let weights = weights_of(&one) as f64;
    for policy in ["availability", "resource"] {
        let repo = TestRepo::new();
        let sessions = std::env::var("SESSIONS").unwrap_or_else(|_| "2".into());
        let toml = format!(
            "[policy]\nkeep_previous = 0\nswap = \"{policy}\"\n[warmup]\ngenerated = false\n[engine]\nsessions = {sessions}"
        );
        repo.add_model("m", &mlp_toml(&one, &toml));
        repo.publish_mlp("m", 1, &one);
        repo.publish_mlp("m", 2, &two);
        let registry = baton_testkit::registry(repo.root());
        let (anon0, file0) = rss_split();
        registry.load("m", Some(1)).unwrap().wait().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let (mut anon, mut total) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let (a, f) = rss_split();
                    (anon, total) = (anon.max(a), total.max(a + f));
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                (anon, total)
            })
        };
        let report = registry.load("m", Some(2)).unwrap().wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        let (anon, total) = sampler.join().unwrap();
        println!(
            "figure: {policy} swap of a {:.0} MiB model, pool of {sessions}: peak {:.2}x the weights (anonymous {:.2}x, the rest mapped \
             file pages); paused {}; stages ms: {}",
            weights / MIB,
            (total.saturating_sub(anon0 + file0)) as f64 / weights,
            anon.saturating_sub(anon0) as f64 / weights,
            report.paused.map_or("no".to_owned(), |p| format!("{:.0} ms", p.as_secs_f64() * 1e3)),
            stages(&report)
        );
    }
}
