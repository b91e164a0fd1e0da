//! Versions that carry their processing, black box: texts in, through the
//! version's own tokenizer and post-processing around its graph; bad text
//! answered with a 400 naming the problem; a version that changes only its
//! processing is a `processing` update.

mod common;

use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_testkit::encoder::Encoder;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::Server;
use baton_testkit::text::word_level;
use common::{assert_no_panic, binary_request, output_f32, start};
use serde_json::{Value, json};

const WORDS: [&str; 8] = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"];

/// A processing.toml: a tokenizer of at most `max_length` tokens that cuts
/// longer texts or refuses them, mean-pooled and normalized.
fn processing(max_length: usize, truncation: bool) -> String {
    format!(
        "[tokenizer]\nmax_length = {max_length}\ntruncation = {truncation}\n\
         [output]\nname = \"embedding\"\nsteps = [\"mean_pool\", \"l2_normalize\"]\n"
    )
}

/// Publishes a text version: the encoder of `seed`, a word-level
/// tokenizer of `words`, and `processing`.
fn publish(repo: &TestRepo, version: u64, seed: u64, words: &[&str], processing: &str) {
    let model = Encoder::new(seed).encode();
    let tokenizer = word_level(words, None);
    let files: [(&str, &[u8]); 3] =
        [("model.onnx", &model), ("tokenizer.json", &tokenizer), ("processing.toml", processing.as_bytes())];
    repo.write_files("t", version, &files);
    repo.seal("t", version);
}

fn texts_request(texts: &[&str]) -> Value {
    json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [texts.len()], "data": texts }] })
}

fn embed(server: &Server, texts: &[&str]) -> (u64, Vec<f32>) {
    let answer = server.post_json("/v2/models/t/infer", &texts_request(texts));
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let body = answer.json();
    (common::version_of(&body), output_f32(&body, "embedding"))
}

#[test]
fn bad_text_is_a_400_naming_the_problem_and_good_text_still_answers() {
    let repo = TestRepo::new();
    repo.add_model("t", "backend = \"onnx\"\n");
    publish(&repo, 1, 3, &WORDS, &processing(6, false));
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("t", 1);

    let (_, before) = embed(&server, &["the cat sat", "a dog"]);
    assert_eq!(before.len(), 2 * 32, "two embeddings of the encoder's width");

    // Text that is not UTF-8 only a binary tensor can carry.
    let text = Tensor {
        name: "text".into(),
        datatype: DataType::Bytes,
        shape: vec![2],
        data: TensorData::Bytes(vec![b"the cat".to_vec(), b"the \xff cat".to_vec()]),
    };
    let (body, length) = binary_request(&[text], &[]);
    let answer = server.post_raw("/v2/models/t/infer", &body, &[("inference-header-content-length", &length)]);
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["kind"], "text_not_utf8", "{}", answer.json());
    assert!(answer.error().contains("text 1") && answer.error().contains("UTF-8"), "{}", answer.error());

    let answer = server.post_json("/v2/models/t/infer", &texts_request(&["the cat sat on the mat and ran"]));
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json()["kind"], "text_too_long", "{}", answer.json());
    assert!(answer.error().contains("8 tokens") && answer.error().contains("at most 6"), "{}", answer.error());

    let (_, after) = embed(&server, &["the cat sat", "a dog"]);
    assert_eq!(before, after, "bad requests change nothing");
    assert_eq!(server.get("/v2/health/ready").status, 200);
    assert_no_panic(&server);
}

