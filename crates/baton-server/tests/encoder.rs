//! A BERT-style encoder with INT64 inputs served by the real binary: it
//! loads with the default validation, answers a JSON request over REST
//! exactly as ONNX Runtime run directly does, and beside it a model whose
//! integer input cannot be generated loads on its shipped samples alone,
//! with the server saying why in its log.

mod common;

use baton_testkit::encoder::{Batch, Encoder, encoder_toml, lookup_model, reference};
use baton_testkit::repo::TestRepo;
use common::{assert_no_panic, output_f32, plain_log, start};

#[test]
fn the_encoder_is_served_over_rest_with_int64_inputs() {
    let encoder = Encoder::new(11);
    let model = encoder.encode();
    let repo = TestRepo::new();
    repo.add_model("encoder", &encoder_toml(&encoder, ""));
    repo.write_files("encoder", 1, &[("model.onnx", &model)]);
    repo.seal("encoder", 1);
    repo.add_model("lookup", "backend = \"onnx\"\n");
    repo.write_files("lookup", 1, &[("model.onnx", &lookup_model())]);
    repo.seal("lookup", 1);

    let server = start(&repo, &[]);
    server.wait_ready();
    server.wait_serving("encoder", 1);
    server.wait_serving("lookup", 1);
    let batch = Batch::new(&encoder, 2, 6, 5);
    let answer = server.post_json("/v2/models/encoder/infer", &batch.json());
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let body = answer.json();
    for (name, shape, values) in reference(&model, &batch) {
        let output = body["outputs"].as_array().unwrap().iter().find(|o| o["name"] == name.as_str()).unwrap();
        let served: Vec<i64> = output["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
        assert_eq!(served, shape, "{name}");
        let got = output_f32(&body, &name);
        let same = got.len() == values.len() && got.iter().zip(&values).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} differs from ONNX Runtime's: {got:?} {values:?}");
    }

    let log = plain_log(&server);
    let warning = log.lines().find(|l| l.contains("Warmup generates no inputs")).unwrap_or_else(|| panic!("{log}"));
    assert!(warning.contains("input 'i'") && warning.contains("lookup"), "{warning}");
    assert!(!log.lines().any(|l| l.contains("Warmup generates no inputs") && l.contains("encoder")), "{log}");
    assert_no_panic(&server);
}
