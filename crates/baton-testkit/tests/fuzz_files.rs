//! Fuzzing the decoders of what a model repository and a request carry
//! besides the request bodies: `MANIFEST`, `model.toml`, warmup sample
//! files, the BYTES framing, and JSON tensor data on its own. Arbitrary
//! input and valid files damaged (see [`baton_testkit::fuzz`]): a value or
//! an error of a known kind, never a panic; valid files round-trip.
//!
//! `PROPTEST_CASES` sets the cases of every test here (see docs/fuzzing.md).

use baton_core::files::manifest::{self, Entry, Manifest};
use baton_core::files::spec::ModelSpec;
use baton_core::registry::load::warmup::parse_sample;
use baton_core::tensors::tensor::{DataType, TensorData, append_framed, framed_items, split_framed};
use baton_core::tensors::tensor_json::{NullFloats, check_json_count, elements_from_json, tensor_to_json};
use baton_testkit::fuzz::{config, damaged, named, seeds, tensor, text_tokens};
use proptest::prelude::*;

/// A manifest's parse error kinds.
fn manifest_kind(text: &str) -> Result<Manifest, &'static str> {
    manifest::parse(text).map_err(|e| {
        assert!(matches!(e.kind(), "manifest_incomplete" | "manifest_malformed"), "{e:?}");
        e.kind()
    })
}

