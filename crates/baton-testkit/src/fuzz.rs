//! Inputs for baton's fuzz tests: valid encodings damaged the way a broken
//! client, a partial copy or a hostile peer damages them, as proptest
//! strategies, and the number of cases a test runs.
//!
//! A damaged input is a valid one (a request, a manifest, a `model.toml`,
//! an ONNX model) with a few edits: bits flipped, bytes set, deleted or
//! repeated, the tail cut off, a token of the format spliced in (huge,
//! negative or fractional numbers, deep nesting, quotes, long varints), or
//! one of its decimal numbers replaced by such a token, which turns a
//! shape of `[2, 3]` into `[4611686018427387904, 3]`.

pub mod seeds;

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, Tensor, TensorData, element_count};
use baton_protocol::TensorHeader;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// The error kinds a request decoder (REST or gRPC) may return: all
/// client errors.
pub const REQUEST_KINDS: [&str; 4] = ["invalid_json", "invalid_request", "invalid_tensor", "invalid_binary"];

/// A model whose inputs are exactly a parsed request's: any request that
/// parses must pass the model check against it.
pub fn model_of<'a>(inputs: impl Iterator<Item = &'a TensorHeader>) -> Signature {
    let spec =
        |t: &TensorHeader| TensorSpec { name: t.name().to_owned(), datatype: t.datatype(), shape: t.shape().to_vec() };
    Signature { inputs: inputs.map(spec).collect(), outputs: Vec::new() }
}

/// Asserts that decoded tensors agree with their shapes and took no more
/// than parsing reserved for each (`reserved`, in the same order).
pub fn assert_within_reservation(tensors: &[Tensor], reserved: &[usize]) {
    assert_eq!(tensors.len(), reserved.len());
    for (tensor, &reserved) in tensors.iter().zip(reserved) {
        assert_eq!(tensor.check_consistent(), Ok(()));
        assert!(tensor.data_bytes() <= reserved, "'{}' took {} > {reserved}", tensor.name, tensor.data_bytes());
    }
}

/// The environment variable that sets the cases every fuzz test runs, for
/// long campaigns; proptest's own name for it.
pub const CASES_VAR: &str = "PROPTEST_CASES";

/// The cases a fuzz test runs: [`CASES_VAR`] when set, else `default`,
/// which keeps the suite within a minute of `cargo test` in debug.
pub fn cases(default: u32) -> u32 {
    std::env::var(CASES_VAR).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A proptest configuration of [`cases`]`(default)` cases that writes no
/// failure files into the source tree (a failure prints its minimal case).
pub fn config(default: u32) -> Config {
    Config { cases: cases(default), failure_persistence: None, ..Config::default() }
}

/// Tokens worth splicing into JSON and TOML text: numbers at and past
/// every limit, and the characters that open, close or quote.
pub const TEXT_TOKENS: &[&str] = &[
    "4611686018427387904",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1099511627776",
    "-1",
    "-9223372036854775808",
    "0",
    "1e400",
    "-0.0",
    "1.5",
    "NaN",
    "inf",
    "null",
    "true",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "\n",
    "  ",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":",
    "\u{1F600}",
    "\u{0}",
];

/// Byte strings worth splicing into protobuf messages: varints of every
/// length up to 64 bits and past it, keys of each wire type, and lengths
/// far beyond any message.
pub const WIRE_TOKENS: &[&[u8]] = &[
    &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    &[0x80],
    &[0x00],
    &[0x01],
    &[0x7f],
    &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x07],
    &[0x0a, 0x00],
    &[0x08],
    &[0x09],
    &[0x0b],
    &[0x0d],
    &[0x0e],
    &[0x3a, 0x00],
    &[0x2a, 0x00],
    &[0x32, 0x00],
];

/// One edit of an input.
#[derive(Clone, Debug)]
pub enum Edit {
    /// Flips one bit of the byte at an index (taken modulo the length, as
    /// every index here).
    Flip(usize, u8),
    /// Sets the byte at an index.
    Set(usize, u8),
    /// Deletes up to this many bytes from an index.
    Delete(usize, usize),
    /// Repeats the bytes of a range (from, length) at another index.
    Repeat(usize, usize, usize),
    /// Cuts the input at an index.
    Truncate(usize),
    /// Inserts a token at an index.
    Insert(usize, Vec<u8>),
    /// Replaces one of the input's runs of ASCII digits by a token.
    Number(usize, Vec<u8>),
}