#[test]
fn a_version_that_changes_only_its_processing_is_a_processing_update() {
    let repo = TestRepo::new();
    repo.add_model("t", "backend = \"onnx\"\n");
    publish(&repo, 1, 3, &WORDS, &processing(6, true));
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "t"]);
    server.wait_serving("t", 1);
    let (_, one) = embed(&server, &["the cat sat on the mat and ran"]);

    // The same graph, texts cut at 3 tokens instead of 6.
    publish(&repo, 2, 3, &WORDS, &processing(3, true));
    let loaded = server.post_json("/baton/v1/models/t/load", &json!({ "version": 2 }));
    assert_eq!(loaded.status, 200, "{}", String::from_utf8_lossy(&loaded.body));
    assert_eq!(loaded.json()["update"], "processing", "{}", loaded.json());
    let (version, two) = embed(&server, &["the cat sat on the mat and ran"]);
    assert_eq!(version, 2);
    assert_ne!(one, two, "the new truncation changes the answer");
    let (_, short) = embed(&server, &["the cat sat"]);
    assert_eq!(two, short, "cut at 3 tokens");

    // Another graph with the same processing is a graph update.
    publish(&repo, 3, 4, &WORDS, &processing(3, true));
    let load = |version: u64| {
        let loaded = server.post_json("/baton/v1/models/t/load", &json!({ "version": version }));
        assert_eq!(loaded.status, 200, "{}", String::from_utf8_lossy(&loaded.body));
        loaded.json()
    };
    assert_eq!(load(3)["update"], "graph");

    // The processing dropped from that graph, then added back to it.
    repo.write_files("t", 4, &[("model.onnx", &Encoder::new(4).encode())]);
    repo.seal("t", 4);
    assert_eq!(load(4)["update"], "processing");
    publish(&repo, 5, 4, &WORDS, &processing(3, true));
    assert_eq!(load(5)["update"], "processing");

    let status = server.status("t");
    let live = status["live"].as_array().unwrap();
    let five = live.iter().find(|v| v["version"] == 5).expect("version 5 serves");
    assert_eq!(
        (five["update"].as_str(), five["update_reason"].as_str()),
        (Some("processing"), Some("processing_only"))
    );
    let series = r#"baton_updates_total{model="t",update="processing",reason="processing_only"}"#;
    assert_eq!(baton_testkit::server::metric(&server.metrics(), series), Some(3.0), "{series} in the metrics");
    assert_no_panic(&server);
}

#[test]
fn a_swap_under_load_that_changes_the_tokenizer_and_the_graph_never_mixes_them() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let repo = TestRepo::new();
    repo.add_model("t", "backend = \"onnx\"\n");
    publish(&repo, 1, 3, &WORDS, &processing(6, true));
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "t"]);
    server.wait_serving("t", 1);
    let text = ["the cat sat on the mat and the dog ran"];
    let (_, first) = embed(&server, &text);

    // Version 2: another graph, the vocabulary reversed, texts cut at 4.
    let reversed: Vec<&str> = WORDS.iter().rev().copied().collect();
    publish(&repo, 2, 5, &reversed, &processing(4, true));
    let stop = AtomicBool::new(false);
    let from_two = AtomicUsize::new(0);
    let answers = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let client = server.client();
                    let mut seen = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let answer = client.post_json("/v2/models/t/infer", &texts_request(&text));
                        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
                        let body = answer.json();
                        let version = common::version_of(&body);
                        if version == 2 {
                            from_two.fetch_add(1, Ordering::Relaxed);
                        }
                        seen.push((version, output_f32(&body, "embedding")));
                    }
                    seen
                })
            })
            .collect();
        let loaded = server.post_json("/baton/v1/models/t/load", &json!({ "version": 2 }));
        assert_eq!(loaded.status, 200, "{}", String::from_utf8_lossy(&loaded.body));
        baton_testkit::server::eventually("the clients' answers from version 2", || {
            (from_two.load(Ordering::Relaxed) >= 20).then_some(())
        });
        stop.store(true, Ordering::Relaxed);
        clients.into_iter().flat_map(|c| c.join().unwrap()).collect::<Vec<_>>()
    });
    let (_, second) = embed(&server, &text);
    assert_ne!(first, second, "the versions answer apart");
    let mut counts = [0usize; 2];
    for (version, answer) in &answers {
        let expected = if *version == 1 { &first } else { &second };
        assert_eq!(answer, expected, "version {version} answered with its own tokenizer and graph");
        counts[(*version - 1) as usize] += 1;
    }
    assert!(counts[0] > 0 && counts[1] >= 20, "answers from each version under load: {counts:?}");
    assert_no_panic(&server);
}

#[test]
fn golden_sets_and_warmup_see_the_version_as_clients_do() {
    let repo = TestRepo::new();
    repo.add_model("t", "backend = \"onnx\"\n[warmup]\nbatch_sizes = [1, 4]\n");
    publish(&repo, 1, 3, &WORDS, &processing(6, false));
    let server = start(&repo, &["--model-control", "explicit", "--load-model", "t"]);
    // Loaded past a warmup of generated texts, on a version that refuses
    // texts longer than 6 tokens: the generated text is valid and short.
    server.wait_serving("t", 1);
    let (_, embedding) = embed(&server, &["the cat sat"]);

    // A golden sample is a text and its embedding.
    let golden = |values: &[f32]| {
        let sample = json!({
            "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [1], "data": ["the cat sat"] }],
            "outputs": [{ "name": "embedding", "datatype": "FP32", "shape": [1, values.len()], "data": values }],
        });
        serde_json::to_vec(&sample).unwrap()
    };
    let flipped: Vec<f32> = embedding.iter().map(|v| -v).collect();
    for (version, expected) in [(2, &embedding), (3, &flipped)] {
        publish(&repo, version, 3, &WORDS, &processing(6, false));
        repo.write_files("t", version, &[("golden/a.json", &golden(expected))]);
        repo.seal("t", version);
    }
    let load = |version: u64| server.post_json("/baton/v1/models/t/load", &json!({ "version": version }));
    let passed = load(2);
    assert_eq!(passed.status, 200, "{}", passed.error());
    let refused = load(3);
    assert_eq!(refused.status, 422, "{}", String::from_utf8_lossy(&refused.body));
    assert!(refused.error().contains("golden"), "{}", refused.error());
    assert_eq!(embed(&server, &["the cat sat"]), (2, embedding));
    assert_no_panic(&server);
}

