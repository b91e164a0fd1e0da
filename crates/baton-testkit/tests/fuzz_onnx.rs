//! Fuzzing baton's ONNX reader, which validation, weight roles, warmup
//! ranges and staging read model files with: [`proto::parse`],
//! [`proto::nested_external_data`], [`proto::externalize`],
//! [`proto::read_skeleton`] and [`proto::initializer_bytes`], and the
//! rewrite that points a weights-only version's graph at its weights file
//! ([`proto::point_at`]). Arbitrary
//! bytes and valid models damaged (long varints, lengths past the message,
//! dims of 2^62 and negative ones, subgraphs nested without end): a model
//! or a [`ProtoError`] of a known kind, never a panic or a stack overflow;
//! the skeleton parses as the whole file does.
//!
//! `PROPTEST_CASES` sets the cases of every test here (see docs/fuzzing.md).

use std::io::Write;

use baton_onnx::proto::{self, ProtoError, RawData};
use baton_testkit::fuzz::{config, damaged, seeds, wire_tokens};
use proptest::prelude::*;

/// Asserts an error is one of the reader's kinds for bad bytes.
fn known(e: &ProtoError) {
    assert!(
        matches!(
            e,
            ProtoError::Truncated { .. }
                | ProtoError::BadWireType { .. }
                | ProtoError::InvalidUtf8 { .. }
                | ProtoError::Malformed(_)
                | ProtoError::Unsupported(_)
        ),
        "{e:?}"
    );
}