/// One to `max` edits, with tokens from `tokens`.
pub fn edits(tokens: Vec<Vec<u8>>, max: usize) -> impl Strategy<Value = Vec<Edit>> {
    let token = proptest::sample::select(tokens);
    let edit = prop_oneof![
        3 => (any::<usize>(), 0u8..8).prop_map(|(i, b)| Edit::Flip(i, b)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        2 => (any::<usize>(), 1usize..16).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => (any::<usize>(), 1usize..64, any::<usize>()).prop_map(|(i, n, at)| Edit::Repeat(i, n, at)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        3 => (any::<usize>(), token.clone()).prop_map(|(i, t)| Edit::Insert(i, t)),
        3 => (any::<usize>(), token).prop_map(|(i, t)| Edit::Number(i, t)),
    ];
    prop::collection::vec(edit, 1..=max)
}

/// `input` with `edits` applied in order.
pub fn apply(input: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = input.to_vec();
    for edit in edits {
        // An index into the input as it is now; inserting may go at its end.
        let at = |i: &usize, len: usize| if len == 0 { 0 } else { i % len };
        match edit {
            Edit::Flip(i, bit) if !out.is_empty() => {
                let i = at(i, out.len());
                out[i] ^= 1 << bit;
            }
            Edit::Set(i, b) if !out.is_empty() => {
                let i = at(i, out.len());
                out[i] = *b;
            }
            Edit::Delete(i, n) if !out.is_empty() => {
                let i = at(i, out.len());
                let end = (i + n).min(out.len());
                out.drain(i..end);
            }
            Edit::Repeat(from, n, to) if !out.is_empty() => {
                let from = at(from, out.len());
                let piece = out[from..(from + n).min(out.len())].to_vec();
                let to = at(to, out.len() + 1);
                out.splice(to..to, piece);
            }
            Edit::Truncate(i) => out.truncate(at(i, out.len() + 1)),
            Edit::Insert(i, token) => {
                let i = at(i, out.len() + 1);
                out.splice(i..i, token.iter().copied());
            }
            Edit::Number(i, token) => {
                let runs = digit_runs(&out);
                if !runs.is_empty() {
                    let (start, end) = runs[at(i, runs.len())];
                    out.splice(start..end, token.iter().copied());
                }
            }
            _ => {}
        }
    }
    out
}

/// The runs of ASCII digits in `bytes`, as (start, end).
fn digit_runs(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, b) in bytes.iter().enumerate() {
        match (b.is_ascii_digit(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, bytes.len()));
    }
    runs
}

/// One of `seeds`, damaged by up to `max` edits with `tokens`.
pub fn damaged(seeds: Vec<Vec<u8>>, tokens: Vec<Vec<u8>>, max: usize) -> impl Strategy<Value = Vec<u8>> {
    (proptest::sample::select(seeds), edits(tokens, max)).prop_map(|(seed, edits)| apply(&seed, &edits))
}

/// [`TEXT_TOKENS`] as byte strings, for [`damaged`].
pub fn text_tokens() -> Vec<Vec<u8>> {
    TEXT_TOKENS.iter().map(|t| t.as_bytes().to_vec()).collect()
}

/// [`WIRE_TOKENS`] as byte strings, for [`damaged`].
pub fn wire_tokens() -> Vec<Vec<u8>> {
    WIRE_TOKENS.iter().map(|t| t.to_vec()).collect()
}

/// A valid tensor of any datatype and a shape of up to 3 dimensions of up
/// to 3, named `t`. `json_safe`: only values JSON carries exactly (finite
/// floats, UTF-8 strings), since JSON writes NaN and Inf as null.
pub fn tensor(json_safe: bool) -> impl Strategy<Value = Tensor> {
    let datatype = proptest::sample::select(DataType::ALL.to_vec());
    (datatype, prop::collection::vec(0i64..4, 0..=3)).prop_flat_map(move |(datatype, shape)| {
        let count = element_count(&shape).unwrap_or(0);
        let size = datatype.size().unwrap_or(0);
        let item = if json_safe {
            "\\PC{0,4}".prop_map(String::into_bytes).boxed()
        } else {
            prop::collection::vec(any::<u8>(), 0..5).boxed()
        };
        let items = prop::collection::vec(item, count);
        (prop::collection::vec(any::<u8>(), count * size), items).prop_map(move |(mut raw, items)| {
            let data = match datatype {
                DataType::Bytes => TensorData::Bytes(items),
                _ => {
                    make_valid(datatype, &mut raw, json_safe);
                    TensorData::Raw(raw)
                }
            };
            Tensor { name: "t".into(), datatype, shape: shape.clone(), data }
        })
    })
}

/// Makes random element bytes valid: BOOL 0 or 1; with `json_safe`,
/// non-finite floats zero.
fn make_valid(datatype: DataType, raw: &mut [u8], json_safe: bool) {
    let finite = |c: &[u8]| match c.len() {
        2 => c[1] & 0x7c != 0x7c,
        4 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite(),
        _ => f64::from_le_bytes(c.try_into().unwrap_or_default()).is_finite(),
    };
    match datatype {
        DataType::Bool => raw.iter_mut().for_each(|b| *b &= 1),
        d if d.is_float() && json_safe => {
            let size = d.size().unwrap_or(1);
            raw.chunks_exact_mut(size).filter(|c| !finite(c)).for_each(|c| c.fill(0));
        }
        _ => {}
    }
}

/// `tensors` with distinct names (`t0`, `t1`, …), as a request needs.
pub fn named(mut tensors: Vec<Tensor>) -> Vec<Tensor> {
    for (i, t) in tensors.iter_mut().enumerate() {
        t.name = format!("t{i}");
    }
    tensors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_found_and_replaced() {
        assert_eq!(digit_runs(b"[2, 30]x7"), vec![(1, 2), (4, 6), (8, 9)]);
        let shape = apply(b"\"shape\":[2,3]", &[Edit::Number(0, b"-1".to_vec())]);
        assert_eq!(shape, b"\"shape\":[-1,3]");
    }

    #[test]
    fn edits_on_an_empty_input_do_not_panic() {
        let all = [
            Edit::Flip(7, 3),
            Edit::Set(7, 1),
            Edit::Delete(7, 4),
            Edit::Repeat(7, 4, 7),
            Edit::Truncate(7),
            Edit::Number(7, b"1".to_vec()),
            Edit::Insert(7, b"ab".to_vec()),
        ];
        assert_eq!(apply(b"", &all), b"ab");
    }
}