#[test]
fn tritonclient_sends_texts_over_http_and_grpc() {
    let repo = TestRepo::new();
    repo.add_model("t", "backend = \"onnx\"\n");
    publish(&repo, 1, 3, &WORDS, &processing(6, true));
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("t", 1);
    let texts = ["the cat sat", "a dog ran on the mat"];
    let (_, expected) = embed(&server, &texts);

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/texts.py");
    let http = server.base().trim_start_matches("http://").to_owned();
    let out = std::process::Command::new(common::client_python())
        .arg(script)
        .args([http.as_str(), server.grpc_address(), "t", &serde_json::to_string(&texts).unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    for way in ["http", "grpc"] {
        let got: Vec<f32> = result[way]["embeddings"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32))
            .collect();
        assert_eq!(got, expected, "{way}: the embeddings REST answers");
        let refused = &result[way]["refused"];
        assert!(refused["message"].as_str().is_some_and(|m| m.contains("UTF-8")), "{way}: {refused}");
    }
    assert_eq!(result["http"]["refused"]["status"], "400", "{result}");
    assert_eq!(result["grpc"]["refused"]["status"], "StatusCode.INVALID_ARGUMENT", "{result}");
    assert_no_panic(&server);
}

#[test]
fn processing_runs_in_the_server_around_a_graph_in_a_worker_process() {
    let repo = TestRepo::new();
    repo.add_model("t", "backend = \"onnx\"\n");
    repo.add_model("w", "backend = \"onnx\"\n[engine]\nisolation = \"process\"\n");
    publish(&repo, 1, 3, &WORDS, &processing(6, true));
    let files: Vec<(String, Vec<u8>)> = ["model.onnx", "tokenizer.json", "processing.toml"]
        .iter()
        .map(|f| ((*f).to_owned(), std::fs::read(repo.version_dir("t", 1).join(f)).unwrap()))
        .collect();
    let files: Vec<(&str, &[u8])> = files.iter().map(|(f, b)| (f.as_str(), b.as_slice())).collect();
    repo.write_files("w", 1, &files);
    repo.seal("w", 1);
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("t", 1);
    server.wait_serving("w", 1);

    let texts = ["the cat sat", "a dog ran on the mat"];
    let (_, here) = embed(&server, &texts);
    let answer = server.post_json("/v2/models/w/infer", &texts_request(&texts));
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(output_f32(&answer.json(), "embedding"), here, "the same version answers alike in a worker");
    let status = server.status("w");
    let live = &status["live"][0];
    assert!(live["worker"]["pid"].is_u64(), "the graph runs in a worker: {live}");
    assert_eq!(live["update"], "runtime", "{live}");

    let answer = server.post_json("/v2/models/w/infer", &texts_request(&["the cat sat on the mat and ran"]));
    assert_eq!(answer.status, 200, "cut at 6 tokens in the server, before the worker");
    assert_no_panic(&server);
}

#[test]
fn with_dynamic_batching_each_client_gets_its_own_embedding() {
    let repo = TestRepo::new();
    let toml = "backend = \"onnx\"\n[batching]\nenabled = true\nmax_batch = 8\nmax_queue_delay_us = 5000\n";
    repo.add_model("t", toml);
    publish(&repo, 1, 3, &WORDS, &processing(6, true));
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("t", 1);
    // Texts of different lengths: a joined batch is padded to its longest.
    let texts = ["the", "the cat sat", "a dog ran on the mat", "cat"];
    let alone: Vec<Vec<f32>> = texts.iter().map(|t| embed(&server, &[t]).1).collect();
    std::thread::scope(|scope| {
        for (text, expected) in texts.iter().zip(&alone) {
            let client = server.client();
            scope.spawn(move || {
                for _ in 0..20 {
                    let answer = client.post_json("/v2/models/t/infer", &texts_request(&[text]));
                    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
                    let got = output_f32(&answer.json(), "embedding");
                    let worst = got.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(got.len() == expected.len() && worst <= 1e-5, "{text:?}: {worst}");
                }
            });
        }
    });
    assert_no_panic(&server);
}
