//! Peak memory of decoding one large JSON inference request.
//!
//! `cargo run --release -p baton-protocol --example decode_memory -- [MIB]`
//!
//! Builds a JSON body of about MIB MiB (default 60) holding one FP32 input
//! of shape [N, 64], resets the process's peak RSS, decodes the body with
//! `decode_request` and prints, as JSON, the RSS before decoding (the body
//! is resident), the peak during it, and the difference.

use baton_core::tensor::Tensor;
use baton_protocol::{decode_request, encode_request};

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

fn main() {
    let mib = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(60);
    let body = body(mib);
    // Peak RSS from here on: 5 resets VmHWM to the current RSS.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_kib("VmRSS:");
    let started = std::time::Instant::now();
    let request = decode_request(&body, None).expect("the body decodes");
    let millis = started.elapsed().as_millis();
    let peak = status_kib("VmHWM:");
    let tensor_bytes: usize = request.inputs.iter().map(|t| t.shape.iter().product::<i64>() as usize * 4).sum();
    println!(
        "{{\"body_bytes\":{},\"tensor_bytes\":{tensor_bytes},\"peak_reset\":{reset},\"rss_before_kib\":{before},\
         \"peak_kib\":{peak},\"peak_over_before_kib\":{},\"decode_ms\":{millis}}}",
        body.len(),
        peak.saturating_sub(before)
    );
}