/// Runs every reader that takes model bytes alone; whatever parses, each
/// initializer's bytes are found or refused.
fn read_all(bytes: &[u8]) {
    match proto::parse(bytes) {
        Ok(model) => {
            let mut scratch = Vec::new();
            let dir = std::path::Path::new("/nonexistent-baton-fuzz");
            for init in model.initializers.iter().chain(model.nodes.iter().filter_map(|n| n.constant.as_ref())) {
                match proto::initializer_bytes(init, RawData::InBytes(bytes), dir, &mut scratch) {
                    Ok(_) | Err(ProtoError::Io { .. }) => {}
                    Err(e) => known(&e),
                }
            }
        }
        Err(e) => known(&e),
    }
    if let Err(e) = proto::nested_external_data(bytes) {
        known(&e);
    }
    let lengths = |_: &str| Some(1u64 << 20);
    for external in [None, Some(&lengths as proto::FileLength<'_>)] {
        match proto::externalize(bytes, "staged.bin", 16, 4096, external) {
            Ok(Some(rewritten)) => {
                // What the rewrite wrote is a model the reader takes as well.
                if let Err(e) = proto::parse(&rewritten.model) {
                    known(&e);
                }
            }
            Ok(None) => {}
            Err(e) => known(&e),
        }
    }
}

/// Points every initializer but biases at the weights file (at an offset
/// and length made from the name); whatever is
/// rewritten parses, with the placed initializers external at exactly
/// their placement and every other initializer as it was. Returns how
/// many were placed.
fn point(bytes: &[u8]) -> usize {
    let placement = |name: &str| (!name.contains("bias")).then(|| (name.len() as u64 * 64, 16 + name.len() as u64));
    let rewritten = match proto::point_at(bytes, "weights.safetensors", &placement) {
        Ok(rewritten) => rewritten,
        Err(e) => {
            known(&e);
            return 0;
        }
    };
    let (Ok(before), after) = (proto::parse(bytes), proto::parse(&rewritten)) else { return 0 };
    let after = after.unwrap_or_else(|e| panic!("a rewrite of a model that parses does not: {e:?}"));
    assert_eq!(before.initializers.len(), after.initializers.len());
    for (was, is) in before.initializers.iter().zip(&after.initializers) {
        assert_eq!((&was.name, was.data_type, &was.dims), (&is.name, is.data_type, &is.dims));
        match placement(&is.name) {
            Some((offset, length)) => match &is.data {
                proto::InitData::External { location, offset: at, length: len } => {
                    assert_eq!((location.as_str(), *at, *len), ("weights.safetensors", offset, Some(length)));
                }
                other => panic!("'{}' was placed but reads {other:?}", is.name),
            },
            None => {
                let bytes_of = |init: &proto::Initializer, file: &[u8]| match &init.data {
                    proto::InitData::Raw(range) => file.get(range.clone()).map(<[u8]>::to_vec),
                    proto::InitData::Inline(inline) => Some(inline.clone()),
                    proto::InitData::External { .. } => None,
                };
                assert_eq!(bytes_of(was, bytes), bytes_of(is, &rewritten), "'{}' was not placed", is.name);
            }
        }
    }
    after.initializers.iter().filter(|i| placement(&i.name).is_some()).count()
}

/// A node whose attribute holds a graph whose node holds a graph…
/// `depth` times, a few bytes per level: built from the inside out, each
/// level only a prefix of the next.
fn nested_subgraphs(depth: usize) -> Vec<u8> {
    fn key_and_len(number: u8, len: usize, out: &mut Vec<u8>) {
        out.push(number << 3 | 2);
        let mut len = len;
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
    }
    let op = [4 << 3 | 2, 2, b'I', b'f'];
    let mut prefixes = Vec::with_capacity(depth);
    let mut len = op.len();
    for _ in 0..depth {
        // NodeProto{op_type, attribute (5): AttributeProto{g (6): GraphProto{node (1): …}}}.
        let (mut graph, mut attribute, mut node) = (Vec::new(), Vec::new(), op.to_vec());
        key_and_len(1, len, &mut graph);
        key_and_len(6, graph.len() + len, &mut attribute);
        key_and_len(5, attribute.len() + graph.len() + len, &mut node);
        len += node.len() + attribute.len() + graph.len();
        prefixes.push([node, attribute, graph].concat());
    }
    let mut model = Vec::new();
    let mut graph = Vec::new();
    key_and_len(1, len, &mut graph);
    key_and_len(7, graph.len() + len, &mut model);
    model.extend(graph);
    model.extend(prefixes.into_iter().rev().flatten());
    model.extend(op);
    model
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_are_refused_or_read(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        read_all(&bytes);
    }

    #[test]
    fn damaged_models_are_refused_or_read(bytes in damaged(seeds::onnx(), wire_tokens(), 4)) {
        read_all(&bytes);
    }

    /// The rewrite that points a graph at its weights file, on arbitrary
    /// and damaged models and on valid ones.
    #[test]
    fn graphs_pointed_at_weights_are_refused_or_rewritten_exactly(
        arbitrary in prop::collection::vec(any::<u8>(), 0..256),
        damaged in damaged(seeds::onnx(), wire_tokens(), 4),
        valid in 0..seeds::onnx().len(),
    ) {
        point(&arbitrary);
        point(&damaged);
        let seed = &seeds::onnx()[valid];
        let initializers = proto::parse(seed).map_or(0, |m| m.initializers.len());
        prop_assert!(initializers == 0 || point(seed) > 0, "no initializer of a valid seed was placed");
    }

    /// The skeleton of any file, valid or damaged, parses as the file does.
    #[test]
    fn skeletons_parse_as_their_files(bytes in damaged(seeds::onnx(), wire_tokens(), 2)) {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let path = std::path::Path::new("model.onnx");
        if let Ok(skeleton) = proto::read_skeleton(&file, path) {
            prop_assert_eq!(skeleton.len(), bytes.len());
            let (whole, partial) = (proto::parse(&bytes), proto::parse(&skeleton));
            prop_assert_eq!(whole.is_ok(), partial.is_ok(), "{:?} vs {:?}", whole, partial);
            if let (Ok(whole), Ok(partial)) = (whole, partial) {
                prop_assert_eq!(whole, partial);
            }
        }
    }

    /// Subgraphs nested without end are refused, not a stack overflow.
    #[test]
    fn deep_subgraphs_are_refused_or_read(depth in 1usize..5_000) {
        read_all(&nested_subgraphs(depth));
    }
}

/// A model of a megabyte that is nothing but nested subgraphs, read on a
/// thread with the stack of a loading thread.
#[test]
fn a_megabyte_of_nested_subgraphs_is_refused() {
    let model = nested_subgraphs(100_000);
    let reader = std::thread::Builder::new().stack_size(2 << 20).spawn(move || {
        let e = proto::parse(&model).unwrap_err();
        known(&e);
        let nested = proto::nested_external_data(&model).unwrap_err();
        known(&nested);
        format!("{e}; {nested}")
    });
    let message = reader.unwrap().join().expect("the reader returns");
    assert!(message.contains("nested"), "{message}");
}
