//! Peak memory of decoding one large JSON inference request.
//!
//! `cargo run --release -p baton-protocol --example decode_memory -- [MIB] [check]`
//!
//! Builds a JSON body of about MIB MiB (default 60) holding one FP32 input
//! of shape [N, 64], resets the process's peak RSS, and decodes the body
//! with `decode_request`; with `check`, instead parses it and checks it
//! against a model taking `input` [-1, 64] with a max_batch_size of 4, as a
//! server does before decoding (the check refuses it). Prints, as JSON, the
//! RSS before (the body is resident), the peak during it, and the
//! difference. Results are in docs/api.md, "Inference".

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, Tensor};
use baton_protocol::{decode_request, encode_request, parse_request};

const WIDTH: usize = 64;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

fn body(mib: usize) -> Vec<u8> {
    // About 11 bytes per element once written ("-0.12345678,").
    let rows = (mib << 20) / (11 * WIDTH);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let values: Vec<f32> = (0..rows * WIDTH)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let tensor = Tensor::from_f32("input", vec![rows as i64, WIDTH as i64], &values);
    encode_request(&[tensor], false, &[], None).body
}

/// Parses the body and checks it against the model; the bytes decoding
/// would take and the check's answer.
fn check(body: &[u8]) -> (usize, String) {
    let spec = |name: &str, shape: Vec<i64>| TensorSpec { name: name.into(), datatype: DataType::Fp32, shape };
    let model = Signature { inputs: vec![spec("input", vec![-1, WIDTH as i64])], outputs: vec![spec("y", vec![-1])] };
    let header = parse_request(body, None).expect("the body parses");
    let answer = match header.check(&model, 4) {
        Ok(()) => "accepted".to_owned(),
        Err(e) => e.to_string(),
    };
    (header.tensor_bytes(), answer)
}

fn main() {
    let mib = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(60);
    let checking = std::env::args().nth(2).is_some_and(|a| a == "check");
    let body = body(mib);
    // Peak RSS from here on: 5 resets VmHWM to the current RSS.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_kib("VmRSS:");
    let started = std::time::Instant::now();
    let (tensor_bytes, answer) = if checking {
        check(&body)
    } else {
        let request = decode_request(&body, None).expect("the body decodes");
        let bytes = request.inputs.iter().map(|t| t.shape.iter().product::<i64>() as usize * 4).sum();
        (bytes, "decoded".to_owned())
    };
    let millis = started.elapsed().as_millis();
    let peak = status_kib("VmHWM:");
    println!(
        "{{\"body_bytes\":{},\"tensor_bytes\":{tensor_bytes},\"peak_reset\":{reset},\"rss_before_kib\":{before},\
         \"peak_kib\":{peak},\"peak_over_before_kib\":{},\"ms\":{millis},\"outcome\":{:?}}}",
        body.len(),
        peak.saturating_sub(before),
        answer
    );
}
