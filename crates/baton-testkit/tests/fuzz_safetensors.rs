//! Fuzzing the safetensors header reader that weights-only versions are
//! read with ([`Header::parse`]): arbitrary bytes and valid files damaged
//! (JSON cut or changed, offsets past the end, overlapping tensors, huge
//! shapes, a header length past the file) give a header whose tensors
//! cover the file's data exactly, in order, each once, or an error; never
//! a panic. And whatever the reference reader (the `safetensors` crate)
//! refuses, baton refuses too.
//!
//! `PROPTEST_CASES` sets the cases of every test here (see docs/fuzzing.md).

use baton_onnx::mlp::mlp_safetensors;
use baton_onnx::safetensors::Header;
use baton_testkit::fuzz::{config, damaged, text_tokens};
use baton_testkit::onnx::Mlp;
use proptest::prelude::*;

/// Reads `bytes` as a whole safetensors file; what is accepted is sound,
/// and is accepted by the reference reader as well.
fn read(bytes: &[u8]) {
    let parsed = Header::parse(bytes, bytes.len() as u64);
    if let Err(reference) = safetensors::SafeTensors::read_metadata(bytes) {
        assert!(parsed.is_err(), "baton read what the safetensors crate refuses ({reference:?}): {parsed:?}");
    }
    let Ok(header) = parsed else { return };
    let mut end = header.data_start;
    for tensor in &header.tensors {
        assert_eq!(tensor.range.start, end, "'{}' does not start where the one before ends", tensor.name);
        assert!(tensor.range.end <= bytes.len() as u64, "'{}' lies past the file", tensor.name);
        end = tensor.range.end;
    }
    assert_eq!(end, bytes.len() as u64, "bytes after the last tensor");
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
        "\"data_offsets\":[0,4]",
        "\"data_offsets\":[4,8]",
        "\u{0}\u{0}\u{0}\u{0}",
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
