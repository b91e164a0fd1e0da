//! Experiment (ignored): what a version of a large MLP holds for pool
//! sizes 1, 2 and 4. `cargo test --release -p baton-testkit --test
//! weights_memory -- --ignored --nocapture`.

use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};

#[test]
#[ignore = "an experiment that prints memory figures"]
fn bytes_held_per_pool_size() {
    let mlp = Mlp::new(&[1024, 4096, 4096, 1], 3);
    let weights = (1024 * 4096 + 4096 * 4096 + 4096) * 4;
    for sessions in [1, 2, 4] {
        let repo = TestRepo::new();
        repo.add_model("m", &mlp_toml(&mlp, &format!("[engine]\nsessions = {sessions}")));
        repo.publish_mlp("m", 1, &mlp);
        let registry = baton_testkit::registry(repo.root());
        let report = registry.load("m", Some(1)).unwrap().wait().unwrap();
        let held = registry.snapshot().model("m").unwrap().stable.bytes_held();
        println!(
            "sessions {sessions}: bytes_held {:.1} MiB = {:.2}x the weights ({:.1} MiB); load {:?} ms",
            held as f64 / 1048576.0,
            held as f64 / weights as f64,
            weights as f64 / 1048576.0,
            report.stages.iter().map(|s| (s.stage.as_str(), s.duration.as_millis())).collect::<Vec<_>>()
        );
    }
}
