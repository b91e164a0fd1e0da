//! Fuzzing the safetensors header reader that weights-only versions are
//! read with ([`Header::parse`]): arbitrary bytes and valid files damaged
//! (JSON cut or changed, offsets past the end, overlapping tensors, huge
//! shapes, a header length past the file) give a header every tensor of
//! which lies inside the file and overlaps no other, or an error; never a
//! panic.
//!
//! `PROPTEST_CASES` sets the cases of every test here (see docs/fuzzing.md).

use baton_onnx::mlp::mlp_safetensors;
use baton_onnx::safetensors::Header;
use baton_testkit::fuzz::{config, damaged, text_tokens};
use baton_testkit::onnx::Mlp;
use proptest::prelude::*;

/// Reads `bytes` as a whole safetensors file; what is accepted is sound.
fn read(bytes: &[u8]) {
    let Ok(header) = Header::parse(bytes, bytes.len() as u64) else { return };
    let mut end = header.data_start;
    for tensor in &header.tensors {
        assert!(tensor.range.start >= end, "'{}' overlaps the one before or the header", tensor.name);
        assert!(tensor.range.end <= bytes.len() as u64, "'{}' lies past the file", tensor.name);
        end = tensor.range.end;
    }
}

fn seeds() -> Vec<Vec<u8>> {
    vec![mlp_safetensors(&Mlp::new(&[3, 4, 2], 1)), mlp_safetensors(&Mlp::new(&[1, 1], 2))]
}

fn tokens() -> Vec<Vec<u8>> {
    let mut tokens = text_tokens();
    for t in [
        "\"data_offsets\":[0,18446744073709551615]",
        "\"shape\":[4294967296,4294967296]",
        "\"dtype\":\"F16\"",
        "[",
        "}",
        "\"",
    ] {
        tokens.push(t.as_bytes().to_vec());
    }
    tokens
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_are_refused_or_read(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        read(&bytes);
    }

    #[test]
    fn damaged_files_are_refused_or_read(bytes in damaged(seeds(), tokens(), 4)) {
        read(&bytes);
    }
}