/// Nesting `depth` deep of the opening and closing `pieces`, around `inner`.
fn nested(depth: usize, (open, close): (&str, &str), inner: &str) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn manifest_arbitrary_text_is_refused_or_parsed(text in "\\PC{0,200}", prefixed in any::<bool>()) {
        let text = if prefixed { format!("baton-manifest 1\n{text}") } else { text };
        let _ = manifest_kind(&text);
    }

    #[test]
    fn manifest_damage_is_refused_or_parsed(bytes in damaged(vec![seeds::manifest()], text_tokens(), 4)) {
        let _ = manifest_kind(&String::from_utf8_lossy(&bytes));
    }

    /// Rendered manifests parse back to themselves.
    #[test]
    fn manifest_round_trips(
        entries in prop::collection::vec(("[a-z0-9_]{1,8}(/[a-z0-9_]{1,8}){0,2}", any::<u64>(), "[0-9a-f]{64}"), 0..6),
        whole in any::<bool>(),
    ) {
        let manifest = Manifest {
            format: if whole { manifest::Format::Whole } else { manifest::Format::Pieces },
            entries: entries.into_iter().map(|(path, size, sha256)| Entry { path, size, sha256 }).collect(),
        };
        prop_assert_eq!(manifest_kind(&manifest::render(&manifest)), Ok(manifest));
    }

    #[test]
    fn spec_arbitrary_text_is_refused_or_parsed(text in "\\PC{0,200}") {
        if let Err(e) = ModelSpec::parse(&text) {
            prop_assert!(!e.is_empty());
        }
    }

    /// Damaged specs: refused with a message, or parsed into a spec whose
    /// own checks hold.
    #[test]
    fn spec_damage_is_refused_or_parsed(bytes in damaged(vec![seeds::MODEL_TOML.as_bytes().to_vec()], text_tokens(), 4)) {
        match ModelSpec::parse(&String::from_utf8_lossy(&bytes)) {
            Ok(spec) => {
                prop_assert!(spec.validation.max_ratio.is_finite() && spec.validation.max_ratio >= 2.0);
                prop_assert!(spec.admission.max_in_flight != Some(0));
            }
            Err(e) => prop_assert!(!e.is_empty()),
        }
    }

    /// Arrays and inline tables nested deep are refused, not a stack overflow.
    #[test]
    fn spec_deep_nesting_is_refused(depth in 1usize..20_000, table in any::<bool>()) {
        let pieces = if table { ("{ a = ", " }") } else { ("[", "]") };
        let text = format!("[engine]\nx = {}\n", nested(depth, pieces, "1"));
        let _ = ModelSpec::parse(&text);
    }

    #[test]
    fn sample_arbitrary_text_is_refused_or_parsed(text in "\\PC{0,200}") {
        if let Err(e) = parse_sample("warmup/x.json".into(), &text) {
            prop_assert_eq!(e.kind(), "bad_sample");
        }
    }

    #[test]
    fn sample_damage_is_refused_or_parsed(bytes in damaged(vec![seeds::SAMPLE.as_bytes().to_vec()], text_tokens(), 4)) {
        match parse_sample("warmup/x.json".into(), &String::from_utf8_lossy(&bytes)) {
            Ok(sample) => {
                for t in &sample.inputs {
                    prop_assert_eq!(t.check_consistent(), Ok(()));
                }
            }
            Err(e) => prop_assert_eq!(e.kind(), "bad_sample"),
        }
    }

    /// Sample files of any JSON-safe tensors parse back to the tensors.
    #[test]
    fn samples_round_trip(tensors in prop::collection::vec(tensor(true), 0..4)) {
        let tensors = named(tensors);
        let inputs: Vec<serde_json::Value> = tensors
            .iter()
            .map(|t| serde_json::json!({"name": t.name, "datatype": t.datatype, "shape": t.shape, "data": tensor_to_json(t)}))
            .collect();
        let text = serde_json::json!({ "inputs": inputs }).to_string();
        let sample = parse_sample("warmup/x.json".into(), &text).unwrap();
        prop_assert_eq!(sample.inputs, tensors);
    }

    /// Framed BYTES split into elements that frame back to the same bytes,
    /// or an error saying where the framing breaks; the iterator agrees.
    #[test]
    fn framing_splits_exactly_or_says_where_it_breaks(bytes in prop::collection::vec(any::<u8>(), 0..64), items in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..6), 0..5)) {
        let mut framed = Vec::new();
        append_framed(&items, &mut framed);
        prop_assert_eq!(split_framed(&framed), Ok(items));
        for input in [bytes.clone(), [framed.clone(), bytes].concat()] {
            match split_framed(&input) {
                Ok(items) => {
                    let mut again = Vec::new();
                    append_framed(&items, &mut again);
                    prop_assert_eq!(&again, &input);
                    prop_assert_eq!(framed_items(&input).count(), items.len());
                }
                Err(e) => {
                    prop_assert!(e.starts_with("BYTES"), "{}", e);
                    prop_assert!(framed_items(&input).last().is_some_and(|i| i.is_err()));
                }
            }
        }
    }

    /// JSON tensor data on its own: any text, any datatype, any claimed
    /// count up to 2^62. Decoded data holds exactly the count.
    #[test]
    fn json_elements_decode_exactly_or_are_refused(
        text in r#"[\[\] ,]{0,6}(-?[0-9]{1,3}(\.[0-9])?|true|null|"[a-z]{0,2}"|\{\}|[\[\],]){0,24}"#,
        datatype in proptest::sample::select(DataType::ALL.to_vec()),
        count in prop_oneof![0usize..16, Just(1usize << 40), Just(1usize << 62), Just(usize::MAX)],
        nan in any::<bool>(),
    ) {
        let nulls = if nan { NullFloats::AsNan } else { NullFloats::Reject };
        if let Ok(data) = elements_from_json(&text, datatype, count, nulls) {
            match (data, datatype.size()) {
                (TensorData::Raw(bytes), Some(size)) => prop_assert_eq!(bytes.len(), count * size),
                (TensorData::Bytes(items), None) => prop_assert_eq!(items.len(), count),
                (data, _) => prop_assert!(false, "{:?} for {}", data, datatype),
            }
        }
        if count > text.len() {
            prop_assert!(check_json_count(&text, count).is_err());
        }
    }

    /// Nested JSON data past serde_json's limit is an error, not a stack overflow.
    #[test]
    fn json_elements_deep_nesting_is_refused(depth in 1usize..20_000, object in any::<bool>()) {
        let pieces = if object { (r#"{"a":"#, "}") } else { ("[", "]") };
        let _ = elements_from_json(&nested(depth, pieces, "1"), DataType::Fp32, 1, NullFloats::Reject);
    }
}
