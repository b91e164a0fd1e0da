//! Weights-only versions (a graph and a safetensors file) and tensors
//! shared between versions, through the real engine: a weights-only
//! version serves exactly what the same model in one ONNX file serves; a
//! weights file that disagrees with its graph, or whose header is damaged,
//! is refused at the stage that catches it while the serving version keeps
//! answering; a version whose tensors are partly those of the serving one
//! holds only the changed ones, and either can go first while requests run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_core::files::source::{FetchError, Fetched, LocalRepository, Presence, Source};
use baton_core::files::spec::ModelSpec;
use baton_core::registry::events::Stage;
use baton_core::run::backend::UpdateKind;
use baton_onnx::mlp::mlp_safetensors;
use baton_onnx::proto::elem;
use baton_onnx::safetensors;
use baton_testkit::onnx::{Mlp, OnnxOptions, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::{infer_mlp, registry};

/// Small, so that a debug build runs these quickly: weights-only versions
/// and versions with external data are always staged, and so shared.
const SIZES: [usize; 4] = [16, 64, 64, 4];

/// Publishes a whole model with its weights as external data.
fn publish_staged(repo: &TestRepo, version: u64, mlp: &Mlp) {
    let options = OnnxOptions { external_data: Some("weights.bin".into()), ..OnnxOptions::default() };
    repo.publish_mlp_with("m", version, mlp, &options, &[]);
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Model `m`: version 1 whole, version 2 new weights only over version 1's
/// graph, version 3 the same new weights whole.
fn three_versions() -> TestRepo {
    let repo = TestRepo::new();
    let (old, new) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
    repo.add_model("m", &mlp_toml(&old, ""));
    repo.publish_mlp("m", 1, &old);
    repo.publish_weights("m", 2, &old, &mlp_safetensors(&new), &[]);
    repo.publish_mlp("m", 3, &new);
    repo
}

#[test]
fn a_weights_only_version_serves_exactly_what_the_whole_model_serves() {
    let repo = three_versions();
    let registry = registry(repo.root());
    let input = sample_input(SIZES[0], 3, 9);
    let mut answers = Vec::new();
    for version in [1, 2, 3] {
        let report = registry.load("m", Some(version)).unwrap().wait().unwrap();
        let expected = if version == 2 { UpdateKind::Weights } else { UpdateKind::Graph };
        assert_eq!(report.update, Some(expected), "version {version}");
        let status = registry.status("m").unwrap();
        let live = status.live.iter().find(|v| v.version == version).unwrap();
        assert_eq!(live.update, expected);
        assert!(live.memory.weights > 0 && live.memory.total == live.bytes_held);
        answers.push(infer_mlp(&registry.snapshot(), "m", &input, 3).unwrap());
    }
    assert_eq!(answers[1].0, 2);
    assert_eq!(answers[1].1, answers[2].1, "weights-only and whole model answer bit for bit alike");
    assert_ne!(answers[0].1, answers[1].1, "the new weights are the ones served");
}

/// Loads a weights-only version 2 whose weights file is `weights` over
/// version 1's graph, expects it refused at `stage` with `reason` and a
/// message containing `says`, and version 1 still serving.
fn refused(weights: Vec<u8>, stage: Stage, reason: &str, says: &str) {
    let repo = TestRepo::new();
    let good = Mlp::new(&[8, 16, 2], 1);
    repo.add_model("m", &mlp_toml(&good, ""));
    repo.publish_mlp("m", 1, &good);
    // Written by hand: `baton package` would refuse to write such a graph.
    let (graph, _) = baton_onnx::mlp::encode_mlp(&good, &OnnxOptions::default());
    repo.write_files("m", 2, &[(safetensors::WEIGHTS_FILE, &weights), (baton_onnx::GRAPH_FILE, &graph)]);
    repo.seal("m", 2);
    let registry = registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    let error = registry.load("m", Some(2)).unwrap().wait().unwrap_err();
    assert_eq!((error.stage(), error.reason()), (Some(stage), reason), "{error}");
    assert!(error.to_string().starts_with(stage.as_str()), "the stage is named: {error}");
    assert!(error.to_string().contains(says), "{says:?} not in: {error}");
    let input = sample_input(8, 1, 2);
    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 1).unwrap();
    assert_eq!(version, 1, "the active version keeps serving");
    assert!(baton_testkit::max_diff(&output, &good.forward(&input, 1)) < 1e-5);
}

#[test]
fn a_weights_file_that_disagrees_with_the_graph_is_refused_at_validate() {
    let mlp = Mlp::new(&[8, 16, 2], 2);
    let (w0, b0, w1, b1) = (
        bytes(&mlp.layers[0].weight),
        bytes(&mlp.layers[0].bias),
        bytes(&mlp.layers[1].weight),
        bytes(&mlp.layers[1].bias),
    );
    let with = |t: &[(&str, i32, &[i64], &[u8])]| safetensors::encode(t).unwrap();
    let f = elem::FLOAT;
    // A tensor the graph does not have.
    let extra = with(&[("fc0.weight", f, &[8, 16], &w0), ("fc9.weight", f, &[2], &b1)]);
    refused(extra, Stage::Validate, "weights_mismatch", "not an initializer of the graph");
    // The right bytes under another type.
    let as_int = with(&[("fc0.weight", elem::INT32, &[8, 16], &w0), ("fc0.bias", f, &[16], &b0)]);
    refused(as_int, Stage::Validate, "weights_mismatch", "is I32 in the weights file but F32 in the graph");
    // Another shape of the same size.
    let reshaped = with(&[("fc0.weight", f, &[16, 8], &w0), ("fc1.weight", f, &[16, 2], &w1)]);
    refused(reshaped, Stage::Validate, "weights_mismatch", "has shape [16, 8] in the weights file but [8, 16]");
}

#[test]
fn a_damaged_weights_header_is_refused_at_load_not_a_crash() {
    let header = |json: &str, data: usize| {
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(json.as_bytes());
        out.resize(out.len() + data, 0);
        out
    };
    refused(header("{\"fc0.bias\": {", 64), Stage::Load, "weights_invalid", "not valid JSON");
    refused(
        header(r#"{"fc0.bias":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}"#, 32),
        Stage::Load,
        "weights_invalid",
        "not within the 32 data bytes",
    );
    refused(
        header(
            r#"{"fc0.bias":{"dtype":"F32","shape":[16],"data_offsets":[0,64]},"fc1.bias":{"dtype":"F32","shape":[2],"data_offsets":[60,68]}}"#,
            68,
        ),
        Stage::Load,
        "weights_invalid",
        "overlap",
    );
    refused(vec![0xff; 8], Stage::Load, "weights_invalid", "more than the");
}

#[test]
fn unchanged_tensors_are_held_once_and_survive_either_version_going_under_concurrent_swaps() {
    let repo = TestRepo::new();
    let base = Mlp::new(&SIZES, 1);
    // A fine-tune of the last layer only.
    let mut tuned = base.clone();
    tuned.layers[2] = Mlp::new(&SIZES, 7).layers[2].clone();
    repo.add_model("m", &mlp_toml(&base, "[policy]\nkeep_previous = 0"));
    publish_staged(&repo, 1, &base);
    repo.publish_weights("m", 2, &base, &mlp_safetensors(&tuned), &[]);
    publish_staged(&repo, 3, &base);
    let registry = Arc::new(registry(repo.root()));
    registry.load("m", Some(1)).unwrap().wait().unwrap();

    let input = sample_input(SIZES[0], 2, 5);
    let expected = [(1, base.forward(&input, 2)), (2, tuned.forward(&input, 2)), (3, base.forward(&input, 2))];
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (registry, stop, input, expected) =
                (Arc::clone(&registry), Arc::clone(&stop), input.clone(), expected.clone());
            std::thread::spawn(move || {
                let mut answered = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 2).unwrap();
                    let want = &expected.iter().find(|(v, _)| *v == version).unwrap().1;
                    let diff = baton_testkit::max_diff(&output, want);
                    assert!(diff < 1e-4, "version {version} answered {diff} away from its own weights");
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    // Each load shares with the version it replaces, which is then freed
    // (keep_previous = 0): the shared tensors must outlive it.
    let layer_bytes = |i: usize| ((SIZES[i] * SIZES[i + 1] + SIZES[i + 1]) * 4) as u64;
    for round in 0..3 {
        for version in [2, 3] {
            registry.load("m", Some(version)).unwrap().wait().unwrap();
            let status = registry.status("m").unwrap();
            let live = status.live.iter().find(|v| v.version == version).unwrap();
            let (unchanged, all) = (layer_bytes(0) + layer_bytes(1), layer_bytes(0) + layer_bytes(1) + layer_bytes(2));
            // The two layers that did not change are shared with the version
            // replaced; the last one too if a version with the same last
            // layer is still being freed.
            assert!(
                live.memory.shared >= unchanged && live.memory.shared <= all,
                "round {round}, version {version}: shared {} of {unchanged} unchanged bytes",
                live.memory.shared
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        assert!(client.join().expect("a client thread panicked") > 0);
    }
    // Once every version is freed, a new load has nothing to share with.
    let freed_before = registry.unload_records().len();
    registry.unload("m").unwrap().wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !registry.unload_records()[freed_before..].iter().any(|r| r.version == 3) {
        assert!(std::time::Instant::now() < deadline, "version 3 was never freed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    registry.load("m", Some(2)).unwrap().wait().unwrap();
    let live = registry.status("m").unwrap().live;
    assert_eq!(live.iter().find(|v| v.version == 2).unwrap().memory.shared, 0, "nothing is left to share with");
    let (version, output) = infer_mlp(&registry.snapshot(), "m", &input, 2).unwrap();
    assert_eq!(version, 2);
    assert!(baton_testkit::max_diff(&output, &expected[1].1) < 1e-4);
}

#[test]
fn a_rollouts_twin_of_a_staged_stable_version_holds_weights_of_its_own() {
    // A twin exists to run as cold as the candidate: sharing the stable
    // version's tensors and packed matrices would share their warmth.
    let repo = TestRepo::new();
    let (stable, candidate) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
    repo.add_model("m", &mlp_toml(&stable, "[rollout]\nsteps = [10, 100]\ninterval_ms = 600000\n"));
    publish_staged(&repo, 1, &stable);
    publish_staged(&repo, 2, &candidate);
    let registry = registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    let start = baton_core::registry::load::RolloutStart { version: Some(2), ..Default::default() };
    registry.start_rollout("m", start).unwrap().wait().unwrap();
    let status = registry.status("m").unwrap();
    let twin = status.live.iter().find(|v| v.twin).expect("a twin of version 1");
    assert_eq!(twin.version, 1);
    assert!(twin.memory.weights > 0, "the twin's weights are staged and mapped: {twin:?}");
    assert_eq!(twin.memory.shared, 0, "the twin took none of the stable version's tensors: {twin:?}");
    let input = [baton_core::tensors::tensor::Tensor::from_f32("input", vec![2, 16], &sample_input(SIZES[0], 2, 5))];
    let snapshot = registry.snapshot();
    let route = snapshot.model("m").unwrap();
    let twin_answer = route.rollout.as_ref().unwrap().twin.as_ref().unwrap().infer(&input).unwrap();
    let stable_answer = route.stable.infer(&input).unwrap();
    assert_eq!(twin_answer[0].to_f32(), stable_answer[0].to_f32(), "the twin answers as the stable version does");
}

#[test]
fn what_a_shared_container_keeps_of_a_gone_version_is_counted() {
    // Version 2 changes only the last layer: it shares the first two with
    // version 1, packed by version 1, and joins its container.
    let repo = TestRepo::new();
    let v1 = Mlp::new(&SIZES, 1);
    let mut v2 = v1.clone();
    v2.layers[2] = Mlp::new(&SIZES, 2).layers[2].clone();
    repo.add_model("m", &mlp_toml(&v1, "[policy]\nkeep_previous = 0\n"));
    publish_staged(&repo, 1, &v1);
    publish_staged(&repo, 2, &v2);
    let registry = registry(repo.root());
    registry.load("m", Some(1)).unwrap().wait().unwrap();
    let status = registry.status("m").unwrap();
    assert_eq!(status.retained, 0, "one version: nothing kept beyond it");
    let v1_weights = status.live[0].memory.weights;
    let freed_before = registry.unload_records().len();
    registry.load("m", Some(2)).unwrap().wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !registry.unload_records()[freed_before..].iter().any(|r| r.version == 1) {
        assert!(std::time::Instant::now() < deadline, "version 1 was never freed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = registry.status("m").unwrap();
    let live = &status.live[0];
    assert_eq!(live.version, 2);
    assert!(live.memory.shared > 0, "version 2 shares the unchanged layers: {live:?}");
    // The container still holds everything version 1 packed: the layers
    // version 2 uses and the last one it replaced. No live version's
    // bytes_held counts them, so the book does.
    assert_eq!(status.retained, v1_weights, "{status:?}");
}

/// A source that hands each version over as a store's cache does: copied
/// into a directory of its own and sealed as written, so that the verify
/// stage reads nothing again and the files are baton's.
struct Sealing {
    local: LocalRepository,
    cache: tempfile::TempDir,
}

impl Source for Sealing {
    fn models(&self) -> Result<Vec<String>, FetchError> {
        self.local.models()
    }
    fn versions(&self, model: &str) -> Result<Vec<u64>, FetchError> {
        self.local.versions(model)
    }
    fn presence(&self, model: &str, version: Option<u64>) -> Presence {
        self.local.presence(model, version)
    }
    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError> {
        self.local.spec(model)
    }
    fn version_stamp(&self, model: &str, version: u64) -> Option<String> {
        self.local.version_stamp(model, version)
    }
    fn fetch(&self, model: &str, version: u64) -> Result<Fetched, FetchError> {
        let from = self.local.fetch(model, version)?.dir;
        let dir = self.cache.path().join(model).join(version.to_string());
        let text = std::fs::read_to_string(from.join(baton_core::files::manifest::MANIFEST)).unwrap();
        let listed = baton_core::files::manifest::parse(&text).unwrap();
        let mut seal = baton_core::files::seal::Seal::new();
        for entry in &listed.entries {
            let to = dir.join(&entry.path);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(from.join(&entry.path), &to).unwrap();
            seal.record(&entry.path, &std::fs::File::open(&to).unwrap(), &entry.sha256).unwrap();
        }
        std::fs::write(dir.join(baton_core::files::manifest::MANIFEST), text).unwrap();
        Ok(Fetched { dir, seal: Some(seal) })
    }
}

/// The lines of this process's memory map that name `needle`.
fn mapped(needle: &str) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter(|l| l.contains(needle)).map(str::to_owned).collect()
}

#[test]
fn a_weights_file_baton_wrote_itself_is_mapped_where_it_is_and_serves_what_a_copy_serves() {
    let repo = three_versions();
    let cache = tempfile::tempdir().unwrap();
    let source = Sealing { local: LocalRepository::new(repo.root()), cache };
    let cached = source.cache.path().join("m/2").join(safetensors::WEIGHTS_FILE).display().to_string();
    let onnx = baton_onnx::OnnxBackend::new().unwrap();
    baton_core::run::executor::start_spawner();
    let backends: Vec<Arc<dyn baton_core::run::backend::Backend>> = vec![Arc::new(onnx)];
    let registry = baton_core::registry::Registry::new(Arc::new(source), backends, Default::default());
    let input = sample_input(SIZES[0], 3, 9);
    registry.load("m", Some(2)).unwrap().wait().unwrap();
    // Mapped from the sealed file itself, not from a staged copy of it.
    assert!(!mapped(&cached).is_empty(), "the sealed weights file is not mapped");
    let copies: Vec<String> = mapped("baton-staged-").into_iter().filter(|l| l.contains("weights.bin")).collect();
    assert!(copies.is_empty(), "a staged copy is mapped: {copies:?}");
    let weights_only = infer_mlp(&registry.snapshot(), "m", &input, 3).unwrap();
    registry.load("m", Some(3)).unwrap().wait().unwrap();
    let whole = infer_mlp(&registry.snapshot(), "m", &input, 3).unwrap();
    assert_eq!((weights_only.0, whole.0), (2, 3));
    assert_eq!(weights_only.1, whole.1, "mapped in place and whole model answer bit for bit alike");
    // Unloaded, the version's mapping of the file goes with it.
    registry.unload("m").unwrap().wait().unwrap();
    baton_testkit::server::eventually("the unloaded version's mapping to go", || {
        mapped(&cached).is_empty().then_some(())
    });
}

/// What in-place updates of weights would stand on: whether ONNX Runtime
/// computes from the buffers baton maps, or from copies of its own. A
/// weights-only version is loaded from a sealing source (its cached file
/// stays writable by the test), then the file's tensors are overwritten with
/// another model's of the same names, types and shapes. Without packing the
/// next answer is the other model's: every run reads baton's mapping, so
/// writing new weights there under a pause would update a live version. With
/// packing it is not: the sessions compute from packed copies of the
/// matrices, which an in-place write does not reach.
#[test]
fn without_packing_the_engine_computes_from_the_mapped_weights_and_with_packing_from_its_own_copy() {
    use std::os::unix::fs::FileExt;
    for prepack in [false, true] {
        let repo = TestRepo::new();
        let (old, new) = (Mlp::new(&SIZES, 1), Mlp::new(&SIZES, 2));
        let toml = format!("[engine]\nprepack = {prepack}\nsessions = 1\n[warmup]\ngenerated = false");
        repo.add_model("m", &mlp_toml(&old, &toml));
        repo.publish_weights("m", 1, &old, &mlp_safetensors(&old), &[]);
        let cache = tempfile::tempdir().unwrap();
        let cached = cache.path().join("m/1").join(safetensors::WEIGHTS_FILE);
        let source = Sealing { local: LocalRepository::new(repo.root()), cache };
        let onnx = baton_onnx::OnnxBackend::new().unwrap();
        baton_core::run::executor::start_spawner();
        let backends: Vec<Arc<dyn baton_core::run::backend::Backend>> = vec![Arc::new(onnx)];
        let registry = baton_core::registry::Registry::new(Arc::new(source), backends, Default::default());
        registry.load("m", Some(1)).unwrap().wait().unwrap();
        let input = sample_input(SIZES[0], 2, 9);
        let before = infer_mlp(&registry.snapshot(), "m", &input, 2).unwrap().1;
        assert!(baton_testkit::max_diff(&before, &old.forward(&input, 2)) < 1e-4);

        let (old_bytes, new_bytes) = (std::fs::read(&cached).unwrap(), mlp_safetensors(&new));
        let header = 8 + u64::from_le_bytes(old_bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(old_bytes[..header], new_bytes[..header], "the same tensors at the same offsets");
        let file = std::fs::OpenOptions::new().write(true).open(&cached).unwrap();
        file.write_all_at(&new_bytes[header..], header as u64).unwrap();
        let after = infer_mlp(&registry.snapshot(), "m", &input, 2).unwrap().1;
        if prepack {
            // The packed matrices are the old ones (biases, which are not
            // packed, may be read from the file: a mixture either way).
            let diff = baton_testkit::max_diff(&after, &new.forward(&input, 2));
            assert!(diff > 1e-3, "packed: the sessions computed from their own copies, not the file");
        } else {
            let diff = baton_testkit::max_diff(&after, &new.forward(&input, 2));
            assert!(diff < 1e-4, "unpacked: the engine reads the mapped file at every run ({diff} off)");
        }
    }
}
